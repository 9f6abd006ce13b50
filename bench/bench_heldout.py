"""Held-out models on the CPU: TuneHub's zero-trial build against ONNX Runtime, one run.

    python -m bench.bench_heldout [--models resnet18 ...] [--out bench/results] [--tag NAME]

For each model of :mod:`bench.heldout` (``transformers`` classes, random weights, batch 1, fp32):
export it to ONNX (torch's dynamo exporter, as ``examples/export.py`` does), then TuneHub's product
path for a model nobody tuned: ``prepare_model`` → :func:`tuner.finalize.publish_zero_trial`
(every task with a library peer on it, the others on TuneHub's default schedules), which verifies
the library against ONNX Runtime and times both on the same seeded inputs with every core this
process may use (the manifest's ``measured`` and ``reference``). The table gives both medians and
their ratio (TuneHub / ONNX Runtime: below 1 is faster), the number of tasks and of peers, the
import and build seconds. Rows are written as they finish: ``<out>/heldout_<date>[_<tag>].md``
and ``.json``. Run it alone: on a 2-core machine anything beside it skews both columns.
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


def bench_model(name: str, work: Path) -> dict[str, Any]:
    """One row: export, import, zero-trial build, verification and timings of ``name``."""
    import torch

    from bench.heldout import BY_NAME, build
    from compiler.prepare import prepare_model
    from compiler.target import resolve_target
    from examples.export import onnx_from_program
    from tuner.finalize import publish_zero_trial

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
    row["tunehub_ms"] = manifest["measured"]["median_ms"]
    row["onnxruntime_ms"] = manifest["reference"]["median_ms"]
    row["threads"] = manifest["reference"]["threads"]
    row["ratio"] = row["tunehub_ms"] / row["onnxruntime_ms"]
    return row


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
        "Runtime on the same seeded inputs, both with every core (ms per call, medians); "
        "`ratio` = TuneHub / ONNX Runtime (below 1: TuneHub is faster).",
        "",
        "| model | what | tasks | peers | ONNX Runtime | TuneHub | ratio | verified | build s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['describe']} | | | | | | {r['error'][:120]} | |")
            continue
        lines.append(
            f"| {r['model']} | {r['describe']} | {r['tasks']} | {r['peers']} | "
            f"{r['onnxruntime_ms']:.2f} | {r['tunehub_ms']:.2f} | **{r['ratio']:.2f}x** | "
            f"{r['verification']} | {r['build_secs']} |"
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
