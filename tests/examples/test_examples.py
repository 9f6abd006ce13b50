"""Tests of the example networks and their ONNX / .pt2 exports.

Every network is exported once per test module (both formats) into a temp dir; each export is
checked against torch eager (ONNX Runtime for .onnx, ``torch.export.load`` for .pt2) and
imported into TVM Relax through both frontends. The small CNN is also compiled with TVM
(untuned) and run, to check that batch-norm survives both imports numerically.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from examples import export as ex
from examples.networks import EXAMPLES, ExampleSpec

# torch's own pytree code warns on every torch.export.save/load; nothing here to act on.
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

NAMES = sorted(EXAMPLES)
REL_TOL = 1e-4
"""Allowed max abs error, as a fraction of the reference output's max magnitude (floor 1)."""


def _reference(spec: ExampleSpec) -> tuple[tuple[torch.Tensor, ...], np.ndarray]:
    inputs = spec.make_inputs(seed=0)
    with torch.no_grad():
        return inputs, spec.build()(*inputs).numpy()


def _assert_close(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.shape == expected.shape
    scale = max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(actual - expected).max())
    assert err <= REL_TOL * scale, f"max abs error {err:.3g} > {REL_TOL} * {scale:.3g}"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    """``exported(name, fmt)``: path of the file; both formats are exported on first request."""
    out_dir = tmp_path_factory.mktemp("examples")
    cache: dict[tuple[str, str], Path] = {}

    def get(name: str, fmt: str) -> Path:
        if (name, fmt) not in cache:
            onnx_path, pt2_path = ex.export_all(out_dir, [name], ["onnx", "pt2"])
            cache[name, "onnx"], cache[name, "pt2"] = onnx_path, pt2_path
        return cache[name, fmt]

    return get


# --- registry -------------------------------------------------------------------------------


def test_registry_names() -> None:
    assert set(EXAMPLES) == {"resnet18", "mobilenetv2", "bert", "mlp", "small_cnn"}
    for name, spec in EXAMPLES.items():
        assert spec.name == name and spec.description and spec.inputs


@pytest.mark.parametrize("name", ["small_cnn", "mlp"])
def test_weights_and_inputs_are_deterministic(name: str) -> None:
    spec = EXAMPLES[name]
    state = torch.get_rng_state()
    a, b = spec.build(), spec.build()
    assert torch.equal(torch.get_rng_state(), state), "building must not touch the global RNG"
    assert not a.training
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    for x, y in zip(spec.make_inputs(3), spec.make_inputs(3)):
        assert torch.equal(x, y)
    assert not torch.equal(spec.make_inputs(3)[0], spec.make_inputs(4)[0])


# --- ONNX ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_onnx_matches_torch(name: str, exported: Callable[[str, str], Path]) -> None:
    spec = EXAMPLES[name]
    path = exported(name, "onnx")
    model = onnx.load(path, load_external_data=False)
    onnx.checker.check_model(model)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(path.name) and p != path]
    assert all(not init.external_data for init in model.graph.initializer), "weights must be inline"
    assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {ex.ONNX_OPSET}
    for value, input_spec in zip(model.graph.input, spec.inputs):
        assert value.name == input_spec.name
        assert [d.dim_value for d in value.type.tensor_type.shape.dim] == list(input_spec.shape)

    inputs, expected = _reference(spec)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (actual,) = session.run(
        [ex.ONNX_OUTPUT_NAME], {i.name: t.numpy() for i, t in zip(spec.inputs, inputs)}
    )
    _assert_close(actual, expected)


def test_onnx_keeps_batchnorm(exported: Callable[[str, str], Path]) -> None:
    ops = {node.op_type for node in onnx.load(exported("small_cnn", "onnx")).graph.node}
    assert "BatchNormalization" in ops and "Conv" in ops


# --- pt2 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_pt2_matches_torch(name: str, exported: Callable[[str, str], Path]) -> None:
    spec = EXAMPLES[name]
    program = torch.export.load(exported(name, "pt2"))
    inputs, expected = _reference(spec)
    with torch.no_grad():
        actual = program.module()(*inputs).numpy()
    _assert_close(actual, expected)


# --- TVM Relax import ---------------------------------------------------------------------


def _assert_main_signature(mod: object, spec: ExampleSpec) -> None:
    """The Relax ``main`` takes the example's inputs first, with their static shapes and dtypes."""
    params = mod["main"].params[: len(spec.inputs)]  # type: ignore[index]
    assert [tuple(int(d) for d in p.ty.shape) for p in params] == [i.shape for i in spec.inputs]
    assert [str(p.ty.dtype) for p in params] == [
        str(i.dtype).removeprefix("torch.") for i in spec.inputs
    ]


@pytest.mark.parametrize("name", NAMES)
def test_tvm_imports_onnx(name: str, exported: Callable[[str, str], Path]) -> None:
    from tvm.relax.frontend.onnx import from_onnx

    mod = from_onnx(onnx.load(exported(name, "onnx")))
    _assert_main_signature(mod, EXAMPLES[name])


@pytest.mark.parametrize("name", NAMES)
def test_tvm_imports_pt2(name: str, exported: Callable[[str, str], Path]) -> None:
    from tvm.relax.frontend.torch import from_exported_program

    mod = from_exported_program(torch.export.load(exported(name, "pt2")))
    _assert_main_signature(mod, EXAMPLES[name])


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["onnx", "pt2"])
def test_tvm_runs_small_cnn(fmt: str, exported: Callable[[str, str], Path]) -> None:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx
    from tvm.relax.frontend.torch import from_exported_program

    spec = EXAMPLES["small_cnn"]
    path = exported("small_cnn", fmt)
    mod = (
        from_onnx(onnx.load(path))
        if fmt == "onnx"
        else from_exported_program(torch.export.load(path))
    )
    mod, params = relax.frontend.detach_params(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    inputs, expected = _reference(spec)
    args = [tvm.runtime.tensor(t.numpy()) for t in inputs] + list(params.get("main", []))
    out = vm["main"](*args)
    while not hasattr(out, "numpy"):  # the torch frontend returns a tuple of outputs
        out = out[0]
    _assert_close(out.numpy(), expected)


# --- export API ----------------------------------------------------------------------------


def test_export_all_rejects_unknown_before_writing(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        ex.export_all(tmp_path, ["mlp", "nope"])
    with pytest.raises(ValueError):
        ex.export_all(tmp_path, ["mlp"], ["onnx", "tflite"])
    assert list(tmp_path.iterdir()) == []


def test_failed_export_keeps_old_file_and_leaves_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "mlp.pt2"
    target.write_bytes(b"old")

    def boom(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch.export, "save", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        ex.export_pt2("mlp", target)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["mlp.pt2"]


def test_exports_are_byte_identical(tmp_path: Path) -> None:
    first = ex.export_all(tmp_path / "a", ["mlp"])
    second = ex.export_all(tmp_path / "b", ["mlp"])
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_cli_writes_requested_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ex.main([str(tmp_path / "out"), "--names", "mlp", "--formats", "onnx"]) == 0
    written = tmp_path / "out" / "mlp.onnx"
    assert capsys.readouterr().out.split() == [str(written)]
    assert sorted(p.name for p in written.parent.iterdir()) == ["mlp.onnx"]
    onnx.checker.check_model(onnx.load(written))
