"""``tunehub inspect`` / ``tunehub compile`` on every example in both formats, and bad inputs.

Every example compiles (untuned), the library verifies against ONNX Runtime or torch from disk,
and the ONNX and ``.pt2`` exports of one network share the task keys of their convolutions and
weight matmuls. Every bad input exits 2 with a message on stderr and leaves no output directory.
"""

from __future__ import annotations

import io
import json
import zipfile
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from service.cli import main
from tests.onnx_factory import matmul_model, relu_model, unsupported_ops_model

EXAMPLES = ["small_cnn", "mlp", "resnet18", "mobilenetv2", "bert"]


def run_cli(*args: str) -> tuple[int, dict | None]:
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(list(args))
    text = buffer.getvalue()
    return code, (json.loads(text) if code == 0 and text.strip().startswith("{") else None)


@pytest.fixture(scope="session")
def compiled(example_model, tmp_path_factory):
    """``compiled(name, fmt)`` → the ``--json`` summary of ``tunehub compile`` (cached)."""
    cache: dict[tuple[str, str], dict] = {}

    def get(name: str, fmt: str) -> dict:
        if (name, fmt) not in cache:
            out = tmp_path_factory.mktemp(f"{name}-{fmt}") / "artifact"
            code, summary = run_cli(
                "compile", str(example_model(name, fmt)), "-o", str(out), "--json"
            )
            assert code == 0
            assert (out / "model.so").is_file() and (out / "manifest.json").is_file()
            manifest = json.loads((out / "manifest.json").read_text())
            assert manifest["model"]["sha256"] == summary["model"]["sha256"]
            assert manifest["versions"]["tvm"].startswith("0.27")
            cache[(name, fmt)] = summary
        return cache[(name, fmt)]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_compile_verifies_every_example(compiled, name: str, fmt: str) -> None:
    summary = compiled(name, fmt)
    assert summary["verification"]["passed"], summary["verification"]
    assert summary["verification"]["reference"] == ("onnxruntime" if fmt == "onnx" else "torch")
    assert summary["verification"]["max_abs_error"] < 1e-3
    assert summary["tasks"], "no tuning tasks extracted"
    for task in summary["tasks"]:
        assert len(task["key"]) == 16 and task["weight"] >= 1


def _heavy_keys(summary: dict) -> set[str]:
    """Keys of tasks whose anchor is a convolution or a matmul by a weight (a ``param_*`` buffer).

    Attention's activation-by-activation matmuls are left out: torch.export lowers them to a
    batched matmul with broadcast/reshape, ONNX to a 4-D MatMul, so their TIR differs.
    """
    return {
        t["key"]
        for t in summary["tasks"]
        if t["name"].startswith(("fused_conv2d", "fused_matmul"))
        and any(s["name"].startswith("param_") for s in t["shapes"])
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_onnx_and_pt2_share_conv_and_matmul_keys(compiled, name: str) -> None:
    onnx_keys = _heavy_keys(compiled(name, "onnx"))
    torch_keys = _heavy_keys(compiled(name, "pt2"))
    assert onnx_keys, "expected conv/matmul tasks"
    assert onnx_keys == torch_keys


def test_inspect_prints_task_table(example_model, capsys) -> None:
    assert main(["inspect", str(example_model("small_cnn", "onnx"))]) == 0
    out = capsys.readouterr().out
    assert "fused_conv2d" in out and "MFLOPs" in out


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _assert_refused(capsys, tmp_path: Path, model: Path, expected: str, *extra: str) -> None:
    out_dir = tmp_path / "out"
    code = main(["compile", str(model), "-o", str(out_dir), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert expected in err
    assert err.startswith("tunehub: error: ") and "Traceback" not in err
    assert not out_dir.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]


def test_bad_inputs_exit_2_without_output(tmp_path, capsys, example_model, monkeypatch) -> None:
    good = matmul_model().SerializeToString()
    cases = [
        (_write(tmp_path / "trunc.onnx", good[: len(good) // 2]), "truncated"),
        (_write(tmp_path / "garbage.onnx", bytes(range(256)) * 4), "not a valid ONNX"),
        (_write(tmp_path / "empty.onnx", b""), "empty"),
        (_write(tmp_path / "zip.pt2", b"PK\x03\x04" + b"junk" * 64), "pt2"),
        (
            _write(tmp_path / "huge.onnx", relu_model([100000, 100000, 64]).SerializeToString()),
            "over the limit",
        ),
        (
            _write(tmp_path / "ops.onnx", unsupported_ops_model().SerializeToString()),
            "unsupported operator(s): Celu, Det",
        ),
        (tmp_path / "missing.onnx", "cannot read model file"),
    ]
    for model, expected in cases:
        _assert_refused(capsys, tmp_path, model, expected)
    # A .pt2 with a malicious pickle is refused and its payload never runs.
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(example_model("mlp", "pt2")) as src, zipfile.ZipFile(evil, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item.filename))
        root = src.namelist()[0].split("/")[0]
        payload = (
            b"\x80\x02cos\nsystem\nq\x00X"
            + len(f"touch {marker}").to_bytes(4, "little")
            + f"touch {marker}".encode()
            + b"q\x01\x85q\x02Rq\x03."
        )
        # (not under data/sample_inputs/: TuneHub never lets torch read those, so a payload
        # there is inert and the file loads: tests/compiler/test_pt2_safety.py)
        dst.writestr(f"{root}/extra/evil.pkl", payload)
    _assert_refused(capsys, tmp_path, evil, "forbidden global os.system")
    assert not marker.exists()
    # Oversized file (the CLI's limit for local files comes from the environment).
    monkeypatch.setenv("TUNEHUB_LOCAL_MAX_MODEL_BYTES", "1000")
    _assert_refused(capsys, tmp_path, example_model("mlp", "onnx"), "over the limit of 1000 bytes")
    monkeypatch.delenv("TUNEHUB_LOCAL_MAX_MODEL_BYTES")
    # A symbolic input: a bad bucket spec is refused; pinned by --input-shape it is one shape.
    sym = _write(tmp_path / "sym.onnx", matmul_model(rows="batch").SerializeToString())
    _assert_refused(
        capsys, tmp_path, sym, "not a symbolic dimension of the model", "--buckets", "rows=4"
    )
    code, summary = run_cli(
        "inspect", str(tmp_path / "sym.onnx"), "--input-shape", "x=3,16", "--json"
    )
    assert code == 0 and summary["model"]["inputs"][0]["shape"] == [3, 16]


def test_compile_refuses_nonempty_output_dir(tmp_path, capsys, example_model) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.txt").write_text("mine")
    code = main(["compile", str(example_model("mlp", "onnx")), "-o", str(out_dir)])
    assert code == 2 and "not empty" in capsys.readouterr().err
    assert [p.name for p in out_dir.iterdir()] == ["keep.txt"]
