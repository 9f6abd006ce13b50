"""What a measured candidate's outcome is, decided in one place.

The rule itself (which run times are a measurement and which mark a failure: MetaSchedule's
``run_secs=[1e10]``, anything non-finite, non-positive or at least 1e9 s) is
:func:`db.types.measurement`, the rule the database stores records by (and
:func:`db.types.mean_run_secs` applies it to one runner result); these helpers apply it to
MetaSchedule's builder and runner results, so the search, the scheduler, progress, uploads and
the database agree on every candidate.
"""

from __future__ import annotations

from typing import Any

from db.types import FAILED_RUN_SECS, measurement


def outcome(built: Any, ran: Any | None) -> tuple[tuple[float, ...], str | None]:
    """``(run_secs, error_text)`` of a candidate from its ``BuilderResult`` and ``RunnerResult``
    as the database stores it: the measured run times, or ``(FAILED_RUN_SECS,)`` with the
    builder's or runner's error for a failure (``None`` when MetaSchedule gave no text)."""
    error = built.error_msg or (ran.error_msg if ran is not None else None)
    if error or ran is None:
        return (FAILED_RUN_SECS,), str(error) if error else None
    run_secs = tuple(float(x) for x in (ran.run_secs or ()))
    if not measurement(run_secs)[0]:
        return (FAILED_RUN_SECS,), None
    return run_secs, None
