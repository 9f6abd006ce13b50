"""An embedding table on an 8- or 4-bit grid is gathered from its codes
(compiler/weights/quantized_gather): the same rows, bit for bit, from a quarter of the bytes; a
table off the grid is left alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from compiler.weights.quantized_gather import gather_from_codes, table_codes
from compiler.weights.weight_formats import FORMAT_VALUES


def _embedding(table: np.ndarray) -> tvm.IRModule:
    """``main(ids: int64[2, 3]) = take(table, ids, axis=0)`` with ``table`` a constant."""
    ids = relax.Var("ids", relax.TensorType((2, 3), "int64"))
    builder = relax.BlockBuilder()
    with builder.function("main", [ids]):
        with builder.dataflow():
            out = builder.emit_output(relax.op.take(relax.const(table), ids, axis=0, mode="fast"))
        builder.emit_func_output(out)
    return builder.get()


def _run(mod: tvm.IRModule, ids: np.ndarray) -> np.ndarray:
    executable = tvm.compile(mod, target="llvm")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    return vm["main"](tvm.runtime.tensor(ids)).numpy()


def _constants(mod: tvm.IRModule) -> list[tuple[str, tuple[int, ...]]]:
    found: list = []
    relax.analysis.post_order_visit(
        mod["main"].body,
        lambda node: (
            found.append((str(node.value.dtype), tuple(node.value.shape)))
            if isinstance(node, tvm.ir.expr.GenericConst)
            else None
        ),
    )
    return found


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_a_table_on_the_grid_is_gathered_from_its_codes(fmt) -> None:
    rng = np.random.default_rng(3)
    table = FORMAT_VALUES[fmt]((rng.standard_normal((50, 64)) * 0.05).astype(np.float32))
    ids = rng.integers(0, 50, (2, 3)).astype(np.int64)
    held = gather_from_codes(_embedding(table), fmt)
    assert sorted(_constants(held)) == [("float16", (50, 2, 1)), ("int8", (50, 2, 32))]
    assert np.array_equal(_run(held, ids), table[ids])  # exact: q * s is a float32
    codes, scales = table_codes(table, fmt)
    assert codes.dtype == np.int8 and scales.dtype == np.float16


def test_a_table_off_the_grid_is_left_as_it_is() -> None:
    table = np.random.default_rng(4).standard_normal((50, 64)).astype(np.float32)
    assert table_codes(table, "q8_0") is None
    assert table_codes(table[:, :40], "q8_0") is None  # rows not a multiple of 32
    mod = _embedding(table)
    assert _constants(gather_from_codes(mod, "q8_0")) == [("float32", (50, 64))]
