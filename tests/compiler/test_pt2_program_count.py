"""Issue 31 (cases 8 and 10): the programs of a ``.pt2`` archive are capped (``max_programs``,
``TUNEHUB_MAX_PT2_PROGRAMS``), an archive over the cap is refused after the inspection and
before any program is loaded, and a one-program ``package_pt2`` archive loads whatever its
program is named. Tiny programs, so every case stays cheap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export.pt2_archive._package import package_pt2

from compiler.errors import ModelError
from compiler.frontends.loader import load_model
from compiler.frontends.model_spec import ModelLimits
from compiler.frontends.pt2_safety import DEFAULT_MAX_PROGRAMS, load_exported_programs


class _Shift(torch.nn.Module):
    def __init__(self, by: int) -> None:
        super().__init__()
        self.by = by

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.by


def _programs(count: int) -> dict[str, torch.export.ExportedProgram]:
    """``count`` programs taking distinct input shapes (``p0``: shape (1,), ...)."""
    return {f"p{i}": torch.export.export(_Shift(i), (torch.ones(i + 1),)) for i in range(count)}


def test_default_cap_fits_a_decoder_and_a_few_buckets() -> None:
    assert ModelLimits().max_programs == DEFAULT_MAX_PROGRAMS == 8


def test_an_archive_over_the_cap_is_refused_before_loading(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "many.pt2"
    package_pt2(path, exported_programs=_programs(DEFAULT_MAX_PROGRAMS + 1))
    import torch.export.pt2_archive._package as package

    def never(*_args, **_kwargs):
        raise AssertionError("a program was loaded")

    monkeypatch.setattr(package, "load_pt2", never)
    monkeypatch.setattr(torch.export, "load", never)
    with pytest.raises(ModelError) as info:
        load_exported_programs(path)
    assert info.value.code == "pt2_too_many_programs"
    assert "9 programs, over the limit of 8" in info.value.message
    assert "TUNEHUB_MAX_PT2_PROGRAMS" in info.value.message
    with pytest.raises(ModelError, match="over the limit of 2"):
        load_model(path, limits=ModelLimits(max_programs=2))


def test_an_archive_at_the_cap_loads(tmp_path: Path) -> None:
    path = tmp_path / "three.pt2"
    package_pt2(path, exported_programs=_programs(3))
    model = load_model(path, limits=ModelLimits(max_programs=3))
    assert model.programs == ("p0", "p1", "p2")


def test_one_program_under_any_name_loads(tmp_path: Path) -> None:
    """What ``torch.export.load`` cannot (it reads only ``model``): the one program of a
    ``package_pt2`` archive, named ``forward``, is the model."""
    path = tmp_path / "forward.pt2"
    package_pt2(path, exported_programs={"forward": _programs(1)["p0"]})
    assert list(load_exported_programs(path)) == ["forward"]
    model = load_model(path)
    assert model.programs == () and [(s.name, s.shape) for s in model.inputs] == [("x", (1,))]
