"""Every bad model input gets a clear ModelError (code + message); good ones load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from compiler.errors import ModelError, UnsupportedOperatorsError
from compiler.frontends.importer import import_model
from compiler.frontends.loader import load_model
from compiler.frontends.model_spec import ModelLimits
from tests.onnx_factory import (
    add_chain_model,
    constant_of_shape_bomb,
    external_data_model,
    float_input,
    make_model,
    matmul_model,
    relu_model,
    unsupported_ops_model,
)


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString()


def _error(source, **kwargs) -> ModelError:
    with pytest.raises(ModelError) as info:
        model = load_model(source, **kwargs)
        import_model(model)
    return info.value


def test_valid_model_loads_with_static_inputs() -> None:
    model = load_model(_bytes(matmul_model()))
    assert model.format == "onnx"
    assert [(s.name, s.shape, s.dtype) for s in model.inputs] == [("x", (4, 16), "float32")]
    assert len(model.sha256) == 64


def test_empty_file() -> None:
    assert _error(b"").code == "empty"


def test_truncated_file() -> None:
    data = _bytes(matmul_model())
    err = _error(data[: len(data) // 2])
    assert err.code == "bad_onnx"
    assert "truncated" in err.message


def test_garbage_bytes() -> None:
    err = _error(bytes(range(256)) * 8)
    assert err.code == "bad_onnx"


def test_wrong_magic_declared_format() -> None:
    err = _error(_bytes(relu_model()), expected_format="pt2")
    assert err.code == "wrong_format"
    assert "declared as pt2" in err.message


def test_zip_magic_garbage_is_refused_as_pt2() -> None:
    err = _error(b"PK\x03\x04" + b"\x00garbage" * 50)
    assert err.code.startswith("bad_pt2") or err.code == "bad_zip"


def test_oversized_file_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.onnx"
    path.write_bytes(_bytes(matmul_model()))
    err = _error(path, limits=ModelLimits(max_bytes=100))
    assert err.code == "too_large"
    assert "over the limit of 100 bytes" in err.message


def test_huge_declared_input_shape() -> None:
    err = _error(_bytes(relu_model([100000, 100000, 64])))
    assert err.code == "input_too_large"
    assert "100000" in err.message


def test_non_positive_dimension() -> None:
    assert _error(_bytes(relu_model([1, 0]))).code == "bad_input_shape"


def test_symbolic_dimension_gets_buckets_or_a_pinned_value() -> None:
    data = _bytes(matmul_model(rows="batch"))
    # No value given: default buckets (powers of two from 16 to 128), one specialization each.
    model = load_model(data)
    assert model.bucket_spec is not None and model.bucket_spec.defaulted == ("batch",)
    assert [b.model.inputs[0].shape for b in model.buckets] == [
        (16, 16),
        (32, 16),
        (64, 16),
        (128, 16),
    ]
    assert model.inputs[0].shape == (128, 16)  # the largest bucket's
    model = load_model(data, buckets={"batch": [2, 5]})
    assert [b.function for b in model.buckets] == ["main_batch_2", "main_batch_5"]
    # --input-shape pins one shape and wins over buckets.
    model = load_model(data, input_shapes={"x": [3, 16]}, buckets={"batch": [2]})
    assert model.inputs[0].shape == (3, 16) and not model.buckets
    import_model(model)
    assert _error(data, buckets={"seq": [2]}).code == "bad_buckets"


def test_input_shape_for_unknown_input_or_wrong_rank() -> None:
    data = _bytes(matmul_model(rows="batch"))
    assert _error(data, input_shapes={"nope": [1, 16]}).code == "bad_input_shape"
    assert _error(data, input_shapes={"x": [1, 2, 16]}).code == "bad_input_shape"
    assert _error(data, input_shapes={"x": [1, 15]}).code == "bad_input_shape"


def test_opset_out_of_range() -> None:
    err = _error(_bytes(relu_model(opset=3)))
    assert err.code == "bad_opset"


def test_checker_failure_is_reported() -> None:
    model = relu_model()
    model.graph.node[0].input[0] = "undefined_tensor"
    err = _error(_bytes(model))
    assert err.code == "bad_onnx"
    assert "validation" in err.message


def test_unsupported_ops_are_all_listed() -> None:
    with pytest.raises(UnsupportedOperatorsError) as info:
        import_model(load_model(_bytes(unsupported_ops_model())))
    assert info.value.ops == ["Celu", "Det"]
    assert "Celu, Det" in info.value.message


def test_external_data_refused_for_uploads_and_outside_folder(tmp_path: Path) -> None:
    model = matmul_model()
    onnx.save_model(
        model,
        tmp_path / "m.onnx",
        save_as_external_data=True,
        location="m.data",
        size_threshold=0,
    )
    data = (tmp_path / "m.onnx").read_bytes()
    assert _error(data).code == "external_data"
    # From a path, weights next to the model file are resolved and the model imports.
    loaded = load_model(tmp_path / "m.onnx")
    import_model(loaded)
    # A location that escapes the model's folder is refused.
    escaped = onnx.load_model(tmp_path / "m.onnx", load_external_data=False)
    for tensor in escaped.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../outside.data"
    inner = tmp_path / "inner"
    inner.mkdir()
    (tmp_path / "outside.data").write_bytes((tmp_path / "m.data").read_bytes())
    onnx.save_model(escaped, inner / "m.onnx")
    assert _error(inner / "m.onnx").code == "external_data"


def test_initializers_are_not_treated_as_inputs() -> None:
    model = matmul_model()
    model.graph.input.append(
        onnx.helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [16, 8])
    )
    loaded = load_model(_bytes(model))
    assert [s.name for s in loaded.inputs] == ["x"]
    assert numpy_helper.to_array(model.graph.initializer[0]).shape == (16, 8)


# -- resource limits (issue 18, cases 3-5): refused before TVM builds anything -------------------


@pytest.mark.parametrize(
    "shape", [[1_000_000, 1_000_000], [250_000_000]], ids=["1e12-elements", "2.5e8-elements"]
)
def test_constant_of_shape_bomb_is_refused_before_folding(shape) -> None:
    data = _bytes(constant_of_shape_bomb(shape))
    assert len(data) < 200
    err = _error(data)
    assert err.code == "constant_too_large"
    assert "ConstantOfShape" in err.message and str(shape) in err.message


def test_bomb_shape_computed_from_an_input_shape_is_refused() -> None:
    """``ConstantOfShape(Concat(Shape(x), [3e8]))``: the shape is only known once propagated."""
    k = numpy_helper.from_array(np.array([300_000_000], np.int64), "k")
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("Concat", ["sx", "k"], ["s"], axis=0),
            helper.make_node("ConstantOfShape", ["s"], ["c"]),
            helper.make_node("Add", ["x2", "c"], ["y"]),
        ],
        [float_input("x", [2]), float_input("x2", [1])],
        [float_input("y", ["n", "m"])],
        [k],
    )
    err = _error(_bytes(model))
    assert err.code == "constant_too_large" and "[2, 300000000]" in err.message


def test_legit_computed_shape_still_loads() -> None:
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["sx"]),
            helper.make_node("Concat", ["sx", "k"], ["s"], axis=0),
            helper.make_node("ConstantOfShape", ["s"], ["c"]),
            helper.make_node("Add", ["x2", "c"], ["y"]),
        ],
        [float_input("x", [2]), float_input("x2", [1])],
        [float_input("y", [2, 3])],
        [k],
    )
    import_model(load_model(_bytes(model)))


def test_folded_constants_are_bounded_at_run_time_too() -> None:
    """With the static check out of the way (huge limits there), the Relax constants that folding
    built are checked against the same limits: prepare_model refuses them."""
    from compiler.prepare import prepare_model
    from compiler.target import resolve_target

    model = load_model(_bytes(constant_of_shape_bomb([64, 1024])))
    assert model.format == "onnx"
    tight = ModelLimits(max_constant_elements=10_000)
    err = _error(_bytes(constant_of_shape_bomb([64, 1024])), limits=tight)
    assert err.code == "constant_too_large"
    from compiler.frontends import importer
    from compiler.limits import constant_limits

    mod = importer.import_model(model)
    with pytest.raises(ModelError) as info:
        constant_limits.check_relax_constants(mod, tight, "importing the model")
    assert info.value.code == "constant_too_large" and "[64, 1024]" in info.value.message
    assert prepare_model(_bytes(constant_of_shape_bomb([8, 8])), resolve_target("cpu")).partition


def test_allocation_failure_in_tvm_is_a_model_error() -> None:
    from compiler.limits.constant_limits import bounded_folding

    with pytest.raises(ModelError) as info, bounded_folding("importing the model"):
        raise RuntimeError("std::bad_alloc")
    assert info.value.code == "out_of_memory"
    with pytest.raises(KeyError), bounded_folding("importing the model"):
        raise KeyError("not an allocation failure")


def test_node_count_limit() -> None:
    err = _error(_bytes(add_chain_model(25_000)))
    assert err.code == "too_many_nodes" and "25000" in err.message
    assert load_model(_bytes(add_chain_model(50)), limits=ModelLimits(max_nodes=50)).inputs


def test_external_data_refused_when_not_allowed_even_inside_the_folder(tmp_path: Path) -> None:
    (tmp_path / "w.bin").write_bytes(np.ones(16, np.float32).tobytes())
    path = tmp_path / "m.onnx"
    path.write_bytes(_bytes(external_data_model("w.bin")))
    assert load_model(path).format == "onnx"  # a local file may use its own folder
    err = _error(path, allow_external_data=False)
    assert err.code == "external_data"


@pytest.mark.parametrize("command", ["inspect", "compile", "tune"])
def test_cli_refuses_a_bomb_with_one_line_and_exit_2(command, tmp_path: Path, capsys) -> None:
    from service.cli import main

    path = tmp_path / "bomb.onnx"
    path.write_bytes(_bytes(constant_of_shape_bomb([1_000_000, 1_000_000])))
    args = {
        "inspect": [],
        "compile": ["-o", str(tmp_path / "out")],
        "tune": ["--trials", "1", "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"],
    }[command]
    assert main([command, str(path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "constant_too_large" not in err
    assert err.startswith("tunehub: error:") and "ConstantOfShape" in err
