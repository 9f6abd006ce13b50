"""The SQL implementation of :class:`db.base.TuningStorage` (SQLite and PostgreSQL).

:class:`SQLStorage` joins one mixin per resource (:mod:`db.sql`); each returns the frozen
dataclasses of :mod:`db.types`. :func:`open_storage` opens a database by URL and settles its
schema first.
"""

from __future__ import annotations

from db.base import TuningStorage
from db.engine import create_storage_engine
from db.sql import (
    CostModelSQL,
    JobSQL,
    LeaseEndSQL,
    LeaseSQL,
    LibraryRecordSQL,
    ModelSQL,
    RecordSQL,
    RecordViewSQL,
    RemeasurementSQL,
    TargetSQL,
    TokenSQL,
    WorkerSQL,
)


class SQLStorage(
    TargetSQL,
    RecordSQL,
    RecordViewSQL,
    RemeasurementSQL,
    LibraryRecordSQL,
    ModelSQL,
    JobSQL,
    LeaseSQL,
    LeaseEndSQL,
    WorkerSQL,
    TokenSQL,
    CostModelSQL,
    TuningStorage,
):
    """:class:`TuningStorage` on SQLAlchemy: one engine per object, one session per call.

    Build it with :func:`db.open_storage`, which also checks the schema version.
    """

    @classmethod
    def from_url(cls, url: str) -> SQLStorage:
        """An unchecked storage for ``url`` (prefer :func:`db.open_storage`)."""
        return cls(create_storage_engine(url))


def open_storage(url: str, *, upgrade: bool = False, pool_size: int | None = None) -> SQLStorage:
    """Open the tuning database at ``url`` and check its schema.

    A fresh database (a SQLite file that does not exist yet or has no tables, a PostgreSQL
    database without tables) is given the schema at once, whatever ``upgrade`` says.

    Args:
        url: an SQLAlchemy URL, ``sqlite:///path`` or ``postgresql[+psycopg]://...``.
        upgrade: also migrate an old schema to the head instead of refusing it. The service
            and the workers pass ``False`` (migrating a database in use is an explicit step,
            ``tunehub db upgrade``); the embedded default SQLite database passes ``True``.
        pool_size: connections kept open (default: SQLAlchemy's 5); a process with more threads
            using the storage at once (the API's request threads) sets it to that number, so
            no request waits for a connection or reopens one.

    Raises:
        SchemaOutdatedError: the database holds tables but an old or no TuneHub schema (and
            ``upgrade`` is false), or a schema newer than this TuneHub; the message names the
            exact command to run.
        StorageUnavailableError: the database cannot be reached.
    """
    from db import schema  # noqa: PLC0415

    engine = create_storage_engine(url, **({"pool_size": pool_size} if pool_size else {}))
    try:
        schema.prepare_schema(engine, migrate=upgrade)
    except BaseException:
        engine.dispose()
        raise
    return SQLStorage(engine)
