"""Held-out models on the GPU at batch 1 and 16, fp32 and fp16: TuneHub against every torch mode.

    python -m bench.bench_gpu_models [--models resnet18 resnet50 distilbert vit_small]
        [--batches 1 16] [--dtypes fp32 fp16] [--trials 0]
        [--torch-modes eager default reduce-overhead max-autotune-no-cudagraphs]
        [--out bench/results] [--tag NAME] [--deadline-secs 540]

Each row (model, batch, dtype) is measured in one process, side by side: torch eager, and
``torch.compile`` in each of ``--torch-modes`` (``reduce-overhead`` replays CUDA graphs); TVM's
untuned build (DLight's default schedules) with and without CUDA graphs; TuneHub's product path
(``.pt2`` export of the same module in the same dtype → ``prepare_model`` → ``tune_model`` with
``--trials``: peers (cuBLAS/cuDNN) chosen against DLight by measurement, verified against torch on
the GPU in the same precision, published) with CUDA graphs (the default) and the same build without
them. TF32 is off everywhere (TVM computes fp32 in fp32). Times are CUDA-event medians for torch
and the VM's ``time_evaluator`` medians for TVM (inputs already on the GPU for both).

The models are :mod:`bench.heldout`'s (``transformers`` classes, random weights). Rows are written
as they finish: ``<out>/gpu_models_<date>[_<tag>].md`` and ``.json``; a row that would start after
``--deadline-secs`` is skipped and listed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any
from unittest import mock

START = time.monotonic()
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
TORCH_MODES = ("eager", "default", "reduce-overhead", "max-autotune-no-cudagraphs")


def torch_times(model, inputs, modes: list[str]) -> dict[str, Any]:
    """Median ms of ``model(*inputs)`` per torch mode (``eager`` or a ``torch.compile`` mode),
    and each compile's seconds; a failed mode gives its error text."""
    import torch

    from bench.bench_gpu import cuda_median_ms

    out: dict[str, Any] = {}
    with torch.no_grad():
        for mode in modes:
            try:
                if mode == "eager":
                    out["eager"] = cuda_median_ms(lambda: model(*inputs))
                    continue
                torch._dynamo.reset()  # noqa: SLF001 - each mode compiles afresh
                started = time.perf_counter()
                compiled = torch.compile(model, mode=None if mode == "default" else mode)
                for _ in range(3):  # reduce-overhead records its graph on a later call
                    compiled(*inputs)
                out[f"{mode}_compile_secs"] = round(time.perf_counter() - started, 1)
                out[mode] = cuda_median_ms(lambda c=compiled: c(*inputs))
            except Exception as err:  # noqa: BLE001 - reported in the table
                out[mode] = f"failed: {type(err).__name__}: {err}"[:160]
    return out


def export_module(model, inputs, path: Path) -> Path:
    """``torch.export`` ``model`` (moved to the CPU, same dtype) on ``inputs`` and save it."""
    import torch

    cpu_model = model.to("cpu")
    cpu_inputs = tuple(x.to("cpu") for x in inputs)
    program = torch.export.export(cpu_model, cpu_inputs)
    torch.export.save(program, str(path))
    model.to("cuda")
    return path


def with_graphs(enabled: bool):
    """Context manager: ``TUNEHUB_CUDA_GRAPHS`` set to ``enabled`` for the builds inside (the
    environment restored after)."""
    from compiler.lowering.pipeline import CUDA_GRAPHS_ENV

    return mock.patch.dict(os.environ, {CUDA_GRAPHS_ENV: "1" if enabled else "0"})


def outputs_stable(library, prepared) -> bool:
    """Two calls of a CUDA-graph library on different inputs: the first call's output tensor
    still holds the first result after the second call (no output lives in replayed memory)."""
    import numpy as np
    import tvm

    from compiler.build.verify import random_inputs

    first_in = random_inputs(prepared.model.inputs, seed=1)
    second_in = random_inputs(prepared.model.inputs, seed=2)
    expected = library.run(first_in)[0]
    vm = library.vm
    first = vm["main"](*[tvm.runtime.tensor(x, library.device) for x in first_in])
    vm["main"](*[tvm.runtime.tensor(x, library.device) for x in second_in])
    held = first if hasattr(first, "numpy") else first[0]
    return bool(np.array_equal(held.numpy(), expected))


def slowest_tasks(manifest: dict[str, Any], count: int = 6) -> list[str]:
    """The ``count`` tasks whose chosen candidate took longest in the final build's
    re-measurement, as ``name: kind ms (other candidates)``."""
    tasks = []
    for task in manifest.get("remeasured", []):
        timed = [
            (next((k for k in ("peer", "default") if k in c), "record"), c.get("median_ms"), c)
            for c in task.get("candidates", [])
        ]
        chosen = [(kind, ms) for kind, ms, c in timed if c.get("chosen") and ms is not None]
        if chosen:
            others = ", ".join(f"{k} {ms:.3f}" for k, ms, c in timed if ms and not c["chosen"])
            tasks.append(
                (
                    chosen[0][1],
                    f"{task['name']}: {chosen[0][0]} {chosen[0][1]:.3f}"
                    + (f" ({others})" if others else ""),
                )
            )
    return [text for _, text in sorted(tasks, reverse=True)[:count]]


def tunehub_times(name: str, model, inputs, trials: int, work: Path) -> dict[str, Any]:
    """TVM untuned and TuneHub's product build of ``model``, with and without CUDA graphs."""
    from tvm.s_tir import meta_schedule as ms

    import db
    from bench.bench_gpu import tune_on_gpu
    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs
    from compiler.prepare import prepare_model
    from compiler.target import resolve_target
    from db.metaschedule_database import MetaScheduleDatabase

    target = resolve_target("cuda")
    out: dict[str, Any] = {}
    started = time.perf_counter()
    path = export_module(model, inputs, work / f"{name}.pt2")
    prepared = prepare_model(path, target)
    out["prepare_secs"] = round(time.perf_counter() - started, 1)
    out["tasks"] = len(prepared.partition.tasks)
    arrays = random_inputs(prepared.model.inputs)
    for graphs in (False, True):
        with with_graphs(graphs):
            library = LoadedLibrary.from_executable(build(prepared.mod, target), "cuda")
            out[f"untuned_graphs_{graphs}"] = library.time(arrays).median_secs * 1e3
    storage = db.open_storage(f"sqlite:///{work / f'{name}.db'}", upgrade=True)
    started = time.perf_counter()
    with with_graphs(True):
        summary = tune_on_gpu(
            storage,
            prepared,
            trials=trials,
            output_dir=work / f"{name}-artifact",
            filename=path.name,
        )
    out["tune_secs"] = round(time.perf_counter() - started, 1)
    out["tunehub_graphs_True"] = summary.measured.median_secs * 1e3 if summary.measured else None
    out["verification"] = summary.verification.get("message")
    out["verified"] = summary.verification.get("passed")
    manifest = json.loads((work / f"{name}-artifact" / "manifest.json").read_text())
    out["cuda_graphs_in_manifest"] = manifest["target"].get("cuda_graphs")
    peers = set((manifest.get("peers") or {}).get("tasks", []))
    out["peers"] = len(peers)
    out["slowest_tasks"] = slowest_tasks(manifest)
    artifact = LoadedLibrary(work / f"{name}-artifact" / "model.so", "cuda")
    out["outputs_stable"] = outputs_stable(artifact, prepared)
    database = (
        MetaScheduleDatabase(storage, storage.ensure_target(target))
        if trials
        else ms.database.MemoryDatabase()
    )
    with with_graphs(False):
        library = LoadedLibrary.from_executable(
            build(prepared.mod, target, database, peers=peers), "cuda"
        )
        out["tunehub_graphs_False"] = library.time(arrays).median_secs * 1e3
    storage.close()
    return out


def bench_row(name: str, batch: int, dtype: str, args, work: Path) -> dict[str, Any]:
    import torch

    from bench.heldout import build

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, inputs = build(name, batch=batch, dtype=getattr(torch, DTYPES[dtype]), device="cuda")
    row: dict[str, Any] = {"model": name, "batch": batch, "dtype": dtype}
    row.update(torch_times(model, inputs, args.torch_modes))
    try:
        row.update(tunehub_times(f"{name}_b{batch}_{dtype}", model, inputs, args.trials, work))
    except Exception as err:  # noqa: BLE001 - reported in the table
        row["tunehub_error"] = f"{type(err).__name__}: {err}"[:300]
        row["traceback"] = traceback.format_exc()[-2000:]
    torch_best = [row[m] for m in args.torch_modes if isinstance(row.get(m), float)]
    if torch_best and isinstance(row.get("tunehub_graphs_True"), float):
        row["best_torch"] = min(torch_best)
        row["ratio_vs_best_torch"] = row["tunehub_graphs_True"] / row["best_torch"]
    return row


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    return "-" if value is None else str(value)[:60]


def write_report(path: Path, info: dict[str, Any], args, rows, skipped) -> None:
    modes = args.torch_modes
    head = [*modes, "TVM untuned", "TVM untuned + graphs", "TuneHub no graphs", "**TuneHub**"]
    lines = [
        f"# Held-out models on the GPU ({info['date']})",
        "",
        f"Machine: {info['gpu']} (compute {info['compute_capability']}), torch {info['torch']} "
        f"(CUDA {info['cuda_runtime']}), TVM {info['tvm']}, {info['cpu_cores']} CPU cores. "
        f"Command: `{info['command']}`. All rows in one process, side by side; ms per call, "
        "medians; TF32 off. `TuneHub` = the published artifact (peers chosen by measurement, "
        f"{args.trials} trials, CUDA graphs on); `ratio` = TuneHub / the best torch mode.",
        "",
        "| model | batch | dtype | " + " | ".join(head) + " | ratio | verified | peers |",
        "|---" * (len(head) + 6) + "|",
    ]
    for r in rows:
        cells = [r.get(m) for m in modes] + [
            r.get("untuned_graphs_False"),
            r.get("untuned_graphs_True"),
            r.get("tunehub_graphs_False"),
            r.get("tunehub_graphs_True"),
        ]
        ratio = r.get("ratio_vs_best_torch")
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['dtype']} | "
            + " | ".join(_cell(c) for c in cells)
            + f" | {f'{ratio:.2f}x' if ratio else '-'} | "
            + f"{_cell(r.get('verification') or r.get('tunehub_error'))} | "
            + f"{_cell(r.get('peers'))} |"
        )
    if skipped:
        lines += ["", f"Skipped at the deadline: {', '.join(skipped)}."]
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(
        json.dumps({"machine": info, "rows": rows, "skipped": skipped}, indent=1) + "\n"
    )


def main() -> int:
    import sys

    import torch
    import tvm

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", nargs="+", default=["resnet18", "resnet50", "distilbert", "vit_small"]
    )
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "fp16"])
    parser.add_argument("--torch-modes", nargs="+", choices=TORCH_MODES, default=list(TORCH_MODES))
    parser.add_argument("--trials", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--deadline-secs", type=float, default=540.0)
    args = parser.parse_args()
    props = torch.cuda.get_device_properties(0)
    info = {
        "date": dt.date.today().isoformat(),
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "tvm": tvm.__version__,
        "cpu_cores": os.cpu_count(),
        "command": "python -m bench.bench_gpu_models " + " ".join(sys.argv[1:]),
    }
    from bench.bench_gpu import choose_cuda_compiler
    from compiler.target import resolve_target

    info["cuda_compiler"] = choose_cuda_compiler(resolve_target("cuda"))
    stem = f"gpu_models_{info['date']}" + (f"_{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="tunehub-gpu-models-") as tmp:
        for batch in args.batches:
            for dtype in args.dtypes:
                for name in args.models:
                    label = f"{name}/b{batch}/{dtype}"
                    if time.monotonic() - START > args.deadline_secs:
                        skipped.append(label)
                        continue
                    started = time.monotonic()
                    rows.append(bench_row(name, batch, dtype, args, Path(tmp)))
                    rows[-1]["row_secs"] = round(time.monotonic() - started, 1)
                    print(label, json.dumps(rows[-1], default=str)[:600], flush=True)
                    write_report(args.out / stem, info, args, rows, skipped)
    write_report(args.out / stem, info, args, rows, skipped)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
