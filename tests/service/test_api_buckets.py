"""Shape buckets over HTTP, against a real ``tunehub serve``: a decoder with a symbolic sequence
length is uploaded with ``buckets`` (a bad spec is a 422 with a message and leaves nothing
behind; the same content with other buckets a 409), and its job (no trials) is finalized by
the embedded worker into one verified library with a function per bucket: the finalize lease
and the server's check of the artifact prepare the model with the stored buckets.
"""

from __future__ import annotations

import pytest

from examples.decoders import export_dynamic
from tests.service.conftest import upload, wait_for_job
from tests.service.request_helpers import tmp_leftovers


@pytest.fixture(scope="module")
def server(serve):
    return serve()


def test_upload_with_buckets_and_finalize(server, tmp_path) -> None:
    path = export_dynamic("gpt2", "onnx", tmp_path / "gpt2_dynamic.onnx")
    with server.client(server.local_token()) as client:
        for buckets, fragment in (
            ("seq=16,x", "expected NAME=V1,V2"),
            ("len=16", "not a symbolic dimension of the model"),
            ("seq=16;seq=32", "twice"),
        ):
            refused = upload(client, path, buckets=buckets)
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] == "bad_buckets"
            assert fragment in refused.json()["detail"]
        assert client.get("/models").json()["count"] == 0
        assert not list((server.storage_dir / "models").iterdir())
        assert not tmp_leftovers(server.storage_dir)

        created = upload(client, path, buckets="seq=32,16")
        assert created.status_code == 201, created.text
        model = created.json()
        assert model["buckets"]["symbols"] == {"seq": [16, 32]}
        assert model["buckets"]["defaulted"] == []
        assert model["tasks"]
        again = upload(client, path, buckets="seq=16,32")
        assert again.status_code == 200 and again.json()["id"] == model["id"]
        other = upload(client, path, buckets="seq=64")
        assert other.status_code == 409 and "DELETE /models/" in other.json()["detail"]
        histogram = upload(client, path, buckets="seq~8:30,20:10")
        assert histogram.status_code == 409, histogram.text  # the same content, other buckets

        response = client.post("/jobs", json={"model_id": model["id"], "trial_budget": 0})
        assert response.status_code == 201, response.text
        job = wait_for_job(
            client, response.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=600
        )
        assert job["status"] == "succeeded", job
        artifact = job["artifact"]
        assert artifact["verified"] is True
        manifest = client.get(artifact["manifest_url"].removeprefix("/api/v1")).json()
        listed = manifest["model"]["buckets"]
        assert [f["function"] for f in listed["functions"]] == ["main_seq_16", "main_seq_32"]
        checks = manifest["verification"]["buckets"]
        assert [c["function"] for c in checks] == ["main_seq_16", "main_seq_32"]
        assert all(c["passed"] for c in checks)


def test_upload_with_a_histogram(server, tmp_path) -> None:
    """Buckets derived from a histogram of expected lengths: stored with each bucket's share,
    the task weights following them; the same histogram again is the same model."""
    path = export_dynamic("llama", "onnx", tmp_path / "llama_hist.onnx")
    with server.client(server.local_token()) as client:
        refused = upload(client, path, buckets="seq~8:30,20:1/99")
        assert refused.status_code == 422 and "1..16 buckets" in refused.json()["detail"]
        refused = upload(client, path, buckets="seq~8:x")
        assert refused.status_code == 422 and "SIZE:COUNT" in refused.json()["detail"]
        created = upload(client, path, buckets="seq~8:90,30:10/2")
        assert created.status_code == 201, created.text
        model = created.json()
        assert model["buckets"]["symbols"] == {"seq": [8, 30]}
        assert model["buckets"]["shares"] == {"seq": [0.9, 0.1]}
        assert model["buckets"]["histograms"] == {"seq": "8:90,30:10/2"}
        again = upload(client, path, buckets="seq~8:90,30:10/2")
        assert again.status_code == 200 and again.json()["id"] == model["id"]
        assert upload(client, path, buckets="seq=8,30").status_code == 409
