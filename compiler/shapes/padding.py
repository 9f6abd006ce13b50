"""Padding to a larger shape bucket, allowed only where it was checked to be exact.

A bucketed library (:mod:`compiler.shapes.buckets`) has one static function per bucket. An input
whose symbolic dimensions fall between buckets can run on the smallest bucket that fits, padded with
zeros at the end of each symbolic axis, its outputs cut back to the input's sizes, **if the
model allows it**: a causal decoder does (a position never reads a later one), an elementwise
model does, an encoder given an attention mask does (the padded keys are masked out); a model
whose outputs read every position (a softmax or a norm over the sequence, a prefill program
that returns the last position's logits) does not. Which one a model is cannot be read off its
operators in general, so it is measured: before an artifact is published,
:func:`check_padding` runs every bucket on inputs of an in-between size (one per bucket,
:func:`probe_values`) padded to that bucket, and compares the cut outputs with the reference
framework run at the in-between size itself (ONNX Runtime or torch take the symbolic model as
it is). Padding is allowed only when every probe matches, and the manifest says so with the
probes' results (:class:`PaddingRule`); otherwise the library keeps dispatching on exact shapes
and its ``no_bucket`` error says why padding was refused.

Which output axes to cut comes from the same probes: an output axis whose size is a symbol's
bucket value in the bucket's function and that symbol's in-between value in the reference is
cut to the symbol's value at run time. An output axis that follows a symbol in another way
(``2 * seq``, a flattened ``seq * hidden``) makes padding refused.

This module needs numpy only; the probes run through the callables it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from compiler.shapes.buckets import SymbolicDim


@dataclass(frozen=True)
class Placement:
    """Where a symbol sits: input ``input`` (its index), axis ``axis``."""

    symbol: str
    input: int
    axis: int


@dataclass(frozen=True)
class OutputCut:
    """Output ``output``'s axis ``axis`` has the size of ``symbol``: cut it to the input's value."""

    output: int
    axis: int
    symbol: str


@dataclass(frozen=True)
class PaddingRule:
    """Whether a bucketed library may pad inputs to a larger bucket, and how.

    ``allowed``: every probe matched; ``reason``: why not, when it is not; ``placements``: where
    each symbol sits in the inputs (how a run reads the symbols' values off its inputs);
    ``cuts``: the output axes to cut back; ``probes``: one line per probe (what was checked);
    ``symbols``: the symbols the probes padded (only those may be padded at run time).
    """

    allowed: bool
    reason: str
    placements: tuple[Placement, ...] = ()
    cuts: tuple[OutputCut, ...] = ()
    probes: tuple[str, ...] = ()
    symbols: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "allowed": self.allowed,
            "reason": self.reason,
            "placements": [[p.symbol, p.input, p.axis] for p in self.placements],
            "cuts": [[c.output, c.axis, c.symbol] for c in self.cuts],
            "probes": list(self.probes),
            "symbols": list(self.symbols),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> PaddingRule | None:
        """The rule a manifest stores (``None``: none stored, or not a rule)."""
        if not isinstance(data, Mapping) or "allowed" not in data:
            return None
        return cls(
            bool(data["allowed"]),
            str(data.get("reason", "")),
            tuple(Placement(str(s), int(i), int(a)) for s, i, a in data.get("placements", [])),
            tuple(OutputCut(int(o), int(a), str(s)) for o, a, s in data.get("cuts", [])),
            tuple(str(p) for p in data.get("probes", [])),
            tuple(str(s) for s in data.get("symbols", [])),
        )

    def values_of(self, shapes: Sequence[Sequence[int]]) -> dict[str, int]:
        """Each symbol's value in inputs of ``shapes``."""
        return {p.symbol: int(shapes[p.input][p.axis]) for p in self.placements}


def placements(dims: Sequence[SymbolicDim], input_names: Sequence[str]) -> tuple[Placement, ...]:
    """Where each symbolic dimension sits, by input index (inputs named ``input_names``)."""
    index = {name: i for i, name in enumerate(input_names)}
    return tuple(Placement(d.symbol, index[d.input], d.axis) for d in dims if d.input in index)


def probe_values(values: Sequence[int], minimum: int) -> dict[int, int]:
    """For each bucket value (sorted), an in-between value that pads to it: halfway between it
    and the bucket below (or ``minimum - 1``), rounded up; none for a bucket with no value
    between (``{16: 9, 32: 24}`` for buckets 16, 32 and minimum 2)."""
    probes: dict[int, int] = {}
    below = max(0, minimum - 1)
    for value in sorted(values):
        candidate = value - (value - below) // 2
        if below < candidate < value and candidate >= minimum:
            probes[value] = candidate
        below = value
    return probes


def pad_inputs(inputs: Sequence[np.ndarray], shapes: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """``inputs`` zero-padded at the end of each axis to ``shapes`` (each at least as large)."""
    out = []
    for array, shape in zip(inputs, shapes):
        array = np.asarray(array)
        widths = [(0, int(want) - int(have)) for have, want in zip(array.shape, shape)]
        out.append(np.pad(array, widths) if any(w for _, w in widths) else array)
    return out


def cut_outputs(
    outputs: Sequence[np.ndarray], cuts: Sequence[OutputCut], values: Mapping[str, int]
) -> list[np.ndarray]:
    """``outputs`` with each cut axis cut back to its symbol's value (a contiguous copy)."""
    out = [np.asarray(o) for o in outputs]
    for cut in cuts:
        if cut.output < len(out):
            index = [slice(None)] * out[cut.output].ndim
            index[cut.axis] = slice(0, values[cut.symbol])
            out[cut.output] = out[cut.output][tuple(index)]
    return [np.ascontiguousarray(o) for o in out]


def fitting_bucket(
    shapes: Sequence[Sequence[int]],
    table: Mapping[tuple[tuple[int, ...], ...], str],
    rule: PaddingRule,
) -> tuple[str, tuple[tuple[int, ...], ...]] | None:
    """The smallest bucket (fewest input elements) that inputs of ``shapes`` pad to under
    ``rule``: the same rank and sizes on every axis, except the axes of the symbols the rule
    checked (``rule.symbols``), which may be smaller; ``None`` when none fits (or the inputs
    give one symbol two values)."""
    padded = {(p.input, p.axis): p.symbol for p in rule.placements if p.symbol in rule.symbols}
    given: dict[str, int] = {}
    for (i, axis), symbol in padded.items():
        if i < len(shapes) and axis < len(shapes[i]):
            if given.setdefault(symbol, int(shapes[i][axis])) != int(shapes[i][axis]):
                return None
    fits = []
    for key, name in table.items():
        if len(key) != len(shapes) or any(len(k) != len(s) for k, s in zip(key, shapes)):
            continue
        if all(
            (b >= a) if (i, axis) in padded else (b == a)
            for i, (k, s) in enumerate(zip(key, shapes))
            for axis, (b, a) in enumerate(zip(k, s))
        ):
            fits.append((sum(int(np.prod(k)) for k in key), key, name))
    if not fits:
        return None
    _, key, name = min(fits)
    return name, key


#: ``run_function(function, inputs) -> outputs`` runs one bucket's VM function.
RunFunction = Callable[[str, list[np.ndarray]], list[np.ndarray]]
#: ``reference(probe_model, inputs) -> outputs``; ``compare(actual, expected) -> (ok, error)``.
Reference = Callable[[Any, list[np.ndarray]], list[np.ndarray]]


def check_padding(
    model: Any,
    run_function: RunFunction,
    reference: Reference,
    compare: Callable[[list[np.ndarray], list[np.ndarray]], tuple[bool, float]],
    make_inputs: Callable[[Any], list[np.ndarray]],
) -> PaddingRule:
    """Measure whether the bucketed ``model`` (a :class:`compiler.frontends.model_spec.LoadedModel`
    with ``buckets``, ``symbolic_dims`` and ``dynamic_source``) may be padded.

    For each bucket, the probe sets every symbol that has one to its :func:`probe_values` value;
    ``make_inputs(probe_model)`` makes its inputs, ``reference`` runs the reference framework at
    the probe's shapes and ``run_function`` the bucket's function on them zero-padded. Never
    raises for a model that does not allow padding: the rule says why.
    """
    dims = tuple(model.symbolic_dims)
    where = placements(dims, [spec.name for spec in model.inputs])
    if not model.buckets or not dims or model.dynamic_source is None:
        return PaddingRule(False, "the model has no symbolic dimensions to pad", where)
    minimum = {d.symbol: max(x.minimum for x in dims if x.symbol == d.symbol) for d in dims}
    per_symbol = {
        symbol: probe_values(values, minimum[symbol]) for symbol, values in model.bucket_spec.values
    }
    cuts: dict[tuple[int, int], str] = {}
    lines: list[str] = []
    padded_symbols: set[str] = set()
    for bucket in model.buckets:
        values = dict(bucket.values)
        probe = {s: per_symbol.get(s, {}).get(v, v) for s, v in values.items()}
        if probe == values:
            continue
        padded_symbols.update(s for s in values if probe[s] != values[s])
        probe_model = _probe_model(model, bucket.model, where, probe)
        inputs = make_inputs(probe_model)
        label = " ".join(f"{s}={v}" for s, v in probe.items()) + f" padded to {bucket.function}"
        try:
            expected = reference(probe_model, inputs)
            padded = run_function(
                bucket.function, pad_inputs(inputs, [s.shape for s in bucket.model.inputs])
            )
        except Exception as exc:  # noqa: BLE001 - a probe that fails to run refuses padding
            return _refused(where, lines, f"{label}: the probe did not run ({exc})")
        found = _output_cuts(padded, expected, values, probe)
        if isinstance(found, str):
            return _refused(where, lines, f"{label}: {found}")
        for cut in found:
            if cuts.setdefault((cut.output, cut.axis), cut.symbol) != cut.symbol:
                return _refused(
                    where,
                    lines,
                    f"{label}: output {cut.output} axis {cut.axis} "
                    "follows different symbols in different buckets",
                )
        ok, error = compare(cut_outputs(padded, found, probe), expected)
        lines.append(f"{label}: max abs error {error:.3g}" + ("" if ok else ", over tolerance"))
        if not ok:
            return _refused(
                where,
                lines,
                f"{label}: the outputs differ from the reference at "
                f"the unpadded size (max abs error {error:.3g})",
            )
    if not lines:
        return PaddingRule(False, "no bucket has a smaller size to pad from", where)
    rule_cuts = tuple(OutputCut(o, a, s) for (o, a), s in sorted(cuts.items()))
    return PaddingRule(
        True,
        "",
        where,
        rule_cuts,
        tuple(lines),
        tuple(s for s, _ in model.bucket_spec.values if s in padded_symbols),
    )


def _refused(where: tuple[Placement, ...], lines: list[str], reason: str) -> PaddingRule:
    return PaddingRule(False, reason, where, (), (*lines, reason))


def _probe_model(
    model: Any, bucket_model: Any, where: Sequence[Placement], probe: Mapping[str, int]
) -> Any:
    """``bucket_model`` at the probe's symbol values, over the model's symbolic source (ONNX
    Runtime and torch run it at any size within the symbols' ranges)."""
    specs = list(bucket_model.inputs)
    for place in where:
        spec = specs[place.input]
        shape = list(spec.shape)
        shape[place.axis] = probe[place.symbol]
        specs[place.input] = replace(spec, shape=tuple(shape))
    return replace(
        bucket_model,
        inputs=tuple(specs),
        source=model.dynamic_source,
        symbol_values=tuple(probe.items()),
        buckets=(),
        bucket_spec=None,
    )


def _output_cuts(
    padded: Sequence[np.ndarray],
    expected: Sequence[np.ndarray],
    values: Mapping[str, int],
    probe: Mapping[str, int],
) -> list[OutputCut] | str:
    """The cuts that make the padded outputs the reference's shapes, or why there are none."""
    if len(padded) != len(expected):
        return f"{len(padded)} outputs against the reference's {len(expected)}"
    cuts = []
    for index, (got, want) in enumerate(zip(padded, expected)):
        got_shape, want_shape = np.shape(got), np.shape(want)
        if len(got_shape) != len(want_shape):
            return f"output {index} has rank {len(got_shape)}, the reference's {len(want_shape)}"
        for axis, (have, need) in enumerate(zip(got_shape, want_shape)):
            if have == need:
                continue
            symbols = [s for s in values if values[s] == have and probe[s] == need]
            if len(symbols) != 1:
                return (
                    f"output {index} axis {axis} is {have} in the bucket and {need} at the "
                    "unpadded size: not one symbol's value, so it cannot be cut back"
                )
            cuts.append(OutputCut(index, axis, symbols[0]))
    return cuts
