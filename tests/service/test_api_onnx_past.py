"""Issue 32 over HTTP, against a real ``tunehub serve``: an optimum-style ONNX decoder
(``past_key_values`` inputs, ``present`` outputs) uploads with buckets over its new tokens and
its past, compiles through a job, and the downloaded artifact generates ONNX Runtime's greedy
tokens; ONNX Runtime GenAI's builder output is a 422 that names ``GroupQueryAttention``."""

from __future__ import annotations

import json

import onnx
import pytest

from compiler.llm.generate import Generator
from compiler.llm.past_present import OnnxRuntimeDecoder, manifest_signature
from examples import onnx_kv_export
from tests.service.conftest import upload, wait_for_job

pytestmark = pytest.mark.slow

DECODER = "llama"


@pytest.fixture(scope="module")
def server(serve):
    return serve()


def test_an_optimum_style_decoder_compiles_and_generates_over_rest(server, tmp_path) -> None:
    path = onnx_kv_export.export_onnx(DECODER, tmp_path / "decoder.onnx")
    with server.client(server.local_token()) as client:
        created = upload(client, path, buckets="sequence_length=1,8 past_sequence_length=8,16")
        assert created.status_code == 201, created.text
        symbols = created.json()["buckets"]["symbols"]
        assert symbols == {
            "batch_size": [1],
            "sequence_length": [1, 8],
            "past_sequence_length": [8, 16],
        }
        response = client.post("/jobs", json={"model_id": created.json()["id"], "trial_budget": 4})
        assert response.status_code == 201, response.text
        job = wait_for_job(
            client, response.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=900
        )
        assert job["status"] == "succeeded", job
        assert job["artifact"]["verified"] is True
        out = tmp_path / "artifact"
        out.mkdir()
        for name, url in (
            ("model.so", job["artifact"]["library_url"]),
            ("manifest.json", job["artifact"]["manifest_url"]),
        ):
            reply = client.get(url.removeprefix("/api/v1"))
            assert reply.status_code == 200, reply.text
            (out / name).write_bytes(reply.content)
        ours = Generator.load(out)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["generation"]["passed"], manifest["generation"]
        signature = manifest_signature(manifest["model"])
        reference = OnnxRuntimeDecoder(onnx.load(path), signature)
        prompt = [3, 1, 4, 1, 5]
        assert ours.generate(prompt, 12).tokens == reference.generate(prompt, 12).tokens


def test_a_genai_builder_model_is_a_422_naming_the_operator(server, tmp_path) -> None:
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("onnx_ir")
    # Qwen2: the builder also writes a tokenizer, which it can make for Qwen2 without one
    # beside the weights (for Llama it would need sentencepiece and a tokenizer file).
    folder = onnx_kv_export.save_pretrained("qwen2", tmp_path / "hf")
    path = onnx_kv_export.genai_builder_export(folder, tmp_path / "genai")
    with server.client(server.local_token()) as client:
        refused = upload(client, path)
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "unsupported_ops"
        assert "com.microsoft::GroupQueryAttention" in refused.json()["detail"]
