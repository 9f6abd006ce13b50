"""Models exported in half precision import and compute in that precision.

TVM's torch frontend computes convolutions and ``addmm`` in float32 whatever their inputs, and
then adds a half-precision bias to that float32 result, which Relax refuses. TuneHub's import
(:func:`compiler.frontends.pt2_ops.translate`) adds the bias in float32 and casts each result back
to the dtype torch gives it, so a float16 program stays float16 from input to output.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from compiler.build.builder import build
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import verify
from compiler.prepare import prepare_model
from compiler.target import resolve_target


class ConvLinear(nn.Module):
    """A convolution with a bias, a batch norm, and a linear layer (``addmm`` once decomposed)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=True)
        self.norm = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.norm(self.conv(x))).flatten(1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_export_stays_in_its_dtype_and_matches_torch(tmp_path, dtype) -> None:
    torch.manual_seed(0)
    model = ConvLinear().eval()
    model.norm.running_mean.uniform_(-0.2, 0.2)
    model.norm.running_var.uniform_(0.5, 1.5)
    model = model.to(dtype)
    path = tmp_path / "conv_linear.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 3, 6, 6, dtype=dtype),)), path)

    prepared = prepare_model(path, resolve_target("cpu"))
    name = str(dtype).removeprefix("torch.")
    assert [spec.dtype for spec in prepared.model.inputs] == [name]
    library = LoadedLibrary.from_executable(build(prepared.mod, prepared.target))
    result = verify(prepared.model, library.run)
    assert result.passed, result.message
    assert result.outputs[0].dtype == name


def test_a_float16_convolutions_batch_norm_is_folded_into_its_weights(tmp_path) -> None:
    """conv (float32 result) → cast to float16 → batch norm: the norm is folded into the
    weights and a bias after the cast (the cast stays next to the convolution)."""
    torch.manual_seed(0)
    norm = nn.BatchNorm2d(8)
    norm.running_mean.uniform_(-0.2, 0.2)
    norm.running_var.uniform_(0.5, 1.5)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), norm, nn.ReLU())
    model = model.eval().to(torch.float16)
    path = tmp_path / "conv_bn.pt2"
    x = torch.randn(1, 3, 6, 6, dtype=torch.float16)
    torch.export.save(torch.export.export(model, (x,)), path)
    prepared = prepare_model(path, resolve_target("cpu"))
    assert "batch_norm" not in prepared.mod.script()
    library = LoadedLibrary.from_executable(build(prepared.mod, prepared.target))
    result = verify(prepared.model, library.run)
    assert result.passed, result.message


def test_bfloat16_weights_are_read_and_pooled_exactly() -> None:
    """A bfloat16 weight reaches TVM with its exact bits, transposed views included (the
    importer's own conversion falls back to ``Tensor.numpy()``, which has no bfloat16), and
    the constant pool tells bfloat16 tensors apart by their bytes (``memoryview`` cannot cast
    ml_dtypes' bfloat16)."""
    import numpy as np

    from compiler.frontends.pt2_ops import torch_tensor_to_tvm
    from compiler.weights.external import _digest

    weight = torch.randn(6, 4).to(torch.bfloat16)
    converted = torch_tensor_to_tvm(weight.t())
    assert str(converted.dtype) == "bfloat16"
    np.testing.assert_array_equal(converted.numpy().astype(np.float32), weight.t().float().numpy())
    other = torch_tensor_to_tvm(weight.t() * 2)
    assert _digest(converted) == _digest(torch_tensor_to_tvm(weight.t().clone()))
    assert _digest(converted) != _digest(other)
