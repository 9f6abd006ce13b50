"""Weights the library holds in their 8- or 4-bit format (no float32 copy at run time).

A decoder compiled with ``--weights q8_0`` (``q4_0``) has float32 weights whose values lie on
the format's grid (:mod:`compiler.weights.weight_formats`), and its GEMMs call the shim's ``q8``
(``q4``) peer, which makes the weight's copy in the format on its first call and keeps it in the
shim's weight cache. Without this pass the library then holds each weight twice: its float32
constant (4 bytes a weight, the whole model's size again) and the copy (1.06 or 0.56 bytes).

:func:`hold_weights` runs on the scheduled module, after the peers are applied. For every
``call_tir`` of a PrimFunc whose peer call is ``q8`` or ``q4`` over an unbatched weight, where
the weight argument is a constant on the format's grid, it:

- holds the constant in the format: the bytes of the shim's own cached layout, written by the
  shim's own quantizer (``tunehub_peer_hold_weight``), so the layout cannot drift from the
  kernel that reads it; the check is the shim's exact one (every weight ``q * scale``);
- calls a copy of the PrimFunc (``<name>_held``) whose weight parameter is those bytes and whose
  call is the ``_held`` entry point (``tunehub_peer_gemm_q8_held``), which reads them as they
  are: no cache entry, no first-call transform.

A float32 constant that no other call reads is then gone from the module, and with it from
``params.bin`` and from the process that loads the library. Calls whose weight is not a constant
or not on the grid are left as they were (their peer computes them as before); so is every
other call. The results are the same numbers: the held bytes are what the cache would hold.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import ir, relax, s_tir, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from compiler.peers.calls import Q4_FUNCTION, Q8_FUNCTION
from compiler.peers.library import peer_library
from compiler.peers.patterns import _stages
from compiler.peers.rewrite import _checked, _region, root_realize

#: The format code ``tunehub_peer_hold_weight`` takes and the entry point that reads the held
#: bytes, by the peer call's entry point.
HELD_FUNCTIONS = {
    Q8_FUNCTION: (8, "tunehub_peer_gemm_q8_held"),
    Q4_FUNCTION: (4, "tunehub_peer_gemm_q4_held"),
}
#: The suffix of a held PrimFunc's name.
HELD_SUFFIX = "_held"


@dataclass(frozen=True)
class HeldCall:
    """A PrimFunc's peer call that can read a held weight: the format code, the entry point
    that reads it, the weight's parameter index (among the PrimFunc's parameters, which start
    with ``call_tir``'s arguments) and the GEMM's ``k``, ``n`` and ``trans_b``."""

    format: int
    function: str
    weight_param: int
    k: int
    n: int
    trans_b: bool


def _peer_block(func: tirx.PrimFunc) -> tuple[Any, list[Any], int] | None:
    """``func``'s root block, its stages and the index of the stage that calls the peer (the
    ``tunehub_peer`` block :func:`compiler.peers.rewrite.peer_function` writes), or ``None``."""
    found = _stages(func)
    if found is None:
        return None
    root, stages = found
    index = next((i for i, s in enumerate(stages) if s.block.name_hint == "tunehub_peer"), None)
    return None if index is None else (root, stages, index)


def _extern_call(block: Any) -> Any:
    """The ``call_extern`` of a CPU peer block (its body asserts the call's status is 0)."""
    body = block.body
    if not isinstance(body, tirx.AssertStmt):
        return None
    call = getattr(body.condition, "a", None)
    extern = ir.Op.get("tirx.call_extern")
    return call if isinstance(call, ir.Call) and call.op.same_as(extern) else None


def _buffer_of(pointer: Any) -> Any:
    """The buffer whose data ``pointer`` (a call argument, ``tirx.buffer_data(buffer)``) is, or
    ``None``. (A PrimFunc's parameters are its buffers.)"""
    if isinstance(pointer, ir.Call) and pointer.op.same_as(ir.Op.get("tirx.buffer_data")):
        return pointer.args[0]
    return None


def held_call(func: tirx.PrimFunc) -> HeldCall | None:
    """The :class:`HeldCall` of a peer PrimFunc that calls ``q8``'s or ``q4``'s entry point over
    an unbatched weight parameter; ``None`` for any other function."""
    found = _peer_block(func)
    call = None if found is None else _extern_call(found[1][found[2]].block)
    if call is None or str(call.args[0].value) not in HELD_FUNCTIONS:
        return None
    args = call.args  # name, A, B, C, batch, M, N, K, trans_b, b_batched, epilogue...
    if int(args[9]) != 0:
        return None
    buffer = _buffer_of(args[2])
    weight = next((i for i, p in enumerate(func.params) if p.same_as(buffer)), None)
    if weight is None:
        return None
    fmt, function = HELD_FUNCTIONS[str(args[0].value)]
    return HeldCall(fmt, function, weight, int(args[7]), int(args[6]), bool(int(args[8])))


def held_function(func: tirx.PrimFunc, call: HeldCall, nbytes: int, name: str) -> tirx.PrimFunc:
    """``func`` (a function :func:`held_call` describes as ``call``) taking its weight as
    ``nbytes`` held bytes (``int8``) and calling ``call.function`` on them, its
    ``global_symbol`` ``name``."""
    root, stages, index = _peer_block(func)  # type: ignore[misc]
    block = stages[index].block
    old = func.params[call.weight_param]
    new = tirx.decl_buffer((tirx.IntImm("int64", nbytes),), "int8", name=f"{old.name}{HELD_SUFFIX}")
    args = [new.data if old.same_as(_buffer_of(a)) else a for a in _extern_call(block).args[1:]]
    extern = s_tir.SBlock(
        block.iter_vars,
        [_region(new) if r.source.same_as(old) else r for r in block.reads],
        block.writes,
        block.name_hint,
        _checked(tirx.call_extern("int32", call.function, *args), call.function, "cpu"),
        block.init,
        block.alloc_buffers,
        block.match_buffers,
        block.annotations,
    )
    body = [s.stmt for s in stages]
    body[index] = s_tir.SBlockRealize([], True, extern)
    params = [new if p.same_as(old) else p for p in func.params]
    out = tirx.PrimFunc(params, root_realize(root, body), func.ret_type, func.attrs)
    return out.with_attr("global_symbol", name)


@functools.cache
def _shim() -> ctypes.CDLL | None:
    library = peer_library()
    if library is None:
        return None
    shim = ctypes.CDLL(str(library.shared))
    shim.tunehub_peer_held_bytes.restype = ctypes.c_int64
    shim.tunehub_peer_held_bytes.argtypes = [ctypes.c_int32, ctypes.c_int64, ctypes.c_int64]
    shim.tunehub_peer_hold_weight.restype = ctypes.c_int32
    shim.tunehub_peer_hold_weight.argtypes = [
        ctypes.c_int32,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int32,
        ctypes.c_void_p,
    ]
    return shim


def hold_weight(weight: np.ndarray, call: HeldCall) -> np.ndarray | None:
    """``weight`` (float32, ``[k, n]``, or ``[n, k]`` with ``trans_b``) held in ``call``'s
    format: the shim's bytes as ``int8``; ``None`` when it is off the format's grid, has
    another shape, or this machine has no peer library."""
    shim = _shim()
    expected = (call.n, call.k) if call.trans_b else (call.k, call.n)
    if shim is None or weight.dtype != np.float32 or weight.shape != expected:
        return None
    nbytes = shim.tunehub_peer_held_bytes(call.format, call.k, call.n)
    if nbytes <= 0:
        return None
    weight = np.ascontiguousarray(weight)
    out = np.empty(nbytes, dtype=np.int8)
    on_grid = shim.tunehub_peer_hold_weight(
        call.format, weight.ctypes.data, call.k, call.n, int(call.trans_b), out.ctypes.data
    )
    return out if on_grid else None


@mutator
class _HoldWeights(PyExprMutator):
    """Redirects the calls of :func:`hold_weights` (see the module docstring)."""

    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        #: PrimFunc name -> (its HeldCall, its held copy's GlobalVar), filled by hold_weights.
        self.calls: dict[str, tuple[HeldCall, Any]] = {}
        self.held: dict[Any, Any] = {}  # float32 constant -> held constant (None: off the grid)
        self.used: set[str] = set()

    def visit_call_(self, op: relax.Call) -> relax.Expr:
        call = super().visit_call_(op)
        if not (isinstance(call, relax.Call) and call.op.same_as(ir.Op.get("relax.call_tir"))):
            return call
        callee, args = call.args[0], call.args[1]
        entry = self.calls.get(callee.name_hint)
        if entry is None or not isinstance(args, relax.Tuple):
            return call
        held_call, held_gvar = entry
        weight = args.fields[held_call.weight_param]
        if not isinstance(weight, tvm.ir.expr.GenericConst):
            return call
        if weight not in self.held:
            held = hold_weight(weight.value.numpy(), held_call)
            self.held[weight] = None if held is None else relax.const(held)
        held = self.held[weight]
        if held is None:
            return call
        self.used.add(callee.name_hint)
        fields = list(args.fields)
        fields[held_call.weight_param] = held
        return relax.Call(
            call.op, [held_gvar, relax.Tuple(fields), *call.args[2:]], call.attrs, call.ty_args
        )


def hold_weights(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (a scheduled CPU module, peers applied) with the constant weights of its ``q8``
    and ``q4`` peer calls held in their format (see the module docstring); ``mod`` itself when
    it has none or this machine has no peer library."""
    shim = _shim()
    if shim is None:
        return mod
    found = {
        gvar: call
        for gvar, func in mod.functions.items()
        if isinstance(func, tirx.PrimFunc) and (call := held_call(func)) is not None
    }
    if not found:
        return mod
    mutator_ = _HoldWeights(mod)
    builder = mutator_.builder_
    for gvar, call in found.items():
        nbytes = shim.tunehub_peer_held_bytes(call.format, call.k, call.n)
        if nbytes > 0:
            name = f"{gvar.name_hint}{HELD_SUFFIX}"
            held = held_function(mod[gvar], call, nbytes, name)
            mutator_.calls[gvar.name_hint] = (call, builder.add_func(held, name))
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            builder.update_func(gvar, mutator_.visit_expr(func))
    if not mutator_.used:
        return mod
    # The functions no call reads any more: the held copies not used, the originals all used.
    return relax.transform.DeadCodeElimination()(builder.get())
