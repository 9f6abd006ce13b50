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

On a CPU whose build links the peer library, the converter's attention is one call of the
shim's kernel instead (:func:`emit_attention`, :func:`attention_kernel`;
``compiler/peers/shim_attention.inc``): a static cache is mostly empty, and the matrix products
read all of it, so a 128-token prefill chunk at the start of a 1,088-position cache computed
8.5 times the scores it needed. The kernel finds, for each block of query rows, the last key
the mask lets any of them see and reads the cache up to there only: the same numbers up to the
order of the sums (a hidden key adds exactly 0). The import always emits the kernel;
:func:`compiler.lowering.pipeline.for_target` keeps it, with its sizes made literal
(:func:`specialize_attention`), or expands it into :func:`grouped_attention`
(:func:`expand_attention`: CUDA, a machine without the peer library, a build without peers).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tvm
from tvm import relax, tirx
from tvm.relax.dpl import is_op, wildcard

from compiler.lowering.relax_rewrite import rewrite_call

SDPA = "scaled_dot_product_attention.default"
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
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
    q, k, v = env[node.args[0]], env[key], env[value]
    if all(str(x.ty.dtype) == "float32" for x in (q, k, v)):  # the shim's kernel is float32
        return emit_attention(importer.block_builder, q, k, v, mask, float(scale))
    return grouped_attention(importer.block_builder, q, k, v, mask, float(scale), n_rep)


#: The PrimFunc attribute that marks :func:`attention_kernel`'s functions (its value: the scale).
ATTENTION_ATTR = "tunehub.attention"
ATTENTION_EXTERN = "tunehub_peer_attention"
_MASK_KINDS = {None: 0, "float32": 1, "bool": 2}


@functools.lru_cache(maxsize=64)
def attention_kernel(
    mask_dtype: str | None, scale: float, shape: tuple[int, ...] | None = None
) -> tirx.PrimFunc:
    """A PrimFunc ``(q, k, v[, mask], out)`` that calls the CPU shim's attention
    (``tunehub_peer_attention``, ``compiler/peers/shim_attention.inc``): ``out = softmax(q k^T *
    scale + mask) v`` for queries ``[b, h, s, d]`` over a cache ``[b, kv, c, d]`` whose head
    ``g`` serves query heads ``g * h / kv ..`` (``repeat_kv``'s order), reading only the keys
    some query row's mask lets through. Shapes are symbolic; the mask (float32: added, bool:
    keep) is ``[mb, mh, ms, c]`` broadcast against the scores. Marked scheduled (nothing tunes
    or schedules it) and with :data:`ATTENTION_ATTR`, so :func:`expand_attention` can replace it
    by :func:`grouped_attention` where the shim is not there. The call's status is checked: a
    shape the shim refuses raises in the kernel. ``shape``: the sizes ``(b, h, s, d, kv, c[,
    mb, mh, ms])`` to build it for (what a build needs: TVM 0.27's lowering loses the
    symbolic sizes of an opaque kernel; :func:`specialize_attention`)."""
    masked = mask_dtype is not None
    names = ("b", "h", "s", "d", "kv", "c") + (("mb", "mh", "ms") if masked else ())
    if shape is None:  # symbolic: each size a variable the buffers bind
        size = {name: name for name in names}
        declare = f"{', '.join(names)} = {', '.join(['T.int64()'] * len(names))}"
    else:
        size = {name: f"T.int64({value})" for name, value in zip(names, shape)}
        declare = "pass"
    b, h, s, d, kv, c = (size[name] for name in names[:6])
    shapes = {"q": (b, h, s, d), "k": (b, kv, c, d), "v": (b, kv, c, d), "out": (b, h, s, d)}
    if masked:
        shapes["mask"] = (size["mb"], size["mh"], size["ms"], c)
    dtypes = {"mask": mask_dtype}

    def region(name: str) -> str:
        return f"{name}[{', '.join(f'0:{x}' for x in shapes[name])}]"

    inputs = [name for name in ("q", "k", "v", "mask") if name in shapes]
    buffers = "\n    ".join(
        f"{name} = T.match_buffer(var_{name}, ({', '.join(shapes[name])}), "
        f'"{dtypes.get(name, "float32")}")'
        for name in (*inputs, "out")
    )
    # Without a mask the shim never reads its pointer (kind 0): q's is passed.
    mask_args = ["mask.data", *shapes["mask"][:3]] if masked else ["q.data"] + ["T.int64(1)"] * 3
    args = ", ".join(
        ["q.data", "k.data", "v.data", mask_args[0], "out.data", b, h, s, d, kv, c]
        + mask_args[1:]
        + [str(_MASK_KINDS[mask_dtype]), f"T.float32({scale!r})"]
    )
    params = ", ".join(f"var_{name}: T.handle" for name in (*inputs, "out"))
    source = f"""
@T.prim_func(private=True)
def attention({params}):
    T.func_attr({{"tirx.noalias": True, "tirx.is_scheduled": True, "{ATTENTION_ATTR}": T.float32({scale!r})}})
    {declare}
    {buffers}
    with T.sblock("root"):
        with T.sblock("tunehub_peer"):
            T.reads({", ".join(region(name) for name in inputs)})
            T.writes({region("out")})
            assert T.call_extern("int32", "{ATTENTION_EXTERN}", {args}) == 0, "the library peer {ATTENTION_EXTERN} failed"
"""  # noqa: E501 - generated TVMScript
    return tvm.script.from_source(source, check_well_formed=False)


def emit_attention(
    builder: relax.BlockBuilder,
    q: relax.Expr,
    k: relax.Expr,
    v: relax.Expr,
    mask: relax.Expr | None,
    scale: float,
) -> relax.Expr:
    """``softmax(q k^T * scale + mask) v`` over a grouped-query cache as one call of
    :func:`attention_kernel` (the CPU shim's attention over the cache's filled part);
    :func:`expand_attention` turns it into :func:`grouped_attention` for builds without the
    shim. A mask of another float dtype is cast to float32."""
    if mask is not None and str(mask.ty.dtype) not in ("bool", "float32"):
        mask = builder.emit(relax.op.astype(mask, "float32"))
    kernel = attention_kernel(None if mask is None else str(mask.ty.dtype), scale)
    gvar = builder.add_func(kernel, "attention")
    args = [q, k, v] + ([mask] if mask is not None else [])
    return builder.emit(
        relax.call_tir(gvar, args, relax.TensorType(q.ty.shape, "float32")),
        name_hint="attention",
    )


def is_attention_kernel(func: object) -> bool:
    """Whether ``func`` is one of :func:`attention_kernel`'s PrimFuncs."""
    return (
        isinstance(func, tirx.PrimFunc) and func.attrs is not None and ATTENTION_ATTR in func.attrs
    )


def _static_sizes(args: list[relax.Expr]) -> tuple[int, ...] | None:
    """``(b, h, s, d, kv, c[, mb, mh, ms])`` of an attention call's arguments, or ``None`` while
    one is symbolic."""
    try:
        q = [int(x) for x in args[0].ty.shape]
        k = [int(x) for x in args[1].ty.shape]
        mask = [int(x) for x in args[3].ty.shape][:3] if len(args) > 3 else []
    except TypeError:
        return None
    return (*q, k[1], k[2], *mask)


def _rewrite_attention_calls(
    mod: tvm.IRModule,
    rewrite: Callable[[relax.BlockBuilder, relax.Call, list[relax.Expr], float], relax.Expr],
    finish: Callable[[relax.Function], relax.Function] = lambda func: func,
) -> tvm.IRModule:
    """``mod`` with each call of :func:`attention_kernel` replaced by ``rewrite(builder, call,
    args, scale)`` (the call's tensor arguments, the kernel's scale), each Relax function then
    passed through ``finish``, and the functions nothing calls any more dropped; ``mod`` itself
    when it has no such kernel (``mod`` is never modified)."""
    kernels = {gvar.name_hint for gvar, func in mod.functions_items() if is_attention_kernel(func)}
    if not kernels:
        return mod

    @relax.expr_functor.mutator
    class _Rewrite(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - TVM's name
            call = super().visit_call_(call)
            if not (
                isinstance(call, relax.Call)
                and call.op.same_as(_CALL_TIR)
                and call.args[0].name_hint in kernels
            ):
                return call
            scale = float(mod[call.args[0]].attrs[ATTENTION_ATTR].value)
            return rewrite(self.builder_, call, list(call.args[1].fields), scale)

    rewriter = _Rewrite(mod.clone())
    for gvar, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gvar, finish(rewriter.visit_expr(func)))
    return relax.transform.DeadCodeElimination()(rewriter.builder_.get())


def specialize_attention(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each call of :func:`attention_kernel` whose arguments have static shapes
    calling a copy built for those sizes (the form a build lowers; ``mod`` is not modified)."""

    def specialized(
        builder: relax.BlockBuilder, call: relax.Call, args: list[relax.Expr], scale: float
    ) -> relax.Expr:
        sizes = _static_sizes(args)
        if sizes is None:
            return call
        mask_dtype = str(args[3].ty.dtype) if len(args) > 3 else None
        gvar = builder.add_func(attention_kernel(mask_dtype, scale, sizes), "attention")
        return relax.Call(call.op, [gvar, *call.args[1:]], call.attrs, call.ty_args)

    return _rewrite_attention_calls(mod, specialized)


def expand_attention(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every call of :func:`attention_kernel` replaced by
    :func:`grouped_attention` (its matrix products become tasks like any matmul) in the prefill
    form where its query rows allow (:func:`prefill_scores`), and the kernels dropped: a build
    for a target without the CPU shim (CUDA, a machine without the peer library, a build with
    no library peers). ``mod`` is not modified."""

    def expanded(
        builder: relax.BlockBuilder, call: relax.Call, args: list[relax.Expr], scale: float
    ) -> relax.Expr:
        q, k, v, *mask = args
        heads, kv_heads = int(q.ty.shape[1]), int(k.ty.shape[1])
        return grouped_attention(
            builder, q, k, v, mask[0] if mask else None, scale, heads // kv_heads
        )

    return _rewrite_attention_calls(mod, expanded, prefill_scores)


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
