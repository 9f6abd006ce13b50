"""Task leases on both backends: start a job, lease its tasks, count batches once, expire leases
of silent workers with a compare-and-set, finalize exactly once; concurrent claimers never share
work."""

from __future__ import annotations

import threading
import time

import pytest

import db
from db import JobStatus, LeaseStatus, NewJobTask


@pytest.fixture
def target_id(storage, target):
    return storage.ensure_target(target).id


@pytest.fixture
def workloads(storage):
    return [storage.ensure_workload(f"{i:016x}", "{}", flops=float(i)).id for i in range(1, 7)]


def _started_job(storage, target_id, workloads, budgets, *, priority=0):
    job = storage.create_job(target_id=target_id, trial_budget=sum(budgets), priority=priority)
    tasks = [
        NewJobTask(workload_id=w, name=f"t{w}", flops=float(w), trial_budget=b)
        for w, b in zip(workloads, budgets)
    ]
    started = storage.start_job(job.id, tasks)
    assert started is not None and started.status == JobStatus.RUNNING
    assert storage.start_job(job.id, tasks) is None  # only one planner wins
    return started


def test_lease_batches_finish_and_finalize(storage, target_id, workloads):
    job = _started_job(storage, target_id, workloads[:2], [8, 4])
    first = storage.claim_task_lease("w1", target_id=target_id, lease_secs=60, max_trials=4)
    # Heaviest task first (FLOPs x weight), at most max_trials of it.
    assert first.kind == "tune" and first.trials == 4 and first.status == LeaseStatus.ACTIVE
    task = {t.id: t for t in storage.list_job_tasks(job.id)}[first.task_id]
    assert task.workload_id == workloads[1] and task.status == "running" and task.leased_by == "w1"

    counted = storage.record_lease_batch(
        first.id, batch=0, trials=2, best_mean_secs=2e-3, lease_secs=60
    )
    assert counted.counted and counted.lease.trials_done == 2 and counted.job_status == "running"
    again = storage.record_lease_batch(
        first.id, batch=0, trials=2, best_mean_secs=1e-3, lease_secs=60
    )
    assert not again.counted and again.lease.trials_done == 2  # a retried upload counts once
    with pytest.raises(db.ConflictError):
        storage.record_lease_batch(first.id, batch=5, trials=2, best_mean_secs=None, lease_secs=60)
    storage.record_lease_batch(first.id, batch=1, trials=2, best_mean_secs=1e-3, lease_secs=60)
    assert storage.get_job(job.id).trials_done == 4

    second = storage.claim_task_lease("w2", target_id=target_id, lease_secs=60, max_trials=64)
    assert second.task_id != first.task_id and second.trials == 8
    assert storage.claim_task_lease("w3", target_id=target_id, lease_secs=60, max_trials=4) is None
    assert storage.claim_finalize_lease("w3", target_id=target_id, lease_secs=60) is None

    done = storage.finish_lease(first.id, "done")
    assert done.status == "done" and done.finished_at is not None
    with pytest.raises(db.InvalidTransitionError):
        storage.finish_lease(first.id, "done")
    # The search ended early (2 of 8 trials): the task is finished, not leased forever.
    storage.record_lease_batch(second.id, batch=0, trials=2, best_mean_secs=5e-3, lease_secs=60)
    storage.finish_lease(second.id, "done")
    tasks = storage.list_job_tasks(job.id)
    assert [t.status for t in tasks] == ["succeeded", "succeeded"]
    assert {t.trials_done for t in tasks} == {4, 2} and min(t.best_mean_secs for t in tasks) == 1e-3

    final = storage.claim_finalize_lease("w3", target_id=target_id, lease_secs=60)
    assert final.kind == "finalize" and final.job_id == job.id
    assert storage.claim_finalize_lease("w1", target_id=target_id, lease_secs=60) is None
    artifact = storage.complete_finalize(
        final.id, path="/a", sha256="ab" * 32, size=3, manifest_json="{}", verified=True
    )
    finished = storage.get_job(job.id)
    assert finished.status == "succeeded" and finished.worker == "w3" and artifact.verified
    assert storage.count_open_jobs(target_id=target_id) == 0
    assert [lease.id for lease in storage.list_leases(job_id=job.id)] == [
        first.id,
        second.id,
        final.id,
    ]


def test_one_lease_covers_several_tasks_of_a_job(storage, target_id, workloads):
    """Issue 33: a tune lease covers up to ``max_tasks`` queued tasks of one job (the heaviest
    first); each batch counts on the task it measured; its end moves every task on; a task left
    queued after its job's budget is spent is finished by the next claim, not leased again."""
    job = _started_job(storage, target_id, workloads[:3], [4, 4, 4])
    other = _started_job(storage, target_id, workloads[3:4], [4])
    lease = storage.claim_task_lease(
        "w1", target_id=target_id, lease_secs=60, max_trials=64, max_tasks=5
    )
    tasks = {t.id: t for t in storage.list_job_tasks(job.id)}
    # One job's tasks only, heaviest first, the first in task_id; trials: all three budgets.
    assert set(lease.task_ids) == set(tasks) and lease.task_id == lease.task_ids[0]
    assert [tasks[t].workload_id for t in lease.task_ids] == workloads[2::-1]
    assert lease.trials == 12 and lease.work_key == f"task:{lease.task_id}"
    assert all(t.status == "running" and t.leased_by == "w1" for t in tasks.values())
    assert storage.get_lease(lease.id).task_ids == lease.task_ids
    # The gradient scheduler gives the heaviest task more than its allotment.
    heavy, middle, light = lease.task_ids
    storage.record_lease_batch(
        lease.id, batch=0, trials=6, best_mean_secs=2e-3, lease_secs=60, task_id=heavy
    )
    storage.record_lease_batch(
        lease.id, batch=1, trials=4, best_mean_secs=1e-3, lease_secs=60, task_id=middle
    )
    with pytest.raises(db.ConflictError):  # not a task of this lease
        storage.record_lease_batch(
            lease.id, batch=2, trials=1, best_mean_secs=None, lease_secs=60, task_id=10**6
        )
    storage.record_lease_batch(
        lease.id, batch=2, trials=5, best_mean_secs=None, lease_secs=60, task_id=light
    )
    tasks = {t.id: t for t in storage.list_job_tasks(job.id)}
    # The lease counts no more than its 12 trials: the last batch counted the 2 left.
    assert [tasks[t].trials_done for t in lease.task_ids] == [6, 4, 2]
    assert tasks[heavy].best_mean_secs == 2e-3 and tasks[middle].best_mean_secs == 1e-3
    assert storage.get_job(job.id).trials_done == 12
    storage.finish_lease(lease.id, "done")
    tasks = {t.id: t for t in storage.list_job_tasks(job.id)}
    # Every task is finished: the light one is short of its own budget, but its job's is spent.
    assert {t.status for t in tasks.values()} == {"succeeded"}
    nxt = storage.claim_task_lease(
        "w1", target_id=target_id, lease_secs=60, max_trials=64, max_tasks=5
    )
    assert nxt.job_id == other.id and len(nxt.task_ids) == 1
    # A returned lease requeues its tasks.
    storage.finish_lease(nxt.id, "returned")
    assert [t.status for t in storage.list_job_tasks(other.id)] == ["queued"]


def test_a_pinned_job_goes_to_its_worker_only(storage, target_id, workloads):
    """A ``tunehub tune`` run's job is pinned to its worker: another worker of the target never
    leases its tasks, its preview or its finalize step; claims can be limited to one job."""
    free = _started_job(storage, target_id, workloads[:1], [4])
    job = storage.create_job(
        target_id=target_id, trial_budget=8, pinned_to=lambda job_id: f"run-{job_id}"
    )
    assert job.worker == f"run-{job.id}"
    tasks = [
        NewJobTask(workload_id=w, name=f"t{w}", flops=float(w), trial_budget=4)
        for w in workloads[1:3]
    ]
    started = storage.start_job(job.id, tasks)
    assert started.worker == f"run-{job.id}"  # starting keeps the pin
    claim = dict(target_id=target_id, lease_secs=60, max_trials=64, max_tasks=5)
    # Another worker gets the free job's task, then nothing: not the pinned job's work.
    other = storage.claim_task_lease("w", **claim)
    assert other.job_id == free.id
    storage.finish_lease(other.id, "returned")
    assert storage.claim_task_lease("w", **claim, job_id=job.id) is None
    assert storage.claim_preview_lease("w", target_id=target_id, lease_secs=60).job_id == free.id
    # Its own worker, limited to its job, gets both tasks in one lease.
    own = storage.claim_task_lease(f"run-{job.id}", **claim, job_id=job.id)
    assert own.job_id == job.id and len(own.task_ids) == 2
    storage.record_lease_batch(own.id, batch=0, trials=8, best_mean_secs=1e-3, lease_secs=60)
    storage.finish_lease(own.id, "done")
    assert storage.claim_finalize_lease("w2", target_id=target_id, lease_secs=60) is None
    final = storage.claim_finalize_lease(
        f"run-{job.id}", target_id=target_id, lease_secs=60, job_id=job.id
    )
    assert final.kind == "finalize" and final.job_id == job.id


def test_the_coordinator_shares_queued_tasks_among_idle_workers(
    storage, target, target_id, workloads
):
    """Issue 33: a lease covers several tasks, but no more than an even share of the queued
    tasks among the target's idle live workers; a job pinned to a run is never planned or
    leased by another worker, and its own worker gets its work only."""
    from tuner.jobs.coordinator import LeasePolicy, lease_work, register
    from tuner.jobs.protocol import TargetInfo

    policy = LeasePolicy(tasks_per_lease=8, previews=False)
    for name in ("a", "b", "c"):
        register(storage, name, TargetInfo.of(target), "{}")
    pinned = storage.create_job(
        target_id=target_id, trial_budget=4, model_id=None, pinned_to=lambda i: f"run-{i}"
    )
    job = _started_job(storage, target_id, workloads[:6], [4] * 6)
    offers = [lease_work(storage, name, policy)[0] for name in ("a", "b", "c")]
    # Six queued tasks: two for each of three idle workers, all of the started job.
    assert [len(o.leased_tasks) for o in offers] == [2, 2, 2]
    assert {o.job_id for o in offers} == {job.id}
    assert len({t.task_id for o in offers for t in o.leased_tasks}) == 6
    assert offers[0].leased_tasks[0].task_id == offers[0].task_id
    # The pinned job was not planned by any of them (it would have failed: it has no model).
    assert storage.get_job(pinned.id).status == "queued"
    register(storage, "d", TargetInfo.of(target), "{}")
    assert lease_work(storage, "d", policy)[0] is None
    assert lease_work(storage, "d", policy, job_id=job.id)[0] is None  # all leased


def test_preview_lease_once_per_tuning_job(storage, target_id, workloads):
    """A running job with tasks to tune has one preview lease at a time; its artifact is the
    job's preview (the job goes on); a failed or returned preview is tried again, two leases in
    all; a job whose tasks are all finished gets none, and a preview lease's end moves no
    task."""
    job = _started_job(storage, target_id, workloads[:2], [4, 4])
    preview = storage.claim_preview_lease("w1", target_id=target_id, lease_secs=60)
    assert preview.kind == "preview" and preview.job_id == job.id and preview.task_id is None
    assert storage.claim_preview_lease("w2", target_id=target_id, lease_secs=60) is None
    storage.finish_lease(preview.id, "failed", error="verification failed")
    assert storage.get_job(job.id).status == "running"
    assert {t.status for t in storage.list_job_tasks(job.id)} == {"queued"}
    again = storage.claim_preview_lease("w2", target_id=target_id, lease_secs=60)
    assert again is not None and again.id != preview.id
    with pytest.raises(db.ConflictError):
        storage.complete_finalize(
            again.id, path="/p", sha256="cd" * 32, size=1, manifest_json="{}", verified=True
        )
    artifact = storage.complete_preview(
        again.id, path="/p", sha256="cd" * 32, size=1, manifest_json="{}", verified=True
    )
    assert artifact.kind == "preview" and storage.get_lease(again.id).status == "done"
    assert storage.get_job(job.id).status == "running"  # the job goes on tuning
    assert storage.claim_preview_lease("w3", target_id=target_id, lease_secs=60) is None
    with pytest.raises(db.ConflictError):  # a tune lease is not a preview lease
        lease = storage.claim_task_lease("w3", target_id=target_id, lease_secs=60, max_trials=4)
        storage.complete_preview(
            lease.id, path="/q", sha256="ef" * 32, size=1, manifest_json="{}", verified=True
        )

    other = _started_job(storage, target_id, workloads[2:3], [4])
    for name, outcome in (("w4", "returned"), ("w5", "failed")):  # two leases: no third try
        lease = storage.claim_preview_lease(name, target_id=target_id, lease_secs=60)
        assert lease.job_id == other.id
        storage.finish_lease(lease.id, outcome, error="no compiler")
    assert storage.claim_preview_lease("w6", target_id=target_id, lease_secs=60) is None

    done = _started_job(storage, target_id, workloads[3:4], [4])
    claims = iter(range(100))  # a worker holds one lease at a time: one worker per claim
    lease = storage.claim_task_lease("w7", target_id=target_id, lease_secs=60, max_trials=64)
    while lease is not None and lease.job_id != done.id:
        lease = storage.claim_task_lease(
            f"w7-{next(claims)}", target_id=target_id, lease_secs=60, max_trials=64
        )
    storage.record_lease_batch(lease.id, batch=0, trials=4, best_mean_secs=1e-3, lease_secs=60)
    storage.finish_lease(lease.id, "done")
    assert storage.claim_preview_lease("w8", target_id=target_id, lease_secs=60) is None
    assert [a.kind for a in storage.list_artifacts(job.id)] == ["preview"]


def test_expired_lease_requeues_the_rest_once(storage, target_id, workloads):
    job = _started_job(storage, target_id, workloads[:1], [12])
    lost = storage.claim_task_lease("dead", target_id=target_id, lease_secs=1, max_trials=12)
    storage.record_lease_batch(lost.id, batch=0, trials=4, best_mean_secs=1e-3, lease_secs=1)
    assert storage.reap_expired_leases() == []  # not expired yet
    time.sleep(2.2)
    reaped = storage.reap_expired_leases()
    assert reaped == [lost.id] and storage.reap_expired_leases() == []
    assert storage.get_lease(lost.id).status == "expired"
    # Late upload of the dead lease: counted nowhere (its records would still be stored).
    late = storage.record_lease_batch(lost.id, batch=1, trials=4, best_mean_secs=None, lease_secs=1)
    assert not late.counted
    with pytest.raises(db.InvalidTransitionError):
        storage.finish_lease(lost.id, "done")
    retry = storage.claim_task_lease("alive", target_id=target_id, lease_secs=60, max_trials=64)
    assert retry.task_id == lost.task_id and retry.trials == 8  # only what was not counted
    # A heartbeat keeps a lease alive; a restarted worker's leases are released at once.
    assert [lease.id for lease in storage.renew_leases("alive", lease_secs=60)] == [retry.id]
    assert storage.release_worker_leases("alive") == [retry.id]
    task = storage.list_job_tasks(job.id)[0]
    assert task.status == "queued" and task.trials_done == 4 and task.leased_by is None


def test_a_task_that_keeps_losing_its_worker_fails(storage, target_id, workloads):
    job = _started_job(storage, target_id, workloads[:1], [8])
    for attempt in range(3):
        lease = storage.claim_task_lease(
            f"w{attempt}", target_id=target_id, lease_secs=60, max_trials=8
        )
        storage.finish_lease(lease.id, "failed", error="segfault", max_attempts=3)
    assert storage.list_job_tasks(job.id)[0].status == "failed"
    assert storage.claim_task_lease("w9", target_id=target_id, lease_secs=60, max_trials=8) is None
    # Every task is finished (one failed): the job can still be compiled with what exists.
    final = storage.claim_finalize_lease("w9", target_id=target_id, lease_secs=60)
    storage.finish_lease(final.id, "failed", error="verification failed")
    job = storage.get_job(job.id)
    assert job.status == "failed" and "verification failed" in job.error


def test_cancelled_job_stops_leasing(storage, target_id, workloads):
    job = _started_job(storage, target_id, workloads[:2], [4, 4])
    lease = storage.claim_task_lease("w1", target_id=target_id, lease_secs=60, max_trials=4)
    storage.transition_job(job.id, JobStatus.CANCELLED, error="cancelled by the user")
    result = storage.record_lease_batch(
        lease.id, batch=0, trials=4, best_mean_secs=None, lease_secs=60
    )
    assert result.job_status == "cancelled"
    assert storage.claim_task_lease("w2", target_id=target_id, lease_secs=60, max_trials=4) is None
    storage.finish_lease(lease.id, "cancelled")
    assert {t.status for t in storage.list_job_tasks(job.id)} == {"cancelled", "queued"}
    assert storage.claim_finalize_lease("w2", target_id=target_id, lease_secs=60) is None


def test_concurrent_claimers_never_share_work(storage, target_id, workloads, db_url):
    job = _started_job(storage, target_id, workloads, [4] * len(workloads))
    leases: list = []
    finals: list = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        with db.open_storage(db_url) as own:
            while lease := own.claim_task_lease(
                name, target_id=target_id, lease_secs=60, max_trials=4
            ):
                own.record_lease_batch(
                    lease.id, batch=0, trials=4, best_mean_secs=None, lease_secs=60
                )
                own.finish_lease(lease.id, "done")
                with lock:
                    leases.append(lease)
            final = own.claim_finalize_lease(name, target_id=target_id, lease_secs=60)
            if final is not None:
                with lock:
                    finals.append(final)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(lease.task_id for lease in leases) == sorted(
        t.id for t in storage.list_job_tasks(job.id)
    )
    assert len(finals) == 1 and finals[0].job_id == job.id  # finalized exactly once
    assert storage.get_job(job.id).trials_done == 4 * len(workloads)
