"""How deep a client's JSON document may nest, checked before it is parsed.

Python's ``json`` parser recurses once per bracket: a document nested a few thousand brackets
deep raises :class:`RecursionError` (a server error, not a refusal) and one nested less deep
still reaches code that recurses over the parsed value. Every JSON document a client sends (a
request body, a finalize manifest, a JSON string inside a body) is checked here first:
:func:`nesting_exceeds` measures the raw text in linear vectorized passes without parsing it,
and :func:`loads` parses only what passed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

#: Deepest nesting of arrays and objects accepted anywhere a client sends JSON. TuneHub's own
#: documents nest less than 10 deep (a measured batch of real MetaSchedule traces: 8).
MAX_JSON_DEPTH = 64

#: Every byte but the four brackets and the quote: deleted before the depth is measured.
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'[]{}"')
#: Objects and arrays nest alike: both bracket kinds become ``[`` (91) and ``]`` (93).
_SAME_BRACKETS = bytes.maketrans(b"{}", b"[]")
_OPEN, _CLOSE, _QUOTE = 91, 93, 34
#: Bytes measured at once (their running counts are int32 arrays 4 times the size).
_CHUNK = 1 << 20


class JsonTooDeep(ValueError):
    """A JSON document nests deeper than the limit (a ``ValueError``, as bad JSON is)."""

    def __init__(self, max_depth: int, what: str = "the JSON document") -> None:
        super().__init__(f"{what} nests arrays and objects more than {max_depth} levels deep")
        self.max_depth = max_depth


def _utf8(data: bytes | str) -> bytes:
    """The document as UTF-8, whichever encoding ``json.loads`` would detect (UTF-16 and -32
    would hide escapes from a byte scan)."""
    if isinstance(data, str):
        return data.encode("utf-8", "surrogatepass")
    encoding = json.detect_encoding(data)
    if encoding in ("utf-8", "utf-8-sig"):
        return bytes(data)
    return data.decode(encoding, "replace").encode("utf-8", "surrogatepass")


def nesting_depth(data: bytes | str) -> int:
    """How deep the JSON text ``data`` nests arrays and objects (0 for a scalar).

    Parses nothing and builds nothing of the document's size but byte copies: escaped quotes
    are dropped (a run of backslashes pairs up left to right, so ``bytes.replace`` finds exactly
    the escaping ones), everything but brackets and quotes is deleted, and with numpy, chunk by
    chunk, the quotes' running count marks what lies inside strings and the brackets' running
    count outside them is the depth. Linear in ``len(data)`` with no per-token work (well under
    a second for 16 MiB of nothing but brackets and quotes). For text that is not well-formed
    JSON it is an upper bound of how deep a parser recurses before it fails.
    """
    raw = _utf8(data).replace(b"\\\\", b"").replace(b'\\"', b"")
    view = np.frombuffer(raw.translate(_SAME_BRACKETS, _NOT_STRUCTURE), np.uint8)
    depth = deepest = quotes = 0
    for start in range(0, len(view), _CHUNK):
        chunk = view[start : start + _CHUNK]
        inside = np.cumsum(chunk == _QUOTE, dtype=np.int32)
        inside += quotes
        quotes = int(inside[-1])
        steps = (chunk == _OPEN).astype(np.int32)
        steps -= chunk == _CLOSE
        steps[(inside & 1).astype(bool)] = 0  # brackets inside strings are text
        np.cumsum(steps, out=steps)
        deepest = max(deepest, depth + int(steps.max()))
        depth += int(steps[-1])
    return deepest


def nesting_exceeds(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text ``data`` nests arrays/objects more than ``max_depth`` levels deep
    (:func:`nesting_depth`; a text with at most ``max_depth`` opening brackets is not even
    measured)."""
    raw = _utf8(data)
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    return nesting_depth(raw) > max_depth


def check_depth(
    data: bytes | str, max_depth: int = MAX_JSON_DEPTH, what: str = "the JSON document"
) -> None:
    """Raise :class:`JsonTooDeep` (naming ``what``) when ``data`` nests deeper than
    ``max_depth``."""
    if nesting_exceeds(data, max_depth):
        raise JsonTooDeep(max_depth, what)


def loads(
    data: bytes | str, max_depth: int = MAX_JSON_DEPTH, what: str = "the JSON document"
) -> Any:
    """``json.loads`` of a client's document, refused first when it nests deeper than
    ``max_depth``. Raises ``ValueError``: :class:`JsonTooDeep`, or ``json.JSONDecodeError`` for
    text that is not JSON; never ``RecursionError``."""
    check_depth(data, max_depth, what)
    try:
        return json.loads(data)
    except RecursionError:  # cannot happen within the depth limit; a refusal all the same
        raise JsonTooDeep(max_depth, what) from None


def check_file(path: Path, max_depth: int = MAX_JSON_DEPTH, what: str | None = None) -> None:
    """Raise :class:`JsonTooDeep` when the JSON file at ``path`` nests deeper than ``max_depth``
    (``OSError`` when it cannot be read). The caller bounds the file's size."""
    check_depth(path.read_bytes(), max_depth, what or path.name)
