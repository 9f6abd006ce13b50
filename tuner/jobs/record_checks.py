"""An uploaded record is checked before it counts: the coordinator's gate for workers' batches.

:func:`check_records` takes a whole batch of :class:`tuner.jobs.protocol.RecordUpload` (a worker's
measurements of one workload) and returns the records to store, or raises
:class:`RecordRefused` (HTTP 422: nothing of the batch is stored). A record that passes but is
faster than its task allows is stored held (:mod:`tuner.jobs.plausibility`). Called by
:func:`tuner.jobs.coordinator.accept_batch`; it replays traces with TVM but measures nothing.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math

from db import NewTuningRecord, TargetRecord, TuningStorage
from tuner.jobs import plausibility
from tuner.jobs.protocol import RecordUpload

logger = logging.getLogger("tunehub.coordinator")


#: A record this many times faster than the best of the workload's other workers is held.
IMPLAUSIBLE_SPEEDUP = 20.0


class RecordRefused(ValueError):
    """An uploaded record is not evidence (HTTP 422; nothing of its batch is stored)."""


def check_records(
    storage: TuningStorage,
    workload,
    target: TargetRecord,
    records: list[RecordUpload],
    *,
    worker: str | None,
    job_id: int | None,
) -> list[NewTuningRecord]:
    """Check a whole batch before any of it counts; return the records to store.

    Each record's run times must be finite and positive (or ``None``/``[1e10]`` for a failure)
    and its argument info must have the workload's arguments; a valid record's trace must
    replay on the workload (:func:`db.metaschedule_database.replay`: parsing and applying it,
    no measuring) and its argument info must be its scheduled function's (a prepacked weight's
    shape is its tiled layout's); a failed one's trace must at least have a trace's shape. Any
    refusal raises :class:`RecordRefused`.
    A valid record whose mean is faster than a physical limit of its task allows
    (:func:`tuner.jobs.plausibility.check`: its FLOPs, the bytes it must write, any kernel call) or
    :data:`IMPLAUSIBLE_SPEEDUP` times faster than the workload's best record of another worker
    is stored **held** (``quarantined``, the reason in ``error_text``: no best-record query
    uses it). Records are attributed to ``worker``."""
    from db.metaschedule_database import describe_error, replay  # noqa: PLC0415
    from tuner.final_build.finalize import expected_args_info, tvm_module  # noqa: PLC0415
    from tuner.jobs.workload_bytes import workload_output_bytes  # noqa: PLC0415

    if not records:
        raise RecordRefused("an empty batch: upload at least one record")
    mod = _workload_module(workload, tvm_module)
    expected = expected_args_info(mod)
    bounds = plausibility.TaskBounds(
        kind=target.kind,
        flops=workload.flops,
        min_bytes=workload_output_bytes(workload.id, workload.mod_json, module=lambda: mod),
    )
    others = [r for r in storage.top_k(workload.id, target.id, 64) if r.worker != worker]
    best_other = others[0].mean_secs if others else None
    out = []
    for i, r in enumerate(records):
        where = f"record {i}"
        run_secs = None if r.run_secs is None else list(r.run_secs)
        if run_secs is not None:
            if not run_secs:
                raise RecordRefused(f"{where}: run_secs is empty (null marks a failure)")
            if any(not math.isfinite(x) or x <= 0 for x in run_secs):
                raise RecordRefused(
                    f"{where}: run times must be finite and positive, got {run_secs[:4]}"
                )
        if expected is not None and len(r.args_info) != len(expected):
            raise RecordRefused(
                f"{where}: {len(r.args_info)} arguments in args_info, the "
                f"workload has {len(expected)}"
            )
        if not (len(r.trace) == 2 and all(isinstance(x, list) for x in r.trace)):
            raise RecordRefused(f"{where}: a trace is [instructions, decisions]")
        try:
            new = NewTuningRecord.from_metaschedule_json(
                workload.id,
                target.id,
                [r.trace, run_secs, None, r.args_info],
                error_text=r.error_text,
                worker=worker,
                job_id=job_id,
            )
        except (TypeError, ValueError) as err:
            raise RecordRefused(f"{where}: {err}") from None
        if new.is_valid:
            try:
                scheduled = replay(mod, r.trace)
            except Exception as err:  # noqa: BLE001 - TVM raises many kinds for a bad trace
                raise RecordRefused(
                    f"{where}: the trace does not replay on the workload: "
                    f"{describe_error(err)[:300]}"
                ) from None
            # The arguments of the scheduled function: a prepacked weight has the tiled layout
            # its schedule's RewriteLayout gave it, not the workload's.
            own = expected_args_info(scheduled.mod)
            if own is not None and not _args_match(r.args_info, own):
                raise RecordRefused(
                    f"{where}: args_info {str(r.args_info)[:200]} is not its "
                    f"schedule's {str(own)[:200]}"
                )
            mean = new.mean_secs
            hold = plausibility.check(mean, bounds)
            held = None if hold is None else hold.reason
            if held is None and best_other is not None and mean * IMPLAUSIBLE_SPEEDUP < best_other:
                held = (
                    f"{best_other / mean:.0f}x faster than the best record of other workers "
                    f"({best_other:.3g} s)"
                )
            if held is not None:
                logger.warning(
                    "record of worker %s on workload %s held: %s", worker, workload.id, held
                )
                new = dataclasses.replace(new, quarantined=True, error_text=f"held: {held}")
        out.append(new)
    return out


_MODULES: dict[tuple[int, int], object] = {}


def _workload_module(workload, load):
    key = (workload.id, hash(workload.mod_json))
    mod = _MODULES.get(key)
    if mod is None:
        if len(_MODULES) > 64:
            _MODULES.clear()
        mod = _MODULES[key] = load(workload.mod_json)
    return mod


def _args_match(args_info: list, expected: list) -> bool:
    """The workload's arguments: as many, each a tensor of the same dtype whose shape is the
    workload's or a layout rewrite of it (prepacked weights: ``RewriteLayout`` stores the
    buffer's new shape, with as many elements, up to padding)."""
    try:
        given = json.loads(json.dumps(args_info))
    except (TypeError, ValueError):
        return False
    if given == expected:
        return True
    if not isinstance(given, list) or len(given) != len(expected):
        return False
    for arg, want in zip(given, expected):
        if not (
            isinstance(arg, list)
            and len(arg) == 3
            and arg[:2] == want[:2]
            and isinstance(arg[2], list)
        ):
            return False
        shape = arg[2]
        if not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
            return False
        size, wanted = math.prod(shape), math.prod(want[2])
        if not wanted <= size <= 2 * wanted:
            return False
    return True
