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

from compiler.build.artifact_layout import MANIFEST_NAME
from compiler.errors import ModelError
from compiler.shapes.padding import PaddingRule, cut_outputs, fitting_bucket, pad_inputs
from compiler.weights.external import PARAMS_NAME, ExternalWeights, load_params


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

    A bucketed library (:mod:`compiler.shapes.bucket_module`) has one VM function per shape bucket
    and no ``main``; ``buckets`` (``Bucket.to_json()`` entries: ``function`` and ``inputs``)
    says which function takes which input shapes, and ``padding`` whether inputs between
    buckets may be padded (:class:`compiler.shapes.padding.PaddingRule`, measured before the
    artifact was published). Given neither, the library's ``manifest.json`` (beside it) is read for
    them; a library without buckets runs ``main``. :meth:`run` and :meth:`time` call the
    function whose bucket is exactly the inputs' shapes; else, where padding is allowed, the
    smallest bucket that fits, on the inputs zero-padded, with the outputs cut back. Inputs
    that fit no bucket (larger than the largest, or between buckets of a model that does not
    allow padding) raise ``ModelError("no_bucket")`` naming the buckets. There is no
    dynamic-shape fallback past the largest bucket: TVM 0.27's symbolic imports of the decoders
    fail (ONNX: its ``Reshape`` converter gets a folded shape scalar; ``.pt2``: Relax cannot
    prove the mask's slices equal in length, and legalization refuses the resulting tensor of
    unknown shape).
    """

    def __init__(
        self,
        path: Path,
        device: str = "cpu",
        buckets: Sequence[Mapping[str, Any]] | None = None,
        padding: PaddingRule | None = None,
        state: Sequence[Any] | None = None,
    ) -> None:
        self.device = tvm.device(device, 0)
        self._input_buffers: dict[tuple[int, tuple[int, ...], str], Any] = {}  # _to_device's
        self.module = tvm.runtime.load_module(str(path))
        self.vm = relax.VirtualMachine(self.module, self.device)
        model = _manifest_model(path)
        stored = model.get("buckets") or {}
        self.buckets = _dispatch_table(
            buckets if buckets is not None else stored.get("functions", [])
        )
        self.padding = (
            padding if padding is not None else PaddingRule.from_json(stored.get("padding"))
        )
        self._own_state(state if state is not None else _state_specs(model.get("state")))
        params = Path(path).parent / PARAMS_NAME
        self.weights = load_params(params, self.device) if params.is_file() else []

    @classmethod
    def from_executable(
        cls,
        executable: Any,
        device: str = "cpu",
        buckets: Sequence[Mapping[str, Any]] | None = None,
        state: Sequence[Any] = (),
    ) -> LoadedLibrary:
        self = cls.__new__(cls)
        self.device = tvm.device(device, 0)
        self._input_buffers = {}
        self.weights = []
        if isinstance(executable, ExternalWeights):
            self.weights = [p.copyto(self.device) for p in executable.params]
            executable = executable.executable
        self.module = executable
        self.vm = relax.VirtualMachine(executable, self.device)
        self.buckets = _dispatch_table(buckets or ())
        self.padding = None
        self._own_state(state)
        return self

    def _own_state(self, specs: Sequence[Any]) -> None:
        """Allocate the state a stateful library keeps between calls (``specs``:
        :class:`compiler.llm.state.StateSpec`), zeroed: every call is given these tensors after
        its inputs, and its kernels update them in place."""
        self.state = tuple(specs)
        self.state_tensors = [
            tvm.runtime.tensor(np.zeros(spec.shape, spec.dtype), self.device) for spec in self.state
        ]

    def reset_state(self) -> None:
        """Zero the state (a new generation starts from an empty cache)."""
        for tensor, spec in zip(self.state_tensors, self.state):
            tensor.copyfrom(np.zeros(spec.shape, spec.dtype))

    def function_for(self, inputs: Sequence[np.ndarray]) -> str:
        """The VM function that runs ``inputs``: ``main``, the bucket of their exact shapes, or
        the bucket they are padded to (``ModelError("no_bucket")`` when none fits)."""
        return self._dispatch(inputs)[0]

    def _dispatch(
        self, inputs: Sequence[np.ndarray]
    ) -> tuple[str, tuple[tuple[int, ...], ...] | None]:
        """The function for ``inputs`` and, when they must be padded, the shapes to pad to."""
        if not self.buckets:
            return "main", None
        shapes = tuple(tuple(int(d) for d in np.shape(array)) for array in inputs)
        function = self.buckets.get(shapes)
        if function is not None:
            return function, None
        fit = (
            fitting_bucket(shapes, self.buckets, self.padding)
            if (self.padding is not None and self.padding.allowed)
            else None
        )
        if fit is not None:
            return fit
        known = "; ".join(
            f"{name} takes {' '.join('x'.join(map(str, s)) for s in key)}"
            for key, name in self.buckets.items()
        )
        given = " ".join("x".join(map(str, s)) for s in shapes)
        if self.padding is not None and self.padding.allowed:
            why = (
                "they are larger than every bucket on a symbolic axis, or differ from the "
                "buckets on another axis"
            )
        elif self.padding is not None and self.padding.reason:
            why = (
                "inputs are not padded to a larger bucket for this model: padding was "
                f"checked when it was compiled and refused ({self.padding.reason})"
            )
        else:
            why = "inputs are not padded to a larger bucket (not checked for this library)"
        raise ModelError(
            "no_bucket",
            f"inputs of shape {given} match no shape bucket of this library ({known}); {why}; "
            "compile the model with a bucket of this size (--buckets)",
        )

    def run_function(self, function: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run VM function ``function`` on ``inputs`` as they are (no dispatch, no padding)."""
        return _flatten(self.vm[function](*self._to_device(list(inputs))))

    def _to_device(self, inputs: list[np.ndarray]) -> list[Any]:
        """``inputs`` on the device, followed by the library's state tensors and weights (a
        library whose weights are beside it, :mod:`compiler.weights.external`), if any.

        Each input goes into a device buffer kept per (position, shape, dtype) and reused by
        later calls: a decode step's two small inputs would otherwise cost a device allocation
        and free each (``cudaFree`` waits for the device) every token."""
        buffers = self._input_buffers
        arrays = []
        for index, array in enumerate(inputs):
            array = np.ascontiguousarray(array)
            key = (index, array.shape, str(array.dtype))
            buffer = buffers.get(key)
            if buffer is None:
                buffer = buffers[key] = tvm.runtime.empty(
                    array.shape, str(array.dtype), self.device
                )
            buffer.copyfrom(array)
            arrays.append(buffer)
        return arrays + list(self.state_tensors) + list(self.weights)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run ``main`` (or the inputs' bucket, padded to it where allowed) once; outputs as a
        flat list of numpy arrays (cut back to the inputs' sizes when they were padded)."""
        function, padded = self._dispatch(inputs)
        if padded is None:
            return self.run_function(function, inputs)
        assert self.padding is not None
        outputs = self.run_function(function, pad_inputs(inputs, padded))
        values = self.padding.values_of([np.shape(a) for a in inputs])
        return cut_outputs(outputs, self.padding.cuts, values)

    def run_fresh(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """:meth:`run` from a zeroed state (a stateful library: one call of a fresh decoder,
        what a reference framework's new module computes); the same as :meth:`run` otherwise."""
        self.reset_state()
        return self.run(inputs)

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
        function, padded = self._dispatch(inputs)
        args = self._to_device(inputs if padded is None else pad_inputs(inputs, padded))
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


def _manifest_model(path: Path) -> dict[str, Any]:
    """The ``model`` of the artifact ``path`` belongs to (its ``manifest.json``): its
    ``buckets`` (the bucket table ``functions`` and the padding rule ``padding``) and
    ``state``; ``{}`` if none."""
    manifest = Path(path).parent / MANIFEST_NAME
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {}
    model = data.get("model", {}) if isinstance(data, dict) else {}
    return model if isinstance(model, dict) else {}


def _state_specs(entries: Any) -> tuple[Any, ...]:
    if not entries:
        return ()
    from compiler.llm.state import StateSpec  # noqa: PLC0415

    return tuple(StateSpec.from_json(entry) for entry in entries)


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
