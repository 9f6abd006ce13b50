"""One decode program for every step of a generation (issue 20, ``examples.kv_decoder.Step``):
a ``transformers`` ``StaticCache`` of fixed capacity C built inside ``forward``, the token
written at an input position. Checked: it imports from both formats (``.pt2``: the cache write
is ``index_put`` at one position, ``compiler.frontends.pt2_ops``' converter), its zero-trial build
matches torch / ONNX Runtime, and a library holding prefill and step (one archive) generates several
tokens exactly as the full model does, from one step program; a program that updates its
inputs or buffers in place is refused with one message. No tuning."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from compiler.build.builder import build_zero_trial
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import compare, verify
from compiler.errors import ModelError
from compiler.frontends.importer import import_model
from compiler.frontends.loader import load_model
from compiler.prepare import PreparedModel, prepare_model
from compiler.target import cpu_target
from examples.kv_decoder import (
    STEP_INPUTS,
    build_causal_lm,
    cache_shape,
    export_program,
    export_programs,
    get_kv_decoder,
)

TARGET = cpu_target(2)
DECODER = "qwen2"
SEQ = 8
CAPACITY = 16


def _library(prepared: PreparedModel) -> LoadedLibrary:
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    executable, _ = build_zero_trial(prepared.mod, TARGET, tasks)
    return LoadedLibrary.from_executable(
        executable, buckets=[b.to_json() for b in prepared.model.buckets]
    )


def test_prefill_then_steps_generate_like_the_full_model(tmp_path: Path) -> None:
    archive = export_programs(
        DECODER,
        tmp_path / "generate.pt2",
        {"prefill": ("prefill", SEQ), "step": ("step", CAPACITY)},
    )
    prepared = prepare_model(archive, TARGET)
    step_inputs = [s.name for s in prepared.model.buckets[1].model.inputs]
    assert step_inputs == list(STEP_INPUTS)
    library = _library(prepared)
    result = verify(prepared.model, library.run)
    assert result.passed, result.message

    spec = get_kv_decoder(DECODER)
    steps = 3
    ids = spec.make_input_ids(SEQ + steps, seed=4)
    with torch.no_grad():
        full = build_causal_lm(spec)(input_ids=ids, use_cache=False).logits[0].numpy()
    logits, keys, values = library.run([ids[:, :SEQ].numpy()])
    assert compare([logits[0, -1]], [full[SEQ - 1]], "torch").passed
    pad = [(0, 0)] * 3 + [(0, CAPACITY - SEQ), (0, 0)]
    keys, values = np.pad(keys, pad), np.pad(values, pad)
    assert keys.shape == cache_shape(spec, CAPACITY)
    for position in range(SEQ, SEQ + steps):
        token = ids[:, position : position + 1].numpy()
        logits, new_keys, values = library.run([token, np.array([position], "int64"), keys, values])
        result = compare([logits[0, -1]], [full[position]], "torch")
        assert result.passed, (position, result.message)
        np.testing.assert_array_equal(new_keys[..., :position, :], keys[..., :position, :])
        assert not new_keys[..., position + 1 :, :].any()  # written at its position only
        keys = new_keys


def test_step_from_onnx_matches_onnx_runtime(tmp_path: Path) -> None:
    path = export_program(DECODER, "step", "onnx", tmp_path / "step.onnx", CAPACITY)
    prepared = prepare_model(path, TARGET)
    result = verify(prepared.model, _library(prepared).run)
    assert result.passed and result.reference == "onnxruntime", result.message


class _WriteAt(torch.nn.Module):
    """``y = x.clone(); y[:, :, position] = new``: the cache write of a ``StaticCache``."""

    def forward(self, x: torch.Tensor, position: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        y = x.clone()
        y.index_copy_(2, position, new)
        return y * 2


def test_write_at_a_position_matches_torch(tmp_path: Path) -> None:
    x, new = torch.randn(2, 3, 6, 4), torch.randn(2, 3, 1, 4)
    program = torch.export.export(_WriteAt(), (x, torch.tensor([2]), new))
    torch.export.save(program, tmp_path / "write.pt2")
    prepared = prepare_model(tmp_path / "write.pt2", TARGET)
    library = _library(prepared)
    for position in (0, 3, 5):
        index = torch.tensor([position])
        expected = _WriteAt()(x, index, new).numpy()
        (actual,) = library.run([x.numpy(), index.numpy(), new.numpy()])
        np.testing.assert_allclose(actual, expected, rtol=1e-6)


class _MutatesInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.add_(1)
        return x * 2


class _MutatesBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return x * self.calls


@pytest.mark.parametrize(
    ("module", "named"), [(_MutatesInput(), "input(s) x"), (_MutatesBuffer(), "buffer(s) calls")]
)
def test_in_place_updates_of_inputs_or_buffers_are_refused(
    module: torch.nn.Module, named: str, tmp_path: Path
) -> None:
    torch.export.save(torch.export.export(module, (torch.randn(2, 3),)), tmp_path / "m.pt2")
    with pytest.raises(ModelError, match=re.escape(f"updates {named} in place")) as err:
        import_model(load_model(tmp_path / "m.pt2"))
    assert err.value.code == "mutates_state"
