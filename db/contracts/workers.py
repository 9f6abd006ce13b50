"""The contract of workers: registration by name and heartbeats on the database clock."""

from __future__ import annotations

import abc

from db.types import Worker


class WorkerStorage(abc.ABC):
    """The registered workers."""

    @abc.abstractmethod
    def register_worker(
        self,
        name: str,
        *,
        fingerprint_json: str = "{}",
        target_id: int | None = None,
        token_id: int | None = None,
    ) -> Worker:
        """Insert or update the worker called ``name`` and stamp a heartbeat. Each call is a new
        registration: the row gets a new random ``instance`` (the process now holding the name)
        and ``token_id`` (the worker token that registered it; ``None`` in process)."""

    @abc.abstractmethod
    def heartbeat(self, worker_id: int, *, status: str | None = None) -> Worker:
        """Stamp ``last_heartbeat`` with the database clock (and set ``status`` if given)."""

    @abc.abstractmethod
    def list_workers(
        self, *, token_id: int | None = None, limit: int | None = None, offset: int = 0
    ) -> list[Worker]:
        """Workers by id: all of them, or those ``token_id`` registered; a page of at most
        ``limit`` (``None``: no limit) after skipping ``offset``."""

    @abc.abstractmethod
    def count_workers(self, *, token_id: int | None = None) -> int:
        """How many workers there are (those ``token_id`` registered, when given)."""
