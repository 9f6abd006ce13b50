"""Index of ``bench/results/``: writes ``docs/benchmarks.md``.

Each results file is named ``<benchmark>_<YYYY-MM-DD>[_<tag>].md`` (a ``.json`` twin may sit
beside it). Files are grouped by benchmark (the name before the date) and by machine (read from
the file's ``Machine:`` line: the CPU or GPU model). The newest file of each group is its
*current* result; the older ones are listed after it. Newest means the latest date in the name,
then the latest commit that added the file (a file git does not track yet counts as newest of
its date).

    python -m bench.results_index          # write docs/benchmarks.md
    python -m bench.results_index --check  # exit 1 if docs/benchmarks.md is out of date
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
OUTPUT = REPO / "docs" / "benchmarks.md"

NAME = re.compile(r"^(?P<bench>[a-z0-9_]+?)_(?P<date>\d{4}-\d{2}-\d{2})(?:_(?P<tag>.+))?$")

#: Files kept as the evidence of a bug, never a benchmark's current result.
EVIDENCE_ONLY = frozenset({"onednn_peers_2026-12-02_openmp_bug"})
#: Files a run of the same day replaces, though committed (or renamed) after it.
SUPERSEDED = frozenset({"llm_2026-12-06_cache1g_qwen05"})

#: Machine names: (pattern in the machine line, label). A line naming several (a CPU run on the
#: GPU machine's host) is the first one it names.
MACHINES = (
    (re.compile(r"\bH200\b"), "NVIDIA H200"),
    (re.compile(r"\bH100\b"), "NVIDIA H100"),
    (re.compile(r"Xeon", re.IGNORECASE), "Intel Xeon"),
    (re.compile(r"EPYC", re.IGNORECASE), "AMD EPYC"),
)
MACHINE_LINE = re.compile(r"^\s*(?:[-*]\s*)?(?:\*\*)?machine\b", re.IGNORECASE)
CPU_ARCH = re.compile(r"\b(znver\d|rocketlake|emeraldrapids|sapphirerapids|skylake[a-z0-9-]*)\b")
CORES = re.compile(r'(\d+) (?:usable |logical )?(?:cores|CPUs|CPU cores)\b|"cores": (\d+)')


@dataclass(frozen=True)
class Result:
    """One results file (its ``.md``) and what the index shows of it."""

    path: Path
    benchmark: str
    date: str
    machine: str
    detail: str
    title: str
    added: float  # commit time that added the file; ``inf`` when git does not track it

    @property
    def has_json(self) -> bool:
        return self.path.with_suffix(".json").exists()

    @property
    def sort_key(self) -> tuple[str, float, str]:
        return (self.date, self.added, self.path.name)


def machine_of(text: str) -> tuple[str, str]:
    """``(label, detail)`` of the machine a results file names: its ``Machine:`` line (or, when
    it has none, the first of its ten first lines that names a known machine)."""
    lines = text.splitlines()[:40]
    line = next((line for line in lines if MACHINE_LINE.match(line)), None)
    if line is None:
        known = (line for line in lines[:10] if any(p.search(line) for p, _ in MACHINES))
        line = next(known, "")
    hits = [(m.start(), name) for pattern, name in MACHINES if (m := pattern.search(line))]
    label = min(hits)[1] if hits else "not recorded"  # the machine the line names first
    detail = []
    if arch := CPU_ARCH.search(line):
        detail.append(f"`{arch.group(1)}`")
    if cores := CORES.search(line):
        detail.append(f"{cores.group(1) or cores.group(2)} cores")
    return label, ", ".join(detail)


def title_of(text: str) -> str:
    """The file's first ``# `` heading, or an empty string."""
    for line in text.splitlines()[:5]:
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def added_times(paths: list[Path]) -> dict[str, float]:
    """Commit time (seconds) of the commit that first added each file, by file name."""
    try:
        log = subprocess.run(
            [
                "git",
                "log",
                "--diff-filter=A",
                "--name-only",
                "--format=@%ct",
                "--",
                "bench/results",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    wanted = {p.name for p in paths}
    added: dict[str, float] = {}
    when = math.inf
    for line in log.splitlines():  # newest commit first: keep the oldest time seen
        if line.startswith("@"):
            when = float(line[1:])
        elif line.strip():
            name = Path(line.strip()).name
            if name in wanted:
                added[name] = when
    return added


def scan(results: Path = RESULTS) -> list[Result]:
    """Every ``<benchmark>_<date>[_<tag>].md`` under ``results``."""
    paths = sorted(results.glob("*.md"))
    added = added_times(paths)
    found = []
    for path in paths:
        match = NAME.match(path.stem)
        if match is None:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        machine, detail = machine_of(text)
        found.append(
            Result(
                path=path,
                benchmark=match["bench"],
                date=match["date"],
                machine=machine,
                detail=detail,
                title=title_of(text),
                added=added.get(path.name, math.inf),
            )
        )
    return found


def group(results: list[Result]) -> dict[tuple[str, str], list[Result]]:
    """Results by ``(benchmark, machine)``, each list newest first; evidence-only and superseded
    files last."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for result in results:
        groups.setdefault((result.benchmark, result.machine), []).append(result)
    for files in groups.values():
        files.sort(key=lambda r: r.sort_key, reverse=True)
        files.sort(key=lambda r: r.path.stem in EVIDENCE_ONLY | SUPERSEDED)
    return dict(sorted(groups.items()))


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def render(groups: dict[tuple[str, str], list[Result]]) -> str:
    """The Markdown of ``docs/benchmarks.md``."""
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by `python -m bench.results_index` from bench/results/. Do not edit. -->",
        "",
        "Every measured figure in these docs names a file under `bench/results/`. Each file",
        "records its machine, date, command and tree. This page lists them: one row per",
        "benchmark and machine, its newest file first (the current result), older files after it.",
        "",
        "- Paths are relative to the repository root. Open them in your checkout.",
        "- *Machine* is the CPU or GPU model the file records. The 2-core AMD EPYC machines",
        "  were Zen 3 (`znver3`) or Zen 5 (`znver5`) virtual machines; the detail column says",
        "  which, where the file records it.",
        "- `(+ json)`: the run's raw data sits beside its `.md`. The raw JSON of superseded",
        "  runs was removed from the tree; it lives in git history.",
        "- Numbers from one file compare with each other only: these shared 2-core machines",
        "  move ONNX Runtime's own times by up to 2x between runs.",
        "",
        "| benchmark | machine | detail | current result | older results |",
        "|---|---|---|---|---|",
    ]
    for (benchmark, machine), files in groups.items():
        current, older = files[0], files[1:]
        cell = f"`{relative(current.path)}`"
        if current.has_json:
            cell += " (+ json)"
        if current.title:
            cell += f"<br>{current.title}"
        older = [r for r in older if r.path.stem not in EVIDENCE_ONLY]
        older_cell = "<br>".join(f"`{relative(r.path)}`" for r in older) or "—"
        out.append(f"| {benchmark} | {machine} | {current.detail or '—'} | {cell} | {older_cell} |")
    evidence = [r for files in groups.values() for r in files if r.path.stem in EVIDENCE_ONLY]
    if evidence:
        out += ["", "Kept as the evidence of a bug, never current:", ""]
        out += [f"- `{relative(r.path)}`: {r.title}" for r in evidence]
    out += [
        "",
        "Regenerate after adding a results file:",
        "",
        "```bash",
        ".venv/bin/python -m bench.results_index",
        "```",
        "",
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page is out of date")
    parser.add_argument("--out", type=Path, default=OUTPUT, help="page to write")
    args = parser.parse_args(argv)
    text = render(group(scan()))
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is out of date: run python -m bench.results_index", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({sum(1 for _ in text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
