"""TVM's default schedules for CPU tasks that have neither a tuned record nor a library peer.

Without them such a task is TVM's naive lowering: one thread, no vectors (a softmax or layer norm
of BERT then costs more than its GEMMs). :func:`apply_default_schedules` runs DLight's CPU rules
(``GEMV``, ``Reduction``) and, for whatever they do not take, :class:`CpuFallback`: DLight's GPU
``Fallback`` rule translated to a CPU (inline what can be inlined, fuse each remaining block's
spatial loops into one parallel loop; an injective block's fused loop is split for an 8-lane
vector). Functions already scheduled (``tirx.is_scheduled``: by ``MetaScheduleApplyDatabase`` or a
library peer) are left alone. This is a fallback, not tuning: no search, no measurement.
"""
from __future__ import annotations

import tvm
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target

VECTOR_LANES = 8


class CpuFallback(CPUScheduleRule):
    """Inline, then one parallel (and, when injective, vectorized) loop per remaining block."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        infos = try_inline(sch, infos)
        reductions = []
        for info in infos:
            block = info.block_rv
            spatial, reduce, other = [], [], []
            for loop, kind in zip(sch.get_loops(block), info.dom_kind()):
                {"S": spatial, "R": reduce, "O": other}[kind].append(loop)
            if not spatial:
                continue
            sch.reorder(*spatial, *reduce, *other)
            fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
            extent = sch.get(fused).extent
            if not reduce and not other and isinstance(extent, tirx.IntImm) \
                    and int(extent) % VECTOR_LANES == 0 and int(extent) > VECTOR_LANES:
                outer, inner = sch.split(fused, [None, VECTOR_LANES])
                sch.parallel(outer)
                sch.vectorize(inner)
            else:
                sch.parallel(fused)
            if reduce:
                reductions.append((block, reduce[0]))
        for block, loop in reductions:
            sch.decompose_reduction(block, loop)
        return sch


def apply_default_schedules(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` with every unscheduled PrimFunc given a default CPU schedule (module docstring).
    A function no rule can schedule is left as it is (TVM's naive lowering)."""
    with target:  # on a copy: the pass may update a module it holds the only reference to
        return dl.ApplyDefaultSchedule(dl.cpu.GEMV(), dl.cpu.Reduction(), CpuFallback())(
            mod.clone())
