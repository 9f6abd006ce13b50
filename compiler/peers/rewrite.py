"""A task's library peer: the same fused PrimFunc with its anchor computed by a library call.

:func:`peer_function` rewrites the task: the padding and the anchor become one opaque block that
calls the peer library's C entry point (``call_extern``; :mod:`compiler.peers.library`) with the
task's own buffers; the epilogue blocks stay, inlined into the last one, whose loops are fused,
split for vectors, parallel and vectorized. The function keeps the task's parameters, so it runs
with the task's arguments, in a measurement and in the model. It is marked scheduled
(MetaSchedule and the build leave it as it is) and loses ``layout_free_buffers`` (the library
reads weights in their own layout).

The call is the one :func:`compiler.peers.match.find_peer` picks, or another of its
:func:`~compiler.peers.match.peer_variants` (:mod:`compiler.peers.calls`).
"""

from __future__ import annotations

import math
from typing import Any

import tvm
from tvm import ir, s_tir, tirx

from compiler.peers import epilogue as peer_epilogue
from compiler.peers.calls import CONV_ALGORITHMS, CUDA_DTYPES, PeerCall
from compiler.peers.match import _anchor, peer_variants
from compiler.peers.patterns import _buffers_by_name, _stages

VECTOR_LANES = 8
#: Threads per block of a CUDA peer's epilogue kernel.
CUDA_THREADS = 256


def _task(func: tirx.PrimFunc) -> tvm.IRModule:
    return tvm.IRModule({"main": func})


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
    if device == "cpu" and peer_epilogue.FUSE_EPILOGUE:
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
    allocated = [b for b in root.alloc_buffers if str(b.name) not in dropped]
    rewritten = func.with_body(root_realize(root, body, allocated))
    rewritten = rewritten.without_attr("layout_free_buffers")
    return _schedule_epilogue(rewritten, len(stages) - last - 1, device)


def root_realize(root: Any, body: list[Any], alloc_buffers: list[Any] | None = None) -> Any:
    """A PrimFunc's root block ``root`` with the statements ``body`` (and ``alloc_buffers``,
    default its own), realized: the body of a rewritten peer function."""
    new_root = s_tir.SBlock(
        root.iter_vars,
        root.reads,
        root.writes,
        root.name_hint,
        tirx.SeqStmt(body) if len(body) > 1 else body[0],
        root.init,
        root.alloc_buffers if alloc_buffers is None else alloc_buffers,
        root.match_buffers,
        root.annotations,
    )
    return s_tir.SBlockRealize([], True, new_root)


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
