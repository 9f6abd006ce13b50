"""Search settings against each other on single CPU tasks at equal trials: trials per second, where
the time went, and how fast the best schedule found runs (issue 35's tuning time).

    python -m bench.bench_search_rate [--cases conv3x3_64_56 ...] [--configs evolve cold_start]
        [--trials 64] [--batch 8] [--seeds 0 1] [--rounds 15] [--out DIR]
    python -m bench.bench_search_rate --example resnet18 [--configs ...] [--trials 96] [--seeds 0]

Each case is one operator of :mod:`bench.bench_levers` (a one-operator ONNX model with seeded
weights), imported and partitioned by the real compile path for this machine's CPU target; its
task is tuned by :func:`tuner.engine.search.run_search` (the product's one search: TuneHub's SQL
database in a fresh SQLite file, its builder and runner, a fresh MetaSchedule ``XGBModel``) once
per configuration (:data:`CONFIGS`) and seed, with the same trials and batch. The order of the
configurations alternates between seeds.

Afterwards, in one process, every run's best schedule is timed alone (``time_evaluator``),
alternating between runs, ``--rounds`` rounds of at least ``--min-ms`` each: the table gives
their medians, so that "best found" is compared side by side and not from each run's own
measurements. Writes ``search_rate_<date>.json`` (after every run) and ``search_rate_<date>.md``
into ``--out`` (default ``bench/results``), with the machine and date.

With ``--example NAME`` (an :mod:`examples.export` network, as ONNX) each configuration instead
tunes the whole model with :func:`tuner.jobs.job.tune_model` (``tunehub tune``'s job: the planner's
batch size, the final build and its whole-model comparison with the zero-trial build) in a fresh
database; the table gives the run's time, its search split, and the published library's time
and the zero-trial build's, as the final build timed them side by side; then every run's published
library and a zero-trial build are timed side by side in one process (``model ms``).
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
from pathlib import Path
from typing import Any

from bench.bench_levers import CASES, _relax_module, _restore_affinity, machine
from tuner.engine.search import SearchConfig

REPO = Path(__file__).resolve().parents[1]

#: The configurations compared, by name.
CONFIGS: dict[str, SearchConfig] = {
    # MetaSchedule's search as it comes (population 512, every batch evolved)
    "evolve": SearchConfig(population_size=512, cold_population=0),
    # no evolution while the cost model ranks at random
    "cold_start": SearchConfig(population_size=512),
    "pop128": SearchConfig(population_size=128),  # the default since 2026-12-07
    "pop128_evolve": SearchConfig(population_size=128, cold_population=0),
}


def tune_once(task: Any, spec: Any, config: SearchConfig, args: Any, seed: int, work: Path) -> Any:
    """Tune ``task`` once; returns (row, best schedule's module or None)."""
    from tvm.s_tir import meta_schedule as ms

    from db import MetaScheduleDatabase
    from db.storage import open_storage
    from tuner.engine.search import reset_metaschedule_logging, run_search
    from tuner.measuring.builder_runner import MeasureConfig

    work.mkdir(parents=True, exist_ok=True)
    storage = open_storage(f"sqlite:///{work / 'tunehub.db'}", upgrade=True)
    try:
        database = MetaScheduleDatabase(storage, spec)
        times: list[Any] = []
        reset_metaschedule_logging()
        _restore_affinity()
        start = time.perf_counter()
        run_search(
            [task],
            database=database,
            target_kind=spec.kind,
            trials=args.trials,
            batch_size=args.batch,
            work_dir=str(work / "ms"),
            measure=MeasureConfig(),
            search=config,
            cost_model=ms.cost_model.XGBModel(num_warmup_samples=100),
            seed=seed,
            on_time=times.append,
        )
        wall = time.perf_counter() - start
        records = database.get_all_tuning_records()
        best = database.query_schedule(task.dispatched[0], spec.tvm_target(), workload_name="main")
    finally:
        storage.close()
    valid = [r for r in records if r.run_secs]
    split = times[0].to_json() if times else {}
    means = [sum(float(x) for x in r.run_secs) / len(r.run_secs) for r in valid]
    row = {
        "wall_s": wall,
        "trials": len(records),
        "valid": len(valid),
        "search_time": split,
        "best_stored_ms": 1e3 * min(means) if means else None,
    }
    return row, best


def _timer(sch: Any, spec: Any, min_ms: int) -> Any:
    """Seconds per call of ``sch`` alone (random data, weights as the schedule reads them)."""
    import numpy as np
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from tuner.measuring.builder_runner import fast_build

    lowered = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
    rng = np.random.default_rng(0)
    dev = tvm.cpu()
    args = [
        tvm.runtime.tensor(rng.standard_normal([int(d) for d in p.shape]).astype(str(p.dtype)), dev)
        for p in lowered["main"].params
    ]
    runtime = fast_build(sch.mod, spec.tvm_target(), None)
    evaluator = runtime.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=min_ms)
    return lambda: float(evaluator(*args).mean)


def run_case(name: str, args: argparse.Namespace, work: Path, result: dict[str, Any]) -> None:
    from compiler.partition import partition
    from compiler.target import cpu_target

    case = CASES[name]
    spec = cpu_target()
    parts = partition(_relax_module(case.build()), spec)
    task = parts.extracted[0]
    runs: list[dict[str, Any]] = []
    schedules: list[Any] = []
    for index, seed in enumerate(args.seeds):
        order = args.configs if index % 2 == 0 else list(reversed(args.configs))
        for config_name in order:
            row, best = tune_once(
                task, spec, CONFIGS[config_name], args, seed, work / f"{name}-{config_name}-{seed}"
            )
            row.update(case=name, config=config_name, seed=seed, task=parts.tasks[0].name)
            print(json.dumps({k: v for k, v in row.items() if k != "search_time"}), flush=True)
            runs.append(row)
            schedules.append(best)
            result["runs"].append(row)
            write(result, args.out)
    _restore_affinity()
    timers = {i: _timer(s, spec, args.min_ms) for i, s in enumerate(schedules) if s is not None}
    for timer in timers.values():
        timer()
    samples: dict[int, list[float]] = {i: [] for i in timers}
    for round_index in range(args.rounds):
        order = list(timers) if round_index % 2 == 0 else list(reversed(timers))
        for i in order:
            samples[i].append(timers[i]())
    for i, row in enumerate(runs):
        row["best_ms"] = statistics.median(samples[i]) * 1e3 if i in samples else None
    write(result, args.out)


def run_example(name: str, args: argparse.Namespace, work: Path, result: dict[str, Any]) -> None:
    """Tune the whole ``name`` network once per configuration and seed (see the docstring)."""
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from db.storage import open_storage
    from examples.export import export_onnx
    from tuner.jobs.job import tune_model

    prepared = prepare_model(export_onnx(name, work / f"{name}.onnx"), cpu_target())
    for index, seed in enumerate(args.seeds):
        order = args.configs if index % 2 == 0 else list(reversed(args.configs))
        for config_name in order:
            run_dir = work / f"{name}-{config_name}-{seed}"
            storage = open_storage(f"sqlite:///{run_dir}.db", upgrade=True)
            _restore_affinity()
            start = time.perf_counter()
            try:
                summary = tune_model(
                    storage,
                    prepared,
                    trials=args.trials,
                    output_dir=run_dir,
                    search=CONFIGS[config_name],
                    seed=seed,
                )
            finally:
                storage.close()
            wall = time.perf_counter() - start
            split = summary.extra.get("search_time") or {}
            choice = summary.extra.get("final_choice") or {}
            row = {
                "case": name,
                "config": config_name,
                "seed": seed,
                "wall_s": wall,
                "trials": summary.trials_this_run,
                "search_time": split,
                "best_ms": choice.get("tuned_ms"),
                "zero_trial_ms": choice.get("zero_trial_ms"),
                "published": choice.get("published"),
                "verified": summary.verification.get("passed"),
            }
            print(json.dumps({k: v for k, v in row.items() if k != "search_time"}), flush=True)
            result["runs"].append(row)
            write(result, args.out)
    _retime_models(prepared, work, name, args, result)


def _retime_models(
    prepared: Any, work: Path, name: str, args: argparse.Namespace, result: dict[str, Any]
) -> None:
    """Every run's published library and a zero-trial build of ``prepared`` (``tune_model``
    with 0 trials) timed in this process side by side, ``--rounds`` alternating rounds: each
    run's ``model_ms`` and ``result["zero_trial_model_ms"]`` are their medians. (Each run's own
    final comparison is timed minutes apart from the others' and cannot be compared across runs.)
    """
    from compiler.build.artifact_layout import LIBRARY_NAME
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import model_inputs
    from db.storage import open_storage
    from tuner.final_build.final_choice import CompareConfig, time_side_by_side
    from tuner.jobs.job import tune_model

    zero_dir = work / f"{name}-zero-trial"
    storage = open_storage(f"sqlite:///{zero_dir}.db", upgrade=True)
    try:
        tune_model(storage, prepared, trials=0, output_dir=zero_dir)
    finally:
        storage.close()
    runs = result["runs"]
    folders = [work / f"{name}-{r['config']}-{r['seed']}" for r in runs] + [zero_dir]
    _restore_affinity()
    libraries = [LoadedLibrary(folder / LIBRARY_NAME) for folder in folders]
    rounds = time_side_by_side(
        libraries, model_inputs(prepared.model), CompareConfig(rounds=args.rounds)
    )
    medians = [statistics.median(t.median_secs for t in timings) * 1e3 for timings in rounds]
    for row, ms in zip(runs, medians[:-1], strict=True):
        row["model_ms"] = ms
    result["zero_trial_model_ms"] = medians[-1]
    write(result, args.out)


def render(result: dict[str, Any]) -> str:
    m, c = result["machine"], result["config"]
    whole = bool(c.get("example"))
    how = (
        f"{c['trials']} trials per run, the planner's batch size, `tune_model` in a fresh "
        "SQLite database (the default cost model). `best ms`: the tuned model, `zero-trial "
        "ms`: the zero-trial build, timed side by side by the final build (`final_choice`); "
        "`published`: the one it published."
        if whole
        else f"{c['trials']} trials per run in batches of {c['batch']}, a fresh XGBoost cost "
        "model and a fresh SQLite database per run (TuneHub's `run_search`). `best ms`: each "
        "run's best schedule timed alone, all runs of a case alternating, median of "
        f"{c['rounds']} rounds."
    )
    title = f"the whole {c['example']}" if whole else "single CPU tasks"
    lines = [
        f"# Search settings on {title} at equal trials ({result['date']})",
        "",
        f"Machine: {m['cpu_model']} (`{m['llvm_cpu']}`, {m['logical_cpus']} logical CPUs), "
        f"TVM {m['tvm']}. Command: `python -m bench.bench_search_rate "
        f"{' '.join(c['argv'])}`. {how} Search split from MetaSchedule's profiler "
        "(`tuner/engine/search_time.py`).",
        "",
        "Configurations: "
        + "; ".join(
            f"`{n}` = population {CONFIGS[n].population_size}, "
            + (
                f"cold start (population {CONFIGS[n].cold_population}, no generations, while "
                "the model ranks at random)"
                if CONFIGS[n].cold_population
                else "evolved every batch"
            )
            for n in c["configs"]
        )
        + ".",
        "",
        "| case | config | seed | wall s | search trials/s | sample s | mutate s | build s "
        "| run s | best ms |" + (" zero-trial ms | published | model ms |" if whole else ""),
        "|---|---|---|---|---|---|---|---|---|---|" + ("---|---|---|" if whole else ""),
    ]
    for r in result["runs"]:
        phases = r["search_time"].get("phases_secs", {})
        best = f"{r['best_ms']:.4f}" if r.get("best_ms") else "—"
        extra = ""
        if whole:
            zero = r.get("zero_trial_ms")
            extra = f" {zero:.3f} | {r.get('published')} |" if zero else " — | — |"
            extra += f" {r['model_ms']:.3f} |" if r.get("model_ms") else " — |"
        lines.append(
            f"| {r['case']} | {r['config']} | {r['seed']} | {r['wall_s']:.1f} "
            f"| {search_rate(r):.2f} | {phases.get('sample', 0):.1f} "
            f"| {phases.get('mutate', 0):.1f} | {phases.get('build', 0):.1f} "
            f"| {phases.get('run', 0):.1f} | {best} |{extra}"
        )
    if whole and result.get("zero_trial_model_ms"):
        lines += [
            "",
            "`model ms`: every run's published library and a zero-trial build "
            f"(`tune_model` with 0 trials: {result['zero_trial_model_ms']:.3f} ms) timed in one "
            f"process after all runs, {c['rounds']} alternating rounds, medians.",
        ]
    lines += [
        "",
        "Medians over seeds:",
        "",
        "| case | config | wall s | search trials/s | best ms |",
    ]
    lines.append("|---|---|---|---|---|")
    for case in dict.fromkeys(r["case"] for r in result["runs"]):
        for config in c["configs"]:
            rows = [r for r in result["runs"] if r["case"] == case and r["config"] == config]
            if not rows:
                continue
            bests = [r["best_ms"] for r in rows if r.get("best_ms")]
            lines.append(
                f"| {case} | {config} | {statistics.median(r['wall_s'] for r in rows):.1f} "
                f"| {statistics.median(search_rate(r) for r in rows):.2f} "
                f"| {statistics.median(bests):.4f} |"
                if bests
                else f"| {case} | {config} | — | — | — |"
            )
    return "\n".join(lines) + "\n"


def search_rate(row: dict[str, Any]) -> float:
    """Trials per second of the search alone (MetaSchedule's profiled total)."""
    total = row["search_time"].get("total_secs")
    return row["trials"] / total if total else 0.0


def write(result: dict[str, Any], out: Path) -> None:
    stem = f"search_rate_{result['date']}{result['config'].get('suffix', '')}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / f"{stem}.md").write_text(render(result))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["conv3x3_64_56"], choices=list(CASES))
    parser.add_argument("--configs", nargs="+", default=["evolve", "cold_start"], choices=CONFIGS)
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--min-ms", type=int, default=50)
    parser.add_argument("--example", help="tune this whole examples.export network instead")
    parser.add_argument("--suffix", default="", help="appended to the result files' names")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "config": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "cases")},
            "cases": args.cases,
            "argv": argv if argv is not None else __import__("sys").argv[1:],
            "settings": {n: dataclasses.asdict(CONFIGS[n]) for n in args.configs},
            "threads": len(os.sched_getaffinity(0)),
        },
        "runs": [],
    }
    with tempfile.TemporaryDirectory(prefix="tunehub-search-rate-") as work:
        if args.example:
            run_example(args.example, args, Path(work), result)
        for name in [] if args.example else args.cases:
            run_case(name, args, Path(work), result)
    print(render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
