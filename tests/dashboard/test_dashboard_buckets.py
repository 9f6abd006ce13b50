"""The dashboard's upload form sends shape buckets: a model with a symbolic dimension uploaded
with ``batch=4,2`` says so in the upload note and the task table's header; a bad spec shows the
API's message and creates nothing."""

from __future__ import annotations

import onnx

from tests.onnx_factory import matmul_model


def test_upload_with_buckets_from_the_page(dash_server, api, token, new_page, tmp_path) -> None:
    path = tmp_path / "symbolic.onnx"
    onnx.save(matmul_model(rows="batch"), path)
    before = len(api.get("/models").json()["data"])
    page = new_page(token)
    page.goto(f"{dash_server.url}/dashboard/models")
    page.set_input_files("#model-file", str(path))
    page.fill("#model-buckets", "rows=5")
    page.click("#upload-button")
    page.wait_for_selector(".error")
    assert "not a symbolic dimension of the model" in page.inner_text(".error")
    assert len(api.get("/models").json()["data"]) == before

    page.goto(f"{dash_server.url}/dashboard/models")
    page.set_input_files("#model-file", str(path))
    page.fill("#model-buckets", "batch=4,2")
    page.click("#upload-button")
    page.wait_for_function(  # a function, not an expression: the page's CSP forbids eval
        "() => document.querySelector('#upload-note').textContent.startsWith('model #')"
    )
    assert "shape buckets batch=2,4" in page.inner_text("#upload-note")
    page.wait_for_selector("#model-detail table")
    assert "shape buckets: batch=2,4" in page.inner_text("#model-detail")
    created = api.get("/models").json()["data"][0]
    assert created["buckets"]["symbols"] == {"batch": [2, 4]}
