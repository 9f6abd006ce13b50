"""Shape buckets: the static values a model's symbolic input dimensions are compiled for.

A model whose inputs have symbolic dimensions (ONNX ``dim_param``, ``torch.export`` ``Dim``)
cannot be tuned as it is: MetaSchedule measures static shapes only. TuneHub compiles it once
per **bucket**, a static value of each symbol (``--buckets seq=16,64,128``); every bucket is a
static specialization of the model, with its own tuning tasks (shared with every other model
by key), and the artifact dispatches on the exact input shape (:mod:`compiler.shapes.bucket_module`,
:class:`compiler.build.runner.LoadedLibrary`).

This module is plain Python (no TVM, no torch): the symbols a model declares
(:class:`SymbolicDim`, found by the loaders), parsing the user's bucket options
(:func:`parse_bucket_option`, :func:`parse_bucket_field`), choosing the buckets
(:func:`resolve_buckets`, with :func:`default_values` for a symbol given none) and naming
their functions (:func:`function_name`). Every bad spec is a
:class:`~compiler.errors.ModelError` with code ``bad_buckets`` and a message for the user.

Buckets may also be derived from a **histogram** of expected sizes (``seq~12:40,37:5,100:3``:
size 12 seen 40 times, ...; :class:`SizeHistogram`): the buckets that minimize the expected
padded size (:func:`histogram_buckets`), each with the share of inputs it serves, which weighs
its tasks' tuning budget (:mod:`compiler.partition`). Sizes between buckets run padded only
where padding was measured exact (:mod:`compiler.shapes.padding`).

Symbols are named by the model: the ONNX ``dim_param`` (an unnamed dynamic dimension is
``INPUT.AXIS``), or the symbol ``torch.export`` recorded (``s0``, ``s70``: the ``Dim``'s own
name is not saved in a ``.pt2``). A bucket option may name a symbol either way: ``seq=16,64``
or ``input_ids.1=16,64``.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from compiler.errors import ModelError

#: Default buckets are the powers of two from this value up to :data:`DEFAULT_MAX` (within the
#: range the model declares for the symbol).
DEFAULT_MIN = 16
#: The largest default bucket: ONNX declares no upper bound, and a bucket past what the model
#: supports (its position embeddings) would read out of bounds, so defaults stay small.
DEFAULT_MAX = 128
#: At most this many static specializations (the product over symbols) per model: each is a
#: full copy of the model's weights in the artifact and a set of tasks to tune.
MAX_SPECIALIZATIONS = 16
#: Largest value a bucket may take (inputs are bounded by ``ModelLimits`` as well).
MAX_BUCKET_VALUE = 1 << 20

#: Buckets a histogram is divided into unless it says otherwise (``.../K``).
DEFAULT_HISTOGRAM_BUCKETS = 4
#: At most this many distinct sizes in a histogram.
MAX_HISTOGRAM_SIZES = 4096
#: A histogram's counts sum to at most this (far more requests than any log holds): the
#: dynamic programme multiplies counts by bucket sizes, which must stay finite.
MAX_HISTOGRAM_TOTAL = 1e15
#: At most this many candidate buckets enter the dynamic programme (work ~ buckets x this^2).
MAX_BUCKET_CANDIDATES = 256

_NAME = re.compile(r"[^A-Za-z0-9_]")


@dataclass(frozen=True)
class SizeHistogram:
    """How often each size of a symbol is expected (``counts``: sorted ``(size, count)``), and
    how many buckets to derive from it (at most ``max_buckets``)."""

    counts: tuple[tuple[int, float], ...]
    max_buckets: int = DEFAULT_HISTOGRAM_BUCKETS

    def describe(self) -> str:
        """The canonical text form, ``12:40,37:5/4``."""
        return ",".join(f"{v}:{c:g}" for v, c in self.counts) + f"/{self.max_buckets}"


def histogram_buckets(
    histogram: SizeHistogram, minimum: int, maximum: int
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The buckets (at most ``histogram.max_buckets``) that minimize the expected padded size of
    the histogram's sizes, and the share of the histogram each serves (summing to 1).

    A bucket is a size the histogram needs rounded up to a multiple of 8 (of 1 when the largest
    size is under 64; of a larger power of two when that leaves over
    :data:`MAX_BUCKET_CANDIDATES` candidates), within ``minimum..maximum``; the largest bucket
    covers the largest size.
    Solved exactly by dynamic programming over those candidates. Raises
    ``ModelError("bad_buckets")`` for a size outside ``minimum..maximum``, or counts that are
    not finite or do not sum to a positive total of at most :data:`MAX_HISTOGRAM_TOTAL`.
    """
    counts = [c for _, c in histogram.counts]
    if not all(math.isfinite(c) and c >= 0 for c in counts) or not (
        0 < sum(counts) <= MAX_HISTOGRAM_TOTAL
    ):
        raise ModelError(
            "bad_buckets",
            f"histogram counts must be finite, non-negative and sum to a positive total of "
            f"at most {MAX_HISTOGRAM_TOTAL:g}",
        )
    sizes = [v for v, _ in histogram.counts]
    outside = [v for v in sizes if v < minimum or v > maximum]
    if outside:
        raise ModelError(
            "bad_buckets",
            f"histogram sizes {outside[:5]} are outside the range the model accepts "
            f"({minimum}..{maximum})",
        )
    granule = 8 if sizes[-1] >= 64 else 1
    candidates = sorted({min(maximum, -(-v // granule) * granule) for v in sizes})
    while len(candidates) > MAX_BUCKET_CANDIDATES:  # coarser, to bound the DP's work
        granule *= 2
        candidates = sorted({min(maximum, -(-v // granule) * granule) for v in sizes})
    weight = [0.0] * len(candidates)  # the count each candidate would serve on its own
    for size, count in histogram.counts:
        weight[bisect.bisect_left(candidates, size)] += count
    # best[t][j]: least cost of serving every size <= candidates[j] with t + 1 buckets, the
    # largest at candidates[j]; a bucket at c_j serves the sizes above the previous bucket.
    m, k = len(candidates), max(1, min(histogram.max_buckets, len(candidates)))
    prefix = [0.0]
    for w in weight:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    best = [[inf] * m for _ in range(k)]
    back = [[-1] * m for _ in range(k)]
    for j in range(m):
        best[0][j] = candidates[j] * prefix[j + 1]
    for t in range(1, k):
        for j in range(m):
            for i in range(j):
                cost = best[t - 1][i] + candidates[j] * (prefix[j + 1] - prefix[i + 1])
                if cost < best[t][j]:
                    best[t][j], back[t][j] = cost, i
    t = min(range(k), key=lambda t: (best[t][m - 1], t))
    chosen, j = [], m - 1
    while j >= 0 and t >= 0:
        chosen.append(j)
        j, t = back[t][j], t - 1
    chosen.reverse()
    total = prefix[-1]
    shares, below = [], -1
    for j in chosen:
        shares.append((prefix[j + 1] - prefix[below + 1]) / total)
        below = j
    return tuple(candidates[j] for j in chosen), tuple(shares)


@dataclass(frozen=True)
class SymbolicDim:
    """One symbolic dimension of a model input: its symbol, where it is, and the range the
    model declares for it (``maximum`` ``None``: unbounded)."""

    symbol: str
    input: str
    axis: int
    minimum: int = 1
    maximum: int | None = None

    @property
    def alias(self) -> str:
        """``INPUT.AXIS``: the other name a bucket option may use for the symbol."""
        return f"{self.input}.{self.axis}"


@dataclass(frozen=True)
class ShapeBuckets:
    """The buckets of a model: each symbol's values (sorted, distinct), and which symbols got
    the default values because the user gave none."""

    values: tuple[tuple[str, tuple[int, ...]], ...]
    defaulted: tuple[str, ...] = ()
    #: Symbols whose buckets a histogram gave: each bucket's share of the expected inputs, and
    #: the histogram (:meth:`SizeHistogram.describe`).
    shares: tuple[tuple[str, tuple[float, ...]], ...] = ()
    histograms: tuple[tuple[str, str], ...] = ()

    def specializations(self) -> list[tuple[tuple[str, int], ...]]:
        """Every combination of one value per symbol, smallest first."""
        symbols = [symbol for symbol, _ in self.values]
        combos = itertools.product(*(values for _, values in self.values))
        return [tuple(zip(symbols, combo)) for combo in combos]

    def specialization_shares(self) -> list[float]:
        """The expected share of inputs each of :meth:`specializations` serves: the product of
        its values' shares, a symbol without a histogram sharing equally among its values."""
        given = dict(self.shares)
        per_symbol = [given.get(s, tuple(1 / len(v) for _ in v)) for s, v in self.values]
        return [math.prod(combo) for combo in itertools.product(*per_symbol)]

    def describe(self) -> str:
        parts = [f"{s}={','.join(map(str, v))}" for s, v in self.values]
        text = " ".join(parts)
        for symbol, shares in self.shares:
            text += (
                f" ({symbol} from a histogram; shares of the expected inputs "
                + ", ".join(f"{share:.0%}" for share in shares)
                + ")"
            )
        if self.defaulted:
            text += (
                f" (default for {', '.join(self.defaulted)}: powers of two from {DEFAULT_MIN} "
                f"up to {DEFAULT_MAX} within the model's range; choose with --buckets)"
            )
        return text

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "symbols": {symbol: list(values) for symbol, values in self.values},
            "defaulted": list(self.defaulted),
            "description": self.describe(),
        }
        if self.shares:
            data["shares"] = {symbol: list(shares) for symbol, shares in self.shares}
            data["histograms"] = dict(self.histograms)
        return data


#: What a bucket option gives a symbol: its bucket values, or a histogram to derive them from.
BucketSpec = tuple[int, ...] | SizeHistogram


def parse_bucket_option(text: str) -> tuple[str, BucketSpec]:
    """Parse one ``NAME=V1,V2,...`` or histogram ``NAME~SIZE:COUNT,...[/BUCKETS]``
    (``--buckets``); ``ModelError("bad_buckets")`` if bad."""
    if "~" in text.partition("=")[0]:
        return _parse_histogram_option(text)
    name, sep, values = text.strip().partition("=")
    name = name.strip()
    try:
        if not sep or not name:
            raise ValueError
        parsed = tuple(int(v) for v in values.split(","))
    except ValueError:
        raise ModelError(
            "bad_buckets",
            f"invalid buckets {text!r}: expected NAME=V1,V2,... with integer values "
            "(e.g. seq=16,64,128) or a histogram NAME~SIZE:COUNT,... (e.g. seq~12:40,100:3)",
        ) from None
    bad = [v for v in parsed if not 1 <= v <= MAX_BUCKET_VALUE]
    if bad:
        raise ModelError(
            "bad_buckets",
            f"invalid buckets {text!r}: every value must be between 1 and {MAX_BUCKET_VALUE}",
        )
    return name, parsed


def _parse_histogram_option(text: str) -> tuple[str, SizeHistogram]:
    name, _, body = text.strip().partition("~")
    body, _, count_text = body.partition("/")
    name = name.strip()
    try:
        if not name or not body.strip():
            raise ValueError
        counts: dict[int, float] = {}
        for item in body.split(","):
            size, sep, count = item.partition(":")
            counts[int(size)] = counts.get(int(size), 0.0) + (float(count) if sep else 1.0)
        max_buckets = int(count_text) if count_text.strip() else DEFAULT_HISTOGRAM_BUCKETS
    except ValueError:
        raise ModelError(
            "bad_buckets",
            f"invalid histogram {text!r}: expected NAME~SIZE:COUNT,...[/BUCKETS] with integer "
            "sizes and counts (e.g. seq~12:40,37:5,100:3/3)",
        ) from None
    if (
        not all(1 <= v <= MAX_BUCKET_VALUE for v in counts)
        or not all(math.isfinite(c) and c >= 0 for c in counts.values())
        or not 0 < sum(counts.values()) <= MAX_HISTOGRAM_TOTAL
    ):
        raise ModelError(
            "bad_buckets",
            f"invalid histogram {text!r}: sizes must be between 1 and {MAX_BUCKET_VALUE}, "
            f"counts finite, non-negative, not all zero and summing to at most "
            f"{MAX_HISTOGRAM_TOTAL:g}",
        )
    if len(counts) > MAX_HISTOGRAM_SIZES or not 1 <= max_buckets <= MAX_SPECIALIZATIONS:
        raise ModelError(
            "bad_buckets",
            f"invalid histogram {text!r}: at most {MAX_HISTOGRAM_SIZES} distinct sizes and "
            f"1..{MAX_SPECIALIZATIONS} buckets",
        )
    kept = tuple(sorted((v, c) for v, c in counts.items() if c > 0))
    return name, SizeHistogram(kept, max_buckets)


def parse_bucket_field(text: str) -> dict[str, BucketSpec]:
    """Parse the REST form field: one or more ``NAME=V1,V2`` or ``NAME~SIZE:COUNT,...``
    separated by ``;`` or spaces (empty: no buckets). A symbol named twice is an error."""
    specs: dict[str, BucketSpec] = {}
    for item in re.split(r"[;\s]+", text.strip()):
        if not item:
            continue
        name, values = parse_bucket_option(item)
        if name in specs:
            raise ModelError("bad_buckets", f"buckets name {name!r} twice")
        specs[name] = values
    return specs


def merge_bucket_options(items: Sequence[str]) -> dict[str, BucketSpec]:
    """The ``--buckets`` options of a command line as one mapping (a name given twice is an
    error)."""
    return parse_bucket_field(";".join(items))


def bucket_values(buckets_json: str | None) -> dict[str, BucketSpec]:
    """The ``buckets`` argument of ``load_model`` that reproduces stored buckets
    (``ShapeBuckets.to_json()`` as JSON, e.g. a model row's; ``None``: none): a symbol's
    histogram where one gave its buckets (so its shares come back too), else its values."""
    if not buckets_json:
        return {}
    data = json.loads(buckets_json)
    out: dict[str, BucketSpec] = {
        str(name): tuple(int(v) for v in values) for name, values in data.get("symbols", {}).items()
    }
    for name, text in (data.get("histograms") or {}).items():
        out[str(name)] = _parse_histogram_option(f"{name}~{text}")[1]
    return out


def default_values(dim: SymbolicDim) -> tuple[int, ...]:
    """Powers of two from :data:`DEFAULT_MIN` to :data:`DEFAULT_MAX` within the symbol's
    declared range; when none falls in it, the powers of two of the range, else its bounds."""
    low = max(1, dim.minimum)
    high = DEFAULT_MAX if dim.maximum is None else min(dim.maximum, DEFAULT_MAX)
    powers = [1 << k for k in range(int(math.log2(DEFAULT_MAX)) + 1)]
    chosen = [p for p in powers if max(low, DEFAULT_MIN) <= p <= high]
    if not chosen:
        chosen = [p for p in powers if low <= p <= high]
    if not chosen:
        chosen = [low if dim.maximum is None else min(max(low, 1), dim.maximum)]
    return tuple(chosen)


def resolve_buckets(
    dims: Sequence[SymbolicDim],
    given: Mapping[str, Sequence[int] | SizeHistogram],
    pinned: Mapping[str, int] | None = None,
) -> ShapeBuckets | None:
    """The buckets of a model with symbolic dimensions ``dims``.

    ``given``: the user's buckets by symbol (or ``INPUT.AXIS`` alias), values or a histogram
    to derive them from (:func:`histogram_buckets`, within the symbol's range and
    :data:`MAX_BUCKET_VALUE`); ``pinned``: symbols
    already bound by ``--input-shape`` (they win: such a symbol has no buckets). A symbol given
    no buckets gets :func:`default_values`. Returns ``None`` when no symbol is left. Raises
    ``ModelError("bad_buckets")`` for a name the model does not declare, a value outside the
    symbol's declared range, or more than :data:`MAX_SPECIALIZATIONS` specializations.
    """
    pinned = dict(pinned or {})
    by_name: dict[str, SymbolicDim] = {}
    symbols: dict[str, list[SymbolicDim]] = {}
    for dim in dims:
        by_name.setdefault(dim.symbol, dim)
        by_name.setdefault(dim.alias, dim)
        symbols.setdefault(dim.symbol, []).append(dim)
    chosen: dict[str, tuple[int, ...]] = {}
    shares: dict[str, tuple[float, ...]] = {}
    histograms: dict[str, str] = {}
    for name, values in given.items():
        dim = by_name.get(name)
        if dim is None:
            known = ", ".join(f"{d.symbol} ({d.alias})" for d in dims) or "none"
            raise ModelError(
                "bad_buckets",
                f"--buckets names {name!r}, which is not a symbolic dimension of the model; "
                f"its symbolic dimensions are: {known}",
            )
        if dim.symbol in pinned:
            continue  # --input-shape pins one shape and wins over buckets
        if dim.symbol in chosen:
            raise ModelError("bad_buckets", f"buckets give symbol {dim.symbol!r} twice")
        low = max(d.minimum for d in symbols[dim.symbol])
        highs = [d.maximum for d in symbols[dim.symbol] if d.maximum is not None]
        high = min(highs) if highs else None
        if isinstance(values, SizeHistogram):
            derived, shares[dim.symbol] = histogram_buckets(
                values, low, MAX_BUCKET_VALUE if high is None else high
            )
            histograms[dim.symbol] = values.describe()
            chosen[dim.symbol] = derived
            continue
        outside = [v for v in values if v < low or (high is not None and v > high)]
        if outside:
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise ModelError(
                "bad_buckets",
                f"buckets {outside} of {dim.symbol!r} are outside the range the model accepts "
                f"for it ({bound})",
            )
        chosen[dim.symbol] = tuple(sorted(set(int(v) for v in values)))
    defaulted = []
    for symbol, occurrences in symbols.items():
        if symbol in pinned or symbol in chosen:
            continue
        merged = SymbolicDim(
            symbol,
            occurrences[0].input,
            occurrences[0].axis,
            max(d.minimum for d in occurrences),
            min((d.maximum for d in occurrences if d.maximum is not None), default=None),
        )
        chosen[symbol] = default_values(merged)
        defaulted.append(symbol)
    if not chosen:
        return None
    count = math.prod(len(v) for v in chosen.values())
    if count > MAX_SPECIALIZATIONS:
        raise ModelError(
            "bad_buckets",
            f"the buckets make {count} static specializations of the model, over the limit of "
            f"{MAX_SPECIALIZATIONS}; give fewer values (--buckets NAME=V1,V2,...)",
        )
    order = [s for s in symbols if s in chosen]
    return ShapeBuckets(
        tuple((s, chosen[s]) for s in order),
        tuple(defaulted),
        tuple((s, shares[s]) for s in order if s in shares),
        tuple((s, histograms[s]) for s in order if s in histograms),
    )


def bucket_input_shapes(
    dims: Sequence[SymbolicDim],
    declared: Mapping[str, Sequence[int | None]],
    values: Mapping[str, int],
) -> dict[str, tuple[int, ...]]:
    """The full static shape of every input with a symbolic dimension, for symbol ``values``
    (``declared``: each such input's shape, ``None`` at its symbolic axes)."""
    shapes: dict[str, list[int | None]] = {}
    for dim in dims:
        shape = shapes.setdefault(dim.input, list(declared[dim.input]))
        shape[dim.axis] = values[dim.symbol]
    return {name: tuple(int(d) for d in shape) for name, shape in shapes.items()}  # type: ignore[arg-type]


def function_name(values: Sequence[tuple[str, int]]) -> str:
    """The VM function of one specialization: ``main_seq_16``, ``main_s70_16_batch_2``."""
    parts = [f"{_NAME.sub('_', symbol)}_{value}" for symbol, value in values]
    return "main_" + "_".join(parts)
