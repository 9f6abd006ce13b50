"""Decoder latency (issue 20): prefill and per-token decode, side by side in one run.

    python -m bench.bench_decoder [--decoder llama_32m] [--prefill 16 128 512] [--past 128]
        [--step 256]
        [--threads 2] [--rounds 5] [--tune N [--tune-programs prefill decode]] [--one-job N]
        [--db URL] [--cost-model auto|random|...]
        [--no-compile] [--out DIR]

The decoder is ``examples.kv_decoder``'s (``transformers``' Llama modelling code, seeded random
weights; the default ``llama_32m``: hidden 512, 8 layers, GQA 8/4 heads, vocabulary 8192,
32 M parameters). Each *case* is one static program: prefill at each ``--prefill`` length S
(``[1, S]`` ids -> last-position logits + the K/V caches of every layer) and decode at past
length ``--past`` P (one token + the caches of P positions -> logits + the caches of P + 1)
and, with ``--step C``, one decode step over a cache of capacity C (``examples.kv_decoder.Step``:
the token at position C / 2, its key and value written at that position; the program a
generation calls at every step).
Per case, in one process:

- **torch eager**: the ``nn.Module`` (``torch.set_num_threads(--threads)``), ``no_grad``;
- **torch.compile**: the same module through ``torch.compile`` (inductor, static shapes); its
  error is reported in the table when it does not compile here;
- **ONNX Runtime**: the case's ONNX export, ``intra_op_num_threads = --threads``;
- **TuneHub zero-trial**: the ``.pt2`` export prepared like an upload and built as ``tunehub
  compile`` without a database does (``compiler.build.builder.build_zero_trial``: OpenBLAS peers for
  the GEMM tasks, TVM's default schedules for the rest), exported, loaded from disk, verified
  against torch (``compiler.build.verify.verify``, plus once on ids over the whole vocabulary);
- **TuneHub tuned** (``--tune N``): ``tuner.jobs.job.tune_model`` with N trials into a SQLite
  database (``--db``, default a temporary one; the final build re-measures each task's top
  records against its peer and default schedule, as every job does); the job's verified
  ``model.so``, loaded from disk and verified here again;
- **TuneHub one job** (``--one-job N``): every case as one program of one ``.pt2`` archive
  (``examples.kv_decoder.export_programs``: ``prefill_16``, ``prefill_128``, ...,
  ``decode_128``), tuned as one job of N trials in all (a task several programs have is one
  task) before the cases are timed; one verified library whose function for each case's inputs
  is picked by their shapes, timed and verified per case like the others.

Timing: ``--rounds`` rounds, each variant once per round in a new random order (seeded) with a
pause of 0.2 s before each variant; one round of a variant runs it for at least 0.2 s and takes
the mean per call; the table gives the median of rounds, the ratio to ONNX Runtime beside it.
``TVM_NUM_THREADS``, torch's and ONNX Runtime's intra-op threads are all ``--threads``.
Writes ``decoder_<date>.json`` and ``.md`` into ``--out`` (default ``bench/results``) after every
case (machine from ``/proc/cpuinfo``, load averages before and after each case, UTC times).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.bench_peers import _timer

REPO = Path(__file__).resolve().parents[1]
VARIANTS = (
    "torch eager",
    "torch.compile",
    "ONNX Runtime",
    "TuneHub zero-trial",
    "TuneHub tuned",
    "TuneHub one job",
)


def interleaved(
    timers: dict[str, Callable[[], float]], rounds: int, seed: int = 0, pause: float = 0.2
) -> dict[str, dict[str, float]]:
    """``rounds`` rounds of every timer in a random order per round (after one warm-up round),
    a pause of ``pause`` seconds before each (other frameworks' worker threads spin for a
    while after a call, and on 2 cores they would slow the next timer); per timer the median,
    min and max of its rounds (seconds)."""
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in timers}
    for timer in timers.values():
        timer()
    for _ in range(rounds):
        order = list(timers)
        rng.shuffle(order)
        for name in order:
            time.sleep(pause)
            samples[name].append(timers[name]())
    return {
        name: {"median": statistics.median(v), "min": min(v), "max": max(v)}
        for name, v in samples.items()
    }


def machine() -> dict[str, Any]:
    """CPU model (``lscpu``'s model name, from ``/proc/cpuinfo``), LLVM CPU, versions."""
    import onnxruntime
    import torch
    import tvm

    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "cpu_model": model,
        "llvm_cpu": str(tvm.target.codegen.llvm_get_system_cpu()),
        "logical_cpus": os.cpu_count(),
        "tvm": tvm.__version__,
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _torch_timer(module: Any, inputs: tuple, threads: int) -> Callable[[], float]:
    import torch

    torch.set_num_threads(threads)

    def call() -> None:
        with torch.no_grad():
            module(*inputs)

    return _timer(call)


def _compiled_timer(module: Any, inputs: tuple, threads: int) -> tuple[Callable[[], float], float]:
    """torch.compile of ``module``, compiled on ``inputs`` (returns the timer and compile secs);
    raises what torch raises."""
    import torch

    torch.set_num_threads(threads)
    compiled = torch.compile(module, dynamic=False)
    started = time.perf_counter()
    with torch.no_grad():
        compiled(*inputs)
    secs = time.perf_counter() - started

    def call() -> None:
        with torch.no_grad():
            compiled(*inputs)

    return _timer(call), secs


def _ort_timer(path: Path, inputs: list[np.ndarray], threads: int) -> Callable[[], float]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    return _timer(lambda: session.run(None, feed))


def _library_timer(
    path: Path, prepared: Any, inputs: list[np.ndarray]
) -> tuple[Callable[[], float], dict[str, Any]]:
    """Load the library at ``path``, verify it (seeded inputs, then ``inputs``) against the
    model's reference, and return its timer (the VM call on inputs already on the device)."""
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import compare, reference_outputs, verify

    library = LoadedLibrary(path, "cpu")
    check = verify(prepared.model, library.run)
    again = compare(library.run(inputs), reference_outputs(prepared.model, inputs), check.reference)
    result = {
        "passed": check.passed and again.passed,
        "reference": check.reference,
        "max_abs_error": max(check.max_abs_error, again.max_abs_error),
        "message": check.message if not check.passed else again.message,
    }
    function = library.function_for(inputs)
    library.vm.set_input(function, *library._to_device(inputs))  # noqa: SLF001 - timing the call
    return _timer(lambda: library.vm.invoke_stateful(function)), result


def _tune(
    prepared: Any, trials: int, output_dir: Path, filename: str, args: argparse.Namespace
) -> tuple[dict[str, Any], Path]:
    """``tuner.jobs.job.tune_model`` of ``prepared`` with ``trials`` into ``args.db``: the job's
    summary for the results (without its per-task rows) and its verified library's path.
    Raises what the job raises."""
    from compiler.build.artifact_layout import LIBRARY_NAME
    from db.storage import open_storage
    from tuner.jobs.job import tune_model

    storage = open_storage(args.db, upgrade=True)
    try:
        summary = tune_model(
            storage,
            prepared,
            trials=trials,
            output_dir=output_dir,
            filename=filename,
            cost_model=args.cost_model,
            force=True,
        )
    finally:
        storage.close()
    tuning = {
        **{
            k: v
            for k, v in summary.to_json().items()
            if k not in ("tasks", "verification", "artifact_dir")
        },
        "tasks by action": dict(Counter(t.action for t in summary.tasks)),
    }
    return tuning, Path(summary.artifact_dir) / LIBRARY_NAME


def _case_name(program: str, length: int) -> str:
    return f"{program}_{length}"


def tune_one_job(
    cases: list[tuple[str, int]], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """Every case as a program of one archive, tuned as one job of ``args.one_job`` trials; the
    job's summary and its library's path (``"library"``), or its error (``"error"``)."""
    from compiler.frontends.model_spec import ModelLimits
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.kv_decoder import export_programs

    print(
        f"[{_now()}] one job: export {len(cases)} programs, tune {args.one_job} trials", flush=True
    )
    info: dict[str, Any] = {"load before": _load(), "started": _now(), "seconds": {}}
    started = time.perf_counter()
    archive = export_programs(
        args.decoder, work / "programs.pt2", {_case_name(p, n): (p, n) for p, n in cases}
    )
    info["seconds"]["export"] = time.perf_counter() - started
    started = time.perf_counter()
    # torch's archive stores every program's weights apart (no sharing across programs): n
    # programs of a 128 MB decoder are n x 128 MB, over the default upload limit of 512 MB.
    limits = ModelLimits(max_bytes=max(ModelLimits().max_bytes, 2 * archive.stat().st_size))
    info["archive MB"] = archive.stat().st_size / 1e6
    prepared = prepare_model(
        archive, cpu_target(args.threads), allow_external_data=False, limits=limits
    )
    info["seconds"]["prepare"] = time.perf_counter() - started
    info["programs"] = list(prepared.model.programs)
    info["tasks"] = len(prepared.partition.tasks)
    started = time.perf_counter()
    try:
        info["tuning"], library = _tune(
            prepared, args.one_job, work / "one-job", archive.name, args
        )
        info["seconds"]["tune"] = time.perf_counter() - started
        info["library"] = str(library)
    except Exception as err:  # noqa: BLE001 - reported in the table
        info["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        traceback.print_exc()
    info["load after"], info["finished"] = _load(), _now()
    return info


def bench_case(
    program: str,
    length: int,
    args: argparse.Namespace,
    work: Path,
    one_job: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One program at one length: every variant built, verified and timed side by side."""
    from compiler.build.builder import build_zero_trial, export_library
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from examples.kv_decoder import example_inputs, export_both, program_module

    label = f"{program} {dict(prefill='S', decode='P', step='C')[program]}={length}"
    print(f"[{_now()}] {label}: export", flush=True)
    row: dict[str, Any] = {
        "case": label,
        "program": program,
        "length": length,
        "load before": _load(),
        "started": _now(),
        "checks": {},
        "errors": {},
        "seconds": {},
    }
    module = program_module(args.decoder, program)
    tensors = example_inputs(args.decoder, program, length, seed=1)
    arrays = [t.numpy() for t in tensors]
    started = time.perf_counter()
    files = export_both(args.decoder, program, length, work)
    pt2, onnx_path = files["pt2"], files["onnx"]
    row["seconds"]["export"] = time.perf_counter() - started

    timers: dict[str, Callable[[], float]] = {
        "torch eager": _torch_timer(module, tensors, args.threads),
        "ONNX Runtime": _ort_timer(onnx_path, arrays, args.threads),
    }
    if not args.no_compile:
        try:
            timers["torch.compile"], row["seconds"]["torch.compile"] = _compiled_timer(
                module, tensors, args.threads
            )
        except Exception as err:  # noqa: BLE001 - reported in the table
            row["errors"]["torch.compile"] = f"{type(err).__name__}: {str(err)[:300]}"

    print(f"[{_now()}] {label}: TuneHub prepare + zero-trial build", flush=True)
    target = cpu_target(args.threads)
    started = time.perf_counter()
    prepared = prepare_model(pt2, target, allow_external_data=False)
    row["seconds"]["prepare"] = time.perf_counter() - started
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    row["tasks"] = len(tasks)
    row["gemm tasks"] = [
        {"name": t.name, "weight": t.weight, "shapes": [list(s[1]) for s in t.shapes]}
        for t in prepared.partition.tasks
        if "matmul" in t.name
    ]
    started = time.perf_counter()
    executable, peers = build_zero_trial(prepared.mod, target, tasks)
    path = export_library(executable, work / f"{program}{length}-zero.so", link_peers=bool(peers))
    row["seconds"]["zero-trial build"] = time.perf_counter() - started
    row["zero-trial peers"] = len(peers)
    timers["TuneHub zero-trial"], row["checks"]["TuneHub zero-trial"] = _library_timer(
        path, prepared, arrays
    )

    if args.tune and program in args.tune_programs:
        print(f"[{_now()}] {label}: tune {args.tune} trials", flush=True)
        started = time.perf_counter()
        try:
            row["tuning"], library = _tune(
                prepared, args.tune, work / f"{program}{length}-job", pt2.name, args
            )
            row["seconds"]["tune"] = time.perf_counter() - started
            timers["TuneHub tuned"], row["checks"]["TuneHub tuned"] = _library_timer(
                library, prepared, arrays
            )
        except Exception as err:  # noqa: BLE001 - reported in the table
            row["errors"]["TuneHub tuned"] = f"{type(err).__name__}: {str(err)[:300]}"
            traceback.print_exc()

    if one_job is not None:
        if "library" in one_job:
            timers["TuneHub one job"], row["checks"]["TuneHub one job"] = _library_timer(
                Path(one_job["library"]), prepared, arrays
            )
        else:
            row["errors"]["TuneHub one job"] = one_job.get("error", "not built")

    print(f"[{_now()}] {label}: timing {list(timers)}", flush=True)
    stats = interleaved(timers, args.rounds)
    row["latency ms"] = {name: s["median"] * 1e3 for name, s in stats.items()}
    row["spread ms"] = {name: [s["min"] * 1e3, s["max"] * 1e3] for name, s in stats.items()}
    row["load after"] = _load()
    row["finished"] = _now()
    return row


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}" if value < 100 else f"{value:.1f}"


def render(run: dict[str, Any]) -> str:
    m = run["machine"]
    lines = [
        f"# Decoder prefill and decode latency, {run['date']}",
        "",
        f"Machine: {m['cpu_model']} (LLVM `{m['llvm_cpu']}`, {m['logical_cpus']} logical CPUs), "
        f"{run['threads']} threads for every framework (TVM_NUM_THREADS, torch.set_num_threads, "
        f"ORT intra_op_num_threads); TVM {m['tvm']}, torch {m['torch']}, ONNX Runtime "
        f"{m['onnxruntime']}. Started {run['started']}, load average {run['load at start']} "
        f"(1/5/15 min). Command: `python -m bench.bench_decoder {' '.join(run['argv'])}`.",
        "",
        f"Decoder: `{run['decoder']}` ({run['parameters'] / 1e6:.1f} M parameters, "
        f"{run['config']}), seeded random weights; `transformers`' Llama modelling code with the "
        "KV cache as explicit tensors (`examples/kv_decoder.py`). Prefill returns the last "
        "position's logits and the caches; decode takes one token and the caches of P "
        "positions; step takes one token, its position (C / 2) and a cache of capacity C "
        "(`Step`: one program for every step of a generation). Medians of "
        f"{run['rounds']} interleaved rounds, ms per call (per token for decode).",
        "",
    ]
    present = [
        v
        for v in VARIANTS
        if any(v in r.get("latency ms", {}) or v in r["errors"] for r in run["cases"])
    ]
    one = "TuneHub one job" in present
    lines += [
        "| case | "
        + " | ".join(present)
        + " | zero-trial / ORT | tuned / ORT |"
        + (" one job / ORT |" if one else "")
        + " load after |",
        "|---" * (len(present) + 4 + one) + "|",
    ]
    for r in run["cases"]:
        lat = r.get("latency ms", {})
        cells = [
            _ms(lat.get(v)) if v in lat else ("failed" if v in r["errors"] else "—")
            for v in present
        ]
        ort = lat.get("ONNX Runtime")

        def ratio(name: str, lat: dict = lat, ort: float | None = ort) -> str:
            return f"{lat[name] / ort:.2f}x" if name in lat and ort else "—"

        lines.append(
            f"| {r['case']} | " + " | ".join(cells) + f" | {ratio('TuneHub zero-trial')}"
            f" | {ratio('TuneHub tuned')} |"
            + (f" {ratio('TuneHub one job')} |" if one else "")
            + f" {r.get('load after')} |"
        )
    lines += [
        "",
        "Per case: TuneHub verification (max abs error against torch), tasks, build times; errors.",
        "",
    ]
    for r in run["cases"]:
        checks = ", ".join(
            f"{k}: {'passed' if v['passed'] else 'FAILED'} {v['max_abs_error']:.1e}"
            for k, v in r["checks"].items()
        )
        secs = ", ".join(f"{k} {v:.0f} s" for k, v in r["seconds"].items())
        gemv = sum(
            1
            for t in r.get("gemm tasks", [])
            if len(t["shapes"][-1]) == 2 and t["shapes"][-1][0] == 1
        )
        lines.append(
            f"- {r['case']}: {checks}; {r.get('tasks')} tasks "
            f"({len(r.get('gemm tasks', []))} matmul, {gemv} of them 2-D with M = 1), "
            f"{r.get('zero-trial peers')} on peers in the zero-trial build; {secs}"
            + (
                f"; tuned {r['tuning']['trials_this_run']} trials, tasks "
                f"{r['tuning']['tasks by action']}"
                if "tuning" in r
                else ""
            )
        )
        for name, error in r["errors"].items():
            lines.append(f"  - {name} failed: `{error}`")
    job = run.get("one job")
    if job:
        secs = ", ".join(f"{k} {v:.0f} s" for k, v in job["seconds"].items())
        tuning = job.get("tuning", {})
        lines += [
            "",
            f"One job: programs {', '.join(job.get('programs', []))} of one archive "
            f"({job.get('archive MB', 0):.0f} MB: torch stores each program's weights), "
            f"{job.get('tasks')} tasks, {tuning.get('trials_this_run', '—')} trials "
            f"in all; tasks {tuning.get('tasks by action', {})}; {secs}; load before "
            f"{job['load before']}, after {job['load after']}.",
        ]
        if "error" in job:
            lines.append(f"  - failed: `{job['error']}`")
    if run.get("load at end"):
        lines += ["", f"Finished {run['finished']}, load average {run['load at end']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decoder", default="llama_32m")
    parser.add_argument("--prefill", type=int, nargs="*", default=[16, 128, 512])
    parser.add_argument("--past", type=int, nargs="*", default=[128])
    parser.add_argument(
        "--step",
        type=int,
        nargs="*",
        default=[],
        help="cache capacities C of one-step decode cases",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tune", type=int, default=0, help="tune each case N trials")
    parser.add_argument(
        "--tune-programs",
        nargs="+",
        choices=("prefill", "decode", "step"),
        default=["prefill", "decode", "step"],
        help="which programs --tune tunes",
    )
    parser.add_argument(
        "--one-job",
        type=int,
        default=0,
        metavar="N",
        help="also tune every case as one program of one archive, one job of N trials in all",
    )
    parser.add_argument(
        "--db", help="SQLite/PostgreSQL URL for --tune and --one-job (default: temporary)"
    )
    parser.add_argument("--cost-model", default="auto")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--tag", default="", help="suffix of the result files' names")
    args = parser.parse_args(argv)
    os.environ["TVM_NUM_THREADS"] = str(args.threads)  # before TVM's thread pool starts

    import torch

    from examples.kv_decoder import build_causal_lm, get_kv_decoder

    torch.set_num_threads(args.threads)
    spec = get_kv_decoder(args.decoder)
    date = dt.date.today().isoformat()
    run: dict[str, Any] = {
        "date": date,
        "started": _now(),
        "load at start": _load(),
        "threads": args.threads,
        "rounds": args.rounds,
        "machine": machine(),
        "decoder": args.decoder,
        "config": ", ".join(f"{k} {v}" for k, v in spec.config.items()),
        "parameters": sum(p.numel() for p in build_causal_lm(spec).parameters()),
        "argv": argv if argv is not None else sys.argv[1:],
        "cases": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"decoder_{date}{args.tag}"

    def write() -> None:
        stem.with_suffix(".json").write_text(json.dumps(run, indent=1, default=str))
        stem.with_suffix(".md").write_text(render(run))

    cases = (
        [("decode", p) for p in args.past]
        + [("step", c) for c in args.step]
        + [("prefill", s) for s in args.prefill]
    )
    with tempfile.TemporaryDirectory(prefix="bench-decoder-") as tmp:
        if (args.tune or args.one_job) and not args.db:
            args.db = f"sqlite:///{tmp}/tuning.db"
        one_job = None
        if args.one_job:
            one_job = run["one job"] = tune_one_job(cases, args, Path(tmp))
            write()
        for program, length in cases:
            run["cases"].append(bench_case(program, length, args, Path(tmp), one_job))
            write()
            print(render(run), flush=True)
    run["finished"], run["load at end"] = _now(), _load()
    write()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
