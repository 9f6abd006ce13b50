"""Decoders that take their KV cache as inputs and return it as outputs (ONNX ``past`` /
``present``), as ``optimum-onnx`` exports them: compiled as shape buckets, driven for generation.

The convention (:func:`past_present_layout` recognizes it on the ONNX graph): inputs
``input_ids [batch, seq]``, ``attention_mask [batch, past + seq]``, optionally ``position_ids
[batch, seq]``, and ``past_key_values.{i}.key`` / ``.value`` ``[batch, kv_heads, past, head_dim]``;
outputs ``logits [batch, seq, vocabulary]`` and ``present.{i}.key`` / ``.value`` ``[batch,
kv_heads, past + seq, head_dim]``. The compiled library stays the pure function the file is: the
past in, the present out. The format copies its whole cache into the outputs on every call, by
design (each call returns a new, one position longer cache): a step costs that copy on top of the
attention, which grows with the context either way.

**Symbolic dimensions.** TVM 0.27 cannot import this graph with a symbolic past (its ONNX
``Reshape`` converter gets the folded ``past + 1`` as a scalar: "Reshape expects the input data
to be a Tensor"), and MetaSchedule tunes static shapes only. So the file compiles as shape
buckets (:mod:`compiler.shapes.buckets`) over ``sequence_length`` and ``past_sequence_length``,
every combination one static function, the mask's length derived (``past + seq``, never a bucket of
its own) and ``batch_size`` 1 unless buckets are given: by default ``sequence_length`` 1 (a decode
step) and 16 (a prefill chunk), ``past_sequence_length`` 16, 32, 64 and 128 (eight functions;
the linear layers' tasks at one ``seq`` are the same in every ``past`` bucket, so a past bucket
adds only its attention tasks). A call runs on the smallest bucket that fits it, **padded**:

- the past with zero rows *in front* (left) and the attention mask with zeros over them, so that
  the real past stays next to the new tokens and the cut of each ``present`` is one slice
  ``[P - p, P + s)``; the first call of a generation (an empty past) is all padding;
- the new tokens with zeros at the end (a prompt chunk shorter than the bucket), the mask with
  zeros over them and their positions the last real one's; their logits and ``present`` rows are
  cut away.

That is exact for a decoder that honours its mask and takes its positions from ``position_ids``
(or from the mask); one that derives positions from the past's *length* (an export without
``position_ids`` of a rotary model) is not. Which one a file is, is measured:
:func:`measure_padding` runs every bucket on inputs of an in-between size padded to it and
compares with ONNX Runtime on the same file at the exact size; padding is used only when every
probe matches (the manifest's ``generation.padding``). Without it no call from an empty past has
a bucket, and generation is refused with the reason.

**Generation.** :class:`PastPresentGenerator` (what :meth:`compiler.llm.generate.Generator.load`
returns for such an artifact) keeps the ``present`` outputs as the next call's past, grows the
mask and the positions, and decodes greedily (:meth:`compiler.llm.generate._Driver.generate`);
:class:`OnnxRuntimeDecoder` drives ONNX Runtime on the same file at the exact shapes, the
reference of :func:`verify_past_present` (called by :func:`compiler.llm.verify.
verify_generation`: 16 greedy tokens equal).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compiler.errors import ModelError
from compiler.llm.generate import DecoderSignature, _Driver
from compiler.llm.verify import GenerationCheck
from compiler.shapes.buckets import SymbolicDim

IDS = "input_ids"
MASK = "attention_mask"
POSITIONS = "position_ids"
LOGITS = "logits"
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")

#: Default buckets of a past/present decoder's symbols (see the module docstring).
DEFAULT_BATCH = (1,)
DEFAULT_SEQUENCE = (1, 16)
DEFAULT_PAST = (16, 32, 64, 128)
#: Token ids of the probes and of the verification prompt: small, within any vocabulary.
_PROBE_IDS = 16


@dataclass(frozen=True)
class PastPresentLayout:
    """Where a past/present decoder keeps what (see the module docstring): its inputs and
    outputs in order, the past inputs and the ``present`` output of each, whether it takes
    ``position_ids``, and the symbols of its batch (``None``: static), new tokens, past and
    the mask's length (``past + seq``: derived, never bucketed)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    past: tuple[str, ...]
    present: tuple[str, ...]
    positions: bool
    seq_symbol: str
    past_symbol: str
    total_symbol: str
    batch_symbol: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "past": list(self.past),
            "present": list(self.present),
            "position_ids": self.positions,
            "symbols": {
                "batch": self.batch_symbol,
                "sequence": self.seq_symbol,
                "past": self.past_symbol,
                "total": self.total_symbol,
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PastPresentLayout:
        symbols = data.get("symbols") or {}
        return cls(
            tuple(data["inputs"]),
            tuple(data["outputs"]),
            tuple(data["past"]),
            tuple(data["present"]),
            bool(data.get("position_ids")),
            str(symbols.get("sequence")),
            str(symbols.get("past")),
            str(symbols.get("total")),
            symbols.get("batch"),
        )


def _dims(value: Any) -> list[str | int]:
    """An ONNX value's dimensions: ints where static, else its symbol (``NAME.AXIS`` when
    unnamed, as :func:`compiler.frontends.onnx_loader.onnx_symbolic_dims` names it)."""
    dims = value.type.tensor_type.shape.dim
    return [
        int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or f"{value.name}.{axis}")
        for axis, d in enumerate(dims)
    ]


def past_present_layout(model: Any) -> PastPresentLayout | None:
    """The :class:`PastPresentLayout` of an ONNX ``model`` that follows the past/present
    convention (module docstring), else ``None``: any other input, a past without its
    ``present`` output, or dimensions that are not the convention's."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = {v.name: v for v in model.graph.input if v.name not in initializers}
    outputs = [v.name for v in model.graph.output]
    past = [name for name in inputs if _PAST.match(name)]
    if not past or IDS not in inputs or MASK not in inputs or LOGITS not in outputs:
        return None
    if set(inputs) - {IDS, MASK, POSITIONS, *past}:
        return None
    present = [name.replace("past_key_values.", "present.", 1) for name in past]
    if any(name not in outputs for name in present):
        return None
    ids, mask = _dims(inputs[IDS]), _dims(inputs[MASK])
    if len(ids) != 2 or len(mask) != 2 or not isinstance(ids[1], str):
        return None
    past_dims = [_dims(inputs[name]) for name in past]
    if any(len(d) != 4 for d in past_dims) or len({d[2] for d in past_dims}) != 1:
        return None
    seq_symbol, past_symbol, total_symbol = ids[1], past_dims[0][2], mask[1]
    symbols = {seq_symbol, past_symbol, total_symbol}
    if not all(isinstance(s, str) for s in symbols) or len(symbols) != 3:
        return None
    if POSITIONS in inputs and _dims(inputs[POSITIONS]) != ids:
        return None
    batch = ids[0] if isinstance(ids[0], str) else None
    return PastPresentLayout(
        tuple(inputs),
        tuple(outputs),
        tuple(past),
        tuple(present),
        POSITIONS in inputs,
        str(seq_symbol),
        str(past_symbol),
        str(total_symbol),
        batch,
    )


def bucket_plan(
    layout: PastPresentLayout, dims: Sequence[SymbolicDim], given: Mapping[str, Any]
) -> tuple[list[SymbolicDim], dict[str, Any]]:
    """The symbolic dimensions to bucket (the attention mask's left out: its shape is the
    token ids' batch and ``past + seq``, :func:`complete_shapes`) and the buckets: the user's
    (``given``, by symbol or ``INPUT.AXIS``), and for each symbol given none,
    :data:`DEFAULT_BATCH`, :data:`DEFAULT_SEQUENCE` or :data:`DEFAULT_PAST`. Raises
    ``ModelError("bad_buckets")`` for buckets given to the mask's length."""
    kept = [d for d in dims if d.input != MASK and d.symbol != layout.total_symbol]
    named = {d.symbol: d.symbol for d in dims} | {d.alias: d.symbol for d in dims}
    chosen = {named.get(name, name) for name in given}
    if layout.total_symbol in chosen:
        raise ModelError(
            "bad_buckets",
            f"{layout.total_symbol!r} (the attention mask's length) is the past's length plus "
            f"the new tokens': give buckets for {layout.past_symbol!r} and "
            f"{layout.seq_symbol!r} instead",
        )
    wanted = dict(given)
    defaults = {
        layout.batch_symbol: DEFAULT_BATCH,
        layout.seq_symbol: DEFAULT_SEQUENCE,
        layout.past_symbol: DEFAULT_PAST,
    }
    for symbol, values in defaults.items():
        if symbol is not None and symbol not in chosen and any(d.symbol == symbol for d in kept):
            wanted[symbol] = values
    return kept, wanted


def complete_shapes(
    layout: PastPresentLayout, shapes: Mapping[str, Sequence[int]]
) -> dict[str, tuple[int, ...]]:
    """``shapes`` with the attention mask's, ``[batch, past + seq]``, where it is not given
    and the token ids' and the past's are."""
    out = {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}
    ids, past = out.get(IDS), out.get(layout.past[0])
    if MASK not in out and ids is not None and past is not None:
        out[MASK] = (ids[0], past[2] + ids[1])
    return out


@dataclass(frozen=True)
class Function:
    """One static function of a past/present library: its VM name and input shapes and
    dtypes by name; ``batch``, ``seq`` and ``past`` read off them."""

    name: str
    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, str]
    past_input: str

    @property
    def batch(self) -> int:
        return self.shapes[IDS][0]

    @property
    def seq(self) -> int:
        return self.shapes[IDS][1]

    @property
    def past(self) -> int:
        return self.shapes[self.past_input][2]


@dataclass(frozen=True)
class PastPresentSignature:
    """How a past/present library is called: its layout, its functions, and the
    :class:`compiler.llm.generate.DecoderSignature` the greedy driver needs (the smallest
    batch, the prompt lengths, the capacity: the largest past bucket plus the one position a
    call at it adds)."""

    layout: PastPresentLayout
    functions: tuple[Function, ...]
    decoder: DecoderSignature = field(init=False)

    def __post_init__(self) -> None:
        first = self.functions[0]
        positions = first.dtypes.get(POSITIONS, "int64")
        decoder = DecoderSignature(
            batch=min(f.batch for f in self.functions),
            lengths=tuple(sorted({f.seq for f in self.functions}, reverse=True)),
            capacity=max(f.past for f in self.functions) + 1,
            ids_dtype=first.dtypes[IDS],
            positions_dtype=positions,
        )
        object.__setattr__(self, "decoder", decoder)

    def kv(self, batch: int) -> list[tuple[tuple[int, ...], str]]:
        """The empty past of each past input at ``batch``: ``(shape, dtype)``."""
        first = self.functions[0]
        out = []
        for name in self.layout.past:
            _, heads, _, head_dim = first.shapes[name]
            out.append(((batch, heads, 0, head_dim), first.dtypes[name]))
        return out


def signature_of(
    layout: PastPresentLayout, functions: Sequence[tuple[str, Sequence[Mapping[str, Any]]]]
) -> PastPresentSignature:
    """The signature of a library whose ``functions`` are ``(VM name, input specs)``, each
    spec ``{"name", "shape", "dtype"}`` (``TensorSpec.to_json()``)."""
    table = []
    for name, specs in functions:
        shapes = {s["name"]: tuple(int(d) for d in s["shape"]) for s in specs}
        dtypes = {s["name"]: str(s["dtype"]) for s in specs}
        table.append(Function(name, shapes, dtypes, layout.past[0]))
    return PastPresentSignature(layout, tuple(table))


def model_signature(model: Any) -> PastPresentSignature:
    """The signature of a :class:`compiler.frontends.model_spec.LoadedModel` with
    ``past_present``."""
    parts = [(b.function, b.model.inputs) for b in model.buckets] or [("main", model.inputs)]
    return signature_of(
        model.past_present, [(name, [s.to_json() for s in specs]) for name, specs in parts]
    )


def manifest_signature(model_json: Mapping[str, Any]) -> PastPresentSignature:
    """The signature of an artifact's manifest ``model`` block."""
    layout = PastPresentLayout.from_json(model_json["past_present"])
    functions = (model_json.get("buckets") or {}).get("functions") or [
        {"function": "main", "inputs": model_json.get("inputs", [])}
    ]
    return signature_of(layout, [(f["function"], f["inputs"]) for f in functions])


class _PastPresentDriver(_Driver):
    """Greedy decoding over a past/present decoder: the ``present`` of each call is the next
    call's past, the mask all ones over what was fed, the positions counting on. ``_run``
    takes and returns exact sizes (the past as long as what was fed)."""

    #: The most tokens one call takes (``None``: any).
    max_chunk: int | None = None

    def __init__(self, signature: PastPresentSignature) -> None:
        super().__init__(signature.decoder)
        self.spec = signature
        self.past: list[np.ndarray] = []
        self.batch = signature.decoder.batch

    def _reset(self) -> None:
        self.past = []

    def _ids(self, ids: Any) -> np.ndarray:
        """``ids`` as ``[batch, n]``: one sequence given as ``[n]`` is the batch of what was fed
        so far (from an empty past, the smallest batch compiled); a batch must be one compiled
        and, after the first call, the one fed so far."""
        batch = self.batch if self.past else self.signature.batch
        array = np.asarray(ids, dtype=self.signature.ids_dtype)
        if array.ndim == 1:
            array = np.broadcast_to(array, (batch, array.shape[0]))
        allowed = {self.batch} if self.past else {f.batch for f in self.spec.functions}
        if array.ndim != 2 or array.shape[0] not in allowed:
            raise ModelError(
                "bad_input",
                f"token ids of shape {list(array.shape)}: this decoder takes a batch of "
                + " or ".join(map(str, sorted(allowed))),
            )
        return np.ascontiguousarray(array)

    def _run(
        self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        raise NotImplementedError

    def prefill(self, ids: Any) -> np.ndarray:
        """Feed ``ids`` (``[n]`` or ``[batch, n]``) after what was fed so far; the last
        position's logits ``[batch, vocabulary]``. ``ModelError("cache_full")`` (nothing run)
        when they would take the context past the largest past bucket."""
        array = self._ids(ids)
        count = array.shape[1]
        if count < 1:
            raise ModelError("bad_input", "no token ids to feed")
        if self.position + count > self.signature.capacity:
            raise ModelError(
                "cache_full",
                f"{count} more tokens after {self.position} do not fit: this library's largest "
                f"past bucket takes {self.signature.capacity - 1} positions (compile it with "
                "larger past buckets, --buckets past_sequence_length=...)",
            )
        if not self.past:
            self.batch = array.shape[0]
            self.past = [np.zeros(shape, dtype) for shape, dtype in self.spec.kv(self.batch)]
        logits = None
        while array.shape[1]:
            n = array.shape[1] if self.max_chunk is None else min(array.shape[1], self.max_chunk)
            start = self.position
            mask = np.ones((self.batch, start + n), dtype=self._dtype(MASK, "int64"))
            positions = np.broadcast_to(
                np.arange(start, start + n, dtype=self.signature.positions_dtype),
                (self.batch, n),
            )
            logits, self.past = self._run(
                np.ascontiguousarray(array[:, :n]), mask, np.ascontiguousarray(positions), self.past
            )
            array = array[:, n:]
            self.position += n
        assert logits is not None
        return np.asarray(logits)[:, -1, :]

    def _dtype(self, name: str, default: str) -> str:
        return self.spec.functions[0].dtypes.get(name, default)


class PastPresentGenerator(_PastPresentDriver):
    """Generation from a compiled past/present decoder (a
    :class:`compiler.build.runner.LoadedLibrary`): each call on the smallest bucket that fits it,
    padded as the module docstring says when ``padding`` (measured) allows it, exact shapes
    otherwise."""

    def __init__(self, library: Any, signature: PastPresentSignature, padding: bool) -> None:
        super().__init__(signature)
        self.library = library
        self.padding = padding
        self.max_chunk = max(f.seq for f in signature.functions)
        layout = signature.layout
        self._logits = layout.outputs.index(LOGITS)
        self._present = [layout.outputs.index(name) for name in layout.present]

    @classmethod
    def from_artifact(cls, library: Any, manifest: Mapping[str, Any]) -> PastPresentGenerator:
        """The generator of an artifact's library, given its manifest. Raises
        ``ModelError("no_generation")`` when the artifact's generation was not verified or
        is not available (padding refused: the manifest says why)."""
        try:
            signature = manifest_signature(manifest["model"])
        except (KeyError, TypeError, ValueError, IndexError) as err:
            raise ModelError(
                "bad_artifact", f"the manifest's past/present decoder is unreadable ({err!r})"
            ) from None
        check = manifest.get("generation") or {}
        padding = check.get("padding") or {}
        if not check.get("passed"):
            why = check.get("message") or (
                "its generation was not verified (built for another machine)"
            )
            raise ModelError("no_generation", f"this artifact cannot generate: {why}")
        return cls(library, signature, bool(padding.get("allowed")))

    def function_for(self, batch: int, seq: int, past: int) -> Function:
        """The smallest bucket that takes ``seq`` new tokens after ``past``: its exact shapes,
        or larger ones when padding is allowed; ``ModelError("no_bucket")`` when none does."""

        def fits(f: Function) -> bool:
            if f.batch != batch:
                return False
            if (f.seq, f.past) == (seq, past):
                return True
            return self.padding and f.seq >= seq and f.past >= past

        candidates = [f for f in self.spec.functions if fits(f)]
        if not candidates:
            known = ", ".join(f"seq {f.seq} past {f.past}" for f in self.spec.functions)
            raise ModelError(
                "no_bucket",
                f"{seq} new tokens after a past of {past} (batch {batch}) fit no bucket of this "
                f"library ({known})"
                + ("" if self.padding else "; padding between buckets was refused for it"),
            )
        return min(candidates, key=lambda f: (f.seq, f.past))

    def run_padded(
        self,
        function: Function,
        ids: np.ndarray,
        mask: np.ndarray,
        positions: np.ndarray,
        past: list[np.ndarray],
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Run ``function`` on the inputs padded to its shapes; the outputs cut back."""
        batch, s = ids.shape
        p = past[0].shape[2]
        seq, cap = function.seq, function.past
        feeds: dict[str, np.ndarray] = {}
        padded_ids = np.zeros((batch, seq), dtype=ids.dtype)
        padded_ids[:, :s] = ids
        feeds[IDS] = padded_ids
        padded_mask = np.zeros((batch, cap + seq), dtype=mask.dtype)
        padded_mask[:, cap - p : cap + s] = mask
        feeds[MASK] = padded_mask
        if self.spec.layout.positions:
            padded_positions = np.empty((batch, seq), dtype=positions.dtype)
            padded_positions[:, :s] = positions
            padded_positions[:, s:] = positions[:, -1:]
            feeds[POSITIONS] = padded_positions
        for name, array in zip(self.spec.layout.past, past):
            padded = np.zeros((*array.shape[:2], cap, array.shape[3]), dtype=array.dtype)
            padded[:, :, cap - p :] = array
            feeds[name] = padded
        outputs = self.library.run_function(
            function.name, [feeds[name] for name in self.spec.layout.inputs]
        )
        logits = outputs[self._logits][:, :s]
        present = [outputs[i][:, :, cap - p : cap + s] for i in self._present]
        return logits, present

    def _run(
        self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        function = self.function_for(ids.shape[0], ids.shape[1], past[0].shape[2])
        return self.run_padded(function, ids, mask, positions, past)


class OnnxRuntimeDecoder(_PastPresentDriver):
    """ONNX Runtime on the ONNX file itself (symbolic dimensions: any past, an empty one
    included), driven the same way: the reference of :func:`verify_past_present`."""

    def __init__(self, proto: Any, signature: PastPresentSignature) -> None:
        super().__init__(signature)
        self.session = onnxruntime_session(proto)

    def _run(
        self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        return self.run(ids, mask, positions, past)

    def run(
        self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One call at the inputs' exact sizes: the logits and each ``present``."""
        layout = self.spec.layout
        feeds = {IDS: ids, MASK: mask, **dict(zip(layout.past, past))}
        if layout.positions:
            feeds[POSITIONS] = positions
        outputs = self.session.run([LOGITS, *layout.present], feeds)
        return outputs[0], list(outputs[1:])


def onnxruntime_session(proto: Any) -> Any:
    """An ONNX Runtime CPU session on ``proto`` with one intra-op thread (as
    :func:`compiler.build.verify.reference_outputs` runs it)."""
    import onnxruntime  # noqa: PLC0415 - the reference runtime, for ONNX models only

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    return onnxruntime.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@dataclass(frozen=True)
class PaddingCheck:
    """Whether a past/present library may run calls padded to a larger bucket (measured by
    :func:`measure_padding`): ``allowed``, why not (``reason``) and one line per probe."""

    allowed: bool
    reason: str
    probes: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"allowed": self.allowed, "reason": self.reason, "probes": list(self.probes)}


def _probes(functions: Sequence[Function]) -> list[tuple[Function, int, int]]:
    """``(function, seq, past)``: for each bucket, about half its new tokens after about half
    its past; and an empty past for each bucket of the smallest past (a generation's first
    call)."""
    smallest = min(f.past for f in functions)
    out = []
    for f in functions:
        seq, past = (f.seq + 1) // 2, f.past // 2
        if (seq, past) != (f.seq, f.past):
            out.append((f, seq, past))
        if f.past == smallest and past != 0:
            out.append((f, seq, 0))
    return out


def measure_padding(model: Any, library: Any, seed: int = 0) -> PaddingCheck:
    """Run each of ``library``'s buckets on probe inputs padded to it and compare the cut
    outputs with ONNX Runtime on ``model``'s file at the probe's exact size (see the module
    docstring); never raises for a model that does not allow padding."""
    from compiler.build.verify import compare  # noqa: PLC0415 - onnxruntime / torch behind it

    signature = model_signature(model)
    proto = model.dynamic_source if model.dynamic_source is not None else model.source
    ours = PastPresentGenerator(library, signature, padding=True)
    session = OnnxRuntimeDecoder(proto, signature)
    rng = np.random.default_rng(seed)
    lines: list[str] = []
    for function, seq, past in _probes(signature.functions):
        batch = function.batch
        ids = rng.integers(0, _PROBE_IDS, size=(batch, seq)).astype(function.dtypes[IDS])
        mask = np.ones((batch, past + seq), dtype=function.dtypes[MASK])
        positions = np.broadcast_to(
            np.arange(past, past + seq, dtype=signature.decoder.positions_dtype), (batch, seq)
        ).copy()
        cache = [
            rng.standard_normal((batch, shape[1], past, shape[3])).astype(dtype)
            for (shape, dtype) in signature.kv(batch)
        ]
        label = f"seq {seq} after past {past} padded to {function.name}"
        try:
            want_logits, want_present = session.run(ids, mask, positions, cache)
            got_logits, got_present = ours.run_padded(function, ids, mask, positions, cache)
        except Exception as exc:  # noqa: BLE001 - a probe that fails to run refuses padding
            reason = f"{label}: the probe did not run ({exc})"
            return PaddingCheck(False, reason, (*lines, reason))
        result = compare([got_logits, *got_present], [want_logits, *want_present], "onnxruntime")
        lines.append(f"{label}: max abs error {result.max_abs_error:.3g}")
        if not result.passed:
            reason = (
                f"{label}: the outputs differ from ONNX Runtime's at the exact size "
                f"({result.message}); the model does not honour a padded past (does it derive "
                "positions from the past's length? export it with position_ids)"
            )
            return PaddingCheck(False, reason, (*lines, reason))
    if not lines:
        return PaddingCheck(False, "no bucket has a smaller size to pad from", ())
    return PaddingCheck(True, "", tuple(lines))


@dataclass(frozen=True)
class PastPresentCheck(GenerationCheck):
    """:class:`compiler.llm.generate.GenerationCheck` of a past/present decoder, with the
    padding measurement it drove the library with; ``available`` ``False``: generation is
    not possible with this library (the message says why), which does not fail the
    artifact."""

    padding: PaddingCheck | None = None
    available: bool = True

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["reference"] = "onnxruntime"
        out["available"] = self.available
        if self.padding is not None:
            out["padding"] = self.padding.to_json()
        return out


def verify_past_present(
    model: Any, library: Any, *, prompt_tokens: int, new_tokens: int, seed: int = 0
) -> PastPresentCheck:
    """Greedy generation of ``library`` against ONNX Runtime on ``model``'s file, both driven
    the same way from an empty past, the reference's token fed to both at every step (as
    :func:`compiler.llm.verify.verify_generation` does against torch): passes when every
    logit is within float32's tolerance and every token is ONNX Runtime's (or its top two
    logits are a tie within that tolerance). Padding is measured first
    (:func:`measure_padding`); refused, the check is not ``available``."""
    from compiler.build.verify import tolerance_for  # noqa: PLC0415

    padding = measure_padding(model, library, seed)
    signature = model_signature(model)
    if not padding.allowed:
        message = (
            "generation is not available from this library: a generation's first call (an "
            "empty past) runs only padded to a bucket, and padding was refused: " + padding.reason
        )
        return PastPresentCheck(False, [], [], [], 0, 0.0, 0.0, message, padding, False)
    capacity = signature.decoder.capacity
    prompt_len = min(prompt_tokens, max(1, capacity // 2))
    new_tokens = max(1, min(new_tokens, capacity - prompt_len))
    prompt = np.random.default_rng(seed).integers(0, _PROBE_IDS, size=prompt_len).tolist()
    proto = model.dynamic_source if model.dynamic_source is not None else model.source
    ours = PastPresentGenerator(library, signature, padding=True)
    theirs = OnnxRuntimeDecoder(proto, signature)
    ours.reset()
    theirs.reset()
    feed: Any = prompt
    expected, actual, ties, worst, tolerance = [], [], 0, 0.0, 0.0
    tol = tolerance_for("float32")
    for _ in range(new_tokens):
        want = theirs.prefill(feed)[0].astype(np.float64)
        got = ours.prefill(feed)[0].astype(np.float64)
        bound = tol.atol * max(1.0, float(np.abs(want).max())) + tol.rtol * np.abs(want).max()
        tolerance = max(tolerance, float(bound))
        worst = max(worst, float(np.abs(got - want).max()))
        token, mine = int(want.argmax()), int(got.argmax())
        expected.append(token)
        actual.append(mine)
        if mine != token:
            top = np.sort(want)[-2:]
            ties += bool(top[1] - top[0] <= bound)
        feed = [token]
    mismatched = sum(a != e for a, e in zip(actual, expected))
    passed = worst <= tolerance and mismatched == ties
    message = (
        f"greedy tokens match ONNX Runtime's ({len(expected)} tokens, {ties} near-ties; max "
        f"logit error {worst:.3g}, tolerance {tolerance:.3g}; calls padded to buckets)"
        if passed
        else f"greedy generation differs from ONNX Runtime's: {mismatched} of {len(expected)} "
        f"tokens differ ({ties} near-ties), max logit error {worst:.3g} (tolerance "
        f"{tolerance:.3g})"
    )
    return PastPresentCheck(
        passed, prompt, expected, actual, ties, worst, tolerance, message, padding
    )
