"""The base every SQL storage part shares: the engine, its sessions and a few statement helpers.

Each resource's part (:mod:`db.sql.records`, :mod:`db.sql.jobs`, ...) is a mixin on
:class:`SQLBase`; :class:`db.storage.SQLStorage` joins them. Everything a part returns is a frozen
dataclass of :mod:`db.types`, built from its row by :func:`frozen`.
"""

from __future__ import annotations

import dataclasses
import threading
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, func
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

from db.engine import connection_scope, display_url, session_scope

T = TypeVar("T")


def utc(value: Any) -> Any:
    """SQLite hands back naive datetimes (stored in UTC); make every datetime aware."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def frozen(cls: type[T], row: Any) -> T:
    """Build the dataclass ``cls`` from an ORM row or a Core row with matching names."""
    getter = (
        row._mapping.__getitem__  # noqa: SLF001 - Row._mapping is SQLAlchemy's public API
        if hasattr(row, "_mapping")
        else row.__getattribute__
    )
    return cls(**{f.name: utc(getter(f.name)) for f in dataclasses.fields(cls)})


class SQLBase:
    """One engine per storage object, one session (or Core connection) per call."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name
        self._lock = threading.Lock()

    @property
    def engine(self) -> Engine:
        return self._engine

    @property
    def url(self) -> str:
        """The database URL, password masked."""
        return display_url(self._engine.url)

    @property
    def dialect(self) -> str:
        return self._dialect

    def close(self) -> None:
        """Release pooled connections. The object must not be used afterwards."""
        self._engine.dispose()

    def _session(self, *, write: bool = False):
        return session_scope(self._engine, write=write)

    def _connection(self, *, write: bool = False):
        return connection_scope(self._engine, write=write)

    def _insert(self, table: Any):
        module = pg_dialect if self._dialect == "postgresql" else sqlite_dialect
        return module.insert(table)

    def _db_now_plus(self, seconds: float) -> Any:
        if self._dialect == "postgresql":
            return func.now() + timedelta(seconds=seconds)
        return func.datetime("now", f"{float(seconds):+} seconds")

    def _add(self, cls: type[T], row: Any) -> T:
        with self._session(write=True) as session:
            session.add(row)
            session.flush()
            session.refresh(row)
            return frozen(cls, row)
