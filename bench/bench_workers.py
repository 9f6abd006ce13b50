"""Measurement throughput of remote tuning workers: 1, 2, 4 (8, ...) workers on the same queue.

    .venv/bin/python bench/bench_workers.py [--workers 1 2 4] [--tasks 4] [--trials 8] [--rpc 0]
                                            [--cores-per-worker K]

For each worker count, a fresh ``tunehub serve --no-worker`` (SQLite, temporary home; PostgreSQL
with ``--db URL``, a fresh database per run) gets ``--tasks`` one-task models (matmuls of
different shapes, so no task is shared), each with a job of ``--trials`` trials; then N
``tunehub worker --server ... --once`` processes lease the tasks over HTTP until the queue is
empty. Measurement throughput is the
trials uploaded (counted by the coordinator) divided by the window from the first lease to the
last tune lease's end (finalize steps and process start-up are outside the window). With
``--rpc K`` the workers measure through a TVM RPC tracker and K RPC servers on loopback.

With ``--cores-per-worker K`` each worker process (and the builder and runner processes it
starts) is pinned to K cores of its own (worker i: cores i*K .. i*K+K-1), so that N workers
use N*K cores and a single worker is not measured with every core of the machine; the jobs are
submitted for that K-core target (registered first). Without it every worker sees all cores.

The CPU seconds of all worker processes (and their builder/runner children) are reported too:
trials per CPU second staying flat while N grows means the coordination costs nothing per
trial, and the wall-clock scaling is bounded by the cores the machine has. Load average before
and after each run is reported, since this machine is shared.

Goal: throughput(N) >= 0.8 N throughput(1). Writes ``bench/results/workers_<date>.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.service.conftest import start_server, stop_server, upload  # noqa: E402
from tests.service.workers_helpers import start_rpc, start_worker, wait_exit  # noqa: E402

SHAPES = [
    (32, 128, 64),
    (48, 96, 64),
    (64, 64, 96),
    (32, 192, 32),
    (40, 128, 80),
    (56, 72, 48),
    (24, 160, 64),
    (64, 112, 40),
]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _fresh_postgres(admin_url: str, name: str) -> str:
    """A new empty, upgraded database next to ``admin_url`` (each run starts with no records)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    import db

    admin = make_url(admin_url).set(drivername="postgresql+psycopg")
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    url = admin.set(database=name).render_as_string(hide_password=False)
    with db.open_storage(url, upgrade=True):
        pass
    return url


def _register_target(server, token: str, cores: int) -> str:
    """Register the ``cores``-core CPU target of this machine (what a worker pinned to that many
    cores resolves) and return its key, so jobs can name it before any worker has started."""
    import json

    from compiler.target import cpu_target

    spec = cpu_target(num_cores=cores)
    with server.client(token) as client:
        reply = client.post(
            "/workers/register",
            json={
                "name": "bench-target",
                "fingerprint": json.loads(spec.fingerprint_json),
                "target": {
                    "kind": spec.kind,
                    "target_json": spec.target_json,
                    "fingerprint_json": spec.fingerprint_json,
                    "tvm_version": spec.tvm_version,
                },
            },
        )
        assert reply.status_code == 200, reply.text
        client.post("/workers/bench-target/heartbeat", json={"status": "offline"})
    return spec.key


def run_once(n_workers: int, args, folder: Path) -> dict:
    import onnx

    from tests.onnx_factory import matmul_model

    home = folder / f"home-{n_workers}"
    env = {"TUNEHUB_LEASE_SECS": "120", "TUNEHUB_SEARCH_POPULATION": str(args.population)}
    db_url = _fresh_postgres(args.db, f"tunehub_bench_workers_{n_workers}") if args.db else None
    server = start_server(home, workers=0, env=env, db_url=db_url)
    cores = args.cores_per_worker
    rpc = start_rpc(folder, servers=args.rpc, key=f"bench-{n_workers}") if args.rpc else None
    procs = []
    try:
        # One worker token per worker (a worker token may be bound to one worker's name).
        target_key = (
            _register_target(server, server.token("bench-target", kind="worker"), cores)
            if cores
            else None
        )
        with server.client(server.token("bench-user")) as user:
            jobs = []
            for i, (rows, inner, cols) in enumerate(SHAPES[: args.tasks]):
                path = folder / f"mm-{n_workers}-{i}.onnx"
                onnx.save(matmul_model(rows=rows, inner=inner, cols=cols), path)
                model = upload(user, path).json()
                body = {"model_id": model["id"], "trial_budget": args.trials}
                if target_key is not None:
                    body["target"] = target_key
                reply = user.post("/jobs", json=body)
                assert reply.status_code == 201, reply.text
                jobs.append(reply.json()["id"])
            load_before = os.getloadavg()
            cpu_before = _children_cpu()
            extra = ["--once"]
            if rpc is not None:
                extra += ["--rpc-tracker", rpc.tracker, "--rpc-key", rpc.key]
            started = time.monotonic()
            procs = []
            for i in range(n_workers):
                name = f"bench-{n_workers}-{i}"
                token = server.token(name, kind="worker")
                procs.append(start_worker(server, token, name, folder, *extra))
                if cores:  # before the worker reads its affinity (its imports take seconds)
                    os.sched_setaffinity(procs[-1].popen.pid, range(i * cores, (i + 1) * cores))
            codes = [wait_exit(p, args.timeout) for p in procs]
            wall = time.monotonic() - started
            cpu = _children_cpu() - cpu_before
            load_after = os.getloadavg()
            assert codes == [0] * n_workers, [p.text()[-2000:] for p in procs]
            leases = []
            for job_id in jobs:
                leases += user.get(
                    "/workers/leases", params={"job_id": job_id, "limit": 1000}
                ).json()["data"]
                assert user.get(f"/jobs/{job_id}").json()["status"] == "succeeded"
        tune = [x for x in leases if x["kind"] == "tune"]
        first = min(_parse_time(x["created_at"]) for x in leases)
        last = max(_parse_time(x["finished_at"]) for x in tune)
        trials = sum(x["trials_done"] for x in tune)
        window = last - first
        return {
            "workers": n_workers,
            "trials": trials,
            "window": window,
            "wall": wall,
            "cpu": cpu,
            "rate": trials / window,
            "per_cpu": trials / cpu if cpu else float("nan"),
            "leases": len(tune),
            "load_before": load_before,
            "load_after": load_after,
            "by_worker": sorted({x["worker"] for x in tune}),
        }
    finally:
        for proc in procs:
            proc.stop()
        if rpc is not None:
            rpc.stop()
        stop_server(server)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument(
        "--tasks", type=int, default=4, help=f"one-task models (at most {len(SHAPES)})"
    )
    parser.add_argument("--trials", type=int, default=8, help="trials per task")
    parser.add_argument("--population", type=int, default=64, help="search population")
    parser.add_argument("--rpc", type=int, default=0, help="measure through K RPC servers")
    parser.add_argument(
        "--db",
        default=None,
        metavar="POSTGRES_URL",
        help="PostgreSQL server URL: a fresh database is made on it for each run "
        "(default: SQLite in a temporary home)",
    )
    parser.add_argument(
        "--cores-per-worker",
        type=int,
        default=0,
        metavar="K",
        help="pin each worker to K cores of its own (0: no pinning)",
    )
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not 1 <= args.tasks <= len(SHAPES):
        parser.error(f"--tasks must be 1..{len(SHAPES)}")
    usable = len(os.sched_getaffinity(0))
    if args.cores_per_worker < 0 or args.cores_per_worker * max(args.workers) > usable:
        parser.error(f"--cores-per-worker x workers must fit the {usable} usable cores")
    results = []
    with tempfile.TemporaryDirectory(prefix="tunehub-bench-workers-") as tmp:
        for n in args.workers:
            result = run_once(n, args, Path(tmp))
            results.append(result)
            print(
                f"{n} worker(s): {result['trials']} trials in {result['window']:.1f} s = "
                f"{result['rate']:.3f} trials/s, {result['per_cpu']:.3f} trials/CPU s, "
                f"load {result['load_before'][0]:.1f} -> {result['load_after'][0]:.1f}",
                flush=True,
            )
    write_results(results, args)
    return 0


def write_results(results: list[dict], args) -> None:
    today = dt.date.today().isoformat()
    out = args.out or REPO / "bench" / "results" / f"workers_{today}.md"
    base = next((r for r in results if r["workers"] == 1), results[0])
    cores = len(os.sched_getaffinity(0))
    lines = [
        f"# Remote tuning workers: measurement throughput with "
        f"{', '.join(str(r['workers']) for r in results)} workers ({today})",
        "",
        f"- machine: {_cpu_model()}, {cores} usable cores, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}",
        f"- date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}`",
        f"- work: {args.tasks} one-task jobs (matmuls of different shapes) x {args.trials} trials, "
        f"search population {args.population}; `tunehub serve --no-worker` on "
        f"{'PostgreSQL' if args.db else 'SQLite'}; "
        "workers `tunehub worker --server ... --once` over HTTP"
        + (
            f", each pinned to {args.cores_per_worker} core(s) of its own"
            if args.cores_per_worker
            else ""
        )
        + (
            f", measuring through a TVM RPC tracker with {args.rpc} RPC servers on loopback"
            if args.rpc
            else ", measuring locally"
        ),
        "- throughput: trials counted by the coordinator / window from the first lease to the last "
        "tune lease's end; CPU: user+system seconds of all worker processes and their children",
        "",
        "| workers | trials | window (s) | trials/s | speedup | efficiency (speedup/N) | "
        "trials per CPU s | worker CPU (s) | load avg before -> after (1 min) | "
        "workers that got leases |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        speedup = r["rate"] / base["rate"]
        lines.append(
            f"| {r['workers']} | {r['trials']} | {r['window']:.1f} | {r['rate']:.3f} | "
            f"{speedup:.2f} | {speedup / r['workers']:.2f} | {r['per_cpu']:.3f} | {r['cpu']:.0f} | "
            f"{r['load_before'][0]:.1f} -> {r['load_after'][0]:.1f} | {len(r['by_worker'])} |"
        )
    met = all(r["rate"] >= 0.8 * r["workers"] * base["rate"] for r in results)
    lines += [
        "",
        f"Goal throughput(N) >= 0.8 N throughput(1): {'met' if met else 'not met'} on this machine "
        f"({cores} cores, shared with other processes: see the load averages).",
        "",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())
