"""Issue 31 (cases 3 and 4) against a real ``tunehub serve``: every uploaded record is checked
against a physical limit of its task, also a task with no FLOPs (a reshape), by the bytes it must
write and the least time of any kernel call; and a task's library records come back in pages
with a count from ``GET /records``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.service.trust_helpers import job_records, job_with_lease, records_for


@pytest.fixture(scope="module")
def server(serve):
    return serve(workers=0)


def reshape_file(folder: Path, rows: int, cols: int) -> Path:
    """An ONNX model of one Reshape, ``rows x cols`` to ``cols x rows``: one task, 0 FLOPs."""
    import numpy as np
    import onnx
    from onnx import helper

    from tests.onnx_factory import float_input, make_model

    shape = onnx.numpy_helper.from_array(np.array([cols, rows], dtype="int64"), "shape")
    model = make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [float_input("x", [rows, cols])],
        [float_input("y", [cols, rows])],
        [shape],
    )
    path = folder / f"reshape-{rows}x{cols}.onnx"
    onnx.save(model, path)
    return path


def _post_batch(worker, lease_id: int, batch: int, records: list):
    return worker.post(
        f"/workers/leases/{lease_id}/records",
        content=json.dumps({"batch": batch, "records": records}),
        headers={"content-type": "application/json"},
    )


def _upload_and_check(server, tmp_path, name: str, rows: int, cols: int, fast: float):
    """A job of a reshape model leased to worker ``name``; one plausible record (0.1 ms), then
    one of ``fast`` seconds. Returns the job's stored records, the fast one's public row and
    the workload's best record."""
    with (
        server.client(server.token("alice")) as user,
        server.client(server.token(f"{name}-token", kind="worker")) as worker,
    ):
        leased = job_with_lease(server, user, worker, name, reshape_file(tmp_path, rows, cols))
        offer = leased.offer
        assert "reshape" in offer["workload_name"], offer["workload_name"]
        good = records_for(offer["mod_json"], 2)
        reply = _post_batch(worker, offer["lease_id"], 0, [good[0]])
        assert reply.status_code == 200 and reply.json()["counted"], reply.text
        reply = _post_batch(worker, offer["lease_id"], 1, [{**good[1], "run_secs": [fast]}])
        assert reply.status_code == 200, reply.text  # held, never refused
        page = user.get("/records", params={"job_id": leased.job_id}).json()["data"]
    with server.storage() as storage:
        workload = storage.get_workload(offer["workload_key"])
        target = storage.get_target(offer["target"]["key"])
        assert workload.flops == 0.0  # the task the FLOP check used to let through
        best = storage.best_record(workload.id, target.id)
    [shown] = [r for r in page if r["run_ms"] and r["run_ms"][0] == pytest.approx(fast * 1e3)]
    return job_records(server, leased.job_id), shown, best


def test_a_zero_flop_record_of_1e_300_s_is_held_and_not_the_best(server, tmp_path):
    """Case 3: a reshape task (0 FLOPs) and a record of 1e-300 s: held by the least time of any
    kernel call; the best stays the plausible 0.1 ms record."""
    stored, shown, best = _upload_and_check(server, tmp_path, "plaus-a-1", 64, 128, 1e-300)
    assert len(stored) == 2 and sum(r.quarantined for r in stored) == 1
    assert shown["quarantined"] and not shown["is_valid"]
    assert shown["error_text"].startswith("held: ") and "kernel call" in shown["error_text"]
    assert best is not None and best.mean_secs == pytest.approx(1e-4)


def test_a_record_faster_than_its_output_bytes_allow_is_held(server, tmp_path):
    """A memory-bound task with 16 MiB of output and a record of 20 ns: above the call floor,
    no FLOPs to bound it, but 8e14 B/s: held by the memory-bandwidth limit."""
    stored, shown, best = _upload_and_check(server, tmp_path, "plaus-b-1", 2048, 2048, 2e-8)
    assert sum(r.quarantined for r in stored) == 1
    assert shown["quarantined"] and "output bytes" in shown["error_text"]
    assert best is not None and best.mean_secs == pytest.approx(1e-4)


def test_library_records_are_paged_with_a_count(server):
    """Case 4: 2,000 library records of one task (one held): ``limit=1`` returns one of them,
    their count and the cursor of the next page; ``valid=`` picks the held or the others."""
    from db import NewLibraryRecord
    from tests.db.test_db_library_records import _Spec

    key = "0000000000031abc"
    with server.storage() as storage:
        storage.ensure_workload(key, '{"nodes":[]}')
        target = storage.ensure_target(_Spec("0000000000031def"))
        call = {"kind": "gemm", "function": "tunehub.peer.gemm"}
        planted = storage.add_library_records(
            [NewLibraryRecord(key, target.key, "tvm", "x", call, (1e-12,), held_reason="held: x")]
            + [NewLibraryRecord(key, target.key, "openblas", "1", call, (1e-3,))] * 1999
        )
    with server.client(server.token("bob")) as user:
        reply = user.get("/records", params={"workload": key, "limit": 1})
        assert reply.status_code == 200, reply.text
        assert len(reply.content) < 10_000
        body = reply.json()
        assert [r["id"] for r in body["library_records"]] == [planted[0].id]
        assert body["library_records"][0]["quarantined"]
        assert body["library_count"] == 2000
        assert body["library_next_after"] == planted[0].id
        after = {"workload": key, "limit": 2, "library_after": planted[0].id}
        page = user.get("/records", params=after).json()
        assert [r["id"] for r in page["library_records"]] == [planted[1].id, planted[2].id]
        held = user.get("/records", params={"workload": key, "valid": "false"}).json()
        assert [r["id"] for r in held["library_records"]] == [planted[0].id]
        assert held["library_count"] == 1
        plausible = user.get("/records", params={"workload": key, "valid": "true", "limit": 5})
        assert plausible.json()["library_count"] == 1999
        assert len(plausible.json()["library_records"]) == 5
