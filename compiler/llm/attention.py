"""Attention over a grouped-query KV cache without copying it.

``transformers``' decoders with grouped-query attention (Qwen2, Llama 3, TinyLlama) expand the
cache's key-value heads to the query heads before attention (``repeat_kv``: ``unsqueeze``,
``expand``, ``clone``, ``view``), which materializes ``query heads / key-value heads`` copies of
the whole cache on every call: in a Qwen2.5-0.5B decode step (14 query heads over 2) those copies
took 26 of its 157 ms, more than the attention itself.

For a stateful decoder (:mod:`compiler.llm.state`) torch's ``scaled_dot_product_attention`` is
kept whole through the decomposition, and :func:`convert_sdpa` translates it into the scores
(:func:`gqa_scores`), a softmax and the weighted sum (:func:`gqa_weighted`), each reading the
cache's key-value head ``h // n_rep`` for query head ``h``: no copy. Three tasks rather than one
fused kernel, so each gets the default schedule that fits it (a batched GEMV, a softmax, a
vectorized sum) and tunes like any task. The ``repeat_kv`` chain it looked
through is then unused and dropped. The mask is applied as given (boolean: keep; float: add),
so the kernel computes exactly what torch's does; dropout must be 0 and ``is_causal`` false (the
static-cache export passes its mask explicitly); anything else goes to TVM's converter.
"""

from __future__ import annotations

from typing import Any

from tvm import relax, te, tirx

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


def gqa_scores(
    q: te.Tensor, k: te.Tensor, mask: te.Tensor | None, scale: float, n_rep: int
) -> te.Tensor:
    """``q k^T * scale`` (plus the mask) for queries ``[b, h, s, d]`` over keys
    ``[b, h / n_rep, c, d]``: query head ``i`` reads key head ``i // n_rep``. ``mask``
    broadcasts to ``[b, h, s, c]``: boolean (keep where true, else the lowest value) or additive.
    A batched matrix-vector product (DLight's ``GEMV`` rule takes it)."""
    batch, heads, seq, dim = q.shape
    length = k.shape[2]
    d = te.reduce_axis((0, dim), name="d")
    dots = te.compute(
        (batch, heads, seq, length),
        lambda b, h, s, c: te.sum(q[b, h, s, d] * k[b, h // n_rep, c, d], axis=d),
        name="attn_dots",
    )
    factor = tirx.const(scale, q.dtype)
    mb = mask is not None and int(mask.shape[0]) > 1
    mh = mask is not None and int(mask.shape[1]) > 1

    def scaled(b: Any, h: Any, s: Any, c: Any) -> Any:
        value = dots[b, h, s, c] * factor
        if mask is None:
            return value
        m = mask[b if mb else 0, h if mh else 0, s, c]
        if mask.dtype == "bool":
            return tirx.Select(m, value, tirx.min_value(q.dtype))
        return value + m.astype(q.dtype)

    return te.compute(dots.shape, scaled, name="attn_scores")


def gqa_weighted(p: te.Tensor, v: te.Tensor, n_rep: int) -> te.Tensor:
    """``p v`` for probabilities ``[b, h, s, c]`` over values ``[b, h / n_rep, c, d]``: a sum
    over ``c`` whose output axis ``d`` is contiguous in ``v`` (vectorized by the default
    schedule)."""
    batch, heads, seq, length = p.shape
    dim = v.shape[3]
    c = te.reduce_axis((0, length), name="c")
    return te.compute(
        (batch, heads, seq, dim),
        lambda b, h, s, e: te.sum(p[b, h, s, c] * v[b, h // n_rep, c, e], axis=c),
        name="attn_weighted",
    )


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
    args = [env[node.args[0]], env[key], env[value]]
    if mask_node is not None:
        mask = env[mask_node]
        if len(mask.ty.shape) != 4:
            return fallback(node)
        args.append(mask)
    builder = importer.block_builder
    scores = builder.emit(
        builder.call_te(
            lambda q, k, *m: gqa_scores(q, k, m[0] if m else None, float(scale), n_rep),
            *[args[0], args[1], *args[3:]],
            primfunc_name_hint="gqa_scores",
        )
    )
    probabilities = builder.emit(relax.op.nn.softmax(scores, axis=-1))
    return builder.emit(
        builder.call_te(
            lambda p, v: gqa_weighted(p, v, n_rep),
            probabilities,
            args[2],
            primfunc_name_hint="gqa_weighted",
        )
    )
