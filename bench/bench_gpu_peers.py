"""GPU library peers (issue 21): cuBLAS as a candidate of each GEMM task, on one GPU.

    python -m bench.bench_gpu_peers [--gemm fp16:4096 fp16:2048 fp32:4096 fp32:2048]
        [--networks bert resnet18] [--trials 8] [--rounds 5] [--out bench/results]
        [--deadline-secs 500]

GEMM (``C = A @ B``, square, row-major; fp16 accumulates in fp32 and stores fp16, as cuBLAS):
the task's DLight default schedule (what an untuned build uses), its cuBLAS peer
(:mod:`compiler.peers`, ``device="cuda"``) and ``torch.matmul`` on the same inputs, each checked
against a float64 product and timed with CUDA events (median of repeats), and the two TuneHub
candidates also side by side in MetaSchedule's runner
(:func:`tuner.final_build.remeasure.time_side_by_side`, what a final build measures); ``chosen`` is
the faster there.

Networks (``examples/networks.py``, batch 1, float32, TF32 off): torch eager and
``torch.compile``; TVM untuned (DLight); every GEMM task on its cuBLAS peer (no choice); and the
product path, ``tune_model`` with ``--trials`` trials, whose final build re-measures each task's
records (its DLight schedule is one), and its peer, and builds with the winners; the artifact is
verified against the reference framework.

Rows are written as they are done: ``<out>/gpu_peers_<date>.md`` and ``.json``.
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

from bench.bench_gpu import cuda_median_ms, gemm_module, machine_info

START = time.monotonic()


def _rel_err(out, ref) -> float:
    import torch

    return float(torch.linalg.norm(out.double() - ref) / torch.linalg.norm(ref))


def bench_gemm(spec: str, target, rounds: int) -> dict[str, Any]:
    import numpy as np
    import torch
    import tvm
    from tvm.s_tir import dlight as dl

    from compiler.peers import load_peers, peer_task_module
    from tuner.final_build.remeasure import time_side_by_side

    dtype_name, n_text = spec.split(":")
    n, dtype = int(n_text), {"fp16": "float16", "fp32": "float32"}[dtype_name]
    task = gemm_module(n, dtype)
    tvm_target = target.tvm_target()
    peer = peer_task_module(task, "cuda")
    load_peers()  # the peer's host code calls the shim: it must be in this process
    with tvm_target:  # on a copy: the pass may update a module it holds the only reference to
        dlight = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Fallback())(
            task.clone()
        )
    row: dict[str, Any] = {"gemm": spec, "flops": 2.0 * n**3}
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=torch_dtype, generator=gen)
    b = torch.randn(n, n, device="cuda", dtype=torch_dtype, generator=gen)
    ref = a.double() @ b.double()
    torch.backends.cuda.matmul.allow_tf32 = False
    out = torch.empty(n, n, device="cuda", dtype=torch_dtype)
    row["torch_ms"] = cuda_median_ms(lambda: torch.matmul(a, b, out=out))
    row["torch_rel_err"] = _rel_err(out, ref)
    dev = tvm.cuda(0)
    a_t, b_t = tvm.runtime.tensor(a.cpu().numpy(), dev), tvm.runtime.tensor(b.cpu().numpy(), dev)
    for label, mod in (("dlight", dlight), ("peer", peer)):
        lib = tvm.compile(mod, target=tvm_target)
        c_t = tvm.runtime.tensor(np.full((n, n), np.nan, dtype=dtype), dev)
        func = lib["main"]
        func(a_t, b_t, c_t)
        dev.sync()
        row[f"{label}_rel_err"] = _rel_err(torch.from_numpy(c_t.numpy()).cuda(), ref)
        row[f"{label}_ms"] = cuda_median_ms(lambda f=func, c=c_t: f(a_t, b_t, c))
    secs = time_side_by_side([(dlight, None), (peer, None)], target, rounds)
    row["runner_ms"] = {
        label: (sorted(s)[len(s) // 2] * 1e3 if s else None)
        for label, s in zip(("dlight", "peer"), secs)
    }
    timed = {k: v for k, v in row["runner_ms"].items() if v is not None}
    row["chosen"] = min(timed, key=timed.get) if timed else None
    row["chosen_ms"] = row[f"{row['chosen']}_ms"] if row["chosen"] else None
    row["vs_cublas"] = row["torch_ms"] / row["chosen_ms"] if row["chosen_ms"] else None
    return row


def bench_network(name: str, target, trials: int, work: Path) -> dict[str, Any]:
    from tvm.s_tir import meta_schedule as ms

    import db
    from bench.bench_gpu import torch_network_ms, tune_on_gpu
    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import random_inputs, verify
    from compiler.peers import device_of, find_peer
    from compiler.prepare import prepare_model
    from examples.export import export_onnx

    path = export_onnx(name, work / f"{name}.onnx")
    prepared = prepare_model(path, target)
    inputs = random_inputs(prepared.model.inputs)
    row: dict[str, Any] = {"network": name, "tasks": len(prepared.partition.tasks)}
    row.update(torch_network_ms(name, inputs))
    untuned = LoadedLibrary.from_executable(build(prepared.mod, target), "cuda")
    row["untuned_ms"] = untuned.time(inputs).median_secs * 1e3
    keys = {
        t.key
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
        if find_peer(e.dispatched[0], device_of(target)) is not None
    }
    row["gemm_tasks"] = len(keys)
    all_peers = LoadedLibrary.from_executable(
        build(prepared.mod, target, ms.database.MemoryDatabase(), peers=keys), "cuda"
    )
    row["all_peers_verified"] = verify(prepared.model, all_peers.run, device="cuda").message
    row["all_peers_ms"] = all_peers.time(inputs).median_secs * 1e3
    if trials:
        storage = db.open_storage(f"sqlite:///{work / f'{name}.db'}", upgrade=True)
        started = time.perf_counter()
        summary = tune_on_gpu(
            storage, prepared, trials=trials, output_dir=work / f"{name}-tuned", filename=path.name
        )
        row["tune_secs"] = time.perf_counter() - started
        manifest = json.loads((work / f"{name}-tuned" / "manifest.json").read_text())
        row["tuned_ms"] = summary.measured.median_secs * 1e3 if summary.measured else None
        row["tuned_verified"] = summary.verification.get("message")
        row["tuned_peers"] = len((manifest.get("peers") or {}).get("tasks", []))
        row["per_task"] = [
            {
                "name": t["name"],
                "candidates": [
                    {_kind(c): c.get("median_ms"), "chosen": c["chosen"]} for c in t["candidates"]
                ],
            }
            for t in manifest.get("remeasured", [])
        ]
        storage.close()
    return row


def _kind(candidate: dict[str, Any]) -> str:
    """What a re-measured candidate of the manifest is: ``peer``, ``default`` or ``record``."""
    return next((k for k in ("peer", "default") if k in candidate), "record")


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return "-" if value is None else str(value)


def write_report(out: Path, info: dict, args: Any, gemms: list, nets: list, notes: list) -> None:
    today = dt.date.today().isoformat()
    lines = [
        f"# GPU library peers ({today})",
        "",
        f"Machine: {info.get('gpu')} (compute {info.get('compute_capability')}), torch "
        f"{info.get('torch')} (CUDA {info.get('cuda_runtime')}), TVM {info.get('tvm')}; peer "
        f"library: {info.get('peer_library')}.",
        "Command: `python -m bench.bench_gpu_peers " + " ".join(os.sys.argv[1:]) + "`",
        "",
        "## GEMM (ms, CUDA events, median; TFLOP/s in brackets)",
        "",
        "| GEMM | DLight | cuBLAS peer | torch (cuBLAS) | runner: DLight / peer | chosen | "
        "chosen vs torch | rel. err peer / torch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in gemms:
        if "error" in r:
            lines.append(f"| {r['gemm']} | failed: {r['error']} |||||||")
            continue

        def tf(ms: float, flops: float = r["flops"]) -> str:
            return f"{ms:.3f} ({flops / ms / 1e9:.0f})"

        runner = r["runner_ms"]
        lines.append(
            f"| {r['gemm']} | {tf(r['dlight_ms'])} | {tf(r['peer_ms'])} | {tf(r['torch_ms'])} | "
            f"{_fmt(runner['dlight'])} / {_fmt(runner['peer'])} | {r['chosen']} | "
            f"{_fmt(r['vs_cublas'], 2)}x | {r['peer_rel_err']:.1e} / {r['torch_rel_err']:.1e} |"
        )
    lines += [
        "",
        "## Networks (ms, batch 1, float32)",
        "",
        "| network | torch eager | torch.compile | TVM untuned (DLight) | all GEMMs on "
        "cuBLAS | tuned + peers (trials) | peers chosen | verified |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in nets:
        if "error" in r:
            lines.append(f"| {r['network']} | failed: {r['error']} |||||||")
            continue
        lines.append(
            f"| {r['network']} | {_fmt(r.get('torch_eager_ms'))} | "
            f"{_fmt(r.get('torch_compile_ms'))} | {_fmt(r.get('untuned_ms'))} | "
            f"{_fmt(r.get('all_peers_ms'))} | "
            f"{_fmt(r.get('tuned_ms'))} ({args.trials}) | {r.get('tuned_peers', '-')} of "
            f"{r.get('gemm_tasks')} | {r.get('tuned_verified') or r.get('all_peers_verified')} |"
        )
    lines += ["", *notes]
    (out / f"gpu_peers_{today}.md").write_text("\n".join(lines) + "\n")
    (out / f"gpu_peers_{today}.json").write_text(
        json.dumps(
            {"machine": info, "gemm": gemms, "networks": nets, "notes": notes},
            indent=1,
            default=str,
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gemm", nargs="*", default=["fp16:4096", "fp16:2048", "fp32:4096", "fp32:2048"]
    )
    parser.add_argument("--networks", nargs="*", default=["bert", "resnet18"])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--deadline-secs", type=float, default=500.0)
    args = parser.parse_args(argv)
    import tvm

    from compiler.peers.cuda_library import cuda_peer_library, cuda_unavailable_reason
    from compiler.target import cuda_target, detect_gpu

    if not tvm.cuda(0).exist:
        print("no CUDA device")
        return 2
    target = cuda_target(detect_gpu())
    info = machine_info(target)
    library = cuda_peer_library()
    info["peer_library"] = library.describe() if library else cuda_unavailable_reason()
    print("peer library:", info["peer_library"], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    gemms: list[dict[str, Any]] = []
    nets: list[dict[str, Any]] = []
    notes: list[str] = []
    work = Path(tempfile.mkdtemp(prefix="gpu-peers-"))
    jobs = [("gemm", s) for s in args.gemm] + [("net", n) for n in args.networks]
    for kind, item in jobs:
        if time.monotonic() - START > args.deadline_secs:
            notes.append(f"- {item}: skipped (deadline {args.deadline_secs:.0f} s)")
            continue
        print(f"== {item}", flush=True)
        try:
            row = (
                bench_gemm(item, target, args.rounds)
                if kind == "gemm"
                else bench_network(item, target, args.trials, work)
            )
        except Exception as err:  # noqa: BLE001 - reported in the table
            traceback.print_exc()
            row = {
                "gemm" if kind == "gemm" else "network": item,
                "error": f"{type(err).__name__}: {err}"[:300],
            }
        print(json.dumps(row, default=str)[:1500], flush=True)
        (gemms if kind == "gemm" else nets).append(row)
        write_report(args.out, info, args, gemms, nets, notes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
