"""A 1-D convolution (a speech encoder's stem) compiles as a 2-D one over a unit row
(:func:`compiler.frontends.canonicalize.canonicalize`), with its bias in the same task: it takes the
convolution layout, default schedules and library peers of ``conv2d``, where it had none."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from compiler.build.builder import build_zero_trial
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import verify
from compiler.peers import peer_library
from compiler.prepare import prepare_model
from compiler.target import resolve_target


class Stem(nn.Module):
    """Whisper's stem, small: two convolutions (the second strided), each with a bias and GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv1d(8, 16, 3, padding=1)
        self.second = nn.Conv1d(16, 16, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional.gelu(self.second(functional.gelu(self.first(x))))


def test_conv1d_becomes_a_conv2d_task_with_its_bias_and_matches_torch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "stem.pt2"
    torch.export.save(torch.export.export(Stem().eval(), (torch.randn(1, 8, 40),)), path)
    prepared = prepare_model(path, resolve_target("cpu"))
    names = [t.name for t in prepared.partition.tasks]
    assert not any("conv1d" in n for n in names)
    convs = [n for n in names if "conv2d" in n]
    assert len(convs) == 2 and all("add" in n for n in convs)  # the bias is in the conv's task
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    executable, peers = build_zero_trial(prepared.mod, prepared.target, tasks)
    if peer_library() is not None:
        assert len(peers) == 2  # both convolutions on the library peer
    library = LoadedLibrary.from_executable(executable)
    result = verify(prepared.model, library.run)
    assert result.passed, result.message
