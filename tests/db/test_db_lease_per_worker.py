"""Issue 31 (cases 7 and 10) on both backends: a worker holds one active lease at a time (a
partial unique index; claims in a row or at once never give one worker two), the migration
that adds the index mends a database where a worker already held several, and a tune lease
counts no more trials than it was allotted."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

import db
from db import JobStatus, LeaseStatus, NewJobTask
from db.engine import create_storage_engine


@pytest.fixture
def target_id(storage, target):
    return storage.ensure_target(target).id


def _job(storage, target_id, budgets: list[int]):
    workloads = [
        storage.ensure_workload(f"{i:016x}", "{}", flops=float(i)).id
        for i in range(1, len(budgets) + 1)
    ]
    job = storage.create_job(target_id=target_id, trial_budget=sum(budgets))
    tasks = [
        NewJobTask(workload_id=w, name=f"t{w}", flops=float(w), trial_budget=b)
        for w, b in zip(workloads, budgets)
    ]
    started = storage.start_job(job.id, tasks)
    assert started is not None
    return started


def _active(storage, worker: str) -> list:
    return storage.list_leases(worker=worker, status=LeaseStatus.ACTIVE, limit=100)


def test_claims_in_a_row_give_one_lease(storage, target_id):
    job = _job(storage, target_id, [4, 4, 4])
    first = storage.claim_task_lease("w1", target_id=target_id, lease_secs=60, max_trials=4)
    assert first is not None
    for claim in (
        lambda: storage.claim_task_lease("w1", target_id=target_id, lease_secs=60, max_trials=4),
        lambda: storage.claim_preview_lease("w1", target_id=target_id, lease_secs=60),
        lambda: storage.claim_finalize_lease("w1", target_id=target_id, lease_secs=60),
    ):
        with pytest.raises(db.LeaseHeldError) as info:
            claim()
        assert info.value.lease_id == first.id and isinstance(info.value, db.ConflictError)
    assert [lease.id for lease in _active(storage, "w1")] == [first.id]
    # Nothing else was claimed: the other tasks are still queued for other workers.
    statuses = sorted(t.status for t in storage.list_job_tasks(job.id))
    assert statuses == ["queued", "queued", "running"]
    second = storage.claim_task_lease("w2", target_id=target_id, lease_secs=60, max_trials=4)
    assert second is not None and second.task_id != first.task_id
    # Once its lease ended, the worker takes the next piece of work.
    storage.finish_lease(first.id, "returned")
    again = storage.claim_task_lease("w1", target_id=target_id, lease_secs=60, max_trials=4)
    assert again is not None and [lease.id for lease in _active(storage, "w1")] == [again.id]


def test_claims_at_once_give_one_lease(storage, target_id, db_url):
    job = _job(storage, target_id, [4] * 6)
    claimers = 6
    barrier = threading.Barrier(claimers)
    won: list = []
    held: list = []
    other: list = []
    lock = threading.Lock()

    def claim() -> None:
        with db.open_storage(db_url) as own:
            barrier.wait(timeout=30)
            try:
                lease = own.claim_task_lease(
                    "busy", target_id=target_id, lease_secs=60, max_trials=4
                )
            except db.LeaseHeldError as err:
                with lock:
                    held.append(err)
            except Exception as err:  # noqa: BLE001 - reported below
                with lock:
                    other.append(err)
            else:
                with lock:
                    won.append(lease)

    threads = [threading.Thread(target=claim) for _ in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not other, other
    assert len(won) == 1 and len(held) == claimers - 1, (won, held)
    assert [lease.id for lease in _active(storage, "busy")] == [won[0].id]
    tasks = storage.list_job_tasks(job.id)
    assert [t.id for t in tasks if t.status == JobStatus.RUNNING] == [won[0].task_id]
    assert {t.leased_by for t in tasks if t.status == JobStatus.QUEUED} == {None}


def test_migration_keeps_the_newest_of_a_workers_leases(db_url):
    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine, "0010_preview_artifacts")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO targets (key, kind, target_json, fingerprint_json, tvm_version) "
                    "VALUES ('00000000000000ff', 'cpu', '{}', '{}', 'x')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO workloads (key, mod_json) "
                    "VALUES ('0000000000000001', '{}'), ('0000000000000002', '{}')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO jobs (target_id, status, trial_budget, owner) "
                    "VALUES (1, 'running', 16, 'alice')"
                )
            )
            for workload in (1, 2):
                conn.execute(
                    text(
                        "INSERT INTO job_tasks (job_id, workload_id, name, trial_budget, "
                        "status, leased_by) VALUES (1, :w, :n, 8, 'running', 'greedy')"
                    ),
                    {"w": workload, "n": f"t{workload}"},
                )
            for task in (1, 2):
                conn.execute(
                    text(
                        "INSERT INTO task_leases (job_id, task_id, kind, work_key, worker, "
                        "status, trials, expires_at) VALUES (1, :t, 'tune', :k, 'greedy', "
                        "'active', 8, CURRENT_TIMESTAMP)"
                    ),
                    {"t": task, "k": f"task:{task}"},
                )
        assert db.upgrade(engine) == db.head_revision()
    finally:
        engine.dispose()
    with db.open_storage(db_url) as storage:
        leases = storage.list_leases(job_id=1)
        assert [(lease.task_id, lease.status) for lease in leases] == [
            (1, "returned"),
            (2, "active"),
        ]
        tasks = {t.id: t for t in storage.list_job_tasks(1)}
        assert tasks[1].status == "queued" and tasks[1].leased_by is None
        assert tasks[2].status == "running" and tasks[2].leased_by == "greedy"
        with pytest.raises(db.LeaseHeldError):
            storage.claim_task_lease("greedy", target_id=1, lease_secs=60, max_trials=8)


def test_a_lease_counts_no_more_than_its_allotment(storage, target_id):
    job = _job(storage, target_id, [64])
    lease = storage.claim_task_lease("w1", target_id=target_id, lease_secs=60, max_trials=8)
    assert lease.trials == 8
    first = storage.record_lease_batch(
        lease.id, batch=0, trials=6, best_mean_secs=None, lease_secs=60
    )
    assert first.counted and first.lease.trials_done == 6
    over = storage.record_lease_batch(
        lease.id, batch=1, trials=10, best_mean_secs=None, lease_secs=60
    )
    assert over.counted and over.lease.trials_done == 8  # only the 2 left of its 8
    beyond = storage.record_lease_batch(
        lease.id, batch=2, trials=8, best_mean_secs=None, lease_secs=60
    )
    assert beyond.lease.trials_done == 8
    assert storage.get_job(job.id).trials_done == 8
    assert storage.list_job_tasks(job.id)[0].trials_done == 8
