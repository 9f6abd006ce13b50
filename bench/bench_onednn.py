"""oneDNN as a candidate convolution library (issue 21): per convolution, side by side in one run.

    apt-get install libdnnl-dev   (Debian's oneDNN 2.6; PyPI's ``onednn`` wheel is built for SYCL)
    .venv/bin/python -m bench.bench_onednn [--threads 2] [--out bench/results]

For ResNet-18's and MobileNetV2's kinds of convolution (+ bias + ReLU, batch 1, float32):
oneDNN's primitive on NHWC tensors with its preferred weight layout (``bench/onednn_conv.cc``,
weights reordered once, like a prepacked peer), ONNX Runtime (MLAS) on the one-convolution ONNX
model, and TuneHub's zero-trial build of that model (``tunehub compile`` without a database:
library peers and default schedules), both as the whole model and as its convolution kernel
alone, timed in the model through the Relax VM's instrument hook (the model also transposes
its NCHW input and output, which a whole network does once, not per convolution). Latencies
are medians of three rounds of :func:`bench.bench_peers.interleaved` (a random order and a
pause each round); the kernel column is measured after them. Writes
``<out>/onednn_<date>.md`` and ``.json``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHAPES = [  # name, H (= W), C, O, K, stride, pad, groups
    ("resnet18 stem 7x7 s2", 224, 3, 64, 7, 2, 3, 1),
    ("resnet18 3x3 64@56", 56, 64, 64, 3, 1, 1, 1),
    ("resnet18 3x3 256@14", 14, 256, 256, 3, 1, 1, 1),
    ("mobilenetv2 stem 3x3 s2", 224, 3, 32, 3, 2, 1, 1),
    ("mobilenetv2 dw 3x3 32@112", 112, 32, 32, 3, 1, 1, 32),
    ("mobilenetv2 dw 3x3 144@56 s2", 56, 144, 144, 3, 2, 1, 144),
    ("mobilenetv2 1x1 16->96 @112", 112, 16, 96, 1, 1, 0, 1),
    ("mobilenetv2 1x1 96->24 @56", 56, 96, 24, 1, 1, 0, 1),
]


def conv_model(h: int, c: int, o: int, k: int, s: int, p: int, g: int, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = (rng.standard_normal((o, c // g, k, k)) * 0.1).astype("float32")
    bias = rng.standard_normal(o).astype("float32")
    out = (h + 2 * p - k) // s + 1
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[k, k], strides=[s, s],
                          pads=[p] * 4, group=g),
         helper.make_node("Relu", ["y"], ["z"])],
        "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, h, h])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, o, out, out])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def onednn_timer(binary: Path, shape: tuple[int, ...], threads: int) -> Callable[[], float]:
    """A round of the oneDNN program: it times its own calls (median of 15 x 20, after a warm-up)
    and prints microseconds; the round returns seconds a call."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}

    def round_secs() -> float:
        out = subprocess.run([str(binary), *map(str, shape)], env=env, capture_output=True,
                             text=True, check=True).stdout.split()
        return float(out[0]) / 1e6

    return round_secs


def onednn_impl(binary: Path, shape: tuple[int, ...]) -> str:
    """The implementation oneDNN picked for ``shape`` (e.g. ``brgconv:avx512_core``)."""
    return subprocess.run([str(binary), *map(str, shape)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def kernel_micros(library, x: np.ndarray) -> float:
    """The convolution kernels' time in the model (median per call, summed), by the VM's
    instrument hook."""
    import tvm

    arg = tvm.runtime.tensor(x, library.device)
    times: dict[str, list[float]] = {}
    started: list[float] = [0.0]

    def hook(func, name, before, ret, *args) -> int:
        now = time.perf_counter()
        if before:
            started[0] = now
        else:
            times.setdefault(name, []).append(now - started[0])
        return 0

    for _ in range(5):
        library.vm["main"](arg)
    library.vm.set_instrument(hook)
    for _ in range(60):
        library.vm["main"](arg)
    library.vm.set_instrument(lambda *a: 0)
    return sum(statistics.median(v) * 1e6 for k, v in times.items() if "conv" in k)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    import onnx
    import tvm

    from bench.bench_peers import _ort_timer, _timer, interleaved
    from compiler.peers import load_peers
    from compiler.runner import LoadedLibrary

    load_peers()
    work = Path(tempfile.mkdtemp(prefix="onednn-"))
    binary = work / "onednn_conv"
    subprocess.run(["g++", "-O2", "-o", str(binary), str(REPO / "bench" / "onednn_conv.cc"),
                    "-ldnnl"], check=True)
    rows = []
    for index, (name, h, c, o, k, s, p, g) in enumerate(SHAPES):
        model = conv_model(h, c, o, k, s, p, g)
        path = work / f"conv{index}.onnx"
        onnx.save(model, path)
        subprocess.run([str(Path(sys.executable).with_name("tunehub")), "compile", str(path),
                        "-o", str(work / f"conv{index}"), "--force"], check=True,
                       capture_output=True, cwd=REPO)
        library = LoadedLibrary(work / f"conv{index}" / "model.so")
        x = np.random.default_rng(1).standard_normal((1, c, h, h)).astype("float32")
        arg = tvm.runtime.tensor(x, library.device)
        shape = (1, h, h, c, o, k, s, p, g)
        medians = interleaved({
            "onednn": onednn_timer(binary, shape, args.threads),
            "ort": _ort_timer(path, [x], args.threads),
            "tunehub model": _timer(lambda lib=library, a=arg: lib.vm["main"](a)),
        }, rounds=3)
        row = {"conv": name, "onednn impl": onednn_impl(binary, shape),
               **{key: value * 1e6 for key, value in medians.items()},
               "tunehub kernel": kernel_micros(library, x)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    date = dt.date.today().isoformat()
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# oneDNN as a convolution peer candidate ({date})", "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, "
        f"{args.threads} threads for every library. Command: `python -m bench.bench_onednn "
        f"--threads {args.threads}`. Microseconds a call, medians of 3 interleaved rounds.", "",
        "| convolution (+bias+ReLU) | oneDNN 2.6 (impl) | ONNX Runtime | TuneHub zero-trial "
        "model | TuneHub conv kernel in the model | TuneHub kernel / oneDNN |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['conv']} | {r['onednn']:.1f} ({r['onednn impl']}) | {r['ort']:.1f} "
                     f"| {r['tunehub model']:.1f} | {r['tunehub kernel']:.1f} | "
                     f"{r['tunehub kernel'] / r['onednn']:.2f}x |")
    (args.out / f"onednn_{date}.md").write_text("\n".join(lines) + "\n")
    (args.out / f"onednn_{date}.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
