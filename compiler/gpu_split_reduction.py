"""A CUDA default schedule for small batched products with a long reduction: decode attention.

In a decode step, attention's probabilities times the values is, per key-value head, a product of
a few query rows (the query heads that share the head) by the cache: ``out[h, g, d] = Σ_k
P[h, g, k] · V[h, k, d]``, ``k`` running over the whole cache. DLight's matmul rule tiles it like
a GEMM: two or three thread blocks, each reducing over the cache alone, 48 µs a layer on the H200
for a 1,152-position cache (``bench/results/gpu_llm_2026-12-04.md``).

:class:`SplitReduction` schedules such a block (one reduction block, spatial iterators then one
reduction iterator of at least :data:`MIN_REDUCTION`, the innermost spatial extent between
:data:`MIN_INNER` and 1,024, the rest at most :data:`MAX_BLOCKS`): one thread block per outer
spatial index, ``threadIdx.x`` along the innermost spatial axis (contiguous in ``V``: coalesced
reads), ``threadIdx.y`` over contiguous slices of the reduction, summed across threads by TVM's
cross-thread reduction. Anything else is left to the next rule.
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
        splits = max(1, min(THREADS // inner_extent, reduction_extent // 32))
        outer = sch.fuse(*spatial[:-1]) if len(spatial) > 1 else sch.add_unit_loop(block)
        thread_y, _ = sch.split(reduction, [splits, None])
        sch.bind(outer, "blockIdx.x")
        sch.bind(spatial[-1], "threadIdx.x")
        sch.bind(thread_y, "threadIdx.y")
        return sch
