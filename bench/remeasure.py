"""Re-measure two runs' best schedules side by side, now, on this machine.

A warm run and the cold run it is compared with were measured on different days of a shared
machine; a task's recorded time moves with the load. :func:`remeasure_bests` takes the best
stored schedule of each task from two databases (e.g. the cold runs' and a warm run's), builds
both with the tuner's builder and times them with the tuner's runner in alternation, ``rounds``
times each, so that both estimates are taken under the same conditions.

    .venv/bin/python -m bench.remeasure --source sqlite:///COLD.db --warm WORK/warm-M.db \
        --model M [--leave-out TASK ...] [--rounds 3] [--out FILE]

``--source`` holds the cold runs (``bench_models --db``), ``--warm`` a warm run's database from
``bench/bench_cost_model.py --work``; tasks and weights are the model's in the source, as there.
Prints (and with ``--out`` writes) a Markdown table: per task, both re-measured times, and both
estimates, recorded and re-measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Remeasured:
    """One task: its weight, and the median of the re-measured mean run times (seconds) of the
    ``a`` and ``b`` runs' best schedules (``None``: it did not build or run)."""

    task: str
    weight: int
    a_secs: float | None
    b_secs: float | None


def remeasure_bests(
    pairs: list[tuple[str, int, Any, Any, Any]], target: Any, rounds: int = 3
) -> list[Remeasured]:
    """``pairs``: ``(task name, weight, workload module, best row of run a, best row of run
    b)``; ``target`` a :class:`compiler.target.TargetSpec`. Returns one :class:`Remeasured` per
    pair, in order. A schedule that does not build or run gets ``None``; never raises for one."""
    from tuner.final_build.remeasure import time_side_by_side

    schedules = [
        (mod, json.loads(row.trace_json))
        for _, _, mod, row_a, row_b in pairs
        for row in (row_a, row_b)
    ]
    rounds_of = time_side_by_side(schedules, target, rounds)
    out = []
    for index, (task, weight, _, _, _) in enumerate(pairs):
        a, b = rounds_of[2 * index], rounds_of[2 * index + 1]
        out.append(Remeasured(task, weight, *(statistics.median(t) if t else None for t in (a, b))))
    return out


def estimate(rows: list[Remeasured], which: str) -> float | None:
    """``sum(weight x time)`` over the tasks for run ``which`` (``"a"`` or ``"b"``); ``None``
    when any task has no time."""
    values = [getattr(r, f"{which}_secs") for r in rows]
    if any(v is None for v in values):
        return None
    return sum(r.weight * v for r, v in zip(rows, values, strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="database URL with the cold runs")
    parser.add_argument("--warm", type=Path, required=True, help="a warm run's SQLite database")
    parser.add_argument("--model", required=True)
    parser.add_argument("--leave-out", nargs="*", default=[], metavar="TASK")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.warm.is_file():
        parser.error(f"{args.warm} is not a file")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    import tvm

    import db
    from bench.bench_cost_model import model_runs
    from bench.bench_db import machine

    source = db.open_storage(args.source)
    warm = db.open_storage(f"sqlite:///{args.warm}")
    try:
        model, _ = model_runs(source, args.model)
        targets = warm.list_targets()
        if len(targets) != 1:
            parser.error(f"{args.warm} holds {len(targets)} targets; a warm run's holds one")
        (target,) = targets
        cold_target = source.get_target(target.key)
        if cold_target is None:
            parser.error(f"{args.source} has no records for the warm run's target {target.key}")
        pairs, recorded = [], [0.0, 0.0]
        for task in source.model_workloads(model.id):
            if task.task_name in args.leave_out:
                continue
            workload = source.get_workload_by_id(task.workload_id)
            cold_best = source.best_record(task.workload_id, cold_target.id)
            warm_id = warm.workload_ids([workload.key]).get(workload.key)
            warm_best = warm.best_record(warm_id, target.id) if warm_id else None
            if cold_best is None or warm_best is None:
                continue  # untunable here or not tuned by one of the runs: in neither estimate
            recorded[0] += task.weight * cold_best.mean_secs
            recorded[1] += task.weight * warm_best.mean_secs
            pairs.append(
                (
                    task.task_name,
                    task.weight,
                    tvm.ir.load_json(workload.mod_json),
                    cold_best,
                    warm_best,
                )
            )
        if not pairs:
            parser.error(f"no task of {args.model} has a best record in both databases")
        rows = remeasure_bests(pairs, target.spec(), args.rounds)
    finally:
        warm.close()
        source.close()
    lines = [
        f"# Re-measured best schedules: {args.model}, cold vs warm ({dt.date.today()})",
        "",
        f"Machine: {json.dumps(machine())}.",
        "",
        "| task | weight | cold best now (ms) | warm best now (ms) | warm / cold |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r.b_secs / r.a_secs:.2f}" if r.a_secs and r.b_secs else "-"
        lines.append(f"| {r.task} | {r.weight} | {_ms(r.a_secs)} | {_ms(r.b_secs)} | {ratio} |")
    cold_now, warm_now = estimate(rows, "a"), estimate(rows, "b")
    lines += [
        "",
        "| estimate (ms) | cold | warm | warm / cold |",
        "|---|---|---|---|",
        (
            f"| recorded | {recorded[0] * 1e3:.3f} | {recorded[1] * 1e3:.3f} | "
            f"{recorded[1] / recorded[0]:.3f} |"
        ),
        (
            f"| re-measured now (median of {args.rounds}) | {_ms(cold_now)} | {_ms(warm_now)} | "
            + (f"{warm_now / cold_now:.3f} |" if cold_now and warm_now else "- |")
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


def _ms(secs: float | None) -> str:
    return "-" if secs is None else f"{secs * 1e3:.4f}"


if __name__ == "__main__":
    raise SystemExit(main())
