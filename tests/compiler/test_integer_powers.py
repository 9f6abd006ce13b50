"""``x ** c`` with a small integer ``c`` compiles as multiplications (GPT-2's GELU cubes its
input; TVM's ``power`` is a scalar ``powf`` per element), and matches torch."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from compiler.build.builder import build
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import verify
from compiler.prepare import prepare_model
from compiler.target import resolve_target


class Powers(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1 + torch.tanh(0.79788456 * (x + 0.044715 * torch.pow(x, 3.0)))) + x**2


def test_integer_powers_are_products_and_match_torch(tmp_path: Path) -> None:
    path = tmp_path / "powers.pt2"
    torch.export.save(torch.export.export(Powers(), (torch.randn(4, 32),)), path)
    prepared = prepare_model(path, resolve_target("cpu"))
    assert "power" not in prepared.mod.script()
    library = LoadedLibrary.from_executable(build(prepared.mod, prepared.target))
    result = verify(prepared.model, library.run)
    assert result.passed, result.message
