"""ONNX decoders with ``past_key_values`` inputs and ``present`` outputs (optimum's convention).

``optimum-onnx`` (``optimum-cli export onnx --task text-generation-with-past``) writes a decoder
as one pure function: the cache comes in as inputs and goes out, one position longer, as
outputs. Its names and dimensions, which this module reproduces:

- inputs ``input_ids`` ``int64 [batch_size, sequence_length]``, ``attention_mask``
  ``int64 [batch_size, past_sequence_length + sequence_length]``, ``position_ids``
  ``int64 [batch_size, sequence_length]`` (omitted by some exports: ``position_ids=False``),
  then ``past_key_values.{i}.key`` / ``.value`` ``float32 [batch_size, kv_heads,
  past_sequence_length, head_dim]`` for each layer ``i``;
- outputs ``logits`` ``float32 [batch_size, sequence_length, vocabulary]``, then
  ``present.{i}.key`` / ``.value`` ``[batch_size, kv_heads, past_sequence_length +
  sequence_length, head_dim]``.

Why not optimum itself: ``optimum-onnx`` 0.1.0 (the registry's latest here) pins
``transformers<4.58`` and would downgrade the ``dev`` extra's ``transformers>=5``. So the export
is torch's dynamo exporter (``torch.onnx.export(dynamo=True)``, opset 18, weights inline) over
:class:`PastPresentWrapper`, a module that puts the past tensors in a ``transformers``
``DynamicCache``, runs the causal LM of an :mod:`examples.decoders` spec (seeded random weights,
nothing downloaded) and returns the logits and the cache's tensors. The attention mask's
dimension, which torch names ``s53``, is renamed to optimum's ``past_sequence_length +
sequence_length``.

The cache is a plain ``DynamicCache`` (no config): every layer keeps all its positions, so a
sliding-window model (Mistral) still returns ``past + seq`` positions (its mask applies the
window), as optimum's exports do. ``transformers`` is a development dependency.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import onnx
import torch
from torch import nn

from examples.decoders import DecoderSpec, get_decoder
from examples.export import ONNX_OPSET, _atomic_write, _tidy_onnx
from examples.hf_exports import causal_lm

BATCH = "batch_size"
SEQUENCE = "sequence_length"
PAST = "past_sequence_length"
TOTAL = f"{PAST} + {SEQUENCE}"
"""optimum's ``dim_param`` of the attention mask and the ``present`` outputs."""

#: The largest past and prompt length the export's symbolic dimensions declare to torch.
MAX_PAST = 4096
MAX_SEQUENCE = 4096


def past_names(layers: int) -> list[str]:
    """``past_key_values.{i}.key``, ``past_key_values.{i}.value`` for each layer, in order."""
    return [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def present_names(layers: int) -> list[str]:
    """``present.{i}.key``, ``present.{i}.value`` for each layer, in order."""
    return [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]


def cache_shape(config: Any) -> tuple[int, int, int]:
    """``(layers, kv_heads, head_dim)`` of a ``transformers`` config."""
    layers = int(getattr(config, "num_hidden_layers", None) or config.n_layer)
    heads = int(getattr(config, "num_attention_heads", None) or config.n_head)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    hidden = int(getattr(config, "hidden_size", None) or config.n_embd)
    head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return layers, kv_heads, head_dim


class PastPresentWrapper(nn.Module):
    """``forward(input_ids, attention_mask, position_ids, *past) -> (logits, *present)``: the
    causal LM ``model`` over a ``DynamicCache`` holding ``past`` (key, value per layer).
    ``position_ids=False``: ``forward(input_ids, attention_mask, *past)``, the model deriving
    the positions itself (from the past's length)."""

    def __init__(self, model: nn.Module, position_ids: bool = True) -> None:
        super().__init__()
        self.model = model
        self.position_ids = position_ids
        self.layers = cache_shape(model.config)[0]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *rest: torch.Tensor):
        from transformers.cache_utils import DynamicCache  # noqa: PLC0415 - dev dependency

        positions = rest[0] if self.position_ids else None
        past = rest[1:] if self.position_ids else rest
        cache = DynamicCache()
        for layer in range(self.layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
        present = []
        for layer in out.cache.layers:
            present += [layer.keys, layer.values]
        return (out.logits, *present)


def example_inputs(
    spec: DecoderSpec | str, batch: int = 2, seq: int = 3, past: int = 5, position_ids: bool = True
) -> tuple[torch.Tensor, ...]:
    """Seeded inputs of the export: ``batch`` sequences of ``seq`` new tokens after ``past``."""
    spec = get_decoder(spec) if isinstance(spec, str) else spec
    layers, kv_heads, head_dim = cache_shape(spec.make_config())
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size, (batch, seq), generator=generator)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    positions = torch.arange(past, past + seq).expand(batch, seq).contiguous()
    cache = [
        torch.randn(batch, kv_heads, past, head_dim, generator=generator) for _ in range(2 * layers)
    ]
    return (ids, mask, *([positions] if position_ids else []), *cache)


def to_onnx_proto(
    spec: DecoderSpec | str, position_ids: bool = True, opset: int = ONNX_OPSET
) -> onnx.ModelProto:
    """The optimum-style ONNX model of decoder ``spec`` (see the module docstring), checked."""
    spec = get_decoder(spec) if isinstance(spec, str) else spec
    model = causal_lm(spec)
    wrapper = PastPresentWrapper(model, position_ids).eval()
    layers = wrapper.layers
    batch = torch.export.Dim(BATCH, min=1, max=64)
    seq = torch.export.Dim(SEQUENCE, min=1, max=MAX_SEQUENCE)
    past = torch.export.Dim(PAST, min=1, max=MAX_PAST)
    # torch.export cannot write the mask's length as past + seq (a sum of two Dims): dynamic
    # here, renamed below.
    rest: list[Any] = [{0: batch, 1: seq}] if position_ids else []
    rest += [{0: batch, 2: past} for _ in range(2 * layers)]
    shapes = ({0: batch, 1: seq}, {0: batch, 1: torch.export.Dim.DYNAMIC}, tuple(rest))
    inputs = ["input_ids", "attention_mask", *(["position_ids"] if position_ids else [])]
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            example_inputs(spec, position_ids=position_ids),
            dynamo=True,
            dynamic_shapes=shapes,
            input_names=inputs + past_names(layers),
            output_names=["logits", *present_names(layers)],
            opset_version=opset,
            optimize=False,
            verbose=False,
        )
    assert program is not None
    _tidy_onnx(program.model)
    from onnxscript import ir  # noqa: PLC0415

    proto = ir.serde.serialize_model(program.model)
    mask_dim = proto.graph.input[1].type.tensor_type.shape.dim[1]
    if mask_dim.dim_param and mask_dim.dim_param != TOTAL:
        _rename_dim_param(proto, mask_dim.dim_param, TOTAL)
    onnx.checker.check_model(proto)
    return proto


def _rename_dim_param(proto: onnx.ModelProto, old: str, new: str) -> None:
    graph = proto.graph
    for value in [*graph.input, *graph.output, *graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param == old:
                dim.dim_param = new


def export_onnx(
    spec: DecoderSpec | str, path: str | os.PathLike[str], position_ids: bool = True
) -> Path:
    """Write decoder ``spec`` as one self-contained optimum-style ONNX file (atomic)."""
    proto = to_onnx_proto(spec, position_ids)
    return _atomic_write(Path(path), lambda f: f.write(proto.SerializeToString()))


def genai_builder_export(hf_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]) -> Path:
    """ONNX Runtime GenAI's model builder (``python -m onnxruntime_genai.models.builder``, fp32,
    CPU) on a ``save_pretrained`` folder, offline; returns the ``model.onnx`` it writes (with
    ``model.onnx.data`` beside it). Needs ``onnxruntime-genai`` and ``onnx-ir`` (the
    ``bench-llm`` extra). The builder also writes a tokenizer: for a Qwen2 folder it makes one
    without any file; for Llama it needs a tokenizer beside the weights (and sentencepiece)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    out = Path(out_dir)
    cache = out.parent / f".{out.name}-cache"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf_dir),
            "-o",
            str(out),
            "-p",
            "fp32",
            "-e",
            "cpu",
            "-c",
            str(cache),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    return out / "model.onnx"


def save_pretrained(spec: DecoderSpec | str, folder: str | os.PathLike[str]) -> Path:
    """``save_pretrained`` decoder ``spec`` (seeded random weights) into ``folder``."""
    causal_lm(spec).save_pretrained(str(folder))
    return Path(folder)
