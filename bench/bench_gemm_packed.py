"""The shim's packed-weight GEMM against OpenBLAS and ONNX Runtime, per operator, side by side.

    python -m bench.bench_gemm_packed [--threads 2] [--rounds 9] [--cases NAME ...] [--out DIR]

Each case is one operator of the bench models (ResNet-18's and MobileNetV2's convolutions, BERT's
and a Llama-style decoder's dense layers), written as a one-operator ONNX model with seeded
weights (conv or matmul, + bias, + ReLU). The TVM side runs it through the real compile path
(:func:`compiler.prepare.prepare_model`: NHWC, prepacked weights) and times every library-peer
variant of its task (:func:`compiler.peers.peer_variants`: ``packed``, the shim's GEMM on the
weight packed once; ``im2col``/``sgemm``, OpenBLAS; ``winograd_*``), each the whole task (library
call + TIR epilogue), built in this process and called from Python; ONNX Runtime runs the same
one-operator model (its MLAS kernels, weights prepacked at session creation). All timers of a
case run interleaved (:func:`bench.bench_peers.interleaved`: a new random order each round, a
pause before each timer), ``--rounds`` rounds of at least 0.2 s; the table gives medians and
GFLOP/s. Every variant's output is checked against ONNX Runtime's (max abs error).

A TVM task reads and writes NHWC; ONNX Runtime's operator is NCHW (its own layout conversions
included in its time). Threads: TVM's target has ``num-cores = --threads``,
``TVM_NUM_THREADS`` is set to it; ONNX Runtime gets ``intra_op_num_threads = --threads``. Writes
``gemm_packed_<date>.json`` and ``.md`` (machine, date) into ``--out`` (default
``bench/results``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

#: name -> ("conv", cin, cout, size, kernel, stride, pad) or ("gemm", rows, inner, cols)
CASES: dict[str, tuple] = {
    "resnet18 stem 7x7/2 3->64 224": ("conv", 3, 64, 224, 7, 2, 3),
    "resnet18 3x3 64->64 56": ("conv", 64, 64, 56, 3, 1, 1),
    "resnet18 3x3 256->256 14": ("conv", 256, 256, 14, 3, 1, 1),
    "resnet18 3x3/2 256->512 14": ("conv", 256, 512, 14, 3, 2, 1),
    "resnet18 3x3 512->512 7": ("conv", 512, 512, 7, 3, 1, 1),
    "mobilenetv2 1x1 24->144 56": ("conv", 24, 144, 56, 1, 1, 0),
    "mobilenetv2 1x1 144->24 56": ("conv", 144, 24, 56, 1, 1, 0),
    "mobilenetv2 1x1 384->64 14": ("conv", 384, 64, 14, 1, 1, 0),
    "bert dense 128x256->1024": ("gemm", 128, 256, 1024),
    "bert dense 128x1024->256": ("gemm", 128, 1024, 256),
    "decoder dense 16x512->1536": ("gemm", 16, 512, 1536),
    "decoder dense 128x512->1408": ("gemm", 128, 512, 1408),
    # Qwen2.5-0.5B's prefill (a 128-token chunk): weights of 17 MB, far past the L2 cache.
    "qwen0.5b mlp up 128x896->4864": ("gemm", 128, 896, 4864),
    "qwen0.5b mlp down 128x4864->896": ("gemm", 128, 4864, 896),
    "qwen0.5b attn out 128x896->896": ("gemm", 128, 896, 896),
    "qwen0.5b mlp up 16x896->4864": ("gemm", 16, 896, 4864),
}


def case_model(spec: tuple) -> tuple[Any, list[int], float]:
    """The one-operator ONNX model of ``spec``, its input shape and its multiply-add FLOPs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def weight(name: str, shape: tuple[int, ...]) -> Any:
        return numpy_helper.from_array(rng.standard_normal(shape).astype("float32") * 0.1, name)

    if spec[0] == "conv":
        _, cin, cout, size, kernel, stride, pad = spec
        out = (size + 2 * pad - kernel) // stride + 1
        shape, out_shape = [1, cin, size, size], [1, cout, out, out]
        nodes = [
            helper.make_node(
                "Conv",
                ["x", "w", "b"],
                ["c"],
                kernel_shape=[kernel] * 2,
                strides=[stride] * 2,
                pads=[pad] * 4,
            ),
            helper.make_node("Relu", ["c"], ["y"]),
        ]
        weights = [weight("w", (cout, cin, kernel, kernel)), weight("b", (cout,))]
        flops = 2.0 * cin * cout * kernel * kernel * out * out
    else:
        _, rows, inner, cols = spec
        shape, out_shape = [rows, inner], [rows, cols]
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["s"]),
            helper.make_node("Relu", ["s"], ["y"]),
        ]
        weights = [weight("w", (inner, cols)), weight("b", (cols,))]
        flops = 2.0 * rows * inner * cols
    graph = helper.make_graph(
        nodes,
        "case",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model, shape, flops


def bench_case(name: str, spec: tuple, threads: int, rounds: int, work: Path) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort
    import tvm

    from bench.bench_peers import _timer, interleaved, variant_label
    from compiler.peers import find_peer, load_peers, peer_task_module, peer_variants
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target

    model, shape, flops = case_model(spec)
    path = work / "case.onnx"
    onnx.save(model, path)
    target = cpu_target(threads)
    prepared = prepare_model(path, target)
    (task,) = [e.dispatched[0] for e in prepared.partition.extracted if find_peer(e.dispatched[0])]
    x = np.random.default_rng(1).standard_normal(shape).astype("float32")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    timers = {"ONNX Runtime": _timer(lambda: session.run(None, {"x": x}))}

    load_peers()
    checks: dict[str, float] = {}
    for call in peer_variants(task):
        label = variant_label(call)
        func = tvm.tirx.build(peer_task_module(task, call=call), target=target.tvm_target())
        tensors = _task_arguments(task, call, x, model)
        func(*tensors)
        out = tensors[-1].numpy()
        checks[label] = float(np.abs(_to_nchw(out, spec) - expected).max())
        timers[label] = _timer(lambda f=func, t=tensors: f(*t))
    medians = interleaved(timers, rounds)
    return {
        "case": name,
        "spec": list(spec),
        "gflop": flops / 1e9,
        "default": variant_label(find_peer(task)),
        "ms": {k: v * 1e3 for k, v in medians.items()},
        "gflops": {k: flops / v / 1e9 for k, v in medians.items()},
        "max_abs_error": checks,
    }


def _to_nchw(out: np.ndarray, spec: tuple) -> np.ndarray:
    return out.transpose(0, 3, 1, 2) if spec[0] == "conv" else out


def _task_arguments(task: Any, call: Any, x: np.ndarray, model: Any) -> list:
    """The task's arguments from the case's input and weights, in the task's layouts (NHWC
    input, HWIO weight for a convolution), and a zero output."""
    import tvm
    from onnx import numpy_helper

    weights = {w.name: numpy_helper.to_array(w) for w in model.graph.initializer}
    out = []
    for param in task["main"].params:
        dims = tuple(int(d) for d in param.shape)
        name = str(param.name)
        if name == call.inputs[0]:
            value = x.transpose(0, 2, 3, 1) if len(dims) == 4 else x
        elif name == call.inputs[1]:
            value = weights["w"].transpose(2, 3, 1, 0) if len(dims) == 4 else weights["w"]
        elif name == str(task["main"].params[-1].name):
            value = np.zeros(dims, "float32")
        else:  # the bias, broadcast to the task's shape for it
            value = weights["b"].reshape(dims)
        assert value.shape == dims, (name, value.shape, dims)
        out.append(tvm.runtime.tensor(np.ascontiguousarray(value, dtype="float32")))
    return out


def render(run: dict[str, Any]) -> str:
    m = run["machine"]
    labels = ["ONNX Runtime", "packed", "im2col", "sgemm", "winograd_f2", "winograd_f4"]
    present = [lab for lab in labels if any(lab in c["ms"] for c in run["cases"])]
    lines = [
        f"# Packed-weight GEMM peers vs OpenBLAS vs ONNX Runtime, {run['date']}",
        "",
        f"Machine: {m['cpu_model']} (LLVM `{m['llvm_cpu']}`), {run['threads']} threads each; "
        f"TVM {m['tvm']}, ONNX Runtime {m['onnxruntime']}; {run['rounds']} interleaved "
        "rounds, medians. Command: `python -m bench.bench_gemm_packed "
        + " ".join(run["argv"])
        + "`.",
        "",
        "ms (GFLOP/s) per operator with bias and ReLU; TVM columns are the task's library "
        "peer variants (`packed`: the shim's GEMM, weight packed once; `im2col`/`sgemm`: "
        "OpenBLAS; the zero-trial default in bold).",
        "",
        "| operator | GFLOP | " + " | ".join(present) + " | packed / ORT | packed / OpenBLAS |",
        "|---" * (len(present) + 4) + "|",
    ]
    for c in run["cases"]:
        cells = []
        for lab in present:
            if lab not in c["ms"]:
                cells.append("—")
                continue
            text = f"{c['ms'][lab]:.3f} ({c['gflops'][lab]:.0f})"
            cells.append(f"**{text}**" if lab == c["default"] else text)
        blas = c["ms"].get("im2col") or c["ms"].get("sgemm")
        packed = c["ms"].get("packed")
        lines.append(
            f"| {c['case']} | {c['gflop']:.3f} | "
            + " | ".join(cells)
            + f" | {packed / c['ms']['ONNX Runtime']:.2f}x | "
            + (f"{packed / blas:.2f}x |" if packed and blas else "— |")
        )
    worst = max(err for c in run["cases"] for err in c["max_abs_error"].values())
    lines += ["", f"Every variant matched ONNX Runtime (largest max abs error {worst:.1e})."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from bench.bench_levers import machine

    date = dt.date.today().isoformat()
    run = {
        "date": date,
        "threads": args.threads,
        "rounds": args.rounds,
        "machine": machine(),
        "argv": argv if argv is not None else sys.argv[1:],
        "cases": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-gemm-") as tmp:
        for name in args.cases:
            run["cases"].append(bench_case(name, CASES[name], args.threads, args.rounds, Path(tmp)))
            (args.out / f"gemm_packed_{date}.json").write_text(json.dumps(run, indent=1))
            (args.out / f"gemm_packed_{date}.md").write_text(render(run))
            print(json.dumps(run["cases"][-1]), flush=True)
    print(render(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
