"""What the server rebuilds a remote worker's finalize artifact from: stored evidence only.

A remote worker's ``model.so`` is native code the server never runs in its own trust
(:mod:`tuner.final_build.artifact_review`). Where the server can build for the job's target, it
compiles the artifact itself, and this module says from what. Every schedule comes from the server's
own database (records it accepted as evidence: each trace replayed on its workload when it was
uploaded, :func:`tuner.jobs.record_checks.check_records`); the worker's manifest only *chooses*
among them, as its side-by-side re-measurement did (:mod:`tuner.final_build.remeasure`):

- a task whose chosen candidate is a stored record builds with that record alone, if the server
  holds it as a valid, unheld record of the job's target; otherwise with the server's best;
- a task whose chosen candidate is a library peer builds with that peer variant (the child
  matches it against the variants the compiler itself offers for the task, so a manifest can
  name only a call TuneHub would make);
- a task whose chosen candidate is TVM's default schedule builds without records;
- every other task builds with the server's best record of it (what the worker fetched);
- the whole library follows the worker's ``final_choice`` (:mod:`tuner.final_build.final_choice`):
  where the worker's side-by-side timing published the zero-trial build, the server builds the
  zero-trial library (no records: nothing to check) instead of timing anything itself.

TVM-free: the API process computes the plan; the build runs in a child
(:mod:`tuner.final_build.rebuild`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from db import TuningStorage
from tuner.final_build.final_choice import FinalChoice

#: Keys of a peer candidate's description that name the call (``PeerCall.to_json()``'s); the
#: rest of the description (library name, version, shim) is informational.
PEER_CALL_FIELDS = ("kind", "algorithm", "epilogue", "function", "config")
#: Most tasks and re-measured candidates the plan reads from a manifest.
MAX_TASKS = 4096
MAX_CANDIDATES = 16


@dataclass(frozen=True)
class RebuildPlan:
    """How the server builds a finalize artifact.

    ``records``: by task key, the stored records (``TuningRecord.as_json()`` lists) the build
    uses, best first; ``peers``: by task key, the peer call the worker's re-measurement chose
    (its description's :data:`PEER_CALL_FIELDS`); ``defaults``: task keys built with TVM's
    default schedule; ``remeasured``: the manifest's re-measurement entries of the job's tasks
    (the worker's report of why, carried into the server's manifest); ``final_choice``: the
    worker's whole-model choice as :meth:`tuner.final_build.final_choice.FinalChoice.to_json`
    rewrites it after :meth:`~tuner.final_build.final_choice.FinalChoice.from_json` read it
    (``None``: the worker's manifest has none the server understood: the tuned library is built);
    ``notes``: choices the server could not follow, each saying why."""

    records: dict[str, list[list[Any]]] = field(default_factory=dict)
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    defaults: tuple[str, ...] = ()
    remeasured: list[dict[str, Any]] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    final_choice: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "peers": self.peers,
            "defaults": list(self.defaults),
            "remeasured": self.remeasured,
            "notes": list(self.notes),
            "final_choice": self.final_choice,
        }


def _record_json(row: Any, target_obj: Any) -> list[Any]:
    return [
        json.loads(row.trace_json),
        list(row.run_secs or ()),
        target_obj,
        json.loads(row.args_info_json),
    ]


def _chosen(entry: Any) -> dict[str, Any] | None:
    candidates = entry.get("candidates") if isinstance(entry, dict) else None
    if not isinstance(candidates, list) or len(candidates) > MAX_CANDIDATES:
        return None
    chosen = [c for c in candidates if isinstance(c, dict) and c.get("chosen") is True]
    return chosen[0] if len(chosen) == 1 else None


def plan_rebuild(storage: TuningStorage, job: Any, manifest: Mapping[str, Any]) -> RebuildPlan:
    """The plan for rebuilding ``job``'s finalize artifact from the server's records, following
    the choices of the worker's ``manifest`` (its ``remeasured`` entries) where they name
    evidence the server holds (see the module docstring). Never raises for a bad manifest: a
    choice it cannot follow falls back to the server's best record and is noted."""
    target = storage.get_target_by_id(job.target_id)
    links = storage.model_workloads(job.model_id) if job.model_id is not None else []
    ids = [link.workload_id for link in links[:MAX_TASKS]]
    workloads = (storage.get_workload_by_id(i) for i in ids)
    by_key = {w.key: w.id for w in workloads if w is not None}
    target_obj = json.loads(target.target_json)
    entries = manifest.get("remeasured") if isinstance(manifest, Mapping) else None
    chosen = {}
    remeasured = []
    for entry in entries if isinstance(entries, list) else ():
        key = entry.get("key") if isinstance(entry, dict) else None
        if key in by_key and key not in chosen:
            chosen[key] = _chosen(entry)
            remeasured.append(entry)
    records: dict[str, list[list[Any]]] = {}
    peers: dict[str, dict[str, Any]] = {}
    defaults: list[str] = []
    notes: list[str] = []
    for key, workload_id in by_key.items():
        choice = chosen.get(key)
        if isinstance(choice, dict) and isinstance(choice.get("peer"), dict):
            peers[key] = {
                name: choice["peer"][name] for name in PEER_CALL_FIELDS if name in choice["peer"]
            }
        elif isinstance(choice, dict) and isinstance(choice.get("default"), dict):
            defaults.append(key)
            continue
        elif isinstance(choice, dict) and isinstance(choice.get("trace_hash"), str):
            row = storage.get_record(workload_id, target.id, choice["trace_hash"])
            if row is not None and row.is_valid and not row.quarantined:
                records[key] = [_record_json(row, target_obj)]
                continue
            notes.append(
                f"task {key}: the chosen schedule {choice['trace_hash'][:16]} is not a valid "
                "stored record here; built with the best stored record"
            )
        best = storage.top_k(workload_id, target.id, 1)
        if best:
            records[key] = [_record_json(best[0], target_obj)]
    final_choice = _final_choice(manifest, notes)
    return RebuildPlan(records, peers, tuple(defaults), remeasured, tuple(notes), final_choice)


def _final_choice(manifest: Any, notes: list[str]) -> dict[str, Any] | None:
    """The worker's ``final_choice`` as the server reads it, or ``None`` (one it cannot read is
    noted: the server builds the tuned library)."""
    entry = manifest.get("final_choice") if isinstance(manifest, Mapping) else None
    if entry is None:
        return None
    choice = FinalChoice.from_json(entry, decided_by="worker")
    if choice is None:
        notes.append("the worker's final_choice is not understood: built the tuned library")
        return None
    return choice.to_json()
