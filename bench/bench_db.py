"""Tuning-database benchmark: record commits/s and top-k latency at 10^5 and 10^6 records.

    .venv/bin/python -m bench.bench_db [--records 100000 1000000] [--backends sqlite postgresql]

Writes ``bench/results/db_<date>.md``. PostgreSQL uses ``$TUNEHUB_TEST_POSTGRES_URL`` if set,
otherwise a throwaway server started with ``scripts/postgres.sh`` (stopped at the end).

What is measured (one target, 1,000 workloads, records spread evenly, 5 % failed candidates):

- bulk commits/s: ``TuningStorage.commit_records`` in batches of 1,000 while filling the database
  (the path of workers uploading results, imports, the API); every record is new.
- single commits/s: ``MetaScheduleDatabase.commit_tuning_record`` with real ``TuningRecord``
  objects, one transaction each (what MetaSchedule's AddToDatabase callback does), measured at
  each size on a fresh workload.
- top-k latency: ``TuningStorage.top_k`` on random workloads (k=1: a compile-time query; k=100:
  what the evolutionary search asks for), and ``MetaScheduleDatabase.get_top_k`` (k=10, records
  already parsed: TVM's trace replay is paid once per record and cached).

Traces are real: those of an 8-trial tuning run of a 64x64x64 matmul, with their sampling
decisions re-drawn to make each record a distinct schedule of realistic size (~1.9 KB).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
N_WORKLOADS = 1000
BATCH = 1000
TOPK_QUERIES = 2000
SINGLE_N = 343  # real, distinct TuningRecords committed one by one at each size


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "memory": mem,
        "python": platform.python_version(),
        "load": os.getloadavg()[0],
    }


def real_traces():
    """(trace JSON objects of a real tuning run, its workload, the records)."""
    # TuneContext imports tvm.s_tir.tensor_intrin, whose CUDA and ROCm parts cost 30-120 s here
    # and are never used for an llvm target: this process gets empty stand-ins for them.
    import types

    for name in ("cuda", "rocm"):
        sys.modules.setdefault(
            f"tvm.s_tir.tensor_intrin.{name}", types.ModuleType(f"tvm.s_tir.tensor_intrin.{name}")
        )
    sys.path.insert(0, str(REPO / "tests" / "db"))
    from db_test_helpers import matmul_mod, tune_matmul

    import db
    from compiler.target import cpu_target

    target = cpu_target(2)
    with tempfile.TemporaryDirectory() as tmp:
        storage = db.open_storage(f"sqlite:///{tmp}/seed.db", upgrade=True)
        adapter = db.MetaScheduleDatabase(storage, target)
        tune_matmul(adapter, target.tvm_target(), trials=8, per_iter=4)
        rows = list(storage.iter_records(valid_only=True))
        storage.close()
    traces = [json.loads(r.trace_json) for r in rows]
    args_info = rows[0].args_info_json
    return traces, args_info, matmul_mod


def factorizations(n: int, parts: int) -> list[list[int]]:
    if parts == 1:
        return [[n]]
    out = []
    for d in range(1, n + 1):
        if n % d == 0:
            out.extend([d] + rest for rest in factorizations(n // d, parts - 1))
    return out


class TraceFactory:
    """Distinct, realistic trace JSON texts derived from real traces."""

    def __init__(self, traces: list, seed: int = 0) -> None:
        import db

        self.canonical = db.canonical_trace_json
        self.traces = traces
        self.rng = random.Random(seed)
        self.tiles = {(64, p): factorizations(64, p) for p in (2, 3, 4)}
        self.seen: set[bytes] = set()

    def _redraw(self, value):
        if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            product = 1
            for v in value:
                product *= v
            options = self.tiles.get((product, len(value)))
            if options:
                return list(self.rng.choice(options))
        if isinstance(value, int):
            return self.rng.randrange(0, 4)
        return value

    def make(self, n: int) -> list[str]:
        """``n`` traces never produced before by this factory."""
        seen = self.seen
        out: list[str] = []
        while len(out) < n:
            insts, decisions = self.rng.choice(self.traces)
            new = [[idx, self._redraw(val)] for idx, val in decisions]
            text = self.canonical([insts, new])
            digest = hashlib.blake2b(text.encode(), digest_size=16).digest()
            if digest in seen:
                continue
            seen.add(digest)
            out.append(text)
        return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def start_postgres() -> tuple[str | None, bool]:
    url = os.environ.get("TUNEHUB_TEST_POSTGRES_URL")
    if url:
        return url, False
    out = subprocess.run(
        ["bash", str(REPO / "scripts" / "postgres.sh"), "start"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    for line in out.splitlines():
        if line.startswith("export TUNEHUB_TEST_POSTGRES_URL="):
            return line.split("=", 1)[1], True
    return None, False


def fresh_database(backend: str, tmp: Path, pg_admin: str | None) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp / 'bench.db'}"
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = make_url(pg_admin).set(drivername="postgresql+psycopg")
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text('DROP DATABASE IF EXISTS "tunehub_bench" WITH (FORCE)'))
        conn.execute(text('CREATE DATABASE "tunehub_bench"'))
    engine.dispose()
    return admin.set(database="tunehub_bench").render_as_string(hide_password=False)


def drop_database(backend: str, pg_admin: str | None) -> None:
    if backend != "postgresql":
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    engine = create_engine(
        make_url(pg_admin).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT"
    )
    with engine.connect() as conn:
        conn.execute(text('DROP DATABASE IF EXISTS "tunehub_bench" WITH (FORCE)'))
    engine.dispose()


def analyze(storage) -> None:
    """What autovacuum does after a bulk load on PostgreSQL (and ANALYZE on SQLite): fresh
    statistics and, on PostgreSQL, a visibility map that allows index-only scans."""
    from sqlalchemy import text

    if storage.dialect == "postgresql":
        with storage.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE tuning_records"))
    else:
        with storage.engine.begin() as conn:
            conn.execute(text("ANALYZE"))


def database_size(storage, url: str) -> int:
    from sqlalchemy import text

    if storage.dialect == "sqlite":
        path = Path(url.split("///", 1)[1])
        return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    with storage.engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar())


def run_backend(backend, sizes, traces, args_info, matmul_mod, pg_admin, log) -> list[dict]:
    from tvm.s_tir import meta_schedule as ms

    import db
    from compiler.target import cpu_target
    from db import NewTuningRecord

    results = []
    target = cpu_target(2)
    factory = TraceFactory(traces, seed=1)
    rng = random.Random(2)
    with tempfile.TemporaryDirectory() as tmp:
        url = fresh_database(backend, Path(tmp), pg_admin)
        storage = db.open_storage(url, upgrade=True)
        t = storage.ensure_target(target)
        mod_json = __import__("tvm").ir.save_json(matmul_mod())
        workload_ids = [
            storage.ensure_workload(f"{i:016x}", mod_json, flops=524288.0, summary="bench").id
            for i in range(1, N_WORKLOADS + 1)
        ]
        adapter = db.MetaScheduleDatabase(storage, target)
        have = 0
        for size in sizes:
            per_workload = (size - have) // N_WORKLOADS
            log(f"[{backend}] filling to {size:,} records ({per_workload} per workload)...")
            fill_secs = 0.0
            filled = 0
            pending: list = []
            for wid in workload_ids:
                for trace in factory.make(per_workload):
                    failed = rng.random() < 0.05
                    secs = (1e10,) if failed else (rng.uniform(1e-5, 1e-3),) * 3
                    pending.append(NewTuningRecord(wid, t.id, trace, secs, args_info))
                    if len(pending) == BATCH:
                        start = time.perf_counter()
                        storage.commit_records(pending)
                        fill_secs += time.perf_counter() - start
                        filled += len(pending)
                        pending = []
            if pending:
                start = time.perf_counter()
                storage.commit_records(pending)
                fill_secs += time.perf_counter() - start
                filled += len(pending)
            have += filled
            analyze(storage)
            assert storage.count_records() == have + sum(r["single_n"] for r in results)
            bulk_rate = filled / fill_secs

            # Single commits through the adapter: real TuningRecords on a fresh workload.
            fresh_mod = matmul_mod(64 - 16 * (len(results) + 1))
            workload = adapter.commit_workload(fresh_mod)
            sys.path.insert(0, str(REPO / "tests" / "db"))
            from db_test_helpers import split_traces

            schedules = split_traces(fresh_mod, SINGLE_N)
            infos = list(ms.arg_info.ArgInfo.from_entry_func(fresh_mod))
            records = [
                ms.database.TuningRecord(tr, workload, [rng.uniform(1e-5, 1e-3)], None, infos)
                for tr in schedules
            ]
            start = time.perf_counter()
            for record in records:
                adapter.commit_tuning_record(record)
            single_rate = len(records) / (time.perf_counter() - start)

            def timed(fn, n):
                lat = []
                for _ in range(n):
                    wid = rng.choice(workload_ids)
                    s = time.perf_counter()
                    fn(wid)
                    lat.append((time.perf_counter() - s) * 1e3)
                return percentile(lat, 50), percentile(lat, 99)

            for wid in workload_ids[:50]:  # warm the pool and the page cache a little
                storage.top_k(wid, t.id, 1)
            k1 = timed(lambda wid: storage.top_k(wid, t.id, 1), TOPK_QUERIES)
            k100 = timed(lambda wid: storage.top_k(wid, t.id, 100), TOPK_QUERIES)
            start = time.perf_counter()
            adapter.get_top_k(workload, 100)  # cold: reads 100 rows, TVM replays each trace
            adapter_cold = (time.perf_counter() - start) * 1e3
            lat = []
            for _ in range(500):
                s = time.perf_counter()
                adapter.get_top_k(workload, 100)
                lat.append((time.perf_counter() - s) * 1e3)
            adapter_k100 = (percentile(lat, 50), percentile(lat, 99))
            row = {
                "backend": backend,
                "records": storage.count_records(),
                "bulk_per_s": bulk_rate,
                "single_per_s": single_rate,
                "single_n": len(records),
                "k1": k1,
                "k100": k100,
                "adapter_k100": adapter_k100,
                "adapter_cold_ms": adapter_cold,
                "size_mb": database_size(storage, url) / 2**20,
            }
            log(f"[{backend}] {row}")
            results.append(row)
        storage.close()
        drop_database(backend, pg_admin)
    return results


def server_versions(pg_admin: str | None) -> dict:
    import sqlite3

    out = {"sqlite": sqlite3.sqlite_version}
    if pg_admin:
        from sqlalchemy import create_engine, text
        from sqlalchemy.engine import make_url

        engine = create_engine(make_url(pg_admin).set(drivername="postgresql+psycopg"))
        with engine.connect() as conn:
            out["postgresql"] = conn.execute(text("SHOW server_version")).scalar()
            out["pg_settings"] = {
                name: conn.execute(text(f"SHOW {name}")).scalar()
                for name in ("fsync", "synchronous_commit", "shared_buffers")
            }
        engine.dispose()
    return out


def write_report(path: Path, rows: list[dict], info: dict, versions: dict, wall: float) -> None:
    lines = [
        f"# Tuning database benchmark ({info['date']})",
        "",
        f"- Machine: {info['cpu']}, {info['cores']} cores, {info['memory']} RAM; "
        f"load average {info['load']:.2f} at start (other work was running on the machine).",
        f"- Python {info['python']}; SQLite {versions['sqlite']} (WAL, synchronous=NORMAL); "
        + (
            f"PostgreSQL {versions['postgresql']} (throwaway local server, "
            + ", ".join(f"{k}={v}" for k, v in versions["pg_settings"].items())
            + ")."
            if "postgresql" in versions
            else "PostgreSQL not run."
        ),
        "- Command: `.venv/bin/python -m bench.bench_db "
        + " ".join(info["argv"])
        + f"` ({wall / 60:.1f} min).",
        f"- Data: one target, {N_WORKLOADS:,} workloads with records spread evenly, 5 % failed "
        "candidates; real traces from an 8-trial tuning run of a 64x64x64 matmul with their "
        "sampling decisions re-drawn, so every record is a distinct schedule of realistic size "
        "(full traces stored, ~1.9 KB each).",
        "- Bulk: `TuningStorage.commit_records`, batches of 1,000 new records, measured over the "
        "whole fill up to that size. Single: `MetaScheduleDatabase.commit_tuning_record`, one "
        "transaction per real `TuningRecord` (343 distinct schedules at each size, on a fresh "
        "workload).",
        f"- top_k: `TuningStorage.top_k` on random workloads, {TOPK_QUERIES:,} queries each; "
        "adapter: `MetaScheduleDatabase.get_top_k(workload, 100)` (what the evolutionary search "
        "asks for each round) on the 343-record workload, warm: ids from the index, parsed "
        "`TuningRecord`s from the adapter's cache. The cold first call (100 rows read and replayed "
        "by TVM) is in the last column.",
        "- After each fill: `VACUUM ANALYZE tuning_records` on PostgreSQL (what autovacuum does "
        "after a bulk insert; it makes the adapter's id-only top-k an index-only scan), `ANALYZE` "
        "on SQLite.",
        "- Goal (issue #3): >= 2,000 commits/s, p99 top-k <= 10 ms.",
        "",
        "| backend | records | bulk commits/s | single commits/s (adapter) | top_k k=1 p50 / p99 "
        "ms | top_k k=100 p50 / p99 ms | adapter get_top_k k=100 warm p50 / p99 ms | size on disk "
        "| adapter get_top_k k=100 cold ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['records']:,} | {r['bulk_per_s']:,.0f} | "
            f"{r['single_per_s']:,.0f} | {r['k1'][0]:.2f} / {r['k1'][1]:.2f} | "
            f"{r['k100'][0]:.2f} / {r['k100'][1]:.2f} | "
            f"{r['adapter_k100'][0]:.2f} / {r['adapter_k100'][1]:.2f} | {r['size_mb']:,.0f} MiB | "
            f"{r['adapter_cold_ms']:.0f} |"
        )
    lines.append("")
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument(
        "--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    sizes = sorted(args.records)

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    started = time.perf_counter()
    info = machine()
    info["date"] = dt.date.today().isoformat()
    info["argv"] = sys.argv[1:] if argv is None else argv
    log("tuning 8 trials for real traces")
    traces, args_info, matmul_mod = real_traces()
    log(
        f"{len(traces)} real traces, {sum(len(json.dumps(t)) for t in traces) // len(traces)} B avg"
    )
    pg_admin, started_pg = (None, False)
    if "postgresql" in args.backends:
        pg_admin, started_pg = start_postgres()
        if pg_admin is None:
            log("PostgreSQL unavailable: skipping it")
    rows = []
    try:
        for backend in args.backends:
            if backend == "postgresql" and pg_admin is None:
                continue
            rows += run_backend(backend, sizes, traces, args_info, matmul_mod, pg_admin, log)
        versions = server_versions(pg_admin)
    finally:
        if started_pg:
            subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh"), "stop"], check=False)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"db_{info['date']}.md"
    write_report(out, rows, info, versions, time.perf_counter() - started)
    log(f"wrote {out}")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
