"""Issue 32: decoders exported the way ``transformers`` documents it compile, keep their KV
cache as state written in place, and generate torch's greedy tokens.

- ``convert_and_export_with_cache`` (ExecuTorch's static cache: buffers updated in place) is
  accepted: the cache buffers become the library's state (:mod:`compiler.llm.state`), and the
  write of the new rows is one in-place kernel on the state (a structural check: no copy of the
  cache is made for it);
- the same export at two token counts in one archive (a prefill program and a decode program)
  shares one cache; any prompt length is fed in chunks;
- ``export_with_dynamic_cache`` (sample inputs that pickle a ``DynamicCache``, a ``DynamicCache``
  in its signature) is accepted and compiles as the pure function its graph is;
- a generation past the cache is refused before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tvm import relax

from compiler.build.verify import module_on
from compiler.errors import ModelError
from compiler.frontends.importer import import_model
from compiler.frontends.loader import load_model
from compiler.llm.cache_write import KERNEL
from compiler.llm.generate import (
    Generator,
    TorchDecoder,
    decoder_signature,
    reference_programs,
)
from compiler.prepare import prepare_model
from compiler.target import cpu_target
from examples import hf_exports
from tuner.final_build.finalize import publish_zero_trial

pytestmark = pytest.mark.slow

DECODER = "qwen2"  # grouped-query attention (4 heads over 2), q/k/v biases
CACHE = 32


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("exports")
    return {
        "static": hf_exports.save(
            hf_exports.static_cache_program(DECODER, CACHE), folder / "static.pt2"
        ),
        "archive": hf_exports.static_cache_archive(
            DECODER, folder / "archive.pt2", CACHE, prompts=(1, 8)
        ),
        "dynamic": hf_exports.save(
            hf_exports.dynamic_cache_program(DECODER, 8), folder / "dynamic.pt2"
        ),
        "symbolic": hf_exports.save(  # tokens 1..16: one program for every bucket
            hf_exports.static_cache_prefill_program(DECODER, CACHE, 16), folder / "symbolic.pt2"
        ),
    }


def _users(func: relax.Function) -> dict[str, list[relax.Call]]:
    """By variable name, the calls of ``func``'s bindings that take it as an argument."""
    users: dict[str, list[relax.Call]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if not isinstance(value, relax.Call):
                continue
            args = list(value.args)
            if args and isinstance(args[-1], relax.Tuple):
                args = args[:-1] + list(args[-1].fields)
            for arg in args:
                if isinstance(arg, relax.Var):
                    users.setdefault(arg.name, []).append(value)
    return users


def test_the_static_cache_is_state_written_in_place(exports) -> None:
    model = load_model(exports["static"])
    assert [s.buffer for s in model.state] == [
        f"{kind}_cache_{layer}" for layer in range(2) for kind in ("key", "value")
    ]
    assert all(s.axis == 2 and s.capacity == CACHE for s in model.state)
    assert [spec.name for spec in model.inputs] == ["input_ids", "cache_position"]
    main = import_model(model)["main"]
    names = [p.name for p in main.params]
    assert names == ["input_ids", "cache_position", *(s.name for s in model.state)]
    users = _users(main)
    for spec in model.state:
        (write,) = users[spec.name]  # one use: the in-place write of the new rows
        assert write.op.name == "relax.call_tir_inplace", write.op
        assert write.args[0].name_hint.startswith(KERNEL)
        assert list(write.attrs.inplace_indices) == [0]
        new_rows = write.args[1].fields[2].ty.shape
        assert int(new_rows[2]) == 1  # one token's rows, not a cache-sized tensor


def test_the_static_cache_export_generates_torchs_tokens(exports, tmp_path) -> None:
    prepared = prepare_model(exports["static"], cpu_target())
    manifest = publish_zero_trial(prepared, tmp_path / "out")
    generation = manifest["generation"]
    assert generation["passed"] and len(generation["tokens"]) == 16, generation
    assert [s["name"] for s in manifest["model"]["state"]] == [s.name for s in prepared.model.state]

    ours = Generator.load(tmp_path / "out")
    torch_reference = TorchDecoder(reference_programs(prepared.model), ours.signature)
    prompt = [5, 9, 2, 7]
    want = torch_reference.generate(prompt, 16).tokens
    assert ours.generate(prompt, 16).tokens == want
    assert ours.generate(prompt, 16).tokens == want  # a second generation starts afresh

    with pytest.raises(ModelError) as info:
        ours.generate(list(range(20)), CACHE)
    assert info.value.code == "cache_full"
    ours.reset()
    ours.prefill(list(range(CACHE)))
    with pytest.raises(ModelError) as info:
        ours.step(3)
    assert info.value.code == "cache_full"
    # The library itself never writes outside its cache, whatever it is given.
    import numpy as np

    ours.library.run([np.array([[1]]), np.array([CACHE + 5])])


def test_the_torch_reference_shares_the_weights_and_owns_its_cache(exports) -> None:
    """Verification runs the exported program for each token bucket: one module for the one
    symbolic program, whose parameters are the program's (a copy each was 2 GB a bucket on a
    0.5 B decoder) and whose buffers (the cache) are its own."""
    model = load_model(exports["symbolic"])
    programs = reference_programs(model)
    assert len(programs) > 1  # a bucket a token count, one program
    reference = TorchDecoder(programs, decoder_signature(model.describe()))
    reference.reset()
    assert len({id(module) for module in reference.modules.values()}) == 1
    module = next(iter(reference.modules.values()))
    stored = {t.data_ptr() for t in model.source.state_dict.values()}
    params = [p.data_ptr() for p in module.parameters()]
    assert params and all(ptr in stored for ptr in params)
    buffers = [b.data_ptr() for b in module.buffers()]
    assert buffers and not any(ptr in stored for ptr in buffers)
    reference.prefill([3, 1, 4])
    assert any(bool(b.abs().sum()) for b in module.buffers())  # the cache was written...
    exported = {**model.source.state_dict, **model.source.constants}
    assert not any(bool(t.abs().sum()) for n, t in exported.items() if "cache" in n)  # ...not its

    moved = module_on(module, torch.float64)  # as to a GPU: the program's tensors stay as they are
    assert all(p.dtype == torch.float64 for p in moved.parameters())
    assert all(t.dtype != torch.float64 for t in model.source.state_dict.values())


def test_a_prefill_computes_its_last_positions_logits_only(exports) -> None:
    """The LM head of an 8-token program is one row's matmul: ``[1, 1, vocabulary]`` out."""
    model = load_model(exports["archive"])
    assert model.last_logits and model.describe()["logits"] == "last_position"
    module = import_model(model)
    vocabulary = int(module["tokens_1"].ret_ty.fields[0].shape[2])
    for name in ("tokens_1", "tokens_8"):
        (logits,) = module[name].ret_ty.fields
        assert [int(v) for v in logits.shape] == [1, 1, vocabulary]
        heads = [
            binding.value.ty.shape
            for block in module[name].body.blocks
            for binding in block.bindings
            if isinstance(binding.value, relax.Call)
            and getattr(binding.value.op, "name", "") == "relax.matmul"
            and int(binding.value.ty.shape[-1]) == vocabulary
        ]
        assert [[int(v) for v in shape] for shape in heads] == [[1, vocabulary]], name


def test_prefill_and_decode_programs_share_one_cache(exports, tmp_path) -> None:
    prepared = prepare_model(exports["archive"], cpu_target())
    assert prepared.model.programs == ("tokens_1", "tokens_8")
    manifest = publish_zero_trial(prepared, tmp_path / "out")
    assert manifest["generation"]["passed"], manifest["generation"]
    assert manifest["model"]["logits"] == "last_position"
    assert manifest["verification"]["passed"], manifest["verification"]
    signature = decoder_signature(manifest["model"])
    assert signature.lengths == (8, 1) and signature.chunks(19) == [8, 8, 1, 1, 1]
    ours = Generator.load(tmp_path / "out")
    reference = TorchDecoder(reference_programs(prepared.model), signature)
    prompt = list(range(3, 14))  # 11 tokens: one prefill call of 8, three of 1
    assert ours.generate(prompt, 12).tokens == reference.generate(prompt, 12).tokens


def test_a_batch_of_four_decodes_each_sequence_as_torch_does(tmp_path) -> None:
    """A static cache of batch 4 (its own export): four different prompts prefilled and decoded
    together give each sequence torch's greedy tokens, and the logits keep one row per
    sequence."""
    import numpy as np

    program = hf_exports.static_cache_prefill_program(DECODER, CACHE, max_tokens=16, batch=4)
    path = hf_exports.save(program, tmp_path / "batch4.pt2")
    prepared = prepare_model(path, cpu_target())
    manifest = publish_zero_trial(prepared, tmp_path / "out")
    assert manifest["generation"]["passed"], manifest["generation"]
    ours = Generator.load(tmp_path / "out")
    assert ours.signature.batch == 4
    reference = TorchDecoder(reference_programs(prepared.model), ours.signature)
    prompts = np.array([[3, 5, 7, 9, 11], [2, 4, 6, 8, 10], [1, 1, 2, 3, 5], [9, 8, 7, 6, 5]])
    ours.reset()
    assert ours.prefill(prompts).shape[0] == 4
    got = ours.generate(prompts, 8).tokens
    assert len({tuple(t) for t in got}) > 1  # the rows really differ
    assert got == reference.generate(prompts, 8).tokens


def test_the_dynamic_cache_export_compiles_as_its_graph(exports, tmp_path) -> None:
    from compiler.frontends.pt2_safety import inspect_pt2_archive

    report = inspect_pt2_archive(
        exports["dynamic"], max_uncompressed_bytes=1 << 30, max_members=999
    )
    assert any(m.kind == "sample_inputs" for m in report.members)
    assert not report.pickles_scanned  # the DynamicCache pickle is never unpickled
    model = load_model(exports["dynamic"])
    assert [spec.name for spec in model.inputs] == ["input_ids", "attention_mask"]
    assert not model.state
    manifest = publish_zero_trial(prepare_model(exports["dynamic"], cpu_target()), tmp_path / "o")
    assert manifest["verification"]["passed"], manifest["verification"]
    # logits, then each layer's keys and values (the DynamicCache's tensors)
    assert len(manifest["verification"]["outputs"]) == 1 + 2 * 2
