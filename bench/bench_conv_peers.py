"""The convolution peer's algorithms side by side on single ResNet-18 tasks (issues 19, 21).

    python -m bench.bench_conv_peers [--threads 2] [--rounds 7] [--baseline COMMIT]
        [--min-secs 0.1] [--pause 0.05] [--no-model] [--out DIR]

For every ResNet-18 task whose anchor is a convolution with a library peer
(:func:`compiler.peers.find_peer`; the model exported at run time, batch 1, 224x224), in one
process, in ``--rounds`` interleaved rounds (each variant runs for at least ``--min-secs`` per
round, in a new random order each round, after ``--pause`` seconds of sleep; the table gives the
median round):

- **baseline im2col**: the peer as the shim at ``--baseline`` (default: the last commit before
  the Winograd shim) computes it (compiled here with its entry points renamed, so both shims
  live in one process);
- **im2col**, **winograd_f2**, **winograd_f4**: every variant of
  :func:`compiler.peers.peer_variants` with today's shim (the Winograd ones for 3x3 stride-1
  convolutions only), and which of them :func:`compiler.peers.find_peer` picks by default;
- **ONNX Runtime** on the same operator: one ``Conv`` (+ the residual ``Add``) + ``Relu`` as the
  task has them, NCHW as ONNX Runtime takes it.

And (unless ``--no-model``) the **whole model** the same way, interleaved: ONNX Runtime and the
zero-trial build with peers (:func:`compiler.build.builder.build_zero_trial`) three times, its
convolutions on the baseline shim's im2col, on today's im2col only, and on
:func:`compiler.peers.find_peer`'s default algorithms; each exported without the shim (resolved
from the shims loaded into this process, as MetaSchedule's runner does) and checked against
ONNX Runtime.

Every TVM variant is the whole task (library call + its TIR epilogue) built with
``tvm.tirx.build`` and called on fixed random arguments (so a Winograd weight is transformed on
the first call and served from the shim's cache afterwards, as a model's constant weight is);
each is checked against the task's own TIR once before timing (max abs error, relative to the
output's largest magnitude, in the JSON). ``TVM_NUM_THREADS`` is set to ``--threads`` before TVM
starts; ONNX Runtime gets ``--threads`` intra-op threads. Writes ``conv_peers_<date>.json`` and
``.md`` (machine, date, load average before and after) into ``--out`` (default
``bench/results``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_peers import interleaved

REPO = Path(__file__).resolve().parents[1]
#: The shim before the Winograd work (im2col copying a tap at a time, row blocks only).
BASELINE = "e09e20d"
SUFFIX = "_baseline"


def _load_baseline(commit: str, work: Path) -> None:
    """Compile the shim of ``commit`` with its entry points suffixed :data:`SUFFIX` and load it
    ``RTLD_GLOBAL`` (the flags :mod:`compiler.peers.library` uses)."""
    import tvm

    from compiler.peers.library import find_blas

    source = work / "shim_baseline.cc"
    source.write_text(
        subprocess.run(
            ["git", "show", f"{commit}:compiler/peers/shim.cc"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    blas = find_blas()
    runtime = Path(tvm.__file__).parent / "lib"
    out = work / "libshim_baseline.so"
    renames = [
        f"-D{name}={name}{SUFFIX}" for name in ("tunehub_peer_gemm", "tunehub_peer_conv2d_nhwc")
    ]
    subprocess.run(
        [
            "g++",
            "-O2",
            "-std=c++17",
            "-fPIC",
            *blas.defines(),
            *renames,
            "-shared",
            str(source),
            "-o",
            str(out),
            "-Wl,--no-as-needed",
            *blas.link_flags(),
            f"-L{runtime}",
            "-ltvm_runtime",
            f"-Wl,-rpath,{runtime}",
        ],
        check=True,
    )
    ctypes.CDLL(str(out), mode=ctypes.RTLD_GLOBAL)


@contextlib.contextmanager
def _baseline_functions() -> Iterator[None]:
    """Peers built inside call the baseline shim's (suffixed) entry points, without the epilogue
    arguments (a baseline older than the shim's epilogue ignores them: the epilogue stays TIR)."""
    from compiler.peers import calls, epilogue

    saved = dict(calls.FUNCTIONS)
    calls.FUNCTIONS.update({k: v + SUFFIX for k, v in saved.items()})
    epilogue.FUSE_EPILOGUE = False
    try:
        yield
    finally:
        calls.FUNCTIONS.clear()
        calls.FUNCTIONS.update(saved)
        epilogue.FUSE_EPILOGUE = True


def _ort_conv(task_mod: Any, call: Any, threads: int) -> Callable[[], Any] | None:
    """ONNX Runtime running the task's operator (Conv with bias, the residual Add when the task
    has one, Relu) on random NCHW data; ``None`` for a task of another form."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    params = task_mod["main"].params
    shapes = [tuple(int(d) for d in p.shape) for p in params]
    config = dict(call.config)
    x, w, bias, *rest = shapes
    out = rest[-1]
    residual = len(rest) == 2
    if len(rest) not in (1, 2) or len(w) != 4 or bias[-1] != w[3]:
        return None
    kh, kw, c, k = w
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((k, c, kh, kw)).astype("float32"), "w"),
        numpy_helper.from_array(rng.standard_normal(k).astype("float32"), "b"),
    ]
    pads_bottom = (
        (out[1] - 1) * config["stride_h"]
        + (kh - 1) * config["dilation_h"]
        + 1
        - x[1]
        - config["pad_top"]
    )
    pads_right = (
        (out[2] - 1) * config["stride_w"]
        + (kw - 1) * config["dilation_w"]
        + 1
        - x[2]
        - config["pad_left"]
    )
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["c"],
            kernel_shape=[kh, kw],
            strides=[config["stride_h"], config["stride_w"]],
            dilations=[config["dilation_h"], config["dilation_w"]],
            pads=[config["pad_top"], config["pad_left"], max(0, pads_bottom), max(0, pads_right)],
        )
    ]
    nchw = lambda s: [s[0], s[3], s[1], s[2]]  # noqa: E731
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, nchw(x))]
    last = "c"
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, nchw(out)))
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    graph = helper.make_graph(
        nodes,
        "conv",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, nchw(out))],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feed = {"x": rng.standard_normal(nchw(x)).astype("float32")}
    if residual:
        feed["r"] = rng.standard_normal(nchw(out)).astype("float32")
    return lambda: session.run(None, feed)


def _tvm_call(mod: Any, target: Any, args: list[np.ndarray]) -> tuple[Callable[[], Any], Any]:
    import tvm

    func = tvm.tirx.build(mod, target=target.tvm_target())
    tensors = [tvm.runtime.tensor(a) for a in args]
    return (lambda: func(*tensors)), tensors


def _conv_flops(task_mod: Any) -> float:
    """2 * N*OH*OW*K * KH*KW*C: the convolution's multiply-adds (the epilogue not counted)."""
    shapes = [tuple(int(d) for d in p.shape) for p in task_mod["main"].params]
    (kh, kw, c, k), out = shapes[1], shapes[-1]
    return 2.0 * out[0] * out[1] * out[2] * k * kh * kw * c


def bench(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from bench.bench_peers import _timer
    from compiler.peers import find_peer, load_peers, peer_task_module, peer_variants
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.export import export_onnx

    load_peers()
    _load_baseline(args.baseline, work)
    target = cpu_target(args.threads)
    prepared = prepare_model(export_onnx("resnet18", work / "resnet18.onnx"), target)
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        task_mod = extracted.dispatched[0]
        call = find_peer(task_mod)
        if call is None or call.kind != "conv2d_nhwc":
            continue
        shapes = [tuple(int(d) for d in p.shape) for p in task_mod["main"].params]
        data = [rng.standard_normal(s).astype("float32") for s in shapes]
        reference, ref_tensors = _tvm_call(task_mod, target, data)
        reference()
        expected = ref_tensors[-1].numpy()
        timers: dict[str, Callable[[], float]] = {}
        errors: dict[str, float] = {}
        with _baseline_functions():
            base = peer_task_module(task_mod, call=_as_im2col(task_mod))
        builds = [("baseline im2col", base)] + [
            (v.algorithm, peer_task_module(task_mod, call=v)) for v in peer_variants(task_mod)
        ]
        for label, mod in builds:
            run, tensors = _tvm_call(mod, target, data)
            run()
            errors[label] = float(
                np.abs(tensors[-1].numpy() - expected).max() / np.abs(expected).max()
            )
            timers[label] = _timer(run, args.min_secs)
        ort_run = _ort_conv(task_mod, call, args.threads)
        if ort_run is not None:
            timers["ONNX Runtime"] = _timer(ort_run, args.min_secs)
        secs = interleaved(timers, args.rounds, args.pause)
        config = dict(call.config)
        (kh, kw, c, k), out = shapes[1], shapes[-1]
        rows.append(
            {
                "task": task.name,
                "weight": task.weight,
                "key": task.key,
                "shape": f"{shapes[0][1]}x{shapes[0][2]}x{c} -> {out[1]}x{out[2]}x{k}, "
                f"{kh}x{kw} s{config['stride_h']}",
                "mflops": _conv_flops(task_mod) / 1e6,
                "default": call.algorithm,
                "ms": {label: s * 1e3 for label, s in secs.items()},
                "max error / max |y|": errors,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return {"tasks": rows}


@contextlib.contextmanager
def _algorithms(choice: str) -> Iterator[None]:
    """Peers built inside use ``choice``: ``default`` (find_peer's rule), ``im2col`` (today's
    shim, im2col for every convolution) or ``baseline`` (the baseline shim's im2col)."""
    from compiler.peers import match

    saved = match.default_conv_algorithm
    if choice != "default":
        match.default_conv_algorithm = lambda shape: "im2col"
    try:
        if choice == "baseline":
            with _baseline_functions():
                yield
        else:
            yield
    finally:
        match.default_conv_algorithm = saved


def bench_model(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """ResNet-18 end to end: ONNX Runtime and the zero-trial build with peers on each choice of
    convolution algorithm (module docstring)."""
    import onnxruntime as ort
    import tvm
    from tvm import relax

    from bench.bench_peers import _timer
    from compiler.build.builder import build_zero_trial, export_library
    from compiler.build.verify import random_inputs
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.export import export_onnx

    path = export_onnx("resnet18", work / "resnet18.onnx")
    target = cpu_target(args.threads)
    prepared = prepare_model(path, target)
    inputs = random_inputs(prepared.model.inputs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    (expected,) = session.run(None, feed)
    timers = {"ONNX Runtime": _timer(lambda: session.run(None, feed), args.min_secs)}
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    errors: dict[str, float] = {}
    for choice in ("baseline", "im2col", "default"):
        with _algorithms(choice):
            executable, keys = build_zero_trial(prepared.mod, target, tasks)
        library = export_library(executable, work / f"resnet18-{choice}.so")
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(library)), tvm.cpu())
        vm.set_input("main", *[tvm.runtime.tensor(a) for a in inputs])
        vm.invoke_stateful("main")
        out = vm.get_outputs("main")
        out = (out[0] if isinstance(out, (list, tuple)) else out).numpy()
        label = f"zero-trial + peers, {choice}"
        errors[label] = float(np.abs(out - expected).max())
        timers[label] = _timer(lambda vm=vm: vm.invoke_stateful("main"), args.min_secs)
        print(
            label,
            f"{len(keys)} tasks on peers, max abs error vs ORT {errors[label]:.1e}",
            flush=True,
        )
    secs = interleaved(timers, args.rounds, args.pause)
    return {
        "ms": {k: v * 1e3 for k, v in secs.items()},
        "max abs error vs ORT": errors,
        "max |y|": float(np.abs(expected).max()),
    }


def _as_im2col(task_mod: Any) -> Any:
    from compiler.peers import peer_variants

    return next(v for v in peer_variants(task_mod) if v.algorithm == "im2col")


def _load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


LABELS = ("baseline im2col", "im2col", "winograd_f2", "winograd_f4", "ONNX Runtime")


def render(run: dict[str, Any]) -> str:
    m = run["machine"]
    lines = [
        f"# Convolution peer algorithms, {run['date']}",
        "",
        f"Machine: {m['cpu_model']} (LLVM `{m['llvm_cpu']}`, {m['logical_cpus']} logical CPUs), "
        f"{run['threads']} threads; TVM {m['tvm']}, ONNX Runtime {m['onnxruntime']}; "
        f"{run['rounds']} rounds of >= {run['min_secs']} s per variant, in a new random order "
        f"each round with {run.get('pause', 0)} s of sleep before each, medians. "
        f"Command: `TVM_NUM_THREADS={run['threads']} python -m bench.bench_conv_peers "
        f"--threads {run['threads']} --rounds {run['rounds']}` at commit {run['commit']}; "
        f"baseline shim: {run['baseline']}.",
        "",
        f"Load before: `{run['load before']}`; after: `{run['load after']}`.",
        "",
        "ms per call of the whole task (library call + TIR epilogue) and GFLOP/s of the "
        "convolution alone (2*N*OH*OW*K*KH*KW*C); ONNX Runtime runs the same Conv (+ Add) + Relu "
        "in NCHW. *default*: what `find_peer` picks. Ratios are against the baseline im2col.",
        "",
        "| task | w | shape | MFLOP | " + " | ".join(LABELS) + " | default | default / baseline "
        "| default / ORT |",
        "|---|---|---|---|" + "---|" * len(LABELS) + "---|---|---|",
    ]
    totals = {label: 0.0 for label in (*LABELS, "default")}
    for r in run["tasks"]:
        ms = r["ms"]

        def cell(label: str, r: dict = r, ms: dict = ms) -> str:
            if label not in ms:
                return "—"
            return f"{ms[label]:.3f} ({r['mflops'] / ms[label]:.0f})"

        default = ms[r["default"]]
        for label in LABELS:
            totals[label] += r["weight"] * ms.get(
                label, ms["im2col"] if label.startswith("winograd") else 0.0
            )
        totals["default"] += r["weight"] * default
        ort = ms.get("ONNX Runtime")
        lines.append(
            f"| {r['task']} | {r['weight']} | {r['shape']} | {r['mflops']:.1f} | "
            + " | ".join(cell(label) for label in LABELS)
            + f" | {r['default']} | {default / ms['baseline im2col']:.2f}x | "
            + (f"{default / ort:.2f}x |" if ort else "— |")
        )
    lines += [
        "",
        "Weighted sums over these tasks (ms; weight = uses in the model; a Winograd column "
        "counts im2col where the task has no Winograd variant): "
        + ", ".join(f"{label} {totals[label]:.2f}" for label in (*LABELS, "default"))
        + ".",
        "",
        "Max abs error of each variant against the task's own TIR, relative to the output's "
        "largest magnitude (random normal data and weights):",
        "",
    ]
    for r in run["tasks"]:
        errs = ", ".join(f"{k} {v:.1e}" for k, v in r["max error / max |y|"].items())
        lines.append(f"- {r['task']}: {errs}")
    if "model" in run:
        model = run["model"]
        ort_ms = model["ms"]["ONNX Runtime"]
        lines += [
            "",
            "## ResNet-18 end to end (ms, batch 1, 224x224)",
            "",
            "Interleaved with each other in the same rounds, after the single tasks; "
            f"the output's largest magnitude is {model.get('max |y|', float('nan')):.3g}.",
            "",
            "| build | ms | / ONNX Runtime | max abs error vs ONNX Runtime |",
            "|---|---|---|---|",
        ]
        for label, ms in model["ms"].items():
            err = model["max abs error vs ORT"].get(label)
            lines.append(
                f"| {label} | {ms:.2f} | {ms / ort_ms:.2f}x | "
                + (f"{err:.1e} |" if err is not None else "— |")
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-secs", type=float, default=0.1)
    parser.add_argument(
        "--pause",
        type=float,
        default=0.05,
        help="seconds of sleep before each timed run (spinning threads idle)",
    )
    parser.add_argument("--baseline", default=BASELINE)
    parser.add_argument(
        "--no-model",
        dest="model",
        action="store_false",
        help="only the single tasks, not ResNet-18 end to end",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    from bench.bench_levers import machine

    date = dt.date.today().isoformat()
    run: dict[str, Any] = {
        "date": date,
        "threads": args.threads,
        "rounds": args.rounds,
        "min_secs": args.min_secs,
        "pause": args.pause,
        "machine": machine(),
        "baseline": args.baseline,
        "load before": _load(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        run.update(bench(args, Path(tmp)))
        if args.model:
            run["model"] = bench_model(args, Path(tmp))
    run["load after"] = _load()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"conv_peers_{date}.json").write_text(json.dumps(run, indent=1))
    (args.out / f"conv_peers_{date}.md").write_text(render(run))
    print(render(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
