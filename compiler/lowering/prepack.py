"""Prepacked weights on CPU targets (the weight-layout lever of issue 19).

MetaSchedule's ``RewriteLayout`` postprocessor (in its default LLVM set) lets a schedule read a
weight in the tiled layout its loops want, but only for buffers its PrimFunc marks layout-free;
plain LegalizeOps → FuseOps → FuseTIR marks none. TVM's static-shape pipeline
(``relax.pipeline.static_shape_tuning_pipeline(cpu_weight_prepack=True)``) does the two halves
below; here the weights are constants, so the weight transform is run once at build time and
the library's ``main`` keeps its signature (inputs only).

- :func:`mark_layout_free` (tuning and build alike, right after FuseTIR): every PrimFunc gets the
  ``layout_free_buffers`` of the arguments its callers pass constants to. The attribute is part
  of the PrimFunc, hence of the task's structural hash: prepacked and plain tasks never share a
  key.
- :func:`fold_prepacked_weights` (build only, after ``MetaScheduleApplyDatabase``): splits each
  tuned kernel's layout-rewrite block into its own PrimFunc, lifts those calls on constants out
  of ``main`` and folds them into new constants (the prepack PrimFuncs are then dropped).

Measurement builds (``tuner.measuring.builder_runner.fast_build``) drop the rewrite block
(``RemoveWeightLayoutRewriteBlock``), as MetaSchedule's default builder does: a candidate's time
excludes the one-off transform.
"""

from __future__ import annotations

import tvm
from tvm import relax


def mark_layout_free(fused: tvm.IRModule) -> tvm.IRModule:
    """Attach ``layout_free_buffers`` to the PrimFuncs of a fused module (see module docstring)."""
    return relax.transform.AttachAttrLayoutFreeBuffers()(fused)


def fold_prepacked_weights(scheduled: tvm.IRModule) -> tvm.IRModule:
    """Fold the weight-layout rewrites of a scheduled module into its constants."""
    return tvm.ir.transform.Sequential(
        [
            relax.transform.SplitLayoutRewritePreproc(),
            relax.transform.LiftTransformParams(),
            relax.transform.FoldConstant(),
            relax.transform.DeadCodeElimination(),  # the folded prepack PrimFuncs
        ]
    )(scheduled)
