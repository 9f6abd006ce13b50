"""Prefill and decode programs of a ``transformers`` decoder with an explicit KV cache (issue 20).

A generating LLM runs two programs: *prefill* reads the prompt and produces the key/value cache,
*decode* reads one token and the cache of the ``P`` tokens before it and produces the next
logits and the cache grown by one. Here both are plain ``torch.export`` programs with static
shapes whose cache is explicit tensors, so TuneHub imports each like any model:

- :class:`Prefill`: ``forward(input_ids int64 [1, S]) -> (logits float32 [1, 1, vocab],
  keys float32 [L, 1, Hkv, S, D], values float32 [L, 1, Hkv, S, D])``: the logits of the last
  position only (what generation needs next; ``transformers``' ``logits_to_keep=1``), the keys
  and values of every layer stacked into one tensor each (``L`` layers, ``Hkv`` key/value heads,
  head size ``D``; rotary already applied to the keys, as the model caches them).
- :class:`Decode`: ``forward(input_ids int64 [1, 1], past_keys [L, 1, Hkv, P, D],
  past_values [L, 1, Hkv, P, D]) -> (logits [1, 1, vocab], keys [L, 1, Hkv, P + 1, D],
  values [L, 1, Hkv, P + 1, D])``: the token at position ``P``.
- :class:`Step`: ``forward(input_ids int64 [1, 1], position int64 [1], keys, values
  [L, 1, Hkv, C, D]) -> (logits, keys, values [L, 1, Hkv, C, D])``: decode over a cache of
  fixed capacity C (``transformers``' ``StaticCache``), the token's key and value written at
  ``position``: one program for every step of a generation up to C tokens (a prefill's cache
  is zero-padded to C to start it).

The modelling code is ``transformers``' own (its attention, rotary embedding, masks, GQA): each
wrapper builds a ``transformers.DynamicCache`` *inside* ``forward`` from the explicit tensors
(``cache.update`` per layer, so the model concatenates the new key/value onto them) and reads
the grown cache back out. ``torch.export`` traces through that Python object, so the exported
graph has tensors only (``aten.cat`` of past and new, no cache object crosses the boundary);
the shapes are static, so positions and masks are constants. Passing a ``DynamicCache`` *as an
input* is what does not export as a tensor program (it is a Python object, not a tensor);
a ``StaticCache`` held by the module exports as mutated buffers, which a pure-function compiler
cannot take either; :class:`Step` builds one inside ``forward`` from clones of its inputs, so
its in-place ``index_copy_`` is on intermediates and the program stays a pure function.
Families whose cache layers crop (Mistral's sliding window) would return a cache shorter than
``P + 1`` and are not offered here.

The cache is bounded: ``S``, ``P + 1`` and ``C`` must not exceed the config's
``max_position_embeddings`` (checked). The exports follow :mod:`examples.decoders` (atomic
writes, ONNX by torch's dynamo exporter, weights inline, seeded random weights, no download).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import onnx
import torch
from torch import nn

from examples.decoders import DECODERS, DecoderSpec, _spec
from examples.export import ONNX_OPSET, _atomic_write, onnx_from_program

PREFILL_INPUTS = ("input_ids",)
DECODE_INPUTS = ("input_ids", "past_keys", "past_values")
STEP_INPUTS = ("input_ids", "position", "keys", "values")
OUTPUTS = ("logits", "keys", "values")
PROGRAMS = ("prefill", "decode", "step")
INPUTS = {"prefill": PREFILL_INPUTS, "decode": DECODE_INPUTS, "step": STEP_INPUTS}

DEFAULT_SEQ = 16
DEFAULT_PAST = 16

#: The benchmark's decoder (``bench/bench_decoder.py``): Llama-style, hidden 512, 8 layers,
#: 8 query heads over 4 key/value heads (head size 64), SiLU-gated MLP of 1408, vocabulary 8192,
#: untied LM head: 32.0 M parameters; a cache of up to 1024 positions.
BENCH_DECODER = _spec(
    "llama_32m", "LlamaForCausalLM", "LlamaConfig",
    "Llama-style benchmark decoder, 32 M parameters, GQA 8/4",
    vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
)  # fmt: skip

KV_DECODERS: dict[str, DecoderSpec] = {
    **{name: DECODERS[name] for name in ("llama", "qwen2")},
    BENCH_DECODER.name: BENCH_DECODER,
}
"""Decoders offered as prefill/decode programs: the tiny Llama (multi-head) and Qwen2
(grouped-query, q/k/v biases) of :data:`examples.decoders.DECODERS`, and the benchmark's."""


def get_kv_decoder(name: str) -> DecoderSpec:
    """The spec named ``name`` in :data:`KV_DECODERS`; ``KeyError`` otherwise."""
    try:
        return KV_DECODERS[name]
    except KeyError:
        raise KeyError(f"unknown KV decoder {name!r}; known: {sorted(KV_DECODERS)}") from None


def build_causal_lm(spec: DecoderSpec) -> nn.Module:
    """The ``transformers`` causal LM of ``spec`` in eval mode (weights seeded, see
    :meth:`DecoderSpec.build`)."""
    return spec.build().model


def _cache(model: nn.Module) -> object:
    from transformers import DynamicCache  # noqa: PLC0415 - a development dependency

    return DynamicCache(config=model.config)


def _stacked(cache: object) -> tuple[torch.Tensor, torch.Tensor]:
    layers = cache.layers  # type: ignore[attr-defined]
    return (
        torch.stack([layer.keys for layer in layers]),
        torch.stack([layer.values for layer in layers]),
    )


class Prefill(nn.Module):
    """``forward(input_ids [1, S]) -> (last logits [1, 1, V], keys, values [L, 1, Hkv, S, D])``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cache = _cache(self.model)
        out = self.model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
        return (out.logits, *_stacked(cache))


class Decode(nn.Module):
    """``forward(input_ids [1, 1], past_keys, past_values [L, 1, Hkv, P, D]) ->
    (logits [1, 1, V], keys, values [L, 1, Hkv, P + 1, D])``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        cache = _cache(self.model)
        for layer in range(past_keys.shape[0]):
            cache.update(past_keys[layer], past_values[layer], layer)  # type: ignore[attr-defined]
        out = self.model(input_ids=input_ids, cache=cache, use_cache=True)
        return (out.logits, *_stacked(cache))


class Step(nn.Module):
    """``forward(input_ids [1, 1], position int64 [1], keys, values [L, 1, Hkv, C, D]) ->
    (logits [1, 1, V], keys, values [L, 1, Hkv, C, D])``: one decode step over a cache of fixed
    capacity C (``transformers``' ``StaticCache``), the token at ``position`` attending to the
    cache's positions ``0..position`` (the rest masked), its key and value written at
    ``position``. One program for every step of a generation up to C tokens, where
    :class:`Decode` needs one export per past length. The cache is built inside ``forward``
    from clones of the inputs (the inputs are not mutated: ``StaticCache`` writes with
    ``index_copy_``), each layer given its own copy of ``position`` (a layer's update advances
    its length in place)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        position: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from transformers import StaticCache  # noqa: PLC0415 - a development dependency

        cache = StaticCache(config=self.model.config, max_cache_len=keys.shape[3])
        for index, layer in enumerate(cache.layers):
            layer.lazy_initialization(keys[index], values[index])
            layer.keys, layer.values = keys[index].clone(), values[index].clone()
            layer.cumulative_length = position.reshape(()).clone()
        out = self.model(
            input_ids=input_ids,
            cache=cache,
            use_cache=True,
            position_ids=position.reshape(1, 1),
            cache_position=position.reshape(1),
        )
        return (out.logits, *_stacked(cache))


def cache_shape(spec: DecoderSpec, length: int) -> tuple[int, int, int, int, int]:
    """``(L, 1, Hkv, length, D)``: the shape of a stacked key (or value) cache of ``spec``."""
    config = spec.make_config()
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return (config.num_hidden_layers, 1, kv_heads, length, head_dim)


def _check_length(spec: DecoderSpec, length: int, what: str) -> None:
    limit = int(spec.make_config().max_position_embeddings)
    if not 1 <= length <= limit:
        raise ValueError(f"{what} {length} is outside the cache bound 1..{limit} of {spec.name}")


def example_inputs(name: str, program: str, length: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Inputs of ``program`` (``"prefill"``: ``length`` = S; ``"decode"``: ``length`` = P;
    ``"step"``: ``length`` = the capacity C, position C // 2): token ids over the whole
    vocabulary and a standard-normal cache (private generator)."""
    spec = get_kv_decoder(name)
    generator = torch.Generator().manual_seed(seed)
    if program == "prefill":
        _check_length(spec, length, "prefill length")
        return (torch.randint(0, spec.vocab_size, (1, length), generator=generator),)
    if program not in ("decode", "step"):
        raise ValueError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
    if program == "decode":
        _check_length(spec, length + 1, "decode past length + 1")
    else:
        _check_length(spec, length, "step cache capacity")
    ids = torch.randint(0, spec.vocab_size, (1, 1), generator=generator)
    shape = cache_shape(spec, length)
    cache = (torch.randn(shape, generator=generator), torch.randn(shape, generator=generator))
    if program == "decode":
        return (ids, *cache)
    return (ids, torch.tensor([length // 2]), *cache)


def program_module(name: str, program: str) -> nn.Module:
    """A fresh :class:`Prefill`, :class:`Decode` or :class:`Step` of decoder ``name`` (eval
    mode)."""
    if program not in PROGRAMS:
        raise ValueError(f"unknown program {program!r}; known: {', '.join(PROGRAMS)}")
    return _wrappers(build_causal_lm(get_kv_decoder(name)))[program]


def _wrappers(model: nn.Module) -> dict[str, nn.Module]:
    return {
        "prefill": Prefill(model).eval(),
        "decode": Decode(model).eval(),
        "step": Step(model).eval(),
    }


def to_exported_program(
    name: str, program: str, length: int, module: nn.Module | None = None
) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``program`` of ``name`` at ``length`` (static shapes);
    ``module`` reuses an already built :func:`program_module`."""
    module = module if module is not None else program_module(name, program)
    with torch.no_grad():
        return torch.export.export(module, example_inputs(name, program, length))


def export_program(
    name: str,
    program: str,
    fmt: str,
    path: str | os.PathLike[str],
    length: int,
    opset: int = ONNX_OPSET,
) -> Path:
    """Write ``program`` (``"prefill"`` at S = ``length`` / ``"decode"`` at P = ``length`` /
    ``"step"`` at capacity C = ``length``) of
    decoder ``name`` as ``fmt`` (``"pt2"``, or ``"onnx"``: self-contained, inputs named
    :data:`INPUTS` of the program, outputs :data:`OUTPUTS`), atomically."""
    exported = to_exported_program(name, program, length)
    if fmt == "pt2":
        return _atomic_write(Path(path), lambda f: torch.export.save(exported, f))
    if fmt != "onnx":
        raise ValueError(f"unknown format {fmt!r}; known: onnx, pt2")
    proto = to_onnx_proto(name, program, length, opset, exported)
    return _atomic_write(Path(path), lambda f: f.write(proto.SerializeToString()))


def export_both(
    name: str, program: str, length: int, folder: str | os.PathLike[str]
) -> dict[str, Path]:
    """``program`` of ``name`` at ``length`` as ``folder/<program><length>.pt2`` and ``.onnx``
    from one ``torch.export`` trace (see :func:`export_program`); the paths by format."""
    exported = to_exported_program(name, program, length)
    stem = Path(folder) / f"{program}{length}"
    proto = to_onnx_proto(name, program, length, exported=exported)
    return {
        "pt2": _atomic_write(stem.with_suffix(".pt2"), lambda f: torch.export.save(exported, f)),
        "onnx": _atomic_write(
            stem.with_suffix(".onnx"), lambda f: f.write(proto.SerializeToString())
        ),
    }


def export_programs(
    name: str, path: str | os.PathLike[str], programs: dict[str, tuple[str, int]]
) -> Path:
    """Write programs of decoder ``name`` as one ``.pt2`` archive, atomically: ``programs`` maps
    each archive name to ``(program, length)`` (``"prefill"`` at S = length, ``"decode"`` at
    P = length, ``"step"`` at capacity C = length), all of one model's weights. What a user
    uploads to tune and build them as one job (``compiler.frontends.loader``: one function per
    program; the library tells them apart by their inputs' shapes, so no two may have the same
    program and length)."""
    model = build_causal_lm(get_kv_decoder(name))
    wrappers = _wrappers(model)
    unknown = sorted({program for program, _ in programs.values()} - set(wrappers))
    if unknown:
        raise ValueError(f"unknown program(s) {unknown}; known: {', '.join(PROGRAMS)}")
    exported = {
        archive_name: to_exported_program(name, program, length, wrappers[program])
        for archive_name, (program, length) in programs.items()
    }
    from torch.export.pt2_archive._package import package_pt2  # noqa: PLC0415 - torch >= 2.8

    return _atomic_write(Path(path), lambda f: package_pt2(f, exported_programs=exported))


def export_generation(
    name: str, path: str | os.PathLike[str], seq: int = DEFAULT_SEQ, past: int = DEFAULT_PAST
) -> Path:
    """Both programs of decoder ``name`` as one ``.pt2`` archive (:func:`export_programs`):
    ``prefill`` at S = ``seq`` and ``decode`` at P = ``past``."""
    return export_programs(name, path, {"prefill": ("prefill", seq), "decode": ("decode", past)})


def to_onnx_proto(
    name: str,
    program: str,
    length: int,
    opset: int = ONNX_OPSET,
    exported: torch.export.ExportedProgram | None = None,
) -> onnx.ModelProto:
    """The checked ONNX model of ``program`` of ``name`` at ``length`` (weights inline)."""
    exported = exported if exported is not None else to_exported_program(name, program, length)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    inputs = INPUTS[program]
    return onnx_from_program(
        exported,
        example_inputs(name, program, length),
        input_names=list(inputs),
        output_names=list(OUTPUTS),
        opset=opset,
    )


__all__ = [
    "BENCH_DECODER",
    "DECODE_INPUTS",
    "INPUTS",
    "KV_DECODERS",
    "OUTPUTS",
    "PREFILL_INPUTS",
    "PROGRAMS",
    "STEP_INPUTS",
    "Decode",
    "Prefill",
    "Step",
    "cache_shape",
    "example_inputs",
    "export_both",
    "export_generation",
    "export_program",
    "export_programs",
    "get_kv_decoder",
    "program_module",
    "to_exported_program",
    "to_onnx_proto",
]
