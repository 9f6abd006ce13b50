"""Which operators a ``.pt2`` program may use, and how it is handed to TVM's torch frontend.

TVM's ``from_exported_program`` does not translate the program it is given: by default it first
runs ``ExportedProgram.run_decompositions()`` (torch's default decomposition table, down to core
ATen) and translates that. So an operator of the uploaded graph needs a converter only if it
survives the decomposition; ``aten.diff`` (the packed-sequence check of every ``transformers``
attention mask) and ``aten.to.device`` (the rotary embedding's ``inv_freq.to(x.device)``) are
rewritten into ``slice``/``sub``/``cat`` and ``_to_copy``, which TVM converts. TuneHub checked
the graph before decomposition against the converter table, and so refused every
``transformers`` decoder for two operators TVM never sees.

What the decoders did need:

- their attention mask and position ids are built from ``arange``: constants, at a static shape,
  which reached Relax as ~40 operators that ``FoldConstant`` compiled one by one (3–4 s of a tiny
  decoder's import) or could not fold at all (``arange``, ``cumsum``, ``index_tensor``: small
  tasks recomputed the mask on every call). :func:`translate` has torch compute every value that
  depends on no placeholder (:func:`input_free_values`) and hands it to TVM as a constant;
- TVM converts two operators of those masks wrongly, which matters once a mask depends on an
  input (a padding mask) or a buffer; TuneHub's converters (:data:`CONVERTERS`) replace TVM's:
  ``cumsum`` of a boolean or integer tensor is ``int64`` in torch, TVM's keeps the input dtype (a
  boolean running sum: wrong, and it does not compile, ``t.MatchesCode(kDLFloat)``);
  ``bitwise_and``/``or``/``xor``/``not`` of boolean tensors (``&``, ``|``, ``^``, ``~`` on masks)
  become ``logical_*``: TVM's bitwise ops on ``bool`` fail LLVM's module verification;
  ``cat`` skips a 1-D empty operand as torch does (the first keys a ``DynamicCache`` stores:
  a prefill that returns its cache, ``examples/kv_decoder.py``), where TVM refused the ranks;
  ``index_put`` at one position (``cache[:, :, position] = new``, what a ``StaticCache``'s
  ``index_copy_`` becomes in a one-token decode) is an element-wise ``where``: TVM's converter
  refused it.

:func:`unsupported_ops` is the check, at two points of the import
(:mod:`compiler.frontends.importer`):

1. on the uploaded graph, before torch decomposes anything: an operator must have a converter
   (TVM's or TuneHub's) or be in :data:`DECOMPOSED_OPS`, a short list of pure tensor-math
   operators (no side effects, no data-dependent output shape, no I/O) that torch's default
   table rewrites into core ATen. Torch's decomposition code runs only on graphs of such known
   operators;
2. on the decomposed graph, the one TVM translates: every operator must have a converter (TVM's
   or one of :data:`CONVERTERS`).

Either way a program that fails is refused with one message listing every missing operator
(:class:`~compiler.errors.UnsupportedOperatorsError`). ``tests/compiler/test_decoder_import.py``
checks that each operator of :data:`DECOMPOSED_OPS` leaves no trace in the decomposed graph and
imports to the same values as torch, and that each converter matches torch.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import tvm
from torch import fx
from tvm import relax

__all__ = [
    "CONVERTERS",
    "DECOMPOSED_OPS",
    "in_torch_dtype",
    "input_free_values",
    "supported_ops",
    "translate",
    "unsupported_ops",
]

#: Operators (``OpOverload.__name__``) without a converter that torch's default
#: decomposition table rewrites into core ATen operators TVM converts. Each is pure tensor math.
DECOMPOSED_OPS: frozenset[str] = frozenset(
    {
        # x[..., 1:] - x[..., :-1] (with optional prepend/append: cat); transformers' masks
        "diff.default",
        # a dtype/device cast: _to_copy (TVM: astype, or nothing for a device-only change)
        "to.device",
        # where(cond, x, scalar): where.self with a scalar tensor; Gemma-2's and Bloom's masks
        "where.ScalarOther",
        # x.T: permute; Falcon's attention
        "numpy_T.default",
        # repeat_interleave(x, n, dim): unsqueeze/expand/reshape; GPT-J's rotary embedding
        "repeat_interleave.self_int",
        # x /= y on an intermediate: functionalized to div.Tensor; Mixtral's top-k router weights
        "div_.Tensor",
        # x.index_copy_(dim, positions, new) on an intermediate: functionalized to index_put
        # (x[:, :, positions] = new); transformers' StaticCache update (examples/kv_decoder.py)
        "index_copy_.default",
    }
)


def _dtype(expr: relax.Expr) -> str:
    return str(expr.ty.dtype)


def _cumsum(node: Any, importer: Any) -> relax.Expr:
    """``aten.cumsum(x, dim, dtype=None)`` with torch's dtype rule: an integral or boolean ``x``
    sums to ``int64`` unless ``dtype`` says otherwise."""
    x = importer.env[node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs["dim"]
    dtype = node.kwargs.get("dtype")
    if dtype is not None:
        out = str(dtype).removeprefix("torch.")
    elif _dtype(x) == "bool" or _dtype(x).startswith(("int", "uint")):
        out = "int64"
    else:
        out = _dtype(x)
    if _dtype(x) != out:
        x = importer.block_builder.emit(relax.op.astype(x, out))
    return importer.block_builder.emit(relax.op.cumsum(x, dim))


def _bitwise(
    bitwise: Callable[..., relax.Expr], logical: Callable[..., relax.Expr]
) -> Callable[[Any, Any], relax.Expr]:
    """A converter for a ``bitwise_*.Tensor`` (or ``bitwise_not``) overload: ``logical`` when
    every operand is boolean, else ``bitwise`` (TVM's own conversion of these overloads)."""

    def convert(node: Any, importer: Any) -> relax.Expr:
        operands = list(importer.retrieve_args(node))
        tensors = [x for x in operands if isinstance(x, relax.Expr)]
        if not tensors:
            raise ValueError(f"{node.target.__name__} without a tensor operand")
        dtype = _dtype(tensors[0])
        operands = [x if isinstance(x, relax.Expr) else relax.const(x, dtype) for x in operands]
        op = logical if all(_dtype(x) == "bool" for x in operands) else bitwise
        return importer.block_builder.emit(op(*operands))

    return convert


def _cat(node: Any, importer: Any) -> relax.Expr:
    """``aten.cat(tensors, dim=0)`` with torch's legacy rule for empty inputs: a 1-D tensor of
    size 0 is skipped whatever the others' rank (``transformers``' ``DynamicCache`` starts each
    layer as ``torch.tensor([])`` and concatenates the first keys onto it, so every prefill that
    fills a cache has ``cat([tensor([]), keys], -2)``; TVM's converter refuses the mixed ranks)."""
    tensors = [importer.env[arg] for arg in node.args[0]]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)

    def legacy_empty(x: relax.Expr) -> bool:
        shape = importer.shape_of(x)
        return (
            shape is not None
            and len(shape) == 1
            and isinstance(shape[0], tvm.tirx.IntImm)
            and int(shape[0]) == 0
        )

    kept = [x for x in tensors if not legacy_empty(x)] or tensors[:1]
    if len(kept) == 1:
        return kept[0]
    return importer.block_builder.emit(relax.op.concat(kept, axis=dim))


def _index_put(node: Any, importer: Any) -> relax.Expr:
    """``aten.index_put(x, indices, values, accumulate=False)`` whose ``indices`` are one
    1-element tensor at some axis, ``None`` before it and nothing or ``None`` after
    (``x[:, :, position] = values``: a static KV cache written at the decoded token's position,
    what ``StaticCache``'s ``index_copy_`` becomes) is ``where(arange == position, values, x)``:
    element-wise, so it fuses and is scheduled like any injective task. TVM's converter needs
    an index per axis and broadcasts the ``None`` axes it fills in wrongly (``IndexPut requires
    the number of index tensors (3) to match ... (4)``), and a ``scatter_elements`` lowers to
    an opaque loop nest no schedule rule takes. A negative position counts from the end, as in
    torch. Any other ``index_put`` goes to TVM's converter."""
    indices = node.args[1]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    given = [axis for axis, index in enumerate(indices) if index is not None]
    x = importer.env[node.args[0]]
    position = importer.env[indices[given[0]]] if len(given) == 1 else None
    x_shape = importer.shape_of(x)
    position_shape = importer.shape_of(position) if position is not None else None
    if (
        accumulate
        or position is None
        or x_shape is None
        or position_shape is None
        or not all(isinstance(d, tvm.tirx.IntImm) for d in (*x_shape, *position_shape))
        or [int(d) for d in position_shape] != [1]
        or _dtype(position) not in ("int32", "int64")
    ):
        return importer._index_put(node)  # noqa: SLF001 - TVM's converter for the other cases
    axis, rank = given[0], len(x_shape)
    builder = importer.block_builder
    extent = x_shape[axis]
    along = [1] * axis + [extent] + [1] * (rank - axis - 1)
    position = builder.emit(relax.op.astype(position, "int64"))
    position = builder.emit(
        relax.op.where(
            relax.op.less(position, relax.const(0, "int64")),
            relax.op.add(position, relax.const(int(extent), "int64")),
            position,
        )
    )
    steps = builder.emit(
        relax.op.reshape(
            relax.op.arange(relax.prim_value(0), extent, relax.prim_value(1), "int64"), along
        )
    )
    chosen = builder.emit(relax.op.equal(steps, relax.op.reshape(position, [1] * rank)))
    values = importer.env[node.args[2]]
    if _dtype(values) != _dtype(x):
        values = builder.emit(relax.op.astype(values, _dtype(x)))
    block = [*x_shape]
    block[axis] = 1
    values = builder.emit(relax.op.broadcast_to(values, block))
    return builder.emit(relax.op.where(chosen, values, x))


#: TuneHub's converters (``custom_convert_map`` of ``from_exported_program``), by operator.
CONVERTERS: dict[str, Callable[[Any, Any], relax.Expr]] = {
    "cat.default": _cat,
    "cumsum.default": _cumsum,
    "index_put.default": _index_put,
    "bitwise_and.Tensor": _bitwise(relax.op.bitwise_and, relax.op.logical_and),
    "bitwise_or.Tensor": _bitwise(relax.op.bitwise_or, relax.op.logical_or),
    "bitwise_xor.Tensor": _bitwise(relax.op.bitwise_xor, relax.op.logical_xor),
    "bitwise_not.default": _bitwise(relax.op.bitwise_not, relax.op.logical_not),
}


def supported_ops() -> frozenset[str]:
    """The operators with a converter: TVM's ``ExportedProgram`` translator's (its
    ``convert_map``) and :data:`CONVERTERS`."""
    from tvm.relax.frontend.torch.exported_program_translator import (  # noqa: PLC0415 - the torch frontend, for .pt2 files only
        ExportedProgramImporter,
    )

    return frozenset(ExportedProgramImporter().convert_map) | frozenset(CONVERTERS)


def unsupported_ops(program: Any, *, decomposed: bool) -> list[str]:
    """Every ``call_function`` target of ``program`` TuneHub cannot import, sorted.

    ``decomposed=False``: the uploaded graph (allowed: :func:`supported_ops` and
    :data:`DECOMPOSED_OPS`); ``decomposed=True``: the graph after ``run_decompositions()``
    (allowed: :func:`supported_ops` only).
    """
    allowed = supported_ops() if decomposed else supported_ops() | DECOMPOSED_OPS
    return sorted(
        {
            node.target.__name__
            for node in program.graph.nodes
            if node.op == "call_function" and node.target.__name__ not in allowed
        }
    )


_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float16,
     torch.float32, torch.float64}
)  # fmt: skip


def input_free_values(program: Any) -> dict[fx.Node, torch.Tensor]:
    """The value of every graph node that depends on no placeholder (no user input, parameter,
    buffer or constant): ``arange``, ``full`` and what is computed from them alone, like the
    attention mask of a static shape and the position ids. Computed by torch on the operators
    of the graph (``program`` has passed :func:`unsupported_ops`: tensor math only); tensors
    only; a node torch fails to compute is left to TVM. Their sizes are bounded before anything
    runs (:func:`compiler.frontends.pt2_loader.check_pt2_graph_limits`; running out of memory is
    ``out_of_memory``, :func:`compiler.limits.constant_limits.bounded_folding`)."""
    values: dict[Any, Any] = {}
    with torch.no_grad():
        for node in program.graph.nodes:
            if node.op != "call_function" or any(arg not in values for arg in node.all_input_nodes):
                continue
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
            try:
                values[node] = node.target(*args, **kwargs)
            except MemoryError:
                raise
            except Exception:  # noqa: BLE001 - torch refused it: TVM translates the node itself
                continue
    return {
        node: value
        for node, value in values.items()
        if isinstance(value, torch.Tensor) and value.dtype in _NUMPY_DTYPES
    }


def without_constant_inputs(program: Any) -> Any:
    """``program`` without placeholders for the constant arguments it was exported with
    (``use_cache=True``, ``None``: ``ConstantArgument`` user inputs, which TVM's translator takes
    for tensors): each use is replaced by its value. Unchanged when it has none."""
    from torch.export.graph_signature import ConstantArgument, ExportGraphSignature  # noqa: PLC0415

    signature = program.graph_signature
    constants = [s for s in signature.input_specs if isinstance(s.arg, ConstantArgument)]
    if not constants:
        return program
    module = program.graph_module
    placeholders = {n.name: n for n in module.graph.nodes if n.op == "placeholder"}
    for spec in constants:
        node = placeholders.get(spec.arg.name)
        if node is None:
            continue
        for user in list(node.users):
            user.args, user.kwargs = fx.node.map_aggregate(
                (user.args, user.kwargs), lambda a, n=node, v=spec.arg.value: v if a is n else a
            )
        module.graph.erase_node(node)
    module.recompile()
    kept = [s for s in signature.input_specs if not isinstance(s.arg, ConstantArgument)]
    return program._update(module, ExportGraphSignature(kept, list(signature.output_specs)))  # noqa: SLF001


def in_torch_dtype(node: Any, expr: relax.Expr, importer: Any) -> relax.Expr:
    """``expr`` (TVM's conversion of ``node``) cast to the floating dtype torch gives ``node``
    where the two differ. TVM's converters of ``conv1d``/``conv2d``/``conv3d`` (and their
    transposes) and ``addmm`` compute in ``out_dtype="float32"`` whatever their inputs: a float16
    or bfloat16 program then met a float32 tensor at its next operator (a batch norm refused the
    mix). The float32 result cast back is what torch's half-precision kernels compute too (they
    accumulate in float32)."""
    val = node.meta.get("val") if hasattr(node, "meta") else None
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
        return expr
    info = getattr(expr, "ty", None)
    if not isinstance(info, relax.TensorType):
        return expr
    want = str(val.dtype).removeprefix("torch.")
    have = str(info.dtype)
    if have == want or not have.startswith(("float", "bfloat")):
        return expr
    return importer.block_builder.emit(relax.op.astype(expr, want))


#: TVM's converters that compute in float32 whatever their inputs' dtype, and the argument that
#: holds their bias (added to that float32 result): a half-precision bias is cast to float32
#: first (:func:`_float32_bias`), the result cast back by :func:`in_torch_dtype`.
FLOAT32_RESULT_OPS: dict[str, int] = {"addmm.default": 0, "convolution.default": 2}


def _float32_bias(
    convert: Callable[[Any], relax.Expr], bias_index: int, importer: Any
) -> Callable[[Any], relax.Expr]:
    """``convert`` (one of :data:`FLOAT32_RESULT_OPS`) seeing its half-precision bias as
    float32, so that it adds two float32 tensors (TVM refuses mixed dtypes)."""

    def run(node: Any) -> relax.Expr:
        bias_node = node.args[bias_index] if len(node.args) > bias_index else None
        bias = importer.env.get(bias_node) if isinstance(bias_node, fx.Node) else None
        if bias is None or _dtype(bias) not in ("float16", "bfloat16"):
            return convert(node)
        importer.env[bias_node] = importer.block_builder.emit(relax.op.astype(bias, "float32"))
        try:
            return convert(node)
        finally:
            importer.env[bias_node] = bias

    return run


def torch_tensor_to_tvm(tensor: Any) -> tvm.runtime.Tensor:
    """A weight or buffer of a program as a TVM tensor: through DLPack, on a dense contiguous
    copy; a bfloat16 tensor some torch builds refuse to share (2.11 on the H200 machine) goes
    through its bits, since ``Tensor.numpy()`` (TVM's fallback) has no bfloat16. Replaces the
    importer's ``_convert_pytorch_tensor_to_tvm``, which would raise ``TypeError`` there."""
    dense = tensor.to_dense() if tensor.layout != torch.strided else tensor
    dense = dense.detach().contiguous()
    try:
        return tvm.runtime.from_dlpack(dense)
    except (RuntimeError, BufferError):
        if dense.dtype == torch.bfloat16:
            import ml_dtypes  # noqa: PLC0415 - TVM's own dependency

            bits = dense.view(torch.int16).numpy()
            return tvm.runtime.tensor(bits.view(ml_dtypes.bfloat16))
        return tvm.runtime.tensor(dense.numpy())


def translate(program: Any, state: frozenset[str] = frozenset()) -> Any:
    """TVM's translation of the decomposed ``program`` (``from_exported_program``, with
    :data:`CONVERTERS` in place of TVM's converters of those operators), every
    :func:`input_free_values` node a constant of torch's value (see the module docstring).
    ``state``: the placeholders of the program's state inputs (:func:`compiler.llm.state.
    lift_state`), whose ``index_put`` updates are in-place writes
    (:func:`compiler.llm.cache_write.convert_state_write`)."""
    from tvm.relax.frontend.torch.exported_program_translator import (  # noqa: PLC0415 - the torch frontend, for .pt2 files only
        ExportedProgramImporter,
    )

    program = without_constant_inputs(program)
    constants = input_free_values(program)
    importer = ExportedProgramImporter()
    importer._convert_pytorch_tensor_to_tvm = torch_tensor_to_tvm  # noqa: SLF001 - see there

    def folded(convert: Callable[[Any], relax.Expr]) -> Callable[[Any], relax.Expr]:
        def run(node: Any) -> relax.Expr:
            value = constants.get(node)
            if value is None:
                return in_torch_dtype(node, convert(node), importer)
            return relax.const(np.ascontiguousarray(value.numpy()))

        return run

    table = dict(importer.convert_map)
    for name, bias_index in FLOAT32_RESULT_OPS.items():
        table[name] = _float32_bias(table[name], bias_index, importer)
    for name, convert in CONVERTERS.items():
        table[name] = functools.partial(convert, importer=importer)
    if state:
        from compiler.llm.cache_write import convert_state_write  # noqa: PLC0415

        others = table["index_put.default"]

        def index_put(node: Any) -> relax.Expr:
            if getattr(node.args[0], "name", None) in state:
                return convert_state_write(node, importer)
            return others(node)

        table["index_put.default"] = index_put
        from compiler.llm.attention import SDPA, convert_sdpa  # noqa: PLC0415

        attention = table[SDPA]
        table[SDPA] = lambda node: convert_sdpa(node, importer, attention)
    importer.convert_map = {name: folded(convert) for name, convert in table.items()}
    return importer.from_exported_program(
        program,
        keep_params_as_input=False,
        unwrap_unit_return_tuple=False,
        no_bind_return_tuple=False,
        custom_convert_map=None,
    )
