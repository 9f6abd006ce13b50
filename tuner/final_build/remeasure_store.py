"""Store the re-measurements an artifact's manifest reports (``manifest["remeasured"]``).

:mod:`tuner.final_build.remeasure` re-measures each task's top records before a final build and
writes what it measured into the manifest (:func:`tuner.final_build.remeasure.remeasurements_json`).
Both ways a job finishes store them through :func:`store_remeasurements`: a job run in one process
right after its build, and the server when it accepts a worker's artifact (the manifest is then the
worker's word: every entry is checked, and one that does not name a stored valid record of one of
the job's tasks, or whose times are not finite and positive, is dropped and counted; so is a second
entry for a task). A candidate that is a library peer (``"peer"``, :mod:`compiler.peers`) is
stored as a library record of its task (:class:`db.NewLibraryRecord`), checked the same way; so
is TVM's default schedule (``"default"``: library ``tvm``, kind ``default``).

Every candidate's median of rounds is checked against the physical limits of its task
(:func:`tuner.jobs.plausibility.check`, the rule tuning records are checked by): an implausible
library record is stored *held* (never a best library record, the reason kept); an implausible
re-measurement is dropped and counted (it never changes its record's measurement, and a held
copy would only show a false time beside it). TVM-free to import: the task's output bytes are
read from its TIR (:mod:`tuner.jobs.workload_bytes`) on first use.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

from db import NewLibraryRecord, NewRemeasurement, TuningStorage
from tuner.jobs.plausibility import TaskBounds, check

#: A task's physical limits by workload id (:func:`stored_bounds`).
BoundsOf = Callable[[int], TaskBounds]

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


def stored_bounds(storage: TuningStorage, target_id: int) -> BoundsOf:
    """The physical limits of a stored workload on target ``target_id`` (its kind), by workload
    id, each read once: its FLOPs from its row, the bytes it must write from its TIR
    (:func:`tuner.jobs.workload_bytes.workload_output_bytes`, which imports TVM). An unknown
    workload or target gets the bounds of an unknown task (the call floor of the most generous
    kind). Never raises."""
    target = storage.get_target_by_id(target_id)
    kind = target.kind if target is not None else ""
    found: dict[int, TaskBounds] = {}

    def bounds_of(workload_id: int) -> TaskBounds:
        if workload_id not in found:
            from tuner.jobs.workload_bytes import workload_output_bytes  # noqa: PLC0415 - TVM

            workload = storage.get_workload_by_id(workload_id)
            found[workload_id] = (
                TaskBounds(kind)
                if workload is None
                else TaskBounds(
                    kind, workload.flops, workload_output_bytes(workload.id, workload.mod_json)
                )
            )
        return found[workload_id]

    return bounds_of


def unique_entries(entries: list[Any]) -> tuple[list[Any], int]:
    """``entries`` without a second (or later) entry for a task key already seen, and how many
    were left out: one entry per task, so one manifest stores at most ``MAX_CANDIDATES``
    candidates of a task. Entries that are not objects are kept (they are dropped later)."""
    seen: set[Any] = set()
    out, repeated = [], 0
    for entry in entries:
        key = entry.get("key") if isinstance(entry, dict) else None
        if isinstance(key, str) and key in seen:
            repeated += 1
            continue
        if isinstance(key, str):
            seen.add(key)
        out.append(entry)
    return out, repeated


def parse_remeasurements(
    storage: TuningStorage,
    entries: Any,
    *,
    target_id: int,
    job_id: int,
    workload_ids: Mapping[str, int],
    worker: str | None,
    bounds: BoundsOf | None = None,
) -> tuple[list[NewRemeasurement], int]:
    """The re-measurements of manifest ``entries`` that name a valid stored record on
    ``target_id`` of one of the job's tasks (``workload_ids``: task key to workload id), and how
    many entries or candidates were dropped (malformed, unknown, a task's second entry, or,
    given ``bounds``, a median faster than the task's limits allow). Never raises for a bad
    entry."""
    if not isinstance(entries, list):
        return [], 0 if entries is None else 1
    out: list[NewRemeasurement] = []
    entries, dropped = unique_entries(entries)
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
            hold = None if bounds is None else check(statistics.median(secs), bounds(workload_id))
            if hold is not None:
                logger.warning(
                    "job %s: a re-measurement of record %s dropped: %s",
                    job_id,
                    record.id,
                    hold.reason,
                )
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
    bounds: BoundsOf | None = None,
) -> tuple[list[NewLibraryRecord], int]:
    """The library-peer and default-schedule candidates of manifest ``entries`` (of the job's
    tasks, keyed in ``workload_ids``; a task's first entry only) as library records of
    ``target_key``, and how many were dropped (malformed, not timed, or of a task that is not
    the job's). Given ``bounds``, one whose median is faster than its task's limits allow is
    returned held (``held_reason`` set: stored, never a best). Never raises for a bad entry."""
    out: list[NewLibraryRecord] = []
    dropped = 0
    unique = unique_entries(entries)[0] if isinstance(entries, list) else []
    for entry in unique:
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
                continue
            hold = (
                None
                if bounds is None
                else check(item.median_secs, bounds(workload_ids[entry["key"]]))
            )
            if hold is not None:
                logger.warning(
                    "job %s: library record %s of task %s held: %s",
                    job_id,
                    item.library,
                    item.workload_key,
                    hold.reason,
                )
                item = dataclasses.replace(item, held_reason=f"held: {hold.reason}"[:512])
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
    bounds: BoundsOf | None = None,
) -> int:
    """Parse (:func:`parse_remeasurements`, :func:`parse_library_records`) and store
    ``entries``, every candidate checked against its task's physical limits (``bounds``;
    default :func:`stored_bounds` of ``target_id``); return how many re-measurements and
    library records were stored (held ones included). A storage error is logged, not raised:
    the artifact they describe is published anyway."""
    if bounds is None:
        bounds = stored_bounds(storage, target_id)
    items, dropped = parse_remeasurements(
        storage,
        entries,
        target_id=target_id,
        job_id=job_id,
        workload_ids=workload_ids,
        worker=worker,
        bounds=bounds,
    )
    target = storage.get_target_by_id(target_id)
    peers, peers_dropped = parse_library_records(
        entries,
        target_key=target.key if target else "",
        job_id=job_id,
        workload_ids=workload_ids,
        worker=worker,
        bounds=bounds,
    )
    dropped += peers_dropped
    if dropped:
        logger.warning(
            "job %s: %d re-measurement entries dropped (not a stored valid record "
            "of the job's tasks, a task's second entry, implausible, or malformed)",
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
