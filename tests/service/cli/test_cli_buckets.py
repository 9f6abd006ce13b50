"""``--buckets`` on ``tunehub inspect`` / ``compile`` / ``tune`` with a decoder whose sequence
length is symbolic: default buckets said so in the JSON, explicit ones compiled into one
verified library (a function per bucket) and tuned as one job over their tasks; a bad spec exits
2 with a message and writes nothing.
"""

from __future__ import annotations

import json

import pytest

from examples.decoders import export_dynamic
from service.cli import main
from tests.service.cli.test_cli_models import run_cli


@pytest.fixture(scope="module")
def dynamic_gpt2(tmp_path_factory):
    return export_dynamic("gpt2", "onnx", tmp_path_factory.mktemp("dyn") / "gpt2_dynamic.onnx")


def test_inspect_defaults_and_bad_specs(dynamic_gpt2, tmp_path, capsys) -> None:
    code, summary = run_cli("inspect", str(dynamic_gpt2), "--json")
    assert code == 0
    buckets = summary["model"]["buckets"]
    assert buckets["symbols"] == {"seq": [16, 32, 64, 128]} and buckets["defaulted"] == ["seq"]
    assert "default" in buckets["description"]
    assert summary["model"]["inputs"][0]["shape"] == [1, 128]
    # --input-shape pins one shape and wins over buckets.
    code, pinned = run_cli(
        "inspect",
        str(dynamic_gpt2),
        "--input-shape",
        "input_ids=1,20",
        "--buckets",
        "seq=16",
        "--json",
    )
    assert code == 0 and "buckets" not in pinned["model"]
    # Buckets from a histogram file of expected lengths (one per line, or "SIZE COUNT").
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("# request lengths\n8\n8\n30 2\n\n8 6\n")
    code, derived = run_cli(
        "inspect", str(dynamic_gpt2), "--bucket-histogram", f"seq={lengths}:2", "--json"
    )
    assert code == 0
    assert derived["model"]["buckets"]["symbols"] == {"seq": [8, 30]}
    assert derived["model"]["buckets"]["shares"] == {"seq": [0.8, 0.2]}
    assert "from a histogram" in derived["model"]["buckets"]["description"]
    capsys.readouterr()
    out = tmp_path / "out"
    (tmp_path / "bad.txt").write_text("8 x\n")
    for args, message in (
        (["--bucket-histogram", f"seq={tmp_path / 'missing.txt'}"], "cannot read histogram"),
        (["--bucket-histogram", f"seq={tmp_path / 'bad.txt'}"], "bad histogram file"),
        (["--buckets", "seq~8:1/99"], "1..16 buckets"),
        (["--buckets", "seq=16,x"], "expected NAME=V1,V2"),
        (["--buckets", "seq=0"], "between 1 and"),
        (["--buckets", "len=16"], "not a symbolic dimension of the model"),
        (["--buckets", "seq=16", "--buckets", "seq=32"], "twice"),
    ):
        with pytest.raises(SystemExit) as info:  # argparse's usage errors exit by themselves
            code = main(["compile", str(dynamic_gpt2), "-o", str(out), *args])
            raise SystemExit(code)
        assert info.value.code == 2, args
        assert message in capsys.readouterr().err
        assert not out.exists()


def test_compile_and_tune_with_buckets(dynamic_gpt2, tmp_path, monkeypatch) -> None:
    out = tmp_path / "compiled"
    code, summary = run_cli(
        "compile", str(dynamic_gpt2), "--buckets", "seq=16,32", "-o", str(out), "--json"
    )
    assert code == 0
    assert summary["verification"]["passed"]
    assert [b["function"] for b in summary["verification"]["buckets"]] == [
        "main_seq_16",
        "main_seq_32",
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["buckets"]["symbols"] == {"seq": [16, 32]}
    # GPT-2 is causal: the probes found padding exact, and the summary says so.
    assert (
        summary["padding"]["allowed"]
        and summary["padding"] == manifest["model"]["buckets"]["padding"]
    )
    assert [p.split(":")[0] for p in summary["padding"]["probes"]] == [
        "seq=8 padded to main_seq_16",
        "seq=24 padded to main_seq_32",
    ]

    monkeypatch.setenv("TUNEHUB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TUNEHUB_REMEASURE_TOP", "1")
    monkeypatch.setenv("TUNEHUB_REMEASURE_ROUNDS", "1")
    tuned = tmp_path / "tuned"
    code, summary = run_cli(
        "tune",
        str(dynamic_gpt2),
        "--buckets",
        "seq=16,32",
        "--trials",
        "2",
        "--population",
        "8",
        "-o",
        str(tuned),
        "--json",
    )
    assert code == 0
    assert summary["buckets"]["symbols"] == {"seq": [16, 32]}
    assert summary["verification"]["passed"]
    assert len(summary["verification"]["buckets"]) == 2
    assert summary["tasks_total"] == len(manifest["tasks"])  # the union of both buckets' tasks
    # The whole tuned library was timed against the zero-trial one (at the largest bucket).
    assert summary["final_choice"]["compared"] is True, summary["final_choice"]
    assert summary["final_choice"]["published"] in ("tuned", "zero_trial")
