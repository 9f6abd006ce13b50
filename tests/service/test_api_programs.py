"""A decoder's prefill and decode programs as one job over HTTP, against a real ``tunehub
serve``: one ``.pt2`` archive holding both programs (``examples.kv_decoder.export_generation``)
is uploaded, tuned a few trials by the embedded worker through the one engine, and published
as one verified library with a function per program; the downloaded library runs generation
(its prefill's cache fed to its decode) and matches the full ``transformers`` model.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from compiler.build.runner import LoadedLibrary
from compiler.build.verify import compare
from examples.kv_decoder import build_causal_lm, export_generation, get_kv_decoder
from tests.service.conftest import upload, wait_for_job

DECODER = "qwen2"
SEQ = 12
PAST = 12


@pytest.fixture(scope="module")
def server(serve):
    return serve()


def test_prefill_and_decode_tuned_as_one_job(server, tmp_path) -> None:
    path = export_generation(DECODER, tmp_path / "qwen2_generation.pt2", SEQ, PAST)
    with server.client(server.local_token()) as client:
        refused = upload(client, path, buckets="seq=16")
        assert refused.status_code == 422, refused.text
        assert "several programs (prefill, decode)" in refused.json()["detail"]
        created = upload(client, path)
        assert created.status_code == 201, created.text
        model = created.json()
        assert model["tasks"]

        response = client.post("/jobs", json={"model_id": model["id"], "trial_budget": 6})
        assert response.status_code == 201, response.text
        job = wait_for_job(
            client, response.json()["id"], {"succeeded", "failed", "cancelled"}, timeout=900
        )
        assert job["status"] == "succeeded", job
        assert job["trials_done"] >= 6
        artifact = job["artifact"]
        assert artifact["verified"] is True
        manifest = client.get(artifact["manifest_url"].removeprefix("/api/v1")).json()
        listed = manifest["model"]["buckets"]
        assert listed["programs"] == ["prefill", "decode"]
        assert [f["function"] for f in listed["functions"]] == ["prefill", "decode"]
        assert "padding" not in listed
        checks = manifest["verification"]["buckets"]
        assert [c["function"] for c in checks] == ["prefill", "decode"]
        assert all(c["passed"] for c in checks)
        assert "at every program (2: prefill, decode" in manifest["verification"]["message"]
        library = client.get(artifact["library_url"].removeprefix("/api/v1"))
        assert library.status_code == 200
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.so").write_bytes(library.content)
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    lib = LoadedLibrary(tmp_path / "out" / "model.so")  # reads the function table beside it

    spec = get_kv_decoder(DECODER)
    ids = spec.make_input_ids(SEQ + 1, seed=5)
    with torch.no_grad():
        full = build_causal_lm(spec)(input_ids=ids, use_cache=False).logits[0].numpy()
    prompt = ids[:, :SEQ].numpy()
    assert lib.function_for([prompt]) == "prefill"
    logits, keys, values = lib.run([prompt])
    assert compare([logits[0, -1]], [full[SEQ - 1]], "torch").passed
    step = [ids[:, SEQ:].numpy(), keys, values]
    assert lib.function_for(step) == "decode"
    next_logits, next_keys, _ = lib.run(step)
    result = compare([next_logits[0, -1]], [full[SEQ]], "torch")
    assert result.passed, result.message
    np.testing.assert_array_equal(next_keys[..., :SEQ, :], keys)
