"""Through HTTP only, against a real ``tunehub serve``: upload → job → tuned by the embedded
worker → verified artifact download → the artifact runs in a fresh process; a running job is
cancelled and its worker stops; the tuning database is browsable; metrics count it all."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import pytest

from tests.service.conftest import REPO, upload, wait_for_job
from tuner.final_build.remeasure import RemeasureConfig


@pytest.fixture(scope="module")
def server(serve):
    return serve()


def test_upload_job_tune_download_run(server, example_model, tmp_path) -> None:
    model_path = example_model("mlp", "onnx")
    with server.client(server.local_token()) as client:
        created = upload(client, model_path)
        assert created.status_code == 201, created.text
        model = created.json()
        assert created.headers["location"].endswith(f"/models/{model['id']}")
        assert model["format"] == "onnx" and len(model["tasks"]) == 3
        assert model["sha256"] == hashlib.sha256(model_path.read_bytes()).hexdigest()
        # The same content again: the same model, no second file.
        again = upload(client, model_path)
        assert again.status_code == 200 and again.json()["id"] == model["id"]
        assert sorted(p.name for p in (server.storage_dir / "models").iterdir()) == [
            model["sha256"]
        ]
        assert client.get("/models").json()["count"] == 1

        response = client.post("/jobs", json={"model_id": model["id"], "trial_budget": 12})
        assert response.status_code == 201, response.text
        job = response.json()
        assert job["status"] == "queued" and job["url"] == f"/api/v1/jobs/{job['id']}"
        started = time.monotonic()
        job = wait_for_job(client, job["id"], {"succeeded", "failed", "cancelled"})
        assert job["status"] == "succeeded", job
        print(f"job tuned and verified in {time.monotonic() - started:.0f} s")
        assert job["trials_done"] >= 12 and job["worker"].endswith("-embedded-0")
        assert job["tasks"] and all(t["status"] == "succeeded" for t in job["tasks"])
        assert all(t["best_latency_ms"] > 0 for t in job["tasks"])
        assert job["best_latency_ms"] > 0 and job["measured_latency_ms"] > 0
        # ONNX Runtime timed on the same inputs when the library was published (the speedup).
        assert job["reference_framework"] == "onnxruntime" and job["reference_latency_ms"] > 0
        artifact = job["artifact"]
        assert artifact["verified"] is True

        library = client.get(artifact["library_url"].removeprefix("/api/v1"))
        assert library.status_code == 200
        digest = hashlib.sha256(library.content).hexdigest()
        assert digest == artifact["sha256"] == library.headers["x-checksum-sha256"]
        manifest = client.get(artifact["manifest_url"].removeprefix("/api/v1")).json()
        assert manifest["verification"]["passed"] is True and manifest["tuned"] is True
        assert manifest["job_id"] == job["id"]

        # The job's preview: its zero-trial build (library peers, default schedules), built,
        # verified and published by the embedded worker before it tuned.
        preview = job["preview"]
        assert preview["verified"] is True
        assert preview["library_url"].endswith(f"/jobs/{job['id']}/artifacts/preview/model.so")
        preview_library = client.get(preview["library_url"].removeprefix("/api/v1"))
        assert preview_library.status_code == 200
        assert hashlib.sha256(preview_library.content).hexdigest() == preview["sha256"]
        preview_manifest = client.get(preview["manifest_url"].removeprefix("/api/v1")).json()
        assert preview_manifest["zero_trial"] is True and preview_manifest["tuned"] is False
        assert preview_manifest["job_id"] == job["id"]
        assert preview_manifest["verification"]["passed"] is True
        assert preview_manifest["measured"]["median_ms"] > 0
        leases = client.get("/workers/leases", params={"job_id": job["id"]}).json()["data"]
        kinds = [lease["kind"] for lease in sorted(leases, key=lambda lease: lease["id"])]
        assert kinds[0] == "preview" and kinds[-1] == "finalize" and kinds.count("preview") == 1

        # The tuning database: this model's workloads have records, the job's records are listed.
        workloads = client.get("/workloads", params={"model_id": model["id"]}).json()
        assert workloads["count"] == 3
        assert sum(w["records_valid"] + w["records_failed"] for w in workloads["data"]) >= 12
        records = client.get("/records", params={"job_id": job["id"], "limit": 5}).json()
        assert records["count"] >= 12 and len(records["data"]) == 5 and records["next_after"]
        page2 = client.get("/records", params={"job_id": job["id"], "after": records["next_after"]})
        assert page2.json()["data"][0]["id"] > records["next_after"]
        # A record carries its repeat count and spread, and the re-measurements the job's final
        # build made of it (the worker's manifest, stored by the server): one chosen per task.
        every = client.get("/records", params={"job_id": job["id"], "limit": 1000}).json()["data"]
        valid = [r for r in every if r["is_valid"]]
        assert valid and all(r["repeats"] == len(r["run_ms"]) and r["spread"] >= 0 for r in valid)
        again = [m for r in every for m in r["remeasurements"]]
        rounds = RemeasureConfig.from_env().rounds  # the server inherits the tests' setting
        assert again and all(
            m["job_id"] == job["id"] and len(m["rounds_ms"]) == rounds for m in again
        )
        records_won = [
            t
            for t in manifest["remeasured"]
            if any(c["chosen"] and "trace_hash" in c for c in t["candidates"])
        ]
        assert sum(m["chosen"] for m in again) == len(records_won)
        # The tuned library differs from the preview where a tuned record won a task and the
        # tuned library was published (where the peers and default schedules won every
        # re-measure it may be the same build, byte for byte: a 12-trial search of this MLP
        # sometimes finds nothing faster). Where the whole-model comparison found the zero-trial
        # library faster, that library is published: the preview's build, byte for byte.
        published = manifest["final_choice"]["published"]
        assert published in {"tuned", "zero_trial"} and manifest["final_choice"]["compared"]
        if published == "zero_trial":
            assert preview["sha256"] == artifact["sha256"]
        elif records_won:
            assert preview["sha256"] != artifact["sha256"]
        assert {t["key"] for t in manifest["remeasured"]} <= {w["key"] for w in workloads["data"]}
        key = workloads["data"][0]["key"]
        assert client.get(f"/workloads/{key}").json()["key"] == key
        assert client.get("/stats").json()["jobs_by_status"]["succeeded"] == 1
        assert client.get("/targets").json()["count"] == 1

    # The downloaded artifact runs in a fresh process.
    so_path = tmp_path / "model.so"
    so_path.write_bytes(library.content)
    code = (
        "import sys, numpy as np; from compiler.build.runner import LoadedLibrary;"
        "lib = LoadedLibrary(sys.argv[1]);"
        "out = lib.run([np.ones((1, 784), 'float32')]); print(out[0].shape)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(so_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(1, 10)"

    import httpx

    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'tunehub_jobs{status="succeeded"} 1.0' in metrics
    assert "tunehub_queue_depth 0.0" in metrics and "tunehub_trials_total" in metrics


def test_cancel_running_job_stops_the_worker(server, tmp_path) -> None:
    import onnx

    from tests.onnx_factory import matmul_model

    path = tmp_path / "matmul.onnx"
    onnx.save(matmul_model(rows=32, inner=128, cols=64), path)
    budget = 8  # one task: two batches of 4, the cancel lands during the second
    with server.client(server.local_token()) as client:
        model = upload(client, path).json()
        assert len(model["tasks"]) == 1, model
        job = client.post("/jobs", json={"model_id": model["id"], "trial_budget": budget}).json()
        # Cancel once the worker is measuring (its first batch is stored).
        deadline = time.monotonic() + 300
        while (current := client.get(f"/jobs/{job['id']}").json())["trials_done"] == 0:
            assert current["status"] in ("queued", "running"), current
            assert time.monotonic() < deadline, "no batch measured in time"
            time.sleep(0.5)
        cancelled = client.post(f"/jobs/{job['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        # The worker notices at its next batch and goes idle; the job stays cancelled.
        deadline = time.monotonic() + 180
        while True:
            workers = client.get("/workers").json()["data"]
            if all(w["status"] == "idle" for w in workers):
                break
            assert time.monotonic() < deadline, workers
            time.sleep(0.5)
        final = client.get(f"/jobs/{job['id']}").json()
        assert final["status"] == "cancelled" and final["artifact"] is None
        assert final["trials_done"] <= budget
        assert not (server.storage_dir / "artifacts" / f"job-{job['id']}").exists()
        # Cancelling a finished job is a clear 409, and the service keeps serving.
        again = client.post(f"/jobs/{job['id']}/cancel")
        assert again.status_code == 409 and again.json()["code"] == "job_finished"
        assert "already cancelled" in again.json()["detail"]
        assert client.get(f"/jobs/{job['id']}/artifacts/model.so").status_code == 409
        # The model of a finished job can be deleted; its file goes with the last row.
        assert client.delete(f"/models/{model['id']}").status_code == 204
        assert not (server.storage_dir / "models" / model["sha256"]).exists()
        assert client.get(f"/jobs/{job['id']}").json()["model_id"] is None
    assert server.alive()
    log = (server.home / "logs" / "worker-0.log").read_text()
    assert f"job {job['id']} cancelled" in log, log[-2000:]
