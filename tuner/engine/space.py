"""The design space MetaSchedule searches, per target kind.

CPU targets use MetaSchedule's default (``"post-order-apply"``, rules from the target).

CUDA targets of compute capability 7.0 and newer use :func:`cuda_tensorcore_space`. MetaSchedule's
own default for them (``ScheduleRule.create("cuda-tensorcore")``) produced no runnable
tensor-core candidate with TVM 0.27 (8 of 96 trials of a 4096³ fp16 matmul were valid on an H200,
none of them on tensor cores):

- its WMMA rule stages the float32 accumulator tile in ``shared.dyn``; the builder merges all
  ``shared.dyn`` buffers into one float16 buffer and then fails in ``LowerAccessPtr``
  ("tvm_access_ptr element type must match the source buffer (float16 vs float32)"), for every
  candidate;
- its second rule (``mma_sync_m16n8k8``) never runs, because the WMMA rule has already rewritten
  the block; alone, most of its candidates fail in ``TransformMmaBufferLayout`` ("Permuted SLayout
  ... second dimension is not a multiple of 32");
- the ``ldmatrix`` + ``mma.sync.m16n8k16`` groups of ``get_mma_intrin_group`` are not handled by
  ``MultiLevelTilingTensorCore`` at all (it leaves the block untensorized).

The space here keeps the default's structure (``ApplyCustomRule``, one tensor-core tiling rule,
then MetaSchedule's plain CUDA rules for every block the tensor cores cannot take) with the WMMA
intrinsic groups, operands staged in ``shared.dyn`` and the accumulator tile in static
``shared`` memory, which lowers and compiles (checked with nvcc for sm_90a), with the tensor-core
postprocessors and mutators. ``VerifyGPUCode`` still bounds shared memory by the target's
``max_shared_memory_per_block``.
"""

from __future__ import annotations

from typing import Any

from tvm.s_tir import meta_schedule as ms

#: (input dtype, accumulator dtype) pairs that get tensor-core schedules.
TENSORCORE_DTYPES: tuple[tuple[str, str], ...] = (("float16", "float32"), ("float16", "float16"))


def wmma_intrin_groups() -> list[dict[str, str]]:
    """WMMA intrinsic groups of :data:`TENSORCORE_DTYPES` (B row- or column-major): operands
    from ``shared.dyn``, accumulator stored to static ``shared``. Needs the CUDA tensor
    intrinsics registered (:func:`compiler.lowering.intrinsics.load_tensor_intrinsics`)."""
    from tvm.s_tir.tensor_intrin.cuda import get_wmma_intrin_group  # noqa: PLC0415 - CUDA only (slow import)

    return [
        get_wmma_intrin_group("shared.dyn", "shared", in_dtype, out_dtype, trans_b)
        for in_dtype, out_dtype in TENSORCORE_DTYPES
        for trans_b in (False, True)
    ]


def cuda_tensorcore_space() -> ms.space_generator.PostOrderApply:
    """Tensor-core design space for CUDA targets (see the module docstring)."""
    rules = ms.schedule_rule
    tensorcore = rules.MultiLevelTilingTensorCore(
        intrin_groups=wmma_intrin_groups(),
        structure="SSSRRSRS",
        tile_binds=["blockIdx.y", "blockIdx.x", "threadIdx.y"],
        max_innermost_factor=4,
        vector_load_lens=[1, 2, 3, 4, 8, 16],
        reuse_read=rules.ReuseType(req="must", levels=[4], scope="shared.dyn"),
        reuse_write=rules.ReuseType(req="must", levels=[2], scope="shared"),
        use_software_pipeline=False,
    )
    plain_cuda = list(rules.ScheduleRule.create("cuda"))[1:]  # all but ApplyCustomRule
    return ms.space_generator.PostOrderApply(
        sch_rules=[rules.ApplyCustomRule(), tensorcore, *plain_cuda],
        postprocs="cuda-tensorcore",
        mutator_probs="cuda-tensorcore",
    )


def _compute_capability(target: Any) -> tuple[int, int]:
    arch = str(target.attrs.get("arch", "")) if target is not None else ""
    digits = "".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit())
    if len(digits) < 2:
        return (0, 0)
    return int(digits[:-1]), int(digits[-1])


def design_space(target_kind: str, target: Any = None) -> Any:
    """The space generator for a target: :func:`cuda_tensorcore_space` for CUDA GPUs of compute
    capability 7.0 or newer (tensor cores), MetaSchedule's plain CUDA rules for older GPUs, its
    default for CPUs."""
    if target_kind == "cuda":
        if _compute_capability(target) >= (7, 0):
            return cuda_tensorcore_space()
        return ms.space_generator.PostOrderApply(
            sch_rules="cuda", postprocs="cuda", mutator_probs="cuda"
        )
    return "post-order-apply"
