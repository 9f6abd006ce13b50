"""One Relax module for a bucketed model: one public function per shape bucket.

Decision (tried in TVM 0.27): the buckets are merged **before** partitioning, as functions of
one ``IRModule`` (``main_seq_16``, ``main_seq_64``, ...), rather than built separately and
joined afterwards. A Relax ``IRModule`` holds any number of public functions and every pass of
the pipeline (legalization, fusion, ``MetaScheduleApplyDatabase``, the VM build) runs over all
of them, so the merged module is partitioned, tuned and built like any model:

- ``ms.relax_integration.extract_tasks`` over the merged module deduplicates the fused PrimFuncs
  of all buckets by structure and sums their weights (a task two buckets share is one task);
- ``relax.build`` makes one executable, so the artifact stays one ``model.so`` with one VM
  function per bucket. Joining separately built libraries would need one VM per library (a
  Relax executable cannot link another's functions), which is what one library per bucket in
  the artifact directory would have been.

Each bucket's import binds the weights as constants of its own, but the VM executable keeps
structurally equal constants once: four buckets of a matmul with a 1 MB weight built into a
1.20 MB ``model.so`` against 1.18 MB for one (weights a tuned schedule prepacks into a layout
of its own may still differ per bucket).

Each bucket's module comes from the importer with ``main`` and helper functions of its own
(``fast_softmax`` of :mod:`compiler.lowering.fast_math`): helpers get names of their own in the
merged module and every reference to them follows (:class:`_RenameGlobals`).
"""

from __future__ import annotations

from collections.abc import Sequence

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


@mutator
class _RenameGlobals(PyExprMutator):
    """Replace every reference to a global function by the one ``mapping`` names for it."""

    def __init__(self, mapping: dict[str, tvm.ir.GlobalVar]) -> None:
        super().__init__()
        self.mapping = mapping

    def visit_global_var_(self, op: tvm.ir.GlobalVar) -> relax.Expr:
        return self.mapping.get(op.name_hint, op)


def merge_buckets(modules: Sequence[tuple[str, tvm.IRModule]]) -> tvm.IRModule:
    """One module holding each ``(function name, normalized module)``'s ``main`` under that
    name (its ``global_symbol`` too), and its helpers (``BlockBuilder.add_func`` names them
    apart, ``fast_softmax1``, and shares a helper structurally equal to one already added)."""
    builder = relax.BlockBuilder()
    for name, mod in modules:
        mapping: dict[str, tvm.ir.GlobalVar] = {}
        items = sorted(mod.functions_items(), key=lambda item: isinstance(item[1], relax.Function))
        for gvar, func in items:  # helpers (PrimFuncs) first: the Relax functions call them
            new_name = name if gvar.name_hint == "main" else gvar.name_hint
            if isinstance(func, relax.Function):
                func = _RenameGlobals(mapping).visit_expr(func)
            if func.attrs is not None and "global_symbol" in func.attrs:
                func = func.with_attr("global_symbol", new_name)
            mapping[gvar.name_hint] = builder.add_func(func, new_name)
    return builder.finalize()
