"""The bytes a tuning task must write at the least: the memory bound of
:mod:`tuner.jobs.plausibility`.

Every kernel writes its outputs at least once, whatever its schedule, so the bytes of the
buffers its function writes bound its time from below (at a memory-bandwidth ceiling). This
module reads them off the workload's TIR (TVM is imported here, not by the rule itself):

- an *output* is a parameter of the function that a ``BufferStore`` writes (directly, or through
  a block's ``match_buffer`` of it);
- it counts the elements its stores reach for sure, at most the whole buffer: the product of the
  extents of the loops whose variables its indices name plainly (``v``, or ``v`` plus or minus a
  constant or a scalar parameter; each loop once, whichever block variables follow it), so an
  in-place update of a slice of a large buffer (a KV-cache append) counts the slice, not the
  buffer; a store under an ``if``, a ``while``, a block predicate or a strided loop counts
  nothing, and a function that can leave a loop early (``break``, ``continue``, ``return``)
  counts nothing at all; a symbolic extent counts as 1;
- bytes are elements x bits x lanes / 8 of the stored buffer's type, at most the parameter's.

A lower bound, never more than what any correct schedule writes: anything it cannot read plainly
counts less, not more.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

import tvm
from tvm import tirx
from tvm.s_tir import SBlock, SBlockRealize

logger = logging.getLogger("tunehub.plausibility")


def _key(obj: Any) -> int:
    """An identity key of a TVM object (``==`` on TIR variables builds an expression)."""
    return obj.__chandle__()


def _int(expr: Any) -> int | None:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def _bits(buffer: Any) -> int:
    dtype = tvm.runtime.DataType(str(buffer.dtype))
    return int(dtype.bits) * int(dtype.lanes)


def _elements(buffer: Any) -> int:
    """The elements of ``buffer``, a symbolic dimension counted as 1."""
    return math.prod(max(0, _int(d)) if _int(d) is not None else 1 for d in buffer.shape)


#: Loop and block variables in scope, by identity key: ``(the key of the loop the variable
#: follows, how many values it takes for sure)``. Two block variables bound to one loop follow
#: that loop, so a diagonal ``B[v, w]`` with ``v`` and ``w`` both bound to ``i`` counts once.
Scope = dict[int, tuple[int, int]]


def _plain_var(index: Any, scope: Scope) -> Any | None:
    """The loop or block variable (in ``scope``) an index names plainly: ``v``, ``v`` plus or
    minus something that is no such variable (a constant, a scalar parameter), or a cast of
    one; else ``None``."""
    while isinstance(index, tirx.Cast):
        index = index.value
    if isinstance(index, tirx.Var):
        return index if _key(index) in scope else None
    if isinstance(index, tirx.Add | tirx.Sub):
        var = _plain_var(index.a, scope)
        if var is not None and _invariant(index.b, scope):
            return var
        if isinstance(index, tirx.Add) and _invariant(index.a, scope):
            return _plain_var(index.b, scope)
    return None


def _invariant(expr: Any, scope: Scope) -> bool:
    """Whether ``expr`` is a constant or a variable that no loop or block in scope binds."""
    while isinstance(expr, tirx.Cast):
        expr = expr.value
    if isinstance(expr, tirx.IntImm):
        return True
    return isinstance(expr, tirx.Var) and _key(expr) not in scope


class _Writes:
    """Walks one PrimFunc; ``bytes``: what it writes for sure, per output parameter (by
    identity key)."""

    def __init__(self, params: Iterable[Any]) -> None:
        self.params = {_key(p): p for p in params}
        self.aliases: dict[int, int] = {}  # a match_buffer's key -> its parameter's key
        self.bytes: dict[int, int] = {}
        self.escapes = False  # a break, continue or return: no loop surely runs its course

    def visit(self, node: Any, scope: Scope, *, sure: bool = True) -> None:  # noqa: C901, PLR0912 - one branch a node kind
        """Walk ``node``; its stores count when ``sure`` (no condition above them)."""
        if node is None:
            return
        if isinstance(node, tirx.SeqStmt):
            for item in node.seq:
                self.visit(item, scope, sure=sure)
        elif isinstance(node, tirx.For):
            if node.step is not None and _int(node.step) != 1:
                sure = False  # a strided loop: how many elements it reaches is not plain
            extent = _int(node.extent)
            key = _key(node.loop_var)
            extent = 1 if extent is None else max(0, extent)
            self.visit(node.body, {**scope, key: (key, extent)}, sure=sure)
        elif isinstance(node, SBlockRealize):
            if _int(node.predicate) != 1:
                sure = False  # a predicated block may skip any instance
            inner = dict(scope)
            for iv, value in zip(node.block.iter_vars, node.iter_values):
                # bound plainly to a loop: that loop's values (at most its own domain's);
                # bound to anything else: one value for sure
                bound = _plain_var(value, scope)
                own = _int(iv.dom.extent)
                if bound is None or own is None:
                    inner[_key(iv.var)] = (_key(iv.var), 1)
                else:
                    origin, extent = scope[_key(bound)]
                    inner[_key(iv.var)] = (origin, min(extent, own))
            self.visit(node.block, inner, sure=sure)
        elif isinstance(node, SBlock):
            for match in node.match_buffers or ():
                source = _key(match.source.buffer)
                source = self.aliases.get(source, source)
                if source in self.params:
                    self.aliases[_key(match.buffer)] = source
            self.visit(node.init, scope, sure=sure)
            self.visit(node.body, scope, sure=sure)
        elif isinstance(node, tirx.BufferStore):
            if sure:
                self._store(node, scope)
        elif isinstance(node, tirx.AttrStmt):
            self.visit(node.body, scope, sure=sure)
        elif isinstance(node, tirx.IfThenElse):
            self.visit(node.then_case, scope, sure=False)
            self.visit(node.else_case, scope, sure=False)
        elif isinstance(node, tirx.While):
            self.visit(node.body, scope, sure=False)
        elif isinstance(node, tirx.Break | tirx.Continue | tirx.Return):
            self.escapes = True
        # other leaves (Evaluate, AllocBuffer, DeclBuffer, Bind, AssertStmt) store nothing

    def _store(self, store: Any, scope: Scope) -> None:
        key = _key(store.buffer)
        param = key if key in self.params else self.aliases.get(key)
        if param is None:
            return
        reached: dict[int, int] = {}  # by the loop each plainly named variable follows
        for index in store.indices:
            var = _plain_var(index, scope)
            if var is not None:
                origin, extent = scope[_key(var)]
                reached[origin] = min(extent, reached.get(origin, extent))
        elements = min(math.prod(reached.values()), _elements(store.buffer))
        written = min(elements * _bits(store.buffer) // 8, self._capacity(param))
        self.bytes[param] = max(self.bytes.get(param, 0), written)

    def _capacity(self, param: int) -> int:
        buffer = self.params[param]
        return _elements(buffer) * _bits(buffer) // 8


def function_output_bytes(func: tirx.PrimFunc) -> int:
    """The bytes ``func`` writes into its parameters at the least (see the module docstring):
    the sum over its output parameters. 0 for a function that writes none plainly."""
    writes = _Writes(p for p in func.params if hasattr(p, "shape"))
    writes.visit(func.body, {})
    return 0 if writes.escapes else sum(writes.bytes.values())


def output_bytes(mod: tvm.IRModule) -> int:
    """The bytes one call of workload ``mod`` writes at the least: its ``main`` PrimFunc's (or,
    without one, the least of its PrimFuncs'), by :func:`function_output_bytes`. 0 when it has
    no PrimFunc. Raises what TVM raises for a malformed module."""
    funcs = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
    if not funcs:
        return 0
    if "main" in funcs:
        return function_output_bytes(funcs["main"])
    return min(function_output_bytes(f) for f in funcs.values())


_CACHE: dict[tuple[int, int], int | None] = {}
_CACHE_SIZE = 256


def workload_output_bytes(
    workload_id: int, mod_json: str, *, module: Callable[[], tvm.IRModule] | None = None
) -> int | None:
    """:func:`output_bytes` of a stored workload, computed once per process (keyed on its id and
    its module text). ``module``: returns the module already loaded (else it is loaded from
    ``mod_json``). ``None`` (logged, and remembered) when the module cannot be read: the memory
    bound is then unknown. Never raises."""
    key = (workload_id, hash(mod_json))
    if key in _CACHE:
        return _CACHE[key]
    try:
        mod = module() if module is not None else tvm.ir.load_json(mod_json)
        found: int | None = output_bytes(mod)
    except Exception as err:  # noqa: BLE001 - an unreadable module only loses this bound
        logger.warning("workload %s: its output bytes are unknown (%s)", workload_id, err)
        found = None
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()
    _CACHE[key] = found
    return found
