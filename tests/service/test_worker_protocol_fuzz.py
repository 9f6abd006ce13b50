"""Property test of the worker protocol (issue 18): random and malformed bodies (hypothesis)
against a real server's worker routes, with a worker token holding a real tune lease. No answer
is a server error, and a refused upload stores nothing; a batch that is accepted stores only
records that are valid and replay, failures, or held records, all attributed to the worker.

Request sizes (issue 31): a body over its route's limit, declared or streamed, on every worker
route is a 4xx (413 where the route reads a body) and stores nothing; without a token it is a
401 before the body is read.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.settings import Settings
from tests.service.conftest import UPLOAD_LIMIT
from tests.service.request_helpers import (
    head_only,
    json_stream,
    multipart_stream,
    tmp_leftovers,
)
from tests.service.trust_helpers import job_records, job_with_lease, matmul_file, records_for

EXAMPLES = 60

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
run_times = (
    st.none()
    | st.lists(st.floats(allow_nan=True, allow_infinity=True) | st.integers(), max_size=4)
    | json_values
)


@pytest.fixture(scope="module")
def lease(serve, tmp_path_factory):
    server = serve(workers=0)
    folder = tmp_path_factory.mktemp("fuzz")
    user = server.client(server.token("fuzz-user"))
    worker = server.client(server.token("fuzz-pool", kind="worker"))
    leased = job_with_lease(
        server, user, worker, "fuzz-pool-1", matmul_file(folder, 4, 8, 8), budget=64, cores=5
    )
    good = records_for(leased.offer["mod_json"], 7)
    yield server, worker, leased, good
    user.close()
    worker.close()


def _send(worker, method: str, path: str, body) -> int:
    text = json.dumps(body)  # NaN and Infinity as Python writes them: not valid JSON
    reply = worker.request(method, path, content=text, headers={"content-type": "application/json"})
    assert reply.status_code < 500, (method, path, text[:500], reply.text[:500])
    return reply.status_code


def test_a_batch_ahead_of_its_turn_is_refused_before_anything_is_stored(lease) -> None:
    """The case hypothesis found (a valid record in a batch numbered past the next expected):
    409, and its records are not stored (they once were, before the number was checked)."""
    server, worker, leased, good = lease
    lease_id = leased.offer["lease_id"]
    before = len(job_records(server, leased.job_id))
    reply = worker.post(
        f"/workers/leases/{lease_id}/records", json={"batch": 1000, "records": [dict(good[0])]}
    )
    assert reply.status_code == 409 and "in order" in reply.text
    assert len(job_records(server, leased.job_id)) == before


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_batches_never_5xx_and_refusals_store_nothing(lease, data) -> None:
    server, worker, leased, good = lease
    lease_id = leased.offer["lease_id"]
    kind = data.draw(st.sampled_from(["garbage", "mutated", "mixed"]))
    if kind == "garbage":
        body = data.draw(
            json_values
            | st.fixed_dictionaries(
                {"batch": json_values, "records": st.lists(json_values, max_size=3)}
            )
        )
    else:
        records = []
        for base in data.draw(st.lists(st.sampled_from(good), min_size=0, max_size=4)):
            record = dict(base)
            field = data.draw(st.sampled_from(["trace", "run_secs", "args_info", "none", "extra"]))
            if field == "run_secs":
                record["run_secs"] = data.draw(run_times)
            elif field in ("trace", "args_info"):
                record[field] = data.draw(json_values)
            elif field == "extra":
                record[data.draw(st.text(min_size=1, max_size=8))] = data.draw(json_values)
            records.append(record)
        if kind == "mixed":
            records.append(dict(data.draw(st.sampled_from(good))))
        body = {"batch": data.draw(st.integers(min_value=-3, max_value=3)), "records": records}
    before = len(job_records(server, leased.job_id))
    status = _send(worker, "POST", f"/workers/leases/{lease_id}/records", body)
    after = job_records(server, leased.job_id)
    if status != 200:
        assert len(after) == before, (status, body)
    for row in after:
        assert row.worker == "fuzz-pool-1"
        if row.is_valid:
            assert row.mean_secs > 0 and math.isfinite(row.mean_secs)


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    route=st.sampled_from(
        [
            ("POST", "/workers/register"),
            ("POST", "/workers/fuzz-pool-1/heartbeat"),
            ("POST", "/workers/fuzz-pool-1/lease"),
            ("POST", "/workers/leases/{lease}/finish"),
            ("GET", "/workers/leases/{lease}/context"),
            ("POST", "/workers/nobody/heartbeat"),
            ("POST", "/workers/leases/{lease}/records"),
            ("GET", "/workers/jobs/{job}/model"),
        ]
    ),
    body=json_values,
)
def test_random_bodies_on_every_worker_route_never_5xx(lease, route, body) -> None:
    server, worker, leased, _good = lease
    method, path = route
    if (
        path.endswith("/finish")
        and isinstance(body, dict)
        and body.get("outcome") in ("done", "returned", "failed", "cancelled")
    ):
        body = {**body, "outcome": 7}  # keep the lease for the other examples
    if path == "/workers/register" and isinstance(body, dict) and "name" in body:
        body = {**body, "name": "fuzz-pool-2"}  # never replace the lease holder
    path = path.format(lease=leased.offer["lease_id"], job=leased.job_id)
    before = len(job_records(server, leased.job_id))
    status = _send(worker, method, path, body)
    if status != 200:
        assert len(job_records(server, leased.job_id)) == before


# ------------------------------------------------------------------ request sizes (issue 31)

LIMITS = Settings(max_upload_bytes=UPLOAD_LIMIT)  # the server's (conftest sets the upload limit)
#: (method, path, the route's body limit or None where the route reads no body)
SIZED_ROUTES = [
    ("POST", "/workers/register", LIMITS.max_json_body_bytes),
    ("POST", "/workers/fuzz-pool-1/heartbeat", LIMITS.max_json_body_bytes),
    ("POST", "/workers/leases/{lease}/finish", LIMITS.max_json_body_bytes),
    ("POST", "/workers/leases/{lease}/records", LIMITS.max_batch_body_bytes),
    ("POST", "/workers/leases/{lease}/artifact", LIMITS.artifact_body_limit),
    ("POST", "/workers/nobody/lease", None),
    ("GET", "/workers/leases/{lease}/context", None),
    ("GET", "/workers/jobs/{job}/model", None),
    ("GET", "/workers/records", None),
    ("GET", "/workers/cost-model", None),
]
BOUNDARY = "fuzzboundary"


def _stored(server, leased) -> tuple:
    """What a refused request must leave as it was: the job's records, its leases, the
    workers, its artifact, the staging folder."""
    with server.storage() as storage:
        leases = [
            (x.id, x.status, x.trials)
            for x in storage.list_leases(job_id=leased.job_id, limit=1000)
        ]
        workers = sorted(w.name for w in storage.list_workers())
    artifact = (server.storage_dir / "artifacts" / f"job-{leased.job_id}").exists()
    return (
        len(job_records(server, leased.job_id)),
        leases,
        workers,
        artifact,
        tmp_leftovers(server.storage_dir),
    )


def _body(path: str, size: int) -> tuple[object, str]:
    if path.endswith("/artifact"):
        return multipart_stream(
            size, BOUNDARY, "library"
        ), f"multipart/form-data; boundary={BOUNDARY}"
    return json_stream(size), "application/json"


@pytest.mark.parametrize("framing", ["content-length", "streamed"])
@pytest.mark.parametrize("route", SIZED_ROUTES, ids=[f"{m} {p}" for m, p, _ in SIZED_ROUTES])
def test_oversized_bodies_on_every_worker_route_are_4xx_and_store_nothing(
    lease, route, framing
) -> None:
    server, worker, leased, _good = lease
    method, template, limit = route
    path = template.format(lease=leased.offer["lease_id"], job=leased.job_id)
    size = (limit or LIMITS.max_json_body_bytes) + (1 if framing == "content-length" else 65536)
    content, content_type = _body(path, size)
    headers = {"Content-Type": content_type}
    if framing == "content-length":
        headers["Content-Length"] = str(size)
    before = _stored(server, leased)
    reply = worker.request(method, path, content=content, headers=headers)
    assert 400 <= reply.status_code < 500, (method, path, reply.status_code, reply.text[:300])
    if framing == "content-length" or limit is not None:
        assert reply.status_code == 413, reply.text[:300]
        assert reply.json()["code"] == "too_large"
    assert _stored(server, leased) == before
    # Without a token: 401 before a byte of the body is read.
    answer = head_only(
        server.url,
        method,
        f"/api/v1{path}",
        {"Content-Type": content_type, "Content-Length": str(300 << 20)},
    )
    assert answer.status == 401, answer
    assert _stored(server, leased) == before


@settings(
    max_examples=24,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(
        ["/workers/register", "/workers/nobody/heartbeat", "/workers/leases/{lease}/finish"]
    ),
    offset=st.integers(min_value=-3, max_value=3) | st.integers(-70_000, 70_000),
    chunk=st.sampled_from([1000, 4096, 65536, 1 << 20]),
    declared=st.booleans(),
)
def test_sizes_around_the_json_limit(lease, path, offset, chunk, declared) -> None:
    """A JSON body of the limit or less is read (and judged for its content); one byte more,
    declared or streamed in chunks of any size, is 413. Never a 5xx, nothing stored."""
    server, worker, leased, _good = lease
    limit = LIMITS.max_json_body_bytes
    size = limit + offset
    path = path.format(lease=leased.offer["lease_id"])

    def body():
        data = b"{" + b" " * (size - 2) + b"}"  # an empty object: no route takes it
        for start in range(0, len(data), chunk):
            yield data[start : start + chunk]

    headers = {"Content-Type": "application/json"}
    if declared:
        headers["Content-Length"] = str(size)
    before = _stored(server, leased)
    reply = worker.post(path, content=body(), headers=headers)
    assert 400 <= reply.status_code < 500, reply.text[:300]
    assert (reply.status_code == 413) == (size > limit), (size, reply.text[:300])
    assert _stored(server, leased) == before
