"""Fixtures for the tuning-database tests: every storage test runs on SQLite and PostgreSQL.

PostgreSQL needs ``TUNEHUB_TEST_POSTGRES_URL`` (``scripts/run-tests.sh`` starts a throwaway
server with ``scripts/postgres.sh`` and sets it); without it those cases are skipped, with the
reason shown. Each test gets a new, empty database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

POSTGRES_ENV = "TUNEHUB_TEST_POSTGRES_URL"
BACKENDS = ["sqlite", "postgresql"]


def _pg_admin_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(
            f"PostgreSQL tests skipped: {POSTGRES_ENV} is not set "
            "(scripts/run-tests.sh starts a server with scripts/postgres.sh)"
        )
    return url


def new_database_url(backend: str, tmp_path) -> Iterator[str]:
    """Yield the URL of a new empty database on ``backend``; drop it afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / f'tunehub-{uuid.uuid4().hex[:8]}.db'}"
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = make_url(_pg_admin_url()).set(drivername="postgresql+psycopg")
    name = f"tunehub_t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield admin.set(database=name).render_as_string(hide_password=False)
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        engine.dispose()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def db_url(backend, tmp_path) -> Iterator[str]:
    yield from new_database_url(backend, tmp_path)


@pytest.fixture
def storage(db_url):
    import db

    with db.open_storage(db_url, upgrade=True) as opened:
        yield opened


@pytest.fixture(scope="session")
def target():
    from compiler.target import cpu_target

    return cpu_target(2)


@pytest.fixture(scope="session")
def other_targets():
    """Targets whose records must never answer for ``target``: other cores, other mcpu."""
    import json

    from compiler.target import TargetSpec, cpu_target

    one_core = cpu_target(1)
    base = cpu_target(2)
    target = json.loads(base.target_json)
    target["mcpu"] = "skylake-avx512" if target.get("mcpu") != "skylake-avx512" else "znver4"
    fingerprint = json.loads(base.fingerprint_json)
    fingerprint["mcpu"] = target["mcpu"]
    other_mcpu = TargetSpec(
        kind="cpu",
        target_json=json.dumps(target, sort_keys=True, separators=(",", ":")),
        fingerprint_json=json.dumps(fingerprint, sort_keys=True, separators=(",", ":")),
    )
    return {"one_core": one_core, "other_mcpu": other_mcpu}


def pytest_terminal_summary(terminalreporter) -> None:
    """Say so at the end when the PostgreSQL half of the storage tests did not run."""
    skipped = terminalreporter.stats.get("skipped", [])
    if any(POSTGRES_ENV in str(getattr(r, "longrepr", "")) for r in skipped):
        terminalreporter.write_line(
            f"NOTE: PostgreSQL storage tests were SKIPPED: {POSTGRES_ENV} is not set "
            "(scripts/run-tests.sh starts a server with scripts/postgres.sh)",
            yellow=True,
        )
