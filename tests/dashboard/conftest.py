"""Fixtures for the dashboard: one real ``tunehub serve`` (no worker: jobs stay queued unless a
test writes their records), headless Chromium, pages signed in with the local user token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.dashboard.browser import launch
from tests.dashboard.job_records import RecordWriter
from tests.onnx_factory import two_layer_model
from tests.service.conftest import Server, start_server, stop_server, upload


@pytest.fixture(scope="session")
def dash_server(tmp_path_factory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("dashboard-home"), workers=0)
    yield server
    stop_server(server)


@pytest.fixture(scope="session")
def token(dash_server) -> str:
    return dash_server.local_token()


@pytest.fixture(scope="session")
def api(dash_server, token) -> Iterator[httpx.Client]:
    with dash_server.client(token) as client:
        yield client


@pytest.fixture(scope="session")
def model_path(tmp_path_factory) -> Path:
    """A small ONNX model with two tuning tasks, written at run time."""
    import onnx

    path = tmp_path_factory.mktemp("models") / "two_layer.onnx"
    onnx.save(two_layer_model(), path)
    return path


@pytest.fixture(scope="session")
def model(api, model_path) -> dict:
    response = upload(api, model_path)
    assert response.status_code in (200, 201), response.text
    return response.json()


@pytest.fixture
def running_job(dash_server, api, model) -> Iterator[tuple[dict, RecordWriter]]:
    """A job of ``model`` claimed by a record writer (see job_records.py), no records yet.
    High priority: it is the next queued job even if a test left other jobs queued."""
    response = api.post(
        "/jobs", json={"model_id": model["id"], "trial_budget": 1000, "priority": 100}
    )
    assert response.status_code == 201, response.text
    job = response.json()
    with dash_server.storage() as storage:
        writer = RecordWriter(storage, job["id"], seed=job["id"])
        writer.start()
        yield job, writer
        storage.transition_job(job["id"], "cancelled", error="test over")


@pytest.fixture(scope="session")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@pytest.fixture
def page_errors() -> list[str]:
    return []


@pytest.fixture
def new_page(browser, page_errors):
    """``new_page(token=None)``: a page in a fresh browser context (empty localStorage), with the
    token stored if given. Uncaught script errors and console errors (other than failed loads,
    e.g. an expected 401) end up in ``page_errors``; the test fails on any."""
    contexts = []

    def make(token: str | None = None):
        context = browser.new_context(viewport={"width": 1200, "height": 800})
        contexts.append(context)
        if token:
            context.add_init_script(f"localStorage.setItem('tunehub.token', {token!r});")
        page = context.new_page()
        page.set_default_timeout(15_000)
        page.on("pageerror", lambda error: page_errors.append(f"pageerror: {error}"))
        page.on(
            "console",
            lambda msg: (
                msg.type == "error"
                and "Failed to load resource" not in msg.text
                and page_errors.append(f"console: {msg.text}")
            ),
        )
        return page

    yield make
    for context in contexts:
        context.close()
    assert page_errors == []
