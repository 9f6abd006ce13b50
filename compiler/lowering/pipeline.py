"""The target-dependent lowering that tuning and the final build share.

Tuning tasks are keyed by the structural hash of the fused PrimFuncs, so the module tuning
extracts tasks from and the module the final build applies the database to must come from one
pass sequence; this module is that sequence. For a :class:`TargetSpec` and a normalized Relax
module (:func:`compiler.frontends.importer.import_model`):

1. :func:`for_target` — before legalization, a decoder's attention kept on the CPU shim or
   expanded into matrix products (:func:`compiler.llm.attention.expand_attention`), the target's
   :class:`~compiler.compile_options.CompileOptions` layout
   (:func:`compiler.lowering.conv_layout.to_nhwc`), then fast math
   (:func:`compiler.lowering.fast_math.fast_math`), then, with 8- or 4-bit weights, embedding tables
   gathered from their codes (:mod:`compiler.weights.quantized_gather`). The order of the first two
   matters: fast math turns ``sigmoid``, ``exp``, ``erf``… into ``call_tir`` s, which
   ``ConvertLayout`` cannot see through, so a convolution followed by a sigmoid kept a transpose
   between them and the sigmoid was a task of its own;
2. :func:`fuse` — library dispatch, LegalizeOps, AnnotateTIROpPattern, FoldConstant, FuseOps,
   FuseTIR (STACK.md: the frontend's module yields 0 tasks without them);
3. with prepacking, :func:`compiler.lowering.prepack.mark_layout_free`.

:func:`fused_for_target` is 1–3 (what :func:`compiler.partition.partition` extracts tasks from).
:func:`lower_with_database` applies 1–3, the library peers chosen for some tasks
(:func:`compiler.peers.apply_peers`, by workload key), then ``MetaScheduleApplyDatabase``, then
the 8- and 4-bit peers' weights held in their format
(:func:`compiler.peers.held_weights.hold_weights`), then (prepacking)
:func:`compiler.lowering.prepack.fold_prepacked_weights`; :func:`build_with_database` lowers that
with TVM's own dataflow-lowering and finalize passes: ``ms.relax_integration.compile_relax`` with
steps 1, 3 and the fold added.
CPU targets stored before the options existed are built by ``compile_relax`` itself (after fast
math), unchanged. CUDA builds run ``compile_relax``'s own steps (fuse as tuning did, the database,
DLight for the rest) with the library peers applied after fusion (:func:`_cuda_build`), and capture
their kernel launches into CUDA graphs (:func:`cuda_graphs_enabled`: TVM's ``RewriteCUDAGraph``
lifts the static-shape regions of ``main`` into functions the VM captures on their first call and
replays after).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

import tvm
from tvm import relax
from tvm.relax import pipeline as relax_pipeline
from tvm.relax.transform import MetaScheduleApplyDatabase

from compiler.compile_options import CompileOptions
from compiler.llm.attention import expand_attention, specialize_attention
from compiler.lowering.conv_layout import to_nhwc
from compiler.lowering.default_schedules import apply_default_schedules, gpu_default_rules
from compiler.lowering.fast_math import fast_math
from compiler.lowering.gpu_gemv import legalize_matmul
from compiler.lowering.prepack import fold_prepacked_weights, mark_layout_free
from compiler.peers import apply_peers, library_for
from compiler.peers.algorithms import FORMAT_ALGORITHMS
from compiler.peers.held_weights import hold_weights
from compiler.target import TargetSpec
from compiler.weights.external import ExternalWeights, lift_weights
from compiler.weights.quantized_gather import gather_from_codes

#: Set to ``0`` (or ``false``/``off``/``no``) to build CUDA artifacts without CUDA graphs.
CUDA_GRAPHS_ENV = "TUNEHUB_CUDA_GRAPHS"


def cuda_graphs_enabled() -> bool:
    """Whether CUDA builds capture their launches into CUDA graphs: on unless
    ``TUNEHUB_CUDA_GRAPHS`` says ``0``, ``false``, ``off`` or ``no``."""
    return os.environ.get(CUDA_GRAPHS_ENV, "1").strip().lower() not in {"0", "false", "off", "no"}


def build_context(target: TargetSpec) -> tvm.transform.PassContext:
    """The pass context of a build for ``target``: opt level 3 and, for CUDA with
    :func:`cuda_graphs_enabled`, ``relax.backend.use_cuda_graph`` (read by the CUDA finalize
    passes' ``RewriteCUDAGraph``)."""
    graphs = target.kind == "cuda" and cuda_graphs_enabled()
    return tvm.transform.PassContext(
        opt_level=3, config={"relax.backend.use_cuda_graph": True} if graphs else {}
    )


def attention_peer_available(target: TargetSpec) -> bool:
    """Whether a build for ``target`` may keep a decoder's attention on the CPU shim
    (:func:`compiler.llm.attention.attention_kernel`): a CPU target that takes library peers,
    on a machine with the peer library."""
    return target.kind == "cpu" and library_for(target) is not None


def for_target(
    mod: tvm.IRModule, options: CompileOptions, attention_peer: bool = False
) -> tvm.IRModule:
    """Step 1: ``mod`` with a decoder's attention kernels expanded into matrix products unless
    ``attention_peer`` (:func:`attention_peer_available`, and a build that links the peer
    library: :func:`compiler.llm.attention.expand_attention`), in the convolution layout of
    ``options``, then with fast math, then, where the weights are in an 8- or 4-bit format, its
    embedding tables gathered from their codes
    (:func:`compiler.weights.quantized_gather.gather_from_codes`; ``mod`` is not modified)."""
    mod = specialize_attention(mod) if attention_peer else expand_attention(mod)
    mod = fast_math(to_nhwc(mod) if options.conv_layout == "NHWC" else mod)
    if options.weights in FORMAT_ALGORITHMS:
        mod = gather_from_codes(mod, options.weights)
    return mod


def fuse(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Step 2: legalize and fuse a Relax module into primitive TIR functions for ``target``."""
    # CUDA: decode-sized matmuls over constant weights as GEMVs over row-major weights.
    legalize = {"relax.matmul": legalize_matmul} if target.kind.name == "cuda" else None
    with target:
        return tvm.ir.transform.Sequential(
            [
                *relax_pipeline.library_dispatch_passes(target),
                relax.transform.LegalizeOps(customize_legalize_map=legalize),
                relax.transform.AnnotateTIROpPattern(),
                relax.transform.FoldConstant(),
                relax.transform.FuseOps(),
                relax.transform.FuseTIR(),
            ]
        )(mod)


def _fuse_and_mark(
    mod: tvm.IRModule, target: tvm.target.Target, options: CompileOptions
) -> tvm.IRModule:
    fused = fuse(mod, target)
    return mark_layout_free(fused) if options.prepack else fused


def fused_for_target(mod: tvm.IRModule, target: TargetSpec) -> tvm.IRModule:
    """Steps 1–3: the fused module whose PrimFuncs are ``target``'s tuning tasks."""
    options = target.compile_options
    return _fuse_and_mark(
        for_target(mod, options, attention_peer_available(target)), target.tvm_target(), options
    )


def lower_with_database(
    mod: tvm.IRModule, target: TargetSpec, database: Any, peers: Collection[str] = ()
) -> tvm.IRModule:
    """Steps 1–3, the peers of the tasks keyed in ``peers``, ``MetaScheduleApplyDatabase``,
    default schedules for the tasks still unscheduled (:mod:`compiler.lowering.default_schedules`),
    the 8- and 4-bit peers' constant weights held in their format
    (:func:`compiler.peers.held_weights.hold_weights`) and (prepacking) the weight fold: the
    scheduled Relax module a non-legacy build lowers to the VM (tests read its constants)."""
    options = target.compile_options
    tvm_target = target.tvm_target()
    with tvm_target, database, tvm.transform.PassContext(opt_level=3):
        # The attention kernel calls the shim, which an executable links with its peers.
        attention_peer = bool(peers) and attention_peer_available(target)
        module = _fuse_and_mark(for_target(mod, options, attention_peer), tvm_target, options)
        module, _ = apply_peers(module, peers)
        module = MetaScheduleApplyDatabase()(module)
        module = apply_default_schedules(module, tvm_target)
        module = hold_weights(module)
        return fold_prepacked_weights(module) if options.prepack else module


def build_with_database(
    mod: tvm.IRModule, target: TargetSpec, database: Any, peers: Collection[str] = ()
) -> Any:
    """Compile the normalized ``mod`` for ``target`` with the best schedules of ``database``
    and the library peers of the tasks keyed in ``peers`` (non-legacy CPU targets only).

    Returns TVM's ``Executable``, or :class:`compiler.weights.external.ExternalWeights` for a model
    whose weights are too large to link into the library; TVM errors propagate (the caller maps
    them).
    """
    from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415 - only the paths that need them

    tvm_target = target.tvm_target()
    if target.kind == "cuda":
        return _cuda_build(for_target(mod, target.compile_options), target, database, peers)
    if target.compile_options.is_legacy:
        if peers:
            raise ValueError(f"{target.describe()} builds without library peers")
        mod = for_target(mod, target.compile_options)
        return ms.relax_integration.compile_relax(database, mod, tvm_target, params=None)
    # Only CPU targets take this path. ``relax.pipeline.dataflow_lower_passes`` fails for llvm
    # in 0.27 (``tvm.relax.backend.cpu_generic`` does not export it); its module has both lists.
    from tvm.relax.backend.cpu_generic import pipeline as cpu_pipeline  # noqa: PLC0415 - only the paths that need them

    scheduled, weights = lift_weights(lower_with_database(mod, target, database, peers))
    late = tvm.ir.transform.Sequential(
        [
            *cpu_pipeline.dataflow_lower_passes(tvm_target),
            *cpu_pipeline.finalize_passes(tvm_target),
        ]
    )
    with tvm_target, tvm.transform.PassContext(opt_level=3):
        executable = relax.build(scheduled, target=tvm_target, relax_pipeline=late)
    return ExternalWeights(executable, weights) if weights else executable


def _cuda_build(
    mod: tvm.IRModule, target: TargetSpec, database: Any, peers: Collection[str]
) -> Any:
    """``ms.relax_integration.compile_relax``'s pipeline for a GPU target (fuse as tuning did,
    apply the database, DLight's GPU rules for the rest, lower), with the cuBLAS / cuDNN peers
    of the tasks keyed in ``peers`` put in after fusion, in :func:`build_context` (CUDA
    graphs)."""
    from tvm.relax.backend.cuda import pipeline as cuda_pipeline  # noqa: PLC0415 - as CPU's
    from tvm.s_tir import dlight as dl  # noqa: PLC0415 - only this path

    tvm_target = target.tvm_target()

    @tvm.transform.module_pass(opt_level=3)
    def pipeline(module: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        module = fuse(module, tvm_target)
        module, _ = apply_peers(module, peers, "cuda")
        module = MetaScheduleApplyDatabase()(module)
        module = dl.ApplyDefaultSchedule(*gpu_default_rules())(module)
        return tvm.ir.transform.Sequential(
            [
                *cuda_pipeline.dataflow_lower_passes(tvm_target),
                *cuda_pipeline.finalize_passes(tvm_target),
            ]
        )(module)

    with tvm_target, database, build_context(target):
        return relax.build(mod, target=tvm_target, relax_pipeline=pipeline)


def build_untuned(mod: tvm.IRModule, target: TargetSpec) -> Any:
    """TVM's default build of ``mod`` in ``target``'s layout (no database: naive loops on CPU,
    DLight's default schedules on CUDA, in :func:`build_context`)."""
    with build_context(target):
        return tvm.compile(for_target(mod, target.compile_options), target=target.tvm_target())
