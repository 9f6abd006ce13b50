"""Issue 31 against a real ``tunehub serve``: a request's token is checked and its body bounded
before a byte of the body is read (case 2), JSON nested too deep is a 422 wherever a client sends
it (case 6), and every answer carries the browser security headers (case 10).

Before, the server refused a 300 MiB body without a token only after reading and parsing it
whole: the API process grew by many times the body's size. Now the answer comes before the body
is sent, and the rest of a streamed body is dropped as it arrives.
"""

from __future__ import annotations

import json

import httpx
import pytest

from service.settings import Settings
from tests.service.conftest import UPLOAD_LIMIT, upload
from tests.service.request_helpers import (
    MIB,
    RSS_BOUND,
    head_only,
    json_stream,
    multipart_stream,
    peak_growth,
    tmp_leftovers,
)
from tests.service.trust_helpers import job_records, job_with_lease, matmul_file, records_for

JSON_LIMIT = Settings().max_json_body_bytes
#: Big enough that reading it shows: a parsed array of 48 MiB of zeros is about 200 MB.
BIG = 48 * MIB
HUGE_DECLARED = str(300 * MIB)


@pytest.fixture(scope="module")
def server(serve):
    server = serve(workers=0)
    with server.client(server.token("warm-up")) as client:  # first requests build caches
        assert client.get("/jobs").status_code == 200
        assert client.post("/jobs", json={"model_id": 1, "trial_budget": 8}).status_code == 404
    return server


def _refused(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert body["code"] == code and body["detail"], body
    return body["detail"]


def _assert_tmp_clean(server) -> None:
    assert tmp_leftovers(server.storage_dir) == []


# ------------------------------------------------------------------ the token before the body


@pytest.mark.parametrize(
    "path, content_type",
    [
        ("/api/v1/jobs", "application/json"),
        ("/api/v1/models", "multipart/form-data; boundary=x"),
        ("/api/v1/workers/register", "application/json"),
        ("/api/v1/workers/leases/1/records", "application/json"),
        ("/api/v1/workers/leases/1/artifact", "multipart/form-data; boundary=x"),
    ],
)
@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_no_token_is_401_before_a_byte_of_the_body(server, path, content_type, framing) -> None:
    """Only the head is sent, declaring 300 MiB (or a chunked body): the 401 comes at once."""
    size = {"Content-Length": HUGE_DECLARED}
    if framing == "chunked":
        size = {"Transfer-Encoding": "chunked"}
    for auth, detail in [(None, "missing API token"), ("Bearer nope", "invalid or revoked")]:
        headers = {"Content-Type": content_type, **size}
        if auth:
            headers["Authorization"] = auth
        answer = head_only(server.url, "POST", path, headers)
        assert answer.status == 401, answer
        assert answer.headers["www-authenticate"] == "Bearer"
        body = json.loads(answer.body)
        assert body["code"] == "unauthorized" and detail in body["detail"]


def test_wrong_token_kind_and_oversized_declared_bodies_are_refused_unread(server) -> None:
    user, worker = server.token("kind-user"), server.token("kind-pool", kind="worker")
    json_head = {"Content-Type": "application/json", "Content-Length": HUGE_DECLARED}
    # A user token on a worker route, a worker token on a user route: 403, body unread.
    for token, path in [(user, "/api/v1/workers/register"), (worker, "/api/v1/jobs")]:
        answer = head_only(
            server.url, "POST", path, {**json_head, "Authorization": f"Bearer {token}"}
        )
        assert answer.status == 403 and json.loads(answer.body)["code"] == "forbidden"
    # The right kind, 300 MiB declared: 413, body unread.
    for token, path in [(worker, "/api/v1/workers/register"), (user, "/api/v1/jobs")]:
        answer = head_only(
            server.url, "POST", path, {**json_head, "Authorization": f"Bearer {token}"}
        )
        assert answer.status == 413, answer
        body = json.loads(answer.body)
        assert body["code"] == "too_large" and str(JSON_LIMIT) in body["detail"]


@pytest.mark.parametrize("framing", ["content-length", "streamed"])
def test_a_large_anonymous_body_neither_waits_nor_grows_the_server(server, framing) -> None:
    """48 MiB of JSON without a token: 401, and the API process does not grow (it did by
    hundreds of MB: FastAPI read and parsed the body before the token dependency ran)."""
    headers = {"Content-Type": "application/json"}
    if framing == "content-length":
        headers["Content-Length"] = str(BIG)
    with httpx.Client(base_url=server.api, timeout=120) as anonymous:
        response, grown = peak_growth(
            server.proc.pid,
            lambda: anonymous.post("/jobs", content=json_stream(BIG), headers=headers),
        )
    _refused(response, 401, "unauthorized")
    assert response.headers["www-authenticate"] == "Bearer"
    assert grown < RSS_BOUND, f"the API process grew by {grown / MIB:.0f} MiB"
    assert server.alive()


@pytest.mark.parametrize("framing", ["content-length", "streamed"])
def test_a_worker_token_cannot_send_a_large_registration(server, framing) -> None:
    """The issue's second case: a valid worker token and 48 MiB to /workers/register is 413
    (the JSON limit), the server does not grow, and no worker is registered."""
    headers = {"Content-Type": "application/json"}
    if framing == "content-length":
        headers["Content-Length"] = str(BIG)
    with server.client(server.token("big-pool", kind="worker")) as worker:
        response, grown = peak_growth(
            server.proc.pid,
            lambda: worker.post("/workers/register", content=json_stream(BIG), headers=headers),
        )
    assert str(JSON_LIMIT) in _refused(response, 413, "too_large")
    assert grown < RSS_BOUND, f"the API process grew by {grown / MIB:.0f} MiB"
    with server.storage() as storage:
        assert not [w for w in storage.list_workers() if w.name.startswith("big-pool")]


def test_json_bodies_are_bounded_and_normal_requests_still_work(server, tmp_path) -> None:
    with server.client(server.token("bounded")) as user:
        # Over the JSON limit by one byte, declared or streamed: 413.
        over = b"".join(json_stream(JSON_LIMIT + 1))
        response = user.post("/jobs", content=over, headers={"Content-Type": "application/json"})
        _refused(response, 413, "too_large")
        for content_type in ("application/json", "text/plain"):  # read whole, or counted
            streamed = user.post(
                "/jobs",
                content=json_stream(JSON_LIMIT + 1, 4096),
                headers={"Content-Type": content_type},
            )
            _refused(streamed, 413, "too_large")
        # At the limit: read and parsed (refused by the route's own validation, not by size).
        at_limit = user.post(
            "/jobs", content=json_stream(JSON_LIMIT), headers={"Content-Type": "application/json"}
        )
        assert at_limit.status_code == 422, at_limit.text[:300]
        # A normal session: upload, job, status, list.
        created = upload(user, matmul_file(tmp_path, 4, 8, 8))
        assert created.status_code == 201, created.text
        job = user.post("/jobs", json={"model_id": created.json()["id"], "trial_budget": 8})
        assert job.status_code == 201, job.text
        assert user.get(f"/jobs/{job.json()['id']}").json()["status"] == "queued"
        assert len(user.get("/jobs").json()["data"]) == 1
    assert httpx.get(f"{server.api}/health").status_code == 200  # public: no token needed
    _assert_tmp_clean(server)


def test_uploads_within_the_limit_are_received_whole(server, tmp_path) -> None:
    """A model upload's limit is the upload limit plus the multipart framing: a file of exactly
    the upload limit reaches validation; one byte more is 413 naming the upload limit."""
    with server.client(server.token("uploader")) as user:
        exact = tmp_path / "exact.onnx"
        exact.write_bytes(b"\x08" * UPLOAD_LIMIT)
        response = upload(user, exact)
        assert response.status_code in (415, 422), response.text  # not a model, but read whole
        assert response.json()["code"] != "too_large"
        over = tmp_path / "over.onnx"
        over.write_bytes(b"\x08" * (UPLOAD_LIMIT + 1))
        assert str(UPLOAD_LIMIT) in _refused(upload(user, over), 413, "too_large")
        # Streamed past the whole body's limit (no Content-Length): 413, nothing left.
        streamed = user.post(
            "/models",
            content=multipart_stream(UPLOAD_LIMIT + 2 * MIB, "bnd"),
            headers={"Content-Type": "multipart/form-data; boundary=bnd"},
        )
        assert str(UPLOAD_LIMIT) in _refused(streamed, 413, "too_large")
        assert user.get("/models").json()["data"] == []
    _assert_tmp_clean(server)


def test_the_guard_derives_each_routes_rule_from_the_route_table(tmp_path) -> None:
    """In-process: which routes need a token (every API route but the health checks), of which
    kind, how each reads its body, and the upload routes' own limits."""
    from service.api.request_guard import JSON, NONE, STREAM, BodyLimits, route_table
    from service.app import create_app

    settings = Settings(home=tmp_path, max_upload_bytes=UPLOAD_LIMIT)
    app = create_app(settings)
    try:
        table = route_table(app.routes, BodyLimits.from_settings(settings))

        def rule(method: str, path: str):
            return table.rule_for({"type": "http", "method": method, "path": path})

        public = {"/api/v1/health", "/api/v1/ready"}
        api_routes = [r for r in app.openapi()["paths"] if r.startswith("/api/v1")]
        assert len(api_routes) > 20
        for path, operations in app.openapi()["paths"].items():
            for method in operations:
                auth = rule(method.upper(), path.replace("{", "").replace("}", ""))
                assert (auth.auth is None) == (path in public), (method, path)
        assert rule("POST", "/api/v1/jobs").auth == "user"
        assert rule("POST", "/api/v1/workers/register").auth == "worker"
        upload_rule = rule("POST", "/api/v1/models")
        assert upload_rule.limit == UPLOAD_LIMIT + 64 * 1024 and upload_rule.body == STREAM
        artifact = rule("POST", "/api/v1/workers/leases/5/artifact")
        assert artifact.limit == settings.artifact_body_limit > UPLOAD_LIMIT
        assert artifact.body == STREAM
        batch = rule("POST", "/api/v1/workers/leases/5/records")
        assert batch.limit == settings.max_batch_body_bytes and batch.body == JSON
        assert rule("POST", "/api/v1/workers/w/lease").body == NONE
        assert rule("GET", "/api/v1/nowhere").auth is None  # the router's 404
        assert rule("GET", "/dashboard/jobs/3").auth is None
    finally:
        app.state.tunehub.storage.close()


def test_the_route_dependency_reuses_the_guards_lookup(tmp_path, monkeypatch) -> None:
    """In-process, with the token cache off: one database lookup per request, not two."""
    from fastapi.testclient import TestClient

    from service.api.deps import ServiceState
    from service.app import create_app
    from service.auth import create_token

    app = create_app(Settings(home=tmp_path, token_cache_secs=0))
    try:
        token = create_token(app.state.tunehub.storage, name="once", kind="user")[0]
        lookups = []
        real = ServiceState.principal

        def counted(self, value):
            lookups.append(value)
            return real(self, value)

        monkeypatch.setattr(ServiceState, "principal", counted)
        client = TestClient(app)
        reply = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
        assert reply.status_code == 200 and lookups == [token]
    finally:
        app.state.tunehub.storage.close()


def test_a_token_lookup_with_the_database_down_is_503(tmp_path, monkeypatch) -> None:
    """In-process: the guard's lookup answers as the routes do when the database is down."""
    from fastapi.testclient import TestClient

    import db
    from service.api.deps import ServiceState
    from service.app import create_app

    app = create_app(Settings(home=tmp_path))
    try:

        def down(self, value):
            raise db.StorageUnavailableError("database is locked")

        monkeypatch.setattr(ServiceState, "principal", down)
        reply = TestClient(app).post(
            "/api/v1/jobs", json={}, headers={"Authorization": "Bearer some-token"}
        )
        assert reply.status_code == 503 and reply.headers["retry-after"] == "5"
        assert reply.json()["code"] == "unavailable"
    finally:
        app.state.tunehub.storage.close()


# ------------------------------------------------------------------------ JSON nested too deep


def test_deep_json_bodies_are_422_not_500(server) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    with (
        server.client(server.token("deep-user")) as user,
        server.client(server.token("deep-pool", kind="worker")) as worker,
    ):
        response = user.post("/jobs", content=deep, headers={"Content-Type": "application/json"})
        assert "64 levels" in _refused(response, 422, "too_deep")
        response = worker.post(
            "/workers/register", content=deep, headers={"Content-Type": "application/json"}
        )
        _refused(response, 422, "too_deep")
        # JSON inside a JSON string (a target's description): 2,000 deep was a 500.
        target = {
            "kind": "cpu",
            "target_json": "[" * 2000 + "]" * 2000,
            "fingerprint_json": "{}",
            "tvm_version": "0",
        }
        response = worker.post("/workers/register", json={"name": "deep-pool-1", "target": target})
        _refused(response, 422, "invalid_request")
        # 64 deep is still JSON a route reads (and answers for its content).
        ok_depth = {"model_id": 1, "trial_budget": 8, "x": json.loads("[" * 63 + "]" * 63)}
        response = user.post("/jobs", json=ok_depth)
        assert response.status_code < 500 and response.json()["code"] != "too_deep"


def _finalize_lease(server, user, worker, name: str, tmp_path) -> tuple[int, dict]:
    """A one-task job whose tuning is done and whose finalize (or preview) lease ``worker``
    holds."""
    leased = job_with_lease(server, user, worker, name, matmul_file(tmp_path, 4, 8, 16), cores=7)
    lease_id = leased.offer["lease_id"]
    good = records_for(leased.offer["mod_json"], leased.offer["trials"])
    reply = worker.post(f"/workers/leases/{lease_id}/records", json={"batch": 0, "records": good})
    assert reply.status_code == 200, reply.text
    end = worker.post(f"/workers/leases/{lease_id}/finish", json={"outcome": "done"})
    assert end.status_code == 200, end.text
    offer = worker.post(f"/workers/{name}/lease", params={"instance": leased.instance})
    lease = offer.json()["lease"]
    assert lease is not None and lease["kind"] in ("finalize", "preview"), offer.text
    return leased.job_id, lease


def test_a_manifest_200000_brackets_deep_is_422_and_the_job_is_unchanged(server, tmp_path):
    with (
        server.client(server.token("manifest-user")) as user,
        server.client(server.token("manifest-pool", kind="worker")) as worker,
    ):
        job_id, lease = _finalize_lease(server, user, worker, "manifest-pool-1", tmp_path)
        before = user.get(f"/jobs/{job_id}").json()
        records = len(job_records(server, job_id))
        files = {
            "library": ("model.so", b"\x7fELF", "application/octet-stream"),
            "manifest": ("manifest.json", "[" * 200_000 + "]" * 200_000, "application/json"),
        }
        response = worker.post(f"/workers/leases/{lease['lease_id']}/artifact", files=files)
        detail = _refused(response, 422, "invalid_artifact")
        assert "manifest.json" in detail and "64 levels" in detail
        after = user.get(f"/jobs/{job_id}").json()
        assert after["status"] == before["status"] and after.get("artifact") is None
        assert len(job_records(server, job_id)) == records
        leases = user.get("/workers/leases", params={"job_id": job_id}).json()["data"]
        assert [x["status"] for x in leases if x["id"] == lease["lease_id"]] == ["active"]
    assert not (server.storage_dir / "artifacts" / f"job-{job_id}").exists()
    _assert_tmp_clean(server)


# ------------------------------------------------------------------------ security headers


@pytest.mark.parametrize(
    "path",
    ["/api/v1/health", "/api/v1/jobs", "/dashboard/", "/dashboard/static/js/main.js", "/"],
)
def test_every_answer_has_the_security_headers(server, path) -> None:
    response = httpx.get(server.url + path)
    assert response.status_code in (200, 401), response.text
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    csp = response.headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "frame-ancestors 'none'"):
        assert directive in csp
    assert "unsafe-inline" not in csp and "http" not in csp  # nothing from elsewhere


def test_api_docs_get_a_policy_that_lets_swagger_ui_load(server) -> None:
    response = httpx.get(f"{server.url}/docs")
    assert response.status_code == 200
    csp = response.headers["content-security-policy"]
    assert "https://cdn.jsdelivr.net" in csp and "frame-ancestors 'none'" in csp
    for url in ("https://cdn.jsdelivr.net/npm/swagger-ui-dist", "fastapi.tiangolo.com"):
        assert url in response.text
    assert response.headers["x-frame-options"] == "DENY"
