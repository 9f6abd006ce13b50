"""Store the re-measurements an artifact's manifest reports (``manifest["remeasured"]``).

:mod:`tuner.remeasure` re-measures each task's top records before a final build and writes what
it measured into the manifest (:func:`tuner.remeasure.remeasurements_json`). Both ways a job
finishes store them through :func:`store_remeasurements`: a job run in one process right after its
build, and the server when it accepts a worker's artifact (the manifest is then the worker's
word: every entry is checked, and one that does not name a stored valid record of one of the
job's tasks, or whose times are not finite and positive, is dropped and counted). TVM-free: the
API process runs it.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from db import NewRemeasurement, TuningStorage

logger = logging.getLogger("tunehub.remeasure")

#: Most candidates and rounds one task's entry may hold (anything larger is not TuneHub's).
MAX_CANDIDATES = 16
MAX_ROUNDS = 64


def _rounds_secs(candidate: dict[str, Any]) -> tuple[float, ...] | None:
    values = candidate.get("rounds_ms")
    if not isinstance(values, list) or not 0 < len(values) <= MAX_ROUNDS:
        return None
    try:
        secs = tuple(float(v) / 1e3 for v in values)
    except (TypeError, ValueError):
        return None
    if any(not math.isfinite(s) or s <= 0.0 for s in secs):
        return None
    return secs


def parse_remeasurements(
    storage: TuningStorage, entries: Any, *, target_id: int, job_id: int,
    workload_ids: Mapping[str, int], worker: str | None,
) -> tuple[list[NewRemeasurement], int]:
    """The re-measurements of manifest ``entries`` that name a valid stored record on
    ``target_id`` of one of the job's tasks (``workload_ids``: task key to workload id), and how
    many entries were dropped. Never raises for a bad entry."""
    if not isinstance(entries, list):
        return [], 0 if entries is None else 1
    out: list[NewRemeasurement] = []
    dropped = 0
    for entry in entries:
        workload_id = workload_ids.get(entry.get("key")) if isinstance(entry, dict) else None
        candidates = entry.get("candidates") if isinstance(entry, dict) else None
        if workload_id is None or not isinstance(candidates, list) or \
                len(candidates) > MAX_CANDIDATES:
            dropped += 1
            continue
        for candidate in candidates:
            secs = _rounds_secs(candidate) if isinstance(candidate, dict) else None
            digest = candidate.get("trace_hash") if isinstance(candidate, dict) else None
            if secs is None:  # not timed (no rounds) or malformed: nothing to store
                dropped += isinstance(candidate, dict) and bool(candidate.get("rounds_ms"))
                continue
            record = (storage.get_record(workload_id, target_id, digest)
                      if isinstance(digest, str) else None)
            if record is None or not record.is_valid:
                dropped += 1
                continue
            out.append(NewRemeasurement(
                record_id=record.id, rounds_secs=secs, chosen=candidate.get("chosen") is True,
                job_id=job_id, worker=worker,
            ))
    return out, dropped


def store_remeasurements(
    storage: TuningStorage, entries: Any, *, target_id: int, job_id: int,
    workload_ids: Mapping[str, int], worker: str | None,
) -> int:
    """Parse (:func:`parse_remeasurements`) and store ``entries``; return how many were stored.
    A storage error is logged, not raised: the artifact they describe is published anyway."""
    items, dropped = parse_remeasurements(
        storage, entries, target_id=target_id, job_id=job_id, workload_ids=workload_ids,
        worker=worker,
    )
    if dropped:
        logger.warning("job %s: %d re-measurement entries dropped (not a stored valid record "
                       "of the job's tasks, or malformed)", job_id, dropped)
    try:
        storage.add_remeasurements(items)
    except Exception:  # noqa: BLE001 - never fails the publish it follows
        logger.exception("job %s: storing %d re-measurements failed", job_id, len(items))
        return 0
    return len(items)
