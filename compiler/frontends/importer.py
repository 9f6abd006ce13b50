"""Import a validated model into TVM Relax.

``import_model`` promises a Relax ``IRModule`` with one ``main`` function (a bucketed model: one
function per shape bucket instead, :mod:`compiler.shapes.bucket_module`) whose parameters are the
user inputs (weights bound as constants), static shapes, and inference-only ops (batch-norm folded
into the preceding convolution where it follows one, so ONNX and ``.pt2`` imports of one network
produce the same convolution and matmul workloads), everything computed from constants alone folded
(attention masks built from ``arange`` included: :mod:`compiler.frontends.fold_constants`).
Transcendental ops stay exact: their vectorizable approximations
(:mod:`compiler.lowering.fast_math`) are put in by the lowering, after the convolution layout.
Operators the importer does not support raise one :class:`UnsupportedOperatorsError` that lists all
of them: for ``.pt2``, checked on the uploaded graph and again on the graph torch's decomposition
makes of it, the one TVM translates (:mod:`compiler.frontends.pt2_ops`, with TuneHub's converters).
"""

from __future__ import annotations

from dataclasses import replace

import onnx
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, wildcard
from tvm.sym.analyzer import Analyzer

from compiler.errors import ModelError, UnsupportedOperatorsError
from compiler.frontends.canonicalize import canonicalize
from compiler.frontends.fold_constants import fold_constants
from compiler.frontends.model_spec import LoadedModel
from compiler.lowering.relax_rewrite import rewrite_call

_ONNX_DEFAULT_DOMAINS = ("", "ai.onnx")


def _all_onnx_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _all_onnx_nodes(attribute.g)
            for subgraph in attribute.graphs:
                yield from _all_onnx_nodes(subgraph)


def unsupported_onnx_ops(model: onnx.ModelProto) -> list[str]:
    """Every operator (with its domain when not the default) the Relax ONNX importer lacks."""
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map  # noqa: PLC0415 - a frontend is imported only for its format

    supported = set(_get_convert_map()) | {"Constant", "If"}
    missing = set()
    for node in _all_onnx_nodes(model.graph):
        if node.domain not in _ONNX_DEFAULT_DOMAINS:
            missing.add(f"{node.domain}::{node.op_type}")
        elif node.op_type not in supported:
            missing.add(node.op_type)
    return sorted(missing)


def unsupported_torch_ops(program, *, decomposed: bool = False) -> list[str]:
    """Every ``call_function`` target TuneHub cannot import from ``program``: before torch's
    decomposition (``decomposed=False``) or after it (see :mod:`compiler.frontends.pt2_ops`)."""
    from compiler.frontends.pt2_ops import unsupported_ops  # noqa: PLC0415 - the torch frontend, for .pt2 only

    return unsupported_ops(program, decomposed=decomposed)


def _squeeze_axes_non_negative(func: relax.Function) -> relax.Function:
    """``squeeze(x, axis=[-1])`` as ``squeeze(x, axis=[rank - 1])``: TVM 0.27's ``ConvertLayout``
    (the CPU targets' NHWC step) dies with ``std::bad_alloc`` on a negative squeeze axis (the
    ONNX import of Mixtral's ``batched_mm`` experts has one)."""
    pattern = is_op("relax.squeeze")(wildcard())

    def rewrite(expr: relax.Call, matches: dict) -> relax.Expr:
        axes = expr.attrs.axis
        rank = getattr(getattr(expr.args[0], "ty", None), "ndim", -1)
        if axes is None or rank < 0 or all(int(a) >= 0 for a in axes):
            return expr
        return relax.op.squeeze(expr.args[0], [int(a) % rank for a in axes])

    return rewrite_call(pattern, rewrite, func)


def _strided_slices_simplified(func: relax.Function) -> relax.Function:
    """Each ``strided_slice`` with its begin/end/stride expressions simplified (``1 + 16`` as
    ``16``) and its axes non-negative. Binding a ``.pt2`` program's symbolic dimensions
    (``BindSymbolicVars``: a shape bucket, ``--input-shape``) leaves ``T.Add(1, 16)`` in the
    slice bounds the rotary embedding's ``diff`` decomposes to, and TVM 0.27 legalizes a slice
    with a non-constant bound by ``dynamic_strided_slice``, which fails on a negative axis."""
    pattern = is_op("relax.strided_slice")(
        wildcard(), wildcard(), wildcard(), wildcard(), wildcard()
    )
    analyzer = Analyzer()

    def values(tup: relax.Expr) -> list | None:
        return list(tup.fields) if isinstance(tup, relax.Tuple) else None

    def rewrite(expr: relax.Call, matches: dict) -> relax.Expr:
        rank = getattr(getattr(expr.args[0], "ty", None), "ndim", -1)
        parts = [values(arg) for arg in expr.args[1:5]]
        if rank < 0 or any(p is None for p in parts):
            return expr
        axes, bounds = parts[0], parts[1:]
        if all(isinstance(v, tvm.tirx.IntImm) for p in bounds for v in p) and all(
            int(a) >= 0 for a in axes
        ):
            return expr
        try:
            simple = [[analyzer.simplify(v) for v in p] for p in bounds]
            normalized = [int(a) % rank for a in axes]
        except (TypeError, ValueError):  # not plain integer expressions: left as it is
            return expr
        return relax.op.strided_slice(
            expr.args[0], normalized, *simple, assume_inbound=bool(expr.attrs.assume_inbound)
        )

    return rewrite_call(pattern, rewrite, func)


def normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Inference-only, batch-norm-folded form shared by both frontends (what
    :func:`import_model` returns for a frontend's module; benchmarks call it on their own).
    Transcendental ops stay exact here: fast math is a lowering step
    (:func:`compiler.lowering.pipeline.for_target`), after the convolution layout."""
    mod = fold_constants(mod)
    mod = canonicalize(mod)
    for gvar, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gvar] = _squeeze_axes_non_negative(func)
    return tvm.ir.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.FoldConstant(),
        ]
    )(mod)


#: ``Constant`` attributes other than ``value`` and the tensor each one means (ONNX spec).
_CONSTANT_ATTRIBUTES = {
    "value_float": (onnx.TensorProto.FLOAT, False),
    "value_floats": (onnx.TensorProto.FLOAT, True),
    "value_int": (onnx.TensorProto.INT64, False),
    "value_ints": (onnx.TensorProto.INT64, True),
}


def constant_values_as_tensors(model: onnx.ModelProto) -> int:
    """Rewrite, in place, each ``Constant`` node given by ``value_float(s)`` / ``value_int(s)``
    into the same constant given by ``value`` (a tensor), the only form TVM's ONNX importer
    reads ("no value in Constant"; torch's dynamo exporter writes ``value_ints`` for the shapes
    of decoders' reshapes). The model means the same; returns how many nodes were rewritten."""
    rewritten = 0
    for node in _all_onnx_nodes(model.graph):
        if node.op_type != "Constant" or node.domain not in _ONNX_DEFAULT_DOMAINS:
            continue
        if len(node.attribute) != 1 or node.attribute[0].name not in _CONSTANT_ATTRIBUTES:
            continue
        attribute = node.attribute[0]
        dtype, is_list = _CONSTANT_ATTRIBUTES[attribute.name]
        values = onnx.helper.get_attribute_value(attribute)
        tensor = onnx.helper.make_tensor(
            "value", dtype, [len(values)] if is_list else [], list(values) if is_list else [values]
        )
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("value", tensor))
        rewritten += 1
    return rewritten


def _import_onnx(model: LoadedModel) -> tvm.IRModule:
    missing = unsupported_onnx_ops(model.source)
    if missing:
        raise UnsupportedOperatorsError(missing, "ONNX")
    constant_values_as_tensors(model.source)
    shape_dict = {spec.name: list(spec.shape) for spec in model.inputs}
    dtype_dict = {spec.name: spec.dtype for spec in model.inputs}
    from tvm.relax.frontend.onnx import from_onnx  # noqa: PLC0415 - a frontend is imported only for its format

    return from_onnx(
        model.source, shape_dict=shape_dict, dtype_dict=dtype_dict, keep_params_in_input=False
    )


def _translate_pt2(model: LoadedModel) -> tvm.IRModule:
    """The program's Relax module as TVM translates it, symbolic dimensions still symbolic."""
    from compiler.frontends.pt2_ops import translate  # noqa: PLC0415 - the torch frontend, for .pt2 only
    from compiler.llm.state import classify_state, decompose, lift_state  # noqa: PLC0415 - torch, .pt2 only

    # Checked before torch decomposes anything, and again on what TVM translates (the
    # decomposition it would run itself): compiler.frontends.pt2_ops.
    missing = unsupported_torch_ops(model.source)
    if missing:
        raise UnsupportedOperatorsError(missing, "torch.export")
    program = decompose(model.source, keep_attention=bool(model.state))
    state, _ = classify_state(program)  # refuses what it cannot keep; the rest is dropped
    missing = unsupported_torch_ops(program, decomposed=True)
    if missing:
        raise UnsupportedOperatorsError(missing, "torch.export")
    return translate(lift_state(program, state), frozenset(s.name for s in state))


def _bind_symbols(mod: tvm.IRModule, model: LoadedModel) -> tvm.IRModule:
    if model.symbol_values:
        mod = relax.transform.BindSymbolicVars(dict(model.symbol_values), "main")(mod)
        mod["main"] = _strided_slices_simplified(mod["main"])
    return mod


def _import_pt2(model: LoadedModel) -> tvm.IRModule:
    """A program with symbolic dimensions bound by ``model`` is exported again at its static
    shapes when torch can (:func:`compiler.frontends.pt2_loader.specialize_program`: the same tasks
    as a static export), else translated symbolically and bound in Relax. A stateful decoder's
    attention then takes its prefill form where its chunk is long enough
    (:func:`compiler.llm.attention.prefill_scores`), and one that keeps its last position's
    logits (``model.last_logits``) is cut to them (:mod:`compiler.llm.last_logits`)."""
    mod = _import_static_pt2(model)
    if model.state:  # a decoder, its shapes bound: the prefill form of attention, the LM head
        from compiler.llm.attention import prefill_scores  # noqa: PLC0415 - decoders only
        from compiler.llm.last_logits import last_position_logits  # noqa: PLC0415

        for gvar, func in list(mod.functions_items()):
            if isinstance(func, relax.Function):
                func = prefill_scores(func)
                mod[gvar] = last_position_logits(func)[0] if model.last_logits else func
    return mod


def _import_static_pt2(model: LoadedModel) -> tvm.IRModule:
    if model.symbol_values:
        from compiler.frontends.pt2_loader import specialize_program  # noqa: PLC0415 - torch, .pt2 only

        missing = unsupported_torch_ops(model.source)  # checked before torch traces anything
        if missing:
            raise UnsupportedOperatorsError(missing, "torch.export")
        static = specialize_program(model.source, model.inputs)
        if static is not None:
            return _translate_pt2(replace(model, source=static, symbol_values=()))
    return _bind_symbols(_translate_pt2(model), model)


def _guarded(model: LoadedModel, importer) -> tvm.IRModule:
    try:
        return importer()
    except ModelError:  # already a refusal with its own code (unsupported operators, ...)
        raise
    except (tvm.error.OpNotImplemented, NotImplementedError, AssertionError, ValueError) as err:
        raise ModelError(
            "import_failed", f"TVM could not import the {model.format} model: {err}"
        ) from None


def _import_buckets(model: LoadedModel) -> tvm.IRModule:
    """One normalized module per bucket, merged
    (:func:`compiler.shapes.bucket_module.merge_buckets`); each bucket is imported as the static
    model it is (a ``.pt2``: :func:`_import_pt2`)."""
    from compiler.shapes.bucket_module import merge_buckets  # noqa: PLC0415 - bucketed models only
    from compiler.weights.external import share_constants  # noqa: PLC0415 - bucketed models only

    importer = _import_onnx if model.format == "onnx" else _import_pt2
    modules = []
    pool: dict[str, object] = {}  # one copy of the weights the buckets share
    for bucket in model.buckets:
        imported = _guarded(bucket.model, lambda b=bucket: importer(b.model))
        modules.append((bucket.function, share_constants(normalize(imported), pool)))
    return merge_buckets(modules)


def import_model(model: LoadedModel) -> tvm.IRModule:
    """Translate ``model`` to a normalized Relax module (see module docstring). A bucketed or
    multi-program model (``model.buckets``) gives one module with one public function per
    bucket or program, named ``Bucket.function``, and no ``main``."""
    if model.buckets:
        return _import_buckets(model)
    importer = _import_onnx if model.format == "onnx" else _import_pt2
    return normalize(_guarded(model, lambda: importer(model)))
