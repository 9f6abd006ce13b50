"""Per-lever benchmark of issue 19: single CPU tasks at equal trials, against ONNX Runtime.

    python -m bench.bench_levers [--cases conv3x3_64_56 ...] [--trials 64] [--threads 8]
        [--rounds 15] [--seed 0] [--out DIR]
    python -m bench.bench_levers --render RESULT.json [...] [--out DIR]

Each case is one operator of an example network (ResNet-18's 3x3 convolutions 64→64 at 56² and
256→256 at 14², MobileNetV2's depthwise 3x3 and pointwise 1x1 convolutions at 56², a BERT FFN
dense), written as a one-operator ONNX model with seeded weights. The TVM side runs it through
the real compile path (``from_onnx`` → :func:`compiler.frontends.importer.normalize` →
:func:`compiler.partition.partition` → :func:`compiler.build.builder.build`) once per variant of
:class:`compiler.compile_options.CompileOptions` (``NCHW`` today, ``NCHW+prepack``, ``NHWC``,
``NHWC+prepack``). Per variant the heaviest task (the operator; NHWC's edge transposes are left
out) is tuned with MetaSchedule's evolutionary search, the same trials, batch, cost model
(``random``: the GPU machine has no xgboost) and seed for every variant, with TuneHub's own
builder and runner (:mod:`tuner.measuring.builder_runner`). A variant whose task hashes like an
earlier one's (BERT's dense: no convolution to re-layout) reuses that result and says so.

Then, in one process: every variant's full module is built with its database and checked against
ONNX Runtime (max abs error), and every tuned kernel is timed alone (``time_evaluator`` on the
best schedule, weights in the layout that schedule reads, as MetaSchedule measures it) side by
side with ONNX Runtime running the same one-operator model, alternating, ``--rounds`` rounds of
at least ``min_ms`` each; the table gives medians of rounds. A kernel's time excludes the
NCHW↔NHWC transposes at its edges (inside a network they occur once per model, not per layer);
ONNX Runtime's includes whatever reordering its kernel does internally.

Threads: the TVM target has ``num-cores = --threads`` and ``TVM_NUM_THREADS`` is set to it;
ONNX Runtime gets ``intra_op_num_threads = --threads``. Writes ``levers_<date>.json`` after every
case and ``levers_<date>.md`` (machine, date, threads) into ``--out`` (default
``bench/results``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

VARIANTS: dict[str, tuple[str, bool]] = {
    "NCHW (today)": ("NCHW", False),
    "NCHW+prepack": ("NCHW", True),
    "NHWC": ("NHWC", False),
    "NHWC+prepack": ("NHWC", True),
}


@dataclass(frozen=True)
class Case:
    """One operator: ``build()`` returns its ONNX model (input ``x``) and a description."""

    name: str
    network: str
    description: str
    build: Callable[[], Any]


def _conv_model(
    cin: int, cout: int, size: int, kernel: int, groups: int, activation: str | None
) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(cin * 1000 + cout + size)
    weight = (rng.standard_normal((cout, cin // groups, kernel, kernel)) * 0.1).astype("float32")
    bias = (rng.standard_normal(cout) * 0.1).astype("float32")
    pad = kernel // 2
    nodes = [
        helper.make_node(
            "Conv",
            ["x", "w", "b"],
            ["conv"],
            kernel_shape=[kernel, kernel],
            pads=[pad] * 4,
            group=groups,
        )
    ]
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")]
    last = "conv"
    if activation == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y"]))
        last = "y"
    elif activation == "relu6":
        inits += [
            numpy_helper.from_array(np.array(0.0, "float32"), "lo"),
            numpy_helper.from_array(np.array(6.0, "float32"), "hi"),
        ]
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y"]))
        last = "y"
    graph = helper.make_graph(
        nodes,
        "op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, [1, cout, size, size])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _dense_model(rows: int, cin: int, cout: int) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(rows + cin + cout)
    weight = (rng.standard_normal((cin, cout)) * 0.05).astype("float32")
    bias = (rng.standard_normal(cout) * 0.1).astype("float32")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["y"]),
        ],
        "op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cin])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cout])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CASES: dict[str, Case] = {
    c.name: c
    for c in (
        Case(
            "conv3x3_64_56",
            "ResNet-18",
            "conv 3x3 64→64, 56², + bias + ReLU",
            lambda: _conv_model(64, 64, 56, 3, 1, "relu"),
        ),
        Case(
            "conv3x3_256_14",
            "ResNet-18",
            "conv 3x3 256→256, 14², + bias + ReLU",
            lambda: _conv_model(256, 256, 14, 3, 1, "relu"),
        ),
        Case(
            "dwconv3x3_144_56",
            "MobileNetV2",
            "depthwise 3x3, 144 ch, 56², + bias + ReLU6",
            lambda: _conv_model(144, 144, 56, 3, 144, "relu6"),
        ),
        Case(
            "pwconv1x1_144_24_56",
            "MobileNetV2",
            "pointwise 1x1 144→24, 56², + bias",
            lambda: _conv_model(144, 24, 56, 1, 1, None),
        ),
        Case(
            "dense_128_256_1024",
            "BERT",
            "dense [128, 256] x [256, 1024] + bias",
            lambda: _dense_model(128, 256, 1024),
        ),
    )
}


def _relax_module(proto: Any) -> Any:
    from tvm.relax.frontend.onnx import from_onnx

    from compiler.frontends.importer import normalize

    return normalize(from_onnx(proto, keep_params_in_input=False))


def _restore_affinity() -> None:
    """TVM's runtime pins the calling thread after a VM run (STACK.md); give builder pools and
    the next timings every CPU back."""
    try:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        pass


def _tune(task: Any, target: Any, trials: int, per_iter: int, seed: int, work: Path) -> Any:
    from tvm.s_tir import meta_schedule as ms

    from tuner.measuring.builder_runner import MeasureConfig, make_builder, make_runner

    measure = MeasureConfig()
    work.mkdir(parents=True, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(work))
    context = ms.TuneContext(
        mod=task.dispatched[0],
        target=target,
        space_generator="post-order-apply",
        search_strategy="evolutionary",
        task_name=str(task.task_name),
        rand_state=seed,
    )
    with closing(make_builder(measure)) as builder:
        return ms.tune.tune_tasks(
            tasks=[context],
            task_weights=[1.0],
            work_dir=str(work),
            max_trials_global=trials,
            max_trials_per_task=trials,
            num_trials_per_iter=per_iter,
            builder=builder,
            runner=make_runner(measure),
            database=database,
            cost_model="random",
        )


def _kernel_timer(task: Any, target: Any, database: Any, min_ms: int) -> Callable[[], float]:
    """Seconds per call of the task's best schedule, alone (weights pre-laid-out, random data)."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from tuner.measuring.builder_runner import fast_build

    mod = task.dispatched[0]
    sch = database.query_schedule(mod, target, workload_name="main")
    if sch is None:
        raise RuntimeError(f"no valid record for {task.task_name}")
    lowered = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
    func = lowered["main"]
    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    args = [  # TVM 0.27 PrimFunc params carry their buffer's shape and dtype
        tvm.runtime.tensor(
            rng.standard_normal([int(d) for d in param.shape]).astype(str(param.dtype)), dev
        )
        for param in func.params
    ]
    runtime = fast_build(sch.mod, target, None)
    evaluator = runtime.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=min_ms)
    return lambda: float(evaluator(*args).mean)


def _ort_session(proto: Any, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(
        proto.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _ort_timer(session: Any, feed: dict[str, np.ndarray], min_ms: int) -> Callable[[], float]:
    def sample() -> float:
        calls, start = 0, time.perf_counter()
        while True:
            session.run(None, feed)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed * 1000 >= min_ms:
                return elapsed / calls

    return sample


def _side_by_side(
    timers: dict[str, Callable[[], float]], rounds: int
) -> dict[str, dict[str, float]]:
    """Median and spread of ``rounds`` alternating samples of every timer (after one warm-up)."""
    for timer in timers.values():
        timer()
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for index in range(rounds):
        order = list(timers) if index % 2 == 0 else list(reversed(timers))
        for name in order:
            samples[name].append(timers[name]())
    return {
        name: {
            "median_ms": statistics.median(v) * 1e3,
            "min_ms": min(v) * 1e3,
            "max_ms": max(v) * 1e3,
        }
        for name, v in samples.items()
    }


def run_case(case: Case, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Tune every variant of ``case``, verify its builds, time kernels and ONNX Runtime."""
    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.compile_options import CompileOptions
    from compiler.partition import partition
    from compiler.target import cpu_target

    proto = case.build()
    mod = _relax_module(proto)
    feed = {
        "x": np.random.default_rng(1)
        .standard_normal([d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim])
        .astype("float32")
    }
    session = _ort_session(proto, args.threads)
    expected = session.run(None, feed)[0]
    variants: dict[str, dict[str, Any]] = {}
    tuned: dict[str, tuple[Any, Any, Any]] = {}
    by_key: dict[str, str] = {}
    for label, (layout, prepack) in VARIANTS.items():
        spec = cpu_target(args.threads, CompileOptions(layout, prepack))  # type: ignore[arg-type]
        parts = partition(mod, spec)
        anchor, task = parts.tasks[0], parts.extracted[0]
        row: dict[str, Any] = {
            "task": anchor.name,
            "key": anchor.key,
            "flops": anchor.flops,
            "tasks_in_module": len(parts.tasks),
        }
        if anchor.key in by_key:
            row["same_task_as"] = by_key[anchor.key]
            variants[label] = row
            continue
        by_key[anchor.key] = label
        _restore_affinity()
        start = time.perf_counter()
        database = _tune(
            task,
            spec.tvm_target(),
            args.trials,
            args.per_iter,
            args.seed,
            work / case.name / label.split()[0].replace("+", "_"),
        )
        row["tune_secs"] = time.perf_counter() - start
        row["valid_records"] = sum(
            1
            for r in database.get_all_tuning_records()
            if r.run_secs and all(float(s) < 1e9 for s in r.run_secs)
        )
        library = LoadedLibrary.from_executable(build(mod, spec, database))
        row["max_abs_error"] = float(np.max(np.abs(library.run([feed["x"]])[0] - expected)))
        tuned[label] = (task, spec.tvm_target(), database)
        variants[label] = row
        print(
            f"{case.name} {label}: tuned {anchor.name} in {row['tune_secs']:.0f} s, "
            f"max abs error {row['max_abs_error']:.2e}",
            flush=True,
        )
    _restore_affinity()
    timers = {
        label: _kernel_timer(t, tgt, db, args.min_ms) for label, (t, tgt, db) in tuned.items()
    }
    timers["ONNX Runtime"] = _ort_timer(session, feed, args.min_ms)
    times = _side_by_side(timers, args.rounds)
    _restore_affinity()
    flops = next(iter(variants.values()))["flops"]
    ort_ms = times["ONNX Runtime"]["median_ms"]
    for label, row in variants.items():
        source = row.get("same_task_as", label)
        row.update(times[source])
        row["gflops"] = flops / (row["median_ms"] * 1e-3) / 1e9
        row["vs_ort"] = row["median_ms"] / ort_ms
    return {
        "case": case.name,
        "network": case.network,
        "description": case.description,
        "flops": flops,
        "ort": {**times["ONNX Runtime"], "gflops": flops / (ort_ms * 1e-3) / 1e9},
        "variants": variants,
    }


def machine() -> dict[str, Any]:
    import onnxruntime
    import tvm

    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": model,
        "llvm_cpu": str(tvm.target.codegen.llvm_get_system_cpu()),
        "logical_cpus": os.cpu_count(),
        "tvm": tvm.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def render(results: list[dict[str, Any]]) -> str:
    """The markdown report of one or more result files (each case was timed in one process)."""
    head = results[0]
    m, cfg = head["machine"], head["config"]
    lines = [
        f"# Compile-path levers on single tasks ({head['date']})",
        "",
        f"Machine: {m['cpu_model']} (`llvm_get_system_cpu()` = `{m['llvm_cpu']}`, "
        f"{m['logical_cpus']} logical CPUs); TVM {m['tvm']}, ONNX Runtime {m['onnxruntime']}.",
        f"Threads: {cfg['threads']} for TVM (`num-cores` in the target, `TVM_NUM_THREADS`) and "
        f"for ONNX Runtime (`intra_op_num_threads`). Tuning: MetaSchedule evolutionary search, "
        f"{cfg['trials']} trials per variant in batches of {cfg['per_iter']}, random cost model, "
        f"seed {cfg['seed']}, TuneHub's builder and runner. Timing: each case in one process, "
        f"kernels and ONNX Runtime alternating, median of {cfg['rounds']} rounds of "
        f"≥{cfg['min_ms']} ms. Ratio = TVM ms / ONNX Runtime ms (below 1: faster than ONNX "
        "Runtime). Command: `python -m bench.bench_levers` "
        f"`{' '.join(cfg['argv'])}`.",
        "",
        "| network | task | variant | ms | GFLOP/s | vs ORT | spread (min–max ms) | tune s "
        "| max abs err |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for result in (r for file in results for r in file["cases"]):
        for label, row in result["variants"].items():
            same = row.get("same_task_as")
            cells = [
                result["network"],
                result["description"],
                f"{label} (same task as {same})" if same else label,
                f"{row['median_ms']:.3f}",
                f"{row['gflops']:.0f}",
                f"{row['vs_ort']:.2f}x",
            ]
            if same:
                cells += ["—", "—", "—"]
            else:
                cells += [
                    f"{row['min_ms']:.3f}–{row['max_ms']:.3f}",
                    f"{row['tune_secs']:.0f}",
                    f"{row['max_abs_error']:.1e}",
                ]
            lines.append("| " + " | ".join(cells) + " |")
        ort = result["ort"]
        lines.append(
            f"| {result['network']} | {result['description']} | **ONNX Runtime** | "
            f"{ort['median_ms']:.3f} | {ort['gflops']:.0f} | 1.00x | "
            f"{ort['min_ms']:.3f}–{ort['max_ms']:.3f} | — | — |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--per-iter", type=int, default=32)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--min-ms", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--render", type=Path, nargs="+", help="only render these result files")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    date = dt.date.today().isoformat()
    if args.render:
        results = [json.loads(p.read_text()) for p in args.render]
        (args.out / f"levers_{results[0]['date']}.md").write_text(render(results))
        return 0
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    result: dict[str, Any] = {
        "date": date,
        "machine": machine(),
        "cases": [],
        "config": {
            "trials": args.trials,
            "per_iter": args.per_iter,
            "threads": args.threads,
            "rounds": args.rounds,
            "min_ms": args.min_ms,
            "seed": args.seed,
            "argv": argv if argv is not None else __import__("sys").argv[1:],
        },
    }
    stem = f"levers_{date}"
    with tempfile.TemporaryDirectory() as work:
        for name in args.cases:
            result["cases"].append(run_case(CASES[name], args, Path(work)))
            (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
            (args.out / f"{stem}.md").write_text(render([result]))
    print(render([result]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
