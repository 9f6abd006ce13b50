"""Cost-model benchmark: offline ranking quality and search efficiency, warm vs cold.

    .venv/bin/python -m bench.bench_cost_model --source URL [--models mlp bert mobilenetv2]
        [--folds 4] [--skip-search]

``--source`` is a tuning database holding cold tuning runs of the example models, as
``bench/bench_models.py --db URL`` leaves it (MetaSchedule's cold XGBModel, every trial stored).

1. Offline evaluation (:mod:`cost_model.evaluate`) over every workload of the source database:
   held-out workloads, pairwise rank accuracy and top-1/top-5 recall of the transferred model
   (both objectives) against MetaSchedule's cold XGBModel.
2. Search efficiency, per model M: the cold curve is M's own run in the source database
   (estimated model latency, ``sum(weight * best so far)``, after each stored trial). A fresh
   database receives every record of the *other* workloads of the source (none of M's), a
   transferred model is trained on it, and M is tuned there with ``--cost-model transfer`` and
   the same trial budget (or ``--max-warm-trials``), stopping as soon as it is within 5 % of the
   cold run's final estimate.
   Reported: trials each run needed to get within 5 % of the cold run's final estimate.
   ``--no-base``: the same warm run with no base booster (the ablation of the transfer).
   Warm runs measure sibling seeds (:mod:`tuner.task_scheduler.sibling_seeds`; they count as trials;
   with ``--population`` siblings' schedules also go into their search populations,
   :mod:`tuner.database.primed`); the models of the copied workloads are registered so that
   families are known; ``--no-seeds`` turns seeds off.
3. ``--unseen MODEL ...``: rank accuracy on each workload of a model of a booster trained on the
   records of every other workload (what a warm run of that model starts from).

Writes ``bench/results/cost_model_<date>.md`` with the machine and date. The estimates are the
runs' recorded times; to compare a warm run's end with the cold run's under the same machine
conditions, re-measure both runs' best schedules with ``bench/remeasure.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
WITHIN = 1.05


class _Reached(BaseException):
    """Raised from a progress listener to stop tuning once the target estimate is reached."""


class StopWhenWithin:
    def __init__(self, goal_secs: float) -> None:
        self.goal_secs = goal_secs
        self.reached_at: int | None = None

    def on_batch(self, update) -> None:
        est = update.estimated_model_secs
        if est is not None and est <= self.goal_secs:
            self.reached_at = update.total_trials
            raise _Reached()


def curve(records, weights: dict[int, int]) -> list[float]:
    """Estimated model latency after each record (inf until every task has a valid one)."""
    best: dict[int, float] = {}
    out = []
    for row in records:
        if row.workload_id in weights and row.is_valid and row.mean_secs:
            best[row.workload_id] = min(best.get(row.workload_id, np.inf), row.mean_secs)
        est = sum(w * best[k] for k, w in weights.items()) if len(best) == len(weights) else np.inf
        out.append(est)
    return out


def trials_to(goal: float, values: list[float]) -> int | None:
    for i, value in enumerate(values):
        if value <= goal:
            return i + 1
    return None


def model_runs(storage, name: str):
    """The source database's model row for example ``name`` and its cold records, in order.

    Every model row of that name counts (a re-export that differs by a byte is a new model row
    with the same tasks, e.g. the ``--continue`` rungs of ``bench_models``).
    """
    models = [m for m in storage.list_models() if m.filename.startswith(f"{name}.")]
    if not models:
        raise SystemExit(f"the source database has no model named {name}")
    model = models[0]
    ids = {m.id for m in models}
    jobs = [j for j in storage.list_jobs() if j.model_id in ids]
    records = []
    for job in jobs:
        after = 0
        while batch := storage.list_records(job_id=job.id, after_id=after, limit=2000):
            records.extend(batch)
            after = batch[-1].id
    records.sort(key=lambda r: r.id)
    return model, records


def copy_other_workloads(source, dest, target_row, exclude: set[int]) -> int:
    """Copy every record of ``target_row`` whose workload is not in ``exclude``, and the models
    that use those workloads with their task names (what sibling seeds look families up in);
    return the number of records copied."""
    from db import ModelWorkload, NewTuningRecord

    spec = target_row.spec()
    dest_target = dest.ensure_target(spec)
    copied = 0
    new_ids: dict[int, int] = {}
    for workload in source.list_workloads(target_id=target_row.id):
        if workload.id in exclude:
            continue
        new = dest.ensure_workload(
            workload.key, workload.mod_json, flops=workload.flops, summary=workload.summary
        )
        new_ids[workload.id] = new.id
        rows = list(source.iter_records(target_id=target_row.id, workload_id=workload.id))
        dest.commit_records(
            [
                NewTuningRecord(
                    workload_id=new.id,
                    target_id=dest_target.id,
                    trace_json=r.trace_json,
                    run_secs=r.run_secs,
                    args_info_json=r.args_info_json,
                    error_text=r.error_text,
                )
                for r in rows
            ]
        )
        copied += len(rows)
    for model in source.list_models():
        tasks = [t for t in source.model_workloads(model.id) if t.workload_id in new_ids]
        if not tasks or any(t.workload_id in exclude for t in source.model_workloads(model.id)):
            continue
        row = dest.add_model(
            content_hash=model.content_hash,
            format=model.format,
            filename=model.filename,
            size=model.size,
            owner=model.owner,
        )
        dest.set_model_workloads(
            row.id,
            [
                ModelWorkload(
                    model_id=row.id,
                    workload_id=new_ids[t.workload_id],
                    task_name=t.task_name,
                    weight=t.weight,
                    skip_reason=t.skip_reason,
                )
                for t in tasks
            ],
        )
    return copied


@contextlib.contextmanager
def sibling_seeders():
    """Every :class:`tuner.task_scheduler.sibling_seeds.SiblingSeeds` created inside the block, to
    read its counters after the run (a run stopped by :class:`StopWhenWithin` returns no
    summary)."""
    from tuner.task_scheduler.sibling_seeds import SiblingSeeds

    created: list = []
    original = SiblingSeeds.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        created.append(self)

    SiblingSeeds.__init__ = init
    try:
        yield created
    finally:
        SiblingSeeds.__init__ = original


def search_efficiency(
    source,
    target_row,
    name: str,
    work: Path,
    max_trials: int | None = None,
    transfer: bool = True,
    seeds: bool = True,
    leave_out: frozenset[str] = frozenset(),
    population: bool = False,
    seed: int = 0,
    full_budget: bool = False,
) -> dict:
    """One warm run of example ``name`` (see the module docstring). ``transfer=False``: the
    run's cost model starts with no booster and learns from the run's measurements alone (the
    same :class:`cost_model.transfer.TransferCostModel`), separating in-run learning from what
    the other models' records add. ``seeds=False``: no sibling seeds
    (:mod:`tuner.task_scheduler.sibling_seeds`; the cold runs of ``bench_models`` before they
    existed had none); ``population=True``: sibling schedules also put in the search's populations
    (:mod:`tuner.database.primed`, off by default). ``seed``: the search's random seed.
    ``leave_out``: task names left out of both estimates (their trials still count; the run's
    stop listener still sees every task, so such a run goes on to its cap). ``full_budget``: no
    stop listener; the run spends its whole budget (what a user's run would do, and what a
    side-by-side re-measurement of its end, ``bench/remeasure.py``, should judge)."""
    import db
    from compiler.prepare import prepare_model
    from cost_model.booster import BoosterConfig
    from cost_model.store import load_model, save_model, train_for_target
    from cost_model.transfer import TransferCostModel
    from examples.export import export_onnx
    from tuner.engine.cost_models import CostModelChoice, guard_switches, transfer_choice
    from tuner.engine.search import SearchConfig
    from tuner.jobs.job import tune_model

    model, cold_records = model_runs(source, name)
    weights = {
        w.workload_id: w.weight
        for w in source.model_workloads(model.id)
        if w.task_name not in leave_out
    }
    tuned = {r.workload_id for r in cold_records}
    weights = {k: w for k, w in weights.items() if k in tuned}  # untunable tasks left out
    cold = curve(cold_records, weights)
    cold_final = cold[-1]
    goal = WITHIN * cold_final
    row = {
        "model": name,
        "cold_trials": len(cold_records),
        "cold_final_ms": cold_final * 1e3,
        "cold_to_goal": trials_to(goal, cold),
        "left_out": sorted(leave_out),
    }
    dest = db.open_storage(f"sqlite:///{work / f'warm-{name}.db'}", upgrade=True)
    try:
        spec = target_row.spec()
        if transfer:
            row["transfer_records"] = copy_other_workloads(source, dest, target_row, set(weights))
            start = time.perf_counter()
            trained = train_for_target(dest, spec)
            row["train_secs"] = time.perf_counter() - start
            save_model(dest, spec, trained)
            cost_model = transfer_choice(load_model(dest, spec))
        else:
            row["model"] = f"{name} (no base booster)"
            row["transfer_records"] = 0
            cost_model = CostModelChoice(TransferCostModel(None, BoosterConfig()), "transfer")
        path = export_onnx(name, work / f"{name}.onnx")
        prepared = prepare_model(path, spec)
        if prepared.target.key != spec.key:
            raise SystemExit("this machine's target differs from the source database's")
        stop = StopWhenWithin(goal)
        start = time.perf_counter()
        try:
            budget = min(len(cold_records), max_trials or len(cold_records))
            with sibling_seeders() as seeders:
                tune_model(
                    dest,
                    prepared,
                    trials=budget,
                    output_dir=work / f"out-{name}",
                    filename=path.name,
                    listeners=[] if full_budget else [stop],
                    cost_model=cost_model,
                    seed=seed,
                    search=SearchConfig(
                        sibling_seeds=seeds, sibling_population=seeds and population
                    ),
                )
        except (_Reached, RuntimeError) as err:
            if stop.reached_at is None:
                raise err
        row["warm_secs"] = time.perf_counter() - start
        job = max(dest.list_jobs(), key=lambda j: j.id)
        warm_records = dest.list_records(job_id=job.id, limit=100000)
        dest_weights = {
            dest.workload_ids([source.get_workload_by_id(k).key])[
                source.get_workload_by_id(k).key
            ]: w
            for k, w in weights.items()
        }
        warm = curve(warm_records, dest_weights)
        row["warm_trials"] = len(warm_records)
        row["warm_to_goal"] = trials_to(goal, warm)
        row["warm_best_ms"] = min(warm, default=np.inf) * 1e3
        # Both estimates at equal trials ("never worse than cold" is read from these).
        row["at_equal_trials"] = {
            n: (warm[n - 1] * 1e3, cold[n - 1] * 1e3)
            for n in sorted({100, 150, 200, 250, 300, 400, len(warm)})
            if n <= min(len(warm), len(cold))
        }
        row["guard_switches"] = guard_switches(getattr(cost_model.model, "guard_log", []))
        row["sibling_seeds"] = sum(len(s.measured) for s in seeders)
        row["sibling_population"] = sum(s.populated for s in seeders)
        if not seeds:
            row["model"] += " (no seeds)"
        elif population:
            row["model"] += " (seeds and population)"
        if seed:
            row["model"] += f" (seed {seed})"
    finally:
        dest.close()
    return row


def unseen_model_accuracy(source, target_row, training_set, name: str) -> list[dict]:
    """Per workload of model ``name``: pairwise rank accuracy of a booster trained on every
    *other* workload's records (what a warm run of that model starts from, before fine-tuning)."""
    from cost_model.booster import BoosterConfig, predict, train_booster
    from cost_model.dataset import throughput_labels
    from cost_model.metrics import pairwise_accuracy

    model, _ = model_runs(source, name)
    keys = {
        source.get_workload_by_id(w.workload_id).key: w for w in source.model_workloads(model.id)
    }
    held = [g for g, key in enumerate(training_set.workload_keys) if key in keys]
    train = ~np.isin(training_set.groups, held)
    labels = throughput_labels(training_set.costs, training_set.groups)
    booster = train_booster(
        training_set.features[train], labels[train], training_set.groups[train], BoosterConfig()
    )
    rows = []
    for group in held:
        idx = np.flatnonzero(training_set.groups == group)
        if np.isfinite(training_set.costs[idx]).sum() < 4:
            continue
        workload = source.get_workload_by_id(keys[training_set.workload_keys[group]].workload_id)
        rows.append(
            {
                "model": name,
                "workload": workload.summary.split(" ")[0],
                "records": len(idx),
                "weight": keys[workload.key].weight,
                "pairwise": pairwise_accuracy(
                    predict(booster, training_set.features[idx]),
                    training_set.costs[idx],
                    np.zeros(len(idx), np.int32),
                ),
            }
        )
    return rows


def write_report(eval_rows, search_rows, source_url: str, args, unseen_rows=()) -> Path:
    """Write the tables (and the command that made them) to ``args.out`` or the default."""
    from bench.bench_db import machine

    today = dt.date.today().isoformat()
    lines = [
        f"# Cost-model benchmark ({today})",
        "",
        f"Machine: {json.dumps(machine())}.",
        "Command: `.venv/bin/python -m bench.bench_cost_model " + " ".join(os.sys.argv[1:]) + "`",
        f"Source database: cold runs written by `bench/bench_models.py --db` ({source_url}).",
        "",
    ]
    if eval_rows:
        lines += [
            "## Offline evaluation: held-out workloads",
            "",
            f"{args.folds} workload folds over the workloads with at least {args.min_records} "
            "records; each held-out workload's records in measurement order, "
            "first half = history a run may have measured (`seen`), second half = test candidates. "
            "cold = MetaSchedule's XGBModel updated with the `seen` records (random below its 100 "
            "warm-up samples); transfer = booster trained on the other folds' workloads, "
            "fine-tuned on the `seen` records.",
            "",
            "| model | seen | workloads | pairwise acc | top-1 recall | top-5 recall |",
            "|---|---|---|---|---|---|",
        ]
        for r in eval_rows:
            lines.append(
                f"| {r.model} | {r.seen} | {r.workloads} | {r.pairwise:.3f} | "
                f"{r.top1:.3f} | {r.top5:.3f} |"
            )
    if search_rows:
        lines += [
            "",
            "## Search efficiency: trials to within 5 % of the cold run's final estimate",
            "",
            "| model | cold trials | cold final est. (ms) | cold trials to goal "
            "| records transferred "
            "| warm trials to goal | warm / cold | warm best est. (ms) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in search_rows:
            ratio = (
                f"{r['warm_to_goal'] / r['cold_to_goal']:.2f}"
                if r.get("warm_to_goal") and r.get("cold_to_goal")
                else "-"
            )
            warm = r.get("warm_to_goal") or f"not within {r.get('warm_trials')}"
            lines.append(
                f"| {r['model']} | {r['cold_trials']} | {r['cold_final_ms']:.4f} | "
                f"{r['cold_to_goal']} | {r.get('transfer_records')} | {warm} | {ratio} | "
                f"{r.get('warm_best_ms', float('nan')):.4f} |"
            )
    equal = [r for r in search_rows if r.get("at_equal_trials")]
    if equal:
        lines += [
            "",
            "### Estimated latency at equal trials, warm / cold (ms)",
            "",
            "| model | trials | warm | cold | warm / cold |",
            "|---|---|---|---|---|",
        ]
        for r in equal:
            for n, (warm, cold) in r["at_equal_trials"].items():
                lines.append(
                    f"| {r['model']} | {n} | {warm:.3f} | {cold:.3f} | {warm / cold:.2f} |"
                )
    left = [r for r in search_rows if r.get("left_out")]
    if left:
        lines += [
            "",
            "Tasks left out of both estimates (`--leave-out`; their trials still count): "
            + "; ".join(f"{r['model']}: {', '.join(r['left_out'])}" for r in left)
            + ".",
        ]
    seeded = [r for r in search_rows if "sibling_seeds" in r]
    if seeded:
        lines += [
            "",
            "Sibling seeds measured in the warm runs (counted in their trials): "
            + ", ".join(f"{r['model']} {r['sibling_seeds']}" for r in seeded)
            + "; "
            "sibling schedules put in their search populations (summed over batches): "
            + ", ".join(f"{r['model']} {r.get('sibling_population', 0)}" for r in seeded)
            + ".",
        ]
    switched = [(r["model"], s) for r in search_rows for s in r.get("guard_switches", [])]
    if switched:
        lines += ["", "Guard switches (batch index over all scored batches):", ""]
        lines += [
            f"- {name}: batch {s['batch']}, {s['family']} to the {s['to']} model "
            f"(window rank accuracy transfer {s['transfer_accuracy']:.3f}, cold "
            f"{s['cold_accuracy']:.3f})"
            for name, s in switched
        ]
    if unseen_rows:
        lines += [
            "",
            "## A model none of whose workloads the booster has seen",
            "",
            "Booster (rank objective) trained on every other workload's records; pairwise rank "
            "accuracy over all stored records of each workload of the model (0.5 = chance).",
            "",
            "| model | workload | records | weight | pairwise acc |",
            "|---|---|---|---|---|",
        ]
        for r in unseen_rows:
            lines.append(
                f"| {r['model']} | {r['workload']} | {r['records']} | {r['weight']} | "
                f"{r['pairwise']:.3f} |"
            )
        by_model: dict[str, list[float]] = {}
        for r in unseen_rows:
            by_model.setdefault(r["model"], []).append(r["pairwise"])
        for name, values in by_model.items():
            lines.append(
                f"| {name} | **mean of {len(values)} workloads** | | | **{np.mean(values):.3f}** |"
            )
    out = args.out or REPO / "bench" / "results" / f"cost_model_{today}.md"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="database URL with cold runs")
    parser.add_argument("--models", nargs="*", default=["mlp", "bert", "mobilenetv2"])
    parser.add_argument("--folds", type=int, default=4)
    parser.add_argument(
        "--min-records",
        type=int,
        default=40,
        help="hold out only workloads with at least this many records",
    )
    parser.add_argument(
        "--history",
        type=int,
        nargs="+",
        default=[0, 16, 64],
        help="records of a held-out workload the models may learn from first",
    )
    parser.add_argument("--skip-eval", action="store_true")
    parser.add_argument(
        "--unseen",
        nargs="*",
        default=[],
        metavar="MODEL",
        help="per-workload rank accuracy on these models' workloads of a booster "
        "trained on all other workloads",
    )
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument(
        "--no-base",
        action="store_true",
        help="warm runs start with no booster "
        "and learn from their own measurements only (ablation of the transfer)",
    )
    parser.add_argument(
        "--no-seeds",
        action="store_true",
        help="warm runs without sibling schedules, measured or in "
        "populations (tuner.task_scheduler.sibling_seeds, tuner.database.primed)",
    )
    parser.add_argument(
        "--full-budget",
        action="store_true",
        help="warm runs spend their whole budget instead of stopping at the goal "
        "(their recorded estimate can reach it early on a fast moment of the "
        "machine)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the warm runs' search seed (repeat a run with another to see its spread)",
    )
    parser.add_argument(
        "--population",
        action="store_true",
        help="warm runs also put sibling schedules in their search populations "
        "(tuner.database.primed; off by default, as in tunehub tune)",
    )
    parser.add_argument(
        "--leave-out",
        nargs="*",
        default=[],
        metavar="TASK",
        help="task names left out of the cold and warm estimates (e.g. tasks the "
        "cold run only tuned in a later job, after a compiler change renamed them)",
    )
    parser.add_argument(
        "--max-warm-trials",
        type=int,
        help="stop a warm run here even when it has "
        "not reached the goal (default: the cold run's trial count)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        help="keep the warm runs' databases and artifacts "
        "here (default: a temporary folder, removed at the end)",
    )
    parser.add_argument(
        "--out", type=Path, help="report path (default: bench/results/cost_model_<date>.md)"
    )
    args = parser.parse_args()
    import db
    from compiler.target import cpu_target
    from cost_model.dataset import extend_training_set
    from cost_model.evaluate import evaluate

    source = db.open_storage(args.source)
    target_row = source.get_target(cpu_target().key)
    if target_row is None:
        raise SystemExit("the source database has no records for this machine's CPU target")
    eval_rows, search_rows, unseen_rows = [], [], []
    training_set = None
    if not args.skip_eval or args.unseen:
        training_set = extend_training_set(source, target_row)
    if not args.skip_eval:
        eval_rows = evaluate(
            source,
            target_row,
            training_set,
            folds=args.folds,
            min_records=args.min_records,
            history_sizes=args.history,
        )
    for name in args.unseen:
        unseen_rows += unseen_model_accuracy(source, target_row, training_set, name)
    if eval_rows or unseen_rows:
        print(write_report(eval_rows, search_rows, args.source, args, unseen_rows), flush=True)
    with tempfile.TemporaryDirectory(prefix="tunehub-cm-bench-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in [] if args.skip_search else args.models:
            if (work / f"warm-{name}.db").exists():
                raise SystemExit(f"{work / f'warm-{name}.db'} exists: pass another --work")
            search_rows.append(
                search_efficiency(
                    source,
                    target_row,
                    name,
                    work,
                    args.max_warm_trials,
                    not args.no_base,
                    not args.no_seeds,
                    frozenset(args.leave_out),
                    args.population,
                    args.seed,
                    args.full_budget,
                )
            )
            print(json.dumps(search_rows[-1], default=str), flush=True)
            print(write_report(eval_rows, search_rows, args.source, args, unseen_rows), flush=True)
    source.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
