"""Two or more TuneHub decoder artifacts side by side: prefill and decode in alternating rounds.

    python -m bench.bench_llm_artifacts NAME=ARTIFACT_DIR [NAME=ARTIFACT_DIR ...]
        [--rounds 3] [--steps 10] [--tag T] [--out bench/results]

What one compiler change does to a whole decoder, measured in one process: each round runs every
artifact in turn (:class:`compiler.llm.generate.Generator`): a prefill of 128 and of 512 tokens
from an empty cache, then 128 tokens and ``--steps`` greedy decode steps (the first two not
timed). Medians over the rounds, ms; the greedy tokens of the last round, to show the builds
agree. With ``--memory``, each artifact is first run alone in a child process, which reports its
resident memory (``VmRSS``) once loaded, after a 128-token prefill and the decode steps, and its
peak (``VmHWM``). Writes ``llm_artifacts_<date>_<tag>.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.llm_compare import machine

PROMPTS = (128, 512)


def measure(generator, prompt: np.ndarray, steps: int) -> tuple[dict[str, float], list[int]]:
    """One round of one artifact: seconds of each prefill and of each timed step; the tokens."""
    times: dict[str, float] = {}
    for count in PROMPTS:
        generator.reset()
        start = time.perf_counter()
        generator.prefill(prompt[:count])
        times[f"prefill {count}"] = time.perf_counter() - start
    generator.reset()
    logits = generator.prefill(prompt[:128])
    tokens, step_secs = [], []
    for index in range(steps):
        token = logits.astype(np.float32).argmax(axis=-1)
        tokens.append(int(token[0]))
        start = time.perf_counter()
        logits = generator.step(token)
        if index >= 2:
            step_secs.append(time.perf_counter() - start)
    times["decode @128"] = statistics.median(step_secs)
    return times, tokens


#: What the memory child runs: load, prefill 128 tokens, decode, reporting ``VmRSS`` (GB) at each
#: stage and ``VmHWM`` at the end, as one JSON line.
_MEMORY_CHILD = """
import json, sys
from pathlib import Path
import numpy as np
from compiler.llm.generate import Generator

def status(field):
    for line in open('/proc/self/status'):
        if line.startswith(field + ':'):
            return int(line.split()[1]) * 1024 / 1e9

out = {}
generator = Generator.load(Path(sys.argv[1]))
out['loaded'] = status('VmRSS')
prompt = np.random.default_rng(0).integers(0, 30_000, 128).astype(np.int64)
logits = generator.prefill(prompt)
out['after prefill 128'] = status('VmRSS')
for _ in range(int(sys.argv[2])):
    logits = generator.step(logits.astype(np.float32).argmax(axis=-1))
out['after decode'] = status('VmRSS')
out['peak'] = status('VmHWM')
print(json.dumps(out))
"""


def memory(folder: str, steps: int) -> dict[str, float]:
    """GB of resident memory of an artifact run alone in a child process (see the module
    docstring)."""
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, folder, str(steps)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from compiler.llm.generate import Generator

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifacts", nargs="+", help="NAME=ARTIFACT_DIR")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--memory", action="store_true", help="RSS of each, alone, first")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    if any("=" not in item for item in args.artifacts):
        parser.error("each artifact is NAME=ARTIFACT_DIR")
    named = dict(item.split("=", 1) for item in args.artifacts)
    memories = (
        {name: memory(folder, args.steps) for name, folder in named.items()} if args.memory else {}
    )
    generators = {name: Generator.load(Path(folder)) for name, folder in named.items()}
    # Token ids every decoder here takes (TinyLlama's vocabulary has 32,000).
    prompt = np.random.default_rng(0).integers(0, 30_000, max(PROMPTS)).astype(np.int64)
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in generators}
    tokens: dict[str, list[int]] = {}
    load = os.getloadavg()
    for _ in range(args.rounds):
        for name, generator in generators.items():
            times, tokens[name] = measure(generator, prompt, args.steps)
            rounds[name].append(times)
    cases = list(next(iter(rounds.values()))[0])
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    info = machine(int(os.environ.get("TVM_NUM_THREADS", "0") or 0))
    flags = ", ".join(f for f, present in info["flags"].items() if present)
    lines = [
        f"# Decoder artifacts side by side ({date})",
        "",
        f"- Machine: {info['cpu']}; {info['cores_available']} cores; flags: {flags}; "
        f"`TVM_NUM_THREADS` {os.environ.get('TVM_NUM_THREADS', 'unset')}; load average at "
        f"start {load[0]:.2f}.",
        f"- Command: `python -m bench.bench_llm_artifacts {' '.join(args.artifacts)} "
        f"--rounds {args.rounds} --steps {args.steps}{' --memory' if args.memory else ''}`.",
        f"- Medians of {args.rounds} alternating rounds, ms.",
        "",
        "| artifact | " + " | ".join(cases) + " | greedy tokens (first 8) |",
        "|---|" + "---|" * (len(cases) + 1),
    ]
    for name, samples in rounds.items():
        medians = [statistics.median(s[case] for s in samples) * 1e3 for case in cases]
        lines.append(
            f"| {name} (`{named[name]}`) | "
            + " | ".join(f"{m:.1f}" for m in medians)
            + f" | {tokens[name][:8]} |"
        )
    if memories:
        stages = list(next(iter(memories.values())))
        lines += [
            "",
            "Resident memory, GB (each artifact alone in a child process: loaded, after a "
            f"128-token prefill, after {args.steps} decode steps; peak = `VmHWM`):",
            "",
            "| artifact | " + " | ".join(stages) + " |",
            "|---|" + "---|" * len(stages),
        ]
        for name, found in memories.items():
            lines.append(f"| {name} | " + " | ".join(f"{found[s]:.2f}" for s in stages) + " |")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"llm_artifacts_{date}{'_' + args.tag if args.tag else ''}.md"
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
