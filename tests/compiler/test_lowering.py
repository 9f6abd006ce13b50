"""CPU compile options (NHWC convolutions, prepacked weights) through partition, tuning and build.

A few trials each: the tests check keys, layouts and numerics, never speed.
"""

from __future__ import annotations

import json
from contextlib import closing

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.ir.expr import GenericConst
from tvm.relax.frontend.onnx import from_onnx

from compiler.build.builder import build
from compiler.build.runner import LoadedLibrary
from compiler.compile_options import CPU_DEFAULT, LEGACY, CompileOptions
from compiler.frontends.importer import normalize
from compiler.lowering.conv_layout import to_nhwc
from compiler.lowering.pipeline import fused_for_target, lower_with_database
from compiler.partition import partition
from compiler.target import TargetSpec, cpu_target

NHWC = CompileOptions("NHWC", False)
PREPACK = CompileOptions("NCHW", True)
BOTH = CompileOptions("NHWC", True)


def _mobilenet_block():
    """conv 1x1 → ReLU6 (Clip) → depthwise 3x3 → ReLU6 → global pool → flatten → dense."""
    rng = np.random.default_rng(0)

    def const(name: str, *shape: int):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype("float32"), name)

    inits = [
        const("w1", 16, 8, 1, 1),
        const("b1", 16),
        const("w2", 16, 1, 3, 3),
        const("b2", 16),
        const("wd", 16, 10),
        const("bd", 10),
        numpy_helper.from_array(np.array(0.0, "float32"), "lo"),
        numpy_helper.from_array(np.array(6.0, "float32"), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),
        helper.make_node(
            "Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1] * 4, group=16
        ),
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "wd"], ["m"]),
        helper.make_node("Add", ["m", "bd"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def block():
    import onnxruntime as ort

    proto = _mobilenet_block()
    x = np.random.default_rng(1).standard_normal((1, 8, 12, 12)).astype("float32")
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return (
        normalize(from_onnx(proto, keep_params_in_input=False)),
        x,
        session.run(None, {"x": x})[0],
    )


def _ops(mod: tvm.IRModule) -> list[str]:
    names: list[str] = []
    relax.analysis.post_order_visit(
        mod["main"],
        lambda e: (
            names.append(e.op.name)
            if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op)
            else None
        ),
    )
    return names


def test_options_are_part_of_the_cpu_target_key() -> None:
    default, legacy = cpu_target(2), cpu_target(2, LEGACY)
    assert default.compile_options == CPU_DEFAULT and legacy.compile_options == LEGACY
    assert default.key != legacy.key and cpu_target(2).key == default.key
    assert json.loads(default.fingerprint_json)["compile"] == CPU_DEFAULT.to_json()
    # A CPU target stored before the options existed is the legacy path.
    fingerprint = {k: v for k, v in default.fingerprint.items() if k != "compile"}
    old = TargetSpec("cpu", default.target_json, json.dumps(fingerprint, sort_keys=True))
    assert old.compile_options.is_legacy
    with pytest.raises(ValueError):
        CompileOptions("NCWH", False)  # type: ignore[arg-type]


def test_nhwc_keeps_only_the_input_transpose(block) -> None:
    mod, _, _ = block
    converted = to_nhwc(mod)
    ops = _ops(converted)
    assert "relax.clip" not in ops  # ReLU6 as minimum(maximum(...)) so the layout propagates
    assert ops.count("relax.permute_dims") == 1  # NCHW input → NHWC; the pooled end is a reshape
    convs = []
    relax.analysis.post_order_visit(
        converted["main"],
        lambda e: (
            convs.append(e)
            if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d"
            else None
        ),
    )
    assert {(str(c.attrs.data_layout), str(c.attrs.kernel_layout)) for c in convs} == {
        ("NHWC", "HWIO")
    }
    assert "relax.clip" in _ops(mod)  # the input module is untouched


@pytest.mark.parametrize("options", [LEGACY, NHWC, PREPACK, BOTH], ids=lambda o: o.describe())
def test_untuned_build_matches_onnxruntime(block, options) -> None:
    mod, x, expected = block
    library = LoadedLibrary.from_executable(build(mod, cpu_target(2, options)))
    np.testing.assert_allclose(library.run([x])[0], expected, rtol=1e-4, atol=1e-4)


def test_prepack_marks_constant_weights_layout_free(block) -> None:
    mod, _, _ = block
    marked = fused_for_target(mod, cpu_target(2, BOTH))
    plain = fused_for_target(mod, cpu_target(2, NHWC))
    conv_funcs = [f for g, f in marked.functions_items() if "conv2d" in g.name_hint]
    assert conv_funcs and all("layout_free_buffers" in f.attrs for f in conv_funcs)
    keys = {t.key for t in partition(mod, cpu_target(2, BOTH)).tasks}
    assert keys.isdisjoint(t.key for t in partition(mod, cpu_target(2, NHWC)).tasks)
    assert not any(
        "layout_free_buffers" in (f.attrs or {})
        for _, f in plain.functions_items()
        if isinstance(f, tvm.tirx.PrimFunc)
    )


def _tune_all(parts, target, tmp_path):
    from tvm.s_tir import meta_schedule as ms

    from compiler.lowering.intrinsics import load_tensor_intrinsics
    from tuner.engine.search import SearchConfig
    from tuner.measuring.builder_runner import MeasureConfig, make_builder, make_runner

    # As the tuner does (tuner.engine.search.run_search): only the CPU's tensor intrinsics. Without
    # it, TuneContext imports every backend's (minutes under pytest's deep stack;
    # compiler/lowering/intrinsics.py).
    load_tensor_intrinsics("cpu")
    measure = MeasureConfig(repeat=1, min_repeat_ms=1)
    # The evolutionary search, small: 3 trials a task need no population of 512 (MetaSchedule's
    # default).
    search = SearchConfig(population_size=16, init_min_unmeasured=4, genetic_num_iters=1)
    contexts = [
        ms.TuneContext(
            mod=t.dispatched[0],
            target=target.tvm_target(),
            space_generator="post-order-apply",
            search_strategy=search.strategy(),
            task_name=str(t.task_name),
            rand_state=0,
        )
        for t in parts.extracted[:2]  # the two convolutions (heaviest first)
    ]
    with closing(make_builder(measure)) as builder:
        return ms.tune.tune_tasks(
            tasks=contexts,
            task_weights=[1.0] * len(contexts),
            work_dir=str(tmp_path),
            max_trials_global=3 * len(contexts),
            max_trials_per_task=3,
            num_trials_per_iter=3,
            builder=builder,
            runner=make_runner(measure),
            database=ms.database.JSONDatabase(work_dir=str(tmp_path)),
            cost_model="random",
        )


def _constant_shapes(func: relax.Function) -> set[tuple[int, ...]]:
    shapes: set[tuple[int, ...]] = set()
    relax.analysis.post_order_visit(
        func, lambda e: shapes.add(tuple(e.value.shape)) if isinstance(e, GenericConst) else None
    )
    return shapes


def _callees(func: relax.Function) -> list[str]:
    names: list[str] = []
    relax.analysis.post_order_visit(
        func,
        lambda e: (
            names.append(e.args[0].name_hint)
            if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.call_tir"
            else None
        ),
    )
    return names


def test_tuned_prepacked_build_folds_weights_and_verifies(block, tmp_path) -> None:
    """Records tuned on partition's tasks are what the build applies: the weights are folded
    into the tiled layouts that ``RewriteLayout`` chose (new constant shapes, no prepack call
    left at run time), ``main`` still takes the input only, and the result matches ONNX Runtime."""
    mod, x, expected = block
    target = cpu_target(2, BOTH)
    parts = partition(mod, target)
    database = _tune_all(parts, target, tmp_path)
    scheduled = lower_with_database(mod, target, database)
    assert len(scheduled["main"].params) == 1
    callees = _callees(scheduled["main"])
    assert sum(name.endswith("_prepacked") for name in callees) == 2, callees
    assert not any(name.endswith("_weight_prepack") for name in callees), callees
    packed = _constant_shapes(scheduled["main"]) - _constant_shapes(parts.fused["main"])
    assert packed, "no weight was folded into a new layout"
    library = LoadedLibrary.from_executable(build(mod, target, database))
    np.testing.assert_allclose(library.run([x])[0], expected, rtol=1e-4, atol=1e-4)
