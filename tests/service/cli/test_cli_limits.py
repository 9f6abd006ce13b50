"""Issue 31 (cases 5 and 8) on the command line: a bucket histogram whose counts are not
finite (or sum past any real count) and a ``.pt2`` archive of more programs than the limit exit
2 with a message, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.cli import main
from tests.onnx_factory import matmul_model


def _exit_code(args: list[str]) -> int:
    """``main``'s exit code, whether it returns it or argparse exits with it."""
    try:
        return main(args)
    except SystemExit as done:
        return int(done.code or 0)


@pytest.mark.parametrize(
    "spec",
    [
        "batch~16:1e308,32:1e308,64:1e308/2",  # each count finite, their sum infinite
        "batch~16:nan",
        "batch~16:inf",
        "batch~16:-3",
        "batch~16:1e16",
        "batch~16:" + "9" * 400,
        "batch~" + "9" * 5000 + ":1",
    ],
)
def test_inspect_refuses_absurd_histogram_counts(tmp_path: Path, capsys, spec: str) -> None:
    model = tmp_path / "sym.onnx"
    model.write_bytes(matmul_model(rows="batch").SerializeToString())
    assert _exit_code(["inspect", str(model), "--buckets", spec]) == 2
    err = capsys.readouterr().err
    assert "invalid histogram" in err and "Traceback" not in err


def test_inspect_refuses_too_many_programs(tmp_path: Path, capsys, monkeypatch) -> None:
    import torch
    from torch.export.pt2_archive._package import package_pt2

    class Shift(torch.nn.Module):
        def __init__(self, by: int) -> None:
            super().__init__()
            self.by = by

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.by

    archive = tmp_path / "three.pt2"
    package_pt2(
        archive,
        exported_programs={
            f"p{i}": torch.export.export(Shift(i), (torch.ones(i + 1),)) for i in range(3)
        },
    )
    monkeypatch.setenv("TUNEHUB_MAX_PT2_PROGRAMS", "2")
    assert _exit_code(["inspect", str(archive)]) == 2
    err = capsys.readouterr().err
    assert "holds 3 programs, over the limit of 2" in err and "Traceback" not in err
