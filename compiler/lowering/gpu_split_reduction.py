"""A CUDA default schedule for small batched products with a long reduction: decode attention.

In a decode step, attention's probabilities times the values is, per key-value head, a product of
a few query rows (the query heads that share the head) by the cache: ``out[h, g, d] = Σ_k
P[h, g, k] · V[h, k, d]``, ``k`` running over the whole cache. DLight's matmul rule tiles it like
a GEMM: two or three thread blocks, each reducing over the cache alone, 48 µs a layer on the H200
for a 1,152-position cache (``bench/results/gpu_llm_2026-12-04.md``).

:class:`SplitReduction` schedules such a block (one reduction block, spatial iterators then one
reduction iterator of at least :data:`MIN_REDUCTION`, the innermost spatial extent between
:data:`MIN_INNER` and 1,024, the rest at most :data:`MAX_BLOCKS`): one thread block per outer
spatial index and slice of the innermost spatial axis (sliced when the outer indices alone give
fewer than :data:`MIN_GRID` blocks: a decode step of Qwen2.5-0.5B has 14, and 14 busy SMs read
the cache at 7 µs a layer on an H100), ``threadIdx.x`` along that slice (contiguous in ``V``:
coalesced reads), ``threadIdx.y`` over contiguous slices of the reduction, summed across threads
by TVM's cross-thread reduction. Anything else is left to the next rule.
"""

from __future__ import annotations

import math

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.target import Target

#: The shortest reduction worth splitting across threads.
MIN_REDUCTION = 256
#: The narrowest innermost spatial axis it schedules (a warp's worth of coalesced reads).
MIN_INNER = 32
#: The most outer spatial indices (thread blocks, each reading all of ``V``): a decode step's
#: heads times query rows up to batch 8; a prefill chunk's many rows are a GEMM (matmul rule).
MAX_BLOCKS = 128
#: Threads per block.
THREADS = 512
#: The thread blocks worth having (an H100/H200 has 132 SMs): with fewer outer indices, the
#: columns are split across blocks too, down to :data:`MIN_TILE` a block (16 bf16 values: one
#: 32-byte memory sector of each row of ``V``).
MIN_GRID, MIN_TILE = 96, 16


class SplitReduction(GPUScheduleRule):
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
        if len(kinds) < 2 or kinds[-1] != "R" or any(kind != "S" for kind in kinds[:-1]):
            return None
        block = infos[0].block_rv
        *spatial, reduction = sch.get_loops(block)
        extents = [sch.get(loop).extent for loop in (*spatial, reduction)]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            return None
        *outer_extents, inner_extent, reduction_extent = (int(e) for e in extents)
        if (
            reduction_extent < MIN_REDUCTION
            or not MIN_INNER <= inner_extent <= 1024
            or math.prod(outer_extents) > MAX_BLOCKS
        ):
            return None
        tile = inner_tile(math.prod(outer_extents), inner_extent)
        splits = max(1, min(THREADS // tile, reduction_extent // 32))
        outer = sch.fuse(*spatial[:-1]) if len(spatial) > 1 else sch.add_unit_loop(block)
        column_block, column = sch.split(spatial[-1], [None, tile])
        thread_y, _ = sch.split(reduction, [splits, None])
        sch.reorder(outer, column_block, column, thread_y)
        sch.bind(sch.fuse(outer, column_block), "blockIdx.x")
        sch.bind(column, "threadIdx.x")
        sch.bind(thread_y, "threadIdx.y")
        return sch


def inner_tile(outer: int, inner: int) -> int:
    """The columns (innermost spatial indices) a thread block takes: all of them while the
    outer indices alone give :data:`MIN_GRID` blocks, else the largest power-of-two share of at
    least :data:`MIN_TILE` that does (more blocks, each reading a narrower slice of ``V``)."""
    tile = inner
    while outer * (inner // tile) < MIN_GRID and tile // 2 >= MIN_TILE and tile % 2 == 0:
        tile //= 2
    return tile
