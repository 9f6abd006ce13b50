"""Read-only views over the tuning records on SQL: a job's history, workload pages, statistics."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import case, func, select

from db.contracts.records import RecordStorage
from db.models import JobRow, JobTaskRow, ModelRow, ModelWorkloadRow, TargetRow, WorkloadRow
from db.sql.base import SQLBase, frozen, utc
from db.sql.records import REC
from db.types import (
    DatabaseStats,
    HistoryPoint,
    JobHistoryPage,
    JobStatus,
    TargetRecord,
    TargetStats,
    WorkloadSummary,
)


class RecordViewSQL(SQLBase, RecordStorage):
    """The history, browsing and statistics part of :class:`RecordStorage`."""

    def job_history(
        self, job_id: int, *, after_id: int = 0, limit: int = 100_000
    ) -> JobHistoryPage:
        # One index-only range scan of three numbers per record; the running best per workload
        # is kept here (faster on SQLite than a window function, which sorts the page by
        # workload). Timestamps are read only for the improvements and the page's ends.
        rec = REC.c
        scan = (
            select(rec.id, rec.workload_id, rec.mean_secs)
            .where(rec.job_id == job_id, rec.id > after_id)
            .order_by(rec.id)
            .limit(max(0, int(limit)))
        )
        best: dict[int, float] = {}
        improved: list[tuple[int, int, int, float]] = []  # id, trial, workload, mean
        count = failed = 0
        first_id = last_id = after_id
        with self._connection() as conn:
            before = 0
            if after_id > 0:
                before = int(
                    conn.execute(
                        select(func.count())
                        .select_from(REC)
                        .where(rec.job_id == job_id, rec.id <= after_id)
                    ).scalar_one()
                )
            for last_id, workload_id, mean in conn.execute(scan):
                count += 1
                if count == 1:
                    first_id = last_id
                if mean is None:
                    failed += 1
                elif mean < best.get(workload_id, math.inf):
                    best[workload_id] = mean
                    improved.append((last_id, before + count, workload_id, mean))
            more = (
                count > 0
                and conn.execute(
                    select(rec.id).where(rec.job_id == job_id, rec.id > last_id).limit(1)
                ).first()
                is not None
            )
            wanted = sorted({first_id, last_id, *(p[0] for p in improved)}) if count else []
            times: dict[int, datetime] = {}
            for chunk in range(0, len(wanted), 500):
                ids = wanted[chunk : chunk + 500]
                stmt = select(rec.id, rec.measured_at).where(rec.id.in_(ids))
                times.update((row.id, row.measured_at) for row in conn.execute(stmt))
        return JobHistoryPage(
            job_id=job_id,
            after_id=after_id,
            last_id=last_id,
            trials_before=before,
            records=count,
            failed=failed,
            more=more,
            first_measured_at=utc(times.get(first_id)) if count else None,
            last_measured_at=utc(times.get(last_id)) if count else None,
            points=tuple(
                HistoryPoint(
                    id=record_id,
                    trial=trial,
                    workload_id=workload_id,
                    mean_secs=mean,
                    measured_at=utc(times.get(record_id)),
                )
                for record_id, trial, workload_id, mean in improved
            ),
        )

    def browse_workloads(
        self,
        *,
        target_id: int | None = None,
        model_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> tuple[list[WorkloadSummary], int]:
        per_record = (
            select(
                REC.c.workload_id.label("workload_id"),
                func.sum(case((REC.c.is_valid.is_(True), 1), else_=0)).label("valid"),
                func.sum(case((REC.c.is_valid.is_(True), 0), else_=1)).label("failed"),
                func.min(REC.c.mean_secs).label("best"),
            )
            .where(*([REC.c.target_id == target_id] if target_id is not None else []))
            .group_by(REC.c.workload_id)
            .subquery()
        )
        filters = []
        if target_id is not None:
            filters.append(per_record.c.workload_id.is_not(None))
        if model_id is not None:
            filters.append(
                select(ModelWorkloadRow.id)
                .where(
                    ModelWorkloadRow.workload_id == WorkloadRow.id,
                    ModelWorkloadRow.model_id == model_id,
                )
                .exists()
            )
        base = (
            select(
                WorkloadRow.id,
                WorkloadRow.key,
                WorkloadRow.summary,
                WorkloadRow.flops,
                per_record.c.valid,
                per_record.c.failed,
                per_record.c.best,
            )
            .select_from(WorkloadRow)
            .outerjoin(per_record, per_record.c.workload_id == WorkloadRow.id)
            .where(*filters)
        )
        page = base.order_by(WorkloadRow.id).limit(max(0, int(limit))).offset(max(0, int(offset)))
        total = select(func.count()).select_from(base.subquery())
        with self._connection() as conn:
            rows = [
                WorkloadSummary(
                    id=r.id,
                    key=r.key,
                    summary=r.summary,
                    flops=r.flops,
                    records_valid=int(r.valid or 0),
                    records_failed=int(r.failed or 0),
                    best_mean_secs=r.best,
                )
                for r in conn.execute(page)
            ]
            return rows, int(conn.execute(total).scalar_one())

    def tuned_workload_keys(
        self, target_id: int, keys: Sequence[str], *, exclude_job_id: int | None = None
    ) -> set[str]:
        if not keys:
            return set()
        stmt = (
            select(WorkloadRow.key)
            .join(JobTaskRow, JobTaskRow.workload_id == WorkloadRow.id)
            .join(JobRow, JobRow.id == JobTaskRow.job_id)
            .where(
                JobRow.target_id == target_id,
                JobTaskRow.status == JobStatus.SUCCEEDED,
                WorkloadRow.key.in_(list(keys)),
            )
            .distinct()
        )
        if exclude_job_id is not None:
            stmt = stmt.where(JobRow.id != exclude_job_id)
        with self._session() as session:
            return {row[0] for row in session.execute(stmt)}

    def stats(self) -> DatabaseStats:
        from db.schema import current_revision  # noqa: PLC0415

        def count(model) -> Any:
            return select(func.count()).select_from(model)

        with self._session() as session:
            workloads = session.execute(count(WorkloadRow)).scalar_one()
            models = session.execute(count(ModelRow)).scalar_one()
            jobs = session.execute(count(JobRow)).scalar_one()
            targets = {r.id: frozen(TargetRecord, r) for r in session.scalars(select(TargetRow))}
            per = session.execute(
                select(
                    REC.c.target_id,
                    func.sum(case((REC.c.is_valid.is_(True), 1), else_=0)),
                    func.sum(case((REC.c.is_valid.is_(True), 0), else_=1)),
                    func.count(func.distinct(REC.c.workload_id)),
                ).group_by(REC.c.target_id)
            ).all()
        by_target = {tid: (int(v or 0), int(f or 0), int(w)) for tid, v, f, w in per}
        per_target = tuple(
            TargetStats(t, *by_target.get(tid, (0, 0, 0))) for tid, t in sorted(targets.items())
        )
        return DatabaseStats(
            url=self.url,
            schema_revision=current_revision(self._engine),
            workloads=int(workloads),
            targets=len(targets),
            records_valid=sum(v for v, _, _ in by_target.values()),
            records_failed=sum(f for _, f, _ in by_target.values()),
            models=int(models),
            jobs=int(jobs),
            per_target=per_target,
        )
