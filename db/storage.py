"""The SQL implementation of :class:`db.base.TuningStorage` (SQLite and PostgreSQL).

:class:`SQLStorage` joins one mixin per resource (:mod:`db.sql`); each returns the frozen
dataclasses of :mod:`db.types`. :func:`open_storage` opens a database by URL and checks its
schema first.
"""
from __future__ import annotations

from pathlib import Path

from db.base import TuningStorage
from db.engine import create_storage_engine, display_url
from db.errors import SchemaOutdatedError
from db.sql import (
    CostModelSQL,
    JobSQL,
    LeaseEndSQL,
    LeaseSQL,
    ModelSQL,
    RecordSQL,
    RecordViewSQL,
    TargetSQL,
    TokenSQL,
    WorkerSQL,
)


class SQLStorage(
    TargetSQL,
    RecordSQL,
    RecordViewSQL,
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

    Args:
        url: an SQLAlchemy URL, ``sqlite:///path`` or ``postgresql[+psycopg]://...``.
        upgrade: migrate a missing or old schema to the head instead of refusing it. The service
            and the workers pass ``False`` (schema changes are an explicit step, ``tunehub db
            upgrade``); the embedded default SQLite database passes ``True``, so a first run on a
            fresh machine creates it.
        pool_size: connections kept open (default: SQLAlchemy's 5); a process with more threads
            using the storage at once (the API's request threads) sets it to that number, so
            no request waits for a connection or reopens one.

    Raises:
        SchemaOutdatedError: the schema is missing or old (and ``upgrade`` is false), or newer
            than this TuneHub; the message names the exact command to run.
        StorageUnavailableError: the database cannot be reached.
    """
    from db import schema  # noqa: PLC0415
    from db.engine import normalize_url  # noqa: PLC0415

    parsed = normalize_url(url)
    if not upgrade and parsed.get_backend_name() == "sqlite":
        path = parsed.database or ""
        if path and path != ":memory:" and not path.startswith("file:"):
            if not Path(path).expanduser().exists():  # do not leave an empty file behind
                raise SchemaOutdatedError(display_url(parsed), None, schema.head_revision())
    engine = create_storage_engine(url, **({"pool_size": pool_size} if pool_size else {}))
    try:
        if upgrade:
            current = schema.current_revision(engine)
            if current != schema.head_revision():
                if current is not None and current not in schema.known_revisions():
                    schema.check_schema(engine)  # raises: newer than this code
                schema.upgrade(engine)
        schema.check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return SQLStorage(engine)
