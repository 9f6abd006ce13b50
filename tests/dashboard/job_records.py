"""Tuning records for a job, written through the storage API as a worker writes them.

The dashboard's tests and its benchmark need jobs with many records without hours of tuning:
:class:`RecordWriter` takes a queued job, claims it the way a worker does (``start_job`` with
job tasks from the model's task list, then one ``claim_task_lease`` per task), then commits
batches of records tagged with the job and updates task and job progress after each batch, like
:class:`tuner.jobs.job.JobRowWriter`. Latencies follow a tuning curve (fast early improvements, a
floor set by the task's FLOPs) with noise and ~5 % failed candidates; traces are distinct JSON
lists, so every record is a new row. Nothing is measured: this stands in for the measuring, not
for the storage, the API or the pages under test.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import db


@dataclass
class RecordWriter:
    storage: db.TuningStorage
    job_id: int
    worker: str = ""  # default: records-writer-<job id>
    seed: int = 0
    failure_rate: float = 0.05
    batch_size: int = 16
    rng: random.Random = field(init=False)
    tasks: list[db.JobTask] = field(init=False, default_factory=list)
    trials: dict[int, int] = field(init=False, default_factory=dict)
    best: dict[int, float] = field(init=False, default_factory=dict)
    serial: int = field(init=False, default=0)
    target_id: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.worker = self.worker or f"records-writer-{self.job_id}"

    def start(self) -> list[db.JobTask]:
        """Start the job (it must be queued) and lease each of its tasks to this writer."""
        job = self.storage.get_job(self.job_id)
        assert job is not None and job.model_id is not None, "a queued job of an uploaded model"
        self.target_id = job.target_id
        self.storage.register_worker(
            self.worker, fingerprint_json='{"cores": 2, "writer": "test"}', target_id=job.target_id
        )
        links = self.storage.model_workloads(job.model_id)
        new = [
            db.NewJobTask(
                workload_id=link.workload_id,
                name=link.task_name,
                weight=link.weight,
                flops=self.storage.get_workload_by_id(link.workload_id).flops,
                trial_budget=job.trial_budget,
            )
            for link in links
        ]
        started = self.storage.start_job(self.job_id, new)
        assert started is not None, "the job was not queued"
        for index, _ in enumerate(new):
            # A worker holds one lease at a time: the writer holds the first task's, helpers
            # named after it the others'.
            lease = self.storage.claim_task_lease(
                self.worker if index == 0 else f"{self.worker}-{index}",
                target_id=job.target_id,
                lease_secs=3600,
                max_trials=job.trial_budget,
            )
            assert lease is not None and lease.job_id == self.job_id, "another job's task was next"
        self.tasks = self.storage.list_job_tasks(self.job_id)
        return self.tasks

    def _latency(self, task: db.JobTask) -> float | None:
        if self.rng.random() < self.failure_rate:
            return None
        floor = max(2e-6, (task.flops or 1e6) / 150e9)  # ~150 GFLOP/s at best
        k = self.trials.get(task.id, 0)
        curve = floor * (1 + 30 * math.exp(-k / 40) + 2 * math.exp(-k / 400))
        return curve * math.exp(self.rng.gauss(0, 0.25))

    def commit(self, n: int) -> None:
        """Measure ``n`` more candidates in batches of ``batch_size`` for one task each (as
        MetaSchedule measures a batch of one task's candidates at a time), round robin."""
        assert self.tasks, "start() first"
        while n > 0:
            size = min(n, self.batch_size)
            task = self.tasks[self.serial % len(self.tasks)]
            self.serial += 1
            records = []
            for _ in range(size):
                latency = self._latency(task)
                self.trials[task.id] = self.trials.get(task.id, 0) + 1
                records.append(
                    db.NewTuningRecord(
                        workload_id=task.workload_id,
                        target_id=self.target_id,
                        trace_json=db.canonical_trace_json(
                            [["SampleTile"], [[0, [self.seed, self.serial, len(records)]]]]
                        ),
                        run_secs=None if latency is None else (latency,),
                        error_text="RuntimeError: build failed" if latency is None else None,
                        worker=self.worker,
                        job_id=self.job_id,
                    )
                )
                if latency is not None and latency < self.best.get(task.id, math.inf):
                    self.best[task.id] = latency
            self.storage.commit_records(records)
            self.storage.update_job_task_progress(
                task.id, trials_done=self.trials[task.id], best_mean_secs=self.best.get(task.id)
            )
            self.storage.add_job_trials(self.job_id, size)
            n -= size
