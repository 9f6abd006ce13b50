"""Remote workers over HTTP against a real ``tunehub serve`` (no embedded worker), with real
MetaSchedule measurements:

- a worker killed with SIGKILL mid-batch loses its lease when its heartbeats stop; another worker
  takes over the rest of the task and finishes the job; nothing uploaded is lost, nothing is
  counted twice, only the batch in flight is measured again;
- three workers, PostgreSQL and a TVM RPC tracker with RPC servers on loopback share one job:
  every task is leased and done exactly once, measured through the RPC servers.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from tests.service.conftest import start_server, stop_server, upload, wait_for_job
from tests.service.workers_helpers import start_rpc, start_worker, wait_exit

LEASE_SECS = 15


def _when(text: str) -> datetime:
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _leases(client, job_id: int) -> list[dict]:
    return client.get("/workers/leases", params={"job_id": job_id}).json()["data"]


def _records(client, job_id: int) -> list[dict]:
    data, after = [], 0
    while True:
        page = client.get(
            "/records", params={"job_id": job_id, "after": after, "limit": 1000}
        ).json()
        data += page["data"]
        if page["next_after"] is None:
            return data
        after = page["next_after"]


@pytest.fixture(scope="module")
def server(serve):
    return serve(workers=0, env={"TUNEHUB_LEASE_SECS": str(LEASE_SECS)})


def test_killed_worker_loses_its_lease_and_another_finishes(server, tmp_path) -> None:
    import onnx

    from tests.onnx_factory import matmul_model

    path = tmp_path / "matmul.onnx"
    onnx.save(matmul_model(rows=32, inner=128, cols=64), path)
    budget = 8  # one task: one lease of two batches of 4
    token = server.token("ci-runner", kind="worker")
    with server.client(server.token("carol")) as user, server.client(token) as as_worker:
        model = upload(user, path).json()
        assert len(model["tasks"]) == 1
        job = user.post("/jobs", json={"model_id": model["id"], "trial_budget": budget}).json()

        doomed = start_worker(server, token, "doomed", tmp_path)
        deadline = time.monotonic() + 400
        while len(before := _records(user, job["id"])) < 4:  # its first batch is uploaded
            assert doomed.popen.poll() is None, doomed.text()[-3000:]
            assert time.monotonic() < deadline, (
                f"no batch uploaded in time: {doomed.text()[-3000:]}"
            )
            time.sleep(0.2)
        workers = {w["name"]: w for w in user.get("/workers").json()["data"]}
        lease = workers["doomed"]["current_lease"]
        assert lease is not None and lease["kind"] == "tune" and lease["job_id"] == job["id"]
        doomed.kill9()  # mid-batch: the second batch is being searched or measured
        killed_at = time.monotonic()
        uploaded = {r["trace_hash"]: r for r in _records(user, job["id"])}
        assert {r["trace_hash"] for r in before} <= set(uploaded)

        # The lease is still the dead worker's until it expires: nobody else gets the task.
        successor = start_worker(server, token, "successor", tmp_path, "--once")
        assert wait_exit(successor, 600) == 0, successor.text()[-4000:]
        waited = time.monotonic() - killed_at
        final = wait_for_job(user, job["id"], {"succeeded", "failed", "cancelled"}, timeout=60)
        assert final["status"] == "succeeded", (final, successor.text()[-3000:])
        assert final["artifact"]["verified"] is True and final["worker"] == "successor"

        leases = _leases(user, job["id"])
        dead = next(x for x in leases if x["id"] == lease["id"])
        tune = [x for x in leases if x["kind"] == "tune"]
        finalize = [x for x in leases if x["kind"] == "finalize"]
        assert dead["status"] == "expired" and dead["worker"] == "doomed"
        assert dead["trials_done"] >= 4 and "heartbeat" in dead["error"]
        rest = [x for x in tune if x["id"] != dead["id"]]
        # Nobody got the task while the dead worker's lease was valid.
        assert all(_when(x["created_at"]) >= _when(dead["expires_at"]) for x in rest + finalize)
        assert waited >= LEASE_SECS * 0.5
        # Only what was not uploaded is leased again: at most the batch in flight is re-measured.
        assert sum(x["trials"] for x in rest) == budget - dead["trials_done"]
        assert all(x["status"] == "done" and x["worker"] == "successor" for x in rest)
        assert [x["status"] for x in finalize] == ["done"] and finalize[0]["worker"] == "successor"

        # Counted once: the task's and the job's trials are the budget, split between workers.
        assert final["trials_done"] == budget
        assert [t["trials_done"] for t in final["tasks"]] == [budget]
        assert dead["trials_done"] + sum(x["trials_done"] for x in rest) == budget
        after = {r["trace_hash"]: r for r in _records(user, job["id"])}
        assert set(uploaded) <= set(after)  # nothing the dead worker uploaded was lost
        assert dead["trials_done"] <= len(after) <= budget  # one row per schedule, none twice

        # A late upload from the expired lease is still accepted, and counts nothing.
        key = model["tasks"][0]["key"]
        target = final["target_key"]
        seeds = as_worker.get(
            "/workers/records", params={"workload": key, "target": target, "k": 1}
        )
        trace, run_secs, _, args_info = seeds.json()["data"][0]
        late = as_worker.post(
            f"/workers/leases/{dead['id']}/records",
            json={
                "batch": dead["batches_done"],
                "records": [{"trace": trace, "run_secs": run_secs, "args_info": args_info}],
            },
        )
        assert late.status_code == 200, late.text
        assert late.json() | {"trials_done": 0} == {
            "accepted": 1,
            "counted": False,
            "keep_going": False,
            "lease_status": "expired",
            "job_status": "succeeded",
            "trials_done": 0,
        }
        assert user.get(f"/jobs/{job['id']}").json()["trials_done"] == budget
        assert (
            as_worker.post(f"/workers/leases/{dead['id']}/finish", json={"outcome": "done"}).json()[
                "code"
            ]
            == "lease_lost"
        )
    assert "lease expired" in dead["error"] or "heartbeat" in dead["error"]
    assert server.alive()


def test_sigterm_returns_the_lease(server, tmp_path) -> None:
    import signal

    import onnx

    from tests.onnx_factory import matmul_model

    path = tmp_path / "matmul-small.onnx"
    onnx.save(matmul_model(rows=16, inner=64, cols=32), path)
    token = server.token("ci-term", kind="worker")
    with server.client(server.token("erin")) as user:
        model = upload(user, path).json()
        job = user.post("/jobs", json={"model_id": model["id"], "trial_budget": 8}).json()
        worker = start_worker(server, token, "terminated", tmp_path)
        deadline = time.monotonic() + 300
        while True:
            listed = {w["name"]: w for w in user.get("/workers").json()["data"]}
            if listed.get("terminated", {}).get("current_lease"):
                break
            assert worker.popen.poll() is None, worker.text()[-3000:]
            assert time.monotonic() < deadline, worker.text()[-3000:]
            time.sleep(0.3)
        worker.popen.send_signal(signal.SIGTERM)  # a CI runner being cancelled
        assert wait_exit(worker, 60) == 128 + signal.SIGTERM
        (lease,) = _leases(user, job["id"])
        assert lease["status"] == "returned" and "signal" in lease["error"]
        detail = user.get(f"/jobs/{job['id']}").json()
        assert detail["status"] == "running" and detail["tasks"][0]["status"] == "queued"
        assert detail["tasks"][0]["trials_done"] == lease["trials_done"]  # uploads kept
        assert {w["name"]: w for w in user.get("/workers").json()["data"]}["terminated"][
            "status"
        ] == "offline"
        assert "lease" in worker.text() and "returned" in worker.text()
        user.post(f"/jobs/{job['id']}/cancel")


@pytest.fixture
def postgres_url(tmp_path):
    from tests.db.conftest import new_database_url

    yield from new_database_url("postgresql", tmp_path)


def test_three_workers_postgres_and_rpc_tracker(tmp_path, postgres_url, example_model) -> None:
    import db

    with db.open_storage(postgres_url, upgrade=True):
        pass  # `tunehub db upgrade`
    server = start_server(
        tmp_path / "home",
        workers=0,
        db_url=postgres_url,
        # One task a lease: three tasks go to the three workers whatever order they register
        # in (several-task leases are shared among the workers idle when one asks).
        env={"TUNEHUB_LEASE_SECS": "60", "TUNEHUB_LEASE_TASKS": "1"},
    )
    rpc = start_rpc(tmp_path, servers=2)
    workers = []
    try:
        token = server.token("ci", kind="worker")
        with server.client(server.token("dave")) as user:
            model = upload(user, example_model("mlp", "onnx")).json()
            assert len(model["tasks"]) == 3
            job = user.post("/jobs", json={"model_id": model["id"], "trial_budget": 12}).json()
            workers = [
                start_worker(
                    server,
                    token,
                    f"ci-{i}",
                    tmp_path,
                    "--once",
                    "--rpc-tracker",
                    rpc.tracker,
                    "--rpc-key",
                    rpc.key,
                )
                for i in range(3)
            ]
            for proc in workers:
                assert wait_exit(proc, 900) == 0, proc.text()[-4000:]
            final = wait_for_job(user, job["id"], {"succeeded", "failed", "cancelled"}, timeout=30)
            assert final["status"] == "succeeded", final
            assert final["artifact"]["verified"] is True

            leases = _leases(user, job["id"])
            tune = [x for x in leases if x["kind"] == "tune"]
            # Every task leased and done exactly once (a lease may cover several: the live
            # workers share the queued tasks); nothing expired, nothing repeated.
            leased = sorted(t for x in tune for t in x["task_ids"])
            assert leased == sorted(t["id"] for t in final["tasks"])
            assert all(x["task_id"] == x["task_ids"][0] for x in tune)
            assert {x["status"] for x in leases} == {"done"}
            assert [x["kind"] for x in leases].count("finalize") == 1
            # One worker built the job's zero-trial preview first; the server re-verified it.
            assert [x["kind"] for x in leases].count("preview") == 1
            assert final["preview"]["verified"] is True
            preview = user.get(final["preview"]["manifest_url"].removeprefix("/api/v1")).json()
            review = preview["server_review"]  # issue 31: the server built it itself
            assert preview["zero_trial"] and review["verified"] and review["built_by"] == "server"
            # A lease of several tasks spreads its trials as the gradient scheduler chooses.
            assert all(t["status"] == "succeeded" for t in final["tasks"])
            assert sum(t["trials_done"] for t in final["tasks"]) == 12
            assert final["trials_done"] == 12 == sum(x["trials_done"] for x in tune)
            records = _records(user, job["id"])
            # Stored: the counted 12, and what a lease's last batch measured past its trials
            # (a sibling seed can precede it; evidence, not counted); never a schedule twice.
            assert 12 <= len(records) < 12 + 4
            assert len({r["trace_hash"] for r in records}) == len(records)
            by_worker = {x["worker"] for x in tune}
            print(f"tune leases by worker: {sorted((x['worker'], x['task_ids']) for x in tune)}")
            assert by_worker <= {"ci-0", "ci-1", "ci-2"} and len(by_worker) >= 2
            listed = {w["name"]: w for w in user.get("/workers").json()["data"]}
            assert {listed[f"ci-{i}"]["status"] for i in range(3)} == {"offline"}
            assert all(listed[f"ci-{i}"]["current_lease"] is None for i in range(3))
        # Measured on the RPC servers, not in the workers.
        assert rpc.server_logs().count("load_module") >= 12, rpc.server_logs()[-2000:]
    finally:
        for proc in workers:
            proc.stop()
        rpc.stop()
        stop_server(server)
