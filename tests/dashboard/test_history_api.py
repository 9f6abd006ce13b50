"""``GET /api/v1/jobs/{id}/history`` over HTTP against a real server: the best-so-far points are
exactly the running minimum per task of the job's records (read back through ``GET /records``),
polling with ``?after=last_id`` returns only what is new, pages cut at ``limit`` merge into the
same curves, and bad requests get the one error body."""

from __future__ import annotations

import math

import pytest


def _records(api, job_id: int) -> list[dict]:
    out, after = [], 0
    while True:
        page = api.get("/records", params={"job_id": job_id, "after": after, "limit": 1000}).json()
        out += page["data"]
        if page["next_after"] is None:
            return out
        after = page["next_after"]


def _running_min(records: list[dict], trials_before: int = 0) -> list[tuple[int, int, int, float]]:
    best: dict[int, float] = {}
    points = []
    for n, r in enumerate(records, start=trials_before + 1):
        if r["is_valid"] and r["mean_ms"] < best.get(r["workload_id"], math.inf):
            best[r["workload_id"]] = r["mean_ms"]
            points.append((r["id"], n, r["workload_id"], r["mean_ms"]))
    return points


def _points(page: dict) -> list[tuple[int, int, int, float]]:
    return [(p["id"], p["trial"], p["workload_id"], p["best_ms"]) for p in page["points"]]


def _merge(*pages: dict) -> dict[int, float]:
    best: dict[int, float] = {}
    for page in pages:
        for p in page["points"]:
            best[p["workload_id"]] = min(p["best_ms"], best.get(p["workload_id"], math.inf))
    return best


def test_history_is_the_running_best_and_polls_incrementally(api, running_job) -> None:
    job, writer = running_job
    url = f"/jobs/{job['id']}/history"
    empty = api.get(url).json()
    assert (empty["records"], empty["last_id"], empty["more"], empty["points"]) == (0, 0, False, [])

    writer.commit(200)
    full = api.get(url).json()
    records = _records(api, job["id"])
    assert full["records"] == len(records) == 200
    assert full["failed"] == sum(not r["is_valid"] for r in records) > 0
    assert full["last_id"] == records[-1]["id"] and full["more"] is False
    expected = _running_min(records)
    assert [p[:3] for p in _points(full)] == [p[:3] for p in expected]
    assert [p[3] for p in _points(full)] == pytest.approx([p[3] for p in expected])
    assert len({p["workload_id"] for p in full["points"]}) == 2
    assert full["first_measured_at"] and full["last_measured_at"] >= full["first_measured_at"]

    # The job's own status page agrees with the curves' ends.
    detail = api.get(f"/jobs/{job['id']}").json()
    task_best = {t["workload_id"]: t["best_latency_ms"] for t in detail["tasks"]}
    assert _merge(full) == pytest.approx(task_best)

    # Poll: only the new records, trial numbers continuing from the first read.
    writer.commit(48)
    newer = api.get(url, params={"after": full["last_id"]}).json()
    assert (newer["after"], newer["trials_before"], newer["records"]) == (full["last_id"], 200, 48)
    records = _records(api, job["id"])
    assert {p[0] for p in _running_min(records) if p[0] > full["last_id"]} <= {
        p["id"] for p in newer["points"]
    }
    assert _merge(full, newer) == pytest.approx(_merge(api.get(url).json()))
    again = api.get(url, params={"after": newer["last_id"]}).json()
    assert (again["records"], again["last_id"], again["points"]) == (0, newer["last_id"], [])

    # Pages cut at the limit merge into the same curves.
    first = api.get(url, params={"limit": 100}).json()
    assert first["records"] == 100 and first["more"] is True
    rest = api.get(url, params={"after": first["last_id"], "limit": 1000}).json()
    assert rest["trials_before"] == 100 and rest["records"] == 148 and rest["more"] is False
    assert _merge(first, rest) == pytest.approx(_merge(full, newer))


def test_history_errors(dash_server, api, running_job) -> None:
    job, _writer = running_job
    url = f"/jobs/{job['id']}/history"
    with dash_server.client(dash_server.token("mallory")) as other:
        response = other.get(url)
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    with dash_server.client(None) as anonymous:
        assert anonymous.get(url).status_code == 401
    assert api.get("/jobs/987654/history").status_code == 404
    for params in ({"after": -1}, {"limit": 0}, {"limit": 10**6}, {"after": "x"}):
        response = api.get(url, params=params)
        assert response.status_code == 422 and response.json()["code"] == "invalid_request", params
