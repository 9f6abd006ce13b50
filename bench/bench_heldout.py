"""Held-out models on the CPU: TuneHub's zero-trial build against ONNX Runtime, one run.

    python -m bench.bench_heldout [--models resnet18 ...] [--out bench/results] [--tag NAME]

For each model of :mod:`bench.heldout` (``transformers`` classes, random weights, batch 1, fp32):
export it to ONNX (torch's dynamo exporter, as ``examples/export.py`` does), then TuneHub's product
path for a model nobody tuned: ``prepare_model`` →
:func:`tuner.final_build.finalize.publish_zero_trial` (every task with a library peer on it, the
others on TuneHub's default schedules), which verifies the library against ONNX Runtime. Both are
then timed on the same seeded inputs with every core this process may use, in alternating rounds
(:func:`interleaved`): the table gives both medians, the median of the rounds' ratios (TuneHub /
ONNX Runtime: below 1 is faster) and their spread, and the number of tasks and of peers. Rows are
written as they finish: ``<out>/heldout_<date>[_<tag>].md`` and ``.json``. Run it alone: on a 2-core
machine anything beside it skews both columns.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

#: Alternating rounds of :func:`interleaved`, and calls per round.
ROUNDS = 7
CALLS = 9


def bench_model(name: str, work: Path) -> dict[str, Any]:
    """One row: export, import, zero-trial build, verification and timings of ``name``."""
    import torch

    from bench.heldout import BY_NAME, build
    from compiler.prepare import prepare_model
    from compiler.target import resolve_target
    from examples.export import onnx_from_program
    from tuner.final_build.finalize import publish_zero_trial

    row: dict[str, Any] = {"model": name, "describe": BY_NAME[name].describe}
    model, inputs = build(name)
    started = time.perf_counter()
    program = torch.export.export(model, inputs)
    proto = onnx_from_program(
        program,
        inputs,
        input_names=[f"input_{i}" for i in range(len(inputs))],
        output_names=["output"],
    )
    path = work / f"{name}.onnx"
    path.write_bytes(proto.SerializeToString())
    row["export_secs"] = round(time.perf_counter() - started, 1)
    started = time.perf_counter()
    prepared = prepare_model(path, resolve_target("cpu"))
    row["prepare_secs"] = round(time.perf_counter() - started, 1)
    row["tasks"] = len(prepared.partition.tasks)
    started = time.perf_counter()
    manifest = publish_zero_trial(prepared, work / f"{name}-artifact", force=True)
    row["build_secs"] = round(time.perf_counter() - started, 1)
    row["peers"] = len((manifest.get("peers") or {}).get("tasks", []))
    row["verification"] = manifest["verification"]["message"]
    row["threads"] = manifest["reference"]["threads"]
    row.update(interleaved(prepared, work / f"{name}-artifact", row["threads"]))
    return row


def interleaved(prepared: Any, artifact: Path, threads: int, rounds: int = ROUNDS) -> dict:
    """TuneHub's artifact and ONNX Runtime timed in ``rounds`` alternating rounds (each the
    median of :data:`CALLS` calls after a warm-up): the median of each, and the median of the
    per-round ratios, so that a burst of load on a shared machine lands on both columns."""
    import statistics

    import numpy as np
    import onnxruntime

    from compiler.build.artifact_layout import LIBRARY_NAME
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs

    arrays = random_inputs(prepared.model.inputs)
    library = LoadedLibrary(artifact / LIBRARY_NAME, "cpu")
    device_args = library._to_device(arrays)  # noqa: SLF001 - inputs on the device once
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(
        prepared.model.source.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feeds = {spec.name: a for spec, a in zip(prepared.model.inputs, arrays)}
    main = library.vm["main"]

    def median_ms(call: Any) -> float:
        call()
        times = []
        for _ in range(CALLS):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(median_ms(lambda: main(*device_args)))
        theirs.append(median_ms(lambda: session.run(None, feeds)))
    ratios = np.array(ours) / np.array(theirs)
    return {
        "tunehub_ms": statistics.median(ours),
        "onnxruntime_ms": statistics.median(theirs),
        "ratio": float(np.median(ratios)),
        "ratio_range": [float(ratios.min()), float(ratios.max())],
        "rounds": rounds,
    }


def machine() -> dict[str, Any]:
    from compiler.target import resolve_target

    target = resolve_target("cpu")
    return {
        "date": dt.date.today().isoformat(),
        "cpu": target.describe(),
        "cores": len(os.sched_getaffinity(0)),
        "host": platform.platform(),
    }


def write_report(stem: Path, info: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    lines = [
        f"# Held-out models on the CPU, zero trials ({info['date']})",
        "",
        f"Machine: {info['cpu']}, {info['cores']} cores, {info['host']}. Command: "
        f"`{info['command']}`. One run, side by side: TuneHub's zero-trial artifact and ONNX "
        "Runtime on the same seeded inputs, both with every core, timed in alternating rounds "
        "(ms per call: medians over the rounds); `ratio` = the median of the rounds' TuneHub / "
        "ONNX Runtime ratios (below 1: TuneHub is faster), `range` their spread.",
        "",
        "| model | what | tasks | peers | ONNX Runtime | TuneHub | ratio | range | verified |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['describe']} | | | | | | {r['error'][:120]} | |")
            continue
        lines.append(
            f"| {r['model']} | {r['describe']} | {r['tasks']} | {r['peers']} | "
            f"{r['onnxruntime_ms']:.2f} | {r['tunehub_ms']:.2f} | **{r['ratio']:.2f}x** | "
            f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f} | {r['verification']} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(
        json.dumps({"machine": info, "rows": rows}, indent=1) + "\n"
    )


def main() -> int:
    import sys

    from bench.heldout import HELDOUT

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=[m.name for m in HELDOUT])
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    info = machine()
    info["command"] = "python -m bench.bench_heldout " + " ".join(sys.argv[1:])
    stem = args.out / (f"heldout_{info['date']}" + (f"_{args.tag}" if args.tag else ""))
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tunehub-heldout-") as tmp:
        for name in args.models:
            try:
                rows.append(bench_model(name, Path(tmp)))
            except Exception as err:  # noqa: BLE001 - reported in the table
                from bench.heldout import BY_NAME

                rows.append(
                    {
                        "model": name,
                        "describe": BY_NAME[name].describe,
                        "error": f"{type(err).__name__}: {err}",
                        "traceback": traceback.format_exc()[-2000:],
                    }
                )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "traceback"}), flush=True)
            write_report(stem, info, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
