"""Schema versions: programmatic Alembic upgrades and the start-up check.

The migrations ship inside the package (``db/migrations``), so this works from any working
directory. The service and the workers call :func:`check_schema` (through
:func:`db.open_storage`) and refuse to start on an old schema; the message names the command.
"""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from db.engine import display_url, map_errors
from db.errors import SchemaOutdatedError

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
