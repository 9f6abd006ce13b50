"""Measurement spread: how far repeated measurements of one schedule drift, per runner config.

    .venv/bin/python -m bench.bench_measure_spread [--example mlp] [--trials 16] [--repeats 10]

Tunes the example briefly into a scratch database, takes the best schedule of each task, builds
it once, and measures the same library ``--repeats`` times through MetaSchedule's LocalRunner
(each measurement is what one trial records: the mean of its ``run_secs``). For each evaluator
configuration it reports the spread ``(max - min) / median`` and the coefficient of variation of
those repeated measurements; the goal is a spread within 3 % for TuneHub's default
(:class:`tuner.measuring.builder_runner.MeasureConfig`). Writes
``bench/results/measure_spread_<date>.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import tempfile
from contextlib import closing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CONFIGS = {
    "number=1 repeat=3 min_repeat_ms=10": dict(repeat=3, min_repeat_ms=10),
    "TuneHub default": {},
    "number=1 repeat=10 min_repeat_ms=100": dict(repeat=10, min_repeat_ms=100),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default="mlp")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    import tvm
    from tvm.s_tir import meta_schedule as ms

    import db
    from bench.bench_db import machine
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from db.metaschedule_database import MetaScheduleDatabase
    from examples.export import export_onnx
    from tuner.engine.search import FAST_SEARCH
    from tuner.jobs.job import tune_model
    from tuner.measuring.builder_runner import MeasureConfig, make_builder, make_runner

    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="tunehub-spread-") as tmp,
        closing(make_builder(MeasureConfig())) as builder,
    ):
        work = Path(tmp)
        target = cpu_target()
        prepared = prepare_model(export_onnx(args.example, work / "m.onnx"), target)
        storage = db.open_storage(f"sqlite:///{work / 's.db'}", upgrade=True)
        tune_model(storage, prepared, trials=args.trials, output_dir=work / "a", search=FAST_SEARCH)
        database = MetaScheduleDatabase(storage, target)
        for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
            mod = extracted.dispatched[0]
            record = database.query_tuning_record(mod, target.tvm_target(), task.name)
            if record is None:
                continue
            sch = tvm.s_tir.Schedule(mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            built = builder.build([ms.builder.BuilderInput(sch.mod, target.tvm_target())])[0]
            if built.error_msg:
                continue
            args_info = ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])
            for label, overrides in CONFIGS.items():
                config = dataclasses.replace(MeasureConfig(), **overrides)
                runner = make_runner(config)
                means = []
                for _ in range(args.repeats):
                    (future,) = runner.run(
                        [ms.runner.RunnerInput(built.artifact_path, "cpu", args_info)]
                    )
                    result = future.result()
                    if result.error_msg:
                        break
                    secs = [float(x) for x in result.run_secs]
                    means.append(sum(secs) / len(secs))
                if len(means) < 2:
                    continue
                median = statistics.median(means)
                rows.append(
                    {
                        "task": task.name,
                        "config": label,
                        "median_us": median * 1e6,
                        "spread_pct": (max(means) - min(means)) / median * 100,
                        "cv_pct": statistics.stdev(means) / statistics.mean(means) * 100,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
        storage.close()
    today = dt.date.today().isoformat()
    lines = [
        f"# Measurement spread ({today})",
        "",
        f"Machine: {json.dumps(machine())}. Example `{args.example}`, best schedule per task after "
        f"{args.trials} trials, each measured {args.repeats} times through LocalRunner.",
        f"TuneHub default: {MeasureConfig()}",
        "",
        "| task | runner config | median (us) | spread (max-min)/median | CV |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['task']} | {r['config']} | {r['median_us']:.2f} | {r['spread_pct']:.1f} % | "
        f"{r['cv_pct']:.1f} % |"
        for r in rows
    ]
    out = REPO / "bench" / "results" / f"measure_spread_{today}.md"
    out.write_text("\n".join(lines) + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
