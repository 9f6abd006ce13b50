"""compiler.lowering.fast_math: float32 transcendental ops become TVM's vectorizable approximations,
accurate to the verification tolerance; other dtypes are left exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from compiler.build.verify import compare
from compiler.lowering.fast_math import fast_math

_ERF = np.vectorize(math.erf)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# op name, Relax builder, exact float64 reference, input range
CASES = {
    "erf": (lambda x: relax.op.erf(x), _ERF, 6.0),
    "exp": (lambda x: relax.op.exp(x), np.exp, 20.0),
    "tanh": (lambda x: relax.op.tanh(x), np.tanh, 12.0),
    "softmax": (lambda x: relax.op.nn.softmax(x, axis=-1), _softmax, 20.0),
    "sigmoid": (lambda x: relax.op.sigmoid(x), lambda x: 1 / (1 + np.exp(-x)), 100.0),
    "silu": (lambda x: relax.op.nn.silu(x), lambda x: x / (1 + np.exp(-x)), 100.0),
    "gelu": (lambda x: relax.op.nn.gelu(x), lambda x: 0.5 * x * (1 + _ERF(x / math.sqrt(2))), 8.0),
    "gelu_tanh": (
        lambda x: relax.op.nn.gelu_tanh(x),
        lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
        8.0,
    ),
}


def _module(build, dtype: str) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 256), dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(build(x))
        bb.emit_func_output(out)
    return bb.get()


def _op_names(mod: tvm.IRModule) -> set[str]:
    names: set[str] = set()

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            names.add(expr.op.name)

    relax.analysis.post_order_visit(mod["main"], visit)
    return names


@pytest.mark.parametrize("name", sorted(CASES))
def test_float32_op_becomes_fast_kernel_within_tolerance(name: str) -> None:
    build, exact, bound = CASES[name]
    mod = fast_math(_module(build, "float32"))

    ops = _op_names(mod)
    assert "relax.call_tir" in ops
    assert not ops & {
        "relax.erf",
        "relax.exp",
        "relax.tanh",
        "relax.nn.softmax",
        "relax.nn.gelu",
        "relax.nn.gelu_tanh",
        "relax.sigmoid",
        "relax.nn.silu",
    }, ops
    kernels = [gv.name_hint for gv, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert kernels and all(k.startswith("fast_") for k in kernels), kernels

    x = np.linspace(-bound, bound, 4 * 256, dtype=np.float32).reshape(4, 256)
    vm = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())
    actual = vm["main"](tvm.runtime.tensor(x)).numpy()
    expected = exact(x.astype(np.float64)).astype(np.float32)
    result = compare([actual], [expected], "exact float64")
    assert result.passed, result.message


@pytest.mark.parametrize("name", ["erf", "softmax", "gelu", "silu"])
def test_other_dtypes_stay_exact(name: str) -> None:
    mod = _module(CASES[name][0], "float64")
    assert tvm_ffi.structural_equal(fast_math(mod), mod)


def test_the_input_module_is_not_modified() -> None:
    mod = _module(CASES["gelu"][0], "float32")
    before = mod.script()
    rewritten = fast_math(mod)
    assert mod.script() == before and "R.nn.gelu" in before
    assert "R.nn.gelu" not in rewritten.script()
