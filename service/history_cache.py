"""Whole-history reads of recently viewed jobs, kept and extended with only the new records.

Every dashboard that opens a job reads its whole history (``?after=0``): at 10^5 records that is
a scan of 10^5 index entries each time. A job's records up to a given id do not change (records
are append-mostly, see :mod:`db.base`), so the service keeps the longest history read from the start
(``after=0``) of the ``max_jobs`` most recently read jobs and answers the next such read with it
plus a read of the records stored since. The answer is the page a full read would give: the same
counts, and points that are exactly the job-wide improvements.

Like the incremental polls themselves, a cached prefix does not see a record improved in place
after it was read (the same schedule measured faster again keeps its id).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict

import db


def extend(prefix: db.JobHistoryPage, newer: db.JobHistoryPage) -> db.JobHistoryPage:
    """The whole history ``prefix`` (read from ``after_id=0``) followed by ``newer`` (read from
    ``prefix.last_id``): counts added, and ``newer``'s points kept only where they beat the best
    of their workload so far (so the result's points are job-wide improvements)."""
    if newer.after_id != prefix.last_id:
        raise ValueError(f"page after {newer.after_id} does not follow {prefix.last_id}")
    best: dict[int, float] = {}
    for point in prefix.points:
        best[point.workload_id] = point.mean_secs
    points = list(prefix.points)
    for point in newer.points:
        if point.mean_secs < best.get(point.workload_id, math.inf):
            best[point.workload_id] = point.mean_secs
            points.append(point)
    return dataclasses.replace(
        prefix,
        last_id=newer.last_id,
        records=prefix.records + newer.records,
        failed=prefix.failed + newer.failed,
        more=newer.more,
        first_measured_at=prefix.first_measured_at or newer.first_measured_at,
        last_measured_at=newer.last_measured_at or prefix.last_measured_at,
        points=tuple(points),
    )


class HistoryCache:
    """Answers :meth:`db.TuningStorage.job_history` reads, whole reads from a kept prefix.

    Thread safe: request threads share it; two threads extending one job both read the new
    records (the later result is kept), never a wrong answer.
    """

    def __init__(self, max_jobs: int = 64) -> None:
        self.max_jobs = max_jobs
        self._lock = threading.Lock()
        self._prefixes: OrderedDict[int, db.JobHistoryPage] = OrderedDict()

    def jobs(self) -> list[int]:
        """Ids of the jobs whose history is kept, least recently read first."""
        with self._lock:
            return list(self._prefixes)

    def read(
        self, storage: db.TuningStorage, job_id: int, *, after_id: int = 0, limit: int = 100_000
    ) -> db.JobHistoryPage:
        """What ``storage.job_history(job_id, after_id=after_id, limit=limit)`` returns."""
        if after_id != 0 or self.max_jobs <= 0:
            return storage.job_history(job_id, after_id=after_id, limit=limit)
        with self._lock:
            prefix = self._prefixes.get(job_id)
        room = limit - (prefix.records if prefix is not None else 0)
        if prefix is None or room < 0:
            page = storage.job_history(job_id, limit=limit)
        elif room == 0:  # the prefix fills the page: only say whether more records exist
            newer = storage.job_history(job_id, after_id=prefix.last_id, limit=1)
            page = dataclasses.replace(prefix, more=newer.records > 0)
        else:
            page = extend(prefix, storage.job_history(job_id, after_id=prefix.last_id, limit=room))
        if page.records:  # a prefix of the history, cut at the limit or not
            with self._lock:
                kept = self._prefixes.get(job_id)
                if kept is None or page.records >= kept.records:
                    self._prefixes[job_id] = page
                self._prefixes.move_to_end(job_id)
                while len(self._prefixes) > self.max_jobs:
                    self._prefixes.popitem(last=False)
        return page
