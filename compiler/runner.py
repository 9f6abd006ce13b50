"""Load an exported library and run it: outputs and timings.

``load_library`` + ``run`` give numpy outputs for numpy inputs (flattening tuple outputs);
``time_library`` measures the median latency with TVM's ``time_evaluator``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax


@dataclass(frozen=True)
class Timing:
    """Latency of one call of ``main`` in seconds: median, and the spread over repeats."""

    median_secs: float
    min_secs: float
    max_secs: float
    repeats: int

    def to_json(self) -> dict[str, float | int]:
        return {
            "median_ms": self.median_secs * 1e3,
            "min_ms": self.min_secs * 1e3,
            "max_ms": self.max_secs * 1e3,
            "repeats": self.repeats,
        }


class LoadedLibrary:
    """A Relax VM over an exported library on one device."""

    def __init__(self, path: Path, device: str = "cpu") -> None:
        self.device = tvm.device(device, 0)
        self.module = tvm.runtime.load_module(str(path))
        self.vm = relax.VirtualMachine(self.module, self.device)

    @classmethod
    def from_executable(cls, executable: Any, device: str = "cpu") -> LoadedLibrary:
        self = cls.__new__(cls)
        self.device = tvm.device(device, 0)
        self.module = executable
        self.vm = relax.VirtualMachine(executable, self.device)
        return self

    def _to_device(self, inputs: list[np.ndarray]) -> list[Any]:
        return [tvm.runtime.tensor(array, self.device) for array in inputs]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run ``main`` once; outputs as a flat list of numpy arrays."""
        result = self.vm["main"](*self._to_device(inputs))
        return _flatten(result)

    def time(
        self,
        inputs: list[np.ndarray],
        *,
        repeat: int = 20,
        min_repeat_ms: int = 50,
        max_total_secs: float = 10.0,
    ) -> Timing:
        """Median latency of ``main`` over ``repeat`` measurements of at least ``min_repeat_ms``.

        A slow library (an untuned build runs naive loops: seconds per call) gets fewer repeats,
        at least 3, so that timing stays near ``max_total_secs``.
        """
        args = self._to_device(inputs)
        self.vm.set_input("main", *args)
        start = time.perf_counter()
        self.vm.invoke_stateful("main")
        first = time.perf_counter() - start
        per_repeat = max(first, min_repeat_ms / 1e3)
        repeat = max(3, min(repeat, int(max_total_secs / per_repeat)))
        evaluator = self.vm.time_evaluator(
            "invoke_stateful", self.device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
        )
        results = np.array(evaluator("main").results)
        return Timing(float(np.median(results)), float(results.min()), float(results.max()), repeat)


def _flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, (tvm.runtime.Tensor,)) or hasattr(value, "numpy"):
        return [value.numpy()]
    out: list[np.ndarray] = []
    for item in value:
        out.extend(_flatten(item))
    return out
