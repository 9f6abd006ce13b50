"""A stateful decoder returns the logits of its last position only.

``transformers``' static-cache export (``convert_and_export_with_cache``) returns logits for
every position it is given: ``[batch, tokens, vocabulary]``. Generation reads the last position
alone (the next token), and a prefill chunk before the last reads none, yet the LM head over
every position is the largest matmul of a prefill: on Qwen2.5-0.5B's shape (vocabulary 151,936)
it took 165 of a 128-token chunk's 702 ms on a 2-core Xeon. ``transformers``' own ``generate``
computes the prefill's last position only (``logits_to_keep=1``), and so do llama.cpp and ONNX
Runtime GenAI.

So a stateful decoder (:mod:`compiler.llm.state`) whose only user output is
``[batch, tokens, vocabulary]`` is compiled to return ``[batch, 1, vocabulary]``: the last
position's logits (:func:`keeps_last_logits` decides at load time; the manifest's model says
``"logits": "last_position"``). Its verification compares them with the reference's last
position (:func:`reference_last_position`), and :class:`compiler.llm.generate.Generator` reads
the last position either way.

:func:`last_position_logits` rewrites the imported Relax function. Where the logits are a
position-wise head over a constant weight (``reshape(matmul(reshape(x, [b * n, h]), W), [b, n,
v])``, what ``nn.Linear`` imports as, or ``matmul(x, W)`` on ``[b, n, h]``), the last position
of ``x`` is sliced *before* the matmul, so the head reads its weight once as a GEMV. Any other
form gets the slice after the output: the same result, without the saving.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

from compiler.errors import ModelError
from compiler.llm.generate import IDS


def keeps_last_logits(program: Any) -> bool:
    """Whether a stateful ``torch.export`` ``program`` is compiled to return its last position's
    logits: its only user output has rank 3 and its axis 1 is the token count (the size of its
    ``input_ids``' axis 1, a number or the same torch symbol)."""
    from torch.export.graph_signature import InputKind, OutputKind  # noqa: PLC0415 - .pt2 only

    signature = program.graph_signature
    user = [s for s in signature.output_specs if s.kind == OutputKind.USER_OUTPUT]
    ids = [
        s.arg.name
        for s in signature.input_specs
        if s.kind == InputKind.USER_INPUT and s.arg.name == IDS
    ]
    if len(user) != 1 or len(ids) != 1:
        return False
    nodes = {n.name: n for n in program.graph.nodes}
    tokens = _fake_shape(nodes.get(ids[0]))
    logits = _fake_shape(nodes.get(user[0].arg.name))
    if tokens is None or logits is None or len(tokens) != 2 or len(logits) != 3:
        return False
    return str(logits[1]) == str(tokens[1])


def _fake_shape(node: Any) -> tuple | None:
    value = node.meta.get("val") if node is not None else None
    shape = getattr(value, "shape", None)
    return tuple(shape) if shape is not None else None


def reference_last_position(outputs: list[Any]) -> list[Any]:
    """The reference's outputs cut to what a last-position library returns: the only output's
    last position, ``[batch, 1, vocabulary]``."""
    (logits,) = outputs
    return [logits[:, -1:]]


def _shape(expr: relax.Expr) -> list[int] | None:
    sinfo = expr.ty
    if not isinstance(sinfo, relax.TensorType) or sinfo.shape is None:
        return None
    try:
        return [int(v) for v in sinfo.shape.values]
    except (TypeError, AttributeError):  # a symbolic dimension: no static shape
        return None


def _call(expr: relax.Expr, var2val: dict, op: str) -> relax.Call | None:
    value = var2val.get(expr) if isinstance(expr, relax.Var) else expr
    if isinstance(value, relax.Call) and getattr(value.op, "name", None) == op:
        return value
    return None


def _constant_weight(expr: relax.Expr, var2val: dict) -> bool:
    value = var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
    if isinstance(value, tvm.ir.expr.Constant):
        return True
    transposed = _call(value, var2val, "relax.permute_dims")
    return transposed is not None and _constant_weight(transposed.args[0], var2val)


def _hoistable_head(logits: relax.Expr, var2val: dict) -> tuple[relax.Expr, relax.Call] | None:
    """``(x, matmul)`` where ``logits`` is ``matmul(x, W)`` on ``x`` ``[b, n, h]``, or
    ``reshape(matmul(reshape(x, [b * n, h]), W), [b, n, v])``, ``W`` a 2-D constant (or its
    transpose); ``None`` for any other form."""
    matmul = _call(logits, var2val, "relax.matmul")
    flat = matmul is None  # the head over [b * n, h] rows, reshaped back to [b, n, v]
    if flat:
        reshaped = _call(logits, var2val, "relax.reshape")
        matmul = _call(reshaped.args[0], var2val, "relax.matmul") if reshaped is not None else None
    if matmul is None or not _constant_weight(matmul.args[1], var2val):
        return None
    weight = _shape(matmul.args[1])
    rows = matmul.args[0]
    if flat:
        flattened = _call(rows, var2val, "relax.reshape")
        if flattened is None:
            return None
        rows = flattened.args[0]
    shape = _shape(rows)
    if weight is None or len(weight) != 2 or shape is None or len(shape) != 3:
        return None
    if shape[2] != weight[0] or shape[:2] != _shape(logits)[:2]:  # [b, n, h] -> [b, n, v]
        return None
    return rows, matmul


@relax.expr_functor.mutator
class _LastPosition(relax.PyExprMutator):
    """Re-emits the binding of ``target`` (the logits) as their last position (see the module
    docstring); every other binding as it is."""

    def __init__(self, target: relax.Var, var2val: dict, mod: tvm.IRModule | None = None):
        super().__init__(mod)
        self.target = target
        self.var2val = var2val
        self.hoisted = False

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        if not binding.var.same_as(self.target):
            super().visit_var_binding_(binding)
            return
        batch, tokens, vocabulary = _shape(binding.var)
        head = _hoistable_head(binding.var, self.var2val)
        if head is not None:
            rows, matmul = head
            hidden = _shape(rows)[2]
            last = self.builder_.emit(
                relax.op.strided_slice(
                    self.visit_expr(rows), axes=[1], begin=[tokens - 1], end=[tokens]
                )
            )
            flat = self.builder_.emit(relax.op.reshape(last, [batch, hidden]))
            product = self.builder_.emit(
                relax.op.matmul(
                    flat, self.visit_expr(matmul.args[1]), out_dtype=matmul.attrs.out_dtype
                )
            )
            new = self.builder_.emit(relax.op.reshape(product, [batch, 1, vocabulary]))
            self.hoisted = True
        else:
            value = self.builder_.emit(self.visit_expr(binding.value))
            new = self.builder_.emit(
                relax.op.strided_slice(value, axes=[1], begin=[tokens - 1], end=[tokens])
            )
        self.set_var_remap(binding.var, new)


def _logits_var(func: relax.Function, var2val: dict) -> relax.Var:
    """The variable the function's only output (or its one-tensor tuple's field) is bound to."""
    body = func.body
    out = body.body if isinstance(body, relax.SeqExpr) else body
    value = var2val.get(out, out) if isinstance(out, relax.Var) else out
    if isinstance(value, relax.Tuple):
        if len(value.fields) != 1:
            raise ModelError(
                "import_failed", "a last-position decoder must return one tensor, its logits"
            )
        value = value.fields[0]
    if not isinstance(value, relax.Var) or _shape(value) is None or len(_shape(value)) != 3:
        raise ModelError(
            "import_failed",
            "a last-position decoder's output must be a static [batch, tokens, vocabulary] tensor",
        )
    return value


def last_position_logits(func: relax.Function) -> tuple[relax.Function, bool]:
    """``func`` returning its logits' last position, ``[batch, 1, vocabulary]`` (see the module
    docstring), and whether the head matmul itself was cut to that position (``False``: the
    output was sliced after it). A function whose logits already have one position is returned
    as it is. Raises ``ModelError("import_failed")`` when the output is not one static
    ``[batch, tokens, vocabulary]`` tensor."""
    var2val = relax.analysis.get_var2val(func)
    target = _logits_var(func, var2val)
    if _shape(target)[1] == 1:
        return func, False
    mutator = _LastPosition(target, var2val)
    body = mutator.visit_expr(func.body)
    rewritten = relax.Function(func.params, body, body.ty, func.is_pure, func.attrs, func.span)
    return relax.analysis.remove_all_unused(rewritten), mutator.hoisted
