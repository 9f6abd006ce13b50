"""Decode attention's two products on the GPU under each default-schedule rule (issue 34).

    python -m bench.bench_gpu_decode_kernels [--cache 1152] [--heads 2] [--rows 7] [--dim 64]
        [--out DIR]

A decode step's attention, per key-value head, is ``scores[h, n, i] = Σ_d K[h, n, d] q[h, d, i]``
(q·Kᵀ, a short reduction over the head dimension, as TVM legalizes the ``transformers`` export)
and ``out[h, i, d] = Σ_n P[h, i, n] V[h, n, d]`` (P·V, a long reduction over the cache), with
``i`` the query heads of a group (Qwen2.5-0.5B: 2 key-value heads of 7 query heads, head
dimension 64). Each product is written in TE with those shapes (bfloat16), scheduled by DLight's
matmul rule alone and as a zero-trial CUDA build schedules it
(:func:`compiler.lowering.default_schedules.default_task_module`: TuneHub's default CUDA rules, the
split reduction for P·V), built for the GPU and timed with ``time_evaluator`` (median µs). Writes
``gpu_decode_kernels_<date>.json`` / ``.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import dlight as dl


def scores(heads: int, rows: int, cache: int, dim: int, dtype: str) -> tuple[Any, list[Any]]:
    """q·Kᵀ as TVM legalizes the decoder's: ``K [1, h, cache, dim] @ qT [1, h, dim, rows]``."""
    k = te.placeholder((1, heads, cache, dim), dtype, name="K")
    q = te.placeholder((1, heads, dim, rows), dtype, name="qT")
    d = te.reduce_axis((0, dim), name="d")
    out = te.compute(
        (1, heads, cache, rows),
        lambda b, h, n, i: te.sum(k[b, h, n, d] * q[b, h, d, i], axis=d),
        name="matmul",
    )
    return te.create_prim_func([k, q, out]), [k, q, out]


def values(heads: int, rows: int, cache: int, dim: int, dtype: str) -> tuple[Any, list[Any]]:
    """P·V: ``P [1, h, rows, cache] @ V [1, h, cache, dim]``."""
    p = te.placeholder((1, heads, rows, cache), dtype, name="P")
    v = te.placeholder((1, heads, cache, dim), dtype, name="V")
    n = te.reduce_axis((0, cache), name="n")
    out = te.compute(
        (1, heads, rows, dim),
        lambda b, h, i, j: te.sum(p[b, h, i, n] * v[b, h, n, j], axis=n),
        name="matmul",
    )
    return te.create_prim_func([p, v, out]), [p, v, out]


def dlight_matmul(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule | None:
    """``mod`` scheduled by DLight's matmul rule alone; ``None`` when the rule declines."""
    with target:
        scheduled = dl.ApplyDefaultSchedule(dl.gpu.Matmul())(mod.clone())
    attrs = scheduled["main"].attrs
    return scheduled if attrs and attrs.get("tirx.is_scheduled", False) else None


def time_module(
    scheduled: tvm.IRModule | None, tensors: list[Any], target: tvm.target.Target
) -> float | None:
    """Median µs of a scheduled module on the GPU; ``None`` for no schedule."""
    if scheduled is None:
        return None
    lib = tvm.compile(scheduled, target=target)
    dev = tvm.cuda(0)
    args = [  # timing only: the values do not matter
        tvm.runtime.empty([int(d) for d in t.shape], str(t.dtype), dev) for t in tensors
    ]
    evaluator = lib.mod.time_evaluator("main", dev, number=200, repeat=7)
    return float(np.median(evaluator(*args).results)) * 1e6


def main(argv: list[str] | None = None) -> int:
    from compiler.lowering.default_schedules import default_task_module
    from compiler.target import cuda_target, detect_gpu

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=int, nargs="+", default=[1152, 4096])
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[7, 56])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    args = parser.parse_args(argv)
    gpu = detect_gpu()
    if gpu is None:
        raise SystemExit("no CUDA GPU here")
    target = cuda_target(gpu).tvm_target()
    rows_out = []
    for cache in args.cache:
        for rows in args.rows:
            for product, build in (("q·Kᵀ", scores), ("P·V", values)):
                func, tensors = build(args.heads, rows, cache, args.dim, args.dtype)
                mod = tvm.IRModule({"main": func})
                entry = {"product": product, "cache": cache, "rows": rows}
                for name, scheduled in (
                    ("dlight matmul", dlight_matmul(mod, target)),
                    ("tunehub", default_task_module(mod, target)),
                ):
                    entry[name] = time_module(scheduled, tensors, target)
                rows_out.append(entry)
                print(json.dumps(entry), flush=True)
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"gpu_decode_kernels_{date}"
    stem.with_suffix(".json").write_text(json.dumps({"gpu": gpu.name, "rows": rows_out}, indent=1))
    lines = [
        f"# Decode attention kernels by schedule rule ({gpu.name}, {date})",
        "",
        f"{args.heads} key-value heads, head dimension {args.dim}, {args.dtype}; median µs.",
        "",
        "| product | cache | query rows | DLight matmul | TuneHub default rules |",
        "|---|---|---|---|---|",
    ]
    for e in rows_out:
        cells = [
            f"{e[k]:.2f}" if e[k] is not None else "declined" for k in ("dlight matmul", "tunehub")
        ]
        lines.append(f"| {e['product']} | {e['cache']} | {e['rows']} | {' | '.join(cells)} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
