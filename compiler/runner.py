"""Load an exported library and run it: outputs and timings.

:class:`LoadedLibrary` ``run`` gives numpy outputs for numpy inputs (flattening tuple outputs),
``time`` the median latency with TVM's ``time_evaluator``; a bucketed library dispatches on the
inputs' shapes.
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tvm
from tvm import relax

from compiler.artifact_layout import MANIFEST_NAME
from compiler.errors import ModelError


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
    """A Relax VM over an exported library on one device.

    A bucketed library (:mod:`compiler.bucket_module`) has one VM function per shape bucket
    and no ``main``; ``buckets`` (``Bucket.to_json()`` entries: ``function`` and ``inputs``)
    says which function takes which input shapes. Given none, the library's ``manifest.json``
    (beside it) is read for them; a library without buckets runs ``main``. :meth:`run` and
    :meth:`time` call the function whose bucket is exactly the inputs' shapes. Inputs of any
    other shape raise ``ModelError("no_bucket")`` naming the buckets: padding to a larger
    bucket is not correct in general (a sequence length reaches softmax denominators, norms
    over the sequence, and every position of a non-causal model), so none is applied; nor is
    there a dynamic-shape fallback: TVM 0.27's symbolic imports of the decoders fail (ONNX: its
    ``Reshape`` converter gets a folded shape scalar; ``.pt2``: Relax cannot prove the mask's
    slices equal in length, and legalization refuses the resulting tensor of unknown shape).
    """

    def __init__(
        self, path: Path, device: str = "cpu", buckets: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        self.device = tvm.device(device, 0)
        self.module = tvm.runtime.load_module(str(path))
        self.vm = relax.VirtualMachine(self.module, self.device)
        self.buckets = _dispatch_table(buckets if buckets is not None else _manifest_buckets(path))

    @classmethod
    def from_executable(
        cls, executable: Any, device: str = "cpu",
        buckets: Sequence[Mapping[str, Any]] | None = None,
    ) -> LoadedLibrary:
        self = cls.__new__(cls)
        self.device = tvm.device(device, 0)
        self.module = executable
        self.vm = relax.VirtualMachine(executable, self.device)
        self.buckets = _dispatch_table(buckets or ())
        return self

    def function_for(self, inputs: Sequence[np.ndarray]) -> str:
        """The VM function that runs ``inputs``: ``main``, or the bucket of their exact shapes
        (``ModelError("no_bucket")`` when none is)."""
        if not self.buckets:
            return "main"
        shapes = tuple(tuple(int(d) for d in np.shape(array)) for array in inputs)
        function = self.buckets.get(shapes)
        if function is None:
            known = "; ".join(
                f"{name} takes {' '.join('x'.join(map(str, s)) for s in key)}"
                for key, name in self.buckets.items()
            )
            given = " ".join("x".join(map(str, s)) for s in shapes)
            raise ModelError(
                "no_bucket",
                f"inputs of shape {given} match no shape bucket of this library ({known}); "
                "inputs are not padded to a larger bucket (not correct in general): compile "
                "the model with a bucket of this size (--buckets)",
            )
        return function

    def _to_device(self, inputs: list[np.ndarray]) -> list[Any]:
        return [tvm.runtime.tensor(array, self.device) for array in inputs]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run ``main`` (or the inputs' bucket) once; outputs as a flat list of numpy arrays."""
        result = self.vm[self.function_for(inputs)](*self._to_device(inputs))
        return _flatten(result)

    def time(
        self,
        inputs: list[np.ndarray],
        *,
        repeat: int = 20,
        min_repeat_ms: int = 50,
        max_total_secs: float = 10.0,
    ) -> Timing:
        """Median latency of ``main`` (or the inputs' bucket) over ``repeat`` measurements of at
        least ``min_repeat_ms``.

        A slow library (an untuned build runs naive loops: seconds per call) gets fewer repeats,
        at least 3, so that timing stays near ``max_total_secs``.
        """
        function = self.function_for(inputs)
        args = self._to_device(inputs)
        self.vm.set_input(function, *args)
        start = time.perf_counter()
        self.vm.invoke_stateful(function)
        first = time.perf_counter() - start
        per_repeat = max(first, min_repeat_ms / 1e3)
        repeat = max(3, min(repeat, int(max_total_secs / per_repeat)))
        evaluator = self.vm.time_evaluator(
            "invoke_stateful", self.device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
        )
        results = np.array(evaluator(function).results)
        return Timing(float(np.median(results)), float(results.min()), float(results.max()), repeat)


def _manifest_buckets(path: Path) -> list[Mapping[str, Any]]:
    """The bucket table of the artifact ``path`` belongs to (its ``manifest.json``), if any."""
    manifest = Path(path).parent / MANIFEST_NAME
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return []
    buckets = data.get("model", {}).get("buckets", {}) if isinstance(data, dict) else {}
    return list(buckets.get("functions", [])) if isinstance(buckets, dict) else []


def _dispatch_table(
    buckets: Sequence[Mapping[str, Any]],
) -> dict[tuple[tuple[int, ...], ...], str]:
    """Input shapes (in input order) -> VM function, from ``Bucket.to_json()`` entries."""
    return {
        tuple(tuple(int(d) for d in spec["shape"]) for spec in entry["inputs"]): str(
            entry["function"]
        )
        for entry in buckets
    }


def _flatten(value: Any) -> list[np.ndarray]:
    if isinstance(value, (tvm.runtime.Tensor,)) or hasattr(value, "numpy"):
        return [value.numpy()]
    out: list[np.ndarray] = []
    for item in value:
        out.extend(_flatten(item))
    return out
