"""Store the re-measurements an artifact's manifest reports (``manifest["remeasured"]``).

:mod:`tuner.remeasure` re-measures each task's top records before a final build and writes what
it measured into the manifest (:func:`tuner.remeasure.remeasurements_json`). Both ways a job
finishes store them through :func:`store_remeasurements`: a job run in one process right after its
build, and the server when it accepts a worker's artifact (the manifest is then the worker's
word: every entry is checked, and one that does not name a stored valid record of one of the
job's tasks, or whose times are not finite and positive, is dropped and counted). A candidate
that is a library peer (``"peer"``, :mod:`compiler.peers`) is stored as a library record of its
task (:class:`db.NewLibraryRecord`), checked the same way; so is TVM's default schedule
(``"default"``: library ``tvm``, kind ``default``). TVM-free: the API process runs it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from db import NewLibraryRecord, NewRemeasurement, TuningStorage

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
    storage: TuningStorage,
    entries: Any,
    *,
    target_id: int,
    job_id: int,
    workload_ids: Mapping[str, int],
    worker: str | None,
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
        if (
            workload_id is None
            or not isinstance(candidates, list)
            or len(candidates) > MAX_CANDIDATES
        ):
            dropped += 1
            continue
        for candidate in candidates:
            if isinstance(candidate, dict) and ("peer" in candidate or "default" in candidate):
                continue  # a library peer or the default schedule: parse_library_records
            secs = _rounds_secs(candidate) if isinstance(candidate, dict) else None
            digest = candidate.get("trace_hash") if isinstance(candidate, dict) else None
            if secs is None:  # not timed (no rounds) or malformed: nothing to store
                dropped += isinstance(candidate, dict) and bool(candidate.get("rounds_ms"))
                continue
            record = (
                storage.get_record(workload_id, target_id, digest)
                if isinstance(digest, str)
                else None
            )
            if record is None or not record.is_valid:
                dropped += 1
                continue
            out.append(
                NewRemeasurement(
                    record_id=record.id,
                    rounds_secs=secs,
                    chosen=candidate.get("chosen") is True,
                    job_id=job_id,
                    worker=worker,
                )
            )
    return out, dropped


def _implementation(candidate: Any) -> Any:
    """A candidate's ``peer`` or ``default`` description (``None``: a record's candidate)."""
    if not isinstance(candidate, dict):
        return None
    return candidate.get("peer", candidate.get("default"))


def _library_record(
    key: str, candidate: Any, *, target_key: str, job_id: int, worker: str | None
) -> NewLibraryRecord | None:
    peer = _implementation(candidate)
    secs = _rounds_secs(candidate) if isinstance(candidate, dict) else None
    if not isinstance(peer, dict) or secs is None:
        return None
    try:
        return NewLibraryRecord(
            workload_key=key,
            target_key=target_key,
            library=str(peer["library"]),
            version=f"{peer['package']} {peer['version']}",
            call={
                name: peer[name]
                for name in ("kind", "function", "config", "shim", "algorithm", "epilogue")
                if name in peer
            },
            run_secs=secs,
            job_id=job_id,
            worker=worker,
        )
    except (KeyError, TypeError, ValueError):
        return None


def parse_library_records(
    entries: Any,
    *,
    target_key: str,
    job_id: int,
    workload_ids: Mapping[str, int],
    worker: str | None,
) -> tuple[list[NewLibraryRecord], int]:
    """The library-peer candidates of manifest ``entries`` (of the job's tasks, keyed in
    ``workload_ids``) as library records of ``target_key``, and how many were dropped
    (malformed, not timed, or of a task that is not the job's). Never raises for a bad entry."""
    out: list[NewLibraryRecord] = []
    dropped = 0
    for entry in entries if isinstance(entries, list) else ():
        candidates = entry.get("candidates") if isinstance(entry, dict) else None
        if not isinstance(candidates, list) or len(candidates) > MAX_CANDIDATES:
            continue  # counted by parse_remeasurements
        for candidate in candidates:
            if _implementation(candidate) is None:
                continue
            item = (
                _library_record(
                    entry.get("key"), candidate, target_key=target_key, job_id=job_id, worker=worker
                )
                if entry.get("key") in workload_ids
                else None
            )
            if item is None:
                dropped += bool(candidate.get("rounds_ms"))
            else:
                out.append(item)
    return out, dropped


def store_remeasurements(
    storage: TuningStorage,
    entries: Any,
    *,
    target_id: int,
    job_id: int,
    workload_ids: Mapping[str, int],
    worker: str | None,
) -> int:
    """Parse (:func:`parse_remeasurements`, :func:`parse_library_records`) and store
    ``entries``; return how many re-measurements and library records were stored. A storage
    error is logged, not raised: the artifact they describe is published anyway."""
    items, dropped = parse_remeasurements(
        storage,
        entries,
        target_id=target_id,
        job_id=job_id,
        workload_ids=workload_ids,
        worker=worker,
    )
    target = storage.get_target_by_id(target_id)
    peers, peers_dropped = parse_library_records(
        entries,
        target_key=target.key if target else "",
        job_id=job_id,
        workload_ids=workload_ids,
        worker=worker,
    )
    dropped += peers_dropped
    if dropped:
        logger.warning(
            "job %s: %d re-measurement entries dropped (not a stored valid record "
            "of the job's tasks, or malformed)",
            job_id,
            dropped,
        )
    try:
        storage.add_remeasurements(items)
    except Exception:  # noqa: BLE001 - never fails the publish it follows
        logger.exception("job %s: storing %d re-measurements failed", job_id, len(items))
        items = []
    try:
        storage.add_library_records(peers)
    except Exception:  # noqa: BLE001 - as above
        logger.exception("job %s: storing %d library records failed", job_id, len(peers))
        peers = []
    return len(items) + len(peers)
