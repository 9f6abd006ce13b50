"""Issue 31 (case 5): a bucket histogram's numbers are bounded where they are parsed. Counts
each finite but summing to infinity, NaN, infinite, negative or absurdly large counts, and
sizes or bucket counts past any integer a model takes are ``bad_buckets`` with a message, and
:func:`histogram_buckets` refuses such a histogram built by hand."""

from __future__ import annotations

import math

import pytest

from compiler.errors import ModelError
from compiler.shapes.buckets import (
    MAX_HISTOGRAM_TOTAL,
    SizeHistogram,
    histogram_buckets,
    parse_bucket_field,
    parse_bucket_option,
)


@pytest.mark.parametrize(
    "spec",
    [
        "seq~16:1e308,32:1e308,64:1e308/2",
        "seq~16:1e308,16:1e308",  # one size named twice: the sum of its counts overflows
        "seq~16:nan",
        "seq~16:inf",
        "seq~16:-1e308",
        f"seq~16:{MAX_HISTOGRAM_TOTAL * 2:g}",
        "seq~16:" + "9" * 400,
        "seq~" + "9" * 5000 + ":1",
        "seq~16:1/" + "9" * 40,
        "seq=" + "9" * 40,
    ],
)
def test_absurd_numbers_are_refused(spec: str) -> None:
    with pytest.raises(ModelError) as info:
        parse_bucket_field(spec)
    assert info.value.code == "bad_buckets" and info.value.message


def test_large_but_finite_counts_give_finite_shares() -> None:
    _, histogram = parse_bucket_option(f"seq~16:{MAX_HISTOGRAM_TOTAL / 2:g},64:1/2")
    values, shares = histogram_buckets(histogram, 1, 1 << 20)
    assert values == (16, 64) and all(math.isfinite(s) for s in shares)
    assert sum(shares) == pytest.approx(1.0)


def test_a_histogram_built_by_hand_is_checked_too() -> None:
    for counts in (((16, 1e308), (32, 1e308)), ((16, math.nan),), ((16, 0.0),)):
        with pytest.raises(ModelError, match="histogram counts"):
            histogram_buckets(SizeHistogram(counts, 2), 1, 1 << 20)
