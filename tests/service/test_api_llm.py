"""Issue 32 over HTTP, against a real ``tunehub serve``: both exports ``transformers`` documents
for deployment upload and compile through a job (the embedded worker tunes a few trials and
builds the verified library); the downloaded static-cache decoder generates torch's greedy
tokens (16) with its cache kept as state."""

from __future__ import annotations

import pytest

from compiler.llm.generate import Generator, TorchDecoder, reference_programs
from compiler.loader import load_model
from examples import hf_exports
from tests.service.conftest import upload, wait_for_job

pytestmark = pytest.mark.slow

DECODER = "llama"
CACHE = 32


@pytest.fixture(scope="module")
def server(serve):
    return serve()


def _job(client, path, tmp_path):
    created = upload(client, path)
    assert created.status_code == 201, created.text
    response = client.post("/jobs", json={"model_id": created.json()["id"], "trial_budget": 4})
    assert response.status_code == 201, response.text
    job = wait_for_job(
        client, response.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=900
    )
    assert job["status"] == "succeeded", job
    assert job["artifact"]["verified"] is True
    out = tmp_path / f"job-{job['id']}"
    out.mkdir()
    for name, url in (
        ("model.so", job["artifact"]["library_url"]),
        ("manifest.json", job["artifact"]["manifest_url"]),
    ):
        reply = client.get(url.removeprefix("/api/v1"))
        assert reply.status_code == 200, reply.text
        (out / name).write_bytes(reply.content)
    return out


def test_both_standard_exports_compile_over_rest(server, tmp_path) -> None:
    static = hf_exports.save(
        hf_exports.static_cache_program(DECODER, CACHE), tmp_path / "static.pt2"
    )
    dynamic = hf_exports.save(hf_exports.dynamic_cache_program(DECODER, 8), tmp_path / "dyn.pt2")
    with server.client(server.local_token()) as client:
        artifact = _job(client, static, tmp_path)
        ours = Generator.load(artifact)
        reference = TorchDecoder(reference_programs(load_model(static)), ours.signature)
        prompt = [3, 1, 4, 1, 5]
        assert ours.generate(prompt, 16).tokens == reference.generate(prompt, 16).tokens

        artifact = _job(client, dynamic, tmp_path)
        import json

        manifest = json.loads((artifact / "manifest.json").read_text())
        assert manifest["verification"]["passed"]
        assert [i["name"] for i in manifest["model"]["inputs"]] == ["input_ids", "attention_mask"]
