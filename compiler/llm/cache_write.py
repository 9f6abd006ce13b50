"""The in-place write of new rows into a state tensor (a decoder's KV cache).

A state buffer's update, ``index_put(cache, [None, .., positions, .., None], new)``
(:mod:`compiler.llm.state`), is translated to ``R.call_tir_inplace`` of
:func:`index_put_inplace`: a kernel that stores only ``new``'s rows, at ``positions`` along the
cache's axis, into the cache tensor the function was given, and returns that same tensor. The
attention that follows reads it. No copy of the cache is made: a decode step's cost has no term
in the cache's size but the attention's own reads. A position outside ``[0, capacity)`` is not
written (the kernel guards every store; the generation driver refuses such a call before it is
made, :mod:`compiler.llm.generate`).

The kernel's name contains ``index``: the partition leaves it untuned, like every indexing task
(its random measurement inputs would be positions, :mod:`compiler.partition`).
"""

from __future__ import annotations

import functools
from typing import Any

import tvm
from tvm import relax

#: The kernel's name in the module (and its tasks').
KERNEL = "index_put_inplace"


@functools.lru_cache(maxsize=64)
def index_put_inplace(rank: int, axis: int, dtype: str, index_dtype: str) -> tvm.tirx.PrimFunc:
    """A PrimFunc ``(state, positions, new)`` that stores ``new`` (``state``'s shape with
    ``positions``' length at ``axis``) into ``state`` at ``positions`` along ``axis``, in place,
    skipping positions outside ``state``. Shapes are symbolic: one kernel serves every size."""
    dims = [f"d{i}" for i in range(rank)]
    loops = [f"i{i}" for i in range(rank)]
    values_shape = [("n" if i == axis else d) for i, d in enumerate(dims)]
    state_at = ", ".join(f"index[v{axis}]" if i == axis else f"v{i}" for i in range(rank))
    values_at = ", ".join(f"v{i}" for i in range(rank))
    written = ", ".join(f"0:{d}" if i == axis else f"v{i}" for i, d in enumerate(dims))
    extents = ", ".join(values_shape)
    source = f"""
@T.prim_func(private=True)
def {KERNEL}(var_state: T.handle, var_index: T.handle, var_values: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    {", ".join(dims)}, n = {", ".join(["T.int64()"] * (rank + 1))}
    state = T.match_buffer(var_state, ({", ".join(dims)},), "{dtype}")
    index = T.match_buffer(var_index, (n,), "{index_dtype}")
    values = T.match_buffer(var_values, ({extents},), "{dtype}")
    with T.sblock("root"):
        for {", ".join(loops)} in T.grid({extents}):
            with T.sblock("write"):
                {", ".join(f"v{i}" for i in range(rank))} = T.axis.remap("{"S" * rank}", [{", ".join(loops)}])
                T.reads(index[v{axis}], values[{values_at}])
                T.writes(state[{written}])
                if index[v{axis}] >= T.{index_dtype}(0) and T.Cast("int64", index[v{axis}]) < {dims[axis]}:
                    state[{state_at}] = values[{values_at}]
"""  # noqa: E501 - generated TVMScript
    return tvm.script.from_source(source, check_well_formed=False)


def convert_state_write(node: Any, importer: Any) -> relax.Expr:
    """The converter of an ``aten.index_put`` node that writes a state tensor (see the module
    docstring): ``R.call_tir_inplace`` of :func:`index_put_inplace` on the state, the positions
    and the new rows (cast to the state's dtype)."""
    state = importer.env[node.args[0]]
    indices = node.args[1]
    axis = next(i for i, index in enumerate(indices) if index is not None)
    positions = importer.env[indices[axis]]
    values = importer.env[node.args[2]]
    state_type = state.ty
    dtype = str(state_type.dtype)
    builder = importer.block_builder
    if str(values.ty.dtype) != dtype:
        values = builder.emit(relax.op.astype(values, dtype))
    rows = list(state_type.shape)
    rows[axis] = positions.ty.shape[0]
    if list(values.ty.shape) != rows:  # index_put broadcasts its values
        values = builder.emit(relax.op.broadcast_to(values, rows))
    kernel = index_put_inplace(int(state_type.ndim), axis, dtype, str(positions.ty.dtype))
    gvar = builder.add_func(kernel, KERNEL)
    return builder.emit(
        relax.call_tir_inplace(gvar, [state, positions, values], [0], state_type),
        name_hint="state_written",
    )
