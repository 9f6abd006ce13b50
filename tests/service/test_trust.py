"""Issue 18 (trust boundaries) against a real ``tunehub serve``: records are evidence checked
before they count (case 1), a worker token reaches only its own workers' leases and the server
re-verifies an artifact (case 2), a name is held by one process at a time and a silent worker's
lease expires (case 6), owner checks, cancelled and empty batches, model ids (case 7)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.service.conftest import REPO, start_server, stop_server, upload
from tests.service.trust_helpers import (
    job_records,
    job_with_lease,
    matmul_file,
    records_for,
    register,
)

LEASE_SECS = 3


@pytest.fixture(scope="module")
def server(serve):
    return serve(workers=0, env={"TUNEHUB_LEASE_SECS": str(LEASE_SECS)})


def _post_batch(worker, lease_id: int, batch: int, records: list) -> object:
    return worker.post(
        f"/workers/leases/{lease_id}/records",
        content=json.dumps({"batch": batch, "records": records}),
        headers={"content-type": "application/json"},
    )


def test_records_are_checked_before_they_count(server, tmp_path) -> None:
    model = matmul_file(tmp_path, 8, 32, 16)
    with (
        server.client(server.token("alice")) as user,
        server.client(server.token("pool-a", kind="worker")) as worker,
    ):
        leased = job_with_lease(server, user, worker, "pool-a-1", model)
        lease_id, mod_json = leased.offer["lease_id"], leased.offer["mod_json"]
        good = records_for(mod_json, 4)
        bad = {
            "garbage trace": [{"trace": ["garbage"], "run_secs": [1e-12], "args_info": []}],
            "a trace that does not replay": [
                {**good[0], "trace": [[["GetSBlock", [], ["nope", "main"], ["b0"]]], []]}
            ],
            "NaN": [{**good[0], "run_secs": [float("nan"), -1.0]}],
            "negative": [{**good[0], "run_secs": [-1.0]}],
            "zero": [{**good[0], "run_secs": [0.0]}],
            "infinite": [{**good[0], "run_secs": [float("inf")]}],
            "wrong args_info": [{**good[0], "args_info": [["TENSOR", "float32", [1]]]}],
            "one bad record among good ones": [*good[:3], {**good[3], "run_secs": [-5.0]}],
            "empty batch": [],
        }
        for what, records in bad.items():
            reply = _post_batch(worker, lease_id, 0, records)
            assert reply.status_code == 422, (what, reply.text)
            assert reply.json()["detail"], what
            assert job_records(server, leased.job_id) == [], what  # nothing of it stored
        assert user.get(f"/jobs/{leased.job_id}").json()["trials_done"] == 0

        reply = _post_batch(worker, lease_id, 0, good[:2])
        assert reply.status_code == 200 and reply.json()["counted"], reply.text
        stored = job_records(server, leased.job_id)
        assert len(stored) == 2 and {r.worker for r in stored} == {"pool-a-1"}
        assert all(r.is_valid and not r.quarantined for r in stored)

        # Faster than any CPU can run it: held, never the best.
        fast = [{**good[2], "run_secs": [1e-15]}]
        reply = _post_batch(worker, lease_id, 1, fast)
        assert reply.status_code == 200, reply.text
        page = user.get("/records", params={"job_id": leased.job_id}).json()["data"]
        held = [r for r in page if r["quarantined"]]
        assert len(held) == 1 and not held[0]["is_valid"] and "held" in held[0]["error_text"]
        with server.storage() as storage:
            workload = storage.get_workload(leased.offer["workload_key"])
            target = storage.get_target(leased.offer["target"]["key"])
            assert storage.best_record(workload.id, target.id).mean_secs == pytest.approx(1e-4)

        # 20x faster than another worker's best: held as well.
        other = server.token("pool-b", kind="worker")
        with server.client(other) as worker_b:
            leased_b = job_with_lease(
                server, user, worker_b, "pool-b-1", matmul_file(tmp_path, 8, 32, 16), budget=4
            )
            assert leased_b.offer["workload_key"] == leased.offer["workload_key"]
            suspicious = [{**good[3], "run_secs": [1e-7]}]
            reply = _post_batch(worker_b, leased_b.offer["lease_id"], 0, suspicious)
            assert reply.status_code == 200, reply.text
            rows = [r for r in job_records(server, leased_b.job_id)]
            assert len(rows) == 1 and rows[0].quarantined and rows[0].worker == "pool-b-1"

        # An operator quarantines everything of worker pool-a-1: no best record is left.
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "service.cli",
                "db",
                "quarantine",
                "--worker",
                "pool-a-1",
                "--db",
                server.db_url,
                "--json",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout) == {"quarantined": 2}
        with server.storage() as storage:
            assert storage.best_record(workload.id, target.id) is None


def test_a_worker_token_reaches_only_its_own_leases(server, tmp_path) -> None:
    model = matmul_file(tmp_path, 4, 16, 8)
    owner, intruder = server.token("pool-c", kind="worker"), server.token("pool-d", kind="worker")
    with (
        server.client(server.token("bob")) as user,
        server.client(owner) as worker,
        server.client(intruder) as other,
    ):
        leased = job_with_lease(server, user, worker, "pool-c-1", model, budget=4, cores=2)
        lease_id = leased.offer["lease_id"]
        assert leased.offer["kind"] == "tune", leased.offer
        good = records_for(leased.offer["mod_json"], leased.offer["trials"])
        register(other, "pool-d-1", 2)
        # Another token's worker: no uploads, context, finish, heartbeat or lease on its name.
        assert _post_batch(other, lease_id, 0, good).status_code == 403
        assert other.get(f"/workers/leases/{lease_id}/context").status_code == 403
        assert (
            other.post(f"/workers/leases/{lease_id}/finish", json={"outcome": "failed"}).status_code
            == 403
        )
        assert other.post("/workers/pool-c-1/heartbeat", json={}).status_code == 403
        assert other.post("/workers/pool-c-1/lease").status_code == 403
        assert other.post("/workers/register", json={"name": "pool-c-1"}).status_code == 403
        assert job_records(server, leased.job_id) == []
        # Not even the owner reads the model before it holds the job's finalize lease.
        assert worker.get(f"/workers/jobs/{leased.job_id}/model").status_code == 403
        assert worker.get(f"/workers/leases/{lease_id}/context").status_code == 200

        assert _post_batch(worker, lease_id, 0, good).status_code == 200
        end = worker.post(f"/workers/leases/{lease_id}/finish", json={"outcome": "done"})
        assert end.status_code == 200, end.text
        final = worker.post("/workers/pool-c-1/lease", params={"instance": leased.instance})
        offer = final.json()["lease"]
        assert offer is not None and offer["kind"] == "finalize", final.text
        assert other.get(f"/workers/jobs/{leased.job_id}/model").status_code == 403
        assert worker.get(f"/workers/jobs/{leased.job_id}/model").status_code == 200

        # A forged library whose manifest says it passed: never published (issue 31: the
        # server builds the artifact itself from its records and publishes that).
        files = {
            "library": ("model.so", b"\x7fELF not really a library", "application/octet-stream"),
            "manifest": (
                "manifest.json",
                json.dumps({"verification": {"passed": True}}),
                "application/json",
            ),
        }
        assert (
            other.post(f"/workers/leases/{offer['lease_id']}/artifact", files=files).status_code
            == 403
        )
        reply = worker.post(f"/workers/leases/{offer['lease_id']}/artifact", files=files)
        assert reply.status_code == 200, reply.text
        job = user.get(f"/jobs/{leased.job_id}").json()
        assert job["status"] == "succeeded" and job["artifact"]["built_by"] == "server", job
        published = user.get(f"/jobs/{leased.job_id}/artifacts/model.so")
        assert published.status_code == 200 and published.content != files["library"][1]


def test_one_process_per_name_and_silent_leases_expire(server, tmp_path) -> None:
    model = matmul_file(tmp_path, 4, 8, 8)
    token = server.token("pool-e", kind="worker")
    with server.client(server.token("carol")) as user, server.client(token) as worker:
        leased = job_with_lease(server, user, worker, "pool-e-1", model, budget=8, cores=3)
        orphan = leased.instance
        # A new process registers the same name: the orphan's lease goes back, and the orphan
        # can neither heartbeat nor take work any more.
        fresh = register(worker, "pool-e-1", 3)
        assert fresh != orphan
        page = user.get("/workers/leases", params={"job_id": leased.job_id}).json()["data"]
        lease = [x for x in page if x["id"] == leased.offer["lease_id"]][0]
        assert lease["status"] != "active"
        assert (
            worker.post("/workers/pool-e-1/heartbeat", json={"instance": orphan}).status_code == 409
        )
        assert (
            worker.post("/workers/pool-e-1/lease", params={"instance": orphan}).status_code == 409
        )
        # The new process takes the task, then goes silent while the orphan keeps beating.
        offer = worker.post("/workers/pool-e-1/lease", params={"instance": fresh}).json()["lease"]
        assert offer is not None and offer["job_id"] == leased.job_id
        deadline = time.monotonic() + LEASE_SECS + 10
        while time.monotonic() < deadline:
            assert (
                worker.post("/workers/pool-e-1/heartbeat", json={"instance": orphan}).status_code
                == 409
            )
            time.sleep(0.5)
        register(worker, "pool-e-2", 3)  # any request for work reaps expired leases
        worker.post("/workers/pool-e-2/lease")
        statuses = {
            x["id"]: x["status"]
            for x in user.get("/workers/leases", params={"job_id": leased.job_id}).json()["data"]
        }
        assert statuses[offer["lease_id"]] == "expired", statuses


def test_owner_checks_cancelled_and_model_ids(server, tmp_path) -> None:
    with (
        server.client(server.token("dave")) as dave,
        server.client(server.token("erin")) as erin,
        server.client(server.token("pool-f", kind="worker")) as worker,
    ):
        leased = job_with_lease(
            server, dave, worker, "pool-f-1", matmul_file(tmp_path, 2, 8, 4), cores=4
        )
        good = records_for(leased.offer["mod_json"], 3)
        assert _post_batch(worker, leased.offer["lease_id"], 0, good[:1]).status_code == 200
        # Another user sees neither the job's records nor its leases.
        assert erin.get("/records", params={"job_id": leased.job_id}).status_code == 404
        assert erin.get("/workers/leases", params={"job_id": leased.job_id}).status_code == 404
        assert dave.get("/records", params={"job_id": leased.job_id}).json()["count"] == 1
        # A batch uploaded after the cancellation does not count.
        assert dave.post(f"/jobs/{leased.job_id}/cancel").status_code in (200, 202)
        reply = _post_batch(worker, leased.offer["lease_id"], 1, good[1:])
        if reply.status_code == 200:
            assert not reply.json()["counted"] and not reply.json()["keep_going"]
        assert dave.get(f"/jobs/{leased.job_id}").json()["trials_done"] == 1

        # A deleted model's id is never handed out again.
        first = upload(dave, matmul_file(tmp_path, 3, 8, 4)).json()
        assert dave.delete(f"/models/{first['id']}").status_code in (200, 204)
        second = upload(dave, matmul_file(tmp_path, 5, 8, 4)).json()
        assert second["id"] > first["id"]


def test_embedded_workers_die_with_their_server(tmp_path) -> None:
    import psutil

    server = start_server(tmp_path / "home", workers=1)
    children: list = []
    try:
        deadline = time.monotonic() + 60
        while True:
            children = [
                p
                for p in psutil.Process(server.proc.pid).children(recursive=True)
                if "worker" in " ".join(p.cmdline())
            ]
            if children or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert children, "no embedded worker started"
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        gone, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        for child in children:  # a worker that outlived its server (the bug) is ours to stop
            with contextlib.suppress(psutil.Error):
                child.kill()
        stop_server(server)
