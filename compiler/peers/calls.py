"""The library call that replaces a task's anchor (:class:`PeerCall`) and the C entry points of
the shims it names, by peer kind and algorithm."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: The C entry points of the shim (``compiler/peers/shim.cc``), by peer kind.
FUNCTIONS = {
    "gemm": "tunehub_peer_gemm",
    "conv2d_nhwc": "tunehub_peer_conv2d_nhwc",
    "depthwise_conv2d_nhwc": "tunehub_peer_depthwise_conv2d_nhwc",
}
#: The C entry points of the CUDA shim (``compiler/peers/shim_cuda.cc``), by peer kind.
CUDA_FUNCTIONS = {"gemm": "tunehub_cuda_gemm", "conv2d_nchw": "tunehub_cuda_conv2d_nchw"}
#: The shim's entry point for Winograd convolutions (``algorithm`` ``winograd_*``).
WINOGRAD_FUNCTION = "tunehub_peer_conv2d_nhwc_winograd"
#: The shim's entry points with packed weights (``algorithm`` ``packed``): the same arguments as
#: :data:`FUNCTIONS`'; the weight is packed into the micro-kernel's panels once and cached.
PACKED_FUNCTIONS = {
    "gemm": "tunehub_peer_gemm_packed",
    "conv2d_nhwc": "tunehub_peer_conv2d_nhwc_packed",
}
#: The shim's bfloat16 GEMMs (``shim_bf16.inc``; bfloat16 input and weight, accumulated in
#: float32), by ``algorithm``: ``bf16`` writes bfloat16, ``bf16_f32`` float32 (a bfloat16
#: linear layer's product before its cast, with the epilogue); ``*_onednn`` the same on oneDNN's
#: bfloat16 matmul (AMX where the CPU has it; a weight ``B`` only, else the shim's). The same
#: arguments as :data:`FUNCTIONS`'.
BF16_FUNCTIONS = {
    "bf16": "tunehub_peer_gemm_bf16",
    "bf16_f32": "tunehub_peer_gemm_bf16_f32",
    "bf16_onednn": "tunehub_peer_gemm_bf16_onednn",
    "bf16_f32_onednn": "tunehub_peer_gemm_bf16_f32_onednn",
}
#: The shim's GEMM over 8-bit weights (``algorithm`` ``q8``; ``shim_q8.inc``): the same
#: arguments as :data:`FUNCTIONS`'. It holds a weight ``B`` in Q8_0's blocks where ``B``'s values
#: are exactly on that grid (weights quantized at load, :mod:`compiler.weights.weight_formats`) and
#: computes any other ``B`` as the rows' default algorithm does.
Q8_FUNCTION = "tunehub_peer_gemm_q8"
#: The same over 4-bit weights (``algorithm`` ``q4``; ``shim_q4.inc``): llama.cpp's Q4_0 blocks.
Q4_FUNCTION = "tunehub_peer_gemm_q4"
#: ``conv2d_nhwc`` algorithms: im2col + packed GEMM, im2col + OpenBLAS sgemm, Winograd by its
#: output tile (m of F(m x m, 3x3)), and oneDNN's primitive; the value is the shim's ``tile``
#: argument (0: not Winograd).
CONV_ALGORITHMS = {"packed": 0, "im2col": 0, "winograd_f2": 2, "winograd_f4": 4, "onednn": 0}
#: The shim's oneDNN entry points (``algorithm`` ``onednn``; ``shim_onednn.inc``), by peer kind:
#: the same arguments as :data:`FUNCTIONS`'. Offered only where the peer library was built
#: against oneDNN (:func:`compiler.peers.library.onednn_available`).
ONEDNN_FUNCTIONS = {
    "gemm": "tunehub_peer_gemm_onednn",
    "conv2d_nhwc": "tunehub_peer_conv2d_nhwc_onednn",
    "depthwise_conv2d_nhwc": "tunehub_peer_depthwise_conv2d_nhwc_onednn",
}
#: ``dtype`` codes of ``tunehub_cuda_gemm``: (input dtype, output dtype).
CUDA_DTYPES = {
    ("float32", "float32"): 0,
    ("float16", "float16"): 1,
    ("float16", "float32"): 2,
    ("bfloat16", "bfloat16"): 3,
    ("bfloat16", "float32"): 4,
}
#: A half-precision CUDA GEMM accumulated in float32 (``dtype`` code) whose output is cast to
#: half precision after it: the code of the call that writes that precision itself, and the
#: cast's dtype (:func:`compiler.peers.match._fold_output_cast`).
CUDA_FOLDED_CASTS = {
    CUDA_DTYPES[("float16", "float32")]: (CUDA_DTYPES[("float16", "float16")], "float16"),
    CUDA_DTYPES[("bfloat16", "float32")]: (CUDA_DTYPES[("bfloat16", "bfloat16")], "bfloat16"),
}


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
        if self.algorithm in BF16_FUNCTIONS:
            return BF16_FUNCTIONS[self.algorithm]
        if self.algorithm == "q8":
            return Q8_FUNCTION
        if self.algorithm == "q4":
            return Q4_FUNCTION
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
