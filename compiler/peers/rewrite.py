"""A task's library peer: the same fused PrimFunc with its anchor computed by a library call.

:func:`find_peer` reads a fused task (one PrimFunc, as :func:`compiler.partition.partition`
extracts it) and promises a :class:`PeerCall` when the task's anchor is an operator the peer
library implements, or ``None``:

- ``gemm``: a ``matmul`` block ``C[..., i, j] += A[..., i, k] * B[(...,) k, j]`` (or
  ``B[(...,) j, k]``), float32, ``A`` and ``B`` parameters of the task, ``B`` 2-D (a weight) or
  with ``C``'s batch dimensions. With a 2-D ``B`` (a weight) it has two variants
  (:data:`GEMM_ALGORITHMS`): ``packed`` (the shim's GEMM on the weight packed once), the
  default with more than one row, and OpenBLAS (``""``: ``sgemm``, ``sgemv`` for one row, the
  default of a GEMV); a batched ``B`` has OpenBLAS only;
- ``conv2d_nhwc``: a ``conv2d_nhwc`` block ``Y[n, y, x, f] += P[n, y*sh + ry*dh, x*sw + rx*dw,
  c] * W[ry, rx, c, f]`` (groups 1, float32), where ``P`` is a parameter or the zero-padding
  of one (the ``pad_temp`` block before it). Its ``algorithm`` is one of
  :data:`CONV_ALGORITHMS`: ``packed`` (im2col + the shim's packed-weight GEMM) or ``im2col``
  (im2col + OpenBLAS sgemm), for any convolution, or, for a 3x3 stride-1 undilated one,
  Winograd ``winograd_f2`` / ``winograd_f4`` (F(2x2, 3x3), F(4x4, 3x3)), and ``onednn``;
  :func:`find_peer` picks one by :func:`default_conv_algorithm` and :func:`peer_variants` lists
  them all, so that a caller can measure each;
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
constants: ReLU, ReLU6), in that order (:func:`_fuse_epilogue`); it then writes the last of those
blocks' buffer, and only the rest of the epilogue stays TIR.

:func:`peer_function` rewrites the task: the padding and the anchor become one opaque block that
calls the peer library's C entry point (``call_extern``; :mod:`compiler.peers.library`) with the
task's own buffers; the epilogue blocks stay, inlined into the last one, whose loops are fused,
split for vectors, parallel and vectorized. The function keeps the task's parameters, so it runs
with the task's arguments, in a measurement and in the model. It is marked scheduled
(MetaSchedule and the build leave it as it is) and loses ``layout_free_buffers`` (the library
reads weights in their own layout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import tvm
from tvm import ir, s_tir, tirx
from tvm.sym.pattern import detect_linear_equation

from compiler.peers.library import onednn_available

# TVM 0.27's TIR nodes: a load is ``ir.TensorLoad`` (its buffer is ``.source``), buffers and
# loop variables are ``ir.Var``, block regions ``ir.TensorRegion``.
_Load = ir.TensorLoad

#: The C entry points of the shim (``compiler/peers/shim.cc``), by peer kind.
FUNCTIONS = {
    "gemm": "tunehub_peer_gemm",
    "conv2d_nhwc": "tunehub_peer_conv2d_nhwc",
    "depthwise_conv2d_nhwc": "tunehub_peer_depthwise_conv2d_nhwc",
}
#: The C entry points of the CUDA shim (``compiler/peers/shim_cuda.cc``), by peer kind.
CUDA_FUNCTIONS = {"gemm": "tunehub_cuda_gemm", "conv2d_nchw": "tunehub_cuda_conv2d_nchw"}
VECTOR_LANES = 8
#: The shim's entry point for Winograd convolutions (``algorithm`` ``winograd_*``).
WINOGRAD_FUNCTION = "tunehub_peer_conv2d_nhwc_winograd"
#: The shim's entry points with packed weights (``algorithm`` ``packed``): the same arguments as
#: :data:`FUNCTIONS`'; the weight is packed into the micro-kernel's panels once and cached.
PACKED_FUNCTIONS = {
    "gemm": "tunehub_peer_gemm_packed",
    "conv2d_nhwc": "tunehub_peer_conv2d_nhwc_packed",
}
#: ``conv2d_nhwc`` algorithms: im2col + packed GEMM, im2col + OpenBLAS sgemm, Winograd by its
#: output tile (m of F(m x m, 3x3)), and oneDNN's primitive; the value is the shim's ``tile``
#: argument (0: not Winograd).
CONV_ALGORITHMS = {"packed": 0, "im2col": 0, "winograd_f2": 2, "winograd_f4": 4, "onednn": 0}
#: :func:`default_conv_algorithm` leaves 1x1 convolutions of more input channels than this to
#: the packed GEMM.
ONEDNN_POINTWISE_MAX_CHANNELS = 32
#: :func:`default_depthwise_algorithm` picks oneDNN for a strided depthwise convolution with at
#: least this many output pixels.
ONEDNN_DEPTHWISE_MIN_PIXELS = 28 * 28
#: The shim's oneDNN entry points (``algorithm`` ``onednn``; ``shim_onednn.inc``), by peer kind:
#: the same arguments as :data:`FUNCTIONS`'. Offered only where the peer library was built
#: against oneDNN (:func:`compiler.peers.library.onednn_available`).
ONEDNN_FUNCTIONS = {
    "conv2d_nhwc": "tunehub_peer_conv2d_nhwc_onednn",
    "depthwise_conv2d_nhwc": "tunehub_peer_depthwise_conv2d_nhwc_onednn",
}
#: ``gemm`` algorithms: the shim's packed-weight GEMM, OpenBLAS (``""``, the older records'
#: name: sgemm, sgemv for one row, per-batch sgemm for a batched ``B``).
GEMM_ALGORITHMS = ("packed", "")
#: Winograd variants are offered for convolutions with at least this many input and output
#: channels (the shim's transforms work on vectors of 8 channels).
WINOGRAD_MIN_CHANNELS = 8
#: :func:`default_conv_algorithm` picks Winograd only with at least this many channels.
WINOGRAD_DEFAULT_MIN_CHANNELS = 64
#: Whether CPU peer calls do the epilogue steps the shim has (:func:`_fuse_epilogue`); off only
#: to build calls for a shim older than its epilogue (``bench.bench_conv_peers``' baseline).
FUSE_EPILOGUE = True
#: Threads per block of a CUDA peer's epilogue kernel.
CUDA_THREADS = 256
#: ``dtype`` codes of ``tunehub_cuda_gemm``: (input dtype, output dtype).
CUDA_DTYPES = {("float32", "float32"): 0, ("float16", "float16"): 1, ("float16", "float32"): 2}


@dataclass(frozen=True)
class PeerCall:
    """The library call that replaces a task's anchor: ``kind`` (a key of :data:`FUNCTIONS`),
    the anchor's inputs and output (parameter or buffer names), the call's integer
    configuration, in the entry point's argument order, and the ``device`` whose shim it calls
    (``cpu``: :data:`FUNCTIONS`; ``cuda``: :data:`CUDA_FUNCTIONS`).
    ``algorithm``: how the shim computes it (``conv2d_nhwc``: a key of
    :data:`CONV_ALGORITHMS`; empty for a GEMM); part of the call's identity and of its
    :meth:`to_json`. ``bias``, ``residual``, ``clamp``: the epilogue the call applies as it
    stores its output (CPU only; the shim's ``Epilogue``): a parameter added per output channel,
    a parameter of the output's shape added elementwise, and ``(lo, hi)`` bounds (infinite for
    none); ``output`` is then the buffer of the last epilogue block the call does."""

    kind: str
    inputs: tuple[str, ...]
    output: str
    config: tuple[tuple[str, int], ...]
    device: str = "cpu"
    algorithm: str = ""
    bias: str = ""
    residual: str = ""
    clamp: tuple[float, float] | None = None

    @property
    def function(self) -> str:
        if CONV_ALGORITHMS.get(self.algorithm):
            return WINOGRAD_FUNCTION
        if self.algorithm == "onednn":
            return ONEDNN_FUNCTIONS[self.kind]
        if self.algorithm == "packed":
            return PACKED_FUNCTIONS[self.kind]
        return (CUDA_FUNCTIONS if self.device == "cuda" else FUNCTIONS)[self.kind]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "function": self.function,
            "config": dict(self.config),
        }
        if self.algorithm:
            out["algorithm"] = self.algorithm
        if self.epilogue:
            out["epilogue"] = list(self.epilogue)
        return out

    @property
    def epilogue(self) -> tuple[str, ...]:
        """What the call does after its product, in words (``bias``, ``residual``,
        ``max 0``, ``min 6``); empty when it does nothing more."""
        done = [name for name, given in (("bias", self.bias), ("residual", self.residual)) if given]
        if self.clamp is not None:
            lo, hi = self.clamp
            done += [f"max {lo:g}"] if lo != -math.inf else []
            done += [f"min {hi:g}"] if hi != math.inf else []
        return tuple(done)


@dataclass(frozen=True)
class _Stage:
    """One top-level loop nest of a fused PrimFunc and the block at its bottom."""

    stmt: Any
    block: Any


def _stages(func: tirx.PrimFunc) -> tuple[Any, list[_Stage]] | None:
    root = func.body.block if isinstance(func.body, s_tir.SBlockRealize) else None
    if root is None:
        return None
    body = root.body
    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    stages = []
    for stmt in stmts:
        node = stmt
        while isinstance(node, tirx.For):
            node = node.body
        if not isinstance(node, s_tir.SBlockRealize):
            return None
        stages.append(_Stage(stmt, node.block))
    return root, stages


def buffer_loads(expr: Any) -> list[Any]:
    """The buffer loads in ``expr`` (arithmetic, casts, calls, selects), outermost first."""
    if isinstance(expr, _Load):
        return [expr]
    out: list[Any] = []
    for name in ("a", "b", "value", "condition", "true_value", "false_value"):
        child = getattr(expr, name, None) if hasattr(type(expr), name) else None
        if child is not None:
            out += buffer_loads(child)
    if isinstance(expr, ir.Call):
        for arg in expr.args:
            out += buffer_loads(arg)
    return out


def _is_vars(indices: Any, variables: list[Any]) -> bool:
    return len(indices) == len(variables) and all(
        isinstance(i, ir.Var) and i.same_as(v) for i, v in zip(indices, variables)
    )


def _reduction_parts(block: Any) -> tuple[Any, Any, Any, list[Any], list[Any]] | None:
    """``(C store, A load, B load, spatial vars, reduce vars)`` of ``C += A * B``."""
    store = block.body
    if block.init is None or not isinstance(store, tirx.BufferStore):
        return None
    value = store.value
    if not (
        isinstance(value, ir.prim.expr.Add)
        and isinstance(value.a, _Load)
        and value.a.source.same_as(store.buffer)
        and isinstance(value.b, ir.prim.expr.Mul)
    ):
        return None
    a, b = _uncast(value.b.a), _uncast(value.b.b)
    if not (isinstance(a, _Load) and isinstance(b, _Load)):
        return None
    spatial = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(spatial) + len(reduce) != len(block.iter_vars):
        return None
    if not _is_vars(store.indices, spatial):
        return None
    return store, a, b, spatial, reduce


def _uncast(expr: Any) -> Any:
    """``x`` of ``T.Cast(dtype, x)`` (how an fp16 product accumulates in fp32), else ``expr``."""
    return expr.value if isinstance(expr, ir.prim.expr.Cast) else expr


def _float32(*buffers: Any) -> bool:
    return all(str(b.dtype) == "float32" for b in buffers)


def _dtypes_supported(device: str, store: Any, a: Any, b: Any) -> bool:
    if device == "cuda":
        pair = (str(a.source.dtype), str(store.buffer.dtype))
        return str(b.source.dtype) == pair[0] and pair in CUDA_DTYPES
    if not _float32(store.buffer, a.source, b.source):
        return False
    return isinstance(store.value.b.a, _Load) and isinstance(store.value.b.b, _Load)


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
    algorithm = "packed" if len(b.source.shape) == 2 and rows > 1 else ""
    return PeerCall(
        "gemm", (a.source.name, b.source.name), store.buffer.name, config, device, algorithm
    )


def _coefficients(expr: Any, variables: list[Any]) -> list[int] | None:
    coeffs = detect_linear_equation(expr, variables)
    if len(coeffs) != len(variables) + 1:
        return None
    try:
        return [int(c) for c in coeffs]
    except (TypeError, ValueError):
        return None


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
    float16 program's convolution imports to, :func:`compiler.pt2_ops.in_torch_dtype`)."""
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


@dataclass(frozen=True)
class _ConvShape:
    """What the choice of a convolution's algorithm reads: kernel, strides, dilations,
    channels in and out, output pixels per image."""

    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    channels: int
    filters: int
    pixels: int

    @staticmethod
    def of(call: PeerCall, weight: Any, output: Any) -> _ConvShape:
        config = dict(call.config)
        kh, kw, c, k = (int(d) for d in weight.shape)
        return _ConvShape(
            (kh, kw),
            (config["stride_h"], config["stride_w"]),
            (config["dilation_h"], config["dilation_w"]),
            c,
            k,
            int(output.shape[1]) * int(output.shape[2]),
        )


def conv_algorithms(shape: _ConvShape) -> list[str]:
    """The algorithms the shim has for a convolution of ``shape``: ``packed`` and ``im2col``
    always; the Winograd ones for a 3x3, stride-1, undilated kernel with at least
    :data:`WINOGRAD_MIN_CHANNELS` channels in and out; ``onednn`` where the peer library has
    oneDNN."""
    out = ["packed", "im2col"]
    if (
        shape.kernel == (3, 3)
        and shape.strides == (1, 1)
        and shape.dilations == (1, 1)
        and min(shape.channels, shape.filters) >= WINOGRAD_MIN_CHANNELS
    ):
        out += ["winograd_f2", "winograd_f4"]
    return out + (["onednn"] if onednn_available() else [])


def depthwise_algorithms() -> list[str]:
    """The algorithms the shim has for a depthwise convolution: its own kernel (``""``)
    always, ``onednn`` where the peer library has oneDNN."""
    return [""] + (["onednn"] if onednn_available() else [])


def default_conv_algorithm(shape: _ConvShape) -> str:
    """The algorithm :func:`find_peer` picks for a convolution (what a zero-trial build uses;
    a final build measures every variant instead). Winograd (rule from
    ``bench/results/conv_peers_2026-12-01.md``, ResNet-18's tasks at 2 threads) only with at
    least :data:`WINOGRAD_DEFAULT_MIN_CHANNELS` channels in and out (with fewer, its small-K
    GEMMs and three passes over memory lost to im2col); then F(4x4, 3x3) on large images (>=
    24x24 output pixels: fewest multiplications, tiles waste little), F(2x2, 3x3) on smaller
    ones down to 12x12. Else, where the peer library has oneDNN, its primitive, except for a
    1x1 convolution of more than :data:`ONEDNN_POINTWISE_MAX_CHANNELS` input channels: rule from
    ``bench/results/onednn_peers_2026-12-02.md`` (ResNet-18's and MobileNetV2's tasks, 2
    threads, Zen 5), where oneDNN took 0.30-0.80x the shim's best time on stems, strided and
    7x7-image 3x3 convolutions and 1x1 expansions of few channels, and 1.0-1.4x on 1x1
    convolutions of many channels (a GEMM the packed kernel does as well). Otherwise ``packed``
    (im2col + the packed-weight GEMM: 0.37-0.98x OpenBLAS's time on these shapes,
    ``bench/results/gemm_packed_2026-12-02.md``)."""
    options = conv_algorithms(shape)
    if min(shape.channels, shape.filters) >= WINOGRAD_DEFAULT_MIN_CHANNELS:
        if "winograd_f4" in options and shape.pixels >= 24 * 24:
            return "winograd_f4"
        if "winograd_f2" in options and shape.pixels >= 12 * 12:
            return "winograd_f2"
    pointwise = shape.kernel == (1, 1)
    if "onednn" in options and not (pointwise and shape.channels > ONEDNN_POINTWISE_MAX_CHANNELS):
        return "onednn"
    return "packed"


def default_depthwise_algorithm(shape: _ConvShape) -> str:
    """The algorithm :func:`find_peer` picks for a depthwise convolution: oneDNN's (where the
    library has it) with stride 1 or at least :data:`ONEDNN_DEPTHWISE_MIN_PIXELS` output
    pixels, where it took 0.29-0.91x the shim's kernel's time on MobileNetV2's
    (``bench/results/onednn_peers_2026-12-02.md``); the shim's own kernel (``""``) on small
    strided ones, where oneDNN took 1.2-1.5x."""
    wide = shape.strides == (1, 1) or shape.pixels >= ONEDNN_DEPTHWISE_MIN_PIXELS
    return "onednn" if wide and "onednn" in depthwise_algorithms() else ""


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
    if device == "cpu" and FUSE_EPILOGUE:
        return _fuse_epilogue(*found, stages, func)
    return found


def _epilogue_step(
    value: Any, current: str, variables: list[Any], shape: list[int], params: dict[str, Any]
) -> tuple[str, Any] | None:
    """What one epilogue block's value does to ``current`` (the buffer so far, read at the
    block's own indices), if the shim's epilogue can do it: ``("bias", name)`` (a float32
    parameter indexed by the last axis, its other axes of extent 1), ``("residual", name)`` (a
    float32 parameter of the output's shape, read at the same indices), ``("max", c)`` or
    ``("min", c)`` with a float32 constant; else ``None``."""

    def is_current(expr: Any) -> bool:
        return (
            isinstance(expr, _Load)
            and str(expr.source.name) == current
            and _is_vars(expr.indices, variables)
        )

    if isinstance(value, (ir.prim.expr.Max, ir.prim.expr.Min)):
        const = value.b if is_current(value.a) else value.a if is_current(value.b) else None
        if isinstance(const, ir.prim.expr.FloatImm) and str(const.ty) == "float32":
            return ("max" if isinstance(value, ir.prim.expr.Max) else "min"), float(const.value)
        return None
    if not isinstance(value, ir.prim.expr.Add):
        return None
    other = value.b if is_current(value.a) else value.a if is_current(value.b) else None
    if not isinstance(other, _Load) or str(other.source.name) not in params:
        return None
    buffer = params[str(other.source.name)]
    dims = [int(d) for d in buffer.shape]
    if str(buffer.dtype) != "float32":
        return None
    if dims == shape and _is_vars(other.indices, variables):
        return "residual", str(buffer.name)
    indices = list(other.indices)  # its axes but the last have extent 1: their indices are 0
    if (
        indices
        and dims
        and dims[-1] == shape[-1]
        and all(d == 1 for d in dims[:-1])
        and isinstance(indices[-1], ir.Var)
        and indices[-1].same_as(variables[-1])
    ):
        return "bias", str(buffer.name)
    return None


def _fuse_epilogue(
    call: PeerCall, anchor: int, stages: list[_Stage], func: tirx.PrimFunc
) -> tuple[PeerCall, int]:
    """``call`` extended by the longest run of epilogue blocks right after ``anchor`` that the
    shim's epilogue does (at most one bias add and one residual add, then clamps; see
    :func:`_epilogue_step`), and the index of the last stage the call then computes. A run is
    cut before a block that does something else, and shortened so that no buffer the call no
    longer writes is read by the blocks left after it."""
    params = {str(p.name): p for p in func.params}  # a PrimFunc's parameters are its buffers
    out = stages[anchor].block.body.buffer
    shape = [int(d) for d in out.shape]
    current, bias, residual = call.output, "", ""
    lo, hi = -math.inf, math.inf
    runs: list[tuple[int, str, str, str, float, float]] = []
    for index in range(anchor + 1, len(stages)):
        block = stages[index].block
        store = block.body
        variables = [iv.var for iv in block.iter_vars]
        if not (
            isinstance(store, tirx.BufferStore)
            and _is_vars(store.indices, variables)
            and [int(d) for d in store.buffer.shape] == shape
            and str(store.buffer.dtype) == "float32"
        ):
            break
        step = _epilogue_step(store.value, current, variables, shape, params)
        clamped = (lo, hi) != (-math.inf, math.inf)
        if step is None:
            break
        kind, what = step
        if kind == "bias" and not bias and not clamped:
            bias = what
        elif kind == "residual" and not residual and not clamped:
            residual = what
        elif kind == "max" and max(lo, what) <= hi:
            lo = max(lo, what)
        elif kind == "min" and lo <= min(hi, what):
            hi = min(hi, what)
        else:
            break
        current = str(store.buffer.name)
        runs.append((index, current, bias, residual, lo, hi))
    while runs:  # the buffers before the run's last must not be read after it
        index, current, bias, residual, lo, hi = runs[-1]
        skipped = {call.output} | {r[1] for r in runs[:-1]}
        later = {str(region.source.name) for s in stages[index + 1 :] for region in s.block.reads}
        if not skipped & later:
            clamp = None if (lo, hi) == (-math.inf, math.inf) else (lo, hi)
            return replace(call, output=current, bias=bias, residual=residual, clamp=clamp), index
        runs.pop()
    return call, anchor


def _fold_output_cast(
    call: PeerCall, stages: list[_Stage], params: set[str]
) -> tuple[PeerCall, int]:
    """A CUDA GEMM accumulated in float32 whose whole epilogue is its cast to a float16 output
    parameter writes that output itself (cuBLAS casts as it stores: one kernel less); returns
    the call and the index of the last stage it computes."""
    if len(stages) != 2 or dict(call.config).get("dtype") != CUDA_DTYPES[("float16", "float32")]:
        return call, 0
    store = stages[1].block.body
    value = store.value if isinstance(store, tirx.BufferStore) else None
    spatial = [iv.var for iv in stages[1].block.iter_vars]
    if not (
        isinstance(value, ir.prim.expr.Cast)
        and str(value.ty) == "float16"
        and isinstance(value.value, _Load)
        and str(value.value.source.name) == call.output
        and str(store.buffer.name) in params
        and _is_vars(store.indices, spatial)
        and _is_vars(value.value.indices, spatial)
    ):
        return call, 0
    config = tuple(
        (k, CUDA_DTYPES[("float16", "float16")] if k == "dtype" else v) for k, v in call.config
    )
    return PeerCall(call.kind, call.inputs, str(store.buffer.name), config, call.device), 1


def find_peer(mod: tvm.IRModule, device: str = "cpu") -> PeerCall | None:
    """The library peer of a task module (one PrimFunc) on ``device`` (``cpu``: OpenBLAS;
    ``cuda``: cuBLAS, GEMMs only, float32 or float16), or ``None`` (see module docstring)."""
    funcs = [f for f in mod.functions.values() if isinstance(f, tirx.PrimFunc)]
    if len(funcs) != 1:
        return None
    found = _anchor(funcs[0], device)
    return found[0] if found else None


def peer_variants(mod: tvm.IRModule, device: str = "cpu") -> list[PeerCall]:
    """Every library call that can replace the anchor of a task module on ``device``: the call
    :func:`find_peer` picks first, then (CPU) the other algorithms of a convolution
    (:func:`conv_algorithms`) or of a packed GEMM (:data:`GEMM_ALGORITHMS`), oneDNN's for a
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
    if call.kind == "gemm":  # a batched B: OpenBLAS only
        return list(GEMM_ALGORITHMS) if len(buffers[call.inputs[1]].shape) == 2 else []
    return conv_algorithms(_ConvShape.of(call, buffers[call.inputs[1]], buffers[call.output]))


def _task(func: tirx.PrimFunc) -> tvm.IRModule:
    return tvm.IRModule({"main": func})


def _buffers_by_name(func: tirx.PrimFunc, root: Any) -> dict[str, Any]:
    out = {str(p.name): p for p in func.params}
    for buf in root.alloc_buffers:
        out[str(buf.name)] = buf
    return out


def _region(buffer: Any) -> Any:
    """The whole of ``buffer`` as a block region."""
    return buffer[tuple(slice(0, d) for d in buffer.shape)]


def peer_function(
    func: tirx.PrimFunc, device: str = "cpu", *, call: PeerCall | None = None
) -> tirx.PrimFunc:
    """``func`` with its anchor replaced by ``device``'s library call (module docstring; on
    ``cuda`` the epilogue is one kernel of :data:`CUDA_THREADS`-thread blocks, launched after
    the call on TVM's stream).
    ``call``: one of :func:`peer_variants` (default: what :func:`find_peer` picks). Raises
    ``ValueError`` when ``func`` has no peer or ``call`` is not one of its variants."""
    found = _anchor(func, device)
    if found is None:
        raise ValueError("the task has no library peer")
    chosen, last = found  # the last stage the call computes (its anchor, or epilogue blocks)
    if call is not None and call != chosen:
        if call not in peer_variants(_task(func)):
            raise ValueError(f"{call} is not a peer variant of the task")
        chosen = call
    call = chosen
    root, stages = _stages(func)  # type: ignore[misc]
    buffers = _buffers_by_name(func, root)
    inputs = [buffers[name] for name in call.inputs]
    output = buffers[call.output]
    epilogue = [buffers[name] for name in (call.bias, call.residual) if name]
    args = [b.data for b in (*inputs, output)] + _extern_sizes(call, inputs, output)
    if device == "cpu" and FUSE_EPILOGUE:
        args += _epilogue_args(call, buffers, output)
    extern = s_tir.SBlock(
        [],
        [_region(b) for b in (*inputs, *epilogue)],
        [_region(output)],
        "tunehub_peer",
        _checked(tirx.call_extern("int32", call.function, *args), call.function, device),
    )
    dropped = {str(stages[i].block.writes[0].source.name) for i in range(last + 1)} - {call.output}
    body = [s_tir.SBlockRealize([], True, extern)] + [s.stmt for s in stages[last + 1 :]]
    new_root = s_tir.SBlock(
        root.iter_vars,
        root.reads,
        root.writes,
        root.name_hint,
        tirx.SeqStmt(body) if len(body) > 1 else body[0],
        root.init,
        [b for b in root.alloc_buffers if str(b.name) not in dropped],
        root.match_buffers,
        root.annotations,
    )
    rewritten = func.with_body(s_tir.SBlockRealize([], True, new_root))
    rewritten = rewritten.without_attr("layout_free_buffers")
    return _schedule_epilogue(rewritten, len(stages) - last - 1, device)


def _checked(status: Any, function: str, device: str) -> Any:
    """A statement that makes the call ``status``; on the CPU it raises a ``RuntimeError`` (in
    the calling kernel, so in its caller: a measurement fails, a model run raises) where the
    status is not 0. (The CUDA shim returns cuBLAS/cuDNN statuses too, but checking them has
    not run on a GPU yet: there the status is still ignored.)"""
    if device != "cpu":
        return tirx.Evaluate(status)
    # TVM 0.27's Python ``tirx.AssertStmt`` passes (kind, condition) to a constructor that
    # takes (condition, kind): call the constructor itself.
    message = [ir.StringImm(f"the library peer {function} failed")]
    return tirx._ffi_api.AssertStmt(  # noqa: SLF001 - see above
        status == 0, ir.StringImm("RuntimeError"), message, None
    )


def _epilogue_args(call: PeerCall, buffers: dict[str, Any], output: Any) -> list[Any]:
    """The CPU shim's trailing epilogue arguments: ``flags`` (bit 0 bias, bit 1 residual), the
    bias and residual pointers (the output's where not given: never read), ``lo``, ``hi``."""
    lo, hi = call.clamp if call.clamp is not None else (-math.inf, math.inf)
    flags = (1 if call.bias else 0) | (2 if call.residual else 0)
    pointers = [(buffers[name] if name else output).data for name in (call.bias, call.residual)]
    return [
        tirx.IntImm("int32", flags),
        *pointers,
        tirx.FloatImm("float32", lo),
        tirx.FloatImm("float32", hi),
    ]


def _extern_sizes(call: PeerCall, inputs: list[Any], output: Any) -> list[Any]:
    """The size arguments of the shim's entry point (``shim.cc``) after its three pointers."""
    config = dict(call.config)
    shape = [int(d) for d in output.shape]
    if call.kind == "gemm":
        a_shape = [int(d) for d in inputs[0].shape]
        batch = 1
        for d in shape[:-2]:
            batch *= d
        b_batched = int(len(inputs[1].shape) > 2)
        i64 = [
            tirx.IntImm("int64", v)
            for v in (batch, shape[-2] if len(shape) > 1 else 1, shape[-1], a_shape[-1])
        ]
        extra = [tirx.IntImm("int32", config["dtype"])] if "dtype" in config else []
        return [
            *i64,
            tirx.IntImm("int32", config["trans_b"]),
            tirx.IntImm("int32", b_batched),
            *extra,
        ]
    x_shape = [int(d) for d in inputs[0].shape]
    if call.kind == "conv2d_nchw":  # tunehub_cuda_conv2d_nchw: int64 sizes, int32 dtype
        k, _, kh, kw = (int(d) for d in inputs[1].shape)
        sizes = (
            *x_shape,
            k,
            kh,
            kw,
            shape[2],
            shape[3],
            config["stride_h"],
            config["stride_w"],
            config["pad_top"],
            config["pad_left"],
            config["dilation_h"],
            config["dilation_w"],
        )
        return [
            *(tirx.IntImm("int64", v) for v in sizes),
            tirx.IntImm("int32", config.get("dtype", CUDA_DTYPES[("float32", "float32")])),
        ]
    tile = CONV_ALGORITHMS.get(call.algorithm, 0)
    if tile:  # tunehub_peer_conv2d_nhwc_winograd: no kernel, stride or dilation arguments
        sizes = (*x_shape, int(inputs[1].shape[3]), shape[1], shape[2])
        return [
            *(tirx.IntImm("int64", v) for v in sizes),
            *(tirx.IntImm("int32", v) for v in (config["pad_top"], config["pad_left"], tile)),
        ]
    w_shape = [int(d) for d in inputs[1].shape]
    sizes = (*x_shape, w_shape[0], w_shape[1], w_shape[3], shape[1], shape[2])
    return [
        *(tirx.IntImm("int64", v) for v in sizes),
        *(tirx.IntImm("int32", v) for _, v in call.config),
    ]


def _schedule_epilogue(func: tirx.PrimFunc, epilogue_blocks: int, device: str) -> tirx.PrimFunc:
    """``func`` marked scheduled, its epilogue inlined, parallel and vectorized where the
    schedule primitives allow (left as loops otherwise: still correct, only slower); on
    ``cuda``, one kernel (a GPU has no fallback: the error propagates)."""
    if device == "cuda":
        return _cuda_epilogue(func, epilogue_blocks)
    try:
        return _scheduled_epilogue(func, epilogue_blocks)
    except (s_tir.ScheduleError, RuntimeError, ValueError):
        return func.with_attr("tirx.is_scheduled", True)


def _inlined_epilogue(sch: s_tir.Schedule) -> Any:
    """Inline every epilogue block but the last (those that can be); the last block."""
    blocks = [b for b in sch.get_child_blocks(sch.get_sblock("root"))][1:]
    for block in blocks[:-1]:
        try:
            sch.compute_inline(block)
        except s_tir.ScheduleError:
            pass
    return sch.get_child_blocks(sch.get_sblock("root"))[-1]


def _cuda_epilogue(func: tirx.PrimFunc, epilogue_blocks: int) -> tirx.PrimFunc:
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    if epilogue_blocks:
        last = _inlined_epilogue(sch)
        loops = sch.get_loops(last)
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        threads = min(CUDA_THREADS, int(sch.get(fused).extent))
        block_x, thread_x = sch.split(fused, [None, threads])
        sch.bind(block_x, "blockIdx.x")
        sch.bind(thread_x, "threadIdx.x")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _scheduled_epilogue(func: tirx.PrimFunc, epilogue_blocks: int) -> tirx.PrimFunc:
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    if epilogue_blocks:
        last = _inlined_epilogue(sch)
        loops = sch.get_loops(last)
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        extent = int(sch.get(fused).extent)
        if extent % VECTOR_LANES == 0 and extent > VECTOR_LANES:
            outer, inner = sch.split(fused, [None, VECTOR_LANES])
            sch.parallel(outer)
            sch.vectorize(inner)
        else:
            sch.parallel(fused)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)
