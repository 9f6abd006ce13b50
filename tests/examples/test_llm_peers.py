"""The LLM benchmark's comparison side (issue 32) on the tiny decoder configurations.

Each peer runtime of :mod:`bench.llm_peers` is measured on the tiny Qwen2 and Llama shapes of
:mod:`bench.llm_models` (random weights, written with ``save_pretrained`` into a temp dir): every
timing must be positive, and every fp32 path's greedy tokens must equal torch eager's on the same
weights (torch eager itself is checked against ``transformers``' forward without a cache). ONNX
Runtime GenAI and llama.cpp are optional (the ``bench-llm`` extra): their tests skip, saying so,
where the package is not installed. Tests that convert with an external tool or compile are
marked ``slow`` (each takes ~10-60 s on two cores).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import llm_compare, llm_limit, llm_models, llm_peers
from bench.llm_models import TINY_SPECS, get_spec
from bench.llm_peers import PEERS
from bench.llm_runtime import PeerResult, PreparedModel, Settings

SETTINGS = Settings(
    threads=1,  # one thread: a shared CI machine's load cannot stall a two-thread barrier
    prefill=(8, 16),
    contexts=(8, 24),
    batch4_contexts=(8,),
    decode_tokens=4,
    warmup_tokens=1,
    repeats=1,
)
AGREE = 4
"""Leading greedy tokens (of 6 per case) an fp32 runtime must share with torch eager."""


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("llm-bench")


@pytest.fixture(scope="module")
def prepared(work_dir: Path) -> dict[str, PreparedModel]:
    out = {}
    for name in TINY_SPECS:
        spec = get_spec(name)
        out[name] = PreparedModel.of(spec, llm_models.save_model_folder(spec, work_dir), work_dir)
    return out


@pytest.fixture(scope="module")
def eager(prepared: dict[str, PreparedModel]) -> dict[str, PeerResult]:
    return {n: llm_peers.measure(PEERS["torch-eager"](), p, SETTINGS) for n, p in prepared.items()}


def _check_timings(result: PeerResult, settings: Settings = SETTINGS) -> None:
    assert result.error is None, result.error
    assert set(result.prefill_ms) == set(settings.prefill)
    assert set(result.decode_ms) == set(settings.contexts)
    assert set(result.decode_b4_ms) == set(settings.batch4_contexts)
    for values in (result.prefill_ms, result.decode_ms, result.decode_b4_ms):
        assert all(v > 0 for v in values.values()), dict(values)
    for ctx in settings.contexts:
        tokens = result.tokens[f"b1c{ctx}"]
        assert len(tokens) == 1 + settings.warmup_tokens + settings.decode_tokens
    # row 0 of batch 4 has the batch-1 prompt: the same greedy tokens
    for ctx in settings.batch4_contexts:
        if ctx in settings.contexts:
            assert result.tokens[f"b4c{ctx}"] == result.tokens[f"b1c{ctx}"]


def _require(runtime: llm_peers.Runtime) -> None:
    reason = runtime.unavailable()
    if reason:
        pytest.skip(f"{runtime.runtime}: {reason}")


def test_saved_folder_reloads_the_same_weights(prepared: dict[str, PreparedModel]) -> None:
    for name, model in prepared.items():
        spec = model.spec
        built = llm_models.build_model(spec)
        loaded = llm_models.load_saved_model(model.folder)
        assert sum(p.numel() for p in built.parameters()) == llm_models.count_parameters(spec)
        ids = torch.from_numpy(llm_models.prompt_ids(spec, 1, 12))
        with torch.no_grad():
            np.testing.assert_array_equal(built(ids).logits.numpy(), loaded(ids).logits.numpy())
        config = json.loads((model.folder / "config.json").read_text())
        assert config["tie_word_embeddings"] is (name == "qwen2.5-tiny")
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(model.folder))
        assert len(tok) == spec.vocab_size
        assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == spec.special_ids


def test_real_shapes_count_as_documented() -> None:
    qwen, llama = get_spec("qwen2.5-0.5b"), get_spec("tinyllama-1.1b")
    assert round(llm_models.count_parameters(qwen) / 1e6) == 494
    assert round(llm_models.count_parameters(llama) / 1e6) == 1100
    # 1.98 GB of fp32 weights a token for the 0.5 B shape (STACK.md's anchor)
    assert llm_models.weight_bytes_per_token(qwen, 4.0) == pytest.approx(1.976e9, rel=1e-3)
    config = qwen.make_config()
    assert (config.num_attention_heads, config.num_key_value_heads) == (14, 2)
    assert config.rope_parameters["rope_theta"] == 1e6


def test_torch_eager_matches_uncached_greedy(
    prepared: dict[str, PreparedModel], eager: dict[str, PeerResult]
) -> None:
    for name, model in prepared.items():
        result = eager[name]
        _check_timings(result)
        spec = model.spec
        hf = llm_models.load_saved_model(model.folder)
        ctx = SETTINGS.contexts[0]
        ids = torch.from_numpy(llm_models.prompt_ids(spec, 1, ctx))
        expected = []
        with torch.no_grad():
            for _ in range(len(result.tokens[f"b1c{ctx}"])):
                logits = hf(ids).logits[0, -1]
                logits[spec.special_ids[1]] = -torch.inf
                expected.append(int(logits.argmax()))
                ids = torch.cat([ids, torch.tensor([[expected[-1]]])], dim=1)
        assert list(result.tokens[f"b1c{ctx}"]) == expected


PEER_CASES = [
    (model, runtime)
    for model in TINY_SPECS
    for runtime in ("ort-genai-fp32", "ort-genai-int4", "llama.cpp-f32", "llama.cpp-q8_0")
] + [("qwen2.5-tiny", "llama.cpp-bf16")]


@pytest.mark.slow
@pytest.mark.parametrize(("model", "runtime"), PEER_CASES)
def test_peer_runtime(
    model: str, runtime: str, prepared: dict[str, PreparedModel], eager: dict[str, PeerResult]
) -> None:
    rt = PEERS[runtime]()
    _require(rt)
    result = llm_peers.measure(rt, prepared[model], SETTINGS)
    _check_timings(result)
    assert result.setup_s is not None and result.setup_s > 0
    if result.precision == "fp32":
        reference = eager[model]
        for ctx in SETTINGS.contexts:
            case = f"b1c{ctx}"
            assert result.tokens[case][:AGREE] == reference.tokens[case][:AGREE], case


@pytest.mark.slow
def test_torch_compile(prepared: dict[str, PreparedModel], eager: dict[str, PeerResult]) -> None:
    settings = Settings(
        threads=1, prefill=(8,), contexts=(8,), batch4_contexts=(), decode_tokens=3, repeats=1
    )
    result = llm_peers.measure(PEERS["torch-compile"](), prepared["qwen2.5-tiny"], settings)
    _check_timings(result, settings)
    assert result.compile_s is not None and result.compile_s > 0
    reference = eager["qwen2.5-tiny"].tokens["b1c8"]
    assert result.tokens["b1c8"] == reference[: len(result.tokens["b1c8"])]


def test_physical_limit_orders_precisions() -> None:
    bandwidth = llm_limit.measure_bandwidth(threads=2, mib=32, repeats=2)
    assert bandwidth["best_gbs"] > 0
    spec = get_spec("tinyllama-1.1b")
    rows = llm_limit.physical_limit(spec, 20.0, Settings(), bandwidth)
    ms = [r.decode_ms[128] for r in rows]
    assert [r.precision for r in rows] == ["fp32", "bf16", "8-bit", "4-bit"]
    assert ms == sorted(ms, reverse=True)
    # 4.14 GB of fp32 weights / 20 GB/s
    assert ms[0] == pytest.approx(4.138e9 / 20e9 * 1e3, rel=1e-3)


class _Renamed(llm_peers.TorchRuntime):
    """A stand-in for a registered runtime (the hook TuneHub's runner uses)."""

    runtime = "plugged-in"


def test_compare_writes_report_with_registered_runtime(
    work_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm_compare, "RUNTIMES", dict(llm_compare.RUNTIMES))
    monkeypatch.setattr(llm_compare, "DEFAULT_RUNTIMES", list(llm_compare.DEFAULT_RUNTIMES))
    llm_compare.register_runtime("plugged-in", _Renamed, default=False)
    assert "plugged-in" not in llm_compare.DEFAULT_RUNTIMES
    argv = [
        "--models", "tinyllama-tiny", "--threads", "1", "--prefill", "8",
        "--contexts", "8", "--batch4-contexts", "8", "--decode-tokens", "2",
        "--repeats", "1", "--runtimes", "torch-eager", "plugged-in",
        "--work-dir", str(work_dir), "--out", str(tmp_path), "--tag", "test",
        "--bandwidth-mib", "16",
    ]  # fmt: skip
    assert llm_compare.main(argv) == 0
    (jpath,) = tmp_path.glob("llm_*_test.json")
    report = json.loads(jpath.read_text())
    assert report["machine"]["threads_used"] == 1
    assert "avx2" in report["machine"]["flags"]
    results = report["models"]["tinyllama-tiny"]["results"]
    names = [(r["runtime"], r["variant"]) for r in results]
    assert ("torch", "eager") in names and ("plugged-in", "eager") in names
    assert sum(r["runtime"] == "limit" for r in results) == 4
    plugged = next(r for r in results if r["runtime"] == "plugged-in")
    assert (
        plugged["tokens"]["b1c8"]
        == next(r for r in results if r["runtime"] == "torch")["tokens"]["b1c8"]
    )
    text = jpath.with_suffix(".md").read_text()
    assert "| plugged-in eager | fp32 |" in text
    assert "## tinyllama-tiny" in text
