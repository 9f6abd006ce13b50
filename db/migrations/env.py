"""Alembic environment for the TuneHub tuning database.

Run programmatically through :mod:`db.schema` (which passes an open connection in
``config.attributes["connection"]``), or by hand with ``alembic -c db/alembic.ini`` and
``sqlalchemy.url`` set. SQLite uses batch mode so later migrations can alter tables.
"""

from __future__ import annotations

from alembic import context

from db.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(**kwargs) -> None:
    context.configure(
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from db.engine import create_storage_engine  # noqa: PLC0415

    engine = create_storage_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.begin() as conn:
            _configure(connection=conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
