"""LLM runtimes side by side (issue 32): prefill and decode of real-shaped decoders, one process.

    python -m bench.llm_compare [--models qwen2.5-0.5b tinyllama-1.1b] [--threads 2]
        [--prefill 128 512] [--contexts 128 1024] [--batch4 | --no-batch4]
        [--batch4-contexts 128] [--runtimes NAME ...] [--decode-tokens 16] [--repeats 3]
        [--rounds 1] [--work-dir /tmp/tunehub-llm-bench] [--out bench/results] [--tag TAG]

Per model (one at a time): the weights are built once (:mod:`bench.llm_models`, random,
seeded, written with ``save_pretrained`` under ``--work-dir``, never in the repository), each
runtime converts them once (cached under the work dir), then every selected runtime is measured
by :func:`bench.llm_peers.measure` (prefill at each ``--prefill`` length, decode ms/token at each
``--contexts`` length at batch 1, and a step at batch 4 at ``--batch4-contexts``; medians; see
that module for exactly what is timed), all with ``--threads`` threads. The physical limit
(weight bytes per token / copy bandwidth, :func:`bench.llm_limit.physical_limit`) comes from a
bandwidth measurement made in the same run, before the models. ``--rounds R`` > 1 measures the
runtimes R times in a new seeded order each round (each round loads, and compiles, again) and
reports the median of the rounds; every round is kept in the JSON. ``--runtimes`` picks from
:data:`RUNTIMES` (default :data:`DEFAULT_RUNTIMES`: the peers of
:data:`bench.llm_peers.PEERS`, then registered runtimes); ``torch-compile-max-autotune`` and
``ort-genai-int8`` run only when named.

Writes ``llm_<UTC date>[_<tag>].json`` and ``.md`` into ``--out`` (default ``bench/results``)
after every runtime: the machine (CPU model from ``/proc/cpuinfo``, the AVX2 / AVX-512 /
AVX512_BF16 / AMX flags found at run time, cores, threads used), the date, the settings, the
bandwidth, and per model a table: one row per runtime variant with its weight precision,
prefill ms, decode ms/token and tokens/s, the fraction of the limit at its precision reached
(limit ms / measured ms, at the first context), and how many leading greedy tokens equal
``torch eager``'s (batch 1, first context; fp32 paths should agree, quantized ones need not).

**The hook for TuneHub** (and any other runtime): :data:`RUNTIMES` maps a ``--runtimes`` name to
a factory of a :class:`bench.llm_runtime.Runtime` (``start`` / ``prefill`` / ``step`` on int64
token ids, ``prepare`` from a :class:`bench.llm_runtime.PreparedModel`). A benchmark script adds
its own before calling :func:`main`::

    from bench.llm_compare import main, register_runtime
    register_runtime("tunehub-zero", lambda: TuneHubRuntime(tuned=False))
    register_runtime("tunehub-tuned", lambda: TuneHubRuntime(tuned=True))
    main()

A registered runtime is measured by default (``default=False`` leaves it to ``--runtimes``),
after the peers, with the same harness, so its row is comparable column for column; its
``describe()`` lands in the JSON. :func:`run` is the same without the command line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from bench.llm_limit import measure_bandwidth, physical_limit
from bench.llm_models import (
    DEFAULT_WORK_DIR,
    LLM_SPECS,
    REAL_SPECS,
    count_parameters,
    get_spec,
    save_model_folder,
)
from bench.llm_peers import OPTIONAL_PEERS, PEERS, measure
from bench.llm_runtime import PeerResult, PreparedModel, RuntimeFactory, Settings
from compiler.target import cpu_flags

log = logging.getLogger("bench.llm_compare")

RUNTIMES: dict[str, RuntimeFactory] = {**PEERS, **OPTIONAL_PEERS}
"""``--runtimes`` names -> runtime factories: the peers, the optional peers (run only when
named), then whatever is registered."""

DEFAULT_RUNTIMES: list[str] = list(PEERS)
"""Measured when ``--runtimes`` is not given, in this order."""

REFERENCE = ("torch", "eager")
"""The runtime whose greedy tokens the others are compared with."""

CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def register_runtime(name: str, factory: RuntimeFactory, *, default: bool = True) -> None:
    """Add (or replace) runtime ``name``; with ``default`` it runs without ``--runtimes``."""
    RUNTIMES[name] = factory
    if default and name not in DEFAULT_RUNTIMES:
        DEFAULT_RUNTIMES.append(name)


def machine(threads: int) -> dict[str, Any]:
    """CPU model and flags from ``/proc/cpuinfo``, cores, memory, threads used, versions."""
    info: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "flags": {}}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            info["cpu"] = value.strip()
            break
    flags = cpu_flags()
    if flags:
        info["flags"] = {f: f in flags for f in CPU_FLAGS}
    try:
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()
        info["memory_gib"] = round(int(mem[1]) / 2**20, 1)
    except (OSError, IndexError, ValueError):
        pass
    info["cores"] = os.cpu_count()
    info["cores_available"] = len(os.sched_getaffinity(0))
    info["threads_used"] = threads
    info["python"] = sys.version.split()[0]
    info["load_average_start"] = os.getloadavg()
    return info


def _median_results(rounds: Sequence[PeerResult]) -> PeerResult:
    """One result whose timings are the medians over ``rounds`` (tokens of the first)."""
    ok = [r for r in rounds if r.error is None]
    if not ok:
        return rounds[0]
    if len(ok) == 1:
        return ok[0]

    def med(attr: str) -> Mapping[int, float]:
        keys = set.intersection(*(set(getattr(r, attr)) for r in ok))
        return MappingProxyType(
            {k: statistics.median(getattr(r, attr)[k] for r in ok) for k in sorted(keys)}
        )

    compile_s = [r.compile_s for r in ok if r.compile_s is not None]
    return replace(
        ok[0],
        prefill_ms=med("prefill_ms"),
        decode_ms=med("decode_ms"),
        decode_b4_ms=med("decode_b4_ms"),
        setup_s=statistics.median(r.setup_s or 0.0 for r in ok),
        compile_s=statistics.median(compile_s) if compile_s else None,
    )


def _leading_equal(a: Sequence[int] | None, b: Sequence[int] | None) -> str:
    """``"n/m"``: how many leading tokens of ``a`` equal ``b``'s, of the shorter length."""
    if not a or not b:
        return ""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return f"{n}/{min(len(a), len(b))}"


def _fmt(x: float | None, digits: int = 2) -> str:
    if x is None:
        return "–"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}"


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report's markdown: machine, settings, bandwidth, then one table per model."""
    m, s = report["machine"], report["settings"]
    flags = ", ".join(f for f, on in m.get("flags", {}).items() if on) or "none found"
    lines = [
        f"# LLM runtimes side by side ({report['date']})",
        "",
        f"- Machine: {m['cpu']}; {m['cores']} cores ({m['cores_available']} available); "
        f"{m.get('memory_gib', '?')} GiB; flags: {flags}; threads used: {m['threads_used']}.",
        f"- Load average at start: {', '.join(f'{x:.2f}' for x in m['load_average_start'])}"
        + (
            f", at the end: {', '.join(f'{x:.2f}' for x in m['load_average_end'])}"
            if "load_average_end" in m
            else ""
        )
        + ".",
        *_busy_warning(m),
        f"- Settings: prefill {s['prefill']}, contexts {s['contexts']}, batch 4 at "
        f"{s['batch4_contexts'] or 'none'}, {s['decode_tokens']} timed decode tokens after "
        f"{s['warmup_tokens']} warm-up, {s['repeats']} prefill repeats, {report['rounds']} "
        f"round(s); medians in ms.",
        f"- Copy bandwidth: {_fmt(report['bandwidth']['best_gbs'])} GB/s "
        f"({report['bandwidth']['method']}; "
        + ", ".join(
            f"{k} {_fmt(v)}" for k, v in report["bandwidth"].items() if k.startswith("copy_")
        )
        + ")."
        + _read_bandwidth(report["bandwidth"]),
        *_builds(report),
        "",
    ]
    for name, entry in report["models"].items():
        lines += _model_table(name, entry, s)
    lines += [
        "Columns: prefill = ms for P prompt tokens at batch 1; decode = ms per token at batch 1 "
        "after C tokens of context (tokens/s in brackets); b4 = ms per step of 4 sequences "
        "(tokens/s in brackets); limit % = the limit at that precision (weights / copy "
        "bandwidth) over the measured decode at the first context (read limit %: at the read "
        "bandwidth); greedy = leading greedy tokens equal "
        "to torch eager's (batch 1, first context).",
        "",
    ]
    return "\n".join(lines)


def _read_bandwidth(bandwidth: Mapping[str, Any]) -> str:
    """The read bandwidth, where the run measured it (runs before 2026-12-07 did not)."""
    if "best_read_gbs" not in bandwidth:
        return ""
    threads = ", ".join(f"{k} {_fmt(v)}" for k, v in bandwidth.items() if k.startswith("read_"))
    return (
        f" Read bandwidth: {_fmt(bandwidth['best_read_gbs'])} GB/s ({threads}); a decode step "
        "mostly reads, so runtimes can beat the copy limit; the limit rows' `ms_at_read_bandwidth`"
        " in the JSON is the bound at this figure."
    )


def _builds(report: Mapping[str, Any]) -> list[str]:
    """One line per distinct llama.cpp build (the CPU features it was compiled for)."""
    infos = {
        r["extra"].get("system_info")
        for e in report["models"].values()
        for r in e["results"]
        if r.get("extra", {}).get("system_info")
    }
    return [f"- llama.cpp build: `{info}`" for info in sorted(infos)]


def _busy_warning(m: Mapping[str, Any]) -> list[str]:
    """A warning line when other work loaded the machine: a 1-minute load above half the cores
    at the start. The load at the end is reported, not judged: it counts the benchmark's own
    threads (on 2 cores, 2 threads alone raise it to about 2)."""
    if m["load_average_start"][0] > 0.5 * (m.get("cores_available") or 1):
        return [
            "- **Warning: the machine was busy** (load average above half the cores): a "
            "runtime's threads wait for cores it does not get (llama.cpp's 2-thread decode "
            "was seen to take 100x longer under load). Re-run alone before comparing."
        ]
    return []


def _model_table(name: str, entry: Mapping[str, Any], s: Mapping[str, Any]) -> list[str]:
    results = [PeerResultView(r) for r in entry["results"]]
    limits = {r.precision: r for r in results if r.runtime == "limit"}
    ref = next((r for r in results if (r.runtime, r.variant) == REFERENCE), None)
    first = s["contexts"][0] if s["contexts"] else None
    case = f"b1c{first}"
    head = ["runtime", "weights"]
    head += [f"prefill {p}" for p in s["prefill"]]
    head += [f"decode @{c}" for c in s["contexts"]]
    head += [f"b4 @{c}" for c in s["batch4_contexts"]]
    read_limits = any(_read_limit_ms(r) for r in limits.values())
    head += ["limit %"] + (["read limit %"] if read_limits else [])
    head += ["greedy", "setup s", "compile s", "note"]
    lines = [
        f"## {name}: {entry['description']} ({_params(entry['parameters'])} parameters)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in results:
        row = [f"{r.runtime} {r.variant}", r.precision]
        row += [_fmt(r.prefill_ms.get(str(p))) for p in s["prefill"]]
        for c in s["contexts"]:
            ms = r.decode_ms.get(str(c))
            row.append(f"{_fmt(ms)} ({_fmt(1e3 / ms, 1)})" if ms else "–")
        for c in s["batch4_contexts"]:
            ms = r.decode_b4_ms.get(str(c))
            row.append(f"{_fmt(ms)} ({_fmt(4e3 / ms, 1)})" if ms else "–")
        lim = limits.get(r.precision)
        ms = r.decode_ms.get(str(first)) if first is not None else None
        if r.runtime != "limit" and lim is not None and ms:
            row.append(f"{100 * lim.decode_ms[str(first)] / ms:.0f} %")
            if read_limits:
                row.append(f"{100 * _read_limit_ms(lim) / ms:.0f} %")
        else:
            row += [""] * (2 if read_limits else 1)
        row.append(_agreement_view(r, ref, case))
        row.append(_fmt(r.setup_s, 1) if r.setup_s is not None else "")
        row.append(_fmt(r.compile_s, 1) if r.compile_s is not None else "")
        note = r.error or (r.batch4_note if r.batch4_note not in (None, "not asked") else "")
        row.append(str(note).replace("|", "/").replace("\n", " ")[:160])
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return lines


def _read_limit_ms(limit: PeerResultView) -> float | None:
    """A limit row's bound at the measured read bandwidth (runs since 2026-12-07)."""
    return (getattr(limit, "extra", None) or {}).get("ms_at_read_bandwidth")


class PeerResultView:
    """A :class:`PeerResult`'s JSON read back (string keys), for rendering."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        self.__dict__.update(d)


def _params(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.{0 if n >= 1e7 else 2}f} M"


def _agreement_view(r: PeerResultView, ref: PeerResultView | None, case: str) -> str:
    if r is ref:
        return "ref."
    if ref is None or r.runtime == "limit":
        return ""
    return _leading_equal(r.tokens.get(case), ref.tokens.get(case))


def _write(report: Mapping[str, Any], out_dir: Path, stem: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    compact = json.dumps(report, separators=(",", ":"))  # the tree stays small; jq reads it
    for path, text in ((jpath, compact), (mpath, render_markdown(report))):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return jpath, mpath


def run(
    models: Sequence[str],
    runtimes: Sequence[str],
    settings: Settings,
    work_dir: Path = DEFAULT_WORK_DIR,
    out_dir: Path | None = None,
    rounds: int = 1,
    tag: str = "",
    bandwidth_mib: int = 512,
) -> dict[str, Any]:
    """Measure ``runtimes`` on ``models``; the report (also written when ``out_dir`` is set)."""
    unknown = [r for r in runtimes if r not in RUNTIMES]
    if unknown:
        raise KeyError(f"unknown runtimes {unknown}; known: {sorted(RUNTIMES)}")
    now = dt.datetime.now(dt.UTC)
    stem = f"llm_{now.date().isoformat()}" + (f"_{tag}" if tag else "")
    bandwidth = measure_bandwidth(settings.threads, bandwidth_mib)
    log.info("copy bandwidth %.1f GB/s", bandwidth["best_gbs"])
    report: dict[str, Any] = {
        "date": now.isoformat(timespec="seconds"),
        "machine": machine(settings.threads),
        "settings": {
            "threads": settings.threads,
            "prefill": list(settings.prefill),
            "contexts": list(settings.contexts),
            "batch4_contexts": list(settings.batch4_contexts),
            "decode_tokens": settings.decode_tokens,
            "warmup_tokens": settings.warmup_tokens,
            "repeats": settings.repeats,
            "seed": settings.seed,
            "runtimes": list(runtimes),
        },
        "rounds": rounds,
        "bandwidth": bandwidth,
        "models": {},
    }
    for name in models:
        spec = get_spec(name)
        t0 = time.perf_counter()
        folder = save_model_folder(spec, work_dir, settings.seed)
        prepared = PreparedModel.of(spec, folder, work_dir, settings.seed)
        entry: dict[str, Any] = {
            "description": spec.description,
            "spec": spec.to_json(),
            "parameters": count_parameters(spec),
            "folder": str(folder),
            "weights_s": time.perf_counter() - t0,
            "results": [
                r.to_json()
                for r in physical_limit(spec, float(bandwidth["best_gbs"]), settings, bandwidth)
            ],
            "rounds": {},
        }
        report["models"][name] = entry
        per_runtime: dict[str, list[PeerResult]] = {r: [] for r in runtimes}
        rng = random.Random(settings.seed)
        for k in range(rounds):
            order = list(runtimes)
            if k > 0:
                rng.shuffle(order)
            for rname in order:
                log.info("%s: %s (round %d/%d)", name, rname, k + 1, rounds)
                t = time.perf_counter()
                res = measure(RUNTIMES[rname](), prepared, settings)
                log.info("%s: %s done in %.1f s%s", name, rname, time.perf_counter() - t,
                         f" ({res.error})" if res.error else "")  # fmt: skip
                per_runtime[rname].append(res)
                entry["rounds"].setdefault(rname, []).append(res.to_json())
                entry["results"] = [r for r in entry["results"] if r["runtime"] == "limit"] + [
                    _median_results(v).to_json() for v in per_runtime.values() if v
                ]
                report["machine"]["load_average_end"] = os.getloadavg()
                if out_dir is not None:
                    _write(report, out_dir, stem)
    if out_dir is not None:
        jpath, mpath = _write(report, out_dir, stem)
        log.info("wrote %s and %s", jpath, mpath)
    return report


def _ints(values: Sequence[str]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(REAL_SPECS), choices=sorted(LLM_SPECS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefill", nargs="+", default=["128", "512"], help="prompt lengths")
    p.add_argument("--contexts", nargs="+", default=["128", "1024"], help="decode contexts")
    p.add_argument("--batch4", action=argparse.BooleanOptionalAction, default=True,
                   help="decode at batch 4 too (at --batch4-contexts)")  # fmt: skip
    p.add_argument("--batch4-contexts", nargs="+", default=["128"])
    p.add_argument("--runtimes", nargs="+", default=None,
                   help=f"default: {' '.join(DEFAULT_RUNTIMES)} (+ registered ones)")  # fmt: skip
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--warmup-tokens", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3, help="timed prefills per length")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bandwidth-mib", type=int, default=512, help="MiB per copied array")
    p.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--tag", default="", help="file name suffix: llm_<date>_<tag>")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring); 1 when an installed runtime failed."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse_args(argv)
    settings = Settings(
        threads=args.threads,
        prefill=_ints(args.prefill),
        contexts=_ints(args.contexts),
        batch4_contexts=_ints(args.batch4_contexts) if args.batch4 else (),
        decode_tokens=args.decode_tokens,
        warmup_tokens=args.warmup_tokens,
        repeats=args.repeats,
        seed=args.seed,
    )
    report = run(
        args.models,
        args.runtimes or list(DEFAULT_RUNTIMES),
        settings,
        work_dir=args.work_dir,
        out_dir=args.out,
        rounds=args.rounds,
        tag=args.tag,
        bandwidth_mib=args.bandwidth_mib,
    )
    print(render_markdown(report))
    failed = [
        r["runtime"] + " " + r["variant"]
        for e in report["models"].values()
        for r in e["results"]
        if r["error"] and not r["error"].startswith("unavailable")
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
