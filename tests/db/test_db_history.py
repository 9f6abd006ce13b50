"""``TuningStorage.job_history`` on both backends: a job's records reduced to counts and the
records that lowered their workload's best, read from any record id, in pages; other jobs'
records never count; the read is a range scan of the job-history index."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import text

from db import NewTuningRecord


@pytest.fixture
def setup(storage, target):
    target_id = storage.ensure_target(target).id
    wa = storage.ensure_workload("00000000000000aa", "{}").id
    wb = storage.ensure_workload("00000000000000bb", "{}").id
    job = storage.create_job(target_id=target_id, trial_budget=100, owner="u")
    other = storage.create_job(target_id=target_id, trial_budget=100, owner="u")
    return storage, target_id, (wa, wb), job.id, other.id


# (workload index, latency ms or None for a failed candidate), one batch per line
BATCHES = [
    [(0, 5.0), (0, 7.0), (0, None), (0, 4.0)],
    [(1, 9.0), (1, 3.0), (1, 3.5)],
    [(0, 4.5), (0, 2.0), (0, None), (0, 1.0)],
    [(1, 2.5), (1, 2.9), (1, 1.5)],
]


def _commit(storage, target_id, workloads, job_id, other_id):
    serial = 0
    for batch in BATCHES:
        records = []
        for index, latency in batch:
            serial += 1
            records.append(
                NewTuningRecord(
                    workloads[index],
                    target_id,
                    f'[["t{serial}"]]',
                    None if latency is None else [latency * 1e-3],
                    error_text="failed" if latency is None else None,
                    job_id=job_id,
                )
            )
        storage.commit_records(records)
        # Another job's records in between must not count.
        storage.commit_records(
            [
                NewTuningRecord(
                    workloads[0], target_id, f'[["o{serial}"]]', [0.1e-3], job_id=other_id
                )
            ]
        )


def _expected(rows, before=0):
    best, points = {}, []
    for n, row in enumerate(rows, start=before + 1):
        if row.mean_secs is not None and row.mean_secs < best.get(row.workload_id, math.inf):
            best[row.workload_id] = row.mean_secs
            points.append((row.id, n, row.workload_id, row.mean_secs))
    return points


def test_history_points_counts_and_pages(setup):
    storage, target_id, workloads, job_id, other_id = setup
    empty = storage.job_history(job_id)
    assert (empty.records, empty.last_id, empty.more, empty.points) == (0, 0, False, ())
    assert empty.first_measured_at is None and storage.job_history(10**6).records == 0

    _commit(storage, target_id, workloads, job_id, other_id)
    rows = storage.list_records(job_id=job_id, limit=1000)
    assert len(rows) == 14
    full = storage.job_history(job_id)
    assert (full.records, full.failed, full.trials_before, full.more) == (14, 2, 0, False)
    assert full.last_id == rows[-1].id and full.after_id == 0
    got = [(p.id, p.trial, p.workload_id, p.mean_secs) for p in full.points]
    assert got == _expected(rows)
    # (Ids within a batch follow the storage's lock order, not the batch order.)
    final = {p.workload_id: round(p.mean_secs * 1e3, 6) for p in full.points}
    assert final == {workloads[0]: 1.0, workloads[1]: 1.5}
    assert len(full.points) >= 4
    assert full.first_measured_at <= full.last_measured_at
    assert all(p.measured_at is not None and p.measured_at.tzinfo for p in full.points)

    # From the middle, cut at a limit: trials continue, points are the page's own improvements.
    middle = rows[5].id
    page = storage.job_history(job_id, after_id=middle, limit=4)
    assert (page.trials_before, page.records, page.more, page.last_id) == (6, 4, True, rows[9].id)
    assert [(p.id, p.trial) for p in page.points] == [
        (r, n) for r, n, _, _ in _expected(rows[6:10], 6)
    ]
    tail = storage.job_history(job_id, after_id=page.last_id)
    assert (tail.trials_before, tail.records, tail.more) == (10, 4, False)
    assert storage.job_history(job_id, after_id=tail.last_id).last_id == tail.last_id

    other = storage.job_history(other_id)
    assert other.records == 4 and [p.trial for p in other.points] == [1]


def test_history_reads_the_job_index(setup, backend):
    storage, *_rest, job_id, _other = setup
    query = (
        "SELECT id, workload_id, mean_secs FROM tuning_records "
        f"WHERE job_id = {job_id} AND id > 0 ORDER BY id"
    )
    with storage.engine.connect() as conn:
        if backend == "sqlite":
            plan = " ".join(
                str(row[-1]) for row in conn.execute(text("EXPLAIN QUERY PLAN " + query))
            )
            assert "COVERING INDEX ix_tuning_records_job_history" in plan, plan
        else:
            conn.execute(text("SET enable_seqscan = off"))
            plan = " ".join(row[0] for row in conn.execute(text("EXPLAIN " + query)))
            assert "ix_tuning_records_job_history" in plan and "Sort" not in plan, plan
