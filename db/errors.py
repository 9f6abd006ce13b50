"""Exceptions raised by the tuning storage.

Callers never see SQLAlchemy or driver exceptions: :func:`db.engine.map_errors` turns them into
these, so the service and the workers can handle storage failures without importing SQLAlchemy.
"""

from __future__ import annotations


class StorageError(Exception):
    """Base class of every error raised by :mod:`db`."""


class StorageUnavailableError(StorageError):
    """The database cannot be reached or is locked beyond the busy timeout; retrying may help."""


class ConflictError(StorageError):
    """A uniqueness or foreign-key constraint rejected the change (e.g. an unknown workload id)."""


class LeaseHeldError(ConflictError):
    """The worker already holds an active lease: a worker (name) holds one at a time.

    ``lease_id``: the lease it holds (``None`` when it ended before it could be read)."""

    def __init__(self, worker: str, lease_id: int | None) -> None:
        held = f"lease {lease_id}" if lease_id is not None else "a lease"
        super().__init__(
            f"worker {worker} already holds {held}: a worker holds one lease at a time"
        )
        self.worker = worker
        self.lease_id = lease_id


class NotFoundError(StorageError):
    """The row asked for does not exist."""


class InvalidTransitionError(StorageError):
    """A status change that the state machine does not allow, or whose precondition failed."""

    def __init__(self, kind: str, row_id: int, current: str | None, requested: str) -> None:
        super().__init__(
            f"{kind} {row_id}: cannot move from {current or 'unknown'!s} to {requested}"
        )
        self.kind = kind
        self.row_id = row_id
        self.current = current
        self.requested = requested


class SchemaOutdatedError(StorageError):
    """The database schema is missing, older or newer than this TuneHub expects.

    ``str(err)`` names the exact command to run (``tunehub db upgrade --db <url>``).
    """

    def __init__(
        self, url: str, current: str | None, expected: str, *, newer: bool = False
    ) -> None:
        self.url = url
        self.current = current
        self.expected = expected
        self.command = f"tunehub db upgrade --db {url}"
        if newer:
            message = (
                f"database {url} has schema revision {current}, which is newer than this TuneHub "
                f"knows ({expected}); upgrade TuneHub instead"
            )
        else:
            state = f"schema revision {current}" if current else "no TuneHub schema"
            message = (
                f"database {url} has {state}, this TuneHub needs {expected}; run: {self.command}"
            )
        super().__init__(message)
