"""The server's own build of a remote worker's artifact, in a child process.

:func:`rebuild_in_child` compiles a job's artifact on the server from a
:class:`tuner.final_build.rebuild_plan.RebuildPlan` (stored records, and the peers and default
schedules the worker's re-measurement chose, and the library its whole-model comparison published:
the tuned or the zero-trial one, :mod:`tuner.final_build.final_choice`; the server times nothing),
or a preview's zero-trial library, exactly as a worker would
(:func:`tuner.final_build.finalize.publish_tuned` /
:func:`tuner.final_build.finalize.publish_zero_trial`), and verifies it against the reference
framework when this machine can run the target's code. It runs TuneHub's own code on validated
inputs only (the model was validated at upload, every trace was replayed when it was stored); the
worker's library is never loaded. The child is a fresh interpreter under a time and memory limit
that dies with the server.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.final_build.process_limits import child_limits

REPO = Path(__file__).resolve().parents[2]


class RebuildFailed(Exception):
    """The server's build did not produce a verified artifact (the message says why)."""


@dataclass(frozen=True)
class RebuildSpec:
    """Everything the child needs: the job's model file (``model_format``, ``buckets_json`` as
    uploaded), its target (:class:`compiler.target.TargetSpec` fields), the model limits
    (:class:`compiler.frontends.model_spec.ModelLimits` fields), ``kind`` (``finalize``: build with
    ``plan``; ``preview``: the zero-trial library), the job's tasks
    (:class:`tuner.jobs.protocol.JobTaskInfo` JSON) and ``not_run_because`` (set: build only)."""

    kind: str
    model_path: str
    model_format: str | None
    buckets_json: str | None
    target: Mapping[str, str]
    limits: Mapping[str, Any]
    job_id: int
    trials_measured: int
    tasks: Sequence[Mapping[str, Any]]
    plan: Mapping[str, Any]
    not_run_because: str | None = None


def rebuild_in_child(
    spec: RebuildSpec, out_dir: Path, *, timeout: float, memory_bytes: int
) -> dict[str, Any]:
    """Build ``spec``'s artifact into ``out_dir`` (``model.so`` + ``manifest.json``, written
    all or nothing) in a child process; return its manifest. Raises :class:`RebuildFailed`
    when the child fails, its library does not verify, or it runs past ``timeout`` seconds (it
    is killed; nothing is written)."""
    with tempfile.TemporaryDirectory(prefix="tunehub-rebuild-") as tmp:
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(dataclasses.asdict(spec)))
        try:
            done = subprocess.run(
                [sys.executable, "-m", "tuner.final_build.rebuild", str(spec_path), str(out_dir)],
                cwd=str(REPO),
                capture_output=True,
                text=True,
                timeout=timeout,
                preexec_fn=child_limits(memory_bytes, timeout),
                env={**os.environ, "TMPDIR": tmp},
            )
        except subprocess.TimeoutExpired:
            shutil.rmtree(out_dir, ignore_errors=True)
            raise RebuildFailed(f"the server's build ran past {timeout:.0f} s") from None
    if done.returncode != 0:
        shutil.rmtree(out_dir, ignore_errors=True)
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        last = lines[-1][:500] if lines else f"exit {done.returncode}"
        raise RebuildFailed(f"the server's build failed: {last}")
    return json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))


def _peer_calls(prepared: Any, wanted: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """By task key, the peer variant (:class:`compiler.peers.PeerCall`) of each task in
    ``wanted`` whose call description matches one the compiler offers for the task; a
    description that matches none is dropped (the task builds with its records)."""
    from compiler.peers import device_of, library_for, peer_variants  # noqa: PLC0415
    from tuner.final_build.rebuild_plan import PEER_CALL_FIELDS  # noqa: PLC0415

    if not wanted or library_for(prepared.target) is None:
        return {}
    device = device_of(prepared.target)
    out = {}
    for task, extracted in zip(prepared.partition.tasks, prepared.partition.extracted):
        description = wanted.get(task.key)
        if description is None:
            continue
        for call in peer_variants(extracted.dispatched[0], device):
            offered = json.loads(json.dumps(call.to_json()))
            if {k: offered[k] for k in PEER_CALL_FIELDS if k in offered} == dict(description):
                out[task.key] = call
                break
    return out


def _outcomes(prepared: Any, spec: RebuildSpec, peers: Mapping[str, Any]) -> list[Any]:
    """The schedule table of the server's build: the job's tasks with the records it used,
    each peer or default task named by its implementation."""
    from compiler.peers import library_for  # noqa: PLC0415
    from tuner.final_build.finalize import finalize_outcomes  # noqa: PLC0415
    from tuner.jobs.protocol import JobTaskInfo  # noqa: PLC0415

    tasks = [JobTaskInfo.model_validate(t) for t in spec.tasks]
    outcomes = finalize_outcomes(prepared, tasks, spec.plan["records"])
    library = library_for(prepared.target) if peers else None
    defaults = set(spec.plan["defaults"])
    out = []
    for outcome in outcomes:
        if outcome.key in peers and library is not None:
            name = library.describe_for(peers[outcome.key]).get("library", "library")
            kind = peers[outcome.key].kind
            outcome = dataclasses.replace(outcome, implementation=f"{name} {kind}")
        elif outcome.key in defaults:
            outcome = dataclasses.replace(outcome, implementation="default", best_secs=None)
        out.append(outcome)
    return out


def _main() -> None:  # pragma: no cover - runs in the child
    from compiler.frontends.model_spec import ModelLimits  # noqa: PLC0415
    from compiler.prepare import prepare_model  # noqa: PLC0415
    from compiler.shapes.buckets import bucket_values  # noqa: PLC0415
    from compiler.target import TargetSpec  # noqa: PLC0415
    from tuner.final_build.final_choice import FinalChoice  # noqa: PLC0415
    from tuner.final_build.finalize import (  # noqa: PLC0415
        database_from_records,
        publish_tuned,
        publish_zero_trial,
    )

    spec = RebuildSpec(**json.loads(Path(sys.argv[1]).read_text()))
    out_dir = Path(sys.argv[2])
    prepared = prepare_model(
        Path(spec.model_path),
        TargetSpec(**spec.target),
        limits=ModelLimits(**spec.limits),
        expected_format=spec.model_format,  # type: ignore[arg-type]
        buckets=bucket_values(spec.buckets_json),
        allow_external_data=False,
    )
    if spec.kind == "preview":
        publish_zero_trial(
            prepared, out_dir, job_id=spec.job_id, not_run_because=spec.not_run_because
        )
        return
    peers = _peer_calls(prepared, spec.plan["peers"])
    publish_tuned(
        prepared,
        database_from_records(prepared, spec.plan["records"]),
        out_dir,
        job_id=spec.job_id,
        trials_measured=spec.trials_measured,
        outcomes=_outcomes(prepared, spec, peers),
        remeasured=list(spec.plan["remeasured"]),
        peers=peers,
        not_run_because=spec.not_run_because,
        follow=FinalChoice.from_json(spec.plan.get("final_choice"))
        or FinalChoice.not_compared(
            "the worker's manifest has no final_choice (the server times nothing)"
        ),
    )


if __name__ == "__main__":  # pragma: no cover
    _main()
