"""Issue 31 against a real ``tunehub serve``: a histogram whose counts sum to infinity (case 5)
and a ``.pt2`` archive of more programs than the limit (case 8) are 422s that store nothing; a
one-program archive loads whatever its program is named; a worker holds one lease at a time,
asked in a row or at once (case 7); and case 10: a lease counts no more than its allotted
trials, a worker token registers a bounded number of names, ``GET /workers`` is paged, and
another user's job ids stay out of the shared lists."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import onnx
import pytest

from tests.onnx_factory import matmul_model, two_layer_model
from tests.service.conftest import upload
from tests.service.trust_helpers import (
    cpu,
    job_records,
    job_with_lease,
    matmul_file,
    records_for,
    register,
)

MAX_PROGRAMS = 2
MAX_NAMES = 3


@pytest.fixture(scope="module")
def server(serve):
    return serve(
        workers=0,
        env={
            "TUNEHUB_MAX_PT2_PROGRAMS": str(MAX_PROGRAMS),
            "TUNEHUB_MAX_WORKERS_PER_TOKEN": str(MAX_NAMES),
        },
    )


def _files(server) -> set[Path]:
    """The stored files: models, and what is left in tmp (but the live server's own marker)."""
    found = set()
    for folder in ("models", "tmp"):
        found |= {p for p in (server.storage_dir / folder).rglob("*") if p.is_file()}
    return {p for p in found if not p.name.startswith(".")}


def _stored_nothing(server, client, before: set[Path]) -> None:
    assert client.get("/models").json()["count"] == 0
    assert _files(server) == before


def test_a_histogram_summing_to_infinity_is_refused(server, tmp_path: Path) -> None:
    path = tmp_path / "sym.onnx"
    onnx.save(matmul_model(rows="batch"), path)
    with server.client(server.token("hist-user")) as client:
        before = _files(server)
        for spec in ("batch~16:1e308,32:1e308,64:1e308/2", "batch~16:nan", "batch~16:1e16"):
            reply = upload(client, path, buckets=spec)
            assert reply.status_code == 422, (spec, reply.text)
            assert reply.json()["code"] == "bad_buckets"
            assert "summing to at most" in reply.json()["detail"]
        _stored_nothing(server, client, before)
        assert upload(client, path, buckets="batch~16:40,32:2/2").status_code == 201


def _archive(path: Path, names: list[str]) -> Path:
    import torch
    from torch.export.pt2_archive._package import package_pt2

    class Shift(torch.nn.Module):
        def __init__(self, by: int) -> None:
            super().__init__()
            self.by = by

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.by

    programs = {
        name: torch.export.export(Shift(i), (torch.ones(i + 1),)) for i, name in enumerate(names)
    }
    package_pt2(path, exported_programs=programs)
    return path


def test_programs_are_capped_and_one_loads_under_any_name(server, tmp_path: Path) -> None:
    with server.client(server.token("pt2-user")) as client:
        many = _archive(tmp_path / "many.pt2", ["a", "b", "c"])
        before = _files(server)
        reply = upload(client, many)
        assert reply.status_code == 422, reply.text
        assert reply.json()["code"] == "pt2_too_many_programs"
        assert f"holds 3 programs, over the limit of {MAX_PROGRAMS}" in reply.json()["detail"]
        _stored_nothing(server, client, before)
        one = upload(client, _archive(tmp_path / "forward.pt2", ["forward"]))
        assert one.status_code == 201, one.text
        assert one.json()["format"] == "pt2" and one.json()["tasks"]


def _active(server, worker: str) -> list:
    with server.storage() as storage:
        return storage.list_leases(worker=worker, status="active", limit=100)


def test_a_worker_holds_one_lease_at_a_time(server, tmp_path: Path) -> None:
    """Four lease calls in a row, then four at once, give the worker its one lease again each
    time (what a worker whose answer was lost needs); its end frees it for the next."""
    with (
        server.client(server.token("lease-user")) as user,
        server.client(server.token("lease-pool", kind="worker")) as worker,
    ):
        instance = register(worker, "lease-pool-1", cores=6)
        for rows in (4, 8):
            path = tmp_path / f"two-{rows}.onnx"
            onnx.save(two_layer_model(batch=rows), path)
            model = upload(user, path).json()
            job = user.post(
                "/jobs",
                json={"model_id": model["id"], "trial_budget": 16, "target": cpu(6).key},
            )
            assert job.status_code == 201, job.text

        def ask() -> dict:
            reply = worker.post("/workers/lease-pool-1/lease", params={"instance": instance})
            assert reply.status_code == 200, reply.text
            return reply.json()["lease"]

        first = ask()
        assert first is not None
        assert [ask()["lease_id"] for _ in range(3)] == [first["lease_id"]] * 3
        answers: list = []
        threads = [threading.Thread(target=lambda: answers.append(ask())) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert [a["lease_id"] for a in answers] == [first["lease_id"]] * 4
        assert [lease.id for lease in _active(server, "lease-pool-1")] == [first["lease_id"]]

        end = worker.post(
            f"/workers/leases/{first['lease_id']}/finish", json={"outcome": "returned"}
        )
        assert end.status_code == 200, end.text
        second = ask()
        assert second is not None and second["lease_id"] != first["lease_id"]
        assert [lease.id for lease in _active(server, "lease-pool-1")] == [second["lease_id"]]


def _post_batch(worker, lease_id: int, batch: int, records: list):
    return worker.post(
        f"/workers/leases/{lease_id}/records",
        content=json.dumps({"batch": batch, "records": records}),
        headers={"content-type": "application/json"},
    )


def test_a_lease_counts_no_more_than_its_allotment(server, tmp_path: Path) -> None:
    with (
        server.client(server.token("allot-user")) as user,
        server.client(server.token("allot-pool", kind="worker")) as worker,
    ):
        leased = job_with_lease(
            server, user, worker, "allot-pool-1", matmul_file(tmp_path, 8, 32, 16), cores=7
        )
        allotted = leased.offer["trials"]
        lease_id = leased.offer["lease_id"]
        good = records_for(leased.offer["mod_json"], allotted + 2)
        reply = _post_batch(worker, lease_id, 0, good[: allotted + 1])
        assert reply.status_code == 200 and reply.json()["counted"], reply.text
        assert reply.json()["trials_done"] == allotted  # one record over: not counted
        again = _post_batch(worker, lease_id, 0, good[: allotted + 1])  # a retried upload
        assert again.status_code == 200 and not again.json()["counted"]
        stored = len(job_records(server, leased.job_id))
        beyond = _post_batch(worker, lease_id, 1, good[allotted + 1 :])
        assert beyond.status_code == 409, beyond.text
        assert f"all {allotted} trials it was allotted" in beyond.json()["detail"]
        assert len(job_records(server, leased.job_id)) == stored  # nothing of it stored
        assert user.get(f"/jobs/{leased.job_id}").json()["trials_done"] == allotted


def test_worker_names_per_token_are_capped_and_the_list_is_paged(server) -> None:
    with (
        server.client(server.token("names-user")) as user,
        server.client(server.token("names-pool", kind="worker")) as worker,
        server.client(server.token("names-other", kind="worker")) as other,
    ):
        for i in range(MAX_NAMES):
            register(worker, f"names-pool-{i}")
        refused = worker.post("/workers/register", json={"name": "names-pool-extra"})
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "too_many_workers"
        assert "TUNEHUB_MAX_WORKERS_PER_TOKEN" in refused.json()["detail"]
        register(worker, "names-pool-0")  # a name it holds registers again
        register(other, "names-other-0")  # another token has its own names
        with server.storage() as storage:
            names = [w.name for w in storage.list_workers()]
        assert "names-pool-extra" not in names

        everyone = user.get("/workers", params={"limit": 1000}).json()
        assert everyone["count"] == len(names) == len(everyone["data"])
        first = user.get("/workers", params={"limit": 2}).json()
        rest = user.get("/workers", params={"limit": 1000, "offset": 2}).json()
        assert first["count"] == rest["count"] == len(names) and len(first["data"]) == 2
        assert [w["name"] for w in first["data"] + rest["data"]] == names
        assert user.get("/workers", params={"limit": 0}).status_code == 422


def test_other_users_job_ids_are_not_shown(server, tmp_path: Path) -> None:
    with (
        server.client(server.token("owner-alice")) as alice,
        server.client(server.token("owner-bob")) as bob,
        server.client(server.token("seen-pool", kind="worker")) as worker,
    ):
        leased = job_with_lease(
            server, alice, worker, "seen-pool-1", matmul_file(tmp_path, 4, 16, 16), cores=8
        )
        good = records_for(leased.offer["mod_json"], 2)
        assert _post_batch(worker, leased.offer["lease_id"], 0, good).status_code == 200
        lease_id, workload = leased.offer["lease_id"], leased.offer["workload_key"]

        mine = alice.get("/workers/leases").json()["data"]
        assert lease_id in [x["id"] for x in mine]
        assert [x["job_id"] for x in mine if x["id"] == lease_id] == [leased.job_id]
        assert bob.get("/workers/leases").json()["data"] == []  # bob has no jobs

        def current(client) -> dict:
            listed = client.get("/workers", params={"limit": 1000}).json()["data"]
            return next(w for w in listed if w["name"] == "seen-pool-1")["current_lease"]

        assert current(alice)["job_id"] == leased.job_id
        seen = current(bob)
        assert seen["id"] == lease_id and seen["job_id"] is None and seen["task_id"] is None

        def records(client) -> list:
            return client.get("/records", params={"workload": workload}).json()["data"]

        assert {(r["job_id"], r["worker"]) for r in records(alice)} == {
            (leased.job_id, "seen-pool-1")
        }
        shared = records(bob)
        assert len(shared) == 2  # the evidence is shared...
        assert {(r["job_id"], r["worker"]) for r in shared} == {(None, None)}  # ...not the job
