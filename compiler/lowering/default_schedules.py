"""TVM's default schedules for CPU tasks that have neither a tuned record nor a library peer.

Without them such a task is TVM's naive lowering: one thread, no vectors (a softmax or layer
norm of BERT then costs more than its GEMMs). :func:`apply_default_schedules` runs DLight's CPU
rules (``GEMV``, ``Reduction``) and, for whatever they do not take, :class:`CpuFallback`:
DLight's GPU ``Fallback`` rule translated to a CPU (inline what can be inlined, fuse each
remaining block's spatial loops into one parallel loop; an injective block's fused loop is split
for an 8-lane vector; a reduction block whose innermost spatial axis is contiguous in its output
and every input that varies along it, e.g. an NHWC depthwise convolution's channels, keeps that
axis innermost, under its reduction loops, and vectorizes it). Functions already scheduled
(``tirx.is_scheduled``: by ``MetaScheduleApplyDatabase`` or a library peer) are left alone. This
is a fallback, not tuning: no search, no measurement.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule
from tvm.target import Target

from compiler.peers.patterns import buffer_loads

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
            lanes = (
                spatial[-1]
                if reduce and not other and len(spatial) > 1 and _contiguous_innermost(sch, info)
                else None
            )
            if lanes is not None:
                spatial = spatial[:-1]
                sch.reorder(*spatial, *reduce, lanes)
                _vectorize(sch, lanes)
            else:
                sch.reorder(*spatial, *reduce, *other)
            fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
            extent = sch.get(fused).extent
            if (
                not reduce
                and not other
                and isinstance(extent, tirx.IntImm)
                and int(extent) % VECTOR_LANES == 0
                and int(extent) > VECTOR_LANES
            ):
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


def _contiguous_innermost(sch: s_tir.Schedule, info: object) -> bool:
    """Whether the block's last spatial iterator is the last index of its output and of every
    load that depends on it (so a vector along it reads and writes contiguous memory)."""
    kinds = info.dom_kind()  # type: ignore[attr-defined]
    last = max(i for i, kind in enumerate(kinds) if kind == "S")
    var = info.iters[last].var  # type: ignore[attr-defined]
    extent = info.iters[last].dom  # type: ignore[attr-defined]
    if not isinstance(extent, int | tirx.IntImm) or int(extent) % VECTOR_LANES:
        return False
    block = sch.get(info.block_rv)  # type: ignore[attr-defined]
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not _is_var(store.indices[-1], var):
        return False
    if store.buffer.dtype == "bfloat16":
        # TVM 0.27's CPU bfloat16 legalization rewrites the buffer to uint16 storage but keeps
        # a vectorized reduction's bfloat16x8 store ("dtype mismatch on BufferStore"): such a
        # block (a bfloat16 attention matmul) stays scalar.
        return False
    for load in buffer_loads(store.value):
        if load.source.same_as(store.buffer):
            continue
        uses = [_mentions(index, var) for index in load.indices]
        if any(uses[:-1]) or (uses and uses[-1] and not _is_var(load.indices[-1], var)):
            return False
    return True


def _is_var(expr: object, var: object) -> bool:
    return isinstance(expr, tvm.ir.Var) and expr.same_as(var)


def _mentions(expr: object, var: object) -> bool:
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _vectorize(sch: s_tir.Schedule, loop: object) -> None:
    extent = int(sch.get(loop).extent)
    if extent > VECTOR_LANES:
        loop = sch.split(loop, [None, VECTOR_LANES])[1]
    sch.vectorize(loop)


class ConvolutionFallback(CpuFallback):
    """:class:`CpuFallback` for convolutions only (the tasks left to it are the depthwise ones),
    ahead of DLight's ``Reduction``, which parallelizes a convolution element by element and
    recomputes its padding per tap (measured: MobileNetV2's default-scheduled tasks 44.6 ms with
    it, 38.2 without, on a loaded 2-core Zen 3; BERT's softmax is faster with it)."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not any("conv" in n for n in _block_names(func)):
            return None
        return super().apply(func, target, tunable)


class FewRowsReduction(CpuFallback):
    """:class:`CpuFallback` for a reduction over few rows whose result is broadcast back over
    the row (a decode step's RMSNorm or layer norm: one row of 896; its softmax over a few
    heads), ahead of DLight's ``Reduction``. With fewer rows than :data:`FEW_ROWS`, DLight
    parallelizes the row's *elements* and computes the row's reduction again under each of them:
    quadratic in the row (measured: a Qwen2.5-0.5B decode step's 49 RMSNorms took 19.9 of its
    157 ms). Many rows (a prefill, BERT's softmax) keep DLight's rule, faster there."""

    def apply(self, func: tirx.PrimFunc, target: Target, tunable: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not _broadcast_reduction(func):
            return None
        return super().apply(func, target, tunable)


class RowSoftmax(CPUScheduleRule):
    """A softmax over the last axis (TOPI's blocks ``T_softmax_maxelem``, the exponential,
    ``T_softmax_expsum``, ``T_softmax_norm``), with element-wise steps before or after it (a
    scale, a mask, the ``where(isnan(..))`` of an exported attention) inlined, ahead of DLight's
    ``Reduction``: one parallel loop over rows; in each row the maximum and the sum reduce into
    :func:`softmax_lanes` partial results (``rfactor``) with a vector loop, the exponential is
    computed once into a row-sized buffer with a vector loop, and the output is a vector loop.
    DLight's rule reduces each row one element at a time and vectorizes with a tail predicate; a
    Whisper encoder's softmax over 6 x 1,500 x 1,500 scores took 19-26 ms with it, 9-13 ms with
    this rule (2 cores). Rows shorter than :data:`SOFTMAX_MIN_ROW` or whose length has no
    vector-sized divisor keep DLight's rule, and so does a function whose other steps cannot be
    inlined."""

    def apply(self, func: tirx.PrimFunc, target: Target, _: bool) -> s_tir.Schedule | None:
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        names = set(_block_names(func))
        exponent = "T_fast_exp" if "T_fast_exp" in names else "T_softmax_exp"
        if not {"T_softmax_maxelem", exponent, "T_softmax_expsum", "T_softmax_norm"} <= names:
            return None
        try:
            return _row_softmax(func, exponent)
        except (s_tir.ScheduleError, ValueError):
            return None


#: The shortest softmax row :class:`RowSoftmax` takes. Measured on 2 Zen 3 cores, 6 x L rows of L
#: with a NaN guard, rule / DLight ms: L=64 (GPT-2) 0.096 / 0.035, 128 (DistilBERT) 0.344 / 0.275,
#: 256 1.09 / 0.83, 512 3.12 / 3.54, 1024 12.7 / 13.9, 1500 (Whisper) 8.7 / 19.1 (4 x 1500 rows).
SOFTMAX_MIN_ROW = 512


def softmax_lanes(length: int) -> int | None:
    """The vector width of a softmax row of ``length``: its largest divisor in 4..16 that is a
    multiple of 4, or ``None``."""
    return next((d for d in (16, 12, 8, 4) if length % d == 0), None)


def _row_softmax(func: tirx.PrimFunc, exponent: str) -> s_tir.Schedule | None:
    """:class:`RowSoftmax`'s schedule; raises ``ScheduleError`` where a step does not fit."""
    sch = s_tir.Schedule(func)
    kept = {"T_softmax_maxelem", "T_softmax_expsum", exponent}
    *inner_blocks, output = sch.get_child_blocks(sch.get_sblock("root"))
    for block in inner_blocks:  # the normalization too, when an element-wise step follows it
        if sch.get(block).name_hint not in kept:
            sch.compute_inline(block)
    loops = sch.get_loops(output)
    extent = sch.get(loops[-1]).extent
    long_rows = isinstance(extent, tirx.IntImm) and int(extent) >= SOFTMAX_MIN_ROW
    lanes = softmax_lanes(int(extent)) if long_rows else None
    if lanes is None or len(loops) < 2:
        return None
    partial = {}
    for name in ("T_softmax_maxelem", "T_softmax_expsum"):
        inner = sch.split(sch.get_loops(sch.get_sblock(name))[-1], [None, lanes])[1]
        partial[name] = sch.rfactor(inner, 0)
    row = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(row)
    sch.vectorize(sch.split(loops[-1], [None, lanes])[1])
    for name in ("T_softmax_expsum", "T_softmax_maxelem"):
        sch.compute_at(sch.get_sblock(name), row)
        sch.compute_at(partial[name], row)
        if name == "T_softmax_expsum":
            sch.compute_at(sch.get_sblock(exponent), row)
            last = sch.get_loops(sch.get_sblock(exponent))[-1]
            sch.vectorize(sch.split(last, [None, lanes])[1])
        rf_loops = sch.get_loops(partial[name])
        sch.reorder(rf_loops[-1], rf_loops[-2])
        sch.vectorize(sch.get_loops(partial[name])[-1])
    return sch


#: Rows below which a broadcast reduction takes :class:`FewRowsReduction`.
FEW_ROWS = 64


def _broadcast_reduction(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` reduces to fewer than :data:`FEW_ROWS` values and then computes more
    outputs than that from them (a norm or a softmax over few rows)."""
    reduced: list[int] = []
    outputs: list[int] = []

    def visit(block: s_tir.SBlock) -> None:
        writes = [w.source for w in block.writes]
        if not writes or block.name_hint == "root":
            return
        size = _elements(writes[0].shape)
        if size is None:
            return
        has_reduce = any(int(iv.iter_type) == tirx.IterVar.CommReduce for iv in block.iter_vars)
        (reduced if has_reduce else outputs).append(size)

    tvm_ffi.structural_walk(func.body, [(s_tir.SBlock, visit)], order="post")
    return (
        bool(reduced) and max(reduced) < FEW_ROWS and bool(outputs) and max(outputs) > max(reduced)
    )


def _elements(shape: object) -> int | None:
    size = 1
    for dim in shape:  # type: ignore[attr-defined]
        if not isinstance(dim, tirx.IntImm):
            return None
        size *= int(dim)
    return size


def _block_names(func: tirx.PrimFunc) -> list[str]:
    names: list[str] = []
    tvm_ffi.structural_walk(
        func.body, [(s_tir.SBlock, lambda b: names.append(str(b.name_hint)))], order="post"
    )
    return names


def apply_default_schedules(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """``mod`` with every unscheduled PrimFunc given a default CPU schedule (module docstring).
    A function no rule can schedule is left as it is (TVM's naive lowering)."""
    with target:  # on a copy: the pass may update a module it holds the only reference to
        return dl.ApplyDefaultSchedule(
            dl.cpu.GEMV(),
            ConvolutionFallback(),
            FewRowsReduction(),
            RowSoftmax(),
            dl.cpu.Reduction(),
            CpuFallback(),
        )(mod.clone())


def gpu_default_rules() -> list[object]:
    """DLight's GPU rules in the order ``ms.relax_integration.compile_relax`` applies them to
    the tasks a CUDA build has no record for
    (:func:`compiler.lowering.pipeline.build_with_database`), after TuneHub's split reduction for
    decode attention's P·V (:class:`compiler.lowering.gpu_split_reduction.SplitReduction`). Its q·Kᵀ
    stays with DLight's matmul rule: a warp-per-cache-row rule measured slower (4.4 against 3.8 µs
    on an H100, ``bench/results/gpu_decode_kernels_2026-12-06_h100.md``)."""
    from compiler.lowering.gpu_split_reduction import SplitReduction  # noqa: PLC0415 - GPU builds only

    return [
        SplitReduction(),
        dl.gpu.Matmul(),
        dl.gpu.GEMV(),
        dl.gpu.Reduction(),
        dl.gpu.GeneralReduction(),
        dl.gpu.Fallback(),
    ]


def default_task_module(task_mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule | None:
    """A task module (``extracted.dispatched[0]``, one PrimFunc ``main``) with its default
    schedule (what a build gives the task when it has no record and no peer: on a CPU target
    :func:`apply_default_schedules`, on a GPU :func:`gpu_default_rules`), as a module
    MetaSchedule's builder and runner take; ``None`` when no rule schedules it (a CPU build
    would use TVM's naive lowering)."""
    if target.kind.name == "cuda":
        with target:  # on a copy, as apply_default_schedules
            scheduled = dl.ApplyDefaultSchedule(*gpu_default_rules())(task_mod.clone())
    else:
        scheduled = apply_default_schedules(task_mod, target)
    func = scheduled["main"]
    if not func.attrs or not func.attrs.get("tirx.is_scheduled", False):
        return None
    return scheduled
