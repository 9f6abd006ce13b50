"""The design space MetaSchedule searches, per target kind.

CPU targets use MetaSchedule's default (``"post-order-apply"``, rules from the target).

CUDA targets use :func:`cuda_tensorcore_space`. MetaSchedule's own CUDA default for ``sm_75`` and
newer (``ScheduleRule.create("cuda-tensorcore")``) puts a WMMA rule first, and with TVM 0.27 every
candidate it produces fails in the builder: the WMMA store of the float32 accumulator goes through
``tvm_access_ptr`` on the merged ``shared.dyn`` buffer, whose element type is float16
(``LowerAccessPtr``: "tvm_access_ptr element type must match the source buffer (float16 vs
float32)"). Its second rule (``mma_*_m16n8k8``) never gets a chance (the WMMA rule already
rewrote the block), and alone it fails too (``TransformMmaBufferLayout``: "Permuted SLayout ...
second dimension is not a multiple of 32"). A 4096³ fp16 matmul therefore gave 8 valid
measurements out of 96 trials on an H200, and the tensor cores were never used.

The space here keeps the default's structure (``ApplyCustomRule``, one tensor-core tiling rule,
then the plain CUDA rules for every block the tensor cores cannot take) but uses the
``ldmatrix`` + ``mma.sync.m16n8k16`` intrinsic groups of :func:`get_mma_intrin_group` with
``shared.dyn`` staging and software pipelining, with the tensor-core postprocessors and mutators.
Blocks that do not match a tensor-core group (float32 matmuls, convolutions in float32,
elementwise) get the same schedules as MetaSchedule's plain ``"cuda"`` rules.
"""
from __future__ import annotations

from typing import Any

from tvm.s_tir import meta_schedule as ms

#: (input dtype, accumulator dtype) pairs that get tensor-core schedules.
TENSORCORE_DTYPES: tuple[tuple[str, str], ...] = (("float16", "float32"), ("float16", "float16"))


def mma_intrin_groups() -> list[dict[str, str]]:
    """The ``ldmatrix``/``mma.sync`` intrinsic groups of :data:`TENSORCORE_DTYPES`, with B
    stored row- or column-major (needs the CUDA tensor intrinsics registered)."""
    from tvm.s_tir.tensor_intrin.cuda import get_mma_intrin_group

    return [
        get_mma_intrin_group("shared.dyn", "shared.dyn", in_dtype, out_dtype, False, trans_b)
        for in_dtype, out_dtype in TENSORCORE_DTYPES
        for trans_b in (False, True)
    ]


def cuda_tensorcore_space() -> ms.space_generator.PostOrderApply:
    """Tensor-core design space for CUDA targets of compute capability 8.0 and newer."""
    rules = ms.schedule_rule
    tensorcore = rules.MultiLevelTilingTensorCore(
        intrin_groups=mma_intrin_groups(),
        structure="SSSRRSRS",
        tile_binds=["blockIdx.y", "blockIdx.x", "threadIdx.y"],
        max_innermost_factor=4,
        vector_load_lens=[1, 2, 3, 4, 8, 16],
        reuse_read=rules.ReuseType(req="must", levels=[4], scope="shared.dyn"),
        reuse_write=rules.ReuseType(req="must", levels=[2], scope="shared.dyn"),
        use_software_pipeline=True,
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
    capability 8.0 or newer (``ldmatrix`` + ``mma.sync.m16n8k16``), MetaSchedule's plain CUDA
    rules for older GPUs (its WMMA default fails, see above), its default for CPUs."""
    if target_kind == "cuda":
        if _compute_capability(target) >= (8, 0):
            return cuda_tensorcore_space()
        return ms.space_generator.PostOrderApply(
            sch_rules="cuda", postprocs="cuda", mutator_probs="cuda"
        )
    return "post-order-apply"
