"""``service.json_limits`` (issue 31, case 6): the nesting depth of a client's JSON text is
measured exactly without parsing it, in linear time whatever the text, and a document nested
deeper than the limit is a ``ValueError``, never a ``RecursionError``."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.json_limits import (
    MAX_JSON_DEPTH,
    JsonTooDeep,
    check_file,
    loads,
    nesting_depth,
    nesting_exceeds,
)

#: Strings full of what a byte scan could mistake for structure.
tricky_text = st.text(alphabet='[]{}"\\ ,:a\n', max_size=8)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(tricky_text, inner, max_size=3),
    max_leaves=30,
)


def _depth(value) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None, database=None)
@given(value=values, indent=st.sampled_from([None, 1]), ascii_only=st.booleans())
def test_depth_is_exact_for_any_document(value, indent, ascii_only) -> None:
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    depth = _depth(value)
    assert nesting_depth(text) == depth
    assert nesting_depth(text.encode("utf-16")) == depth  # json.loads reads UTF-16 too
    for limit in (0, 1, depth - 1, depth, depth + 1):
        if limit >= 0:
            assert nesting_exceeds(text, limit) == (depth > limit)


@pytest.mark.parametrize(
    "text, depth",
    [
        ('"[[[["', 0),
        ('["\\"[", [[]]]', 3),  # an escaped quote does not end the string
        ('["\\\\", [[]]]', 3),  # an escaped backslash does not escape the quote after it
        ('["\\\\\\"[[[", []]', 2),
        ('{"a": {"b": [{}]}}', 4),
        ('"unterminated [[[[', 0),
    ],
)
def test_strings_and_escapes(text: str, depth: int) -> None:
    assert nesting_depth(text) == depth


def test_a_real_measured_batch_is_far_below_the_limit() -> None:
    """A batch as a worker sends it (real MetaSchedule traces make a batch 8 deep)."""
    record = {
        "trace": [[["SamplePerfectTile", ["l1"], [4, 64], ["v2", "v3"]]], [[0, [[2, 2]]]]],
        "run_secs": [1e-4],
        "args_info": [["TENSOR", "float32", [8, 32]]],
    }
    batch = json.dumps({"batch": 0, "records": [record] * 64})
    assert nesting_depth(batch) < 10 < MAX_JSON_DEPTH


def test_200000_brackets_are_refused_quickly_as_value_errors(tmp_path) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    started = time.monotonic()
    assert nesting_exceeds(deep)
    with pytest.raises(JsonTooDeep, match="more than 64 levels"):
        loads(deep, what="the manifest")
    with pytest.raises(ValueError):  # JsonTooDeep is one, as json.JSONDecodeError is
        loads(deep)
    path = tmp_path / "manifest.json"
    path.write_text(deep)
    with pytest.raises(JsonTooDeep, match="manifest.json"):
        check_file(path)
    assert time.monotonic() - started < 2
    assert loads('{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}
    with pytest.raises(json.JSONDecodeError):
        loads("[1,")


@pytest.mark.parametrize(
    "adversarial",
    [
        b"[" * (8 << 20),
        b"[]" * (4 << 20),
        b'["' * (4 << 20),  # a string then a bracket, over and over
        b'"' + b'\\"' * (4 << 20),  # one string that never ends
        b"\\" * (8 << 20),
        (b"[" * 63 + b"]" * 63) * ((8 << 20) // 126),
    ],
    ids=["open", "pairs", "quote-bracket", "escaped-quotes", "backslashes", "63-deep-trees"],
)
def test_linear_time_on_adversarial_text(adversarial: bytes) -> None:
    """8 MiB of the worst a client can send is measured in well under the time a parser takes
    (no backtracking, no per-token Python work)."""
    started = time.monotonic()
    nesting_exceeds(adversarial)
    assert time.monotonic() - started < 3
