"""Engines, sessions and error mapping: the only place that knows about database drivers.

SQLite (the embedded default, one machine): every connection runs in WAL mode with
``synchronous=NORMAL``, a 30 s busy timeout, foreign keys on, a 1 GiB memory map and a 32 MiB
page cache. Transactions that write start with
``BEGIN IMMEDIATE`` so that two writers queue on the busy timeout instead of failing with
"database is locked" when a read transaction tries to upgrade to a write.

PostgreSQL (shared use): ``postgresql://`` URLs are given the psycopg 3 driver; connections are
pinged before use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from db.errors import ConflictError, StorageError, StorageUnavailableError

SQLITE_BUSY_TIMEOUT_MS = 30_000
SQLITE_MMAP_BYTES = 1 << 30
_BEGIN_KEY = "tunehub_begin"


def normalize_url(url: str | URL) -> URL:
    """Parse ``url``; plain ``postgresql://`` gets the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def display_url(url: str | URL) -> str:
    """The URL as shown to people: the password, if any, is masked."""
    return normalize_url(url).render_as_string(hide_password=True)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def create_storage_engine(url: str | URL, **kwargs) -> Engine:
    """Create the one engine a process uses for ``url`` (see the module docstring for settings)."""
    parsed = normalize_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        memory = database in ("", ":memory:") or database.startswith("file::memory:")
        if not memory:
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        if memory:
            kwargs.setdefault("poolclass", StaticPool)
        engine = create_engine(parsed, connect_args=connect_args, **kwargs)
        _install_sqlite_hooks(engine, memory=memory)
        return engine
    if backend == "postgresql":
        kwargs.setdefault("pool_pre_ping", True)
        kwargs.setdefault("pool_size", 5)
        kwargs.setdefault("max_overflow", 10)
        return create_engine(parsed, **kwargs)
    raise StorageError(f"unsupported database URL {display_url(parsed)}: use sqlite or postgresql")


def _install_sqlite_hooks(engine: Engine, *, memory: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
        # Let SQLAlchemy's "begin" event emit BEGIN itself (pysqlite's own handling is broken).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # Reads of full records (2 KB traces spread over a large file) come from memory-mapped
        # pages and a 32 MiB page cache per connection instead of one read() per page.
        cursor.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        cursor.execute("PRAGMA cache_size=-32768")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        conn.exec_driver_sql(conn.info.pop(_BEGIN_KEY, "BEGIN"))


@contextlib.contextmanager
def map_errors() -> Iterator[None]:
    """Translate SQLAlchemy/driver exceptions into :mod:`db.errors` exceptions."""
    try:
        yield
    except exc.IntegrityError as err:
        raise ConflictError(str(err.orig or err)) from err
    except (exc.OperationalError, exc.InterfaceError, exc.TimeoutError) as err:
        raise StorageUnavailableError(str(getattr(err, "orig", None) or err)) from err
    except exc.SQLAlchemyError as err:
        raise StorageError(str(err)) from err


@contextlib.contextmanager
def connection_scope(engine: Engine, *, write: bool = False) -> Iterator[Connection]:
    """Like :func:`session_scope` but a bare Core connection (the hot paths: fewer objects)."""
    with map_errors(), engine.connect() as conn:
        if write and is_sqlite(engine):
            conn.info[_BEGIN_KEY] = "BEGIN IMMEDIATE"
        try:
            with conn.begin():
                yield conn
        finally:
            conn.info.pop(_BEGIN_KEY, None)


@contextlib.contextmanager
def session_scope(engine: Engine, *, write: bool = False) -> Iterator[Session]:
    """One transaction: commits on success, rolls back on error, maps errors (see above).

    ``write=True`` marks a transaction that will write; on SQLite it starts with
    ``BEGIN IMMEDIATE`` (take the write lock first, then wait on the busy timeout).
    """
    with map_errors(), engine.connect() as conn:
        if write and is_sqlite(engine):
            conn.info[_BEGIN_KEY] = "BEGIN IMMEDIATE"
        with Session(bind=conn, expire_on_commit=False, autoflush=False) as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise
            finally:
                conn.info.pop(_BEGIN_KEY, None)
