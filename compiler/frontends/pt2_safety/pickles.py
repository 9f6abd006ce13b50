"""Scanning pickle bytes without unpickling them: every global a pickle references must be in
:data:`ALLOWED_GLOBALS` (what ``torch.save`` writes for plain tensors) and every opcode must only
build data (:func:`scan_pickle`)."""

from __future__ import annotations

import io
import pickletools
import struct
from dataclasses import dataclass
from typing import IO

from compiler.errors import ModelError

_MAX_LEGACY_PICKLES = 5  # torch.serialization._legacy_load reads at most 5 consecutive pickles

_STORAGE_TYPES = (
    "BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage",
    "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage",
    "LongStorage", "ShortStorage",
)  # fmt: skip

#: ``(module, name)`` pairs a pickle may reference. Derived from genuine ``torch.export.save``
#: archives (the only pickle is the ``torch.save`` of the example inputs): tensors are
#: ``_rebuild_tensor_v2`` over a typed storage class with an ``OrderedDict`` of backward hooks;
#: ``_rebuild_parameter`` covers ``nn.Parameter`` example inputs. Every entry is also allowed by
#: torch's own weights-only unpickler (``torch/_weights_only_unpickler.py:_get_allowed_globals``);
#: quantized storages, layouts, devices, tensor subclasses and ``_rebuild_from_type_v2`` are
#: deliberately left out.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_parameter"),
        ("collections", "OrderedDict"),
    }
    | {("torch", name) for name in _STORAGE_TYPES}
)

# Opcodes that only build data (plus GLOBAL/STACK_GLOBAL, checked against ALLOWED_GLOBALS, REDUCE,
# which can then only call allowlisted callables, and BINPERSID, which torch's loader resolves to a
# storage).
_ALLOWED_OPCODES = frozenset(
    """PROTO FRAME STOP MARK POP POP_MARK DUP PUT BINPUT LONG_BINPUT MEMOIZE GET BINGET LONG_BINGET
    NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 LONG4 FLOAT BINFLOAT
    STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE SHORT_BINUNICODE BINUNICODE8
    BINBYTES SHORT_BINBYTES BINBYTES8 BYTEARRAY8 EMPTY_LIST APPEND APPENDS LIST EMPTY_TUPLE TUPLE
    TUPLE1 TUPLE2 TUPLE3 EMPTY_DICT DICT SETITEM SETITEMS EMPTY_SET ADDITEMS FROZENSET
    GLOBAL STACK_GLOBAL REDUCE BINPERSID""".split()
)
_OPCODE_REASONS = {
    "EXT1": "resolves a global through the copyreg extension registry",
    "EXT2": "resolves a global through the copyreg extension registry",
    "EXT4": "resolves a global through the copyreg extension registry",
    "INST": "instantiates a class",
    "OBJ": "instantiates a class",
    "NEWOBJ": "instantiates a class",
    "NEWOBJ_EX": "instantiates a class",
    "BUILD": "calls __setstate__ / updates an object's __dict__",
    "PERSID": "uses a text persistent id, which torch never writes",
    "NEXT_BUFFER": "uses out-of-band buffers",
    "READONLY_BUFFER": "uses out-of-band buffers",
}
_STRING_OPCODES = frozenset(
    {
        "STRING",
        "BINSTRING",
        "SHORT_BINSTRING",
        "UNICODE",
        "BINUNICODE",
        "SHORT_BINUNICODE",
        "BINUNICODE8",
    }
)
_PUT_OPCODES = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})
_GET_OPCODES = frozenset({"GET", "BINGET", "LONG_BINGET"})


@dataclass(frozen=True)
class PickleScan:
    """Result of scanning one pickle stream: label, number of pickles in it, globals referenced."""

    member: str
    pickles: int
    globals: tuple[str, ...]


class _Mark:
    """Stack marker for the MARK opcode."""


class _Unknown:
    """A stack value the scanner does not track (anything but a string literal)."""


_MARK = _Mark()
_UNKNOWN = _Unknown()


class _MalformedPickle(Exception):
    pass


def _unsafe(member: str, what: str) -> ModelError:
    return ModelError(
        "unsafe_pickle",
        f"refusing .pt2 file: pickle member {member!r} {what}; TuneHub only accepts pickles of "
        "plain tensors, as torch.export.save writes them",
    )


def _check_global(member: str, module: str, name: str, seen: set[str]) -> None:
    if (module, name) not in ALLOWED_GLOBALS:
        raise _unsafe(member, f"references the forbidden global {module}.{name}")
    seen.add(f"{module}.{name}")


def _scan_one_pickle(stream: IO[bytes], member: str, seen: set[str]) -> None:
    """Walk one pickle (up to STOP) with a symbolic stack; raise on forbidden content.

    Forbidden globals/opcodes raise ``ModelError('unsafe_pickle')`` as soon as they are reached (the
    real unpickler would act on them in the same order); anything malformed raises
    ``_MalformedPickle``.
    """
    stack: list[object] = []
    memo: dict[int, object] = {}

    def pop() -> object:
        if not stack or stack[-1] is _MARK:
            raise _MalformedPickle("stack underflow")
        return stack.pop()

    try:
        for opcode, arg, pos in pickletools.genops(stream):
            name = opcode.name
            if name in ("GLOBAL", "INST"):
                module, _, qualname = str(arg).partition(" ")
                _check_global(member, module, qualname, seen)
            if name not in _ALLOWED_OPCODES:
                reason = _OPCODE_REASONS.get(name, "is not needed for tensor data")
                raise _unsafe(member, f"uses opcode {name} at byte {pos}, which {reason}")
            if name == "PROTO" and not 0 <= int(arg) <= 5:
                raise _MalformedPickle(f"unknown protocol {arg}")
            if name in _STRING_OPCODES:
                stack.append(arg if isinstance(arg, str) else _UNKNOWN)
            elif name in _PUT_OPCODES or name == "MEMOIZE":
                if not stack or stack[-1] is _MARK:
                    raise _MalformedPickle("memo store from an empty stack")
                memo[len(memo) if name == "MEMOIZE" else int(arg)] = stack[-1]
            elif name in _GET_OPCODES:
                if int(arg) not in memo:
                    raise _MalformedPickle(f"memo key {arg} missing")
                stack.append(memo[int(arg)])
            elif name == "DUP":
                if not stack or stack[-1] is _MARK:
                    raise _MalformedPickle("DUP on an empty stack")
                stack.append(stack[-1])
            elif name == "POP":  # like Unpickler.load_pop: an empty frame pops the MARK itself
                if not stack:
                    raise _MalformedPickle("stack underflow")
                stack.pop()
            elif name == "STACK_GLOBAL":
                qualname_v, module_v = pop(), pop()
                if not isinstance(module_v, str) or not isinstance(qualname_v, str):
                    raise _unsafe(
                        member,
                        f"uses STACK_GLOBAL at byte {pos} with a module/name that is not a plain "
                        "string literal, so it cannot be verified",
                    )
                _check_global(member, module_v, qualname_v, seen)
                stack.append(_UNKNOWN)
            elif name == "MARK":
                stack.append(_MARK)
            else:
                before = list(opcode.stack_before)
                if before and before[-1] is pickletools.stackslice:
                    while stack and stack[-1] is not _MARK:
                        stack.pop()
                    if not stack:
                        raise _MalformedPickle("no MARK on the stack")
                    stack.pop()
                    before = before[:-2]
                for _ in before:
                    pop()
                stack.extend(_UNKNOWN for _ in opcode.stack_after)
    except ModelError:
        raise
    except (ValueError, EOFError, struct.error, UnicodeDecodeError, OverflowError) as exc:
        raise _MalformedPickle(str(exc) or type(exc).__name__) from exc


def scan_pickle(data: bytes, *, member: str = "<pickle>", strict: bool = True) -> PickleScan:
    """Scan pickle bytes without unpickling anything; return the globals they reference.

    Every GLOBAL / INST / STACK_GLOBAL (module and name of STACK_GLOBAL resolved through the string
    pushes and memo gets that precede it) must be in :data:`ALLOWED_GLOBALS`, and only data-building
    opcodes may appear. ``strict`` (for members torch unpickles): ``data`` must be exactly one
    well-formed pickle -- the legacy multi-pickle ``torch.save`` format is refused. Non-strict (for
    members torch never unpickles but that look like pickles): up to 5 consecutive pickles are
    walked until one turns out malformed.

    Raises ``ModelError('unsafe_pickle')`` for forbidden content -- also when it precedes a
    malformed part, since an unpickler acts on opcodes in order -- and, if ``strict``,
    ``ModelError('bad_pt2')`` for malformed data or bytes after the pickle's STOP.
    """
    stream = io.BytesIO(data)
    seen: set[str] = set()
    count = 0
    while count < (1 if strict else _MAX_LEGACY_PICKLES) and stream.tell() < len(data):
        start = stream.tell()
        try:
            _scan_one_pickle(stream, member, seen)
        except _MalformedPickle as exc:
            if strict:
                raise ModelError(
                    "bad_pt2", f"malformed pickle in .pt2 member {member!r} at byte {start}: {exc}"
                ) from None
            break
        count += 1
    if strict and stream.tell() < len(data):
        raise ModelError(
            "bad_pt2",
            f"malformed pickle in .pt2 member {member!r}: {len(data) - stream.tell()} bytes follow "
            "the pickle (the legacy torch.save format is not supported; torch.export.save never "
            "writes it)",
        )
    return PickleScan(member=member, pickles=count, globals=tuple(sorted(seen)))


def _looks_like_pickle(head: bytes) -> bool:
    return len(head) >= 2 and head[0] == 0x80 and 1 <= head[1] <= 5
