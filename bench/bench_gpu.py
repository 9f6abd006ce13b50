"""GPU benchmark: TuneHub-tuned CUDA code against torch (cuBLAS, cuDNN, inductor) on one GPU.

    python -m bench.bench_gpu [--gemm fp32:2048 fp32:4096 fp16:2048 fp16:4096] [--gemm-trials 64]
        [--networks resnet18 bert] [--net-trials 48] [--baseline-space fp16:4096]
        [--baseline-trials 32] [--out bench/results] [--deadline-secs 540]

GEMM (``C = A @ B``, square, row-major, output in the input dtype; fp16 accumulates in fp32 like
cuBLAS): each workload is tuned through TuneHub's tuner (its CUDA design space and GPU measure
settings, records in a SQL database), the best schedule is compiled, checked against a float64
product, and timed against ``torch.matmul`` on the same inputs, both with CUDA events
(median of repeats). ``--baseline-space`` tunes the same workloads with MetaSchedule's default
CUDA space instead, to compare valid-candidate ratios.

Networks (``examples/networks.py``, batch 1, float32): the ``.pt2`` export goes through the
product path (``prepare_model`` → ``tune_model``: tune, compile, verify against torch on the GPU,
publish) with ``--net-trials`` trials (the plan gives the heaviest tasks 4 each, the others keep
DLight's default schedules); compared with torch eager and
``torch.compile`` on the GPU, TF32 off everywhere (TVM computes in float32), and with TVM's untuned
build (DLight default GPU schedules).

Every row is written as soon as it is done: ``<out>/gpu_<date>.md`` (report) and
``gpu_<date>.json`` (rows, with the error texts of failed candidates). Items that would start
after ``--deadline-secs`` are skipped and marked so.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import platform
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
START = time.monotonic()


# -- timing ------------------------------------------------------------------------------------
def cuda_median_ms(call, *, min_ms: float = 50.0, repeat: int = 15, warmup: int = 3) -> float:
    """Median per-call time in ms of ``call`` (GPU work on the default stream), CUDA events.

    Each repeat runs ``call`` enough times to last about ``min_ms``."""
    import torch

    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    number = max(1, int(min_ms / max(start.elapsed_time(end), 1e-3)))
    samples = []
    for _ in range(repeat):
        start.record()
        for _ in range(number):
            call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / number)
    return statistics.median(samples)


def choose_cuda_compiler(target) -> str:
    """Build one small kernel with TVM's default CUDA compiler (NVRTC through ``cuda.bindings``);
    if that fails, switch to ``nvcc`` for this process and the builder workers it starts.
    Returns the mode used."""
    import tvm
    from tvm import te
    from tvm.s_tir import dlight as dl

    x = te.placeholder((1024,), "float32", name="x")
    y = te.compute((1024,), lambda i: x[i] * 2.0, name="y")
    mod = tvm.IRModule({"main": te.create_prim_func([x, y])})
    for mode in (os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc"), "nvcc"):
        os.environ["TVM_CUDA_COMPILE_MODE"] = mode
        try:
            with target.tvm_target():
                scheduled = dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)
            tvm.compile(scheduled, target=target.tvm_target())
            return mode
        except Exception as err:  # noqa: BLE001 - reported, then the next compiler is tried
            print(f"CUDA compile with {mode} failed: {error_line(str(err))}", flush=True)
    raise RuntimeError("neither NVRTC nor nvcc can build CUDA code here")


# -- measuring the search ----------------------------------------------------------------------
def error_line(message: str) -> str:
    """The informative line of a TVM builder/runner error text."""
    text = str(message).replace("\x00", "")
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for line in reversed(lines):
        if not line.startswith("File ") and not line.startswith("^"):
            return line[:240]
    return lines[-1][:240] if lines else "?"


def make_trial_stats():
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class TrialStats(ms.measure_callback.PyMeasureCallback):
        """Counts measured candidates, valid ones, and the error line of each failure."""

        def __init__(self) -> None:
            super().__init__()
            self.trials = 0
            self.valid = 0
            self.errors: collections.Counter[str] = collections.Counter()
            self.samples: dict[str, str] = {}
            self.best_secs: float | None = None

        def apply(self, task_scheduler, task_id, candidates, builder_results, runner_results):
            try:
                for built, ran in zip(builder_results, runner_results, strict=False):
                    self.trials += 1
                    message = built.error_msg or (ran.error_msg if ran is not None else None)
                    if message:
                        stage = "build" if built.error_msg else "run"
                        key = f"{stage}: {error_line(message)}"
                        self.errors[key] += 1
                        self.samples.setdefault(key, str(message).replace("\x00", "")[-2500:])
                    else:
                        self.valid += 1
                        secs = sum(float(x) for x in ran.run_secs) / len(ran.run_secs)
                        self.best_secs = (
                            secs if self.best_secs is None else min(self.best_secs, secs)
                        )
            except Exception:  # noqa: BLE001 - never abort tuning
                traceback.print_exc()

        def summary(self) -> dict[str, Any]:
            return {
                "trials": self.trials,
                "valid": self.valid,
                "valid_ratio": self.valid / self.trials if self.trials else None,
                "errors": dict(self.errors.most_common(8)),
                "error_samples": self.samples,
                "search_best_ms": None if self.best_secs is None else self.best_secs * 1e3,
            }

    return TrialStats()


class ValidCounter:
    """Progress listener for ``tune_model``: trials and valid measurements over all batches."""

    def __init__(self) -> None:
        self.trials = 0
        self.valid = 0

    def on_batch(self, update) -> None:
        self.trials += update.batch_trials
        self.valid += update.batch_valid


def gpu_search_config(population: int):
    from tuner.engine.search import SearchConfig

    return SearchConfig(
        population_size=population,
        init_min_unmeasured=min(50, population // 4),
        genetic_num_iters=2,
    )


def tune_on_gpu(storage, prepared, *, trials: int, output_dir: Path, filename: str):
    """``tune_model`` as the GPU benchmarks run it (``bench_gpu_peers``, ``bench_gpu_models``):
    :func:`gpu_search_config` with a population of 64, seed 0, the cold cost model (xgboost is
    not on the GPU machine), ``output_dir`` replaced. Returns the ``TuneSummary``."""
    from tuner.jobs.job import tune_model

    return tune_model(
        storage,
        prepared,
        trials=trials,
        output_dir=output_dir,
        filename=filename,
        search=gpu_search_config(64),
        seed=0,
        force=True,
        cost_model="cold",
    )


# -- GEMM --------------------------------------------------------------------------------------
def gemm_module(n: int, dtype: str):
    """``C = A @ B`` for square ``n``: float32 accumulation, output in ``dtype``."""
    import tvm
    from tvm import te

    acc = "float32"
    a = te.placeholder((n, n), dtype, name="A")
    b = te.placeholder((n, n), dtype, name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute(
        (n, n),
        lambda i, j: te.sum(a[i, k].astype(acc) * b[k, j].astype(acc), axis=k),
        name="matmul",  # the name a GEMM anchor has after LegalizeOps (compiler.peers)
    )
    out = c if dtype == acc else te.compute((n, n), lambda i, j: c[i, j].astype(dtype), name="D")
    return tvm.IRModule({"main": te.create_prim_func([a, b, out])})


def bench_gemm(spec: str, trials: int, target, work: Path, population: int, space: Any = None):
    import torch
    import tvm
    from tvm.s_tir import meta_schedule as ms

    import db
    from db.metaschedule_database import MetaScheduleDatabase, RecordErrorsCallback
    from tuner.engine.search import default_cost_model, reset_metaschedule_logging, run_search
    from tuner.measuring.builder_runner import MeasureConfig
    from tuner.task_scheduler.default_schedules import default_schedule

    kind, size = spec.split(":")
    n = int(size)
    dtype = {"fp32": "float32", "fp16": "float16"}[kind]
    mod = gemm_module(n, dtype)
    tvm_target = target.tvm_target()
    label = "MetaSchedule default space" if space else "TuneHub space"
    row: dict[str, Any] = {"gemm": spec, "space": label, "trials_budget": trials}
    db_file = work / f"gemm-{kind}-{n}-{'default' if space else 'tunehub'}.db"
    storage = db.open_storage(f"sqlite:///{db_file}", upgrade=True)
    database = MetaScheduleDatabase(storage, target)
    stats = make_trial_stats()
    task = ms.ExtractedTask(
        task_name=f"gemm_{kind}_{n}", mod=mod, target=tvm_target, dispatched=[mod], weight=1
    )
    reset_metaschedule_logging()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tunehub-gemm-") as work_dir:
        run_search(
            [task],
            database=database,
            target_kind="cuda",
            trials=trials,
            batch_size=min(32, max(8, trials // 4)),
            work_dir=work_dir,
            measure=MeasureConfig.for_target("cuda"),
            search=gpu_search_config(population),
            callbacks=[RecordErrorsCallback(database), stats],
            space=space,
            seed=0,
        )
    row["tune_secs"] = time.perf_counter() - started
    row.update(stats.summary())
    row["cost_model"] = default_cost_model()
    flops = 2.0 * n**3
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch_dtype, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=torch_dtype, generator=gen)
    ref = a.double() @ b.double()

    def rel_err(out) -> float:
        return float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))

    torch.backends.cuda.matmul.allow_tf32 = False
    out_torch = a @ b
    row["torch_ms"] = cuda_median_ms(lambda: torch.matmul(a, b, out=out_torch))
    row["torch_tflops"] = flops / row["torch_ms"] / 1e9
    row["torch_rel_err"] = rel_err(out_torch)
    default_sch = default_schedule(mod, tvm_target)
    row["default_ms"] = None
    if default_sch is not None:
        default_lib = tvm.compile(default_sch.mod, target=tvm_target)
        row["default_ms"] = _time_tvm_gemm(default_lib, a, b, dtype, rel_err, row, "default")
    sch = ms.tir_integration.compile_tir(database, mod, tvm_target)
    storage.close()
    if sch is None:
        row["error"] = "no valid schedule found"
        return row
    row["chosen"] = (
        "default (DLight)"
        if default_sch is not None and str(sch.trace) == str(default_sch.trace)
        else "search"
    )
    lib = tvm.compile(sch.mod, target=tvm_target)
    row["tunehub_ms"] = _time_tvm_gemm(lib, a, b, dtype, rel_err, row, "tunehub")
    row["tunehub_tflops"] = flops / row["tunehub_ms"] / 1e9
    row["vs_cublas"] = row["torch_ms"] / row["tunehub_ms"]
    return row


def _time_tvm_gemm(lib, a, b, dtype: str, rel_err, row: dict, label: str) -> float:
    """Run a compiled GEMM on ``a``, ``b``: store its relative error in ``row``, return its
    median time in ms (CUDA events, as for torch)."""
    import numpy as np
    import torch
    import tvm

    dev = tvm.cuda(0)
    n = a.shape[0]
    a_t = tvm.runtime.tensor(a.cpu().numpy(), dev)
    b_t = tvm.runtime.tensor(b.cpu().numpy(), dev)
    c_t = tvm.runtime.tensor(np.full((n, n), np.nan, dtype=dtype), dev)
    func = lib.mod["main"] if hasattr(lib, "mod") else lib["main"]
    func(a_t, b_t, c_t)
    row[f"{label}_rel_err"] = rel_err(torch.from_numpy(c_t.numpy()).cuda())
    return cuda_median_ms(lambda: func(a_t, b_t, c_t))


# -- networks ----------------------------------------------------------------------------------
def torch_network_ms(name: str, inputs) -> dict[str, Any]:
    import torch

    from examples.networks import EXAMPLES

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = EXAMPLES[name].build().cuda().eval()
    tensors = [torch.from_numpy(x).cuda() for x in inputs]
    out: dict[str, Any] = {}
    with torch.no_grad():
        out["torch_eager_ms"] = cuda_median_ms(lambda: model(*tensors))
        try:
            started = time.perf_counter()
            compiled = torch.compile(model)
            compiled(*tensors)
            out["torch_compile_secs"] = time.perf_counter() - started
            out["torch_compile_ms"] = cuda_median_ms(lambda: compiled(*tensors))
        except Exception as err:  # noqa: BLE001 - reported in the table
            out["torch_compile_ms"] = f"failed: {type(err).__name__}: {err}"[:200]
    return out


def bench_network(name: str, trials: int, target, work: Path, storage, population: int):
    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs, verify
    from compiler.errors import ModelError
    from compiler.prepare import prepare_model
    from examples.export import export_onnx, export_pt2
    from tuner.engine.search import default_cost_model
    from tuner.jobs.job import tune_model

    path = export_pt2(name, work / f"{name}.pt2")
    try:
        prepared = prepare_model(path, target)
        refused = None
    except ModelError as err:  # a refused .pt2 (seen before the zip64 end-record fix): use ONNX
        refused = f".pt2 refused ({err}); ONNX used"
        path = export_onnx(name, work / f"{name}.onnx")
        prepared = prepare_model(path, target)
    inputs = random_inputs(prepared.model.inputs)
    tunable = [t for t in prepared.partition.tasks if t.tunable]
    row: dict[str, Any] = {
        "network": name,
        "tasks": len(prepared.partition.tasks),
        "tunable_tasks": len(tunable),
        "trial_budget": trials,
        "format": prepared.model.format,
        "format_note": refused,
    }
    row.update(torch_network_ms(name, inputs))
    untuned = LoadedLibrary.from_executable(build(prepared.mod, target), "cuda")
    row["untuned_verified"] = verify(prepared.model, untuned.run, device="cuda").passed
    row["untuned_ms"] = untuned.time(inputs).median_secs * 1e3
    counter = ValidCounter()
    started = time.perf_counter()
    summary = tune_model(
        storage,
        prepared,
        trials=trials,
        output_dir=work / f"{name}-tuned",
        filename=path.name,
        search=gpu_search_config(population),
        listeners=[counter],
        seed=0,
        force=True,
    )
    row["tune_secs"] = time.perf_counter() - started
    row["tasks_tuned"] = sum(1 for t in summary.tasks if t.action == "tune")
    row["trials"] = counter.trials
    row["valid"] = counter.valid
    row["valid_ratio"] = counter.valid / counter.trials if counter.trials else None
    row["cost_model"] = default_cost_model()
    row["tuned_ms"] = summary.measured.median_secs * 1e3 if summary.measured else None
    row["verification"] = summary.verification.get("message")
    row["verified"] = summary.verification.get("passed")
    errors: collections.Counter[str] = collections.Counter()
    for rec in storage.iter_records(target_id=storage.ensure_target(target).id):
        if not rec.is_valid and rec.job_id == summary.job_id:
            errors[error_line(rec.error_text or "no error text")] += 1
    row["errors"] = dict(errors.most_common(8))
    return row


# -- report ------------------------------------------------------------------------------------
def machine_info(target) -> dict[str, Any]:
    import torch
    import tvm

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": f"{props.major}.{props.minor}",
        "multiprocessors": props.multi_processor_count,
        "gpu_memory_gib": round(props.total_memory / 2**30),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "tvm": tvm.__version__,
        "cpu_cores": os.cpu_count(),
        "host": platform.platform(),
        "tunehub_target": target.describe(),
        "target_key": target.key,
    }


def _ms(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else ("-" if value is None else str(value))


def _ratio(value: Any) -> str:
    return f"{value:.0%}" if isinstance(value, float) else "-"


def write_report(out: Path, info: dict, args, gemm_rows, net_rows, skipped) -> Path:
    from tuner.measuring.builder_runner import MeasureConfig

    today = dt.date.today().isoformat()
    measure = MeasureConfig.for_target("cuda")
    lines = [
        f"# GPU benchmark ({today})",
        "",
        f"Machine: {info['gpu']} (compute {info['compute_capability']}, "
        f"{info['multiprocessors']} SMs, {info['gpu_memory_gib']} GiB), {info['cpu_cores']} CPU "
        f"cores; torch {info['torch']} (CUDA {info['cuda_runtime']}), TVM {info['tvm']}.",
        f"TuneHub target: {info['tunehub_target']} (key {info['target_key']}).",
        f"CUDA compiler: {info.get('cuda_compiler')}. Measurement: LocalRunner "
        f"number={measure.number}, repeat={measure.repeat}, min_repeat_ms={measure.min_repeat_ms}; "
        f"builder timeout {measure.build_timeout_sec:.0f} s.",
        f"Search: evolutionary, population {args.population}, cost model "
        f"`{(gemm_rows or net_rows or [{}])[0].get('cost_model', '?')}` (xgboost is not installed "
        "on the GPU machine; below 100 measured candidates per task MetaSchedule's XGBoost model "
        "ranks randomly as well).",
        "Command: `python -m bench.bench_gpu " + " ".join(os.sys.argv[1:]) + "`",
        "",
        "## GEMM (C = A @ B, square; fp16: fp32 accumulation, fp16 output, as cuBLAS)",
        "",
        "Latency in ms, median of CUDA-event timed repeats; `vs cuBLAS` = torch time / TuneHub "
        "time (1.0 = as fast); rel. error = ‖out − ref‖/‖ref‖ against a float64 product.",
        "",
        "`DLight ms` = TVM's default GPU schedule (what an untuned build uses; TuneHub measures it "
        "as one record per task, so tuning never makes a task slower); `search best` = best "
        "candidate of the search alone (runner time); `chosen` = which one the tuned build uses.",
        "",
        "| GEMM | space | trials | valid | TuneHub ms | TFLOP/s | torch ms | TFLOP/s | vs cuBLAS "
        "| DLight ms | search best ms | chosen | rel. err TuneHub / torch | tuning s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in gemm_rows:
        if "error" in r and "tunehub_ms" not in r:
            lines.append(
                f"| {r['gemm']} | {r.get('space')} | {r.get('trials', '-')} | "
                f"{_ratio(r.get('valid_ratio'))} | failed: {r['error'][:120]} ||||||||||"
            )
            continue
        lines.append(
            f"| {r['gemm']} | {r['space']} | {r['trials']} | {r['valid']} "
            f"({_ratio(r['valid_ratio'])}) | {_ms(r['tunehub_ms'])} | {r['tunehub_tflops']:.0f} | "
            f"{_ms(r['torch_ms'])} | {r['torch_tflops']:.0f} | {r['vs_cublas']:.2f}x | "
            f"{_ms(r.get('default_ms'))} | {_ms(r.get('search_best_ms'))} | {r.get('chosen')} | "
            f"{r['tunehub_rel_err']:.1e} / {r['torch_rel_err']:.1e} | {r['tune_secs']:.0f} |"
        )
    lines += ["", "Failed candidates by error (GEMM):", ""]
    for r in gemm_rows:
        for message, count in (r.get("errors") or {}).items():
            lines.append(f"- {r['gemm']} ({r.get('space')}): {count} × `{message}`")
    lines += [
        "",
        "## Networks (batch 1, float32, TF32 off in torch)",
        "",
        "Latency in ms. `untuned` = TVM with DLight default GPU schedules; `TuneHub` = the "
        "published, verified artifact after the trials shown (a few for the heaviest tasks only: "
        "device time is scarce), plus one measurement of the default schedule per tuned task.",
        "",
        "| network | tasks (tuned) | trials (valid) | torch eager | torch.compile | TVM untuned | "
        "TuneHub | TuneHub / eager | verified | tuning s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in net_rows:
        if "error" in r and "tuned_ms" not in r:
            lines.append(f"| {r['network']} | failed: {r['error'][:160]} |||||||||")
            continue
        ratio = (
            f"{r['tuned_ms'] / r['torch_eager_ms']:.2f}x"
            if isinstance(r.get("tuned_ms"), float)
            else "-"
        )
        lines.append(
            f"| {r['network']} | {r['tasks']} ({r.get('tasks_tuned')}) | {r['trials']} "
            f"({r['valid']}, {_ratio(r['valid_ratio'])}) | {_ms(r['torch_eager_ms'])} | "
            f"{_ms(r['torch_compile_ms'])} | {_ms(r['untuned_ms'])} | {_ms(r['tuned_ms'])} | "
            f"{ratio} | {r['verified']} ({r['verification']}) | {r['tune_secs']:.0f} |"
        )
    for r in net_rows:
        for message, count in (r.get("errors") or {}).items():
            lines.append(f"- {r['network']} failed candidates: {count} × `{message}`")
    if skipped:
        lines += ["", "Skipped (deadline): " + ", ".join(skipped)]
    path = out / f"gpu_{today}.md"
    path.write_text("\n".join(lines) + "\n")
    (out / f"gpu_{today}.json").write_text(
        json.dumps(
            {"machine": info, "gemm": gemm_rows, "networks": net_rows, "skipped": skipped},
            indent=1,
            default=str,
        )
        + "\n"
    )
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--gemm", nargs="*", default=["fp16:4096", "fp16:2048", "fp32:2048", "fp32:4096"]
    )
    parser.add_argument("--gemm-trials", type=int, default=64)
    parser.add_argument(
        "--baseline-space",
        nargs="*",
        default=[],
        help="GEMMs also tuned in MetaSchedule's default CUDA space",
    )
    parser.add_argument("--baseline-trials", type=int, default=32)
    parser.add_argument("--networks", nargs="*", default=["resnet18", "bert"])
    parser.add_argument(
        "--net-trials",
        type=int,
        default=48,
        help="trial budget per network (4 per task: the heaviest tasks first)",
    )
    parser.add_argument("--population", type=int, default=256)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--deadline-secs", type=float, default=None)
    args = parser.parse_args()

    import db
    from compiler.lowering.intrinsics import load_tensor_intrinsics
    from compiler.target import resolve_target

    target = resolve_target("cuda")
    load_tensor_intrinsics("cuda")
    info = machine_info(target)
    info["cuda_compiler"] = choose_cuda_compiler(target)
    print(json.dumps(info), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    gemm_rows: list[dict] = []
    net_rows: list[dict] = []
    skipped: list[str] = []

    def in_time(item: str) -> bool:
        if args.deadline_secs is not None and time.monotonic() - START > args.deadline_secs:
            skipped.append(item)
            return False
        return True

    def run(rows: list[dict], item: str, key: str, fn) -> None:
        print(f"[{time.monotonic() - START:6.0f} s] {item}", flush=True)
        try:
            row = fn()
        except Exception as err:  # noqa: BLE001 - one failed item must not lose the others
            traceback.print_exc()
            row = {key: item, "error": f"{type(err).__name__}: {err}"}
        rows.append(row)
        print(
            json.dumps({k: v for k, v in row.items() if k != "error_samples"}, default=str),
            flush=True,
        )
        write_report(args.out, info, args, gemm_rows, net_rows, skipped)

    with tempfile.TemporaryDirectory(prefix="tunehub-bench-gpu-") as tmp:
        work = Path(tmp)
        for spec in args.baseline_space:
            if in_time(f"{spec} (default space)"):
                from tvm.s_tir import meta_schedule as ms

                default = ms.space_generator.PostOrderApply()
                run(
                    gemm_rows,
                    spec,
                    "gemm",
                    lambda s=spec, d=default: bench_gemm(
                        s, args.baseline_trials, target, work, args.population, space=d
                    ),
                )
        for spec in args.gemm:
            if in_time(spec):
                run(
                    gemm_rows,
                    spec,
                    "gemm",
                    lambda s=spec: bench_gemm(s, args.gemm_trials, target, work, args.population),
                )
        storage = db.open_storage(f"sqlite:///{work / 'networks.db'}", upgrade=True)
        for name in args.networks:
            if in_time(name):
                run(
                    net_rows,
                    name,
                    "network",
                    lambda n=name: bench_network(
                        n, args.net_trials, target, work, storage, args.population
                    ),
                )
        storage.close()
    print(write_report(args.out, info, args, gemm_rows, net_rows, skipped).read_text(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
