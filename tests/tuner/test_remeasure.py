"""Noise-proof winners (issue 19): before the final build each task's top records are measured
again side by side, the build uses the re-measured winner, and the re-measurements are stored
beside their records, for a job run in one process and (through the manifest) for a worker's
finalize lease. Real MetaSchedule measurements, a few trials."""

from __future__ import annotations

import json
import statistics

import pytest

import db
from compiler.lowering.default_schedules import default_task_module
from compiler.peers import find_peer, peer_library
from compiler.peers.algorithms import gemm_algorithms
from compiler.prepare import prepare_model
from compiler.target import cpu_target
from tuner.final_build.remeasure import RemeasureConfig
from tuner.final_build.remeasure_store import parse_remeasurements


@pytest.fixture(scope="module")
def tuned(tuned_mlp, tmp_path_factory):
    """The MLP tuned once (16 trials: each task gets at least two valid records): this module's
    copy of the session's ``tuned_mlp`` (tests/conftest.py), whose run made the final build."""
    folder = tmp_path_factory.mktemp("remeasure")
    storage = db.open_storage(tuned_mlp.copy(folder / "tune.db"))
    prepared = prepare_model(tuned_mlp.model, cpu_target())
    manifest = json.loads((tuned_mlp.artifact_dir / "manifest.json").read_text())
    yield storage, prepared, tuned_mlp.summary, manifest
    storage.close()


def _peer_name(peer: dict) -> str:
    """How a schedule table names a GEMM peer candidate's library: oneDNN for its ``onednn``
    variant, OpenBLAS (with the shim) for the others."""
    return "onednn gemm" if peer.get("algorithm") == "onednn" else "openblas gemm"


@pytest.mark.slow
def test_job_builds_with_remeasured_winners_and_stores_them(tuned):
    storage, prepared, summary, manifest = tuned
    assert manifest["verification"]["passed"]
    config = RemeasureConfig.from_env()
    remeasured = manifest["remeasured"]
    # Every task with two or more valid records was re-measured (config.top record candidates
    # each), and every task with a library peer (all three GEMMs of the MLP) with its peer.
    target = storage.get_target(prepared.target.key)
    ids = storage.workload_ids([t.key for t in prepared.partition.tasks])
    with_peer = {
        t.key
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
        if peer_library() is not None and find_peer(e.dispatched[0]) is not None
    }
    assert peer_library() is None or len(with_peer) == 3
    recorded = {key for key, wid in ids.items() if storage.top_k(wid, target.id, 1)}
    # TVM's default schedule is a candidate of every task with a record or a peer.
    with_default = {
        t.key
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
        if (t.key in recorded or t.key in with_peer)
        and default_task_module(e.dispatched[0], prepared.target.tvm_target()) is not None
    }
    assert with_default
    expected = {key for key, wid in ids.items() if len(storage.top_k(wid, target.id, 2)) == 2}
    assert expected and {t["key"] for t in remeasured} == expected | with_peer | with_default
    # The tuned build's table and peers: the manifest's own, or, where the whole-model comparison
    # published the zero-trial library instead (tuner/final_build/final_choice.py), kept in
    # final_choice.
    built = manifest["final_choice"].get("tuned_build") or manifest
    schedules = {s["key"]: s for s in built["schedules"]}
    for task in remeasured:
        candidates = task["candidates"]
        records = [c for c in candidates if "peer" not in c and "default" not in c]
        peers = [c for c in candidates if "peer" in c]
        defaults = [c for c in candidates if "default" in c]
        assert len(records) == (config.top if task["key"] in expected else len(records))
        # Every variant of the task's peer (a GEMM against a weight: the packed GEMM, OpenBLAS
        # and, where the library has it, oneDNN's matmul), each its own candidate.
        variants = set(gemm_algorithms()) if task["key"] in with_peer else set()
        assert len(peers) == len(variants)
        assert {c["peer"].get("algorithm", "") for c in peers} == variants
        assert len(defaults) == (task["key"] in with_default)
        recorded_ms = [c["recorded_ms"] for c in records]
        assert recorded_ms == sorted(recorded_ms)  # best recorded first
        for c in candidates:
            assert len(c["rounds_ms"]) == config.rounds
            assert c["median_ms"] == pytest.approx(statistics.median(c["rounds_ms"]))
            assert c["spread"] >= 0
        chosen = [c for c in candidates if c["chosen"]]
        assert len(chosen) == 1
        assert chosen[0]["median_ms"] == min(c["median_ms"] for c in candidates)
        assert task["changed"] == (chosen[0] is not candidates[0])
        # The schedule table reports the winner's re-measured time and what it is.
        row = schedules[task["key"]]
        assert row["best_ms"] == pytest.approx(chosen[0]["median_ms"])
        assert row["implementation"] == (
            _peer_name(chosen[0]["peer"])
            if "peer" in chosen[0]
            else "default"
            if "default" in chosen[0]
            else "schedule"
        )
    # The tuned build links the library exactly when a peer won somewhere.
    won = {
        t["key"] for t in remeasured if any("peer" in c and c["chosen"] for c in t["candidates"])
    }
    defaults_won = {
        t["key"] for t in remeasured if any("default" in c and c["chosen"] for c in t["candidates"])
    }
    assert (built["peers"] or {}).get("tasks", []) == sorted(won)
    assert set((built["peers"] or {}).get("calls", {})) == won  # the variant each calls
    # Stored beside their records, tagged with the job; the records themselves are unchanged.
    stored = storage.list_remeasurements(job_id=summary.job_id)
    assert len(stored) == sum(
        len([c for c in t["candidates"] if "peer" not in c and "default" not in c])
        for t in remeasured
    )
    assert sum(r.chosen for r in stored) == len(remeasured) - len(won) - len(defaults_won)
    for row in stored:
        (record,) = storage.get_records([row.record_id])
        assert record.is_valid and record.job_id == summary.job_id
        assert len(row.rounds_secs) == config.rounds
    # The peers' and the defaults' measurements are library records of their tasks, shared
    # like schedules.
    library = storage.list_library_records(job_id=summary.job_id)
    assert {r.workload_key for r in library if r.library != "tvm"} == with_peer
    assert {r.library for r in library} <= {"openblas", "onednn", "tvm"}
    assert {r.workload_key for r in library if r.library == "tvm"} == with_default
    for record in library:
        assert record.call["kind"] == ("default" if record.library == "tvm" else "gemm")
        assert len(record.run_secs) == config.rounds
    # The estimate adds up the re-measured times.
    assert summary.estimated_secs == pytest.approx(
        sum(t.weight * t.best_secs for t in summary.tasks)
    )


@pytest.mark.slow
def test_compile_with_the_database_uses_faster_library_records(tuned, tuned_mlp, tmp_path, capsys):
    """``tunehub compile --db``: a task whose best stored library record (its peer's or TVM's
    default schedule's, stored by the job's final build) measured faster than its best schedule
    record is built with it; the others with their best record. The artifact verifies."""
    from service.cli import main  # noqa: PLC0415

    storage, prepared, summary, manifest = tuned
    target = storage.get_target(prepared.target.key)
    ids = storage.workload_ids([t.key for t in prepared.partition.tasks])
    library = storage.best_library_records(target.key, list(ids))
    expected = {}
    for task in prepared.partition.tasks:
        best = storage.best_record(ids[task.key], target.id)
        lib = library.get(task.key)
        if lib is None or (best is not None and lib.median_secs >= best.mean_secs):
            expected[task.key] = "schedule"
        else:
            expected[task.key] = "default" if lib.library == "tvm" else f"{lib.library} gemm"
    out = tmp_path / "out"
    url = tuned_mlp.copy(tmp_path / "copy.db")
    code = main(["compile", str(tuned_mlp.model), "-o", str(out), "--db", url, "--json"])
    summary_json = json.loads(capsys.readouterr().out)
    assert code == 0
    assert {row["key"]: row["implementation"] for row in summary_json["schedules"]} == expected
    assert summary_json["verification"]["passed"]
    peers = {k for k, v in expected.items() if v.endswith(" gemm")}
    assert set((summary_json["peers"] or {}).get("tasks", [])) == peers


@pytest.mark.slow
def test_manifest_entries_are_checked_one_by_one(tuned):
    """What a worker's manifest says is checked before it is stored: unknown tasks, records that
    are not stored, and times that are not finite and positive are dropped and counted."""
    storage, prepared, summary, manifest = tuned
    target = storage.get_target(prepared.target.key)
    ids = storage.workload_ids([t.key for t in prepared.partition.tasks])
    good = next(
        e
        for e in manifest["remeasured"]
        if sum("peer" not in c and "default" not in c for c in e["candidates"]) >= 2
    )
    good = {
        **good,
        "candidates": [c for c in good["candidates"] if "peer" not in c and "default" not in c],
    }
    bad_times = {**good, "candidates": [{**good["candidates"][0], "rounds_ms": [1.0, -2.0]}]}
    nan_times = {**good, "candidates": [{**good["candidates"][0], "rounds_ms": ["nan"]}]}
    unknown_record = {**good, "candidates": [{**good["candidates"][0], "trace_hash": "0" * 64}]}
    too_many = {**good, "candidates": good["candidates"] * 9}
    entries = [
        good,
        {"key": "nope", "candidates": good["candidates"]},
        bad_times,
        nan_times,
        unknown_record,
        too_many,
        "junk",
        {"key": good["key"]},
    ]
    items, dropped = parse_remeasurements(
        storage,
        entries,
        target_id=target.id,
        job_id=summary.job_id,
        workload_ids=ids,
        worker="w",
    )
    assert len(items) == len(good["candidates"]) and dropped == 7
    assert parse_remeasurements(
        storage,
        {"not": "a list"},
        target_id=target.id,
        job_id=summary.job_id,
        workload_ids=ids,
        worker="w",
    ) == ([], 1)


def test_settings_are_checked(monkeypatch):
    monkeypatch.setenv("TUNEHUB_REMEASURE_TOP", "x")
    with pytest.raises(ValueError, match="TUNEHUB_REMEASURE_TOP"):
        RemeasureConfig.from_env()
    monkeypatch.setenv("TUNEHUB_REMEASURE_TOP", "1")
    assert not RemeasureConfig.from_env().enabled
    with pytest.raises(ValueError, match="finite, positive"):
        db.NewRemeasurement(record_id=1, rounds_secs=(0.0,))


@pytest.mark.skipif(peer_library() is None, reason="no peer library on this machine")
def test_every_peer_variant_is_a_candidate_and_the_fastest_is_built(tmp_path):
    """A 3x3 stride-1 convolution has five peer variants (im2col on the packed GEMM or on
    OpenBLAS, Winograd F(2x2), F(4x4), oneDNN's where the peer library has it):
    each is timed side by side with the default schedule, and the build's ``peers`` names the
    variant that won; the artifact built with it matches ONNX Runtime."""
    from compiler.build.builder import build  # noqa: PLC0415
    from compiler.build.runner import LoadedLibrary  # noqa: PLC0415
    from compiler.build.verify import verify  # noqa: PLC0415
    from compiler.peers import peer_variants  # noqa: PLC0415
    from compiler.peers.library import onednn_available  # noqa: PLC0415
    from tests.compiler.test_peers import conv_model  # noqa: PLC0415
    from tuner.final_build.remeasure import peer_keys, remeasure_tasks  # noqa: PLC0415

    path = tmp_path / "conv.onnx"
    path.write_bytes(conv_model(64, 64, 16, 3, 1, 1).SerializeToString())
    prepared = prepare_model(path, cpu_target())
    ((task, extracted),) = [
        (t, e)
        for t, e in zip(prepared.partition.tasks, prepared.partition.extracted)
        if "conv" in t.name
    ]
    variants = peer_variants(extracted.dispatched[0])
    onednn = {"onednn"} if onednn_available() else set()
    assert {v.algorithm for v in variants} == {
        "packed",
        "im2col",
        "winograd_f2",
        "winograd_f4",
        *onednn,
    }
    remeasured = remeasure_tasks(prepared, {}, RemeasureConfig(top=2, rounds=2))
    candidates = remeasured[task.key].candidates
    assert sorted(c.peer["algorithm"] for c in candidates if c.peer) == sorted(
        v.algorithm for v in variants
    )
    # each says which library it ran (what its library record stores)
    assert all(
        c.peer["library"] == ("onednn" if c.peer["algorithm"] == "onednn" else "openblas")
        for c in candidates
        if c.peer
    )
    assert sum(c.default is not None for c in candidates) == 1
    assert all(len(c.rounds_secs) == 2 for c in candidates)
    peers = peer_keys(remeasured)
    winner = remeasured[task.key].winner
    assert (task.key in peers) == (winner.peer is not None)
    if task.key in peers:
        assert peers[task.key].algorithm == winner.peer["algorithm"]
    from tvm.s_tir import meta_schedule as ms  # noqa: PLC0415

    executable = build(prepared.mod, prepared.target, ms.database.MemoryDatabase(), peers=peers)
    loaded = LoadedLibrary.from_executable(executable, "cpu")
    assert verify(prepared.model, loaded.run).passed
