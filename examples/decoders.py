"""Tiny transformer decoders from Hugging Face ``transformers`` definitions, and their export.

Each :class:`DecoderSpec` names a ``transformers`` causal-LM class and a tiny config (2 layers,
hidden 64, vocabulary 512): the real modelling code of that family (its attention, masks,
normalization, rotary embedding and MLP), with seeded random weights, no download. The models
run with ``use_cache=False`` in eval mode and are wrapped by :class:`LogitsOnly`, whose
``forward(input_ids)`` takes ``int64 [1, seq]`` token ids and returns the logits
``float32 [1, seq, vocab]``.

``DECODERS`` holds the families issue 20 asks for (Llama, GPT-2, Qwen2 with grouped-query
attention, Mistral with a sliding window shorter than the sequence, Phi with partial rotary and
parallel attention/MLP); ``EXTRA_DECODERS`` a few more the benchmark tries
(``bench/bench_decoder_import.py``), including a mixture-of-experts model that is still refused.

Exports follow :mod:`examples.export`: static shapes (``seq`` fixed at export; ``export_dynamic``
keeps it symbolic, for shape buckets), atomic writes,
ONNX by torch's dynamo exporter at opset ``ONNX_OPSET`` with onnxscript's constant folding only,
the input named ``input_ids`` and the output ``logits``. ``transformers`` is a development
dependency (the ``dev`` extra): the service never imports this module.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import onnx
import torch
from torch import nn

from examples.export import ONNX_OPSET, _atomic_write, onnx_from_program
from examples.networks import WEIGHT_SEED

DEFAULT_SEQ = 16
"""Sequence length of the static exports the tests and the benchmark use."""

INPUT_NAME = "input_ids"
OUTPUT_NAME = "logits"

#: Weight standard deviation of every decoder (``initializer_range``). ``transformers``' default
#: of 0.02 leaves a 64-wide model's attention almost uniform, so a wrong mask or rotary embedding
#: would barely move the logits; 0.1 makes the attention pattern, and so those parts, observable.
INIT_STD = 0.1

_SMALL = MappingProxyType(
    {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 128,
    }
)


class LogitsOnly(nn.Module):
    """``forward(input_ids) -> logits`` of a ``transformers`` causal LM, without a KV cache."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


@dataclass(frozen=True)
class DecoderSpec:
    """A decoder definition: a ``transformers`` class, its config class and the config values.

    ``features`` says in a few words what the definition exercises (the benchmark prints it).
    """

    name: str
    model_class: str
    config_class: str
    config: Mapping[str, Any] = field(repr=False)
    features: str = ""

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    def make_config(self) -> Any:
        import transformers  # noqa: PLC0415 - a development dependency, needed only to build

        values = {"initializer_range": INIT_STD, **self.config, "use_cache": False}
        return getattr(transformers, self.config_class)(**values)

    def build(self) -> LogitsOnly:
        """A fresh model in eval mode whose weights depend only on ``WEIGHT_SEED``.

        The caller's global torch RNG state is saved and restored.
        """
        import transformers  # noqa: PLC0415 - a development dependency, needed only to build

        config = self.make_config()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(WEIGHT_SEED)
            model = getattr(transformers, self.model_class)(config)
        return LogitsOnly(model).eval()

    def make_input_ids(self, seq: int = DEFAULT_SEQ, seed: int = 0) -> torch.Tensor:
        """``int64 [1, seq]`` token ids drawn over the whole vocabulary (a private generator)."""
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.vocab_size, (1, seq), generator=generator, dtype=torch.int64)


def _spec(name: str, model: str, config: str, features: str, **values: Any) -> DecoderSpec:
    return DecoderSpec(name, model, config, MappingProxyType(values), features)


DECODERS: dict[str, DecoderSpec] = {
    spec.name: spec
    for spec in (
        _spec("llama", "LlamaForCausalLM", "LlamaConfig",
              "RMSNorm, rotary, SiLU-gated MLP, multi-head attention",
              **_SMALL, num_key_value_heads=4),
        _spec("gpt2", "GPT2LMHeadModel", "GPT2Config",
              "learned positions, LayerNorm, Conv1D (addmm) projections, tanh-GELU MLP",
              vocab_size=512, n_embd=64, n_layer=2, n_head=4, n_positions=128,
              bos_token_id=511, eos_token_id=511),
        _spec("qwen2", "Qwen2ForCausalLM", "Qwen2Config",
              "Llama-style with q/k/v biases and grouped-query attention (4 heads, 2 KV heads)",
              **_SMALL, num_key_value_heads=2),
        _spec("mistral", "MistralForCausalLM", "MistralConfig",
              "grouped-query attention (4/2) and a sliding window of 8 < seq 16",
              **_SMALL, num_key_value_heads=2, sliding_window=8),
        _spec("phi", "PhiForCausalLM", "PhiConfig",
              "LayerNorm, partial rotary (half the head), parallel attention and GELU MLP",
              **_SMALL, partial_rotary_factor=0.5),
    )
}  # fmt: skip
"""The decoder definitions issue 20 asks for, by stable name."""

EXTRA_DECODERS: dict[str, DecoderSpec] = {
    spec.name: spec
    for spec in (
        _spec("gemma", "GemmaForCausalLM", "GemmaConfig",
              "multi-query attention (1 KV head), (1 + w) RMSNorm, scaled embeddings",
              **_SMALL, num_key_value_heads=1, head_dim=16),
        _spec("qwen3", "Qwen3ForCausalLM", "Qwen3Config",
              "grouped-query attention with RMSNorm on queries and keys",
              **_SMALL, num_key_value_heads=2, head_dim=16),
        _spec("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig",
              "fused QKV projection, partial rotary, parallel residual", **_SMALL),
        _spec("opt", "OPTForCausalLM", "OPTConfig",
              "learned positions with offset, ReLU MLP",
              vocab_size=512, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=128, word_embed_proj_dim=64),
        _spec("mixtral", "MixtralForCausalLM", "MixtralConfig",
              "mixture of experts (4 experts, top-2), transformers' default grouped_mm experts",
              **_SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        _spec("mixtral_batched_mm", "MixtralForCausalLM", "MixtralConfig",
              "the same mixture of experts with experts_implementation='batched_mm'",
              **_SMALL, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
              experts_implementation="batched_mm"),
    )
}  # fmt: skip
"""More definitions, for the benchmark's table of what imports and what is refused."""

ALL_DECODERS: dict[str, DecoderSpec] = {**DECODERS, **EXTRA_DECODERS}


def get_decoder(name: str) -> DecoderSpec:
    """The spec named ``name`` (``DECODERS`` or ``EXTRA_DECODERS``); ``KeyError`` otherwise."""
    try:
        return ALL_DECODERS[name]
    except KeyError:
        raise KeyError(f"unknown decoder {name!r}; known: {sorted(ALL_DECODERS)}") from None


def to_exported_program(name: str, seq: int = DEFAULT_SEQ) -> torch.export.ExportedProgram:
    """``torch.export.export`` of decoder ``name`` on ``[1, seq]`` token ids (static shapes)."""
    spec = get_decoder(name)
    with torch.no_grad():
        return torch.export.export(spec.build(), (spec.make_input_ids(seq),))


def _onnx_from_program(
    program: torch.export.ExportedProgram, example: torch.Tensor, opset: int
) -> onnx.ModelProto:
    # The dynamo exporter logs a warning per export about torchvision ops it cannot register.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    return onnx_from_program(
        program, (example,), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], opset=opset
    )


def to_onnx_proto(name: str, seq: int = DEFAULT_SEQ, opset: int = ONNX_OPSET) -> onnx.ModelProto:
    """The ONNX model of decoder ``name`` at ``[1, seq]`` (weights inline, checker-valid)."""
    spec = get_decoder(name)
    return _onnx_from_program(to_exported_program(name, seq), spec.make_input_ids(seq), opset)


def export_pt2(name: str, path: str | os.PathLike[str], seq: int = DEFAULT_SEQ) -> Path:
    """``torch.export.save`` decoder ``name`` at ``[1, seq]`` to ``path`` (atomic); returns it."""
    program = to_exported_program(name, seq)
    return _atomic_write(Path(path), lambda f: torch.export.save(program, f))


def export_onnx(
    name: str, path: str | os.PathLike[str], seq: int = DEFAULT_SEQ, opset: int = ONNX_OPSET
) -> Path:
    """Write decoder ``name`` at ``[1, seq]`` as one self-contained ONNX file (atomic)."""
    proto = to_onnx_proto(name, seq, opset)
    return _atomic_write(Path(path), lambda f: f.write(proto.SerializeToString()))


SEQ_SYMBOL = "seq"
"""The ``dim_param`` of the sequence length in :func:`export_dynamic`'s ONNX files (a ``.pt2``
keeps the symbol torch chose, e.g. ``s70``: the ``Dim``'s name is not saved)."""


def to_dynamic_program(name: str, seq: int = DEFAULT_SEQ) -> torch.export.ExportedProgram:
    """``torch.export.export`` of decoder ``name`` with a symbolic sequence length
    (``Dim("seq", min=2, max=max_position_embeddings)``; traced on ``[1, seq]``)."""
    spec = get_decoder(name)
    config = spec.make_config()
    limit = int(getattr(config, "max_position_embeddings", None) or config.n_positions)
    dim = torch.export.Dim(SEQ_SYMBOL, min=2, max=limit)
    with torch.no_grad():
        return torch.export.export(
            spec.build(), (spec.make_input_ids(seq),), dynamic_shapes=({1: dim},)
        )


def _rename_dim_params(proto: onnx.ModelProto, old: str, new: str) -> None:
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    graph = proto.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                dim.dim_param = pattern.sub(new, dim.dim_param)


def export_dynamic(name: str, fmt: str, path: str | os.PathLike[str]) -> Path:
    """Write decoder ``name`` with a symbolic sequence length (:func:`to_dynamic_program`) as
    ``fmt`` (``"pt2"``, or ``"onnx"`` whose ``input_ids`` has ``dim_param`` ``seq``)."""
    program = to_dynamic_program(name)
    if fmt == "pt2":
        return _atomic_write(Path(path), lambda f: torch.export.save(program, f))
    if fmt != "onnx":
        raise ValueError(f"unknown format {fmt!r}; known: onnx, pt2")
    proto = _onnx_from_program(program, get_decoder(name).make_input_ids(DEFAULT_SEQ), ONNX_OPSET)
    symbol = proto.graph.input[0].type.tensor_type.shape.dim[1].dim_param
    if symbol:
        _rename_dim_params(proto, symbol, SEQ_SYMBOL)
    return _atomic_write(Path(path), lambda f: f.write(proto.SerializeToString()))


def export(name: str, fmt: str, path: str | os.PathLike[str], seq: int = DEFAULT_SEQ) -> Path:
    """``export_onnx`` or ``export_pt2`` by ``fmt`` (``"onnx"`` / ``"pt2"``)."""
    if fmt == "onnx":
        return export_onnx(name, path, seq)
    if fmt == "pt2":
        return export_pt2(name, path, seq)
    raise ValueError(f"unknown format {fmt!r}; known: onnx, pt2")
