"""Library records (issue 21, "kernels as peers") on both backends: adding (all or none), checks,
the best per task, cascades, migration 0008 and the records API."""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime

import pytest
from sqlalchemy import event, inspect, text

import db
from db import NewLibraryRecord
from db.engine import create_storage_engine

WA, WB, WC = "00000000000000aa", "00000000000000bb", "00000000000000cc"
CALL = {"kind": "gemm", "function": "tunehub.peer.gemm", "config": {"trans_b": 0}}


@dataclasses.dataclass(frozen=True)
class _Spec:
    """What ``ensure_target`` reads of a ``compiler.target.TargetSpec`` (no TVM import here)."""

    key: str
    kind: str = "cpu"
    target_json: str = "{}"
    fingerprint_json: str = "{}"
    tvm_version: str = "test"


@pytest.fixture
def keys(storage):
    """Two targets (A, B) and three workloads; their keys."""
    for key in (WA, WB, WC):
        storage.ensure_workload(key, '{"nodes":[]}')
    a = storage.ensure_target(_Spec("000000000000a0a0", target_json='{"a":1}'))
    b = storage.ensure_target(_Spec("000000000000b0b0", target_json='{"b":1}'))
    return a.key, b.key


def lib(workload: str, target: str, run_secs, **kw) -> NewLibraryRecord:
    fields = {"library": "openblas", "version": "scipy-openblas32 0.3.34.481.3", "call": CALL}
    return NewLibraryRecord(workload, target, run_secs=run_secs, **{**fields, **kw})


def _count(storage) -> int:
    with storage.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM library_records")).scalar_one()


def test_add_returns_what_is_stored_and_list_filters(storage, keys):
    a, b = keys
    job = storage.create_job(target_id=storage.get_target(a).id, trial_budget=8)
    added = storage.add_library_records(
        [
            lib(WA, a, [3e-3, 1e-3, 2e-3], job_id=job.id, worker="w1"),
            lib(WB, a, (5e-4,), call={"z": [1, 2.5, None, True], "a": "é"}),
            lib(WA, b, [4e-3, 4e-3]),
        ]
    )
    first = added[0]
    assert [r.workload_key for r in added] == [WA, WB, WA]
    assert [r.target_key for r in added] == [a, a, b]
    assert len({r.id for r in added}) == 3 and added == sorted(added, key=lambda r: r.id)
    assert first.library == "openblas" and first.version == "scipy-openblas32 0.3.34.481.3"
    assert first.call == CALL and isinstance(first.call, dict)
    assert first.run_secs == (3e-3, 1e-3, 2e-3) and first.median_secs == 2e-3
    assert first.spread == pytest.approx((3e-3 - 1e-3) / 2e-3)
    assert (first.job_id, first.worker) == (job.id, "w1")
    assert isinstance(first.measured_at, datetime) and first.measured_at.tzinfo is not None
    assert added[1].spread == 0.0 and added[1].call == {"a": "é", "z": [1, 2.5, None, True]}
    assert (added[1].job_id, added[1].worker) == (None, None)

    assert storage.list_library_records() == added  # oldest first, as returned by add
    assert storage.list_library_records(workload_key=WA) == [added[0], added[2]]
    assert storage.list_library_records(target_key=a) == added[:2]
    assert storage.list_library_records(workload_key=WA, target_key=b) == [added[2]]
    assert storage.list_library_records(job_id=job.id) == [first]
    assert storage.list_library_records(workload_key="ffffffffffffffff") == []
    assert storage.list_library_records(target_key="ffffffffffffffff") == []
    assert storage.add_library_records([]) == []
    with storage.engine.connect() as conn:  # canonical compact JSON, ids rather than keys
        stored = conn.execute(
            text(
                "SELECT call_json, run_secs_json, workload_id, target_id FROM library_records "
                "WHERE id = :id"
            ),
            {"id": added[1].id},
        ).one()
    assert stored[0] == '{"a":"é","z":[1,2.5,null,true]}' and json.loads(stored[1]) == [5e-4]
    assert (stored[2], stored[3]) == (storage.get_workload(WB).id, storage.get_target(a).id)


BAD_VALUES = [
    ({"run_secs": []}, "1..64 run times"),
    ({"run_secs": [1e-3] * 65}, "1..64 run times"),
    ({"run_secs": [1e-3, 0.0]}, "finite and positive"),
    ({"run_secs": [-1e-3]}, "finite and positive"),
    ({"run_secs": [math.nan]}, "finite and positive"),
    ({"run_secs": [math.inf]}, "finite and positive"),
    ({"run_secs": ["1e-3"]}, "numbers"),
    ({"run_secs": [True]}, "numbers"),
    ({"run_secs": "1e-3"}, "sequence"),
    ({"library": ""}, "library"),
    ({"library": "x" * 65}, "library"),
    ({"version": ""}, "version"),
    ({"version": "v" * 129}, "version"),
    ({"worker": ""}, "worker"),
    ({"worker": "w" * 129}, "worker"),
    ({"job_id": "1"}, "job_id"),
    ({"call": ["gemm"]}, "JSON object"),
    ({"call": "gemm"}, "JSON object"),
    ({"call": {"x": math.nan}}, "plain JSON"),
    ({"call": {"x": object()}}, "plain JSON"),
    ({"call": {1: "x"}}, "keys must be strings"),
    ({"call": {"blob": "x" * 4090}}, "at most 4096 bytes"),
    ({"workload_key": ""}, "workload_key"),
    ({"target_key": None}, "target_key"),
]


@pytest.mark.parametrize(("change", "message"), BAD_VALUES)
def test_bad_values_are_refused_on_construction(change, message):
    fields = {
        "workload_key": WA,
        "target_key": "000000000000a0a0",
        "library": "openblas",
        "version": "1",
        "call": CALL,
        "run_secs": (1e-3,),
        **change,
    }
    with pytest.raises(ValueError, match=message):
        NewLibraryRecord(**fields)


def test_largest_values_are_accepted():
    item = NewLibraryRecord(
        WA, "k", "x" * 64, "v" * 128, {"b": "x" * 4088}, [1e-3] * 64, worker="w" * 128
    )
    assert len(item.call_json.encode()) == 4096 and len(item.run_secs) == 64


def test_bad_values_leave_nothing_written(storage, keys):
    a, _ = keys
    good = lib(WA, a, [1e-3])
    changed = lib(WB, a, [1e-3], call={"blob": []})
    changed.call["blob"].append("x" * 5000)  # mutated after its checks: checked again on add
    with pytest.raises(ValueError, match="at most 4096 bytes"):
        storage.add_library_records([good, changed])
    with pytest.raises(ValueError, match="NewLibraryRecord"):
        storage.add_library_records([good, {"workload_key": WA}])  # type: ignore[list-item]
    assert _count(storage) == 0


@pytest.mark.parametrize("unknown", ["workload", "target", "job"])
def test_unknown_workload_target_or_job_is_a_conflict_and_nothing_written(storage, keys, unknown):
    a, _ = keys
    bad = {
        "workload": lib("ffffffffffffffff", a, [1e-3]),
        "target": lib(WB, "ffffffffffffffff", [1e-3]),
        "job": lib(WB, a, [1e-3], job_id=987654),
    }[unknown]
    with pytest.raises(db.ConflictError, match=f"unknown {unknown}"):
        storage.add_library_records([lib(WA, a, [1e-3]), lib(WC, a, [2e-3]), bad])
    assert _count(storage) == 0
    assert len(storage.add_library_records([lib(WA, a, [1e-3])])) == 1  # still writable


def test_best_per_workload_for_one_target_in_one_query(storage, keys):
    a, b = keys
    added = storage.add_library_records(
        [
            lib(WA, a, [3e-3]),
            lib(WA, a, [1e-3, 2e-3, 3e-3], version="old"),  # median 2e-3
            lib(WA, a, [2e-3], version="tie, later"),  # the same median, stored later: wins
            lib(WA, a, [5e-3]),
            lib(WB, a, [7e-3]),
            lib(WA, b, [1e-4]),  # faster, but on another target
            lib(WC, b, [1e-4]),  # only on another target
        ]
    )
    statements: list[str] = []

    def count(conn, cursor, statement, *args) -> None:
        statements.append(statement)

    event.listen(storage.engine, "before_cursor_execute", count)
    try:
        best = storage.best_library_records(a, [WA, WB, WC, "ffffffffffffffff", WA])
    finally:
        event.remove(storage.engine, "before_cursor_execute", count)
    assert best == {WA: added[2], WB: added[4]}
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    assert storage.best_library_records(b, [WA, WB, WC]) == {WA: added[5], WC: added[6]}
    assert storage.best_library_records(b, [WB]) == {}
    assert storage.best_library_records(a, []) == {}
    assert storage.best_library_records("ffffffffffffffff", [WA, WB]) == {}
    many = [f"f{i:015x}" for i in range(2500)] + [WB]  # more keys than one IN list holds
    assert storage.best_library_records(a, many) == {WB: added[4]}


def test_deleting_a_workload_or_target_deletes_them_a_job_is_unset(storage, keys):
    a, b = keys
    job = storage.create_job(target_id=storage.get_target(a).id, trial_budget=8)
    added = storage.add_library_records(
        [
            lib(WA, a, [1e-3], job_id=job.id),
            lib(WB, a, [1e-3], job_id=job.id),
            lib(WA, b, [1e-3]),
            lib(WC, b, [1e-3]),
        ]
    )
    with storage.engine.begin() as conn:
        conn.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": job.id})
    assert [r.job_id for r in storage.list_library_records()] == [None] * 4
    with storage.engine.begin() as conn:
        conn.execute(text("DELETE FROM workloads WHERE key = :k"), {"k": WA})
    assert [r.id for r in storage.list_library_records()] == [added[1].id, added[3].id]
    with storage.engine.begin() as conn:
        conn.execute(text("DELETE FROM targets WHERE key = :k"), {"k": b})
    assert [r.id for r in storage.list_library_records()] == [added[1].id]


def test_migration_0008_up_and_down_keeps_the_rest(db_url):
    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine, "0007_remeasurements")
        assert "library_records" not in inspect(engine).get_table_names()
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO workloads (key, mod_json) VALUES (:k, '{}')"), {"k": WA})
        assert db.upgrade(engine, "0008_library_records") == "0008_library_records"
        found = inspect(engine)
        assert {i["name"]: i["column_names"] for i in found.get_indexes("library_records")} == {
            "ix_library_records_task": ["workload_id", "target_id"],
            "ix_library_records_job": ["job_id"],
        }
        foreign = {
            f["referred_table"]: f["options"].get("ondelete")
            for f in found.get_foreign_keys("library_records")
        }
        assert foreign == {"workloads": "CASCADE", "targets": "CASCADE", "jobs": "SET NULL"}
        db.schema.downgrade(engine, "0007_remeasurements")
        assert db.current_revision(engine) == "0007_remeasurements"
        assert "library_records" not in inspect(engine).get_table_names()
        with engine.connect() as conn:  # the rest untouched
            assert conn.execute(text("SELECT key FROM workloads")).scalars().all() == [WA]
        assert db.upgrade(engine, "0008_library_records") == "0008_library_records"
    finally:
        engine.dispose()


def test_migration_matches_the_orm_table(db_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from db.models import Base

    engine = create_storage_engine(db_url)
    try:
        db.upgrade(engine)
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diffs = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    ours = [d for d in diffs if "library_records" in repr(d)]
    assert ours == []


def test_records_api_shows_the_tasks_library_records(storage, keys, tmp_path):
    """``GET /records`` over HTTP (the app in this process, on this storage): the task's library
    records beside its tuning records."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.auth import create_token
    from service.settings import Settings

    a, b = keys
    added = storage.add_library_records(
        [
            lib(WA, a, [2e-3, 1e-3, 4e-3], worker="w1"),
            lib(WA, b, [3e-3]),
            lib(WB, a, [1e-3]),
        ]
    )
    token = create_token(storage, name="alice", kind="user")[0]
    app = create_app(Settings(storage_dir=tmp_path / "storage"), storage=storage)
    client = TestClient(app, headers={"Authorization": f"Bearer {token}"})

    def records(**query) -> dict:
        response = client.get("/api/v1/records", params=query)
        assert response.status_code == 200, response.text
        return response.json()

    task = records(workload=WA, target=a)
    assert task["data"] == [] and task["count"] == 0
    [shown] = task["library_records"]
    assert shown["id"] == added[0].id and shown["workload_key"] == WA and shown["target_key"] == a
    assert (shown["library"], shown["version"]) == ("openblas", "scipy-openblas32 0.3.34.481.3")
    assert shown["call"] == CALL and shown["worker"] == "w1" and shown["job_id"] is None
    assert shown["median_ms"] == pytest.approx(2.0)
    assert shown["rounds_ms"] == pytest.approx([2.0, 1.0, 4.0])
    assert shown["spread"] == pytest.approx(1.5) and shown["measured_at"]
    assert [r["id"] for r in records(workload=WA)["library_records"]] == [added[0].id, added[1].id]
    assert records(workload=WA, valid="false")["library_records"] == []
    assert records()["library_records"] == [] and records(target=a)["library_records"] == []
    assert (
        client.get(
            "/api/v1/records", params={"workload": WC, "target": "ffffffffffffffff"}
        ).status_code
        == 404
    )
