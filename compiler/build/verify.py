"""Verify a built library against the model's own framework.

``reference_outputs`` runs the original model (ONNX Runtime for ONNX, the ``torch.export`` program
for ``.pt2``) on seeded random inputs, the torch program on the GPU when the library is verified
for a CUDA target (with TF32 off: cuDNN convolutions default to TF32, which is not float32);
``verify`` compares a library's outputs with per-dtype tolerances and promises a
:class:`VerificationResult` (it never raises for a mismatch: callers decide; ``require_passed``
raises :class:`VerificationError`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from compiler.errors import VerificationError
from compiler.frontends.model_spec import LoadedModel, TensorSpec
from compiler.shapes.padding import PaddingRule, check_padding


@dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol * max(1, max|expected|) + rtol * |expected|`` elementwise."""

    rtol: float
    atol: float


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-7, 1e-9),
    "float32": Tolerance(1e-3, 1e-4),
    "float16": Tolerance(1e-2, 1e-2),
    # bfloat16 keeps 8 bits of mantissa (a unit roundoff of 2**-9): rounded after every
    # operator of a deep network, a 24-layer decoder's logits differ from torch's own bfloat16
    # run by ~2-3 % of their largest value (0.11 on the H200, 2026-12-04), over 2e-2.
    "bfloat16": Tolerance(5e-2, 5e-2),
}
EXACT = Tolerance(0.0, 0.0)


def tolerance_for(dtype: str) -> Tolerance:
    return TOLERANCES.get(dtype, EXACT)


def random_inputs(specs: tuple[TensorSpec, ...], seed: int = 0) -> list[np.ndarray]:
    """Seeded inputs: standard normal floats, small non-negative integers, random booleans."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "f":
            arrays.append(rng.standard_normal(spec.shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.random(spec.shape) < 0.5)
        else:
            arrays.append(rng.integers(0, 2, size=spec.shape).astype(dtype))
    return arrays


def model_inputs(model: LoadedModel, seed: int = 0) -> list[np.ndarray]:
    """:func:`random_inputs` for ``model``, except a stateful decoder's ``cache_position``:
    ``0 .. n - 1``, the positions a prompt's first chunk has. Random positions repeat, and a
    cache written twice at one position in one call holds whichever write came last, which
    torch's program and the library need not agree on (``transformers``' static cache even
    fails on some: 64 random positions of 0 and 1 in a cache of 64)."""
    arrays = random_inputs(model.inputs, seed)
    if model.state:
        from compiler.llm.generate import POSITIONS  # noqa: PLC0415 - decoders only

        for index, spec in enumerate(model.inputs):
            if spec.name == POSITIONS and len(spec.shape) == 1:
                arrays[index] = np.arange(spec.shape[0], dtype=np.dtype(spec.dtype))
    return arrays


def reference_outputs(
    model: LoadedModel, inputs: list[np.ndarray], device: str = "cpu"
) -> list[np.ndarray]:
    """Outputs of the original model: ONNX Runtime (CPU) or the exported torch program, on the
    GPU when ``device`` is ``"cuda"`` and torch sees one (see :func:`reference_name`)."""
    if model.format == "onnx":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        session = onnxruntime.InferenceSession(
            model.source.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feeds = {spec.name: array for spec, array in zip(model.inputs, inputs)}
        return [np.asarray(out) for out in session.run(None, feeds)]
    import torch

    torch_device = _torch_device(device, model.source)
    # A decoder's own cache, starting from the exported (empty) one.
    module = stateful_module(model.source) if model.state else model.source.module()
    if torch_device != "cpu":
        module = module_on(module, torch_device)
    with torch.no_grad(), _strict_float32():
        tensors = [_to_torch(array).to(torch_device) for array in inputs]
        result = call_program(model.source, module, tensors)
    outputs = [_to_numpy(t) for t in _flatten_torch(result)]
    if model.last_logits:  # the library returns the last position's logits only
        from compiler.llm.last_logits import reference_last_position  # noqa: PLC0415

        return reference_last_position(outputs)
    return outputs


def _to_torch(array: np.ndarray) -> Any:
    """``array`` as a CPU tensor; bfloat16 (``ml_dtypes``, which torch cannot read) through
    float32, which holds every bfloat16 value exactly."""
    import torch

    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(array)


def _to_numpy(tensor: Any) -> np.ndarray:
    """A torch tensor as a numpy array (bfloat16 as ``ml_dtypes.bfloat16``, through float32)."""
    import torch

    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        import ml_dtypes

        return tensor.float().numpy().astype(ml_dtypes.bfloat16)
    return tensor.numpy()


def stateful_module(program: Any) -> Any:
    """``program.module()`` with buffers of its own (a decoder's KV cache, starting as exported)
    and the program's parameters shared, not copied: a copy of a 0.5 B decoder's weights is
    2 GB, and verification builds one module for each of a decoder's buckets."""
    import copy

    module = program.module()
    return copy.deepcopy(module, {id(p): p for p in module.parameters()})


def module_on(module: Any, device: str) -> Any:
    """``module`` moved to ``device`` with parameters of its own there: the exported program's
    tensors, which ``program.module()`` and :func:`stateful_module` share, stay where they are
    (``Module.to`` would otherwise move them in place, under every other user of the program)."""
    import torch

    previous = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    try:
        return module.to(device)
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(previous)


def call_program(program: Any, module: Any, tensors: list[Any]) -> Any:
    """``module`` (``program.module()``) called on ``tensors``, the user inputs in order: as
    positional arguments, or by keyword where the program was exported with keyword inputs
    (``transformers``' ``convert_and_export_with_cache`` takes ``input_ids=``,
    ``cache_position=``)."""
    spec = program.call_spec.in_spec
    if spec is None or spec.num_children != 2:
        return module(*tensors)
    if spec.num_leaves != len(tensors):  # also constants or objects (a DynamicCache)
        return _call_graph(program, tensors)
    positional = spec.child(0).num_leaves
    names = list(spec.child(1).context or ())
    return module(*tensors[:positional], **dict(zip(names, tensors[positional:])))


def _call_graph(program: Any, tensors: list[Any]) -> list[Any]:
    """The user outputs of ``program``'s graph on the user input ``tensors``, its parameters,
    buffers and constants (and the constant arguments it was exported with) passed as its
    placeholders take them: what the module computes, without its input and output structure
    (``transformers``' ``export_with_dynamic_cache`` takes and returns a ``DynamicCache``, which
    this process may not know)."""
    from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

    stored = {**program.state_dict, **program.constants}
    given = iter(tensors)
    args = []
    for spec in program.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            args.append(stored[spec.target])
        elif isinstance(spec.arg, ConstantArgument):
            args.append(spec.arg.value)
        else:
            args.append(next(given))
    outputs = program.graph_module(*args)
    specs = program.graph_signature.output_specs
    return [o for o, s in zip(outputs, specs) if s.kind == OutputKind.USER_OUTPUT]


def _torch_device(device: str, program: Any = None) -> str:
    """``"cuda"`` when asked for and torch has a GPU, unless ``program`` (an ``ExportedProgram``)
    creates tensors on the CPU itself; else ``"cpu"``."""
    if device != "cuda" or (program is not None and _creates_cpu_tensors(program)):
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _creates_cpu_tensors(program: Any) -> bool:
    """Whether a node of ``program``'s graph names the CPU as its ``device`` (a program exported
    on the CPU bakes ``arange(..., device=cpu)`` in: ``transformers``' position ids), so that its
    module cannot run on a GPU."""
    for node in program.graph.nodes:
        device = node.kwargs.get("device") if node.op == "call_function" else None
        if device is not None and str(device).startswith("cpu"):
            return True
    return False


def reference_name(model: LoadedModel, device: str = "cpu") -> str:
    """Which reference :func:`reference_outputs` runs: ``onnxruntime``, ``torch`` or
    ``torch (cuda)``."""
    if model.format == "onnx":
        return "onnxruntime"
    return "torch (cuda)" if _torch_device(device, model.source) == "cuda" else "torch"


class _strict_float32:  # noqa: N801 - used like a function: ``with _strict_float32():``
    """Context: torch matmuls and cuDNN convolutions in float32, not TF32 (restored after)."""

    def __enter__(self) -> None:
        import torch

        self._saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc: object) -> None:
        import torch

        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self._saved


def _flatten_torch(value: Any) -> list[Any]:
    if hasattr(value, "detach"):
        return [value]
    out: list[Any] = []
    for item in value:
        out.extend(_flatten_torch(item))
    return out


@dataclass(frozen=True)
class OutputCheck:
    index: int
    dtype: str
    shape: tuple[int, ...]
    max_abs_error: float
    passed: bool


@dataclass(frozen=True)
class VerificationResult:
    passed: bool
    reference: str
    max_abs_error: float
    outputs: tuple[OutputCheck, ...]
    message: str
    #: A bucketed model's verification: each bucket's function and its own result.
    buckets: tuple[tuple[str, VerificationResult], ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "passed": self.passed,
            "reference": self.reference,
            "max_abs_error": self.max_abs_error,
            "message": self.message,
            "outputs": [
                {
                    "index": o.index,
                    "dtype": o.dtype,
                    "shape": list(o.shape),
                    "max_abs_error": o.max_abs_error,
                    "passed": o.passed,
                }
                for o in self.outputs
            ],
        }
        if self.buckets:
            data["buckets"] = [
                {"function": function, **result.to_json()} for function, result in self.buckets
            ]
        return data

    def require_passed(self) -> VerificationResult:
        if not self.passed:
            raise VerificationError(self.message)
        return self


def compare(
    actual: list[np.ndarray], expected: list[np.ndarray], reference: str
) -> VerificationResult:
    """Compare outputs elementwise with :func:`tolerance_for` their expected dtype."""
    if len(actual) != len(expected):
        return VerificationResult(
            False,
            reference,
            float("inf"),
            (),
            f"output count differs: TVM gave {len(actual)}, {reference} gave {len(expected)}",
        )
    checks = []
    problems = []
    for index, (got, want) in enumerate(zip(actual, expected)):
        want = np.asarray(want)
        got = np.asarray(got)
        if got.shape != want.shape:
            checks.append(OutputCheck(index, str(want.dtype), want.shape, float("inf"), False))
            problems.append(f"output {index}: shape {got.shape} != {want.shape}")
            continue
        tol = tolerance_for(want.dtype.name)
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
        max_err = float(diff.max()) if diff.size else 0.0
        scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
        finite = bool(np.isfinite(got).all() == np.isfinite(want).all())
        ok = finite and bool(
            np.all(diff <= tol.atol * scale + tol.rtol * np.abs(want.astype(np.float64)))
        )
        checks.append(OutputCheck(index, want.dtype.name, want.shape, max_err, ok))
        if not ok:
            problems.append(f"output {index}: max abs error {max_err:.3g} over tolerance")
    max_abs = max((c.max_abs_error for c in checks), default=0.0)
    passed = not problems
    message = (
        f"matches {reference} (max abs error {max_abs:.3g})"
        if passed
        else f"does not match {reference}: " + "; ".join(problems)
    )
    return VerificationResult(passed, reference, max_abs, tuple(checks), message)


def verify(model: LoadedModel, run: Any, seed: int = 0, device: str = "cpu") -> VerificationResult:
    """Run ``run(inputs) -> outputs`` and the reference on the same seeded inputs; compare.

    ``device`` is the library's device: for ``"cuda"`` a ``.pt2`` reference runs on the GPU too.
    A bucketed model is verified at every bucket, a multi-program model at every program
    (``run`` dispatches on the input shapes, as :class:`compiler.build.runner.LoadedLibrary` does):
    it passes when every one does.
    """
    if model.buckets:
        return _verify_buckets(model, run, seed, device)
    inputs = model_inputs(model, seed)
    reference = reference_name(model, device)
    return compare(run(inputs), reference_outputs(model, inputs, device), reference)


def _verify_buckets(model: LoadedModel, run: Any, seed: int, device: str) -> VerificationResult:
    results = tuple(
        (bucket.function, verify(bucket.model, run, seed, device)) for bucket in model.buckets
    )
    failed = [f"{name}: {result.message}" for name, result in results if not result.passed]
    max_abs = max(result.max_abs_error for _, result in results)
    reference = results[0][1].reference
    what = "program" if model.programs else "bucket"
    message = (
        f"matches {reference} at every {what} ({len(results)}: "
        + ", ".join(name for name, _ in results)
        + f"; max abs error {max_abs:.3g})"
        if not failed
        else f"does not match {reference} at " + "; ".join(failed)
    )
    outputs = tuple(check for _, result in results for check in result.outputs)
    return VerificationResult(not failed, reference, max_abs, outputs, message, results)


def bucket_padding(
    model: LoadedModel, library: Any, seed: int = 0, device: str = "cpu"
) -> PaddingRule:
    """Whether the bucketed ``model``'s ``library`` (a :class:`compiler.build.runner.LoadedLibrary`)
    may pad inputs between buckets: :func:`compiler.shapes.padding.check_padding` with this module's
    seeded inputs, reference framework and tolerances."""

    def close(actual: list[np.ndarray], expected: list[np.ndarray]) -> tuple[bool, float]:
        result = compare(actual, expected, reference_name(model, device))
        return result.passed, result.max_abs_error

    return check_padding(
        model,
        library.run_function,
        lambda probe, inputs: reference_outputs(probe, inputs, device),
        close,
        lambda probe: random_inputs(probe.inputs, seed),
    )


def time_reference(model: LoadedModel, *, repeat: int = 20, threads: int | None = None) -> float:
    """Median latency in seconds of the reference framework on the model's seeded inputs.

    ONNX Runtime (``threads`` intra-op threads) for ONNX models, the ``torch.export`` program in
    eager mode for ``.pt2`` models: the bar a tuned artifact is compared with.
    """
    inputs = model_inputs(model)
    if model.format == "onnx":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        session = onnxruntime.InferenceSession(
            model.source.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feeds = {spec.name: array for spec, array in zip(model.inputs, inputs)}

        def call() -> None:
            session.run(None, feeds)
    else:
        import torch

        if threads:
            torch.set_num_threads(threads)
        module = stateful_module(model.source) if model.state else model.source.module()
        tensors = [torch.from_numpy(array) for array in inputs]

        def call() -> None:
            with torch.no_grad():
                call_program(model.source, module, tensors)

    call()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))
