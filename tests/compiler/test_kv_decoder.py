"""Prefill and decode programs with an explicit KV cache (issue 20, ``examples/kv_decoder.py``).

A tiny ``transformers`` decoder (Llama; Qwen2 with grouped-query attention) is exported as a
prefill program (``[1, S]`` ids -> last logits + the stacked K/V caches) and a decode program
(one token + a past cache of length ``P`` -> logits + the cache of ``P + 1``), in both formats.
Checked: the two programs together are the model (torch); TuneHub imports both
(``tunehub inspect``); decode's GEMM tasks are GEMVs (M = 1) and none is one of prefill's
tasks; a zero-trial artifact of each (peers + default schedules, as ``tunehub compile``
builds it), loaded from disk, matches torch / ONNX Runtime, and TVM's prefill feeding TVM's
decode gives the full model's next logits. No tuning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from compiler.build.builder import build_zero_trial, export_library
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import compare, reference_outputs, verify
from compiler.frontends.model_spec import TensorSpec
from compiler.prepare import PreparedModel, prepare_model
from compiler.target import cpu_target
from examples.kv_decoder import (
    DECODE_INPUTS,
    Decode,
    Prefill,
    build_causal_lm,
    cache_shape,
    example_inputs,
    export_program,
    get_kv_decoder,
)

TARGET = cpu_target(2)
REPO = Path(__file__).resolve().parents[2]
SEQ = 16
PAST = 16
FORMATS = ("pt2", "onnx")
DECODER = "qwen2"  # grouped-query attention: 4 query heads over 2 key/value heads


@pytest.fixture(scope="module")
def program_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``program_file(program, fmt)``: the Qwen2 program exported at SEQ / PAST (once)."""
    folder = tmp_path_factory.mktemp("kv")
    cache: dict[tuple[str, str], Path] = {}

    def get(program: str, fmt: str) -> Path:
        if (program, fmt) not in cache:
            length = SEQ if program == "prefill" else PAST
            cache[(program, fmt)] = export_program(
                DECODER, program, fmt, folder / f"{program}.{fmt}", length
            )
        return cache[(program, fmt)]

    return get


@pytest.fixture(scope="module")
def prepared(program_file) -> Callable[[str, str], PreparedModel]:
    cache: dict[tuple[str, str], PreparedModel] = {}

    def get(program: str, fmt: str) -> PreparedModel:
        if (program, fmt) not in cache:
            cache[(program, fmt)] = prepare_model(
                program_file(program, fmt), TARGET, allow_external_data=False
            )
        return cache[(program, fmt)]

    return get


@pytest.fixture(scope="module")
def library(prepared, tmp_path_factory) -> Callable[[str, str], LoadedLibrary]:
    """The zero-trial artifact of a program, exported and loaded back from disk (once)."""
    folder = tmp_path_factory.mktemp("kv-libs")
    cache: dict[tuple[str, str], LoadedLibrary] = {}

    def get(program: str, fmt: str) -> LoadedLibrary:
        if (program, fmt) not in cache:
            model = prepared(program, fmt)
            tasks = [
                (t.key, e.dispatched[0])
                for t, e in zip(model.partition.tasks, model.partition.extracted)
            ]
            executable, peers = build_zero_trial(model.mod, TARGET, tasks)
            path = export_library(
                executable, folder / f"{program}-{fmt}.so", link_peers=bool(peers)
            )
            cache[(program, fmt)] = LoadedLibrary(path, "cpu")
        return cache[(program, fmt)]

    return get


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_prefill_then_decode_is_the_model(name: str) -> None:
    """Prefill of S tokens, then decode of token S on its cache: the full model's logits at
    positions S - 1 and S; the decode cache is the prefill cache plus one position."""
    spec = get_kv_decoder(name)
    model = build_causal_lm(spec)
    ids = spec.make_input_ids(SEQ + 1, seed=5)
    with torch.no_grad():
        full = model(input_ids=ids, use_cache=False).logits
        logits, keys, values = Prefill(model)(ids[:, :SEQ])
        assert logits.shape == (1, 1, spec.vocab_size)
        assert keys.shape == values.shape == cache_shape(spec, SEQ)
        torch.testing.assert_close(logits[0, -1], full[0, SEQ - 1], rtol=1e-4, atol=1e-5)
        next_logits, next_keys, next_values = Decode(model)(ids[:, SEQ:], keys, values)
    torch.testing.assert_close(next_logits[0, -1], full[0, SEQ], rtol=1e-4, atol=1e-5)
    assert next_keys.shape == cache_shape(spec, SEQ + 1)
    assert torch.equal(next_keys[..., :SEQ, :], keys)
    assert torch.equal(next_values[..., :SEQ, :], values)


def test_cache_is_bounded() -> None:
    limit = get_kv_decoder(DECODER).make_config().max_position_embeddings
    with pytest.raises(ValueError, match="cache bound"):
        example_inputs(DECODER, "decode", limit)
    with pytest.raises(ValueError, match="cache bound"):
        example_inputs(DECODER, "prefill", limit + 1)


@pytest.mark.parametrize("fmt", FORMATS)
def test_both_programs_import_with_their_inputs(fmt: str, prepared) -> None:
    shape = cache_shape(get_kv_decoder(DECODER), PAST)
    assert prepared("prefill", fmt).model.inputs == (TensorSpec("input_ids", (1, SEQ), "int64"),)
    assert prepared("decode", fmt).model.inputs == (
        TensorSpec(DECODE_INPUTS[0], (1, 1), "int64"),
        TensorSpec(DECODE_INPUTS[1], shape, "float32"),
        TensorSpec(DECODE_INPUTS[2], shape, "float32"),
    )


def _gemms(model: PreparedModel) -> list:
    return [t for t in model.partition.tasks if "matmul" in t.name]


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_tasks_are_gemvs_distinct_from_prefill(fmt: str, prepared) -> None:
    """Every projection of decode (a 2-D matmul) has one row; prefill's have SEQ (but the LM
    head's, which sees the last position only); the LM head is the one GEMM task decode shares
    with prefill by key."""
    decode, prefill = prepared("decode", fmt), prepared("prefill", fmt)
    projections = [t for t in _gemms(decode) if len(t.shapes[-1][1]) == 2]
    assert len(projections) >= 5, [t.name for t in _gemms(decode)]  # q, k/v, o, MLP, LM head
    assert all(t.shapes[-1][1][0] == 1 for t in projections), [t.shapes for t in projections]
    # attention over the cache: one query row against PAST + 1 keys
    scores = [t for t in _gemms(decode) if t.shapes[-1][1][-2:] == (1, PAST + 1)]
    assert scores, [t.shapes for t in _gemms(decode)]
    rows = {t.shapes[-1][1][0] for t in _gemms(prefill) if len(t.shapes[-1][1]) == 2}
    assert rows == {SEQ, 1}, rows  # the LM head: logits of the last position only
    vocab = get_kv_decoder(DECODER).vocab_size
    shared = [t for t in _gemms(decode) if t.key in {p.key for p in prefill.partition.tasks}]
    # the LM head on one position is the same GEMV in both programs (one task, by key)
    assert [t.shapes[-1][1] for t in shared] == [(1, vocab)], [t.name for t in shared]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("program", ["prefill", "decode"])
def test_zero_trial_artifact_matches_reference(program: str, fmt: str, prepared, library) -> None:
    model = prepared(program, fmt)
    lib = library(program, fmt)
    result = verify(model.model, lib.run)
    assert result.passed, result.message
    # verify draws token ids 0 and 1: once more over the whole vocabulary
    inputs = [
        t.numpy()
        for t in example_inputs(DECODER, program, SEQ if program == "prefill" else PAST, seed=2)
    ]
    again = compare(lib.run(inputs), reference_outputs(model.model, inputs), result.reference)
    assert again.passed, again.message


@pytest.mark.parametrize("fmt", FORMATS)
def test_tvm_prefill_feeds_tvm_decode(fmt: str, library) -> None:
    """Generation across the two artifacts: TVM's prefill cache, passed to TVM's decode, gives
    the full torch model's logits of the next position."""
    spec = get_kv_decoder(DECODER)
    ids = spec.make_input_ids(SEQ + 1, seed=9)
    with torch.no_grad():
        full = build_causal_lm(spec)(input_ids=ids, use_cache=False).logits[0].numpy()
    logits, keys, values = library("prefill", fmt).run([ids[:, :SEQ].numpy()])
    assert compare([logits[0, -1]], [full[SEQ - 1]], "torch").passed
    next_logits, next_keys, _ = library("decode", fmt).run([ids[:, SEQ:].numpy(), keys, values])
    result = compare([next_logits[0, -1]], [full[SEQ]], "torch")
    assert result.passed, result.message
    np.testing.assert_array_equal(next_keys[..., :SEQ, :], keys)


def test_cli_inspects_both_programs(program_file) -> None:
    """``tunehub inspect --json`` takes each program file; decode's input list has the cache."""
    counts = {}
    for program in ("prefill", "decode"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "service.cli",
                "inspect",
                str(program_file(program, "pt2")),
                "--json",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        names = [spec["name"] for spec in data["model"]["inputs"]]
        assert names == (["input_ids"] if program == "prefill" else list(DECODE_INPUTS))
        counts[program] = len(data["tasks"])
    assert counts["prefill"] > 5 and counts["decode"] > 5, counts


class _CatOntoEmpty(torch.nn.Module):
    """What a ``DynamicCache`` layer does with its first keys: ``cat([tensor([]), x], -2)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.tensor([]), x * 2], dim=-2) + 1


def test_cat_skips_a_legacy_empty_operand(tmp_path: Path) -> None:
    """compiler.frontends.pt2_ops's ``cat`` converter: a 1-D empty operand is skipped, as in torch
    (TVM's converter refused the mixed ranks), and the result matches torch."""
    from compiler.build.builder import build
    from compiler.frontends.importer import import_model
    from compiler.frontends.loader import load_model

    program = torch.export.export(_CatOntoEmpty().eval(), (torch.randn(1, 2, 3, 4),))
    torch.export.save(program, tmp_path / "m.pt2")
    model = load_model(tmp_path / "m.pt2")
    result = verify(model, LoadedLibrary.from_executable(build(import_model(model), TARGET)).run)
    assert result.passed, result.message
