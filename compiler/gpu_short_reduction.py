"""A CUDA default schedule for many short dot products against a few vectors: decode's q·Kᵀ.

In a decode step, attention's scores are, per key-value head, the cache's keys times the few
query rows that share the head: ``out[h, n, i] = Σ_d K[h, n, d] · q[h, d, i]``, ``n`` over the
whole cache, ``d`` the head dimension (64 or 128), ``i`` the query heads of the group (a handful).
DLight's matmul rule tiles it like a GEMM whose ``i`` side is padded to its tile: 9.1 µs a layer
on the H200 for a 1,152-position cache (``bench/results/gpu_llm_2026-12-04_gemv_4l.md``).

:class:`ShortReduction` schedules such a block (one reduction block, spatial iterators then one
reduction iterator of :data:`MIN_REDUCTION` to :data:`MAX_REDUCTION`, the innermost spatial
extent at most :data:`MAX_COLUMNS`, the other spatial iterators at least :data:`MIN_ROWS` in all,
and the first operand read along the reduction contiguously): a warp per row ``n``, its lanes
along ``d`` (each lane a contiguous slice, so a warp reads the row in one coalesced sweep), the
few ``i`` in a serial loop around a warp-level reduction, :data:`ROWS_PER_BLOCK` rows a block.
Anything else is left to the next rule.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

#: The reduction extents it takes (a head dimension; longer ones go to the split reduction).
MIN_REDUCTION, MAX_REDUCTION = 32, 256
#: The most columns (query rows of a group, times a small batch) a row is dotted with.
MAX_COLUMNS = 16
#: The fewest rows (cache positions times heads) for which a warp per row pays.
MIN_ROWS = 256
#: Lanes along the reduction, and rows (warps) per thread block.
LANES, ROWS_PER_BLOCK = 32, 8


def _reads_along(block: s_tir.SBlock, loop_var: tirx.Var) -> bool:
    """Whether the block's first read indexes its innermost axis by ``loop_var`` alone."""
    if not block.reads:
        return False
    last = block.reads[0].region[-1]
    return isinstance(last.min, tirx.Var) and last.min.same_as(loop_var)


class ShortReduction(GPUScheduleRule):
    """See the module docstring."""

    def apply(
        self, func: tirx.PrimFunc, target: Target, _: bool
    ) -> None | s_tir.Schedule | list[s_tir.Schedule]:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None or len(infos) != 1 or not infos[0].is_reduction():
            return None
        kinds = [it.kind for it in infos[0].iters]
        if len(kinds) < 3 or kinds[-1] != "R" or any(kind != "S" for kind in kinds[:-1]):
            return None
        block = infos[0].block_rv
        *spatial, reduction = sch.get_loops(block)
        extents = [sch.get(loop).extent for loop in (*spatial, reduction)]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            return None
        *row_extents, columns, reduction_extent = (int(e) for e in extents)
        if (
            not MIN_REDUCTION <= reduction_extent <= MAX_REDUCTION
            or reduction_extent % LANES
            or columns > MAX_COLUMNS
            or math.prod(row_extents) < MIN_ROWS
        ):
            return None
        sblock = sch.get(block)
        if not _reads_along(sblock, sblock.iter_vars[-1].var):
            return None
        rows = sch.fuse(*spatial[:-1])
        block_x, thread_y = sch.split(rows, [None, ROWS_PER_BLOCK])
        lanes, _ = sch.split(reduction, [LANES, None])
        sch.reorder(block_x, thread_y, spatial[-1], lanes)
        sch.bind(block_x, "blockIdx.x")
        sch.bind(thread_y, "threadIdx.y")
        sch.bind(lanes, "threadIdx.x")
        return sch
