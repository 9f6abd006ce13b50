"""The physical limit of the LLM benchmark: the machine's copy bandwidth
(:func:`measure_bandwidth`) and the decode time no runtime can beat, weight bytes read per token
over that bandwidth, at each weight precision (:func:`physical_limit`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from bench.llm_models import BYTES_PER_WEIGHT, LLMSpec, kv_bytes_per_token, weight_bytes_per_token
from bench.llm_runtime import PeerResult, Settings


def measure_bandwidth(
    threads: int = 2, mib: int = 512, repeats: int = 5
) -> dict[str, float | int | str]:
    """Copy bandwidth in GB/s (STREAM's convention: bytes read + bytes written, best of N).

    Two float64 arrays of ``mib`` MiB each (far larger than the caches): ``np.copyto`` on one
    thread, and ``threads`` Python threads each copying its slice (numpy releases the GIL
    while copying); ``best_gbs`` is the larger.
    """
    n = mib * 2**20 // 8
    src = np.ones(n)
    dst = np.zeros(n)
    np.copyto(dst, src)
    nbytes = 2 * src.nbytes

    def one() -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t0)
        return nbytes / best / 1e9

    def many() -> float:
        bounds = np.linspace(0, n, threads + 1).astype(int)
        best = float("inf")
        for _ in range(repeats):
            barrier = threading.Barrier(threads + 1)

            def work(lo: int, hi: int, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                np.copyto(dst[lo:hi], src[lo:hi])

            pool = [
                threading.Thread(target=work, args=(bounds[i], bounds[i + 1]))
                for i in range(threads)
            ]
            for t in pool:
                t.start()
            t0 = time.perf_counter()
            barrier.wait()
            for t in pool:
                t.join()
            best = min(best, time.perf_counter() - t0)
        return nbytes / best / 1e9

    single = one()
    out: dict[str, float | int | str] = {"copy_1thread_gbs": single, "best_gbs": single}
    if threads > 1:
        multi = many()
        out[f"copy_{threads}threads_gbs"] = multi
        out["best_gbs"] = max(single, multi)
    out["array_mib"] = mib
    out["method"] = "np.copyto, float64, 2 x bytes per copy, best of repeats"
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
                        "ms_with_kv": {
                            str(c): (wbytes + v) / (bandwidth_gbs * 1e9) * 1e3
                            for c, v in kv.items()
                        },
                    }
                ),
            )
        )
    return out
