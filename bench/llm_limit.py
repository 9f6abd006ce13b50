"""The physical limit of the LLM benchmark: the machine's copy and read bandwidth
(:func:`measure_bandwidth`) and the decode time no runtime can beat, weight bytes read per token
over that bandwidth, at each weight precision (:func:`physical_limit`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from bench.llm_models import BYTES_PER_WEIGHT, LLMSpec, kv_bytes_per_token, weight_bytes_per_token
from bench.llm_runtime import PeerResult, Settings


def measure_bandwidth(
    threads: int = 2, mib: int = 512, repeats: int = 5
) -> dict[str, float | int | str]:
    """Copy and read bandwidth in GB/s, best of ``repeats``.

    Copy (STREAM's convention: bytes read + bytes written): two float64 arrays of ``mib`` MiB
    each (far larger than the caches), ``np.copyto`` on one thread and on ``threads`` Python
    threads each copying its slice (numpy releases the GIL while copying); ``best_gbs`` is the
    larger. Read: the bytes of one such array over the time of ``np.max`` of it (one thread,
    and ``threads`` threads on slices); ``best_read_gbs`` is the larger. A decode step reads its
    weights and writes little, so the read figure is the bound that applies (runtimes beat the
    copy bound on a Zen 5: llama.cpp's f32 decode reached 141 % of it). ``np.max`` slightly
    underestimates it: float32 decodes reached 113-115 % of it on a 2-core Xeon."""
    n = mib * 2**20 // 8
    src = np.ones(n)
    dst = np.zeros(n)
    np.copyto(dst, src)

    def copy(lo: int, hi: int) -> None:
        np.copyto(dst[lo:hi], src[lo:hi])

    def read(lo: int, hi: int) -> None:
        np.max(src[lo:hi])

    def best_seconds(work: Callable[[int, int], None], workers: int) -> float:
        bounds = np.linspace(0, n, workers + 1).astype(int)
        best = float("inf")
        for _ in range(repeats):
            if workers == 1:
                t0 = time.perf_counter()
                work(0, n)
                best = min(best, time.perf_counter() - t0)
                continue
            barrier = threading.Barrier(workers + 1)

            def run(lo: int, hi: int, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                work(lo, hi)

            pool = [
                threading.Thread(target=run, args=(bounds[i], bounds[i + 1]))
                for i in range(workers)
            ]
            for t in pool:
                t.start()
            t0 = time.perf_counter()
            barrier.wait()
            for t in pool:
                t.join()
            best = min(best, time.perf_counter() - t0)
        return best

    out: dict[str, float | int | str] = {}
    for name, work, nbytes in (("copy", copy, 2 * src.nbytes), ("read", read, src.nbytes)):
        for workers in sorted({1, threads}):
            label = f"{name}_1thread_gbs" if workers == 1 else f"{name}_{workers}threads_gbs"
            out[label] = nbytes / best_seconds(work, workers) / 1e9
    out["best_gbs"] = max(v for k, v in out.items() if k.startswith("copy_"))
    out["best_read_gbs"] = max(v for k, v in out.items() if k.startswith("read_"))
    out["array_mib"] = mib
    out["method"] = (
        "np.copyto, float64, 2 x bytes per copy; read: np.max, bytes of the array; best of repeats"
    )
    return out


def physical_limit(
    spec: LLMSpec, bandwidth_gbs: float, settings: Settings, bandwidth: Mapping[str, Any]
) -> list[PeerResult]:
    """One result per weight precision: decode ms/token >= weight bytes / bandwidth.

    ``decode_ms[C]`` (and ``decode_b4_ms``: a batch-4 step reads the weights once) is the
    weights-only bound at every context; ``extra`` also gives the K/V bytes a token reads at
    each context (fp32 cache) and the bound with them.
    """
    out = []
    for precision, bpw in BYTES_PER_WEIGHT.items():
        wbytes = weight_bytes_per_token(spec, bpw)
        ms = wbytes / (bandwidth_gbs * 1e9) * 1e3
        contexts = sorted(set(settings.contexts) | set(settings.batch4_contexts))
        kv = {c: kv_bytes_per_token(spec, c) for c in contexts}
        out.append(
            PeerResult(
                runtime="limit",
                variant=precision,
                precision=precision,
                model=spec.name,
                threads=settings.threads,
                decode_ms=MappingProxyType({c: ms for c in settings.contexts}),
                decode_b4_ms=MappingProxyType({c: ms for c in settings.batch4_contexts}),
                extra=MappingProxyType(
                    {
                        "weight_bytes_per_token": wbytes,
                        "bytes_per_weight": bpw,
                        "bandwidth": dict(bandwidth),
                        "kv_bytes_per_token_fp32": {str(c): v for c, v in kv.items()},
                        "ms_at_read_bandwidth": (
                            wbytes / (float(bandwidth["best_read_gbs"]) * 1e9) * 1e3
                            if "best_read_gbs" in bandwidth
                            else None
                        ),
                        "ms_with_kv": {
                            str(c): (wbytes + v) / (bandwidth_gbs * 1e9) * 1e3
                            for c, v in kv.items()
                        },
                    }
                ),
            )
        )
    return out
