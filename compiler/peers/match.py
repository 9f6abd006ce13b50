"""Finding a task's library peer: the anchor a library call can compute, and its variants.

:func:`find_peer` reads a fused task (one PrimFunc, as :func:`compiler.partition.partition`
extracts it) and promises a :class:`PeerCall` when the task's anchor is an operator the peer
library implements, or ``None``:

- ``gemm``: a ``matmul`` block ``C[..., i, j] += A[..., i, k] * B[(...,) k, j]`` (or
  ``B[(...,) j, k]``), float32, ``A`` and ``B`` parameters of the task, ``B`` 2-D (a weight) or
  with ``C``'s batch dimensions. With a 2-D ``B`` (a weight) it has the variants of
  :func:`~compiler.peers.algorithms.gemm_algorithms`: ``packed`` (the shim's GEMM on the weight
  packed once), OpenBLAS (``""``: ``sgemm``, ``sgemv`` for one row) and, where the library has
  oneDNN, ``onednn`` (its matmul, one column block a worker);
  :func:`~compiler.peers.algorithms.default_gemm_algorithm` picks one by the rows. A batched
  ``B`` has OpenBLAS only. With ``A`` and ``B`` in bfloat16 it has
  the shim's bfloat16 GEMM (float32 accumulation, any ``B``), ``bf16`` for a bfloat16 ``C``,
  ``bf16_f32`` for a float32 one (its epilogue fused as for float32), and over a weight of
  enough rows oneDNN's bfloat16 matmul (``bf16_onednn`` / ``bf16_f32_onednn``, the default
  there: :func:`~compiler.peers.algorithms.default_bf16_algorithm`);
- ``conv2d_nhwc``: a ``conv2d_nhwc`` block ``Y[n, y, x, f] += P[n, y*sh + ry*dh, x*sw + rx*dw,
  c] * W[ry, rx, c, f]`` (groups 1, float32), where ``P`` is a parameter or the zero-padding
  of one (the ``pad_temp`` block before it). Its ``algorithm`` is one of
  :data:`~compiler.peers.calls.CONV_ALGORITHMS`: ``packed`` (im2col + the shim's packed-weight
  GEMM) or ``im2col`` (im2col + OpenBLAS sgemm), for any convolution, or, for a 3x3 stride-1
  undilated one, Winograd ``winograd_f2`` / ``winograd_f4`` (F(2x2, 3x3), F(4x4, 3x3)), and
  ``onednn``; :func:`find_peer` picks one by :func:`default_conv_algorithm` and
  :func:`peer_variants` lists them all, so that a caller can measure each;
- ``depthwise_conv2d_nhwc``: a ``group_conv2d_nhwc`` block with one input channel and one
  filter per group, ``Y[n, y, x, f] += P[n, y*sh + ry*dh, x*sw + rx*dw, f + rc] * W[ry, rx, rc,
  f]`` (``rc`` of extent 1: the weight is ``[KH, KW, 1, C]``), float32, input as for
  ``conv2d_nhwc``: the shim's depthwise kernel (vectors along the channels, ``algorithm``
  ``""``) and, where the library has oneDNN, oneDNN's (``onednn``);
  :func:`default_depthwise_algorithm` picks one.

Where the peer library was built against oneDNN
(:func:`compiler.peers.library.onednn_available`), every convolution
also has the ``onednn`` variant: oneDNN's primitive on slabs of output rows, one a TVM worker
(``compiler/peers/shim_onednn.inc``).

Every other block after the anchor is its epilogue (bias, residual add, activation), and must be
elementwise (no reduction). The anchor must be the task's first block (after the padding it
absorbs). On the CPU the call also does the epilogue's first blocks where they are a per-channel
bias add, an elementwise add of a parameter (a residual) and a clamp (``max``/``min`` with
constants: ReLU, ReLU6), in that order (:func:`compiler.peers.epilogue._fuse_epilogue`); it
then writes the last of those blocks' buffer, and only the rest of the epilogue stays TIR.

:func:`compiler.peers.rewrite.peer_function` then rewrites the task to make the call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import tvm
from tvm import ir, tirx

from compiler.peers import epilogue as peer_epilogue
from compiler.peers.algorithms import (
    _ConvShape,
    bf16_algorithms,
    conv_algorithms,
    default_bf16_algorithm,
    default_conv_algorithm,
    default_depthwise_algorithm,
    default_gemm_algorithm,
    depthwise_algorithms,
    gemm_algorithms,
)
from compiler.peers.calls import CUDA_DTYPES, CUDA_FOLDED_CASTS, PeerCall
from compiler.peers.epilogue import _fuse_epilogue
from compiler.peers.patterns import (
    _buffers_by_name,
    _coefficients,
    _float32,
    _is_vars,
    _Load,
    _reduction_parts,
    _Stage,
    _stages,
    buffer_loads,
)


def _dtypes_supported(device: str, store: Any, a: Any, b: Any) -> bool:
    if device == "cuda":
        pair = (str(a.source.dtype), str(store.buffer.dtype))
        return str(b.source.dtype) == pair[0] and pair in CUDA_DTYPES
    if _bfloat16(a.source, b.source) and str(store.buffer.dtype) in ("bfloat16", "float32"):
        return True  # the loads, or their casts to float32 (_reduction_parts checked them)
    if not _float32(store.buffer, a.source, b.source):
        return False
    return isinstance(store.value.b.a, _Load) and isinstance(store.value.b.b, _Load)


def _bfloat16(*buffers: Any) -> bool:
    return all(str(b.dtype) == "bfloat16" for b in buffers)


def _gemm(block: Any, params: set[str], device: str = "cpu") -> PeerCall | None:
    parts = _reduction_parts(block)
    if parts is None or not str(block.name_hint).startswith("matmul"):
        return None
    store, a, b, spatial, reduce = parts
    if len(reduce) != 1 or len(spatial) < 2 or not _dtypes_supported(device, store, a, b):
        return None
    (k,), batch, i, j = reduce, spatial[:-2], spatial[-2], spatial[-1]
    if not _is_vars(a.indices, [*batch, i, k]):
        return None
    if _is_vars(b.indices, [k, j]) or _is_vars(b.indices, [*batch, k, j]):
        trans_b = 0
    elif _is_vars(b.indices, [j, k]) or _is_vars(b.indices, [*batch, j, k]):
        trans_b = 1
    else:
        return None
    if not {a.source.name, b.source.name} <= params:
        return None
    config: tuple[tuple[str, int], ...] = (("trans_b", trans_b),)
    if device == "cuda":
        config += (("dtype", CUDA_DTYPES[(str(a.source.dtype), str(store.buffer.dtype))]),)
        return PeerCall("gemm", (a.source.name, b.source.name), store.buffer.name, config, device)
    rows = 1
    for d in store.buffer.shape[:-1]:
        rows *= int(d)
    if _bfloat16(a.source):  # the shim's bfloat16 GEMM, or oneDNN's over a weight
        base = "bf16" if _bfloat16(store.buffer) else "bf16_f32"
        algorithm = default_bf16_algorithm(base, rows, len(b.source.shape) == 2)
    else:
        algorithm = default_gemm_algorithm(rows) if len(b.source.shape) == 2 else ""
    return PeerCall(
        "gemm", (a.source.name, b.source.name), store.buffer.name, config, device, algorithm
    )


def _pad_source(stage: _Stage, padded: Any, layout: str = "NHWC") -> tuple[str, int, int] | None:
    """``(input name, pad top, pad left)`` when ``stage`` zero-pads an input in ``layout``
    (``NHWC`` or ``NCHW``) into ``padded``."""
    store = stage.block.body
    if not (isinstance(store, tirx.BufferStore) and store.buffer.same_as(padded)):
        return None
    loads = buffer_loads(store.value)
    if len(loads) != 1 or len(loads[0].indices) != 4:
        return None
    variables = [iv.var for iv in stage.block.iter_vars]
    offsets = []
    for axis in range(4):
        coeffs = _coefficients(loads[0].indices[axis], [variables[axis]])
        if coeffs is None or coeffs[0] != 1:
            return None
        offsets.append(-coeffs[1])
    rows = layout.index("H")
    if any(offsets[axis] for axis in range(4) if axis not in (rows, rows + 1)):
        return None
    return loads[0].source.name, offsets[rows], offsets[rows + 1]


@dataclass(frozen=True)
class _ConvMatch:
    """A convolution anchor read from a task: its stage index (0, or 1 after its padding), the
    output store, the weight load, the (unpadded) input buffer and its name, the zero padding
    before the top row and left column, and the ``[stride, dilation, 0]`` coefficients of the
    row and column indices."""

    index: int
    store: Any
    weight: Any
    source: Any
    top: int
    left: int
    rows: list[int]
    cols: list[int]

    def config(self) -> tuple[tuple[str, int], ...]:
        return (
            ("stride_h", self.rows[0]),
            ("stride_w", self.cols[0]),
            ("pad_top", self.top),
            ("pad_left", self.left),
            ("dilation_h", self.rows[1]),
            ("dilation_w", self.cols[1]),
        )


def _match_conv(
    stages: list[_Stage],
    params: set[str],
    layout: str,
    depthwise: bool = False,
    half_inputs: bool = False,
) -> _ConvMatch | None:
    """The groups-1 float32 convolution anchor of ``stages`` in ``layout`` (``NHWC``: block
    ``conv2d_nhwc``, ``Y[n, y, x, f] += P[n, y*sh + ry*dh, x*sw + rx*dw, c] * W[ry, rx, c, f]``;
    ``NCHW``: block ``conv2d_nchw``, ``Y[n, f, y, x] += P[n, c, ...] * W[f, c, ry, rx]``), whose
    input is a parameter or the zero padding of one, and whose weight is a parameter. With
    ``depthwise`` (``NHWC`` only): the ``group_conv2d_nhwc`` block of a depthwise convolution
    instead (input channel ``f + rc``, weight ``[KH, KW, 1, C]``, as many outputs as inputs).
    With ``half_inputs``: a float16 input and weight accumulated into float32 instead (what a
    float16 program's convolution imports to, :func:`compiler.frontends.pt2_ops.in_torch_dtype`)."""
    prefix = "group_conv2d_nhwc" if depthwise else f"conv2d_{layout.lower()}"
    for index in (0, 1):
        if index < len(stages) and str(stages[index].block.name_hint).startswith(prefix):
            break
    else:
        return None
    parts = _reduction_parts(stages[index].block)
    if parts is None:
        return None
    store, data, weight, spatial, reduce = parts
    if (
        len(spatial) != 4
        or len(reduce) != 3
        or not _float32(store.buffer)
        or {str(data.source.dtype), str(weight.source.dtype)}
        != {"float16" if half_inputs else "float32"}
    ):
        return None
    if layout == "NHWC":
        (n, y, x, f), (ry, rx, rc) = spatial, reduce
        weight_vars, row_axis, batch_and_channel = [ry, rx, rc, f], 1, [0, 3]
    else:
        (n, f, y, x), (rc, ry, rx) = spatial, reduce
        weight_vars, row_axis, batch_and_channel = [f, rc, ry, rx], 2, [0, 1]
    if not (_is_vars(weight.indices, weight_vars) and weight.source.name in params):
        return None
    rows = _coefficients(data.indices[row_axis], [y, ry])
    cols = _coefficients(data.indices[row_axis + 1], [x, rx])
    if rows is None or cols is None or rows[2] or cols[2]:
        return None
    if depthwise:
        if (
            not _is_vars(data.indices[:1], [n])
            or _coefficients(data.indices[3], [f, rc]) != [1, 1, 0]
            or int(weight.source.shape[2]) != 1
            or int(store.buffer.shape[3]) != int(data.source.shape[3])
        ):
            return None
    elif not _is_vars([data.indices[i] for i in batch_and_channel], [n, rc]):
        return None
    if index == 0:
        source, top, left = data.source, 0, 0
    else:
        pad = _pad_source(stages[0], data.source, layout)
        if pad is None:
            return None
        source, top, left = stages[0].block.reads[0].source, pad[1], pad[2]
        if str(source.name) != pad[0]:
            return None
    if str(source.name) not in params:
        return None
    return _ConvMatch(index, store, weight, source, top, left, rows, cols)


def _conv2d(stages: list[_Stage], params: set[str]) -> tuple[PeerCall, int] | None:
    """The conv peer and the index of its anchor stage (0, or 1 after its padding)."""
    match = _match_conv(stages, params, "NHWC")
    if match is None:
        return None
    call = PeerCall(
        "conv2d_nhwc",
        (str(match.source.name), match.weight.source.name),
        match.store.buffer.name,
        match.config(),
        algorithm="im2col",
    )
    shape = _ConvShape.of(call, match.weight.source, match.store.buffer)
    return replace(call, algorithm=default_conv_algorithm(shape)), match.index


def _depthwise_conv2d(stages: list[_Stage], params: set[str]) -> tuple[PeerCall, int] | None:
    """The depthwise peer and the index of its anchor stage (0, or 1 after its padding)."""
    match = _match_conv(stages, params, "NHWC", depthwise=True)
    if match is None:
        return None
    call = PeerCall(
        "depthwise_conv2d_nhwc",
        (str(match.source.name), match.weight.source.name),
        match.store.buffer.name,
        match.config(),
    )
    shape = _ConvShape.of(call, match.weight.source, match.store.buffer)
    return replace(call, algorithm=default_depthwise_algorithm(shape)), match.index


def _conv2d_nchw(stages: list[_Stage], params: set[str]) -> tuple[PeerCall, int] | None:
    """The cuDNN peer of an NCHW convolution (a CUDA target's layout) and the index of the last
    stage it computes: groups 1, padding equal on both sides of each axis (cuDNN's); float32,
    or float16 accumulated in float32 whose next stage casts the result to float16 (cuDNN's
    half-precision convolution computes in float32 and writes float16: it computes both
    stages, :func:`_fold_conv_cast`)."""
    match = _match_conv(stages, params, "NCHW")
    half = match is None
    if half:
        match = _match_conv(stages, params, "NCHW", half_inputs=True)
    if match is None:
        return None
    h, w = (int(d) for d in match.source.shape[2:])
    kh, kw = (int(d) for d in match.weight.source.shape[2:])
    oh, ow = (int(d) for d in match.store.buffer.shape[2:])
    rows, cols = match.rows, match.cols
    if (h + 2 * match.top - rows[1] * (kh - 1) - 1) // rows[0] + 1 != oh or (
        w + 2 * match.left - cols[1] * (kw - 1) - 1
    ) // cols[0] + 1 != ow:
        return None  # padded more on one side than the other: not cuDNN's convolution
    call = PeerCall(
        "conv2d_nchw",
        (str(match.source.name), match.weight.source.name),
        match.store.buffer.name,
        (*match.config(), ("dtype", CUDA_DTYPES[("float16" if half else "float32",) * 2])),
        "cuda",
    )
    return _fold_conv_cast(call, match.index, stages) if half else (call, match.index)


def _fold_conv_cast(
    call: PeerCall, index: int, stages: list[_Stage]
) -> tuple[PeerCall, int] | None:
    """A half-precision convolution (``call``, anchor stage ``index``, float32 output) whose next
    stage is the cast of that output to float16 at the same indices: the call writing the cast's
    buffer, and the cast's index; ``None`` otherwise (cuDNN cannot write float32 from float16)."""
    if index + 1 >= len(stages):
        return None
    block = stages[index + 1].block
    store = block.body
    value = store.value if isinstance(store, tirx.BufferStore) else None
    spatial = [iv.var for iv in block.iter_vars]
    if not (
        isinstance(value, ir.prim.expr.Cast)
        and str(value.ty) == "float16"
        and isinstance(value.value, _Load)
        and str(value.value.source.name) == call.output
        and _is_vars(store.indices, spatial)
        and _is_vars(value.value.indices, spatial)
    ):
        return None
    return replace(call, output=str(store.buffer.name)), index + 1


def _anchor(func: tirx.PrimFunc, device: str = "cpu") -> tuple[PeerCall, int] | None:
    found = _stages(func)
    if found is None:
        return None
    _, stages = found
    params = {str(p.name) for p in func.params}
    found: tuple[PeerCall, int] | None = None
    if stages and (call := _gemm(stages[0].block, params, device)) is not None:
        found = _fold_output_cast(call, stages, params) if device == "cuda" else (call, 0)
    elif device == "cpu":
        found = _conv2d(stages, params) or _depthwise_conv2d(stages, params)
    else:
        found = _conv2d_nchw(stages, params)
    if found is None:
        return None
    epilogue = stages[found[1] + 1 :]
    if any(iv.iter_type != tirx.IterVar.DataPar for s in epilogue for iv in s.block.iter_vars):
        return None  # a reduction after the anchor (e.g. a mean): the task stays TIR
    if device == "cpu" and peer_epilogue.FUSE_EPILOGUE:
        return _fuse_epilogue(*found, stages, func)
    return found


def _fold_output_cast(
    call: PeerCall, stages: list[_Stage], params: set[str]
) -> tuple[PeerCall, int]:
    """A CUDA GEMM accumulated in float32 whose whole epilogue is its cast to a half-precision
    output parameter (float16 or bfloat16, as its inputs) writes that output itself (cuBLAS casts
    as it stores: one kernel less); returns the call and the index of the last stage it
    computes."""
    folded = CUDA_FOLDED_CASTS.get(dict(call.config).get("dtype", -1))
    if len(stages) != 2 or folded is None:
        return call, 0
    code, half = folded
    store = stages[1].block.body
    value = store.value if isinstance(store, tirx.BufferStore) else None
    spatial = [iv.var for iv in stages[1].block.iter_vars]
    if not (
        isinstance(value, ir.prim.expr.Cast)
        and str(value.ty) == half
        and isinstance(value.value, _Load)
        and str(value.value.source.name) == call.output
        and str(store.buffer.name) in params
        and _is_vars(store.indices, spatial)
        and _is_vars(value.value.indices, spatial)
    ):
        return call, 0
    config = tuple((k, code if k == "dtype" else v) for k, v in call.config)
    return PeerCall(call.kind, call.inputs, str(store.buffer.name), config, call.device), 1


def find_peer(mod: tvm.IRModule, device: str = "cpu") -> PeerCall | None:
    """The library peer of a task module (one PrimFunc) on ``device`` (``cpu``: OpenBLAS;
    ``cuda``: cuBLAS, GEMMs only, float32, float16 or bfloat16), or ``None`` (see module
    docstring)."""
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        return None
    found = _anchor(funcs[0], device)
    return found[0] if found else None


def gemm_rows(mod: tvm.IRModule, call: PeerCall) -> int:
    """The rows of a GEMM peer ``call`` of task module ``mod``: its output's elements over its
    last dimension (a batched GEMM's batch included)."""
    func = next(f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc))
    root, _ = _stages(func)  # type: ignore[misc]
    shape = [int(d) for d in _buffers_by_name(func, root)[call.output].shape]
    return math.prod(shape[:-1])


def peer_variants(mod: tvm.IRModule, device: str = "cpu") -> list[PeerCall]:
    """Every library call that can replace the anchor of a task module on ``device``: the call
    :func:`find_peer` picks first, then (CPU) the other algorithms of a convolution
    (:func:`conv_algorithms`) or of a GEMM over a weight (:func:`gemm_algorithms`), oneDNN's for a
    depthwise convolution (where the library has it); empty when the task has no peer. Each
    builds with ``peer_function(func, device, call=...)`` /
    ``peer_task_module(mod, device, call=...)`` and is told apart by ``algorithm`` (in its
    :meth:`PeerCall.to_json`)."""
    default = find_peer(mod, device)
    if default is None or device != "cpu":
        return [default] if default is not None else []
    return [default] + [
        replace(default, algorithm=a)
        for a in _cpu_algorithms(mod, default)
        if a != default.algorithm
    ]


def _cpu_algorithms(mod: tvm.IRModule, call: PeerCall) -> list[str]:
    """The algorithms the CPU shim has for the anchor of ``call`` (a task's :func:`find_peer`)."""
    if call.kind == "depthwise_conv2d_nhwc":
        return depthwise_algorithms()
    func = next(f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc))
    root, _ = _stages(func)  # type: ignore[misc]
    buffers = _buffers_by_name(func, root)
    if call.kind == "gemm" and call.algorithm.startswith("bf16"):
        base = call.algorithm.removesuffix("_onednn")
        weight = len(buffers[call.inputs[1]].shape) == 2
        return bf16_algorithms(base, gemm_rows(mod, call), weight)
    if call.kind == "gemm":  # a batched B: OpenBLAS only
        return gemm_algorithms() if len(buffers[call.inputs[1]].shape) == 2 else []
    return conv_algorithms(_ConvShape.of(call, buffers[call.inputs[1]], buffers[call.output]))
