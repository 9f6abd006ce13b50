"""How the CPU shim computes a peer: the algorithms it has for a GEMM, a convolution or a
depthwise convolution of a given shape (the variants a final build measures), and the one a
zero-trial build picks (:func:`default_conv_algorithm`, :func:`default_depthwise_algorithm`:
rules from the benchmarks they cite)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from compiler.peers.calls import PeerCall
from compiler.peers.library import onednn_available
from compiler.target import cpu_flags

#: :func:`default_conv_algorithm` leaves 1x1 convolutions of more input channels than this to
#: the packed GEMM.
ONEDNN_POINTWISE_MAX_CHANNELS = 32
#: :func:`default_depthwise_algorithm` picks oneDNN for a strided depthwise convolution with at
#: least this many output pixels.
ONEDNN_DEPTHWISE_MIN_PIXELS = 28 * 28
#: ``gemm`` algorithms: the shim's packed-weight GEMM, OpenBLAS (``""``, the older records'
#: name: sgemm, sgemv for one row, per-batch sgemm for a batched ``B``), the GEMM over 8-bit
#: weights (``q8``: a weight on Q8_0's grid, else as the rows' default) and over 4-bit ones
#: (``q4``: Q4_0's grid); oneDNN's matmul (``onednn``) too where the peer library has it
#: (:func:`gemm_algorithms`).
GEMM_ALGORITHMS = ("packed", "", "q8", "q4")
#: The GEMM algorithm that streams each weight format's values. A zero-trial build of a target
#: whose weights are ``q8_0`` (``q4_0``) computes every GEMM over a weight with ``q8`` (``q4``)
#: (:func:`compiler.peers.zero_trial_call`), whatever its rows, so that the library holds each
#: weight in the format only (:mod:`compiler.peers.held_weights`): prefill chunks on the float32
#: packed GEMM kept a packed float32 copy of every weight as well (TinyLlama-1.1B Q8_0: 9.90 GB
#: of RSS at peak, against 1.69 GB held;
#: ``bench/results/llm_artifacts_2026-12-07_tinyllama11_q8_held.md``).
#: Over all of Qwen2.5-0.5B's GEMMs (169, each its own weight), 2 threads, ``q8`` took 0.49x the
#: best float32 algorithm's time at 1 row, 0.79x at 16, 0.87x at 32 and 1.02x at 128 on a 2-core
#: Zen 5 (``bench/results/q8_gemm_2026-12-06.md``); 0.34x at 1 row and 0.81x at 32 on a 2-core
#: Xeon (``q8_gemm_2026-12-07.md``), 0.99x at 64 and 1.26x at 128
#: (``q8_gemm_2026-12-07_rows128.md``; ``q4`` 1.39x). From 64 rows the shim now widens each
#: 32-column tile to float32 once a call and runs the packed micro-kernel over it: 0.83x at 64
#: and 0.97x at 128 (``q4`` 0.94x and 0.98x; ``q8_gemm_2026-12-07_widened.md``).
FORMAT_ALGORITHMS = {"q8_0": "q8", "q4_0": "q4"}
#: Winograd variants are offered for convolutions with at least this many input and output
#: channels (the shim's transforms work on vectors of 8 channels).
WINOGRAD_MIN_CHANNELS = 8
#: :func:`default_conv_algorithm` picks Winograd only with at least this many channels.
WINOGRAD_DEFAULT_MIN_CHANNELS = 64


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


def gemm_algorithms() -> list[str]:
    """The algorithms the shim has for a GEMM over a weight (a 2-D ``B``): :data:`GEMM_ALGORITHMS`
    always, ``onednn`` where the peer library has oneDNN."""
    return list(GEMM_ALGORITHMS) + (["onednn"] if onednn_available() else [])


def default_gemm_algorithm(rows: int) -> str:
    """The algorithm :func:`find_peer` picks for a GEMM over a weight of ``rows`` rows (what a
    zero-trial build uses; a final build measures every variant of :func:`gemm_algorithms`):
    OpenBLAS (``""``: its ``sgemv``) for one row, else ``packed`` (``q8`` where the target's
    weights are ``q8_0``: :func:`compiler.peers.zero_trial_call`). oneDNN's matmul is a variant
    only: on a 2-core Xeon (AVX-512, AMX), 2 threads, over Qwen2.5-0.5B's prefill GEMMs it took
    0.79x the packed GEMM's time on the 4,864 x 896 down projection at 128 rows (4.29 against
    5.44 ms) and 0.98-1.22x on the others (16 to 128 rows, 896 x 4,864 / 896 / 128), within
    this machine's run-to-run noise of about 10 %."""
    return "packed" if rows > 1 else ""


#: :func:`bf16_algorithms` offers oneDNN's bfloat16 matmul for a GEMM over a weight of at least
#: this many rows, and :func:`default_bf16_algorithm` picks it.
ONEDNN_BF16_MIN_ROWS = 16


def bf16_algorithms(base: str, rows: int, weight: bool) -> list[str]:
    """The algorithms of a bfloat16 GEMM whose shim kernel is ``base`` (``bf16`` / ``bf16_f32``):
    that kernel, and oneDNN's matmul (``<base>_onednn``) for a weight ``B`` of
    :data:`ONEDNN_BF16_MIN_ROWS` rows or more where the peer library has oneDNN and the CPU
    computes bfloat16 natively (AMX or AVX-512 BF16: :func:`native_bfloat16`; elsewhere oneDNN
    3.2 may have no bfloat16 matmul to give)."""
    onednn = weight and rows >= ONEDNN_BF16_MIN_ROWS and onednn_available() and native_bfloat16()
    return [base] + ([f"{base}_onednn"] if onednn else [])


def native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 instructions (``amx_bf16`` or ``avx512_bf16``)."""
    return bool({"amx_bf16", "avx512_bf16"} & cpu_flags())


def default_bf16_algorithm(base: str, rows: int, weight: bool) -> str:
    """The algorithm :func:`find_peer` picks for a bfloat16 GEMM: oneDNN's matmul where
    :func:`bf16_algorithms` offers it, else the shim's kernel. oneDNN's runs on AMX where the
    CPU has it: on a 2-core Xeon with AMX (2 threads), a 128 x 896 x 4,864 bfloat16 GEMM took
    1.52 ms in oneDNN 3.2 alone (734 GFLOP/s), where the float32 packed GEMM takes 4.8 ms and
    the shim's bfloat16 loop is slower still (a bfloat16 Qwen2.5-0.5B's 128-token prefill took
    3.0 s on it, `llm_2026-12-06_qwen05_lastlogits.md`)."""
    return bf16_algorithms(base, rows, weight)[-1]


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
