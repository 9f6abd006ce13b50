"""Load benchmark of the REST service: concurrent clients reading a job's status while it tunes.

    .venv/bin/python bench/bench_api_load.py [--clients 50] [--duration 30] [--interval 0.1]

Starts ``tunehub serve`` (API + one embedded worker, SQLite, a temporary home) on a free loopback
port, uploads the example small CNN, queues a tuning job and waits until the worker has measured
its first batch. Then ``--clients`` clients, each with its own connection, poll
``GET /api/v1/jobs/{id}`` (status, per-task progress, latency estimate) every ``--interval``
seconds (a dashboard's poll; clients start at random points of the interval and have their
connection open before the window) for ``--duration`` seconds. Reports p50/p90/p99/max latency,
throughput and errors (non-200 answers and transport errors) and checks that the job kept tuning
during the window. Goal: p99 <= 50 ms and 0 errors. The same load is then repeated with the worker
idle (the job cancelled), to show what tuning on the same machine costs the API. The clients share
the machine with the API and the tuning worker, so their own CPU time is part of what is measured.

Writes ``bench/results/api_load_<date>.md`` (machine, date, settings, numbers).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.service.conftest import start_server, stop_server  # noqa: E402


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def client_loop(
    client: httpx.AsyncClient,
    job_id: int,
    stop_at: float,
    interval: float,
    latencies: list[float],
    errors: list[str],
    rng: random.Random,
) -> None:
    # Clients are not synchronized: each starts at a random point of its interval.
    await asyncio.sleep(rng.uniform(0, interval))
    while time.monotonic() < stop_at:
        started = time.perf_counter()
        try:
            response = await client.get(f"/jobs/{job_id}")
            elapsed = time.perf_counter() - started
            if response.status_code != 200:
                errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
            else:
                response.json()
                latencies.append(elapsed)
        except httpx.HTTPError as err:
            errors.append(f"{type(err).__name__}: {err}")
            elapsed = time.perf_counter() - started
        await asyncio.sleep(max(0.0, interval - elapsed))


async def run_load(
    url: str, token: str, job_id: int, clients: int, duration: float, interval: float
) -> tuple[list[float], list[str], float]:
    """Open every client's connection first (one unmeasured request each), then measure."""
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    pool = [
        httpx.AsyncClient(base_url=url, headers=headers, timeout=10, limits=limits, verify=False)
        for _ in range(clients)
    ]
    try:
        await asyncio.gather(*(c.get(f"/jobs/{job_id}") for c in pool))
        latencies: list[float] = []
        errors: list[str] = []
        started = time.monotonic()
        stop_at = started + duration
        rng = random.Random(1)
        await asyncio.gather(
            *(client_loop(c, job_id, stop_at, interval, latencies, errors, rng) for c in pool)
        )
        return latencies, errors, time.monotonic() - started
    finally:
        await asyncio.gather(*(c.aclose() for c in pool))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="seconds between one client's requests (0: back to back)",
    )
    parser.add_argument("--example", default="small_cnn")
    parser.add_argument("--trials", type=int, default=400, help="budget of the job being tuned")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()

    from examples.export import export_onnx

    with tempfile.TemporaryDirectory(prefix="tunehub-bench-") as tmp:
        home = Path(tmp) / "home"
        model_path = export_onnx(args.example, Path(tmp) / f"{args.example}.onnx")
        # serve's default: the embedded worker tunes at niceness 10 (the tests run it at 0).
        server = start_server(home, workers=1, env={"TUNEHUB_WORKER_NICE": "10"})
        try:
            token = server.local_token()
            with server.client(token) as client:
                with open(model_path, "rb") as handle:
                    model = client.post("/models", files={"file": (model_path.name, handle)}).json()
                job = client.post(
                    "/jobs", json={"model_id": model["id"], "trial_budget": args.trials}
                ).json()
                deadline = time.monotonic() + 600
                while (current := client.get(f"/jobs/{job['id']}").json())["trials_done"] == 0:
                    if time.monotonic() > deadline or current["status"] not in (
                        "queued",
                        "running",
                    ):
                        raise SystemExit(f"the job did not start tuning: {current}")
                    time.sleep(0.5)
                trials_before = current["trials_done"]
                gc.collect()
                gc.freeze()  # this process imported torch (export): keep the GC off its objects
                print(
                    f"job {job['id']} tuning ({trials_before} trials so far); "
                    f"{args.clients} clients for {args.duration:.0f} s ...",
                    flush=True,
                )
                latencies, errors, elapsed = asyncio.run(
                    run_load(
                        server.api, token, job["id"], args.clients, args.duration, args.interval
                    )
                )
                after = client.get(f"/jobs/{job['id']}").json()
                # The same load with the worker idle: what tuning on the same machine costs.
                client.post(f"/jobs/{job['id']}/cancel")
                deadline = time.monotonic() + 300
                while any(w["status"] != "idle" for w in client.get("/workers").json()["data"]):
                    if time.monotonic() > deadline:
                        raise SystemExit("the worker did not stop after the cancel")
                    time.sleep(0.5)
                idle = asyncio.run(
                    run_load(
                        server.api, token, job["id"], args.clients, args.duration, args.interval
                    )
                )
        finally:
            stop_server(server)

    def row(label: str, latencies: list[float], errors: list[str], elapsed: float):
        ms = [x * 1e3 for x in latencies]
        p50, p90, p99 = (percentile(ms, q) for q in (50, 90, 99))
        worst = max(ms) if ms else float("nan")
        rate = len(ms) / elapsed if elapsed else 0.0
        line = (
            f"| {label} | {len(ms)} | {rate:.0f} | {p50:.1f} | {p90:.1f} | {p99:.1f} | "
            f"{worst:.1f} | {len(errors)} |"
        )
        return line, p99

    tuning_line, p99 = row("job tuning", latencies, errors, elapsed)
    idle_line, _ = row("worker idle (after cancel)", *idle)
    tuned = after["trials_done"] - trials_before
    ok = p99 <= 50.0 and not errors
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    today = dt.date.today().isoformat()
    lines = [
        f"# API load: {args.clients} clients reading job status while a job tunes ({today})",
        "",
        f"- machine: {_cpu_model()}, {len(os.sched_getaffinity(0))} usable cores, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}; load average "
        f"after the run (1/5/15 min): {load} (other processes on this shared machine included)",
        f"- command: `.venv/bin/python bench/bench_api_load.py --clients {args.clients} "
        f"--duration {args.duration:g} --interval {args.interval:g}`",
        f"- server: `tunehub serve` (one uvicorn process, one embedded worker process tuning "
        f"{args.example} at niceness 10, SQLite WAL, job status page reused for 0.25 s); "
        f"clients: one asyncio process, {args.clients} httpx "
        f"connections, each `GET /api/v1/jobs/{{id}}` every {args.interval:g} s, same machine",
        f"- the job kept tuning during the window: {tuned} trials measured "
        f"({after['status']}, {after['trials_done']}/{args.trials})",
        "",
        "| window | requests | req/s | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        tuning_line,
        idle_line,
        "",
        f"Goal while the job tunes, p99 <= 50 ms and 0 errors: {'met' if ok else 'NOT met'}.",
    ]
    if errors:
        lines += ["", "First errors:", *[f"- {e}" for e in errors[:10]]]
    text = "\n".join(lines) + "\n"
    print(text)
    out = args.output or REPO / "bench" / "results" / f"api_load_{today}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
