"""Where an artifact's estimate and its measured latency part: each tuned kernel timed alone.

    .venv/bin/python -m bench.task_times ARTIFACT_DIR [--threads 2] [--repeat 50]

A TuneHub artifact's estimated latency is ``sum(weight x best_ms)`` over its tasks, where
``best_ms`` is what MetaSchedule's runner measured while tuning: the kernel alone, built by
itself, repeated on the same buffers without flushing the CPU cache
(``tuner.measuring.builder_runner``). Inside the model each kernel runs once per call, after other
layers have evicted its weights and inputs. This tool calls every tuned kernel of the published
``model.so`` directly, on random inputs of the manifest's shapes, twice: with warm caches (as the
tuner measured) and with the CPU cache flushed before each repeat (TVM's
``cache_flush_cpu_non_first_arg``, which flushes every argument but the first), and prints both next
to the tuner's ``best_ms``, weighted sums included, with the artifact's measured model latency for
comparison. Timing only: nothing is written.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path, help="folder with model.so and manifest.json")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    os.environ.setdefault("TVM_NUM_THREADS", str(args.threads))
    for name in ("manifest.json", "model.so"):
        if not (args.artifact / name).is_file():
            parser.error(f"{args.artifact} has no {name}: pass a folder `tunehub tune -o` wrote")
    import tvm

    manifest = json.loads((args.artifact / "manifest.json").read_text())
    if manifest.get("target", {}).get("kind", "cpu") != "cpu":
        parser.error("only CPU artifacts: the kernels are timed on this machine's CPU")
    # The VM executable imports the DSO that holds the kernels; time them there.
    library = tvm.runtime.load_module(str(args.artifact / "model.so")).imports[0]
    device = tvm.cpu(0)
    best = {s["key"]: s for s in manifest["schedules"]}
    rng = np.random.default_rng(0)
    rows = []
    for task in manifest["tasks"]:
        schedule = best.get(task["key"])
        if not task.get("tunable") or schedule is None or schedule.get("best_ms") is None:
            continue
        arrays = [
            tvm.runtime.tensor(rng.uniform(-1, 1, s["shape"]).astype(s["dtype"]), device)
            for s in task["shapes"]
        ]
        times = {}
        for flush in (False, True):
            evaluator = library.time_evaluator(
                task["name"],
                device,
                number=1,
                repeat=args.repeat,
                f_preproc="cache_flush_cpu_non_first_arg" if flush else "",
            )
            times[flush] = float(np.median(evaluator(*arrays).results)) * 1e3
        rows.append((task["name"], task["weight"], schedule["best_ms"], times[False], times[True]))
    print(f"{'task':58} {'w':>2} {'tuner ms':>9} {'warm ms':>9} {'flushed ms':>10}")
    for name, weight, tuned, warm, flushed in rows:
        print(f"{name[:58]:58} {weight:>2} {tuned:9.4f} {warm:9.4f} {flushed:10.4f}")
    sums = [sum(r[1] * r[i] for r in rows) for i in (2, 3, 4)]
    print(f"{'weighted sum':58} {'':>2} {sums[0]:9.3f} {sums[1]:9.3f} {sums[2]:10.3f}")
    measured = manifest.get("measured") or {}
    print(
        f"manifest: estimated {manifest.get('estimated_ms', float('nan')):.3f} ms, "
        f"measured median {measured.get('median_ms', float('nan')):.3f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
