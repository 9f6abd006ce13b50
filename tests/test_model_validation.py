"""Every bad model input gets a clear ModelError (code + message); good ones load."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from compiler.errors import ModelError, UnsupportedOperatorsError
from compiler.importer import import_model
from compiler.loader import load_model
from compiler.model_spec import ModelLimits
from tests.onnx_factory import matmul_model, relu_model, unsupported_ops_model


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


def test_symbolic_dimension_needs_a_value() -> None:
    data = _bytes(matmul_model(rows="batch"))
    err = _error(data)
    assert err.code == "symbolic_shape"
    assert "--input-shape x=" in err.message
    model = load_model(data, input_shapes={"x": [3, 16]})
    assert model.inputs[0].shape == (3, 16)
    import_model(model)


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
        model, tmp_path / "m.onnx", save_as_external_data=True, location="m.data",
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
