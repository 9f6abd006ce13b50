"""Must-show: 4 processes committing concurrently; every record is present exactly once, and a
trace measured by several workers keeps its best measurement."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from db.models import TuningRecordModel

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
N_WORKERS, N_SHARED, N_UNIQUE = 4, 120, 120

sys.path.insert(0, str(HERE))
from commit_worker import shared_secs  # noqa: E402


def test_four_processes_commit_concurrently(storage, db_url, target, tmp_path):
    t = storage.ensure_target(target)
    w = storage.ensure_workload("0000000000000c0c", "{}")
    go = tmp_path / "go"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "commit_worker.py"),
                db_url,
                str(w.id),
                str(t.id),
                str(i),
                str(go),
                str(N_SHARED),
                str(N_UNIQUE),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(N_WORKERS)
    ]
    go.touch()
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]

    assert storage.count_records() == N_SHARED + N_WORKERS * N_UNIQUE
    table = TuningRecordModel.__table__
    with storage.engine.connect() as conn:
        dupes = conn.execute(
            select(table.c.trace_hash, func.count())
            .group_by(table.c.workload_id, table.c.target_id, table.c.trace_hash)
            .having(func.count() > 1)
        ).all()
    assert dupes == []
    rows = {r.trace_json: r for r in storage.iter_records()}
    for j in range(N_SHARED):
        best = min(shared_secs(j, i) for i in range(N_WORKERS))
        assert rows[f'[["shared",{j}]]'].mean_secs == best, j
    for i in range(N_WORKERS):
        for j in range(N_UNIQUE):
            assert rows[f'[["w{i}",{j}]]'].worker == f"w{i}"
    top = storage.top_k(w.id, t.id, 5)
    assert [r.mean_secs for r in top] == sorted(r.mean_secs for r in rows.values())[:5]
