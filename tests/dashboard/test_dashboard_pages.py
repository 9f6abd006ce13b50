"""The dashboard in headless Chromium against a real server: signing in with a token, the job
page's task table and curves (and their live update when new records arrive), uploading a model
and starting a job from the page, and the jobs, workers and database pages."""

from __future__ import annotations

import re

import pytest

from tests.onnx_factory import matmul_model

pytestmark = pytest.mark.browser


def _chart_state(page) -> dict:
    return page.eval_on_selector("#charts", "el => ({...el.dataset})")


def test_sign_in_asks_for_a_token_and_refuses_a_wrong_one(dash_server, token, new_page) -> None:
    page = new_page()
    page.goto(f"{dash_server.url}/dashboard/")
    page.wait_for_selector("#sign-in")
    page.fill("#token-input", "not-a-token")
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#sign-in .error")
    assert "token refused" in page.inner_text("#sign-in .error")
    assert page.evaluate("localStorage.getItem('tunehub.token')") is None
    page.fill("#token-input", token)
    page.click("#sign-in button[type=submit]")
    page.wait_for_selector("#jobs-table table")
    assert page.evaluate("localStorage.getItem('tunehub.token')") == token
    # A token in the URL fragment is taken and removed from the address bar.
    fresh = new_page()
    fresh.goto(f"{dash_server.url}/dashboard/stats#token={token}")
    fresh.wait_for_selector("#stat-records")
    assert fresh.url.endswith("/dashboard/stats")


def test_job_page_fills_the_table_and_plots_and_follows_new_records(
    dash_server, api, token, model, running_job, new_page
) -> None:
    job, writer = running_job
    writer.commit(160)
    page = new_page(token)
    page.goto(f"{dash_server.url}/dashboard/jobs/{job['id']}")
    page.wait_for_selector("#charts[data-trials='160']")

    rows = page.query_selector_all("#task-table tbody tr")
    detail = api.get(f"/jobs/{job['id']}").json()
    assert len(rows) == len(detail["tasks"]) == len(model["tasks"]) == 2
    for row, task in zip(rows, detail["tasks"]):
        cells = [c.inner_text() for c in row.query_selector_all("td")]
        assert cells[0] == task["name"] and cells[2] == str(task["weight"])
        assert cells[6] == str(task["trials_done"]) and cells[7] == "running"
        assert cells[4].endswith("s") and cells[3] != "—"  # latency and GFLOP/s are known
    history = api.get(f"/jobs/{job['id']}/history").json()
    state = _chart_state(page)
    assert int(state["points"]) == len(history["points"]) > 0
    assert int(state["lastId"]) == history["last_id"]
    # The estimate curve ends at the job's estimate (every task tuned by this job alone).
    assert float(state["estimate"]) == pytest.approx(detail["estimated_latency_ms"])
    # Every chart has drawn data: per-task curves and the estimate (both tasks measured).
    drawn = page.eval_on_selector_all("#charts figure", "els => els.map(e => +e.dataset.points)")
    assert len(drawn) == 4 and all(n > 0 for n in drawn), drawn
    assert page.inner_text("#job-summary").count("—") >= 2  # nothing measured yet: no speedups
    assert "running" in page.inner_text("h1")

    # New records arrive: the page reads only those and redraws.
    writer.commit(96)
    page.wait_for_selector("#charts[data-trials='256']", timeout=20_000)
    newer = api.get(f"/jobs/{job['id']}/history").json()
    assert int(_chart_state(page)["points"]) == len(newer["points"]) >= len(history["points"])
    trials = [
        r.query_selector_all("td")[6].inner_text()
        for r in page.query_selector_all("#task-table tbody tr")
    ]
    detail = api.get(f"/jobs/{job['id']}").json()
    assert trials == [str(t["trials_done"]) for t in detail["tasks"]]
    assert sum(int(t) for t in trials) == 256


def test_upload_from_the_page_and_start_a_job(dash_server, api, token, new_page, tmp_path) -> None:
    import onnx

    path = tmp_path / "matmul.onnx"
    onnx.save(matmul_model(), path)
    before = {m["id"] for m in api.get("/models").json()["data"]}
    page = new_page(token)
    page.goto(f"{dash_server.url}/dashboard/models")
    page.set_input_files("#model-file", str(path))
    page.click("#upload-button")
    page.wait_for_function(  # a function, not an expression: the page's CSP forbids eval
        "() => document.querySelector('#upload-note').textContent.startsWith('model #')"
    )
    created = [m for m in api.get("/models").json()["data"] if m["id"] not in before]
    assert len(created) == 1 and created[0]["filename"] == "matmul.onnx"
    model_id = created[0]["id"]
    page.wait_for_selector(f"#models-table tr[data-model-id='{model_id}']")
    page.wait_for_selector("#model-detail table")  # the model's tuning tasks
    assert page.eval_on_selector("#job-model", "el => el.value") == str(model_id)

    page.fill("#job-budget", "24")
    page.click("#start-job")
    page.wait_for_url(re.compile(r".*/dashboard/jobs/\d+$"))
    job_id = int(page.url.rsplit("/", 1)[1])
    job = api.get(f"/jobs/{job_id}").json()
    assert (job["model_id"], job["trial_budget"], job["status"]) == (model_id, 24, "queued")
    page.wait_for_selector("#task-table tr.empty")  # no worker: no tasks yet
    assert "queued" in page.inner_text("h1")

    # A bad upload is refused with the API's message, and nothing is created.
    bad = tmp_path / "garbage.onnx"
    bad.write_bytes(b"not a model")
    page.goto(f"{dash_server.url}/dashboard/models")
    page.set_input_files("#model-file", str(bad))
    page.click("#upload-button")
    page.wait_for_selector(".error")
    assert len(api.get("/models").json()["data"]) == len(before) + 1


def test_jobs_workers_and_database_pages(dash_server, api, token, running_job, new_page) -> None:
    job, writer = running_job
    writer.commit(32)
    page = new_page(token)
    page.goto(f"{dash_server.url}/dashboard/")
    row = page.wait_for_selector(f"#jobs-table tr[data-job-id='{job['id']}']")
    cells = [c.inner_text() for c in row.query_selector_all("td")]
    assert cells[0] == f"#{job['id']}" and cells[1] == "running" and cells[2] == "two_layer.onnx"
    assert "32 / 1000" in cells[4] and cells[5].endswith("s")  # estimated latency known
    assert cells[6] == cells[7] == cells[8] == "—"  # not measured: no numbers made up
    row.query_selector("a").click()
    page.wait_for_url(f"**/dashboard/jobs/{job['id']}")
    page.wait_for_selector("#charts[data-trials='32']")

    page.click("nav a[data-section=workers]")
    worker = page.wait_for_selector(f"#workers-table tr[data-worker='{writer.worker}']")
    text = worker.inner_text()
    target = api.get("/targets").json()["data"][0]["description"]
    assert target in text and f"job #{job['id']}" in text and "ago" in text

    page.click("nav a[data-section=stats]")
    page.wait_for_selector("#stat-records")
    stats = api.get("/stats").json()
    shown = page.inner_text("#stat-records .stat-value").replace(",", "")
    assert int(shown) == stats["records"]["valid"] + stats["records"]["failed"] >= 32
    assert stats["schema_revision"] in page.inner_text("#stats")


def test_pages_need_no_token_and_nothing_from_elsewhere(
    dash_server, token, running_job, new_page
) -> None:
    import httpx

    job, writer = running_job
    writer.commit(16)
    bare = httpx.get(f"{dash_server.url}/dashboard", follow_redirects=False)
    assert bare.status_code in (301, 302, 307, 308) and bare.headers["location"] == "/dashboard/"
    for path in (
        "/dashboard/",
        f"/dashboard/jobs/{job['id']}",
        "/dashboard/models",
        "/dashboard/workers",
        "/dashboard/stats",
    ):
        response = httpx.get(dash_server.url + path)
        assert response.status_code == 200 and "<title>TuneHub</title>" in response.text, path
    assert httpx.get(f"{dash_server.url}/dashboard/nowhere").status_code == 404
    assert (
        httpx.get(f"{dash_server.url}/dashboard/static/vendor/uPlot.iife.min.js").status_code == 200
    )

    page = new_page(token)
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    for path in (f"/dashboard/jobs/{job['id']}", "/dashboard/models", "/dashboard/workers"):
        page.goto(dash_server.url + path)
        page.wait_for_load_state("networkidle")
    assert requested and all(url.startswith(dash_server.url + "/") for url in requested), requested
    assert any("/api/v1/jobs/" in url for url in requested)
