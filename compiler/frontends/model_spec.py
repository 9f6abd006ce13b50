"""Plain descriptions of a loaded model: its format, content hash and input tensors."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from compiler.shapes.buckets import ShapeBuckets, SymbolicDim

ModelFormat = Literal["onnx", "pt2"]


@dataclass(frozen=True)
class TensorSpec:
    """A model input: name, static shape and dtype (a numpy dtype name such as ``"float32"``)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class ModelLimits:
    """What TuneHub accepts from a user's model file.

    ``max_bytes`` bounds the file (and, for ``.pt2``, the unpacked archive); ``max_input_elements``
    bounds each declared input; ``max_total_input_bytes`` bounds all inputs together.
    ``max_nodes`` bounds the graph's operator nodes (subgraphs included, ONNX; graph nodes,
    ``.pt2``). ``max_constant_elements`` / ``max_constant_bytes`` bound every tensor the import
    could materialize at compile time (initializers, ``Constant`` nodes and anything computed only
    from them, such as a ``ConstantOfShape``/``Expand``/``Tile``/``Range`` on constant operands):
    checked on the ONNX graph before TVM folds anything, and on the Relax module after each folding
    step (so they bound weights too: raise them with ``max_bytes``). ``max_programs`` bounds the
    programs of a ``.pt2`` archive (each is loaded, tuned and verified), checked before any is
    loaded.
    """

    max_bytes: int = 512 * 1024 * 1024
    max_input_elements: int = 1 << 26
    max_total_input_bytes: int = 1 << 30
    max_nodes: int = 20_000
    max_constant_elements: int = 1 << 27
    max_constant_bytes: int = 1 << 29
    max_programs: int = 8
    min_onnx_opset: int = 7
    max_onnx_opset: int = 23


@dataclass(frozen=True, eq=False)
class LoadedModel:
    """A validated model, ready to import into Relax.

    ``source`` is the framework object: an ``onnx.ModelProto`` or a
    ``torch.export.ExportedProgram``. ``inputs`` are the user inputs with every dimension static
    (symbolic dimensions already bound to the values the user gave). ``symbol_values`` holds those
    bindings by symbol name.
    """

    format: ModelFormat
    sha256: str
    size_bytes: int
    inputs: tuple[TensorSpec, ...]
    source: Any = field(repr=False)
    symbol_values: tuple[tuple[str, int], ...] = ()
    #: A model with symbolic dimensions compiled as shape buckets: one static specialization
    #: per bucket (:mod:`compiler.shapes.buckets`); this model's ``inputs`` are its largest
    #: bucket's.
    buckets: tuple[Bucket, ...] = ()
    bucket_spec: ShapeBuckets | None = None
    #: A bucketed model's symbolic dimensions, and its source with them still symbolic (the
    #: ONNX model before specialization, the ``torch.export`` program): what the reference
    #: framework runs at sizes between buckets (:mod:`compiler.shapes.padding`).
    symbolic_dims: tuple[SymbolicDim, ...] = ()
    dynamic_source: Any = field(default=None, repr=False)
    #: A ``.pt2`` archive of several programs (a decoder's ``prefill`` and ``decode``): their
    #: names, in the archive's order. Each is one static function of the model, carried in
    #: ``buckets`` like a shape bucket (no symbol values), so the programs are imported into
    #: one module, tuned as one job (a task they share is one task), built into one library
    #: that picks the function by its inputs' shapes, and verified one by one. This model's
    #: ``inputs`` are the first program's.
    programs: tuple[str, ...] = ()
    #: What a stateful program keeps between calls (a decoder's KV cache, written in place:
    #: :mod:`compiler.llm.state`), passed to the compiled function after ``inputs``.
    state: tuple[Any, ...] = ()
    #: An ONNX decoder that takes its KV cache as inputs and returns it as outputs
    #: (``past_key_values.*`` / ``present.*``): its :class:`compiler.llm.past_present.
    #: PastPresentLayout` (how the library is driven for generation).
    past_present: Any = None
    #: A stateful decoder compiled to return its last position's logits only, ``[batch, 1,
    #: vocabulary]`` (:mod:`compiler.llm.last_logits`): what generation reads.
    last_logits: bool = False
    #: The weight format applied at load (:mod:`compiler.weights.weight_formats`): its
    #: ``WeightFormatReport``, or ``None`` for the weights as exported.
    weight_format: Any = None

    def describe(self) -> dict[str, Any]:
        described: dict[str, Any] = {
            "format": self.format,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "inputs": [spec.to_json() for spec in self.inputs],
        }
        if self.buckets:
            described["buckets"] = buckets_json(self)
        if self.state:
            described["state"] = [spec.to_json() for spec in self.state]
        if self.past_present is not None:
            described["past_present"] = self.past_present.to_json()
        if self.last_logits:
            described["logits"] = "last_position"
        if self.weight_format is not None:
            described["weights"] = self.weight_format.to_json()
        return described


@dataclass(frozen=True, eq=False)
class Bucket:
    """One static function of a model: a specialization of a bucketed model (the VM function
    that runs it, the symbol values, and the model loaded at those values), or one program of a
    multi-program archive (no symbol values). ``model.inputs`` are the exact shapes the
    function takes."""

    function: str
    values: tuple[tuple[str, int], ...]
    model: LoadedModel = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "values": dict(self.values),
            "inputs": [spec.to_json() for spec in self.model.inputs],
        }


def buckets_json(model: LoadedModel) -> dict[str, Any]:
    """What a manifest and a summary say about ``model``'s buckets (``{}`` for a static model):
    the symbols' values, which were defaulted, and each bucket's function and input shapes
    (what :class:`compiler.build.runner.LoadedLibrary` dispatches on). A multi-program model: the
    program names and the same ``functions`` table."""
    if model.programs:
        return {"programs": list(model.programs), "functions": [b.to_json() for b in model.buckets]}
    if not model.buckets or model.bucket_spec is None:
        return {}
    return {**model.bucket_spec.to_json(), "functions": [b.to_json() for b in model.buckets]}
