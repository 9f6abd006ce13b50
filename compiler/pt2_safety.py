"""Loading untrusted ``.pt2`` files (``torch.export.save`` archives) without running code from them.

Why this module exists -- what ``torch.export.load`` really does in PyTorch 2.13
=================================================================================

Read from the installed sources (``torch/export/__init__.py``,
``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``,
``torch/serialization.py``, ``torch/export/_unlift.py``):

* ``torch.export.load`` (``torch/export/__init__.py``) calls ``pt2_archive._package.load_pt2``. If
  that raises ``RuntimeError`` it logs the error and falls back to the pre-2.8 layout (top-level
  ``serialized_*.json`` / ``serialized_*.pt`` members read with :mod:`zipfile`).
* Plain weights and constants are **not** pickled in 2.13: ``_package_state_dict`` /
  ``_package_constants`` write the raw storage bytes (``data/weights/weight_N``,
  ``data/constants/tensor_N``) and describe them in ``data/weights/<model>_weights_config.json`` /
  ``data/constants/<model>_constants_config.json``. The graph itself is JSON
  (``models/<model>.json``).
* Pickles are still read, and **not** safely:

  - ``_package._load_state_dict`` / ``_load_constants``: an entry whose config says
    ``"use_pickle": true`` (tensor subclasses) is read with
    ``torch.load(io.BytesIO(...), weights_only=False)`` -- the full, code-executing unpickler;
    legacy ``data/weights/<model>.pt`` / ``data/constants/<model>.pt`` go to
    ``deserialize_torch_artifact`` (below).
  - ``_package._load_constants``: ``data/constants/opaque_obj_N`` -> plain ``pickle.loads``;
    ``data/constants/custom_obj_N`` -> ``torch._C._pickle_load_obj`` (TorchScript/torchbind
    unpickler).
  - ``serialize.deserialize_torch_artifact`` (used for ``data/sample_inputs/<model>.pt``, which
    every genuine archive contains as a nested ``torch.save`` zip): tries
    ``torch.load(weights_only=True)`` and, on **any** exception, retries with
    ``torch.load(weights_only=False)``. So a malicious sample-inputs pickle is refused by the
    weights-only unpickler and then executed by the fallback.
  - ``torch.load(weights_only=False)`` on a zip that looks like TorchScript dispatches to
    ``torch.jit.load``.
  - ``load_pt2`` loads an AOTInductor package (``data/aotinductor/<model>/...``, a compiled shared
    library) whenever such members exist: native code from the file.
* Not pickle, but code from the file all the same:

  - ``serialize.GraphModuleDeserializer._parse_sym_expr`` passes every ``expr_str`` string of the
    JSON to ``sympy.sympify``, which ``eval``\\ s it: ``"__import__('os').system(...)"`` runs during
    ``torch.export.load`` (verified with torch 2.13 / sympy 1.14).
  - ``guards_code`` strings from the JSON are pasted into Python source and ``exec``\\ d by
    ``torch/export/_unlift.py:_convert_guards_code_to_fn`` when ``ep.module()`` is built; the guard
    expressions then run on every call of that module.
  - ``call_function`` targets are looked up by dotted name from ``torch``/``operator``/``math`` (so
    ``"torch.os.system"`` resolves); the ``torch._export.verifier.Verifier`` run by
    ``ExportedProgram`` rejects non-operator targets, and :func:`load_exported_program` re-checks
    this.

What this module does about it
==============================

1. :func:`inspect_pt2_archive` examines the raw bytes before torch sees them: zip structure and
   limits, member names, that every member torch would unpickle is a pickle (or a nested
   ``torch.save`` zip whose ``data.pkl`` is) referencing only :data:`ALLOWED_GLOBALS` with data-only
   opcodes, no opaque/torchbind objects, no AOTInductor payload, and that every ``expr_str`` /
   ``guards_code`` string is a plain arithmetic expression over an allowlist of names.
2. :func:`load_exported_program` runs the inspection and then calls ``torch.export.load`` inside
   :func:`_hardened_torch_loading`, which for the duration of the call forces ``torch.load`` to
   ``weights_only=True`` (so the ``weights_only=False`` call sites and the fallback above reach only
   the weights-only unpickler), makes ``pickle.loads`` in ``_package`` /
   ``torch._C._pickle_load_obj`` / ``torch.jit.load`` / AOTInductor loading raise, re-validates
   every string handed to ``sympy.sympify`` by the deserializer, and never reads the sample
   inputs (``data/sample_inputs/``: torch is handed empty ones, so the program's
   ``example_inputs`` is ``None``). Nothing needs them to compile, and a genuine archive's may
   pickle objects that are not tensors (``transformers``' ``export_with_dynamic_cache`` pickles a
   ``DynamicCache``): they are accepted as bytes that are never unpickled, whatever they hold.
   A pytree type of the program's signature that this process does not know (that same
   ``DynamicCache``) is deserialized as an opaque stand-in (the graph is flat tensors), and a
   pytree context that names an enum (which torch would import by name) is refused. So if the
   scanner had a gap, torch's weights-only unpickler is a second barrier for pickles (the tests
   check both layers separately). The patches are process-wide while a load runs (loads are
   serialized by a lock); other threads' ``torch.load`` calls in that window are weights-only
   too.

``tests/compiler/test_pt2_safety.py`` shows plain ``torch.export.load`` executing payloads through
the sample-inputs fallback, a ``use_pickle`` weight, an opaque constant and an ``expr_str``, and the
same files being refused here -- with and without the scanner.

Error codes (all :class:`~compiler.errors.ModelError`)
------------------------------------------------------
``bad_pt2`` not a zip / corrupt / malformed pickle or JSON / torch failed to load it;
``pt2_truncated`` the archive is cut short; ``pt2_too_large`` sizes over the limits or a zip bomb;
``pt2_too_many_members``; ``pt2_too_many_programs`` more programs than the limit (checked before
any is loaded); ``pt2_bad_member_name`` absolute path, ``..``, duplicate or otherwise
unsafe member name; ``pt2_symlink``; ``unsafe_pickle`` a pickle that references a global outside the
allowlist or uses a non-data opcode; ``unsafe_pt2`` code-bearing content that is not a pickle
(AOTInductor library, TorchScript, executable expressions in the JSON).
``unsupported_ops`` the graph calls an operator PyTorch does not define (one that a library such as
``transformers`` registers when imported), so torch cannot load it.

Residual trust: ``torch._C.PyTorchFileReader`` (miniz) still parses the zip, and the weights-only
unpickler and JSON deserializer still run on the (checked) content; attribute look-ups of dotted
operator names may import torch submodules (torch's own code).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import os
import pickle
import pickletools
import re
import stat
import struct
import threading
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, BinaryIO

from compiler.errors import ModelError

if TYPE_CHECKING:  # torch is imported lazily: inspecting a file must not need it
    import torch

__all__ = [
    "ALLOWED_GLOBALS",
    "DEFAULT_MAX_MEMBERS",
    "DEFAULT_MAX_PROGRAMS",
    "DEFAULT_MAX_UNCOMPRESSED_BYTES",
    "PickleScan",
    "Pt2ArchiveReport",
    "Pt2Member",
    "inspect_pt2_archive",
    "load_exported_program",
    "load_exported_programs",
    "scan_pickle",
    "validate_guard_code",
    "validate_sympy_expr",
]

DEFAULT_MAX_UNCOMPRESSED_BYTES = 4 * 1024**3
DEFAULT_MAX_MEMBERS = 20_000
#: Programs one archive may hold (a decoder's prefill, decode and step, and a few buckets of
#: them): each is loaded, imported, tuned and verified, so their number bounds all that work.
DEFAULT_MAX_PROGRAMS = 8
#: a member larger than this whose compression ratio exceeds MAX_COMPRESSION_RATIO is a zip bomb
#: (torch.export.save stores members uncompressed, so genuine archives have ratio 1).
ZIP_BOMB_MIN_BYTES = 1024 * 1024
MAX_COMPRESSION_RATIO = 200
MAX_EXPRESSION_CHARS = 20_000
_MAX_LEGACY_PICKLES = 5  # torch.serialization._legacy_load reads at most 5 consecutive pickles
_CHUNK = 1024 * 1024

# Layout constants of torch/csrc/export/pt2_archive_constants.h (tests check them against torch).
ARCHIVE_FORMAT_PATH = "archive_format"
ARCHIVE_FORMAT_VALUE = "pt2"
ARCHIVE_VERSION_PATH = "archive_version"
MODELS_DIR = "models/"
WEIGHTS_DIR = "data/weights/"
CONSTANTS_DIR = "data/constants/"
SAMPLE_INPUTS_DIR = "data/sample_inputs/"
AOTINDUCTOR_DIR = "data/aotinductor/"
EXECUTORCH_DIR = "data/executorch/"
TENSOR_CONSTANT_FILENAME_PREFIX = "tensor_"
CUSTOM_OBJ_FILENAME_PREFIX = "custom_obj_"
OPAQUE_OBJ_FILENAME_PREFIX = "opaque_obj_"

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

_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP_MAGIC = b"PK\x05\x06"
_SAFE_PATH_NAME = re.compile(r"[A-Za-z0-9_.\-]+")
_MEMBER_NAME_OK = re.compile(r"[^\x00-\x1f\x7f\\:]+")

# ------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class Pt2Member:
    """One zip member: full name, sizes, and how it was treated (see ``Pt2ArchiveReport``)."""

    name: str
    uncompressed_bytes: int
    compressed_bytes: int
    kind: str  # "raw_tensor" | "pickle" | "torch_save_zip" | "json" | "other" | "directory"


@dataclass(frozen=True)
class PickleScan:
    """Result of scanning one pickle stream: label, number of pickles in it, globals referenced."""

    member: str
    pickles: int
    globals: tuple[str, ...]


@dataclass(frozen=True)
class Pt2ArchiveReport:
    """What :func:`inspect_pt2_archive` found in an archive it accepted.

    ``members`` lists the outer archive's members; ``pickles_scanned`` names every pickle stream
    that was scanned (``outer!inner`` for a ``data.pkl`` inside a nested ``torch.save`` zip);
    ``globals_seen`` is every ``module.name`` those pickles reference (always within
    :data:`ALLOWED_GLOBALS`).
    """

    root: str
    members: tuple[Pt2Member, ...]
    total_uncompressed_bytes: int
    total_compressed_bytes: int
    models: tuple[str, ...]
    pickles_scanned: tuple[str, ...]
    globals_seen: frozenset[str]

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.members)


# ---------------------------------------------------------------------------------- pickle scanning


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


# --------------------------------------------------------------------- expression validation (JSON)

_SYMPY_CALLABLES = frozenset(
    """Symbol Integer Float Rational Add Mul Pow Max Min Mod Abs floor ceiling Equality Unequality
    StrictLessThan LessThan StrictGreaterThan GreaterThan Eq Ne Lt Le Gt Ge And Or Not Piecewise
    ExprCondPair""".split()
)
# classes of torch/utils/_sympy/functions.py (tests check this list against torch)
_TORCH_SYMPY_FUNCTIONS = frozenset(
    """BitwiseFn_bitwise_and BitwiseFn_bitwise_or BitwiseFn_bitwise_xor CeilDiv CeilToInt CleanDiv
    FloatPow FloatTrueDiv FloorDiv FloorToInt Identity IntTrueDiv IsNonOverlappingAndDenseIndicator
    LShift Max Min Mod ModularIndexing OpaqueUnaryFn_acos OpaqueUnaryFn_asin OpaqueUnaryFn_asinh
    OpaqueUnaryFn_atan OpaqueUnaryFn_cos OpaqueUnaryFn_cosh OpaqueUnaryFn_exp OpaqueUnaryFn_log
    OpaqueUnaryFn_log2 OpaqueUnaryFn_sin OpaqueUnaryFn_sinh OpaqueUnaryFn_sqrt OpaqueUnaryFn_tan
    OpaqueUnaryFn_tanh PowByNatural PythonMod RShift RoundDecimal RoundToInt ToFloat TruncToFloat
    TruncToInt Where""".split()
)
_SYMPY_CONSTANTS = frozenset({"oo", "zoo", "nan", "true", "false", "int_oo", "pi", "E"})
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FLOAT_TEXT = re.compile(r"[-+]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf|nan)")
_ARITH_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_UNARY_OPS = (ast.USub, ast.UAdd, ast.Not, ast.Invert)

_GUARD_NAMES = frozenset(
    {"L", "math", "torch", "inf", "max", "min", "abs", "int", "float", "round", "bool",
     "IsNonOverlappingAndDenseIndicator", "cast_symbool_to_symint_guardless"}
)  # fmt: skip
_GUARD_MODULE_ATTRS = {
    "math": frozenset(
        """floor ceil trunc sqrt exp log log2 pow isnan isinf isfinite inf nan
        acos asin atan cos cosh sin sinh tan tanh""".split()
    ),
    "torch": frozenset(
        "sym_float sym_int sym_max sym_min sym_not sym_ite sym_sqrt _sym_sqrt".split()
    ),
}
_GUARD_VALUE_ATTRS = frozenset({"size", "stride", "storage_offset", "dim", "numel", "shape"})
_GUARD_STRING = re.compile(r"[A-Za-z0-9_.\- ]*")


def _expr_error(what: str, text: str, why: str) -> ModelError:
    shown = text if len(text) <= 120 else text[:117] + "..."
    return ModelError(
        "unsafe_pt2",
        f"refusing .pt2 file: {what} {shown!r} is not a plain symbolic-shape expression ({why}); "
        "torch would evaluate it as Python code",
    )


def _parse_expression(text: object, what: str) -> ast.Expression:
    if not isinstance(text, str):
        raise ModelError("bad_pt2", f"malformed .pt2 file: {what} is not a string")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise _expr_error(what, text, f"longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise _expr_error(what, text, "not a valid expression") from None


def validate_sympy_expr(text: object, what: str = "expr_str") -> None:
    """Accept only what ``sympy.srepr`` writes for shape expressions; raise
    ``ModelError('unsafe_pt2')``.

    ``torch._export.serde.serialize`` hands these strings to ``sympy.sympify`` (i.e. ``eval``).
    Allowed: calls of an allowlisted sympy/torch-sympy class, numbers, a few named constants,
    unary/binary arithmetic, and string literals only as the name of ``Symbol(...)`` or the digits
    of ``Float(...)``.
    """
    tree = _parse_expression(text, what)
    assert isinstance(text, str)
    allowed_callables = _SYMPY_CALLABLES | _TORCH_SYMPY_FUNCTIONS

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in allowed_callables:
                raise _expr_error(what, text, f"calls {ast.unparse(node.func)!r}")
            for i, arg in enumerate(node.args):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    pattern = {"Symbol": _IDENTIFIER, "Float": _FLOAT_TEXT}.get(node.func.id)
                    if i != 0 or pattern is None or not pattern.fullmatch(arg.value):
                        raise _expr_error(what, text, f"unexpected string {arg.value!r}")
                else:
                    check(arg)
            for kw in node.keywords:
                if kw.arg is None or not re.fullmatch(r"[a-z][a-z_]*", kw.arg):
                    raise _expr_error(what, text, "unexpected keyword argument")
                if not (isinstance(kw.value, ast.Constant) and type(kw.value.value) in (bool, int)):
                    raise _expr_error(what, text, f"unexpected value for {kw.arg}=")
        elif isinstance(node, ast.Name):
            if node.id not in allowed_callables | _SYMPY_CONSTANTS:
                raise _expr_error(what, text, f"unknown name {node.id!r}")
        elif isinstance(node, ast.Constant):
            if type(node.value) not in (int, float, bool):
                raise _expr_error(what, text, f"unexpected literal {node.value!r}")
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY_OPS):
            check(node.operand)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, _ARITH_OPS):
            check(node.left)
            check(node.right)
        elif isinstance(node, ast.Tuple):
            for elt in node.elts:
                check(elt)
        else:
            raise _expr_error(what, text, f"contains a {type(node).__name__} node")

    check(tree.body)


def validate_guard_code(text: object, what: str = "guards_code entry") -> None:
    """Accept only shape-guard expressions like ``L['x'].size()[0] <= 64``; raise
    ``ModelError('unsafe_pt2')``.

    ``torch/export/_unlift.py:_convert_guards_code_to_fn`` pastes these strings into Python source
    and ``exec``\\ s it. Allowed: comparisons, boolean/arithmetic operators, numbers, quote-free
    identifier strings, subscripts by constants, ``.size()``-style tensor attributes, and a fixed
    set of ``math``, ``torch.sym_*`` and builtin numeric functions.
    """
    if isinstance(text, str) and any(c in text for c in '\n\r"\\'):
        raise _expr_error(what, text, "contains a newline, double quote or backslash")
    tree = _parse_expression(text, what)
    assert isinstance(text, str)

    def check(node: ast.AST) -> None:
        if isinstance(node, ast.Compare):
            check(node.left)
            for comparator in node.comparators:
                check(comparator)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                check(value)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, _ARITH_OPS):
            check(node.left)
            check(node.right)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, _UNARY_OPS):
            check(node.operand)
        elif isinstance(node, ast.Call):
            if node.keywords:
                raise _expr_error(what, text, "uses keyword arguments")
            if isinstance(node.func, ast.Name):
                if node.func.id not in _GUARD_NAMES - {"L", "math", "torch", "inf"}:
                    raise _expr_error(what, text, f"calls {node.func.id!r}")
            else:
                check(node.func)
            for arg in node.args:
                check(arg)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in _GUARD_MODULE_ATTRS:
                if node.attr not in _GUARD_MODULE_ATTRS[node.value.id]:
                    raise _expr_error(what, text, f"uses {node.value.id}.{node.attr}")
            elif node.attr in _GUARD_VALUE_ATTRS:
                check(node.value)
            else:
                raise _expr_error(what, text, f"uses attribute {node.attr!r}")
        elif isinstance(node, ast.Subscript):
            check(node.value)
            key = node.slice
            if isinstance(key, ast.UnaryOp) and isinstance(key.op, ast.USub):
                key = key.operand
            if not (
                isinstance(key, ast.Constant)
                and (
                    type(key.value) is int
                    or (isinstance(key.value, str) and _GUARD_STRING.fullmatch(key.value))
                )
            ):
                raise _expr_error(what, text, "subscript is not a constant")
        elif isinstance(node, ast.Name):
            if node.id not in _GUARD_NAMES:
                raise _expr_error(what, text, f"unknown name {node.id!r}")
        elif isinstance(node, ast.Constant):
            value = node.value
            if not (
                type(value) in (int, float, bool)
                or value is None
                or (isinstance(value, str) and _GUARD_STRING.fullmatch(value))
            ):
                raise _expr_error(what, text, f"unexpected literal {value!r}")
        else:
            raise _expr_error(what, text, f"contains a {type(node).__name__} node")

    check(tree.body)


def _validate_model_json(data: bytes, member: str) -> None:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ModelError("bad_pt2", f"malformed JSON in .pt2 member {member!r}: {exc}") from None
    if not isinstance(doc, dict):
        raise ModelError("bad_pt2", f"malformed .pt2 member {member!r}: expected a JSON object")
    guards = doc.get("guards_code") or []
    if not isinstance(guards, list):
        raise ModelError("bad_pt2", f"malformed .pt2 member {member!r}: guards_code is not a list")
    for guard in guards:
        validate_guard_code(guard, f"guards_code entry in {member}")
    pending: list[Any] = [doc]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr_str":
                    validate_sympy_expr(value, f"expr_str in {member}")
                elif isinstance(value, (dict, list)):
                    pending.append(value)
        elif isinstance(node, list):
            pending.extend(v for v in node if isinstance(v, (dict, list)))


# --------------------------------------------------------------------------------- archive scanning


@dataclass
class _Budget:
    bytes_left: int
    members_left: int
    max_bytes: int
    max_members: int


def _open_source(
    data: bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO,
) -> tuple[BinaryIO, str, bool]:
    if isinstance(data, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(data)), "<upload>", True
    if isinstance(data, (str, os.PathLike)):
        path = os.fspath(data)
        try:
            return open(path, "rb"), os.path.basename(path), True
        except OSError as exc:
            raise ModelError(
                "bad_pt2", f"cannot read .pt2 file {os.path.basename(path)!r}: {exc.strerror}"
            ) from None
    if hasattr(data, "read") and hasattr(data, "seek"):
        name = getattr(data, "name", None)
        return data, os.path.basename(name) if isinstance(name, str) else "<upload>", False
    raise TypeError(f"expected bytes, a path or a binary file object, got {type(data).__name__}")


def _looks_truncated(fh: BinaryIO) -> bool:
    """A plausible local file header at offset 0 but no central directory: the file was cut
    short."""
    fh.seek(0)
    header = fh.read(30)
    if len(header) < 30:
        return True
    _sig, _ver, _flags, method, _t, _d, _crc, _cs, _us, name_len, _xl = struct.unpack(
        "<4s5H3L2H", header
    )
    if method not in (0, 8) or not 0 < name_len <= 4096:
        return False
    name = fh.read(name_len)
    return len(name) == name_len and all(32 <= b < 127 or b >= 128 for b in name)


_END_RECORD = struct.Struct("<4s4H2LH")  # end of central directory record (22 bytes + comment)
_ZIP64_LOCATOR = struct.Struct("<4sLQL")  # zip64 end of central directory locator (20 bytes)
_ZIP64_END_RECORD = struct.Struct("<4sQ2H2L4Q")  # zip64 end of central directory record (56 bytes)
_MAX_COMMENT = 0xFFFF


def _central_directory_shift(fh: BinaryIO) -> int | None:
    """Bytes by which the central directory sits after where the end records place it.

    0 for a well-formed archive (torch writes zip64 end records even for small files); not 0 when
    data was prepended or inserted, or when a zip64 end record is not directly before its locator
    (CPython releases disagree on such "zip64 extensible data", so it is treated as a shift too).
    None when there is no end record (``zipfile`` reports that). Parsed from the bytes per the zip
    specification rather than through ``zipfile``'s private helpers, whose meaning changed in the
    CVE-2025-8291 fix (gh-139700) that Python 3.12/3.13 security releases carry.
    """
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    tail_start = max(0, size - _END_RECORD.size - _MAX_COMMENT)
    fh.seek(tail_start)
    tail = fh.read()
    # no archive comment (torch writes none), as zipfile tries first
    at = len(tail) - _END_RECORD.size
    if at < 0 or tail[at : at + 4] != _EMPTY_ZIP_MAGIC or tail[-2:] != b"\0\0":
        at = tail.rfind(_EMPTY_ZIP_MAGIC)
    if at < 0 or len(tail) - at < _END_RECORD.size:
        return None
    end_pos = tail_start + at
    *_, cd_size, cd_offset, _comment_len = _END_RECORD.unpack_from(tail, at)
    cd_end = end_pos
    locator_pos = end_pos - _ZIP64_LOCATOR.size
    if locator_pos >= 0:
        fh.seek(locator_pos)
        sig, _disk, zip64_pos, _disks = _ZIP64_LOCATOR.unpack(fh.read(_ZIP64_LOCATOR.size))
        if sig == b"PK\x06\x07":
            expected = locator_pos - _ZIP64_END_RECORD.size
            fh.seek(max(expected, 0))
            record = fh.read(_ZIP64_END_RECORD.size)
            if expected < 0 or zip64_pos != expected or record[:4] != b"PK\x06\x06":
                return zip64_pos - expected or -1
            *_, cd_size, cd_offset = _ZIP64_END_RECORD.unpack(record)
            cd_end = expected
    return cd_end - cd_size - cd_offset


def _check_central_directory_offset(fh: BinaryIO, label: str) -> None:
    """Reject archives whose end records misplace the central directory (data before/inside).

    Python's zipfile silently compensates for such a shift, torch's miniz reader does not; the two
    would then read different bytes for the same member.
    """
    if _central_directory_shift(fh) not in (0, None):
        raise ModelError(
            "bad_pt2",
            f"{label} is not a well-formed zip archive: its central directory offsets are "
            "inconsistent (extra data before or inside the archive)",
        )


def _open_zip(fh: BinaryIO, label: str) -> zipfile.ZipFile:
    fh.seek(0)
    magic = fh.read(4)
    if magic == _EMPTY_ZIP_MAGIC:
        raise ModelError(
            "bad_pt2", f"{label} is an empty zip archive, not a torch.export.save file"
        )
    if magic != _ZIP_MAGIC:
        raise ModelError(
            "bad_pt2",
            f"{label} is not a .pt2 file: it does not start with the zip signature "
            "(expected a file written by torch.export.save)",
        )
    _check_central_directory_offset(fh, label)  # before zipfile, whose reading varies by version
    fh.seek(0)
    try:
        zf = zipfile.ZipFile(fh, "r")
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        OSError,
        ValueError,
        struct.error,
    ) as exc:
        if _looks_truncated(fh):
            raise ModelError(
                "pt2_truncated",
                f"{label} is truncated: the zip archive ends before its central directory "
                "(incomplete upload or copy?); upload the complete file",
            ) from None
        raise ModelError(
            "bad_pt2",
            f"{label} is corrupt: it starts like a zip archive but cannot be read as one ({exc})",
        ) from None
    return zf


def _check_member_headers(
    zf: zipfile.ZipFile, label: str, budget: _Budget, outer: str
) -> list[zipfile.ZipInfo]:
    infos = zf.infolist()
    budget.members_left -= len(infos)
    if budget.members_left < 0:
        raise ModelError(
            "pt2_too_many_members",
            f"{label} has too many members ({len(infos)}; the limit is {budget.max_members} in "
            "total)",
        )
    seen_names: set[str] = set()
    total = 0
    for info in infos:
        name = info.filename
        shown = f"{outer}{name}"
        parts = name.split("/")
        if (
            not name
            or name.startswith(("/", "\\"))
            or re.match(r"[A-Za-z]:", name)
            or ".." in parts
            or "." in parts
            or not _MEMBER_NAME_OK.fullmatch(name)
        ):
            raise ModelError(
                "pt2_bad_member_name",
                f"{label} contains a member with an unsafe name {shown!r} "
                "(absolute path, '..', backslash or control character)",
            )
        if not name.isascii() and not info.flag_bits & 0x800:
            raise ModelError(
                "pt2_bad_member_name",
                f"{label}: member name {shown!r} is not ASCII and not marked UTF-8",
            )
        if name in seen_names:
            raise ModelError(
                "pt2_bad_member_name",
                f"{label} contains the member {shown!r} twice (ambiguous archive)",
            )
        seen_names.add(name)
        mode = info.external_attr >> 16
        if info.create_system == 3 and stat.S_ISLNK(mode):
            raise ModelError(
                "pt2_symlink", f"{label} contains a symbolic link {shown!r}; links are not allowed"
            )
        if info.flag_bits & 0x1:
            raise ModelError("bad_pt2", f"{label}: member {shown!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise ModelError(
                "bad_pt2",
                f"{label}: member {shown!r} uses zip compression method {info.compress_type}; "
                "only stored or deflated members are supported",
            )
        if info.file_size > budget.max_bytes:
            raise ModelError(
                "pt2_too_large",
                f"{label}: member {shown!r} would decompress to {info.file_size} bytes, over the "
                f"limit of {budget.max_bytes} bytes",
            )
        if info.file_size > ZIP_BOMB_MIN_BYTES and info.file_size > MAX_COMPRESSION_RATIO * max(
            info.compress_size, 1
        ):
            raise ModelError(
                "pt2_too_large",
                f"{label}: member {shown!r} expands "
                f"{info.file_size // max(info.compress_size, 1)}:1 ({info.compress_size} -> "
                f"{info.file_size} bytes); refusing a likely zip bomb",
            )
        total += info.file_size
    budget.bytes_left -= total
    if budget.bytes_left < 0:
        raise ModelError(
            "pt2_too_large",
            f"{label} would decompress to more than the limit of {budget.max_bytes} bytes in total "
            "(zip bomb or model too large)",
        )
    ordered = sorted(infos, key=lambda i: i.header_offset)
    for prev, cur in zip(ordered, ordered[1:]):
        if (
            cur.header_offset
            < prev.header_offset + 30 + len(prev.orig_filename.encode()) + prev.compress_size
        ):
            raise ModelError(
                "pt2_too_large",
                f"{label}: members {prev.filename!r} and {cur.filename!r} overlap (zip bomb "
                "construction)",
            )
    return infos


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # local file header (30 bytes, then name and extra)
_DATA_DESCRIPTOR_FLAG = 0x08
_ZIP64_SIZE = 0xFFFFFFFF


def _member_chunks(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str) -> Iterator[bytes]:
    """Yield a member's decompressed bytes, proving they are exactly what its headers declare.

    ``zipfile`` trusts the central directory's sizes and cuts the output there, so a member whose
    header understated its size (with a CRC of the cut data) read as valid while its data went on:
    hidden bytes for another zip reader, or a deflate stream expanding far past the limits. Here the
    local header must agree with the central directory (method, and CRC and sizes unless a data
    descriptor follows the data), a stored member's two sizes must be equal, and a deflate stream
    must end exactly at ``compress_size`` input bytes having produced exactly ``file_size`` bytes,
    with the CRC over all of them. Raises ``ModelError`` (``bad_pt2`` or ``pt2_too_large``).
    """
    fp = zf.fp
    if fp is None:
        raise ModelError(
            "bad_pt2", f"member {shown!r} of the .pt2 file cannot be read (archive closed)"
        )
    fp.seek(info.header_offset)
    header = fp.read(_LOCAL_HEADER.size)
    if len(header) < _LOCAL_HEADER.size:
        raise ModelError(
            "bad_pt2", f"member {shown!r} of the .pt2 file is corrupt (local header cut short)"
        )
    sig, _ver, flags, method, _t, _d, crc, csize, usize, name_len, extra_len = _LOCAL_HEADER.unpack(
        header
    )
    if sig != _ZIP_MAGIC or method != info.compress_type:
        raise ModelError(
            "bad_pt2",
            f"member {shown!r} of the .pt2 file is corrupt (local header disagrees with the "
            "directory)",
        )
    if not flags & _DATA_DESCRIPTOR_FLAG and (
        crc != info.CRC
        or (csize != _ZIP64_SIZE and csize != info.compress_size)
        or (usize != _ZIP64_SIZE and usize != info.file_size)
    ):
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r}: its local header and the central directory declare different sizes "
            "or checksums (a header that understates the member's size)",
        )
    if method == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r} is stored uncompressed but declares {info.compress_size} stored and "
            f"{info.file_size} unpacked bytes (a header that understates the member's size)",
        )
    encoding = "utf-8" if info.flag_bits & 0x800 else "cp437"
    if fp.read(name_len) != info.orig_filename.encode(encoding, "replace"):
        raise ModelError(
            "bad_pt2",
            f"member {shown!r} of the .pt2 file is corrupt (file name in directory and header "
            "differ)",
        )
    fp.seek(info.header_offset + _LOCAL_HEADER.size + name_len + extra_len)
    left = info.compress_size
    produced = 0
    checksum = 0
    decompressor = zlib.decompressobj(-15) if method == zipfile.ZIP_DEFLATED else None
    while left > 0:
        raw = fp.read(min(_CHUNK, left))
        if not raw:
            raise ModelError("bad_pt2", f"member {shown!r} of the .pt2 file is cut short")
        left -= len(raw)
        pending = raw
        while pending:
            if decompressor is None:
                chunk, pending = pending, b""
            else:
                if decompressor.eof:
                    raise ModelError(
                        "pt2_too_large",
                        f"member {shown!r}: its compressed data ends before its declared "
                        "compressed size",
                    )
                try:  # bounded: never more than one byte past what the header declares
                    chunk = decompressor.decompress(pending, info.file_size - produced + 1)
                except zlib.error as exc:
                    raise ModelError(
                        "bad_pt2", f"member {shown!r} of the .pt2 file is corrupt ({exc})"
                    ) from None
                pending = decompressor.unconsumed_tail
            produced += len(chunk)
            if produced > info.file_size:
                raise ModelError(
                    "pt2_too_large", f"member {shown!r} decompresses to more than its declared size"
                )
            checksum = zlib.crc32(chunk, checksum)
            if chunk:
                yield chunk
    if decompressor is not None and (not decompressor.eof or decompressor.unused_data):
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r}: its compressed data does not end where its header says "
            "(a header that understates the member's size)",
        )
    if produced != info.file_size:
        raise ModelError(
            "pt2_too_large",
            f"member {shown!r} decompresses to {produced} bytes, not its declared {info.file_size}",
        )
    if checksum != info.CRC:
        raise ModelError("bad_pt2", f"member {shown!r} of the .pt2 file is corrupt (bad CRC-32)")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str, keep: bool) -> bytes:
    """Decompress a member (exactly its declared size, CRC-checked); return it if ``keep``."""
    chunks: list[bytes] = []
    try:
        for chunk in _member_chunks(zf, info, shown):
            if keep:
                chunks.append(chunk)
    except ModelError:
        raise
    except (OSError, ValueError, EOFError, struct.error) as exc:
        raise ModelError(
            "bad_pt2", f"member {shown!r} of the .pt2 file is corrupt ({exc})"
        ) from None
    return b"".join(chunks)


def _load_json_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, shown: str) -> Any:
    data = _read_member(zf, info, shown, keep=True)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ModelError("bad_pt2", f"malformed JSON in .pt2 member {shown!r}: {exc}") from None


def _payload_members(config: Any, shown: str, directory: str) -> tuple[set[str], set[str]]:
    """(raw tensor members, members torch would unpickle) referenced by a weights/constants
    config."""
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        raise ModelError(
            "bad_pt2", f"malformed .pt2 member {shown!r}: expected {{'config': {{...}}}}"
        )
    raw: set[str] = set()
    pickled: set[str] = set()
    for fqn, meta in entries.items():
        path_name = meta.get("path_name") if isinstance(meta, dict) else None
        if (
            not isinstance(path_name, str)
            or not _SAFE_PATH_NAME.fullmatch(path_name)
            or path_name in (".", "..")
        ):
            raise ModelError(
                "pt2_bad_member_name",
                f"{shown}: entry {fqn!r} has an unsafe path_name {path_name!r}",
            )
        if directory == CONSTANTS_DIR and path_name.startswith(
            (CUSTOM_OBJ_FILENAME_PREFIX, OPAQUE_OBJ_FILENAME_PREFIX)
        ):
            kind = (
                "TorchScript/torchbind"
                if path_name.startswith(CUSTOM_OBJ_FILENAME_PREFIX)
                else "opaque Python"
            )
            raise _unsafe(
                directory + path_name,
                f"holds a {kind} object for constant {fqn!r}, which torch would unpickle without "
                "restrictions (only tensor constants are supported)",
            )
        (pickled if meta.get("use_pickle") is True else raw).add(directory + path_name)
    return raw, pickled


def _is_pickle_location(rel: str) -> bool:
    return rel.endswith((".pt", ".pth", ".pkl", ".pickle"))


def _scan_payload(
    data: bytes, shown: str, required: bool, budget: _Budget, depth: int, scans: list[PickleScan]
) -> str:
    """Scan a member torch might unpickle; return its kind."""
    if data[:4] == _ZIP_MAGIC:
        if depth > 0:
            raise ModelError("bad_pt2", f"member {shown!r} nests zip archives too deeply")
        _inspect_torch_save_zip(data, shown, budget, depth + 1, scans)
        return "torch_save_zip"
    if len(data) > 262 and data[257:262] == b"ustar":
        raise _unsafe(
            shown, "is a legacy tar-format torch.save file, whose inner pickles torch would load"
        )
    if required or _looks_like_pickle(data[:2]):
        scans.append(scan_pickle(data, member=shown, strict=required))
        return "pickle"
    return "other"


def _split_root(infos: list[zipfile.ZipInfo], label: str) -> tuple[str, dict[str, zipfile.ZipInfo]]:
    """torch's PyTorchFileReader resolves every record inside the first member's top folder: require
    all members to live there, and map names relative to it to their entries."""
    root = infos[0].filename.split("/", 1)[0]
    by_rel: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        head, sep, rel = info.filename.partition("/")
        if not sep or head != root:
            raise ModelError(
                "pt2_bad_member_name",
                f"{label}: member {info.filename!r} is not inside the archive folder "
                f"{root + '/'!r} like every member torch writes",
            )
        if rel:
            by_rel[rel] = info
    return root, by_rel


def _inspect_torch_save_zip(
    data: bytes, label: str, budget: _Budget, depth: int, scans: list[PickleScan]
) -> None:
    """A nested ``torch.save`` zip (e.g. the example inputs): scan its ``data.pkl``; refuse
    TorchScript."""
    zf = _open_zip(io.BytesIO(data), f"nested archive {label!r}")
    with zf:
        infos = _check_member_headers(zf, f"nested archive {label!r}", budget, f"{label}!")
        if not infos:
            raise ModelError("bad_pt2", f"nested archive {label!r} is empty")
        _split_root(infos, f"nested archive {label!r}")
        for info in infos:
            rel = info.filename.partition("/")[2]
            shown = f"{label}!{info.filename}"
            if rel == "constants.pkl" or rel.startswith("code/"):
                raise ModelError(
                    "unsafe_pt2",
                    f"refusing .pt2 file: {label!r} is a TorchScript archive ({info.filename}), "
                    "which torch.load would hand to torch.jit.load",
                )
            if info.is_dir():
                continue
            raw_storage = re.fullmatch(r"data/\d+", rel) is not None
            content = _read_member(zf, info, shown, keep=not raw_storage)
            if not raw_storage:
                _scan_payload(content, shown, rel.endswith(".pkl"), budget, depth, scans)


def _inspect_fileobj(
    fh: BinaryIO, label: str, max_uncompressed_bytes: int, max_members: int
) -> Pt2ArchiveReport:
    budget = _Budget(max_uncompressed_bytes, max_members, max_uncompressed_bytes, max_members)
    zf = _open_zip(fh, label)
    with zf:
        infos = _check_member_headers(zf, label, budget, "")
        if not infos:
            raise ModelError("bad_pt2", f"{label} is an empty zip archive")
        root, by_rel = _split_root(infos, label)

        fmt = by_rel.get(ARCHIVE_FORMAT_PATH)
        if (
            fmt is None
            or _read_member(zf, fmt, fmt.filename, keep=True).strip()
            != ARCHIVE_FORMAT_VALUE.encode()
        ):
            raise ModelError(
                "bad_pt2",
                f"{label} is a zip archive but not a torch.export.save .pt2 file "
                f"(missing {root}/{ARCHIVE_FORMAT_PATH} = 'pt2')",
            )
        for rel, info in by_rel.items():
            if rel.startswith((AOTINDUCTOR_DIR, EXECUTORCH_DIR)):
                raise ModelError(
                    "unsafe_pt2",
                    f"refusing .pt2 file: it contains compiled native code ({info.filename}); "
                    "torch would load the AOTInductor library from the archive. Upload the plain "
                    "torch.export.save output",
                )
            if rel.startswith(CONSTANTS_DIR) and rel[len(CONSTANTS_DIR) :].startswith(
                (CUSTOM_OBJ_FILENAME_PREFIX, OPAQUE_OBJ_FILENAME_PREFIX)
            ):
                raise _unsafe(
                    info.filename,
                    "is a non-tensor constant object, which torch would unpickle without "
                    "restrictions",
                )

        raw: set[str] = set()
        pickled: set[str] = set()
        json_members: set[str] = set()
        models: list[str] = []
        for rel, info in by_rel.items():
            config_dir = (
                WEIGHTS_DIR if re.fullmatch(r"data/weights/.+_weights_config\.json", rel)
                else CONSTANTS_DIR if re.fullmatch(r"data/constants/.+_constants_config\.json", rel)
                else None
            )  # fmt: skip
            if config_dir is not None:
                cfg_raw, cfg_pickled = _payload_members(
                    _load_json_member(zf, info, info.filename), info.filename, config_dir
                )
                raw |= cfg_raw
                pickled |= cfg_pickled
                json_members.add(rel)
            elif rel.startswith(MODELS_DIR) and not info.is_dir():
                # torch deserializes *every* member under models/ as a program (whatever its suffix)
                _validate_model_json(
                    _read_member(zf, info, info.filename, keep=True), info.filename
                )
                models.append(rel[len(MODELS_DIR) :].removesuffix(".json"))
                json_members.add(rel)
        raw -= pickled  # a member some entry says torch unpickles is scanned, whatever else it is

        scans: list[PickleScan] = []
        members: list[Pt2Member] = []
        for info in infos:
            rel = info.filename.partition("/")[2]
            if info.is_dir() or not rel:
                kind = "directory"
            elif rel in json_members:
                kind = "json"
            elif rel in raw:
                _read_member(zf, info, info.filename, keep=False)  # CRC/size check only
                kind = "raw_tensor"
            elif rel.startswith(SAMPLE_INPUTS_DIR) and rel not in pickled:
                _read_member(zf, info, info.filename, keep=False)  # never unpickled: see above
                kind = "sample_inputs"
            else:
                content = _read_member(zf, info, info.filename, keep=True)
                required = rel in pickled or _is_pickle_location(rel)
                kind = _scan_payload(content, info.filename, required, budget, 0, scans)
            members.append(Pt2Member(info.filename, info.file_size, info.compress_size, kind))

    return Pt2ArchiveReport(
        root=root,
        members=tuple(members),
        total_uncompressed_bytes=sum(m.uncompressed_bytes for m in members),
        total_compressed_bytes=sum(m.compressed_bytes for m in members),
        models=tuple(sorted(models)),
        pickles_scanned=tuple(s.member for s in scans),
        globals_seen=frozenset(g for s in scans for g in s.globals),
    )


def inspect_pt2_archive(
    data: bytes | bytearray | memoryview | str | os.PathLike[str] | BinaryIO,
    *,
    max_uncompressed_bytes: int,
    max_members: int,
    display_name: str | None = None,
) -> Pt2ArchiveReport:
    """Check an untrusted ``.pt2`` archive without importing or running anything from it.

    ``data`` is the file's bytes, its path, or a seekable binary file object (left open, position
    undefined afterwards); messages call it ``display_name`` (default: its file name). Nothing in
    the archive is unpickled, ``eval``\\ ed or imported; torch is not
    imported.

    Promises, when it returns: the file is a well-formed zip (no data before/inside it, no duplicate
    or overlapping members, only stored/deflated unencrypted members, CRCs valid) with at most
    ``max_members`` members (nested ``torch.save`` zips included) that decompress to at most
    ``max_uncompressed_bytes`` in total, all under one top folder, with safe relative names and no
    symlinks; it is a ``torch.export.save`` archive (``archive_format`` is ``pt2``) without
    AOTInductor / ExecuTorch payloads or non-tensor constants; every member torch could unpickle
    (``use_pickle`` payloads, ``*.pt``/``*.pkl``, anything that looks like a pickle, the
    ``data.pkl`` of nested ``torch.save`` zips; not the sample inputs, which TuneHub never lets
    torch read: kind ``sample_inputs``) references only :data:`ALLOWED_GLOBALS` with
    data-only opcodes; and every ``expr_str`` / ``guards_code`` string in ``models/*.json`` is a
    plain symbolic-shape expression.

    Raises :class:`~compiler.errors.ModelError` with code ``bad_pt2``, ``pt2_truncated``,
    ``pt2_too_large``, ``pt2_too_many_members``, ``pt2_bad_member_name``, ``pt2_symlink``,
    ``unsafe_pickle`` or ``unsafe_pt2`` (see the module docstring).
    """
    if max_uncompressed_bytes <= 0 or max_members <= 0:
        raise ValueError("max_uncompressed_bytes and max_members must be positive")
    fh, label, owned = _open_source(data)
    label = display_name or label
    try:
        return _inspect_fileobj(fh, f".pt2 file {label!r}", max_uncompressed_bytes, max_members)
    finally:
        if owned:
            fh.close()


# --------------------------------------------------------------------------------------- loading


_LOAD_LOCK = threading.Lock()


class _Refused(RuntimeError):
    """Raised by the hardened hooks when torch tries a code-executing loader."""


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise _Refused(f"TuneHub refused {what} while loading an untrusted .pt2 file")

    return refuse


class _RefusingPickleModule:
    """Stand-in for ``pickle`` inside ``torch.export.pt2_archive._package`` during a load."""

    load = staticmethod(_refuse("pickle.load"))
    loads = staticmethod(_refuse("pickle.loads"))

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


class _GuardedSympy:
    """Stand-in for ``sympy`` inside ``torch._export.serde.serialize``: validates sympify'd
    strings."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def sympify(self, a: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(a, str):
            validate_sympy_expr(a, "expr_str")
        return self._real.sympify(a, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _CaptureSwallowedError(logging.Filter):
    """torch.export.load logs load_pt2's RuntimeError and raises a vaguer one; keep the real
    cause."""

    def __init__(self) -> None:
        super().__init__()
        self.cause: BaseException | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.exc_info
            and record.exc_info[1] is not None
            and "deserializing" in str(record.msg)
        ):
            self.cause = record.exc_info[1]
            return False
        return True


@contextlib.contextmanager
def _hardened_torch_loading() -> Iterator[_CaptureSwallowedError]:
    """Patch torch so that a ``torch.export.load`` inside the block cannot reach an unsafe loader.

    Process-wide for the duration of the block (serialized by a lock): any ``torch.load`` call runs
    with ``weights_only=True``; ``pickle.load(s)`` in ``pt2_archive._package``,
    ``torch._C._pickle_load_obj``, ``torch.jit.load`` and AOTInductor loading raise; strings passed
    to ``sympy.sympify`` by the export deserializer are validated first.
    """
    import torch
    import torch._export.serde.serialize as serialize_mod
    import torch.export.pt2_archive._package as package_mod

    real_load = torch.load

    def weights_only_load(
        f: Any, map_location: Any = None, pickle_module: Any = None, **kwargs: Any
    ) -> Any:
        kwargs.pop("weights_only", None)
        mmap = kwargs.pop("mmap", None)
        return real_load(f, map_location=map_location, weights_only=True, mmap=mmap)

    import torch.utils._pytree as pytree

    real_read_bytes = package_mod.PT2ArchiveReader.read_bytes
    real_json_to_treespec = pytree._json_to_treespec  # noqa: SLF001

    def json_to_treespec(schema: Any) -> Any:
        name = schema.get("type") if isinstance(schema, dict) else None
        known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
        if not isinstance(name, str) or _torchs_own(known.get(name)):
            return real_json_to_treespec(schema)
        saved = known.get(name)
        known[name] = _stand_in(pytree, name)  # for this node only: see _StandIn
        try:
            return real_json_to_treespec(schema)
        finally:
            if saved is None:
                known.pop(name, None)
            else:
                known[name] = saved

    def treespec_loads(serialized: str) -> Any:
        protocol, schema = json.loads(serialized)
        if protocol != 1:
            raise _Refused(f"a pytree spec of protocol {str(protocol)[:20]!r}")
        return json_to_treespec(schema)

    def read_bytes(reader: Any, name: str) -> bytes:
        if name.startswith(SAMPLE_INPUTS_DIR):
            return b""  # never deserialized: the program's example_inputs are None
        return real_read_bytes(reader, name)

    patches: list[tuple[Any, str, Any]] = [
        (torch, "load", weights_only_load),
        (package_mod.PT2ArchiveReader, "read_bytes", read_bytes),
        (pytree, "_json_to_treespec", json_to_treespec),
        (serialize_mod, "treespec_loads", treespec_loads),
        (pytree, "enum_object_hook", _refuse_enum_reference),
        (package_mod, "pickle", _RefusingPickleModule()),
        (package_mod, "_load_aoti", _refuse("loading an AOTInductor library")),
        (torch._C, "_pickle_load_obj", _refuse("torch._C._pickle_load_obj")),  # noqa: SLF001
        (torch.jit, "load", _refuse("torch.jit.load")),
        (serialize_mod, "sympy", _GuardedSympy(serialize_mod.sympy)),
    ]
    # A name this torch does not have is a loader path it does not take (torch 2.11's _package
    # imports no pickle module); the archive scan before loading is the first line either way.
    patches = [(obj, attr, value) for obj, attr, value in patches if hasattr(obj, attr)]
    capture = _CaptureSwallowedError()
    export_logger = logging.getLogger("torch.export")
    with _LOAD_LOCK:
        saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
        try:
            for obj, attr, value in patches:
                setattr(obj, attr, value)
            export_logger.addFilter(capture)
            yield capture
        finally:
            export_logger.removeFilter(capture)
            for obj, attr, value in reversed(saved):
                setattr(obj, attr, value)


class _StandIn:
    """A pytree node of a type that is not Python's or torch's (e.g. ``transformers``'
    ``DynamicCache`` in a program's input or output spec): its children and its context, kept
    as the JSON it was saved with. The graph takes and returns flat tensors, which is what
    TuneHub compiles; the type's own code (which this process may not have, and which the file
    does not choose) is never used."""

    def __init__(self, children: list[Any], context: Any) -> None:
        self.children = list(children)
        self.context = context


_STAND_INS: dict[str, type] = {}


def _torchs_own(cls: Any) -> bool:
    """Whether ``cls`` (a registered pytree node type) is Python's or torch's own."""
    module = getattr(cls, "__module__", "") or ""
    return cls is not None and module.split(".")[0] in ("builtins", "collections", "torch")


def _stand_in(pytree: Any, name: str) -> type:
    """The :class:`_StandIn` subclass for the serialized type ``name``, registered as a pytree
    node (once) without taking the name over: a type of that name this process registers
    itself (``transformers``' ``DynamicCache``) keeps it. Its context is never parsed."""
    if not re.fullmatch(r"[A-Za-z_][\w.]{0,200}", name):
        raise _Refused(f"a pytree type named {name[:100]!r} in the program's signature")
    cls = _STAND_INS.get(name)
    if cls is not None:
        return cls
    cls = _STAND_INS[name] = type(f"StandIn[{name}]", (_StandIn,), {})
    saved = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name)
    pytree.register_pytree_node(
        cls,
        lambda node: (node.children, node.context),
        lambda children, context: cls(children, context),
        flatten_with_keys_fn=lambda node: (
            [(pytree.SequenceKey(i), child) for i, child in enumerate(node.children)],
            node.context,
        ),
        serialized_type_name=name,
        to_dumpable_context=lambda context: context,
        from_dumpable_context=lambda context: context,
    )
    if saved is None:
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.pop(name, None)
    else:
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = saved
    return cls


def _refuse_enum_reference(obj: dict[str, Any]) -> Any:
    """torch's JSON hook for pytree contexts imports the module an ``"__enum__"`` object names
    (``torch.utils._pytree.enum_object_hook``): a file must not choose what this process
    imports."""
    if "__enum__" in obj:
        raise _Refused(f"an enum reference to {str(obj.get('fqn'))[:100]!r} in a pytree context")
    return obj


def _describe_load_failure(exc: BaseException) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    lines = [line.strip() for line in text.splitlines() if line.strip()] or [type(exc).__name__]
    if isinstance(exc, _Refused):
        return f"refusing .pt2 file: {lines[0][:300]}"
    if isinstance(exc, pickle.UnpicklingError) or "weights only load failed" in text.lower():
        detail = next(
            (
                line
                for line in lines
                if re.search(r"WeightsUnpickler error:|GLOBAL|Unsupported|blocked", line)
            ),
            lines[0],
        )
        detail = detail.removeprefix("WeightsUnpickler error:").strip().split(". ")[0]
        return (
            "could not load the .pt2 file: PyTorch's weights-only unpickler refused one of its "
            f"pickled members ({detail[:300]})"
        )
    return (
        f"could not load the .pt2 file ({type(exc).__name__}: {lines[0][:300]}). TuneHub loads "
        "programs written by torch.export.save with PyTorch 2.13; re-export the model and upload "
        "the .pt2 file unchanged"
    )


_NODE_TARGET = re.compile(r"Failed deserializing node Node\(target='torch\.ops\.([\w.]+)'")


def _unknown_operator(exc: BaseException) -> str | None:
    """``ns.op.overload`` when torch failed to load a graph node calling an operator it does not
    know (one a library registers at import, like ``transformers::grouped_mm_fallback``)."""
    import torch

    match = _NODE_TARGET.search(str(exc))
    if match is None:
        return None
    name = match.group(1)
    namespace, _, rest = name.partition(".")
    try:
        packet = getattr(getattr(torch.ops, namespace), rest.partition(".")[0])
        getattr(packet, rest.partition(".")[2] or "default")
    except (AttributeError, RuntimeError):
        return name
    return None


def _check_loaded_program(ep: torch.export.ExportedProgram) -> None:
    """Defense in depth on the loaded graph: operator targets and guard code (run by
    ``ep.module()``)."""
    from torch._export.verifier import Verifier
    from torch._ops import HigherOrderOperator, OpOverload

    builtin_ops = Verifier().allowed_builtin_ops()
    for node in ep.graph.nodes:
        if node.op in ("call_module", "call_method"):
            raise ModelError(
                "unsafe_pt2", f"refusing .pt2 file: graph node {node.name} is a {node.op} node"
            )
        if node.op == "call_function" and not (
            isinstance(node.target, (OpOverload, HigherOrderOperator))
            or any(node.target is op for op in builtin_ops)
        ):
            raise ModelError(
                "unsafe_pt2",
                f"refusing .pt2 file: graph node {node.name} calls {node.target!r}, not an "
                "operator",
            )
    for guard in getattr(ep, "_guards_code", None) or []:
        validate_guard_code(guard)


def load_exported_program(
    path: str | os.PathLike[str],
    *,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    display_name: str | None = None,
) -> torch.export.ExportedProgram:
    """Load an untrusted single-program ``.pt2`` file as an ``ExportedProgram`` without executing
    code from it (:func:`load_exported_programs`; an archive of several programs is refused with
    ``bad_pt2``)."""
    programs = load_exported_programs(
        path,
        max_uncompressed_bytes=max_uncompressed_bytes,
        max_members=max_members,
        display_name=display_name,
    )
    if len(programs) != 1:
        display = display_name or os.path.basename(os.fspath(path))
        raise ModelError(
            "bad_pt2",
            f".pt2 file {display!r} holds {len(programs)} programs "
            f"({', '.join(programs)}); one was expected",
        )
    return next(iter(programs.values()))


def _program_names(fh: BinaryIO) -> tuple[str, ...]:
    """The programs (``<root>/models/<name>.json`` members) of the checked archive, by name."""
    fh.seek(0)
    with zipfile.ZipFile(fh) as archive:
        return tuple(
            sorted(
                rel[len(MODELS_DIR) :].removesuffix(".json")
                for rel in (name.partition("/")[2] for name in archive.namelist())
                if rel.startswith(MODELS_DIR) and not rel.endswith("/")
            )
        )


def _check_program_count(names: tuple[str, ...], max_programs: int, display: str) -> None:
    """Refuse (``ModelError("pt2_too_many_programs")``) an archive of more than
    ``max_programs`` programs, before any of them is loaded."""
    if len(names) > max_programs:
        raise ModelError(
            "pt2_too_many_programs",
            f".pt2 file {display!r} holds {len(names)} programs, over the limit of "
            f"{max_programs} programs per model (TUNEHUB_MAX_PT2_PROGRAMS)",
        )


def load_exported_programs(
    path: str | os.PathLike[str],
    *,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
    max_members: int = DEFAULT_MAX_MEMBERS,
    max_programs: int = DEFAULT_MAX_PROGRAMS,
    display_name: str | None = None,
) -> dict[str, torch.export.ExportedProgram]:
    """Load an untrusted ``.pt2`` file as its ``ExportedProgram`` s, by name, without executing
    code from it.

    An archive of ``torch.export.save`` holds one program (named ``model``); one written by
    ``torch.export.pt2_archive._package.package_pt2(f, exported_programs={...})`` holds one or
    several under any names (e.g. a decoder's ``prefill`` and ``decode``), returned in the
    archive's order. At most ``max_programs``: an archive with more is refused after the
    inspection, before anything is loaded.

    Opens the file once, runs :func:`inspect_pt2_archive` on it, then hands the same open file to
    ``torch.export.load`` (one program named ``model``) or ``load_pt2`` (any other: several, or one
    under another name, since ``torch.export.load`` reads only the one named ``model``) inside
    :func:`_hardened_torch_loading` (weights-only ``torch.load``; pickle, TorchScript,
    AOTInductor loaders disabled; sympify inputs validated), and finally checks that every graph
    node calls an operator and that the guard code is a plain expression.

    Raises :class:`~compiler.errors.ModelError`: the inspection's codes,
    ``pt2_too_many_programs``, or ``bad_pt2`` with a one-line, user-facing message if torch
    fails to load the checked file (the torch exception is chained as ``__cause__`` for server
    logs). Messages name the file ``display_name`` (default: the
    path's file name), so a caller loading a temp copy never shows its temp name.
    """
    display = display_name or os.path.basename(os.fspath(path))
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise ModelError("bad_pt2", f"cannot read .pt2 file {display!r}: {exc.strerror}") from None
    with fh:
        inspect_pt2_archive(
            fh,
            max_uncompressed_bytes=max_uncompressed_bytes,
            max_members=max_members,
            display_name=display,
        )
        names = _program_names(fh)
        _check_program_count(names, max_programs, display)
        plain = names == ("model",)  # what torch.export.save writes
        fh.seek(0)
        import torch
        from torch.export.pt2_archive._package import load_pt2

        with _hardened_torch_loading() as capture:
            try:
                programs = (
                    {"model": torch.export.load(fh)}
                    if plain
                    else dict(load_pt2(fh).exported_programs)
                )
            except ModelError:
                raise
            except Exception as exc:  # noqa: BLE001 - any torch failure is a bad_pt2 refusal
                cause = capture.cause or exc
                if isinstance(cause, ModelError):
                    raise cause from None
                unknown = _unknown_operator(cause)
                if unknown is not None:
                    raise ModelError(
                        "unsupported_ops",
                        f"torch.export model calls {unknown}, an operator PyTorch itself does "
                        "not define: a library registers it when it is imported, and TuneHub "
                        "runs no code from uploads. Export the model with PyTorch operators",
                    ) from cause
                raise ModelError("bad_pt2", _describe_load_failure(cause)) from cause
    if not programs:
        raise ModelError("bad_pt2", f".pt2 file {display!r} holds no program")
    for program in programs.values():
        _check_loaded_program(program)
    return programs
