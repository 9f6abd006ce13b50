"""A decoder's GEMMs over 8-bit weights against float32, the whole model's weights per pass.

    python -m bench.bench_q8_gemm [--threads 2] [--rounds 7] [--rows 1 4 8 16] [--out DIR]

A decode step reads each weight once, and a model's weights do not fit in any cache, so each
timer here runs every GEMM of a model once (Qwen2.5-0.5B's shapes: 24 layers of q, k, v, o,
gate, up and down projections, and the 896 x 151,936 head), each over its own weight, at
``rows`` rows of input: what one decode step's (or a small batch's) projections cost. The
weights are random and put on Q8_0's grid (:func:`compiler.weights.weight_formats.q8_0_values`), as
``--weights q8_0`` leaves them. Timers, side by side, interleaved
(:func:`bench.bench_peers.interleaved`):

- ``sgemv``: OpenBLAS over the float32 weights (``tunehub_peer_gemm``; ``sgemm`` above one row);
- ``packed``: the shim's packed-weight GEMM (``tunehub_peer_gemm_packed``);
- ``q8``: the shim's GEMM over the 8-bit copy (``tunehub_peer_gemm_q8``);
- ``q4``: the shim's GEMM over a 4-bit copy (``tunehub_peer_gemm_q4``) of the same weights put
  on Q4_0's grid instead (:func:`compiler.weights.weight_formats.q4_0_values`).

The shim is called directly (ctypes) on TVM's thread pool (``TVM_NUM_THREADS = --threads``).
Each algorithm's output is checked against float64 numpy on the head. The effective bandwidth
column divides the bytes each algorithm must read (4 a weight; 1.0625 for ``q8``) by its time.
Writes ``q8_gemm_<date>.json`` and ``.md`` (machine, date) into ``--out`` (default
``bench/results``).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
#: Qwen2.5-0.5B: (inner, outer) of each projection of a layer, and of the head.
LAYER = {"q": (896, 896), "k": (896, 128), "v": (896, 128), "o": (896, 896)}
LAYER |= {"gate": (896, 4864), "up": (896, 4864), "down": (4864, 896)}
LAYERS = 24
HEAD = (896, 151936)
FUNCTIONS = {
    "sgemv": "tunehub_peer_gemm",
    "packed": "tunehub_peer_gemm_packed",
    "q8": "tunehub_peer_gemm_q8",
    "q4": "tunehub_peer_gemm_q4",
}
BYTES_PER_WEIGHT = {"sgemv": 4.0, "packed": 4.0, "q8": 1.0625, "q4": 0.5625}


def _weights(seed: int = 0, fmt: str = "q8_0") -> list[np.ndarray]:
    from compiler.weights.weight_formats import FORMAT_VALUES

    rng = np.random.default_rng(seed)
    shapes = [shape for _ in range(LAYERS) for shape in LAYER.values()] + [HEAD]
    out = []
    for k, n in shapes:
        # torch's [out, in] weight quantized along its input axis, then laid out [in, out]
        w = (rng.standard_normal((n, k), dtype=np.float32) * 0.02).astype(np.float32)
        out.append(np.ascontiguousarray(FORMAT_VALUES[fmt](w).T))
    return out


def _entry(lib: ctypes.CDLL, name: str) -> Any:
    f = getattr(lib, name)
    i64, i32, ptr, f32 = ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_float
    f.argtypes = [ptr, ptr, ptr, i64, i64, i64, i64, i32, i32, i32, ptr, ptr, f32, f32]
    f.restype = ctypes.c_int
    return f


def _call(f: Any, a: np.ndarray, w: np.ndarray, c: np.ndarray) -> None:
    k, n = w.shape
    inf = ctypes.c_float(np.inf)
    f(a.ctypes.data, w.ctypes.data, c.ctypes.data, 1, a.shape[0], n, k, 0, 0, 0, None, None,
      ctypes.c_float(-np.inf), inf)  # fmt: skip


def bench(threads: int, rounds: int, rows_list: list[int]) -> dict[str, Any]:
    os.environ["TVM_NUM_THREADS"] = str(threads)
    from bench.bench_peers import interleaved
    from compiler.peers.library import peer_library

    lib = ctypes.CDLL(str(peer_library().shared), mode=ctypes.RTLD_GLOBAL)
    entries = {name: _entry(lib, symbol) for name, symbol in FUNCTIONS.items()}
    weights = _weights()
    by_name = {name: weights for name in FUNCTIONS} | {"q4": _weights(fmt="q4_0")}
    values = sum(w.size for w in weights)
    rng = np.random.default_rng(1)
    rows_out = []
    for rows in rows_list:
        inputs = {
            k: rng.standard_normal((rows, k), dtype=np.float32)
            for k in {w.shape[0] for w in weights}
        }
        outputs = [np.empty((rows, w.shape[1]), np.float32) for w in weights]
        errors = {}
        for name, f in entries.items():
            head = by_name[name][-1]
            _call(f, inputs[HEAD[0]], head, outputs[-1])
            want = inputs[HEAD[0]].astype(np.float64) @ head.astype(np.float64)
            errors[name] = float(np.abs(outputs[-1] - want).max())

        def timer(f: Any, ws: list, inputs: dict = inputs, outputs: list = outputs) -> Any:
            def run() -> float:
                start = time.perf_counter()
                for w, c in zip(ws, outputs, strict=True):
                    _call(f, inputs[w.shape[0]], w, c)
                return time.perf_counter() - start

            return run

        times = interleaved({n: timer(f, by_name[n]) for n, f in entries.items()}, rounds)
        rows_out.append({"rows": rows, "seconds": times, "max_abs_error": errors})
        print(rows, {n: f"{t * 1e3:.2f} ms" for n, t in times.items()}, flush=True)
    return {"weights": values, "gemms": len(weights), "rows": rows_out}


def render(run: dict[str, Any]) -> str:
    m = run["machine"]
    lines = [
        f"# A decoder's GEMMs over 8- and 4-bit weights ({run['date']})",
        "",
        f"Machine: {m['cpu_model']} (LLVM `{m['llvm_cpu']}`), {run['threads']} threads. "
        f"Command: `{run['command']}`.",
        "",
        f"One pass = every GEMM of Qwen2.5-0.5B once ({run['gemms']} GEMMs, "
        f"{run['weights'] / 1e6:.0f} M weights, each its own), median of {run['rounds']} "
        "interleaved rounds. GB/s: the bytes each algorithm must read over its time.",
        "",
        "| rows | sgemv (OpenBLAS) ms | packed ms | q8 ms | q4 ms | q8 / best float32 | "
        "q4 / q8 | q8 GB/s | q4 GB/s | float32 best GB/s | max abs error (head) sgemv / packed / "
        "q8 / q4 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in run["rows"]:
        t = row["seconds"]
        best = min(t["sgemv"], t["packed"])
        e = row["max_abs_error"]
        q4 = t.get("q4")  # runs before 2026-12-07 had no q4

        def gbs(name: str, t: dict = t) -> str:
            return f"{run['weights'] * BYTES_PER_WEIGHT[name] / t[name] / 1e9:.1f}"

        q4_ms = f"{q4 * 1e3:.2f}" if q4 else "–"
        q4_ratio = f"{q4 / t['q8']:.2f}x" if q4 else "–"
        errs = " / ".join(f"{e.get(n, float('nan')):.1e}" for n in ("sgemv", "packed", "q8", "q4"))
        lines.append(
            f"| {row['rows']} | {t['sgemv'] * 1e3:.2f} | {t['packed'] * 1e3:.2f} | "
            f"{t['q8'] * 1e3:.2f} | {q4_ms} | {t['q8'] / best:.2f}x | {q4_ratio} | {gbs('q8')} | "
            f"{gbs('q4') if q4 else '–'} | {run['weights'] * 4 / best / 1e9:.1f} | {errs} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    from bench.bench_levers import machine

    run = {
        "date": dt.date.today().isoformat(),
        "machine": machine(),
        "threads": args.threads,
        "rounds": args.rounds,
        "command": "python -m bench.bench_q8_gemm " + " ".join(argv or sys.argv[1:]),
        **bench(args.threads, args.rounds, args.rows),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"q8_gemm_{run['date']}{('_' + args.tag) if args.tag else ''}"
    (args.out / f"{stem}.json").write_text(json.dumps(run, indent=1))
    (args.out / f"{stem}.md").write_text(render(run))
    print(render(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
