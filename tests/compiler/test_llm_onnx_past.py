"""Issue 32: ONNX decoders with ``past_key_values`` inputs and ``present`` outputs, as
``optimum-onnx`` writes them, compile as shape buckets over the new tokens and the past, and
generate ONNX Runtime's greedy tokens from the artifact (calls padded to a bucket, where the
padding was measured exact). ONNX Runtime GenAI's builder output (``GroupQueryAttention``, a
contrib operator TVM's importer lacks) is refused with one message naming the operators.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import onnx
import pytest

from compiler.errors import ModelError, UnsupportedOperatorsError
from compiler.frontends.loader import load_model
from compiler.llm.generate import Generator
from compiler.llm.past_present import (
    OnnxRuntimeDecoder,
    PastPresentGenerator,
    manifest_signature,
)
from compiler.prepare import prepare_model
from compiler.shapes.buckets import parse_bucket_field
from compiler.target import cpu_target
from examples import onnx_kv_export
from service.cli import main
from tuner.final_build.finalize import publish_zero_trial

pytestmark = pytest.mark.slow

DECODER = "qwen2"  # grouped-query attention (4 heads over 2 KV heads), q/k/v biases
PROMPT = [5, 9, 2, 7, 3]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    return onnx_kv_export.export_onnx(DECODER, tmp_path_factory.mktemp("kv") / "decoder.onnx")


@pytest.fixture(scope="module")
def artifact(exported, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("artifact") / "out"
    manifest = publish_zero_trial(prepare_model(exported, cpu_target()), out)
    return out, manifest


def test_the_file_follows_optimums_convention(exported) -> None:
    proto = onnx.load(exported)
    dims = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*proto.graph.input, *proto.graph.output]
    }
    assert list(dims)[:4] == [
        "input_ids",
        "attention_mask",
        "position_ids",
        "past_key_values.0.key",
    ]
    assert dims["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert dims["past_key_values.1.value"] == ["batch_size", 2, "past_sequence_length", 16]
    assert dims["present.1.value"] == [
        "batch_size",
        2,
        "past_sequence_length + sequence_length",
        16,
    ]
    assert dims["logits"] == ["batch_size", "sequence_length", 512]


def test_buckets_over_new_tokens_and_past_with_the_mask_derived(exported) -> None:
    model = load_model(exported)
    assert model.past_present is not None and not model.state  # a pure function
    assert model.bucket_spec.values == (
        ("batch_size", (1,)),
        ("sequence_length", (1, 16)),
        ("past_sequence_length", (16, 32, 64, 128)),
    )
    for bucket in model.buckets:
        shapes = {spec.name: spec.shape for spec in bucket.model.inputs}
        seq, past = shapes["input_ids"][1], shapes["past_key_values.0.key"][2]
        assert shapes["attention_mask"] == (1, past + seq)
    chosen = load_model(
        exported, buckets=parse_bucket_field("sequence_length=1 past_sequence_length=8,24")
    )
    assert [b.function for b in chosen.buckets] == [
        "main_batch_size_1_sequence_length_1_past_sequence_length_8",
        "main_batch_size_1_sequence_length_1_past_sequence_length_24",
    ]
    with pytest.raises(ModelError) as info:
        load_model(exported, buckets={"past_sequence_length + sequence_length": (16,)})
    assert info.value.code == "bad_buckets" and "past_sequence_length" in str(info.value)


def test_the_artifact_generates_onnxruntimes_tokens(exported, artifact) -> None:
    out, manifest = artifact
    assert manifest["verification"]["passed"], manifest["verification"]
    generation = manifest["generation"]
    assert generation["passed"] and generation["reference"] == "onnxruntime", generation
    assert len(generation["tokens"]) == 16 and generation["tokens"] == generation["expected_tokens"]
    assert generation["padding"]["allowed"], generation["padding"]
    assert "state" not in manifest["model"] and manifest["model"]["past_present"]["position_ids"]

    ours = Generator.load(out)
    assert isinstance(ours, PastPresentGenerator)
    reference = OnnxRuntimeDecoder(onnx.load(exported), manifest_signature(manifest["model"]))
    want = reference.generate(PROMPT, 16).tokens
    assert ours.generate(PROMPT, 16).tokens == want
    assert ours.generate(PROMPT, 16).tokens == want  # a second generation starts afresh
    long_prompt = list(range(1, 40))  # three prefill calls (16, 16, 7 padded to 16)
    assert ours.generate(long_prompt, 4).tokens == reference.generate(long_prompt, 4).tokens

    capacity = ours.signature.capacity
    assert capacity == 129  # the largest past bucket, and the position a call at it adds
    with pytest.raises(ModelError) as info:
        ours.generate(PROMPT, capacity)
    assert info.value.code == "cache_full"


def test_tunehub_generate_drives_the_artifact(exported, artifact) -> None:
    out, manifest = artifact
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        code = main(
            ["generate", str(out), "--prompt-ids", ",".join(map(str, PROMPT)), "--json"]
            + ["--max-new-tokens", "16"]
        )
    assert code == 0
    result = json.loads(buffer.getvalue())
    reference = OnnxRuntimeDecoder(onnx.load(exported), manifest_signature(manifest["model"]))
    assert result["tokens"] == reference.generate(PROMPT, 16).tokens
    assert result["prefill_ms"] > 0 and result["decode_ms_per_token"] > 0


def test_positions_from_the_past_length_refuse_padding(tmp_path) -> None:
    """Without ``position_ids`` the model takes positions from the past's length: a padded past
    shifts them, the measurement refuses padding, and the artifact cannot generate (no bucket
    takes an empty past) but is published, verified call by call, saying why."""
    path = onnx_kv_export.export_onnx(DECODER, tmp_path / "nopos.onnx", position_ids=False)
    buckets = parse_bucket_field("sequence_length=1 past_sequence_length=8,16")
    manifest = publish_zero_trial(
        prepare_model(path, cpu_target(), buckets=buckets), tmp_path / "o"
    )
    assert manifest["verification"]["passed"]
    generation = manifest["generation"]
    assert not generation["available"] and not generation["padding"]["allowed"], generation
    assert "position_ids" in generation["message"]
    with pytest.raises(ModelError) as info:
        Generator.load(tmp_path / "o")
    assert info.value.code == "no_generation" and "padding was refused" in str(info.value)


def test_a_genai_builder_model_is_refused_naming_its_operators(tmp_path) -> None:
    pytest.importorskip("onnxruntime_genai")
    pytest.importorskip("onnx_ir")
    folder = onnx_kv_export.save_pretrained(DECODER, tmp_path / "hf")
    path = onnx_kv_export.genai_builder_export(folder, tmp_path / "genai")
    with pytest.raises(UnsupportedOperatorsError) as info:
        load_model(path)
    assert info.value.code == "unsupported_ops"
    assert "com.microsoft::GroupQueryAttention" in info.value.ops
    assert "GroupQueryAttention" in str(info.value) and "GenAI" in str(info.value)
    # Uploads refuse external data, but the operators are named first: they are the reason.
    with pytest.raises(UnsupportedOperatorsError):
        load_model(path.read_bytes())
