"""Schema versions: upgrade from empty, fresh databases created, refusal of old/newer schemas,
the CLI commands."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import inspect, text

import db
from db.engine import create_storage_engine

HEAD = "0013_lease_tasks"
EXPECTED_TABLES = {
    "workloads",
    "targets",
    "tuning_records",
    "remeasurements",
    "library_records",
    "models",
    "model_workloads",
    "jobs",
    "job_tasks",
    "workers",
    "artifacts",
    "cost_models",
    "api_tokens",
    "task_leases",
    "lease_tasks",
    "alembic_version",
}


def test_head_revision_is_readable():
    assert db.head_revision() == HEAD


def test_upgrade_from_empty_creates_every_table(db_url):
    engine = create_storage_engine(db_url)
    try:
        assert db.current_revision(engine) is None
        assert db.upgrade(engine) == HEAD
        assert EXPECTED_TABLES <= set(inspect(engine).get_table_names())
        indexes = {i["name"] for i in inspect(engine).get_indexes("tuning_records")}
        assert "ix_tuning_records_top_k" in indexes
        assert db.check_schema(engine) == HEAD
        # Down to nothing and back up again: the migration is reversible.
        db.schema.downgrade(engine, "base")
        assert db.current_revision(engine) is None
        assert db.upgrade(engine) == HEAD
    finally:
        engine.dispose()


def test_upgrade_from_0001_keeps_data_and_adds_job_worker(db_url):
    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine, "0001_initial")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO targets (key, kind, target_json, fingerprint_json, tvm_version) "
                    "VALUES ('00000000000000ff', 'cpu', '{}', '{}', 'x')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO jobs (target_id, status, trial_budget, owner) "
                    "VALUES (1, 'running', 8, 'alice')"
                )
            )
        assert db.upgrade(engine) == HEAD
        assert "worker" in {c["name"] for c in inspect(engine).get_columns("jobs")}
    finally:
        engine.dispose()
    with db.open_storage(db_url) as storage:
        job = storage.list_jobs(owner="alice")[0]
        assert job.status == "running" and job.worker is None  # a CLI-style run: no worker


def test_fresh_database_gets_the_schema_without_upgrade(db_url):
    """A missing SQLite file and an empty PostgreSQL database are created at the head."""
    with db.open_storage(db_url) as storage:
        assert storage.stats().schema_revision == HEAD
        assert EXPECTED_TABLES <= set(inspect(storage.engine).get_table_names())
    with db.open_storage(db_url) as storage:  # opened again: nothing to do
        assert storage.count_records() == 0


def test_older_schema_is_refused_with_the_exact_command(db_url):
    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine, "0001_initial")
    finally:
        engine.dispose()
    with pytest.raises(db.SchemaOutdatedError) as info:
        db.open_storage(db_url)
    shown = db.engine.display_url(db_url)
    assert "schema revision 0001_initial" in str(info.value)
    assert f"tunehub db upgrade --db {shown}" in str(info.value)
    assert info.value.command == f"tunehub db upgrade --db {shown}"
    engine = create_storage_engine(db_url)
    try:
        assert db.current_revision(engine) == "0001_initial"  # refused, not touched
    finally:
        engine.dispose()


def test_tables_without_a_tunehub_schema_are_refused(db_url):
    engine = create_storage_engine(db_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE someone_elses (id INTEGER PRIMARY KEY)"))
    finally:
        engine.dispose()
    with pytest.raises(db.SchemaOutdatedError, match="no TuneHub schema"):
        db.open_storage(db_url)
    engine = create_storage_engine(db_url)
    try:
        assert set(inspect(engine).get_table_names()) == {"someone_elses"}
    finally:
        engine.dispose()


def test_old_schema_is_refused_and_upgrade_fixes_it(db_url):
    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine)
        db.schema.downgrade(engine, "base")  # an "old" database: no TuneHub schema stamped
    finally:
        engine.dispose()
    with pytest.raises(db.SchemaOutdatedError, match="tunehub db upgrade --db"):
        db.open_storage(db_url)
    with db.open_storage(db_url, upgrade=True) as storage:
        assert storage.stats().schema_revision == HEAD
    with db.open_storage(db_url) as storage:  # now accepted without upgrade
        assert storage.count_records() == 0


def test_newer_schema_is_refused_even_with_upgrade(db_url):
    with db.open_storage(db_url, upgrade=True) as storage:
        with storage.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0099_future'"))
    with pytest.raises(db.SchemaOutdatedError, match="newer than this TuneHub"):
        db.open_storage(db_url, upgrade=True)


def test_cli_upgrade_and_stats(db_url, capsys):
    from service.cli import main

    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine, "0001_initial")  # an old schema: refused until upgraded
    finally:
        engine.dispose()
    assert main(["db", "stats", "--db", db_url]) == 2
    assert "tunehub db upgrade --db" in capsys.readouterr().err
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert f"-> {HEAD}" in capsys.readouterr().out
    assert main(["db", "upgrade", "--db", db_url]) == 0
    assert f"already at {HEAD}" in capsys.readouterr().out
    assert main(["db", "stats", "--db", db_url, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["schema_revision"] == HEAD
    assert stats["records"] == {"valid": 0, "failed": 0}
    assert main(["db", "stats", "--db", db_url]) == 0
    assert "records (valid)" in capsys.readouterr().out


def test_embedded_default_is_created_on_first_use(tmp_path, monkeypatch, capsys):
    from service.cli import main

    monkeypatch.delenv(db.DATABASE_URL_ENV, raising=False)
    monkeypatch.setenv("TUNEHUB_HOME", str(tmp_path / "home"))
    assert db.default_database_url() == f"sqlite:///{tmp_path / 'home' / 'tunehub.db'}"
    assert main(["db", "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema_revision"] == HEAD
    assert (tmp_path / "home" / "tunehub.db").exists()
    monkeypatch.setenv(db.DATABASE_URL_ENV, f"sqlite:///{tmp_path / 'env.db'}")
    assert db.resolve_database_url(None) == (f"sqlite:///{tmp_path / 'env.db'}", False)
    assert db.resolve_database_url("sqlite:///x.db") == ("sqlite:///x.db", False)


def test_missing_sqlite_file_is_created_with_the_schema(tmp_path, capsys):
    from service.cli import main

    path = tmp_path / "new" / "absent.db"
    with db.open_storage(f"sqlite:///{path}") as storage:
        assert storage.stats().schema_revision == HEAD
    assert path.exists()
    # The CLI the same way: `tunehub db stats --db sqlite:///<missing path>` creates it.
    other = tmp_path / "cli.db"
    assert main(["db", "stats", "--db", f"sqlite:///{other}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schema_revision"] == HEAD
    assert other.exists()


def test_sqlite_pragmas(tmp_path):
    with db.open_storage(f"sqlite:///{tmp_path / 'p.db'}", upgrade=True) as storage:
        with storage.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 30000
