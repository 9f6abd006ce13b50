"""Validating the strings of a program's JSON that torch would run as Python: ``expr_str``
(handed to ``sympy.sympify``, i.e. ``eval``) and ``guards_code`` (pasted into source and
``exec``\\ d): each must be a plain symbolic-shape expression over an allowlist of names."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from compiler.errors import ModelError
from compiler.frontends.pt2_safety.constants import MAX_EXPRESSION_CHARS

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
