"""Bad inputs through HTTP: each is a 4xx with a clear ``{"detail", "code"}`` body, the service
keeps serving, and nothing is half-written (no model row without its file, no file without a row,
no upload left in the staging folder)."""

from __future__ import annotations

import os

import httpx
import pytest

from tests.service.conftest import UPLOAD_LIMIT, upload
from tests.service.request_helpers import tmp_leftovers


@pytest.fixture(scope="module")
def server(serve):
    return serve(workers=0)  # no worker: jobs stay queued, nothing tunes


@pytest.fixture(scope="module")
def alice(server):
    with server.client(server.token("alice")) as client:
        yield client


@pytest.fixture
def model_id(alice, example_model) -> int:
    """An id of one of alice's models: the first listed, or the MLP uploaded now. xdist may run
    this module's tests on two workers, each with its own server, so no test can count on
    another's upload."""
    models = alice.get("/models").json()["data"]
    if models:
        return models[0]["id"]
    response = upload(alice, example_model("mlp", "onnx"))
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["code"] == code and body["detail"], body
    return body["detail"]


def _assert_nothing_half_written(server) -> None:
    assert tmp_leftovers(server.storage_dir) == []
    files = {p.name for p in (server.storage_dir / "models").iterdir()}
    with server.storage() as storage:
        rows = {m.content_hash for m in storage.list_models()}
    assert files == rows


def test_oversized_upload_is_413_without_leftovers(server, alice, tmp_path) -> None:
    big = tmp_path / "big.onnx"
    big.write_bytes(os.urandom(UPLOAD_LIMIT + 1024))
    detail = _error(upload(alice, big), 413, "too_large")
    assert str(UPLOAD_LIMIT) in detail
    # Chunked (no Content-Length): refused by the running count while streaming.
    boundary = "tunehubboundary"

    def body():
        yield (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="big.onnx"\r\nContent-Type: application/octet-stream\r\n\r\n'
        ).encode()
        chunk = b"\0" * (1 << 20)
        for _ in range(UPLOAD_LIMIT // len(chunk) + 2):
            yield chunk
        yield f"\r\n--{boundary}--\r\n".encode()

    response = alice.post(
        "/models",
        content=body(),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
    )
    _error(response, 413, "too_large")
    _assert_nothing_half_written(server)
    assert alice.get("/health").status_code == 200


def test_garbage_and_wrong_types_are_refused(server, alice, tmp_path, example_model) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(os.urandom(4096))
    assert "ONNX" in _error(upload(alice, garbage), 422, "bad_onnx")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    _error(upload(alice, empty), 422, "empty")
    # Not multipart at all.
    _error(alice.post("/models", json={"file": "x"}), 415, "unsupported_media_type")
    _error(
        alice.post(
            "/models", content=b"\0" * 10, headers={"Content-Type": "application/octet-stream"}
        ),
        415,
        "unsupported_media_type",
    )
    # A file part that says it is text.
    onnx = example_model("mlp", "onnx")
    response = alice.post("/models", files={"file": ("m.onnx", onnx.read_bytes(), "text/plain")})
    assert "text/plain" in _error(response, 415, "unsupported_media_type")
    # Declared .pt2, content ONNX.
    _error(upload(alice, onnx, format="pt2"), 415, "wrong_format")
    # A form without the file.
    _error(
        alice.post("/models", data={"format": "onnx"}, files={"other": ("x", b"1")}),
        422,
        "missing_file",
    )
    _error(upload(alice, onnx, target="tpu"), 422, "bad_target")
    _assert_nothing_half_written(server)
    with server.storage() as storage:
        assert storage.list_models() == []


def test_tokens_and_ownership(server, alice, example_model) -> None:
    model = upload(alice, example_model("mlp", "onnx"))
    assert model.status_code == 201, model.text
    model_id = model.json()["id"]
    job = alice.post("/jobs", json={"model_id": model_id, "trial_budget": 4}).json()

    with server.client(None) as anonymous:
        response = anonymous.get("/jobs")
        _error(response, 401, "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"
    with server.client("th_not-a-real-token") as wrong:
        assert "invalid" in _error(wrong.get(f"/jobs/{job['id']}"), 401, "unauthorized")
    with server.client(server.token("bob")) as bob:
        # Another user's job and model do not exist for bob.
        _error(bob.get(f"/jobs/{job['id']}"), 404, "not_found")
        _error(bob.post(f"/jobs/{job['id']}/cancel"), 404, "not_found")
        _error(bob.get(f"/models/{model_id}"), 404, "not_found")
        _error(bob.delete(f"/models/{model_id}"), 404, "not_found")
        _error(bob.post("/jobs", json={"model_id": model_id, "trial_budget": 4}), 404, "not_found")
        assert bob.get("/jobs").json() == {"data": [], "count": 0}
        # Uploading the same content gives bob his own model row, sharing the stored file.
        mine = upload(bob, example_model("mlp", "onnx"))
        assert mine.status_code == 201 and mine.json()["id"] != model_id
    worker_token = server.token("w1", kind="worker")
    with server.client(worker_token) as worker:
        _error(worker.get("/jobs"), 403, "forbidden")
        registered = worker.post("/workers/register", json={"name": "remote-1"})
        assert registered.status_code == 200 and registered.json()["status"] == "idle"
        beat = worker.post("/workers/remote-1/heartbeat", json={"status": "busy"})
        assert beat.json()["status"] == "busy"
        _error(worker.post("/workers/nobody/heartbeat", json={}), 404, "not_found")
    _error(alice.post("/workers/register", json={"name": "x"}), 403, "forbidden")

    # A revoked token stops working at once.
    token = server.token("carol")
    with server.storage() as storage:
        carol = [t for t in storage.list_api_tokens() if t.name == "carol"][0]
        storage.revoke_api_token(carol.id)
    with server.client(token) as revoked:
        _error(revoked.get("/models"), 401, "unauthorized")

    # Deleting a model with a queued job is refused; nothing changes.
    _error(alice.delete(f"/models/{model_id}"), 409, "conflict")
    assert alice.get(f"/models/{model_id}").status_code == 200
    _assert_nothing_half_written(server)


def test_unknown_ids_bad_bodies_and_finished_jobs(server, alice, model_id) -> None:
    assert "job 999999 not found" in _error(alice.get("/jobs/999999"), 404, "not_found")
    _error(alice.post("/jobs/999999/cancel"), 404, "not_found")
    _error(alice.get("/jobs/999999/artifacts/model.so"), 404, "not_found")
    _error(alice.get("/models/999999"), 404, "not_found")
    _error(alice.get("/jobs/abc"), 422, "invalid_request")
    _error(alice.get("/jobs/1/artifacts/secrets.txt"), 422, "invalid_request")
    _error(alice.get("/workloads/zzzz"), 422, "invalid_request")
    _error(alice.get("/workloads/00000000deadbeef"), 404, "not_found")
    _error(alice.get("/records", params={"target": "00000000deadbeef"}), 404, "not_found")
    _error(alice.post("/jobs", json={"model_id": 1, "trial_budget": -1}), 422, "invalid_request")
    _error(alice.post("/jobs", json={"model_id": 1}), 422, "invalid_request")
    _error(
        alice.post("/jobs", content=b"{not json", headers={"Content-Type": "application/json"}),
        422,
        "invalid_request",
    )
    _error(
        alice.post("/jobs", json={"model_id": model_id, "trial_budget": 4, "target": "tpu"}),
        422,
        "bad_target",
    )

    job = alice.post("/jobs", json={"model_id": model_id, "trial_budget": 4})
    assert job.status_code == 201
    job_id = job.json()["id"]
    assert alice.post(f"/jobs/{job_id}/cancel").json()["status"] == "cancelled"
    detail = _error(alice.post(f"/jobs/{job_id}/cancel"), 409, "job_finished")
    assert "already cancelled" in detail
    _error(alice.get(f"/jobs/{job_id}/artifacts/manifest.json"), 409, "no_artifact")
    _error(alice.get(f"/jobs/{job_id}/artifacts/preview/model.so"), 409, "no_preview")
    _error(alice.get(f"/jobs/{job_id}/artifacts/preview/other.so"), 422, "invalid_request")
    _error(alice.get("/no/such/path"), 404, "not_found")
    _error(alice.put("/jobs"), 405, "method_not_allowed")
    assert alice.get("/health").json() == {"status": "ok"}
    assert server.alive()
    _assert_nothing_half_written(server)


def test_queue_metrics(server, alice, model_id) -> None:
    low = alice.post("/jobs", json={"model_id": model_id, "trial_budget": 4}).json()
    alice.post("/jobs", json={"model_id": model_id, "trial_budget": 4, "priority": 10}).json()
    metrics = httpx.get(f"{server.url}/metrics").text
    queued = [line for line in metrics.splitlines() if line.startswith("tunehub_queue_depth")]
    assert queued and float(queued[0].split()[1]) >= 2
    assert "tunehub_http_requests_total" in metrics
    assert alice.get(f"/jobs/{low['id']}").json()["status"] == "queued"
