"""Run-time bounds on what TVM materializes while importing and partitioning a model.

:mod:`compiler.limits.graph_limits` bounds ONNX constants before TVM runs; this module is the bound
behind it, for both formats: :func:`check_relax_constants` refuses a Relax module holding a constant
over ``ModelLimits.max_constant_elements`` / ``max_constant_bytes`` (checked after each folding
step), and :func:`bounded_folding` turns an allocation failure inside TVM (``std::bad_alloc``,
surfaced as ``tvm.error.InternalError``, or Python's ``MemoryError``; both also end a validation
process that hits its address-space limit) into a :class:`ModelError` instead of a traceback.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np
import tvm
from tvm import relax

from compiler.errors import ModelError
from compiler.frontends.model_spec import ModelLimits


def _tensor_constants(mod: tvm.IRModule) -> Iterator[tvm.runtime.Tensor]:
    """The tensor payload of every literal constant in ``mod``'s Relax functions (in 0.27 a
    ``tvm.ir.expr.GenericConst`` whose ``value`` is a ``tvm.runtime.Tensor``)."""
    found: list[tvm.runtime.Tensor] = []

    def visit(expr: object) -> None:
        if isinstance(expr, tvm.ir.expr.GenericConst):
            value = expr.value
            if isinstance(value, tvm.runtime.Tensor):
                found.append(value)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    yield from found


def check_relax_constants(mod: tvm.IRModule, limits: ModelLimits, step: str) -> None:
    """Refuse ``mod`` if any Relax constant is over the limits; ``step`` names the stage for the
    message. Raises :class:`ModelError` with code ``constant_too_large``."""
    for tensor in _tensor_constants(mod):
        shape = [int(d) for d in tensor.shape]
        elements = math.prod(shape)
        try:
            itemsize = np.dtype(str(tensor.dtype)).itemsize
        except TypeError:  # a dtype numpy does not know (bfloat16...): count 8 bytes
            itemsize = 8
        size = elements * itemsize
        if elements > limits.max_constant_elements or size > limits.max_constant_bytes:
            raise ModelError(
                "constant_too_large",
                f"{step} built a constant of shape {shape} ({elements:.3g} elements, {size:.3g} "
                f"bytes), over the limit of {limits.max_constant_elements} elements and "
                f"{limits.max_constant_bytes} bytes for a tensor built at compile time",
            )


def _is_allocation_failure(err: BaseException) -> bool:
    return isinstance(err, MemoryError) or "bad_alloc" in str(err)


@contextlib.contextmanager
def bounded_folding(step: str) -> Iterator[None]:
    """Run a TVM step, turning an allocation failure into ``ModelError("out_of_memory")``.

    Any other exception passes through unchanged.
    """
    try:
        yield
    except ModelError:
        raise
    except (MemoryError, RuntimeError) as err:  # tvm.error.InternalError is a RuntimeError
        if not _is_allocation_failure(err):
            raise
        raise ModelError(
            "out_of_memory",
            f"{step} ran out of memory: the model builds tensors larger than this machine (or the "
            "validation's memory limit) allows",
        ) from None
