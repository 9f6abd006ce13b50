"""Import a validated model into TVM Relax.

``import_model`` promises a Relax ``IRModule`` with one ``main`` function whose parameters are the
user inputs (weights bound as constants), static shapes, and inference-only ops (batch-norm folded
into the preceding convolution where it follows one, so ONNX and ``.pt2`` imports of one network
produce the same convolution and matmul workloads), and float32 ``erf`` / ``exp`` / ``tanh`` /
``softmax`` / GELU as TVM's vectorizable approximations (:mod:`compiler.fast_math`). Operators
the importer does not support raise one :class:`UnsupportedOperatorsError` that lists all of them.
"""
from __future__ import annotations

import onnx
import tvm
from tvm import relax

from compiler.canonicalize import canonicalize
from compiler.errors import ModelError, UnsupportedOperatorsError
from compiler.fast_math import fast_math
from compiler.model_spec import LoadedModel

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


def unsupported_torch_ops(program) -> list[str]:
    """Every ``call_function`` target the Relax ``ExportedProgram`` importer lacks."""
    from tvm.relax.frontend.torch.exported_program_translator import (  # noqa: PLC0415 - a frontend is imported only for its format
        ExportedProgramImporter,
    )

    supported = ExportedProgramImporter().convert_map
    return sorted(
        {
            node.target.__name__
            for node in program.graph.nodes
            if node.op == "call_function" and node.target.__name__ not in supported
        }
    )


def normalize(mod: tvm.IRModule) -> tvm.IRModule:
    """Inference-only, batch-norm-folded form shared by both frontends, fast math applied (what
    :func:`import_model` returns for a frontend's module; benchmarks call it on their own)."""
    mod = relax.transform.FoldConstant()(mod)
    mod = canonicalize(mod)
    mod = tvm.ir.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.transform.FoldConstant(),
        ]
    )(mod)
    return fast_math(mod)


def _import_onnx(model: LoadedModel) -> tvm.IRModule:
    missing = unsupported_onnx_ops(model.source)
    if missing:
        raise UnsupportedOperatorsError(missing, "ONNX")
    shape_dict = {spec.name: list(spec.shape) for spec in model.inputs}
    dtype_dict = {spec.name: spec.dtype for spec in model.inputs}
    from tvm.relax.frontend.onnx import from_onnx  # noqa: PLC0415 - a frontend is imported only for its format

    return from_onnx(
        model.source, shape_dict=shape_dict, dtype_dict=dtype_dict, keep_params_in_input=False
    )


def _import_pt2(model: LoadedModel) -> tvm.IRModule:
    from tvm.relax.frontend.torch import from_exported_program  # noqa: PLC0415 - a frontend is imported only for its format

    missing = unsupported_torch_ops(model.source)
    if missing:
        raise UnsupportedOperatorsError(missing, "torch.export")
    mod = from_exported_program(model.source, keep_params_as_input=False)
    if model.symbol_values:
        mod = relax.transform.BindSymbolicVars(dict(model.symbol_values), "main")(mod)
    return mod


def import_model(model: LoadedModel) -> tvm.IRModule:
    """Translate ``model`` to a normalized Relax module (see module docstring)."""
    importer = _import_onnx if model.format == "onnx" else _import_pt2
    try:
        mod = importer(model)
    except UnsupportedOperatorsError:
        raise
    except (tvm.error.OpNotImplemented, NotImplementedError, AssertionError, ValueError) as err:
        raise ModelError(
            "import_failed", f"TVM could not import the {model.format} model: {err}"
        ) from None
    return normalize(mod)
