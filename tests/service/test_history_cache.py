"""``service.history_cache``: a whole-history read answered from a kept prefix plus the new
records equals a full read from the database, every time; pages cut at a limit and polls from
an id go to the database; the least recently read jobs are dropped first."""

from __future__ import annotations

import random

import pytest

import db
from service.history_cache import HistoryCache, extend


@pytest.fixture
def storage(tmp_path):
    with db.open_storage(f"sqlite:///{tmp_path / 'h.db'}", upgrade=True) as opened:
        yield opened


def _job_with_records(storage, target, n_workloads=3):
    target_id = storage.ensure_target(target).id
    workloads = [storage.ensure_workload(f"{i:016x}", "{}").id for i in range(1, n_workloads + 1)]
    job = storage.create_job(target_id=target_id, trial_budget=10**6, owner="u")
    rng = random.Random(job.id)
    serial = [0]

    def commit(n: int) -> None:
        records = []
        for _ in range(n):
            serial[0] += 1
            latency = None if rng.random() < 0.1 else rng.uniform(1e-4, 1e-2)
            records.append(
                db.NewTuningRecord(
                    rng.choice(workloads),
                    target_id,
                    f'[["r{job.id}-{serial[0]}"]]',
                    None if latency is None else [latency],
                    job_id=job.id,
                )
            )
        storage.commit_records(records)

    return job.id, commit


@pytest.fixture(scope="module")
def target():
    from compiler.target import cpu_target

    return cpu_target(2)


def test_whole_reads_from_a_prefix_equal_full_reads(storage, target) -> None:
    cache = HistoryCache(max_jobs=4)
    job_id, commit = _job_with_records(storage, target)
    assert cache.read(storage, job_id).records == 0  # an empty history is not kept
    for batch in (50, 1, 0, 120, 7):
        commit(batch)
        assert cache.read(storage, job_id) == storage.job_history(job_id)
    full = storage.job_history(job_id)
    # Polls and limited pages are the database's answers.
    assert cache.read(storage, job_id, after_id=full.points[2].id) == storage.job_history(
        job_id, after_id=full.points[2].id
    )
    cut = cache.read(storage, job_id, limit=40)
    assert cut == storage.job_history(job_id, limit=40) and cut.more
    # A kept prefix exactly as long as the limit, then longer than it.
    exact = cache.read(storage, job_id, limit=full.records)
    assert exact == full and not exact.more
    commit(30)
    assert cache.read(storage, job_id, limit=full.records) == storage.job_history(
        job_id, limit=full.records
    )
    grown = cache.read(storage, job_id, limit=full.records + 10)
    assert grown == storage.job_history(job_id, limit=full.records + 10) and grown.more
    assert cache.read(storage, job_id, limit=40) == storage.job_history(job_id, limit=40)


def test_prefix_is_used_and_least_recent_jobs_are_dropped(storage, target) -> None:
    cache = HistoryCache(max_jobs=2)
    jobs = []
    for _ in range(3):
        job_id, commit = _job_with_records(storage, target)
        commit(20)
        jobs.append(job_id)
        cache.read(storage, job_id)
    assert cache.jobs() == jobs[1:]

    calls = []

    class Recording:
        def job_history(self, job_id, *, after_id=0, limit=100_000):
            calls.append(after_id)
            return storage.job_history(job_id, after_id=after_id, limit=limit)

    page = cache.read(Recording(), jobs[2])
    assert calls == [page.last_id] and page == storage.job_history(jobs[2])


def test_extend_refuses_a_gap(storage, target) -> None:
    job_id, commit = _job_with_records(storage, target)
    commit(10)
    whole = storage.job_history(job_id)
    with pytest.raises(ValueError, match="does not follow"):
        extend(whole, storage.job_history(job_id, after_id=whole.last_id - 1))
