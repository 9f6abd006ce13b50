"""Model benchmark: tuned latency side by side, and TuneHub's tuning throughput.

    .venv/bin/python -m bench.bench_models [--models resnet18 mobilenetv2 bert mlp]
        [--trials 200 1000 2000] [--threads 2] [--throughput-model mlp] [--throughput-trials 64]
        [--db URL] [--work DIR]
    .venv/bin/python -m bench.bench_models --retime DIR [--threads 2]

For each example network at batch 1 it measures, in one run and on the same inputs: ONNX Runtime,
torch eager, ``torch.compile`` (inductor), TVM untuned, TuneHub's zero-trial build (rung ``0``:
library peers and TVM's default schedules, as ``tunehub compile`` without a database) and TuneHub
tuned after each cumulative trial budget (the database keeps growing: the 1,000-trial artifact is
the 200-trial job plus a ``--continue`` job of 800 more, and so on). After all tuning, every
framework and every rung's artifact is timed side by side in one process
(:func:`interleaved_latencies`, ``--rounds`` interleaved rounds, medians); TVM untuned (seconds a
call) is timed once, apart. ``--threads`` intra-op threads for every framework (TVM's target has
``num-cores = threads``).

Every TuneHub run uses MetaSchedule's cold XGBModel (``cost_model="cold"``): these runs are the cold
baseline of ``bench/bench_cost_model.py``, which reads the database ``--db`` keeps.

Throughput: trials/s of TuneHub (SQL database, progress and error callbacks) against a plain
``ms.relax_integration.tune_relax`` run with MetaSchedule's JSON database, the same builder,
runner and search settings and the same budget, on ``--throughput-model``.

Writes ``bench/results/models_<date>.md`` with the machine and date. ``--work DIR`` keeps the
artifacts of every rung and ``DIR/rows.json``; a later run with the same ``--work`` and ``--db``
resumes: rungs already measured are not run again and models not named keep their rows.
``--retime DIR`` measures the baselines and those artifacts again, in one run, without tuning
(for a quieter moment than the tuning run had: on a shared machine, latencies measured while other
work runs are inflated, torch's most of all).

``--paths today new`` tunes each model once per compile path, side by side in one run and one
database (their target keys differ, so nothing is shared between them): ``new`` is
:data:`compiler.compile_options.CPU_DEFAULT` (NHWC convolutions, prepacked weights; columns
``TuneHub <budget>``), ``today`` is :data:`compiler.compile_options.LEGACY` (NCHW, weights as
imported: the path of ``models_2026-11-30.md``; columns ``TuneHub NCHW <budget>``). Default:
``new`` only.

``--top-up N`` (with ``--work``/``--db`` of an earlier run): after a compiler change that gives
some tasks of a model new keys (e.g. ``compiler/lowering/fast_math.py``), tune each named model with
N more trials *without* ``--continue``: only the tasks the database has no records for are tuned,
the others are reused. Reported as its own column (``TuneHub top-up``) beside the rungs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import tempfile
import time
from contextlib import closing
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: Compile paths by name (``--paths``); see the module docstring.
PATHS = ("today", "new")


#: How the table's latencies were taken (the report says it).
INTERLEAVED_NOTE = (
    "Latencies (but TVM untuned's) are medians of interleaved rounds in one process after all "
    "tuning (`interleaved_latencies`: ONNX Runtime, torch eager, torch.compile and every rung's "
    "artifact, a new random order each round). `TuneHub 0` is the zero-trial build (library "
    "peers + TVM's default schedules, no tuning)."
)


def rung(path: str, budget: int | str) -> str:
    """The column label of ``path``'s rung ``budget`` (``"500"`` or ``"NCHW 500"``)."""
    return str(budget) if path == "new" else f"NCHW {budget}"


def path_options(path: str):
    from compiler.compile_options import CPU_DEFAULT, LEGACY

    return CPU_DEFAULT if path == "new" else LEGACY


def _median_secs(call, repeat: int = 30, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def torch_latencies(name: str, inputs: list[np.ndarray], threads: int) -> dict[str, str | float]:
    import torch

    from examples.networks import EXAMPLES

    torch.set_num_threads(threads)
    model = EXAMPLES[name].build()
    tensors = [torch.from_numpy(a) for a in inputs]
    out: dict[str, str | float] = {}
    with torch.no_grad():
        out["torch eager"] = _median_secs(lambda: model(*tensors))
        try:
            compiled = torch.compile(model)
            compiled(*tensors)
            out["torch.compile"] = _median_secs(lambda: compiled(*tensors))
        except Exception as err:  # noqa: BLE001 - reported in the table
            out["torch.compile"] = f"failed: {type(err).__name__}"
    return out


def zero_trial_rung(row: dict, prepared, work: Path) -> None:
    """The zero-trial build (library peers + TVM's default schedules, no database: what
    ``tunehub compile`` gives) of ``row``'s model, verified and published as rung ``0``."""
    from tuner.final_build.finalize import publish_zero_trial

    publish_zero_trial(prepared, work / f"{row['model']}-0", force=True)
    row["TuneHub 0"] = None  # timed with the others (interleaved_latencies)
    row["trials 0"] = 0


def baseline_row(name: str, threads: int, work: Path) -> tuple[dict, object, list[np.ndarray]]:
    """Export ``name``, prepare it and measure every framework that needs no tuning."""
    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs, time_reference
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.export import export_onnx

    path = export_onnx(name, work / f"{name}.onnx")
    target = cpu_target(threads)
    prepared = prepare_model(path, target)
    inputs = random_inputs(prepared.model.inputs)
    row: dict = {"model": name, "tasks": len(prepared.partition.tasks), "path": path}
    row["ONNX Runtime"] = time_reference(prepared.model, repeat=50, threads=threads)
    row.update(torch_latencies(name, inputs, threads))
    untuned = LoadedLibrary.from_executable(build(prepared.mod, target)).time(inputs)
    row["TVM untuned"] = untuned.median_secs
    return row, prepared, inputs


def _done_key(path: str) -> str:
    return "trials done" if path == "new" else f"trials done {path}"


def tune_rung(row: dict, prepared, budget: int, work: Path, storage, path: str = "new") -> None:
    """Tune ``row``'s model (``prepared`` for compile path ``path``) up to ``budget`` cumulative
    trials of that path and record the tuned latency under the rung's label."""
    from tuner.jobs.job import tune_model

    label = rung(path, budget)
    done = row.get(_done_key(path), 0)
    start = time.perf_counter()
    summary = tune_model(
        storage,
        prepared,
        trials=budget - done,
        output_dir=work / f"{row['model']}-{label.replace(' ', '-')}",
        continue_tuning=done > 0,
        filename=Path(row["path"]).name,
        cost_model="cold",
    )
    row[_done_key(path)] = done + summary.trials_this_run
    row[f"TuneHub {label}"] = summary.measured.median_secs if summary.measured else None
    row[f"trials {label}"] = row[_done_key(path)]
    row[f"wall {label}"] = time.perf_counter() - start
    row[f"verified {label}"] = summary.verification["passed"]


def top_up(row: dict, prepared, trials: int, work: Path, storage) -> None:
    """Tune only ``row``'s tasks the database lacks, with ``trials`` more; record the artifact."""
    from tuner.jobs.job import tune_model

    start = time.perf_counter()
    summary = tune_model(
        storage,
        prepared,
        trials=trials,
        output_dir=work / f"{row['model']}-top-up",
        filename=Path(row["path"]).name,
        cost_model="cold",
        force=True,
    )
    row["trials top-up"] = summary.trials_this_run
    row["tasks reused top-up"] = summary.tasks_reused
    row["TuneHub top-up"] = summary.measured.median_secs if summary.measured else None
    row["wall top-up"] = time.perf_counter() - start
    row["verified top-up"] = summary.verification["passed"]


def bench_throughput(name: str, trials: int, threads: int, work: Path) -> dict:
    """Trials/s of TuneHub vs plain tune_relax (JSON database), same settings and budget, both
    starting from empty databases (a fresh folder under ``work`` each call)."""
    from tvm.s_tir import meta_schedule as ms

    import db
    from compiler.build.builder import build
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.export import export_onnx
    from tuner.engine.search import SearchConfig
    from tuner.jobs.job import tune_model
    from tuner.jobs.plan import choose_batch_size
    from tuner.measuring.builder_runner import MeasureConfig, make_builder, make_runner

    work = Path(tempfile.mkdtemp(prefix="throughput-", dir=work))
    path = export_onnx(name, work / f"tp-{name}.onnx")
    target = cpu_target(threads)
    prepared = prepare_model(path, target)
    batch = choose_batch_size(len(prepared.partition.tasks), trials)
    storage = db.open_storage(f"sqlite:///{work / 'throughput.db'}", upgrade=True)
    start = time.perf_counter()
    summary = tune_model(
        storage, prepared, trials=trials, output_dir=work / "tp-tunehub", seed=0, cost_model="cold"
    )
    tunehub_secs = time.perf_counter() - start
    storage.close()
    measure = MeasureConfig()
    start = time.perf_counter()
    with closing(make_builder(measure)) as builder:
        database = ms.relax_integration.tune_relax(
            mod=prepared.partition.fused,
            params=None,
            target=target.tvm_target(),
            work_dir=str(work / "tp-plain"),
            max_trials_global=trials,
            num_trials_per_iter=batch,
            builder=builder,
            runner=make_runner(measure),
            strategy=SearchConfig().strategy(),
            seed=0,
        )
    build(prepared.mod, target, database)
    plain_secs = time.perf_counter() - start
    plain_trials = len(database.get_all_tuning_records())
    return {
        "model": name,
        "tunehub_trials": summary.trials_measured,
        "tunehub_secs": tunehub_secs,
        "plain_trials": plain_trials,
        "plain_secs": plain_secs,
    }


def interleaved_latencies(
    name: str, model_path: Path, threads: int, libraries: dict[str, Path], rounds: int
) -> dict[str, float]:
    """Median seconds per call of ONNX Runtime, torch eager, ``torch.compile`` and each library of
    ``libraries`` (label -> ``model.so``) on ``name``'s seeded inputs, timed side by side in one
    process: :func:`bench.bench_peers.interleaved` rounds (a new random order each round, a pause
    before each timer), each timer running for at least 0.2 s a round. The machines these
    benchmarks run on change speed by up to 2x within minutes, so latencies taken one framework
    after another are not comparable; these are."""
    import torch

    from bench.bench_peers import _ort_timer, _timer, _torch_timer, interleaved
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs
    from compiler.frontends.loader import load_model
    from examples.networks import EXAMPLES

    inputs = random_inputs(load_model(model_path).inputs)
    timers = {
        "ONNX Runtime": _ort_timer(model_path, inputs, threads),
        "torch eager": _torch_timer(name, inputs, threads),
    }
    try:
        compiled = torch.compile(EXAMPLES[name].build().eval())
        tensors = [torch.from_numpy(a) for a in inputs]
        with torch.no_grad():
            compiled(*tensors)

        def call_compiled() -> None:
            with torch.no_grad():
                compiled(*tensors)

        timers["torch.compile"] = _timer(call_compiled)
    except Exception as err:  # noqa: BLE001 - reported in the table
        print(f"torch.compile failed on {name}: {type(err).__name__}: {err}", flush=True)
    for label, path in libraries.items():
        library = LoadedLibrary(path, "cpu")
        library.vm.set_input("main", *library._to_device(inputs))  # noqa: SLF001
        timers[label] = _timer(lambda vm=library.vm: vm.invoke_stateful("main"))
    return interleaved(timers, rounds)


def rung_libraries(work: Path, model: str, labels: list[str]) -> dict[str, Path]:
    """``TuneHub <label>`` -> the ``model.so`` each rung of ``model`` published under ``work``."""
    out = {}
    for label in labels:
        library = work / f"{model}-{label.replace(' ', '-')}" / "model.so"
        if library.exists():
            out[f"TuneHub {label}"] = library
    return out


def retime(work: Path, threads: int, rounds: int = 7) -> tuple[list[dict], list[int], dict | None]:
    """Measure baselines and every stored rung artifact of ``work/rows.json`` again, side by side
    (:func:`interleaved_latencies`); TVM untuned apart (seconds a call)."""
    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target

    saved = json.loads((work / "rows.json").read_text())
    budgets = saved["budgets"]
    labels = ["0", *(rung(p, b) for p in saved.get("paths", ["new"]) for b in budgets), "top-up"]
    rows = []
    for old in saved["rows"]:
        row = {
            k: v
            for k, v in old.items()
            if k in ("model", "tasks", "path", "TVM untuned")
            or k.startswith(("trials ", "wall ", "verified ", "tasks reused "))
        }
        path = Path(old["path"])
        row.update(
            interleaved_latencies(
                old["model"], path, threads, rung_libraries(work, old["model"], labels), rounds
            )
        )
        if "TVM untuned" not in row:
            prepared = prepare_model(path, cpu_target(threads))
            untuned = LoadedLibrary.from_executable(build(prepared.mod, prepared.target))
            row["TVM untuned"] = untuned.time(
                random_inputs(prepared.model.inputs), repeat=3
            ).median_secs
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    return rows, budgets, saved.get("throughput"), saved.get("paths", ["new"])


def load_saved_rows(work: Path) -> dict:
    """What an earlier run with the same ``--work`` left (rungs done are not run again), or {}."""
    path = work / "rows.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_rows(
    work: Path, rows: list[dict], budgets: list[int], throughput: dict | None, paths: list[str]
) -> None:
    (work / "rows.json").write_text(
        json.dumps(
            {"budgets": budgets, "paths": paths, "rows": rows, "throughput": throughput},
            default=str,
            indent=1,
        )
    )


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value * 1e3:.3f}"
    return "-" if value is None else str(value)


def write_report(
    rows: list[dict],
    budgets: list[int],
    throughput: dict | None,
    threads: int,
    note: str = "",
    out: Path | None = None,
    paths: list[str] | None = None,
) -> Path:
    from bench.bench_db import machine

    today = dt.date.today().isoformat()
    info = machine()
    lines = [
        f"# Model benchmark ({today})",
        "",
        f"Machine: {json.dumps(info)}; {threads} threads for every framework; batch 1; "
        "median latency in ms.",
        "Command: `.venv/bin/python -m bench.bench_models " + " ".join(os.sys.argv[1:]) + "`",
        "",
    ]
    if note:
        lines += [note, ""]
    columns = ["ONNX Runtime", "torch eager", "torch.compile", "TVM untuned", "TuneHub 0"]
    labels = [rung(p, b) for p in (paths or ["new"]) for b in budgets]
    columns += [f"TuneHub {label}" for label in labels]
    if any("TuneHub top-up" in row for row in rows):
        columns.append("TuneHub top-up")
    lines.append("| model | tasks | " + " | ".join(columns) + " | TuneHub best / ORT |")
    lines.append("|---" * (len(columns) + 3) + "|")
    for row in rows:
        tuned = [row.get(f"TuneHub {label}") for label in [*labels, "top-up"]]
        best = min((t for t in tuned if isinstance(t, float)), default=None)
        ratio = f"{best / row['ONNX Runtime']:.2f}x" if best else "-"
        cells = [_fmt(row.get(c)) for c in columns]
        lines.append(f"| {row['model']} | {row['tasks']} | " + " | ".join(cells) + f" | {ratio} |")
    lines += ["", "Trials measured (cumulative) and tuning wall time per rung:", ""]
    for row in rows:
        rungs = ", ".join(
            f"{label}: {row.get(f'trials {label}')} trials in "
            f"{row.get(f'wall {label}', 0):.0f} s (verified: {row.get(f'verified {label}')})"
            for label in labels
            if f"trials {label}" in row
        )
        if "trials top-up" in row:
            rungs += (
                f"; top-up: {row['trials top-up']} trials on the tasks the database lacked "
                f"({row['tasks reused top-up']} tasks reused) in "
                f"{row['wall top-up']:.0f} s (verified: {row['verified top-up']})"
            )
        lines.append(f"- {row['model']}: {rungs}")
    pending = [label for label in labels if any(f"TuneHub {label}" not in row for row in rows)]
    if pending:
        lines += ["", f"Not (yet) run: rungs {pending} for some models ('-' above)."]
    if throughput:
        t = throughput
        ours = t["tunehub_trials"] / t["tunehub_secs"]
        plain = t["plain_trials"] / t["plain_secs"]
        lines += [
            "",
            f"## Tuning throughput ({t['model']})",
            "",
            "| run | trials | wall s (tune + compile) | trials/s |",
            "|---|---|---|---|",
            f"| TuneHub (SQL database, callbacks, verify) | {t['tunehub_trials']} | "
            f"{t['tunehub_secs']:.1f} | {ours:.3f} |",
            f"| plain tune_relax (JSON database) | {t['plain_trials']} | {t['plain_secs']:.1f} | "
            f"{plain:.3f} |",
            "",
            f"TuneHub overhead: {(plain / ours - 1) * 100:+.1f} % time per trial "
            "(includes TuneHub's verification against ONNX Runtime and artifact timing).",
        ]
    out = out or REPO / "bench" / "results" / f"models_{today}.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenetv2", "bert", "mlp"])
    parser.add_argument("--trials", nargs="+", type=int, default=[200, 1000, 2000])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--throughput-model", default="mlp")
    parser.add_argument("--throughput-trials", type=int, default=64)
    parser.add_argument(
        "--db",
        help="keep the tuning database at this URL (default: a temporary "
        "SQLite file); bench/bench_cost_model.py trains on such a database",
    )
    parser.add_argument("--work", type=Path, help="keep artifacts and rows.json in DIR")
    parser.add_argument(
        "--out", type=Path, help="report path (default: bench/results/models_<date>.md)"
    )
    parser.add_argument(
        "--top-up",
        type=int,
        metavar="N",
        help="tune only the tasks of the "
        "named models that the database lacks, with N trials (see above)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        choices=PATHS,
        default=["new"],
        help="compile paths to tune, side by side (see above)",
    )
    parser.add_argument(
        "--rounds", type=int, default=7, help="interleaved timing rounds of the final side by side"
    )
    parser.add_argument(
        "--retime",
        type=Path,
        metavar="DIR",
        help="re-measure baselines and the artifacts a --work run left in DIR",
    )
    args = parser.parse_args()
    if args.retime:
        rows, budgets, throughput, paths = retime(args.retime, args.threads, args.rounds)
        print(
            write_report(
                rows,
                budgets,
                throughput,
                args.threads,
                note=(
                    "Latencies re-measured in one run with `--retime` from the artifacts each rung "
                    "published (tuning itself ran earlier, see trials and wall times). "
                    + INTERLEAVED_NOTE
                ),
                out=args.out,
                paths=paths,
            )
        )
        return 0
    import db

    budgets = asked = sorted(args.trials)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunehub-bench-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        throughput = None
        if args.throughput_model:
            throughput = bench_throughput(
                args.throughput_model, args.throughput_trials, args.threads, work
            )
            print(json.dumps(throughput), flush=True)
        storage = db.open_storage(args.db or f"sqlite:///{work / 'bench.db'}", upgrade=True)
        saved = load_saved_rows(work)
        paths = [p for p in PATHS if p in args.paths or p in saved.get("paths", [])]
        if saved:
            budgets = sorted(set(budgets) | set(saved["budgets"]))
            throughput = throughput or saved.get("throughput")
        prepared = {}
        for name in args.models:
            row, prepared[name, "new"], _ = baseline_row(name, args.threads, work)
            zero_trial_rung(row, prepared[name, "new"], work)
            if "today" in args.paths:
                from compiler.prepare import prepare_model
                from compiler.target import cpu_target

                prepared[name, "today"] = prepare_model(
                    Path(row["path"]), cpu_target(args.threads, options=path_options("today"))
                )
            old = next((r for r in saved.get("rows", []) if r["model"] == name), {})
            row.update(
                {
                    k: v
                    for k, v in old.items()
                    if k.startswith("trials done")
                    or k.startswith(("TuneHub ", "trials ", "wall ", "verified "))
                }
            )
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
        rows += [r for r in saved.get("rows", []) if r["model"] not in args.models]
        for budget in asked:  # rung-major: every model gets the small budget first
            for row in rows:
                for path in args.paths:  # side by side: both paths of a model at each rung
                    if (
                        row["model"],
                        path,
                    ) not in prepared or f"TuneHub {rung(path, budget)}" in row:
                        continue  # not asked for this run, or measured by an earlier run
                    tune_rung(row, prepared[row["model"], path], budget, work, storage, path)
                    print(json.dumps(row, default=str), flush=True)
                    write_report(rows, budgets, throughput, args.threads, out=args.out, paths=paths)
                    save_rows(work, rows, budgets, throughput, paths)
        for row in rows:
            if args.top_up and (row["model"], "new") in prepared:
                top_up(row, prepared[row["model"], "new"], args.top_up, work, storage)
                print(json.dumps(row, default=str), flush=True)
                save_rows(work, rows, budgets, throughput, paths)
        storage.close()
        labels = ["0", *(rung(p, b) for p in paths for b in budgets), "top-up"]
        for row in rows:  # the table's latencies: all side by side, at the end
            if row["model"] in args.models:
                row.update(
                    interleaved_latencies(
                        row["model"],
                        Path(row["path"]),
                        args.threads,
                        rung_libraries(work, row["model"], labels),
                        args.rounds,
                    )
                )
                print(json.dumps(row, default=str), flush=True)
        save_rows(work, rows, budgets, throughput, paths)
    print(
        write_report(
            rows,
            budgets,
            throughput,
            args.threads,
            out=args.out,
            paths=paths,
            note=INTERLEAVED_NOTE,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
