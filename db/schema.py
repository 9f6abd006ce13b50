"""Schema versions: programmatic Alembic upgrades and the start-up check.

The migrations ship inside the package (``db/migrations``), so this works from any working
directory. :func:`db.open_storage` settles the schema through :func:`prepare_schema`: a fresh
database (no tables at all) gets the schema at once, as MLflow and Optuna do; the service and the
workers refuse to start on an old schema, and the message names the command.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from db.engine import display_url, map_errors
from db.errors import SchemaOutdatedError, StorageError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str | None = None) -> Config:
    """An Alembic ``Config`` pointing at the packaged migrations (no ini file, no cwd)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        config.set_main_option("sqlalchemy.url", str(url).replace("%", "%%"))
    return config


def head_revision() -> str:
    """The revision this TuneHub's code expects (e.g. ``"0002_job_worker"``)."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    return {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The revision stamped in the database, ``None`` for a database without TuneHub tables."""
    with map_errors(), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_empty(engine: Engine) -> bool:
    """Whether the database has no tables (a new SQLite file, an empty PostgreSQL database)."""
    with map_errors(), engine.connect() as conn:
        return not inspect(conn).get_table_names()


def prepare_schema(engine: Engine, *, migrate: bool = False) -> str:
    """Bring the schema to the head where that is safe, else refuse; return the revision.

    At the head: nothing to do. A fresh database (:func:`is_empty`) is migrated to the head. An
    old schema (or tables without a TuneHub stamp) is migrated only with ``migrate``. Two
    processes creating the schema of one fresh database at once both succeed: the loser of the
    race finds the winner's schema.

    Raises:
        SchemaOutdatedError: the schema is old (and ``migrate`` is false) or newer than this
            TuneHub; the message names the exact command to run.
    """
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return current
    if current is not None and current not in known_revisions():
        check_schema(engine)  # raises: newer than this code
    if migrate or (current is None and is_empty(engine)):
        try:
            upgrade(engine)
        except StorageError:
            if current_revision(engine) != head:
                raise
    return check_schema(engine)


def check_schema(engine: Engine) -> str:
    """Return the current revision, or raise :class:`SchemaOutdatedError` if it is not the head."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return current
    newer = current is not None and current not in known_revisions()
    raise SchemaOutdatedError(display_url(engine.url), current, head, newer=newer)


def upgrade(engine: Engine, revision: str = "head") -> str:
    """Migrate the database to ``revision`` (default: the head) and return the new revision."""
    with map_errors(), engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    return current_revision(engine) or ""


def downgrade(engine: Engine, revision: str) -> str | None:
    """Migrate down to ``revision`` (``"base"`` drops every TuneHub table). For tests and repair."""
    with map_errors(), engine.begin() as conn:
        config = alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, revision)
    return current_revision(engine)
