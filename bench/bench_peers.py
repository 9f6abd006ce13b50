"""Library peers (issue 21) on CPU: per task and whole models, side by side in one run.

    python -m bench.bench_peers [--models resnet18 mobilenetv2 bert mlp] [--threads 2]
        [--rounds 7] [--db URL] [--tune N] [--cost-model auto|random|...] [--no-untuned]
        [--out DIR]

Per model (exported at run time, batch 1, seeded weights), in one process:

- **Per task**, every task with a peer (:mod:`compiler.peers`): every peer variant, TVM's default
  schedule (:mod:`compiler.lowering.default_schedules`) and, with ``--db``, the database's best
  record, all built with the tuner's builder and timed by the tuner's runner side by side
  (:func:`tuner.final_build.remeasure.time_side_by_side`, ``--rounds`` rounds, order rotated);
  medians and GFLOP/s. What the peer's time includes: the whole task (library call + the TIR
  epilogue).
- **Whole model**, each a verified library run in this process, timed in ``--rounds``
  interleaved rounds (each round runs every variant for at least 0.2 s; the table gives the
  median of rounds): ONNX Runtime, torch eager, zero-trial without peers (TVM's default
  schedules only), zero-trial with peers (``compiler.build.builder.build_zero_trial``), the same
  with OpenBLAS instead of the packed GEMM and with the shim's kernels instead of oneDNN's (where
  oneDNN is a default) and, with
  ``--db``, tuned alone (each task's best record) and tuned + peers (each task's winner of the
  side-by-side re-measurement of its top records and its peer,
  ``tuner.final_build.finalize.choose_winners``, as a job's final build does). TVM untuned (naive
  loops) is timed once, apart (seconds per call); ``--no-untuned`` skips it.

``--tune N`` first tunes each model N trials into ``--db`` (a temporary SQLite database when none
is given) with ``tuner.jobs.job.tune_model`` and ``--cost-model`` (``random`` on a machine without
xgboost), then measures as above: one command for the whole side by side.

Threads: TVM's target has ``num-cores = --threads`` and ``TVM_NUM_THREADS`` is set to it (the
peers run on TVM's thread pool); ONNX Runtime and torch get ``--threads`` intra-op threads.
Writes ``peers_<date>.json`` and ``peers_<date>.md`` (machine, date, threads) into ``--out``
(default ``bench/results``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MODELS = ("resnet18", "mobilenetv2", "bert", "mlp")


def _timer(call: Callable[[], Any], min_secs: float = 0.2) -> Callable[[], float]:
    """A round of ``call``: run it for at least ``min_secs``, return the mean seconds per call."""

    def round_secs() -> float:
        count, start = 0, time.perf_counter()
        while True:
            call()
            count += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_secs:
                return elapsed / count

    return round_secs


def interleaved(
    timers: dict[str, Callable[[], float]], rounds: int, pause: float = 0.05, seed: int = 0
) -> dict[str, float]:
    """Median of ``rounds`` rounds per timer. Each round runs every timer once in a new random
    order, with ``pause`` seconds of sleep before each: a runtime's threads that spin after
    their call (ONNX Runtime's intra-op pool, TVM's pool) go idle before the next timer starts,
    and no timer always follows the same one. (With a fixed rotation, on the loaded 2-core box
    of 2026-12-01, a timer always run right after ONNX Runtime measured 1.5-2.5x slower on
    tasks where it ran the same code as another; with this order and pause, 0.92-1.0x:
    ``bench/results/conv_peers_2026-12-01.md``.)"""
    import random
    import time

    order = list(timers)
    samples: dict[str, list[float]] = {n: [] for n in order}
    shuffle = random.Random(seed).shuffle
    for name in order:  # warm up
        timers[name]()
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            time.sleep(pause)
            samples[name].append(timers[name]())
    return {n: statistics.median(v) for n, v in samples.items()}


def _library_timer(
    executable: Any, inputs: list[np.ndarray], link_peers: bool, work: Path, model: Any, label: str
) -> tuple[Callable[[], float], dict[str, Any]]:
    """Export ``executable``, load it from disk, verify it and return its timer."""
    from compiler.build.builder import export_library
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import verify

    path = export_library(executable, work / f"{label}.so", link_peers=link_peers)
    library = LoadedLibrary(path, "cpu")
    check = verify(model, library.run, device="cpu").to_json()
    args = library._to_device(inputs)  # noqa: SLF001 - timing the VM call alone
    library.vm.set_input("main", *args)
    return _timer(lambda: library.vm.invoke_stateful("main")), check


def _ort_timer(model_path: Path, inputs: list[np.ndarray], threads: int) -> Callable[[], float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    return _timer(lambda: session.run(None, feed))


def _torch_timer(name: str, inputs: list[np.ndarray], threads: int) -> Callable[[], float]:
    import torch

    from examples.networks import EXAMPLES

    torch.set_num_threads(threads)
    model = EXAMPLES[name].build().eval()
    tensors = [torch.from_numpy(a) for a in inputs]

    def call() -> None:
        with torch.no_grad():
            model(*tensors)

    return _timer(call)


def variant_label(call: Any) -> str:
    """A peer variant's column: its algorithm (``sgemm`` for OpenBLAS's GEMM, whose algorithm
    is ``""``)."""
    return call.algorithm or ("sgemm" if call.kind == "gemm" else call.kind)


def openblas_call(call: Any) -> Any:
    """``call`` with the shim's packed-weight GEMM replaced by OpenBLAS (a convolution's
    ``im2col``, a GEMM's sgemm): the peers before the packed GEMM, for the side by side."""
    if call.algorithm != "packed":
        return call
    return dataclasses.replace(call, algorithm="im2col" if call.kind == "conv2d_nhwc" else "")


def without_onednn(call: Any) -> Any:
    """``call`` with oneDNN's primitive replaced by the shim's own kernel (the packed GEMM for a
    convolution, the depthwise kernel): the zero-trial peers before oneDNN, for the side by
    side."""
    if call.algorithm != "onednn":
        return call
    return dataclasses.replace(call, algorithm="packed" if call.kind == "conv2d_nhwc" else "")


def per_task(prepared: Any, records: dict[str, list], rounds: int) -> list[dict[str, Any]]:
    """Every peer variant (:func:`compiler.peers.peer_variants`: packed GEMM, OpenBLAS,
    Winograd) vs default schedule vs best record of every task with a peer, side by side."""
    from compiler.lowering.default_schedules import apply_default_schedules
    from compiler.peers import find_peer, peer_task_module, peer_variants
    from tuner.final_build.remeasure import time_side_by_side

    target = prepared.target
    jobs: list[tuple[int, str, Any, Any]] = []
    rows: list[dict[str, Any]] = []
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        task_mod = extracted.dispatched[0]
        call = find_peer(task_mod)
        if call is None:
            continue
        row = {
            "task": task.name,
            "key": task.key,
            "weight": task.weight,
            "mflops": task.flops / 1e6,
            "peer": f"{call.kind} {dict(call.config)}",
            "default variant": variant_label(call),
            "variants": [],
        }
        index = len(rows)
        rows.append(row)
        for variant in peer_variants(task_mod):
            label = f"peer {variant_label(variant)}"
            row["variants"].append(label)
            jobs.append((index, label, peer_task_module(task_mod, call=variant), None))
        default = apply_default_schedules(task_mod, target.tvm_target())
        jobs.append((index, "default", default, None))
        best = [e for e in records.get(task.key, []) if e]
        if best:
            jobs.append((index, "tuned", task_mod, best[0][0]))
    times = time_side_by_side([(mod, trace) for _, _, mod, trace in jobs], target, rounds)
    for (index, label, _, _), secs in zip(jobs, times):
        rows[index][f"{label} ms"] = statistics.median(secs) * 1e3 if secs else None
    for row in rows:
        for label in (*row["variants"], "default", "tuned"):
            ms = row.get(f"{label} ms")
            row[f"{label} GFLOP/s"] = row["mflops"] / ms if ms else None
        timed = {
            label: row[f"{label} ms"]
            for label in (*row["variants"], "default", "tuned")
            if row.get(f"{label} ms")
        }
        row["peer ms"] = row.get(f"peer {row['default variant']} ms")
        row["chosen"] = min(timed, key=timed.get) if timed else None
    return rows


def bench_model(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from compiler.build.builder import build, build_zero_trial
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.export import export_onnx

    path = export_onnx(name, work / f"{name}.onnx")
    target = cpu_target(args.threads)
    prepared = prepare_model(path, target)
    inputs = random_inputs(prepared.model.inputs)
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    result: dict[str, Any] = {"model": name, "tasks": len(tasks), "checks": {}}
    timers: dict[str, Callable[[], float]] = {
        "ONNX Runtime": _ort_timer(path, inputs, args.threads),
        "torch eager": _torch_timer(name, inputs, args.threads),
    }
    from tvm.s_tir import meta_schedule as ms

    started = time.perf_counter()
    defaults_only = build(prepared.mod, target, ms.database.MemoryDatabase())
    timers["zero-trial, no peers"], result["checks"]["zero-trial, no peers"] = _library_timer(
        defaults_only, inputs, False, work, prepared.model, f"{name}-defaults"
    )
    started = time.perf_counter()
    zero, keys = build_zero_trial(prepared.mod, target, tasks)
    result["zero-trial build s"] = time.perf_counter() - started
    result["zero-trial peers"] = len(keys)
    timers["zero-trial + peers"], result["checks"]["zero-trial + peers"] = _library_timer(
        zero, inputs, bool(keys), work, prepared.model, f"{name}-zero"
    )
    if keys:  # the same with OpenBLAS where the packed GEMM is the default, without oneDNN
        from compiler.peers import find_peer

        defaults = {key: find_peer(task) for key, task in tasks if key in keys}
        # (label, swap, file suffix, built even when it swaps nothing)
        variants = [
            ("OpenBLAS", openblas_call, "openblas", True),
            ("no oneDNN", without_onednn, "no-onednn", False),
        ]
        for label, swap, suffix, always in variants:
            calls = {key: swap(call) for key, call in defaults.items()}
            if calls == defaults and not always:  # the zero-trial build itself
                continue
            built = build(prepared.mod, target, ms.database.MemoryDatabase(), peers=calls)
            column = f"zero-trial + peers ({label})"
            timers[column], result["checks"][column] = _library_timer(
                built, inputs, True, work, prepared.model, f"{name}-zero-{suffix}"
            )
    records: dict[str, list] = {}
    if args.tune:
        from db.storage import open_storage
        from tuner.jobs.job import tune_model

        storage = open_storage(args.db, upgrade=True)
        started = time.perf_counter()
        summary = tune_model(
            storage,
            prepared,
            trials=args.tune,
            output_dir=work / f"{name}-job",
            filename=path.name,
            cost_model=args.cost_model,
            force=True,
        )
        storage.close()
        result["tuning"] = {
            "trials": summary.trials_this_run,
            "wall s": time.perf_counter() - started,
            "job artifact ms": summary.measured.median_secs * 1e3 if summary.measured else None,
        }
    if args.db:
        records = _tuned(name, prepared, args, work, inputs, timers, result)
    result["per task"] = per_task(prepared, records, args.rounds)
    result["latency ms"] = {k: v * 1e3 for k, v in interleaved(timers, args.rounds).items()}
    if not args.no_untuned:
        untuned = LoadedLibrary.from_executable(build(prepared.mod, target))
        result["latency ms"]["TVM untuned"] = untuned.time(inputs, repeat=3).median_secs * 1e3
    return result


def _tuned(
    name: str,
    prepared: Any,
    args: argparse.Namespace,
    work: Path,
    inputs: list[np.ndarray],
    timers: dict[str, Callable[[], float]],
    result: dict[str, Any],
) -> dict[str, list]:
    """Add ``tuned alone`` and ``tuned + peers`` from ``--db``; return the top records."""
    from compiler.build.builder import build
    from db.metaschedule_database import MetaScheduleDatabase
    from db.storage import open_storage
    from tuner.final_build.finalize import choose_winners, database_from_records, top_records
    from tuner.final_build.remeasure import RemeasureConfig

    storage = open_storage(args.db)
    database = MetaScheduleDatabase(storage, prepared.target)
    records = top_records(prepared, database, 3)
    result["tuned tasks"] = sum(1 for v in records.values() if v)
    alone = build(prepared.mod, prepared.target, database_from_records(prepared, records))
    timers["tuned alone"], result["checks"]["tuned alone"] = _library_timer(
        alone, inputs, False, work, prepared.model, f"{name}-tuned"
    )
    winners = choose_winners(prepared, records, RemeasureConfig(top=3, rounds=args.rounds))
    both = build(prepared.mod, prepared.target, winners.database, peers=winners.peers)
    result["tuned + peers: peers chosen"] = len(winners.peers)
    timers["tuned + peers"], result["checks"]["tuned + peers"] = _library_timer(
        both, inputs, bool(winners.peers), work, prepared.model, f"{name}-tuned-peers"
    )
    storage.close()
    return records


def machine() -> dict[str, Any]:
    from bench.bench_levers import machine as levers_machine

    return levers_machine()


COLUMNS = (
    "ONNX Runtime",
    "torch eager",
    "TVM untuned",
    "zero-trial, no peers",
    "zero-trial + peers (OpenBLAS)",
    "zero-trial + peers (no oneDNN)",
    "zero-trial + peers",
    "tuned alone",
    "tuned + peers",
)


def _ms(value: Any) -> str:
    return "—" if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def render(run: dict[str, Any]) -> str:
    lines = [
        f"# Library peers, {run['date']}",
        "",
        f"Machine: {run['machine']['cpu_model']} (LLVM `{run['machine']['llvm_cpu']}`), "
        f"{run['threads']} threads for every framework; TVM {run['machine']['tvm']}, "
        f"ONNX Runtime {run['machine']['onnxruntime']}; {run['rounds']} interleaved rounds, "
        "medians. Command: `python -m bench.bench_peers " + " ".join(run["argv"]) + "`.",
        "",
        "## Whole models (ms)",
        "",
    ]
    present = [c for c in COLUMNS if any(c in m["latency ms"] for m in run["models"])]
    lines += [
        "| model | " + " | ".join(present) + " | zero-trial + peers / ORT |",
        "|---" * (len(present) + 2) + "|",
    ]
    for m in run["models"]:
        lat = m["latency ms"]
        ratio = lat["zero-trial + peers"] / lat["ONNX Runtime"]
        lines.append(
            f"| {m['model']} | "
            + " | ".join(_ms(lat.get(c)) for c in present)
            + f" | {ratio:.2f}x |"
        )
    lines += ["", "Verification of every library (max abs error against ONNX Runtime):", ""]
    for m in run["models"]:
        checks = ", ".join(
            f"{k} {v['max_abs_error']:.1e}" + ("" if v["passed"] else " FAILED")
            for k, v in m["checks"].items()
        )
        lines.append(
            f"- {m['model']}: {checks}; zero-trial build {m['zero-trial build s']:.1f} s, "
            f"{m['zero-trial peers']} of {m['tasks']} tasks on peers"
        )
    for m in run["models"]:
        if "tuning" in m:
            t = m["tuning"]
            lines.append(
                f"- {m['model']}: tuned {t['trials']} trials in {t['wall s']:.0f} s "
                f"({m.get('tuned tasks', '?')} tasks with records); the job's own "
                f"artifact (tuned + peers as a job builds it): {_ms(t['job artifact ms'])}"
                f" ms; tuned + peers here chose {m.get('tuned + peers: peers chosen')} "
                "peers"
            )
    for m in run["models"]:
        lines += [
            "",
            f"## {m['model']}: tasks with a peer (ms, GFLOP/s)",
            "",
            "Every peer variant of the task (`packed`: im2col + the shim's packed-weight "
            "GEMM; `im2col`/`sgemm`: OpenBLAS; `winograd_*`; `onednn`: oneDNN's primitive; "
            "`depthwise_conv2d_nhwc`: the shim's depthwise kernel), the zero-trial build's "
            "default variant first.",
            "",
            "| task | weight | MFLOP | peer call | peer variants | default schedule |"
            " tuned best | fastest |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in m["per task"]:

            def cell(label: str, r: dict = r) -> str:
                ms = r.get(f"{label} ms")
                return "—" if ms is None else f"{ms:.3f} ({r[f'{label} GFLOP/s']:.0f})"

            variants = "; ".join(
                f"{v.removeprefix('peer ')} {cell(v)}" for v in r.get("variants", ["peer"])
            )
            lines.append(
                f"| {r['task']} | {r['weight']} | {r['mflops']:.1f} | {r['peer']} | "
                f"{variants} | {cell('default')} | {cell('tuned')} | "
                f"{r.get('chosen') or '—'} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--db", help="a tuning database to add tuned alone / tuned + peers")
    parser.add_argument("--tune", type=int, default=0, help="tune each model N trials first")
    parser.add_argument("--cost-model", default="auto")
    parser.add_argument("--no-untuned", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    date = dt.date.today().isoformat()
    run = {
        "date": date,
        "threads": args.threads,
        "rounds": args.rounds,
        "machine": machine(),
        "argv": argv if argv is not None else __import__("sys").argv[1:],
        "models": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        if args.tune and not args.db:
            args.db = f"sqlite:///{tmp}/tuning.db"
        for name in args.models:
            run["models"].append(bench_model(name, args, Path(tmp)))
            (args.out / f"peers_{date}.json").write_text(json.dumps(run, indent=1, default=str))
            (args.out / f"peers_{date}.md").write_text(render(run))
            print(render(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
