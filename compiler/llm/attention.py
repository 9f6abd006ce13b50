"""Attention over a grouped-query KV cache without copying it.

``transformers``' decoders with grouped-query attention (Qwen2, Llama 3, TinyLlama) expand the
cache's key-value heads to the query heads before attention (``repeat_kv``: ``unsqueeze``,
``expand``, ``clone``, ``view``), which materializes ``query heads / key-value heads`` copies of
the whole cache on every call: in a Qwen2.5-0.5B decode step (14 query heads over 2) those copies
took 26 of its 157 ms, more than the attention itself.

For a stateful decoder (:mod:`compiler.llm.state`) torch's ``scaled_dot_product_attention`` is
kept whole through the decomposition, and :func:`convert_sdpa` translates it into
:func:`grouped_attention`: matrix products on the cache as it is stored, each cache head
multiplied once by the query heads that share it (no copy of the cache), then the mask, a
softmax and the product with the values. A measured first version, one TE kernel per attention
with a default schedule, took 0.7 ms a layer in a Qwen2.5-0.5B decode step and 51 ms in a
128-token prefill; as matrix products they get the library peers and GEMM schedules. The
``repeat_kv`` chain it looked through is then unused and dropped. The mask is applied as given
(boolean: keep; float: add), so the result is exactly what torch's computes; dropout must be 0
and ``is_causal`` false (the static-cache export passes its mask explicitly); anything else
goes to TVM's converter.
"""

from __future__ import annotations

from typing import Any

from tvm import relax
from tvm.relax.dpl import is_op, wildcard

from compiler.relax_rewrite import rewrite_call

SDPA = "scaled_dot_product_attention.default"
_REPEAT_OPS = {"view.default", "_unsafe_view.default", "clone.default", "reshape.default"}


def _name(node: Any) -> str:
    return getattr(getattr(node, "target", None), "__name__", "")


def repeat_source(node: Any) -> tuple[Any, int]:
    """``(X, n)`` when ``node`` is ``repeat_kv(X, n)`` as ``transformers`` writes it
    (``X[:, :, None].expand(b, kv, n, s, d)`` then ``clone``/``view`` to ``(b, kv * n, s, d)``),
    else ``(node, 1)``."""
    current = node
    while _name(current) in _REPEAT_OPS:
        current = current.args[0]
    if _name(current) != "expand.default":
        return node, 1
    unsqueezed = current.args[0]
    if _name(unsqueezed) != "unsqueeze.default" or unsqueezed.args[1] != 2:
        return node, 1
    source = unsqueezed.args[0]
    shape = list(current.args[1])
    value = source.meta.get("val")
    if value is None or value.dim() != 4 or len(shape) != 5:
        return node, 1
    return source, int(shape[2])


def _argument(node: Any, index: int, name: str, default: Any) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def convert_sdpa(node: Any, importer: Any, fallback: Any) -> relax.Expr:
    """The converter of ``aten.scaled_dot_product_attention`` (see the module docstring);
    ``fallback(node)`` (TVM's converter) for what it does not take."""
    mask_node = _argument(node, 3, "attn_mask", None)
    dropout = _argument(node, 4, "dropout_p", 0.0)
    causal = _argument(node, 5, "is_causal", False)
    scale = _argument(node, 6, "scale", None)
    q_value = node.args[0].meta.get("val")
    if dropout or causal or q_value is None or q_value.dim() != 4:
        return fallback(node)
    key, n_rep = repeat_source(node.args[1])
    value, v_rep = repeat_source(node.args[2])
    if n_rep != v_rep or int(q_value.shape[1]) != int(key.meta["val"].shape[1]) * n_rep:
        return fallback(node)
    if scale is None:
        scale = float(q_value.shape[-1]) ** -0.5
    env = importer.env
    mask = env[mask_node] if mask_node is not None else None
    if mask is not None and len(mask.ty.shape) != 4:
        return fallback(node)
    return grouped_attention(
        importer.block_builder, env[node.args[0]], env[key], env[value], mask, float(scale), n_rep
    )


#: Query rows (``n_rep`` x tokens) from which the scores are ``q k^T`` (over a copy of the
#: cache's ``k^T``, the size of the cache) instead of ``(k q^T)^T`` (the cache read as stored,
#: the scores transposed after): :func:`prefill_scores`. A decode step's few rows keep the
#: latter; a prefill chunk's scores are ``n_rep * tokens / dim`` times the size of its ``k``, and
#: their transpose costs about as much as the GEMM. Measured on Qwen2.5-0.5B's attention (14
#: query heads over 2, a cache of 1,088, zero-trial CPU build, 2-core Xeon, ms per layer,
#: ``(k q^T)^T`` / ``q k^T``): 4 tokens (28 rows) 0.604 / 0.641, 16 tokens (112 rows) 0.804 /
#: 0.678, 128 tokens 4.91 / 3.96.
PREFILL_SCORES_MIN_ROWS = 64
_SWAP = [0, 1, 3, 2]


def _swaps_last_two(call: relax.Call) -> bool:
    axes = call.attrs.axes
    return axes is not None and [int(a) for a in axes] == _SWAP


def prefill_scores(func: relax.Function) -> relax.Function:
    """``func`` with each ``(k q^T)^T`` of :func:`grouped_attention` whose query rows are static
    and at least :data:`PREFILL_SCORES_MIN_ROWS` computed as ``q k^T``. Run after a bucket's
    token count is bound (the converter may see it symbolic)."""
    swapped_q = is_op("relax.permute_dims")(wildcard())
    product = is_op("relax.matmul")(wildcard(), swapped_q)
    pattern = is_op("relax.permute_dims")(product)

    def rewrite(expr: relax.Call, matches: dict) -> relax.Expr:
        query_t = matches[swapped_q]
        if not (_swaps_last_two(expr) and _swaps_last_two(query_t)):
            return expr
        grouped, keys = query_t.args[0], matches[product].args[0]
        shape = grouped.ty.shape
        if len(shape) != 4 or len(keys.ty.shape) != 4:
            return expr
        try:
            rows = int(shape[2])
        except TypeError:  # still symbolic
            return expr
        if rows < PREFILL_SCORES_MIN_ROWS:
            return expr
        return relax.op.matmul(grouped, relax.op.permute_dims(keys, _SWAP))

    return rewrite_call(pattern, rewrite, func)


def grouped_attention(
    builder: relax.BlockBuilder,
    q: relax.Expr,
    k: relax.Expr,
    v: relax.Expr,
    mask: relax.Expr | None,
    scale: float,
    n_rep: int,
) -> relax.Expr:
    """``softmax(q k^T * scale + mask) v`` for queries ``[b, h, s, d]`` over a key-value cache
    ``[b, h / n_rep, c, d]`` as plain matrix products on the cache itself: query heads
    ``kv * n_rep .. kv * n_rep + n_rep - 1`` read key-value head ``kv`` (``repeat_kv``'s order),
    so ``q`` viewed as ``[b, kv, n_rep * s, d]`` (no copy) multiplies each cache head once. The
    scores are ``(k q^T)^T``: the cache is read as it is stored (a transpose of the small
    queries and scores, never of the cache). ``mask`` (broadcast to ``[b, h, s, c]``) is boolean
    (keep where true) or additive. Each product is a task like any matmul (a library peer, the
    default GEMM schedule, tuning)."""
    emit = builder.emit
    batch, heads, seq, dim = (q.ty.shape[i] for i in range(4))
    kv, length = k.ty.shape[1], k.ty.shape[2]
    grouped = emit(relax.op.reshape(q, [batch, kv, n_rep * seq, dim]))
    scores_t = emit(relax.op.matmul(k, emit(relax.op.permute_dims(grouped, _SWAP))))
    scores = emit(relax.op.permute_dims(scores_t, _SWAP))  # see prefill_scores
    scores = emit(relax.op.reshape(scores, [batch, heads, seq, length]))
    scores = emit(relax.op.multiply(scores, relax.const(scale, str(q.ty.dtype))))
    if mask is not None:
        if str(mask.ty.dtype) == "bool":
            lowest = relax.const(float("-inf"), str(q.ty.dtype))
            scores = emit(relax.op.where(mask, scores, lowest))
        else:
            scores = emit(relax.op.add(scores, emit(relax.op.astype(mask, str(q.ty.dtype)))))
    probabilities = emit(relax.op.nn.softmax(scores, axis=-1))
    grouped_p = emit(relax.op.reshape(probabilities, [batch, kv, n_rep * seq, length]))
    out = emit(relax.op.matmul(grouped_p, v))
    return emit(relax.op.reshape(out, [batch, heads, seq, dim]))
