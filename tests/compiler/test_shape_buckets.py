"""Symbolic dimensions as shape buckets (issue 20).

A decoder exported with a symbolic sequence length (``examples.decoders.export_dynamic``: a
``torch.export`` ``Dim``, and its ONNX export with ``dim_param`` ``seq``) is prepared with
buckets, one static specialization each, merged into one Relax module (a function per bucket)
whose tasks are the union of the buckets' tasks by key; it builds into one ``model.so`` that is
verified at every bucket and, loaded from disk, dispatches on the input's length: the outputs
match torch / ONNX Runtime at each bucket. A length between buckets runs padded to the next
bucket where the probes before publishing found padding exact (the causal decoder; an
elementwise model), and is a clear error where they did not (a softmax over the sequence) or
past the largest bucket.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from compiler.build.artifact import publish_artifact
from compiler.build.builder import build_zero_trial
from compiler.build.runner import LoadedLibrary
from compiler.build.verify import compare, reference_outputs
from compiler.errors import ModelError
from compiler.prepare import prepare_model
from compiler.shapes.buckets import (
    DEFAULT_MAX,
    SymbolicDim,
    default_values,
    merge_bucket_options,
    parse_bucket_field,
    resolve_buckets,
)
from compiler.target import cpu_target
from examples.decoders import SEQ_SYMBOL, export_dynamic, get_decoder

TARGET = cpu_target(2)
BUCKETS = (16, 32)
BETWEEN = 24  # pads to 32
PAST = 40  # past the largest bucket


@pytest.fixture(scope="module")
def dynamic_decoder(tmp_path_factory):
    """``dynamic_decoder(fmt)`` → the path of the Llama decoder with a symbolic length."""
    folder = tmp_path_factory.mktemp("dynamic")
    paths: dict[str, Path] = {}

    def get(fmt: str) -> Path:
        if fmt not in paths:
            paths[fmt] = export_dynamic("llama", fmt, folder / f"llama.{fmt}")
        return paths[fmt]

    return get


def _symbol(prepared) -> str:
    return prepared.model.bucket_spec.values[0][0]


def test_bucket_specs_are_parsed_and_checked() -> None:
    assert parse_bucket_field("seq=16,64; batch=1,2") == {"seq": (16, 64), "batch": (1, 2)}
    assert merge_bucket_options(["seq=64,16,16"]) == {"seq": (64, 16, 16)}
    for bad in ("seq", "seq=", "seq=16,x", "=16", "seq=0", "seq=-4"):
        with pytest.raises(ModelError) as info:
            parse_bucket_field(bad)
        assert (
            info.value.code == "bad_buckets"
            and "NAME=V1,V2" in info.value.message
            or ("between 1 and" in info.value.message)
        )
    with pytest.raises(ModelError, match="twice"):
        merge_bucket_options(["seq=16", "seq=32"])
    dims = [SymbolicDim("s0", "ids", 1, 2, 100)]
    spec = resolve_buckets(dims, {"ids.1": [64, 16, 16]})
    assert spec.values == (("s0", (16, 64)),) and spec.defaulted == ()
    with pytest.raises(ModelError, match=r"outside the range .* \(2\.\.100\)"):
        resolve_buckets(dims, {"s0": [1, 16]})
    with pytest.raises(ModelError, match=r"not a symbolic dimension .* s0 \(ids\.1\)"):
        resolve_buckets(dims, {"seq": [16]})
    assert resolve_buckets(dims, {"s0": [16]}, pinned={"s0": 7}) is None  # --input-shape wins
    defaulted = resolve_buckets(dims, {})
    assert defaulted.values == (("s0", (16, 32, 64)),) and defaulted.defaulted == ("s0",)
    assert "default" in defaulted.describe()
    assert default_values(SymbolicDim("n", "x", 0)) == (16, 32, 64, DEFAULT_MAX)
    assert default_values(SymbolicDim("n", "x", 0, 1, 8)) == (1, 2, 4, 8)
    two = [SymbolicDim("a", "x", 0), SymbolicDim("b", "x", 1)]
    with pytest.raises(ModelError, match="25 static specializations"):
        resolve_buckets(two, {"a": [1, 2, 3, 4, 5], "b": [1, 2, 3, 4, 5]})


@pytest.mark.parametrize("fmt", ["pt2", "onnx"])
def test_bucketed_decoder_dispatches_to_each_bucket(dynamic_decoder, fmt, tmp_path) -> None:
    path = dynamic_decoder(fmt)
    symbol = SEQ_SYMBOL if fmt == "onnx" else "input_ids.1"  # .pt2: torch's s-name, or the alias
    prepared = prepare_model(path, TARGET, buckets={symbol: list(BUCKETS)})
    model = prepared.model
    assert [dict(b.values) for b in model.buckets] == [{_symbol(prepared): n} for n in BUCKETS]
    assert [b.model.inputs[0].shape for b in model.buckets] == [(1, n) for n in BUCKETS]
    functions = [b.function for b in model.buckets]
    assert functions == [f"main_{_symbol(prepared)}_{n}" for n in BUCKETS]
    relax_functions = {
        gv.name_hint for gv, f in prepared.mod.functions_items() if type(f).__name__ == "Function"
    }
    assert relax_functions == set(functions)  # one VM function per bucket, no main

    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    executable, peers = build_zero_trial(prepared.mod, TARGET, tasks)
    out = tmp_path / "artifact"
    manifest = publish_artifact(executable, model, TARGET, out, tasks=[], link_peers=bool(peers))
    assert manifest["verification"]["passed"], manifest["verification"]["message"]
    assert [b["function"] for b in manifest["verification"]["buckets"]] == functions
    listed = json.loads((out / "manifest.json").read_text())["model"]["buckets"]
    assert [f["function"] for f in listed["functions"]] == functions
    assert [f["inputs"][0]["shape"] for f in listed["functions"]] == [[1, n] for n in BUCKETS]

    # Loaded from disk (the bucket table comes from manifest.json), on inputs of its own.
    library = LoadedLibrary(out / "model.so")
    spec = get_decoder("llama")
    for bucket, length in zip(model.buckets, BUCKETS):
        ids = spec.make_input_ids(length, seed=7).numpy()
        assert library.function_for([ids]) == bucket.function
        result = compare(library.run([ids]), reference_outputs(bucket.model, [ids]), fmt)
        assert result.passed, result.message
        assert library.run([ids])[0].shape == (1, length, spec.vocab_size)
    # The causal decoder allows padding: measured before publishing (a probe per bucket).
    padding = listed["padding"]
    assert padding["allowed"], padding
    assert len(padding["probes"]) == len(BUCKETS) and padding["cuts"] == [
        [0, 1, _symbol(prepared)]
    ]  # the logits' sequence axis is cut back
    ids = spec.make_input_ids(BETWEEN, seed=3).numpy()
    assert library.function_for([ids]) == functions[-1]
    result = compare(library.run([ids]), reference_outputs(_at_length(model, ids), [ids]), fmt)
    assert result.passed, result.message
    assert library.run([ids])[0].shape == (1, BETWEEN, spec.vocab_size)
    with pytest.raises(ModelError) as info:
        library.run([spec.make_input_ids(PAST).numpy()])
    assert info.value.code == "no_bucket"
    assert "1x40" in info.value.message and all(f in info.value.message for f in functions)
    assert "larger than every bucket" in info.value.message
    timing = library.time([spec.make_input_ids(BUCKETS[0]).numpy()], repeat=3, min_repeat_ms=1)
    assert timing.median_secs > 0


def _at_length(model, ids):
    """``model``'s largest bucket at the length of ``ids``, over the symbolic source (what the
    reference framework runs between buckets)."""
    from dataclasses import replace

    spec = replace(model.inputs[0], shape=tuple(ids.shape))
    return replace(model.buckets[-1].model, inputs=(spec,), source=model.dynamic_source)


def test_padding_is_refused_where_it_changes_the_outputs(tmp_path) -> None:
    """A softmax over the symbolic axis reads every position: the probe padded to the bucket
    differs from ONNX Runtime at the unpadded length, so the manifest refuses padding with
    the probe's result, and an input between buckets is a ``no_bucket`` error saying why."""
    from onnx import helper

    from tests.onnx_factory import float_input, make_model

    model = make_model(
        [helper.make_node("Softmax", ["x"], ["y"], axis=1)],
        [float_input("x", [1, "n"])],
        [float_input("y", [1, "n"])],
    )
    prepared = prepare_model(model.SerializeToString(), TARGET, buckets={"n": [8, 16]})
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    executable, _ = build_zero_trial(prepared.mod, TARGET, tasks)
    manifest = publish_artifact(executable, prepared.model, TARGET, tmp_path / "out", tasks=[])
    assert manifest["verification"]["passed"]  # exact buckets still match
    padding = manifest["model"]["buckets"]["padding"]
    assert not padding["allowed"] and "differ from the reference" in padding["reason"]
    assert padding["reason"].startswith("n=4 padded to main_n_8")
    library = LoadedLibrary(tmp_path / "out" / "model.so")
    x = np.random.default_rng(0).standard_normal((1, 12)).astype("float32")
    with pytest.raises(ModelError) as info:
        library.run([x])
    assert info.value.code == "no_bucket" and "refused" in info.value.message
    exact = np.random.default_rng(1).standard_normal((1, 8)).astype("float32")
    want = np.exp(exact) / np.exp(exact).sum()
    np.testing.assert_allclose(library.run([exact])[0], want, rtol=1e-5)

    # A worker's manifest that claims padding anyway: the server's sandboxed check of the
    # worker's library (issue 31) verifies it at every bucket and withdraws the claim.
    from dataclasses import asdict

    from compiler.frontends.model_spec import ModelLimits
    from tuner.final_build.artifact_review import ReviewContext, review_artifact

    source = tmp_path / "softmax.onnx"
    source.write_bytes(model.SerializeToString())
    forged = json.loads((tmp_path / "out" / "manifest.json").read_text())
    forged["model"]["buckets"]["padding"].update(allowed=True, symbols=["n"], cuts=[[0, 1, "n"]])
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(forged))
    context = ReviewContext(
        model_path=source,
        model_format="onnx",
        buckets_json=json.dumps(prepared.model.bucket_spec.to_json()),
        target=TARGET,
        limits=asdict(ModelLimits()),
        job_id=1,
        trials_measured=0,
        tasks=[],
        hide=[],
        server_build=False,
    )
    review = review_artifact(context, "preview", tmp_path / "out", None)
    assert review.verified and review.kind == "sandbox_reference" and review.built_by == "worker"
    checked = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert checked["model"]["buckets"]["padding"]["allowed"] is False


def test_bucket_tasks_are_the_union_of_the_static_specializations(dynamic_decoder) -> None:
    path = dynamic_decoder("onnx")
    bucketed = prepare_model(path, TARGET, buckets={SEQ_SYMBOL: list(BUCKETS)})
    alone = [prepare_model(path, TARGET, input_shapes={"input_ids": [1, n]}) for n in BUCKETS]
    weights: Counter[str] = Counter()
    for prepared in alone:
        assert not prepared.model.buckets
        for task in prepared.partition.tasks:
            weights[task.key] += task.weight
    # Keys are structural hashes: each bucket's tasks are those of the static model at that
    # length (shared with it in the database), a task two buckets share would be one task
    # with its weights summed. (Here none is shared: every matmul's rows are the length.)
    assert {t.key: t.weight for t in bucketed.partition.tasks} == dict(weights)
    keys = [{t.key for t in p.partition.tasks} for p in alone]
    assert len(bucketed.partition.tasks) == len(keys[0] | keys[1])


def test_default_buckets_and_pinned_shape(dynamic_decoder) -> None:
    path = dynamic_decoder("onnx")
    from compiler.frontends.loader import load_model  # loading only: no import, no partition

    model = load_model(path)
    assert model.bucket_spec.defaulted == (SEQ_SYMBOL,)
    assert model.bucket_spec.values == ((SEQ_SYMBOL, (16, 32, 64, 128)),)
    assert model.describe()["buckets"]["defaulted"] == [SEQ_SYMBOL]
    pinned = load_model(path, input_shapes={"input_ids": [1, 20]}, buckets={SEQ_SYMBOL: [16]})
    assert not pinned.buckets and pinned.inputs[0].shape == (1, 20)
    with pytest.raises(ModelError) as info:
        load_model(path, buckets={"len": [16]})
    assert info.value.code == "bad_buckets" and "seq (input_ids.1)" in info.value.message
    with pytest.raises(ModelError, match="outside the range"):
        load_model(dynamic_decoder("pt2"), buckets={"input_ids.1": [256]})  # Dim max is 128
    ids = np.zeros((1, 16), dtype=np.int64)
    assert model.buckets[0].model.inputs[0].shape == ids.shape


def test_pt2_bucket_has_the_tasks_of_a_static_export(dynamic_decoder, tmp_path) -> None:
    """A ``.pt2`` bucket is exported again at its length before translation, so its masks are
    constants and its tasks are exactly a static export's: the same keys in the database."""
    from examples.decoders import export_pt2

    static = prepare_model(export_pt2("llama", tmp_path / "llama16.pt2", seq=16), TARGET)
    bucketed = prepare_model(dynamic_decoder("pt2"), TARGET, buckets={"input_ids.1": [16]})
    assert {t.key for t in bucketed.partition.tasks} == {t.key for t in static.partition.tasks}
    mask_work = ("arange", "cumsum", "index_tensor", "less_equal")
    assert not [t.name for t in bucketed.partition.tasks if any(m in t.name for m in mask_work)]
    # --input-shape pins the same way: one static specialization, the static export's tasks.
    pinned = prepare_model(dynamic_decoder("pt2"), TARGET, input_shapes={"input_ids": [1, 16]})
    assert not pinned.model.buckets
    assert {t.key for t in pinned.partition.tasks} == {t.key for t in static.partition.tasks}


def test_two_symbols_shared_by_two_inputs(tmp_path) -> None:
    """Symbols shared by inputs get one value per specialization; two symbols make the product
    of their buckets, and dispatch matches every input's shape."""
    from onnx import helper

    from tests.onnx_factory import float_input, make_model

    model = make_model(
        [helper.make_node("Add", ["x", "y"], ["s"]), helper.make_node("Relu", ["s"], ["z"])],
        [float_input("x", ["batch", "n"]), float_input("y", ["batch", "n"])],
        [float_input("z", ["batch", "n"])],
    )
    data = model.SerializeToString()
    prepared = prepare_model(data, TARGET, buckets={"batch": [1, 2], "n": [8]})
    functions = [b.function for b in prepared.model.buckets]
    assert functions == ["main_batch_1_n_8", "main_batch_2_n_8"]
    assert [tuple(s.shape for s in b.model.inputs) for b in prepared.model.buckets] == [
        ((1, 8), (1, 8)),
        ((2, 8), (2, 8)),
    ]
    tasks = [
        (t.key, e.dispatched[0])
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
    ]
    executable, _ = build_zero_trial(prepared.mod, TARGET, tasks)
    manifest = publish_artifact(executable, prepared.model, TARGET, tmp_path / "out", tasks=[])
    assert manifest["verification"]["passed"]
    library = LoadedLibrary(tmp_path / "out" / "model.so")
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((2, 8)).astype("float32") for _ in range(2))
    assert library.function_for([x, y]) == "main_batch_2_n_8"
    np.testing.assert_allclose(library.run([x, y])[0], np.maximum(x + y, 0), rtol=1e-6)
    with pytest.raises(ModelError, match="no shape bucket"):
        library.run([x, y[:1]])  # the inputs disagree: no bucket takes 2x8 with 1x8
    # Elementwise: n pads (probed at 4); batch has no value between its buckets, so it
    # is never padded: a 2x5 input runs on main_batch_2_n_8, cut back to 2x5.
    rule = manifest["model"]["buckets"]["padding"]
    assert rule["allowed"] and rule["symbols"] == ["n"], rule
    assert library.function_for([x[:, :5], y[:, :5]]) == "main_batch_2_n_8"
    np.testing.assert_allclose(
        library.run([x[:, :5], y[:, :5]])[0], np.maximum(x[:, :5] + y[:, :5], 0), rtol=1e-6
    )


def test_histogram_buckets_minimize_the_expected_padded_size() -> None:
    from compiler.shapes.buckets import SizeHistogram, histogram_buckets, parse_bucket_option

    name, histogram = parse_bucket_option("seq~12:40,37:5,100:3,500:1/3")
    assert name == "seq" and histogram == SizeHistogram(
        ((12, 40.0), (37, 5.0), (100, 3.0), (500, 1.0)), 3
    )
    # Candidates are the sizes rounded up to multiples of 8 (16, 40, 104, 504); of the
    # three-bucket sets, 16/104/504 pads least in expectation (16*40 + 104*8 + 504*1).
    values, shares = histogram_buckets(histogram, 2, 1024)
    assert values == (16, 104, 504)
    assert shares == pytest.approx((40 / 49, 8 / 49, 1 / 49))
    # Small sizes are not rounded; as many buckets as sizes is one bucket per size.
    assert histogram_buckets(SizeHistogram(((1, 5), (2, 3), (3, 1), (7, 1)), 2), 1, 64) == (
        (2, 7),
        (0.8, 0.2),
    )
    assert histogram_buckets(SizeHistogram(((16, 1), (32, 1)), 4), 1, 64)[0] == (16, 32)
    # The model's range bounds the rounding, and a size outside it is refused.
    assert histogram_buckets(SizeHistogram(((70, 1),), 1), 1, 72)[0] == (72,)
    assert histogram_buckets(SizeHistogram(((70, 1),), 1), 1, 70)[0] == (70,)
    with pytest.raises(ModelError, match="outside the range"):
        histogram_buckets(SizeHistogram(((8, 1), (300, 1)), 2), 2, 128)
    for bad in ("seq~", "seq~12:x", "seq~12:-1", "seq~0:3", "seq~12:3/0", "seq~12:0"):
        with pytest.raises(ModelError, match="histogram") as info:
            parse_bucket_option(bad)
        assert info.value.code == "bad_buckets"
    dims = [SymbolicDim("s0", "ids", 1, 2, 128)]
    spec = resolve_buckets(dims, {"ids.1": SizeHistogram(((8, 90.0), (30, 10.0)), 2)})
    assert spec.values == (("s0", (8, 30)),) and spec.shares == (("s0", (0.9, 0.1)),)
    assert spec.specialization_shares() == [0.9, 0.1]
    assert spec.to_json()["histograms"] == {"s0": "8:90,30:10/2"}
    from compiler.shapes.buckets import bucket_values

    stored = bucket_values(json.dumps(spec.to_json()))
    assert resolve_buckets(dims, stored) == spec  # a stored histogram gives the same buckets


def test_histogram_shares_weigh_the_tasks(dynamic_decoder) -> None:
    """A histogram's shares weigh each bucket's tasks: 90 % of inputs at length 8 makes that
    bucket's tasks 1.8x their calls and the rare length-30 bucket's 0.2x (at least 1)."""
    path = dynamic_decoder("onnx")
    from compiler.shapes.buckets import SizeHistogram

    weighted = prepare_model(
        path, TARGET, buckets={SEQ_SYMBOL: SizeHistogram(((8, 90.0), (30, 10.0)), 2)}
    )
    plain = prepare_model(path, TARGET, buckets={SEQ_SYMBOL: [8, 30]})
    assert weighted.model.bucket_spec.values == plain.model.bucket_spec.values
    calls = {t.key: t.weight for t in plain.partition.tasks}
    assert set(calls) == {t.key for t in weighted.partition.tasks}
    per_bucket = {
        n: {
            t.key: t.weight
            for t in prepare_model(path, TARGET, input_shapes={"input_ids": [1, n]}).partition.tasks
        }
        for n in (8, 30)
    }
    for task in weighted.partition.tasks:
        expected = per_bucket[8].get(task.key, 0) * 0.9 + per_bucket[30].get(task.key, 0) * 0.1
        assert task.weight == max(1, round(expected * 2)), task.name
    assert any(t.weight > calls[t.key] for t in weighted.partition.tasks)
    assert any(t.weight < calls[t.key] for t in weighted.partition.tasks)


def test_a_wide_histogram_is_coarsened_to_bound_the_work() -> None:
    import time

    from compiler.shapes.buckets import MAX_BUCKET_CANDIDATES, SizeHistogram, histogram_buckets

    wide = SizeHistogram(tuple((v, 1.0) for v in range(1, 4097)), 16)
    start = time.perf_counter()
    values, shares = histogram_buckets(wide, 1, 1 << 20)
    assert time.perf_counter() - start < 10  # ~1 s here; 4,096 candidates would take minutes
    assert len(values) == 16 and values[-1] == 4096 and sum(shares) == pytest.approx(1)
    assert all(v % (4096 // MAX_BUCKET_CANDIDATES) == 0 for v in values)
