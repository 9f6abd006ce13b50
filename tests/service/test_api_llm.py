"""Issue 32 over HTTP, against a real ``tunehub serve``: both exports ``transformers`` documents
for deployment upload and compile through a job (the embedded worker tunes the static-cache
export a few trials, builds the dynamic-cache one with none, and verifies each library); the
downloaded static-cache decoder generates torch's greedy tokens (16) with its cache kept as
state."""

from __future__ import annotations

import pytest

from compiler.frontends.loader import load_model
from compiler.llm.generate import Generator, TorchDecoder, reference_programs
from examples import hf_exports
from tests.service.conftest import upload, wait_for_job

pytestmark = pytest.mark.slow

DECODER = "llama"
CACHE = 32


@pytest.fixture(scope="module")
def server(serve):
    return serve()


def _job(client, path, tmp_path, **fields):
    created = upload(client, path)
    assert created.status_code == 201, created.text
    body = {"model_id": created.json()["id"], "trial_budget": 4, **fields}
    response = client.post("/jobs", json=body)
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

        # The dynamic-cache export builds with no trials: compiling it is what is new here.
        artifact = _job(client, dynamic, tmp_path, trial_budget=0)
        import json

        manifest = json.loads((artifact / "manifest.json").read_text())
        assert manifest["verification"]["passed"]
        assert [i["name"] for i in manifest["model"]["inputs"]] == ["input_ids", "attention_mask"]


def test_a_job_with_8_bit_weights(server, tmp_path, example_model) -> None:
    """``weights: q8_0`` makes the job's target the CPU with 8-bit weights (its own target key):
    the artifact says so, and is verified against the model quantized the same way, a ``.pt2``
    decoder's and an ONNX model's alike. An unknown format is refused, nothing queued."""
    import json

    static = hf_exports.save(hf_exports.static_cache_program(DECODER, CACHE), tmp_path / "s.pt2")
    with server.client(server.local_token()) as client:
        artifact = _job(client, static, tmp_path, weights="q8_0", trial_budget=0)
        manifest = json.loads((artifact / "manifest.json").read_text())
        assert manifest["model"]["weights"]["format"] == "q8_0"
        assert manifest["verification"]["passed"] and manifest["generation"]["passed"]

        mlp = example_model("mlp", "onnx")
        artifact = _job(client, mlp, tmp_path, weights="q8_0", trial_budget=0)
        manifest = json.loads((artifact / "manifest.json").read_text())
        assert manifest["model"]["weights"]["format"] == "q8_0"
        assert manifest["model"]["weights"]["tensors"] == 2  # 512 and 256 inputs; 784 is no block
        assert manifest["verification"]["passed"]

        onnx = upload(client, mlp)
        before = client.get("/jobs").json()
        bad = client.post(
            "/jobs", json={"model_id": onnx.json()["id"], "trial_budget": 4, "weights": "q4"}
        )
        assert bad.status_code == 422, bad.text
        assert client.get("/jobs").json() == before
