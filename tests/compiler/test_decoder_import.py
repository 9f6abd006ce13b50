"""Transformer decoders from ``transformers`` import from ``.pt2`` and ONNX (issue 20).

Every decoder of :data:`examples.decoders.DECODERS` (tiny configs, seeded random weights,
``use_cache=False``) is exported in both formats, taken through the upload path
(:func:`compiler.prepare.prepare_model`: load with external data refused, validate, import,
partition), built untuned (TVM's default schedules) and verified against torch / ONNX Runtime.
The operators the import needed for them (:mod:`compiler.frontends.pt2_ops`,
:mod:`compiler.frontends.fold_constants`) are checked one by one on small programs, and what is
still unsupported is refused with one message.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

from compiler.build.builder import build
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import compare, reference_outputs, verify
from compiler.errors import ModelError, UnsupportedOperatorsError
from compiler.frontends.importer import (
    constant_values_as_tensors,
    import_model,
    unsupported_torch_ops,
)
from compiler.frontends.loader import load_model
from compiler.frontends.model_spec import TensorSpec
from compiler.frontends.pt2_ops import CONVERTERS, DECOMPOSED_OPS
from compiler.prepare import PreparedModel, prepare_model
from compiler.target import cpu_target
from examples.decoders import DECODERS, DEFAULT_SEQ, export, get_decoder
from tests.onnx_factory import float_input, make_model

TARGET = cpu_target(2)
FORMATS = ("pt2", "onnx")
REPO = Path(__file__).resolve().parents[2]

#: Fused-operator names of mask work that must not reach the runtime: the mask of a static
#: shape is a constant (compiler.frontends.fold_constants).
MASK_OPS = ("arange", "cumsum", "index_tensor", "less_equal", "logical_and", "bitwise")

#: What each decoder's task list must show, as (description, predicate on a task name).
_RMSNORM = ("RMSNorm: mean and rsqrt fused", lambda n: "mean" in n and "sqrt" in n)
_ROTARY = (
    "rotary: rotate_half fused with the cos/sin multiply-add",
    lambda n: "negative" in n and "concatenate" in n and "multiply" in n,
)
_SILU_GATE = (
    "SiLU-gated MLP: silu(gate) * up in one task",
    lambda n: "silu_multiply" in n or "sigmoid_multiply" in n,
)
_LAYER_NORM = ("LayerNorm", lambda n: "layer_norm" in n)
_GELU_TANH = ("tanh-GELU", lambda n: "tanh" in n)
EXPECTED_PARTS: dict[str, tuple[tuple[str, Callable[[str], bool]], ...]] = {
    "llama": (_RMSNORM, _ROTARY, _SILU_GATE),
    "qwen2": (_RMSNORM, _ROTARY, _SILU_GATE),
    "mistral": (_RMSNORM, _ROTARY, _SILU_GATE),
    "gpt2": (_LAYER_NORM, _GELU_TANH),
    "phi": (_LAYER_NORM, _ROTARY, _GELU_TANH),
}


@pytest.fixture(scope="module")
def decoder_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``decoder_file(name, fmt)``: the decoder exported at ``[1, DEFAULT_SEQ]`` (once)."""
    folder = tmp_path_factory.mktemp("decoders")
    cache: dict[tuple[str, str], Path] = {}

    def get(name: str, fmt: str) -> Path:
        if (name, fmt) not in cache:
            cache[(name, fmt)] = export(name, fmt, folder / f"{name}.{fmt}")
        return cache[(name, fmt)]

    return get


@pytest.fixture(scope="module")
def prepared(decoder_file) -> Callable[[str, str], PreparedModel]:
    """``prepared(name, fmt)``: the exported file through the upload path (once)."""
    cache: dict[tuple[str, str], PreparedModel] = {}

    def get(name: str, fmt: str) -> PreparedModel:
        if (name, fmt) not in cache:
            path = decoder_file(name, fmt)
            cache[(name, fmt)] = prepare_model(
                path, TARGET, allow_external_data=False, display_name=path.name
            )
        return cache[(name, fmt)]

    return get


# ----------------------------------------------------------------------------- real decoders


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoder_builds_untuned_and_matches_its_framework(name: str, fmt: str, prepared) -> None:
    spec = get_decoder(name)
    model = prepared(name, fmt)
    assert model.model.inputs == (TensorSpec("input_ids", (1, DEFAULT_SEQ), "int64"),)
    library = LoadedLibrary.from_executable(build(model.mod, TARGET))

    result = verify(model.model, library.run)
    assert result.passed, result.message
    assert result.outputs[0].shape == (1, DEFAULT_SEQ, spec.vocab_size)
    # verify draws token ids 0 and 1 only: once more over the whole vocabulary
    ids = spec.make_input_ids(seed=1).numpy()
    whole = compare(library.run([ids]), reference_outputs(model.model, [ids]), result.reference)
    assert whole.passed, whole.message


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", sorted(DECODERS))
def test_decoder_tasks_are_the_layers_and_no_mask(name: str, fmt: str, prepared) -> None:
    spec = get_decoder(name)
    tasks = prepared(name, fmt).partition.tasks
    names = [task.name for task in tasks]
    assert not [n for n in names if any(op in n for op in MASK_OPS)], names
    assert any("softmax" in n for n in names), names
    outputs = [task.shapes[-1][1] for task in tasks if "matmul" in task.name]
    assert (DEFAULT_SEQ, spec.vocab_size) in outputs, "the LM head is one GEMM task"
    assert any(len(shape) >= 3 and shape[-2] == DEFAULT_SEQ for shape in outputs), (
        "attention scores are a batched matmul over heads"
    )
    embedding = [task for task in tasks if "take" in task.name]
    assert len(embedding) == 1 and not embedding[0].tunable
    for description, matches in EXPECTED_PARTS[name]:
        assert any(matches(n) for n in names), f"{description}: none in {names}"


def test_gqa_shares_key_and_value_projections_of_half_width(prepared) -> None:
    """Qwen2's 2 KV heads of 4: K and V project to 32 (one task, weight 4 over 2 layers)."""
    tasks = prepared("qwen2", "pt2").partition.tasks
    kv = [t for t in tasks if "matmul" in t.name and t.shapes[-1][1] == (DEFAULT_SEQ, 32)]
    assert len(kv) == 1 and kv[0].weight == 4, [(t.name, t.shapes, t.weight) for t in tasks]


# --------------------------------------------------------------- the operators, one at a time


def _pt2(module: torch.nn.Module, example: torch.Tensor, path: Path):
    program = torch.export.export(module.eval(), (example,))
    torch.export.save(program, path)
    return program


class _Fn(torch.nn.Module):
    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> object:
        return self.fn(x)


def _div_in_place(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y /= x.abs() + 1
    return y


def _index_copy_in_place(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.index_copy_(1, torch.tensor([5]), x[:, :1] * 3)  # a StaticCache's write at one position
    return y


DECOMPOSED_CASES = {
    "diff.default": (lambda x: torch.diff(x, dim=-1, prepend=x[..., :1] - 1), (2, 8)),
    "to.device": (lambda x: (x.to(device=x.device, dtype=torch.float64) * 3).float(), (2, 8)),
    "where.ScalarOther": (lambda x: torch.where(x > 0, x, 0.5), (2, 8)),
    "numpy_T.default": (lambda x: x.T * 2, (3, 5)),
    "repeat_interleave.self_int": (lambda x: torch.repeat_interleave(x, 2, dim=-1), (2, 4)),
    "div_.Tensor": (_div_in_place, (2, 8)),
    "index_copy_.default": (_index_copy_in_place, (2, 8)),
}


def test_every_decomposed_op_has_a_case() -> None:
    assert set(DECOMPOSED_CASES) == DECOMPOSED_OPS


@pytest.mark.parametrize("op", sorted(DECOMPOSED_CASES))
def test_decomposed_op_leaves_no_trace_and_matches_torch(op: str, tmp_path: Path) -> None:
    fn, shape = DECOMPOSED_CASES[op]
    program = _pt2(_Fn(fn), torch.randn(shape), tmp_path / "m.pt2")
    ops = {n.target.__name__ for n in program.graph.nodes if n.op == "call_function"}
    assert op in ops, f"the case does not exercise {op}: {sorted(ops)}"
    decomposed = program.run_decompositions()
    assert op not in {n.target.__name__ for n in decomposed.graph.nodes if n.op == "call_function"}
    assert unsupported_torch_ops(decomposed, decomposed=True) == []

    model = load_model(tmp_path / "m.pt2")
    library = LoadedLibrary.from_executable(build(import_model(model), TARGET))
    result = verify(model, library.run)
    assert result.passed, result.message


def _cumsums(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (x > 0).cumsum(-1), x.int().cumsum(-1), x.cumsum(0)


def _bitwise(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    a, b = x > 0, x < 0.5
    return a & b, a | b, a ^ b, ~a, x.int() & (x * 10).int()


@pytest.mark.parametrize(
    ("fn", "ops"),
    [
        (_cumsums, {"cumsum.default"}),
        (
            _bitwise,
            {
                "bitwise_and.Tensor",
                "bitwise_or.Tensor",
                "bitwise_xor.Tensor",
                "bitwise_not.default",
            },
        ),
    ],
    ids=["cumsum", "bitwise"],
)
def test_converters_match_torch_on_inputs(fn, ops: set[str], tmp_path: Path) -> None:
    """The converters of compiler.frontends.pt2_ops on values computed from the input (not folded):
    torch's dtypes (a boolean or int32 cumsum is int64), boolean and integer operands."""
    assert ops <= set(CONVERTERS)
    program = _pt2(_Fn(fn), torch.randn(3, 6), tmp_path / "m.pt2")
    decomposed = program.run_decompositions()
    assert ops <= {n.target.__name__ for n in decomposed.graph.nodes if n.op == "call_function"}
    model = load_model(tmp_path / "m.pt2")
    library = LoadedLibrary.from_executable(build(import_model(model), TARGET))
    inputs = [np.random.default_rng(3).standard_normal((3, 6)).astype(np.float32)]
    got, want = library.run(inputs), reference_outputs(model, inputs)
    assert [g.dtype for g in got] == [w.dtype for w in want]
    result = compare(got, want, "torch")
    assert result.passed, result.message


class _BufferMask(torch.nn.Module):
    """A running sum and a gather over buffers: constants, but not input-free (placeholders)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("positions", torch.arange(8))
        self.register_buffer("rows", torch.tensor([[0], [3], [5]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.positions > 2).cumsum(0)[self.rows].float()


def _cumsum_of_initializer() -> onnx.ModelProto:
    ramp = onnx.numpy_helper.from_array(np.arange(8, dtype=np.int64), "ramp")
    axis = onnx.numpy_helper.from_array(np.array(0, dtype=np.int64), "axis")
    nodes = [
        helper.make_node("CumSum", ["ramp", "axis"], ["sums"]),
        helper.make_node("Cast", ["sums"], ["sums_f"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Add", ["x", "sums_f"], ["y"]),
    ]
    return make_model(nodes, [float_input("x", [8])], [float_input("y", [8])], [ramp, axis])


@pytest.mark.parametrize("fmt", FORMATS)
def test_cumsum_and_index_of_constants_are_folded(fmt: str, tmp_path: Path) -> None:
    """compiler.frontends.fold_constants: what FoldConstant cannot fold (cumsum, index_tensor) is no
    task."""
    path = tmp_path / f"m.{fmt}"
    if fmt == "pt2":
        _pt2(_BufferMask(), torch.randn(3, 1), path)
    else:
        path.write_bytes(_cumsum_of_initializer().SerializeToString())
    model = prepare_model(path, TARGET, allow_external_data=False)
    assert [task.name for task in model.partition.tasks] == ["add1"]
    library = LoadedLibrary.from_executable(build(model.mod, TARGET))
    result = verify(model.model, library.run)
    assert result.passed, result.message


def test_onnx_constants_given_by_value_attributes_import(tmp_path: Path) -> None:
    """``Constant`` nodes with ``value_ints`` / ``value_floats`` / ``value_float`` /
    ``value_int`` (what torch's dynamo exporter writes for decoders' reshapes) import."""
    constants = [
        helper.make_node("Constant", [], ["shape"], value_ints=[3, 4]),
        helper.make_node("Constant", [], ["scale"], value_floats=[1.0, 2.0, 3.0, 4.0]),
        helper.make_node("Constant", [], ["offset"], value_float=1.5),
        helper.make_node("Constant", [], ["row"], value_int=1),
    ]
    graph = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),
        helper.make_node("Mul", ["r", "scale"], ["m"]),
        helper.make_node("Add", ["m", "offset"], ["a"]),
        helper.make_node("Gather", ["a", "row"], ["y"], axis=0),
    ]
    proto = make_model(constants + graph, [float_input("x", [2, 6])], [float_input("y", [4])])
    onnx.checker.check_model(proto)
    assert constant_values_as_tensors(onnx.ModelProto.FromString(proto.SerializeToString())) == 4
    path = tmp_path / "m.onnx"
    path.write_bytes(proto.SerializeToString())
    model = load_model(path)
    library = LoadedLibrary.from_executable(build(import_model(model), TARGET))
    result = verify(model, library.run)
    assert result.passed, result.message


# ------------------------------------------------------------------------------- refusals


class _Unsupported(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.histc(x, bins=4).sum() + torch.logsumexp(x, dim=-1)


def test_unsupported_ops_are_refused_in_one_message(tmp_path: Path) -> None:
    _pt2(_Unsupported(), torch.randn(2, 8), tmp_path / "m.pt2")
    with pytest.raises(UnsupportedOperatorsError) as info:
        prepare_model(tmp_path / "m.pt2", TARGET, allow_external_data=False)
    err = info.value
    assert err.code == "unsupported_ops"
    assert err.ops == ["histc.default", "logsumexp.default"]
    assert err.message == (
        "torch.export model uses 2 unsupported operator(s): histc.default, logsumexp.default"
    )


def test_the_decomposed_graph_is_checked_too() -> None:
    """logsumexp is refused before decomposition; what it decomposes into (amax) would be
    refused after it, the graph TVM translates."""
    program = torch.export.export(_Fn(lambda x: torch.logsumexp(x, -1)), (torch.randn(2, 8),))
    assert unsupported_torch_ops(program) == ["logsumexp.default"]
    assert unsupported_torch_ops(program.run_decompositions(), decomposed=True) == ["amax.default"]


def test_mixtral_default_experts_are_refused(decoder_file) -> None:
    """transformers' default mixture-of-experts kernel is an operator of its own: one message
    naming the unsupported operators where transformers is imported, and one naming the unknown
    operator where it is not (an upload's validation process)."""
    path = decoder_file("mixtral", "pt2")
    with pytest.raises(ModelError) as info:
        import_model(load_model(path))
    assert info.value.code == "unsupported_ops"
    assert info.value.message == (
        "torch.export model uses 2 unsupported operator(s): grouped_mm_fallback.default, "
        "histc.default"
    )
    script = (
        "import sys; from pathlib import Path\n"
        "from compiler.errors import ModelError\n"
        "from compiler.frontends.loader import load_model\n"
        "try:\n    load_model(Path(sys.argv[1]))\n"
        "except ModelError as err:\n"
        "    print(err.code, 'transformers' in sys.modules)\n    print(err.message)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    code, message = done.stdout.splitlines()
    assert code == "unsupported_ops False", done.stdout + done.stderr
    assert message.startswith(
        "torch.export model calls transformers.grouped_mm_fallback.default, an operator PyTorch "
        "itself does not define"
    )
