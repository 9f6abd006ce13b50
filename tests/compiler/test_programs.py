"""``.pt2`` archives of several programs (``compiler.frontends.loader``): a decoder's prefill and
decode packaged together load as one model with a function per program, whose tasks are the union of
the two programs' tasks (a task both have is one task, its weight the sum); what cannot be one
library is refused with one message each. Tuning and the published artifact over HTTP:
``tests/service/test_api_programs.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.export.pt2_archive._package import package_pt2

from compiler.errors import ModelError
from compiler.frontends.loader import load_model
from compiler.frontends.model_spec import buckets_json
from compiler.frontends.pt2_safety import load_exported_program
from compiler.prepare import prepare_model
from compiler.target import cpu_target
from examples.kv_decoder import export_generation, export_program

TARGET = cpu_target(2)
DECODER = "qwen2"
SEQ = 8
PAST = 8


class _Scale(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


class _Product(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x @ y


def _archive(path: Path, **programs: torch.export.ExportedProgram) -> Path:
    package_pt2(path, exported_programs=programs)
    return path


def test_generation_archive_is_one_model_with_a_function_per_program(tmp_path: Path) -> None:
    archive = export_generation(DECODER, tmp_path / "generation.pt2", SEQ, PAST)
    model = load_model(archive)
    assert model.programs == ("prefill", "decode")
    assert [b.function for b in model.buckets] == ["prefill", "decode"]
    assert [s.name for s in model.inputs] == ["input_ids"]  # the first program's
    table = buckets_json(model)
    assert table["programs"] == ["prefill", "decode"]
    assert [[s["name"] for s in f["inputs"]] for f in table["functions"]] == [
        ["input_ids"],
        ["input_ids", "past_keys", "past_values"],
    ]

    together = prepare_model(archive, TARGET)
    functions = {
        gvar.name_hint
        for gvar in together.mod.functions
        if gvar.name_hint in ("prefill", "decode", "main")
    }
    assert functions == {"prefill", "decode"}
    alone = {
        program: prepare_model(
            export_program(
                DECODER,
                program,
                "pt2",
                tmp_path / f"{program}.pt2",
                SEQ if program == "prefill" else PAST,
            ),
            TARGET,
        ).partition.tasks
        for program in ("prefill", "decode")
    }
    weights: dict[str, float] = {}
    for tasks in alone.values():
        for task in tasks:
            weights[task.key] = weights.get(task.key, 0) + task.weight
    assert {t.key: t.weight for t in together.partition.tasks} == weights
    shared = {t.key for t in alone["prefill"]} & {t.key for t in alone["decode"]}
    assert shared and len(together.partition.tasks) < sum(len(t) for t in alone.values())


def test_what_cannot_be_one_library_is_refused(tmp_path: Path) -> None:
    x = torch.randn(2, 3)
    scale = torch.export.export(_Scale(), (x,))
    product = torch.export.export(_Product(), (x, torch.randn(3, 4)))
    two = _archive(tmp_path / "two.pt2", first=scale, second=product)
    assert load_model(two).programs == ("first", "second")

    with pytest.raises(ModelError, match="holds 2 programs") as err:
        load_exported_program(two)
    assert err.value.code == "bad_pt2"
    with pytest.raises(ModelError, match="apply to a single program") as err:
        load_model(two, input_shapes={"x": [2, 3]})
    assert err.value.code == "bad_input_shape"

    same = _archive(tmp_path / "same.pt2", a=scale, b=torch.export.export(_Scale(), (x,)))
    with pytest.raises(ModelError, match="'a' and 'b' take the same input shapes"):
        load_model(same)

    dim = torch.export.Dim("rows", min=2, max=64)
    dynamic = torch.export.export(_Scale(), (torch.randn(4, 3),), dynamic_shapes=({0: dim},))
    symbolic = _archive(tmp_path / "symbolic.pt2", fixed=product, free=dynamic)
    with pytest.raises(ModelError, match="program 'free' has symbolic dimensions") as err:
        load_model(symbolic)
    assert err.value.code == "symbolic_shape"

    named = _archive(tmp_path / "named.pt2", **{"pre-fill": scale, "decode": product})
    with pytest.raises(ModelError, match="is not an identifier"):
        load_model(named)
