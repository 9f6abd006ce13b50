"""Where a tuned artifact's time goes: its tasks by weighted time, with GFLOP/s and implementation.

    .venv/bin/python -m bench.task_gflops ARTIFACT_DIR [ARTIFACT_DIR ...] [--top 12]

Reads each artifact's ``manifest.json`` (nothing is run or written) and prints, per artifact, a
markdown table of its tasks sorted by ``weight x best_ms`` (the build's estimate of the task's
share of one model call): the implementation the build chose (``schedule``: tuned TIR,
``default``: TVM's default schedule, or a library peer such as ``openblas gemm``, with its
algorithm where the final build's re-measure names one: ``winograd_f4``, ``packed``), trials, the
chosen candidate's ``best_ms`` (the final build's side-by-side re-measure where there was one,
else the best record), its GFLOP/s (the task's FLOPs as MetaSchedule counts them over
``best_ms``: for Winograd, more than the machine's peak, since it does fewer), and its share
of the estimate. Kernels timed alone: an in-model kernel can be slower
(``bench.task_times`` shows by how much).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def task_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest's ``schedules`` with ``weighted_ms`` and ``gflops`` added, heaviest first.

    Raises:
        ValueError: the manifest has no ``schedules`` (a zero-trial build records none).
    """
    schedules = manifest.get("schedules")
    if not schedules:
        raise ValueError("the manifest lists no schedules (not a tuned build)")
    algorithms = {
        entry["key"]: candidate["peer"]["algorithm"]
        for entry in manifest.get("remeasured") or []
        for candidate in entry.get("candidates", [])
        if candidate.get("chosen") and (candidate.get("peer") or {}).get("algorithm")
    }
    rows = []
    for schedule in schedules:
        best_ms = schedule.get("best_ms")
        if best_ms is None:
            continue
        flops = schedule.get("flops") or 0.0
        implementation = schedule["implementation"]
        if schedule["key"] in algorithms:
            implementation += f" ({algorithms[schedule['key']]})"
        rows.append(
            {
                **schedule,
                "implementation": implementation,
                "weighted_ms": schedule["weight"] * best_ms,
                "gflops": flops / (best_ms * 1e6) if flops else None,
            }
        )
    return sorted(rows, key=lambda row: -row["weighted_ms"])


def markdown(name: str, manifest: dict[str, Any], top: int) -> str:
    """One artifact's table (its ``top`` heaviest tasks and a line for the rest)."""
    rows = task_rows(manifest)
    total = sum(row["weighted_ms"] for row in rows)
    measured = (manifest.get("measured") or {}).get("median_ms")
    lines = [
        f"**{name}**: {len(rows)} tasks, estimate {total:.3f} ms (sum of weight x best ms)"
        + (f", measured {measured:.3f} ms in the build" if measured else "")
        + ".",
        "",
        "| task | weight | implementation | trials | best ms | GFLOP/s | weight x ms | share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows[:top]:
        gflops = f"{row['gflops']:.0f}" if row["gflops"] else "-"
        lines.append(
            f"| {row['name'][:60]} | {row['weight']} | {row['implementation']} | "
            f"{row.get('trials', '-')} | {row['best_ms']:.4f} | {gflops} | "
            f"{row['weighted_ms']:.3f} | {row['weighted_ms'] / total:.0%} |"
        )
    rest = rows[top:]
    if rest:
        rest_ms = sum(row["weighted_ms"] for row in rest)
        lines.append(f"| {len(rest)} more | | | | | | {rest_ms:.3f} | {rest_ms / total:.0%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "artifacts",
        nargs="+",
        type=Path,
        help="folders with a manifest.json (a tuned build's output)",
    )
    parser.add_argument("--top", type=int, default=12, help="tasks listed per artifact")
    args = parser.parse_args()
    for folder in args.artifacts:
        path = folder / "manifest.json"
        if not path.is_file():
            parser.error(f"{folder} has no manifest.json")
        try:
            print(markdown(folder.name, json.loads(path.read_text()), args.top), end="\n\n")
        except ValueError as error:
            parser.error(f"{folder}: {error}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
