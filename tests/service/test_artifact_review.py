"""Issue 31, case 1: a remote worker's ``model.so`` never runs in the server's trust.

Against a real ``tunehub serve``: a worker speaking the protocol by hand takes a job to its
finalize lease and uploads a library whose load-time constructor writes a marker file and prints
the success word, then exits. With server builds on (the default), the server compiles the
artifact itself from its stored records and publishes that; the worker's library is never
loaded (no marker anywhere). With server builds off, the worker's library runs only in the
sandbox (:mod:`tuner.final_build.sandbox`): printing "verified" decides nothing, the marker cannot
reach the server's storage, a genuine library is published as the worker's and a wrong one is
refused.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.service.conftest import REPO
from tests.service.trust_helpers import job_with_lease, matmul_file, records_for

pytestmark = pytest.mark.slow


def _evil_library(folder: Path, marker: Path) -> Path:
    """A shared library whose constructor writes ``marker``, prints the old check's success
    word and exits 0 while it is being loaded."""
    source = folder / "evil.c"
    source.write_text(
        textwrap.dedent(
            f"""
            #include <stdio.h>
            #include <stdlib.h>
            __attribute__((constructor)) static void evil(void) {{
                FILE *f = fopen("{marker}", "w");
                if (f) {{ fputs("the worker's code ran here", f); fclose(f); }}
                printf("verified\\n");
                fflush(stdout);
                exit(0);
            }}
            """
        )
    )
    library = folder / "evil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def _manifest(**extra) -> str:
    return json.dumps({"verification": {"passed": True}, **extra})


def _finalize_offer(server, user, worker, name: str, model: Path) -> tuple[int, dict, list]:
    """A one-task job of ``model`` tuned by hand (4 real records) up to its finalize lease,
    held by worker ``name``: ``(job id, finalize offer, the records uploaded)``."""
    leased = job_with_lease(server, user, worker, name, model, budget=4)
    good = records_for(leased.offer["mod_json"], 4)
    for i, record in enumerate(good):  # distinct times: the third is the best
        record["run_secs"] = [2e-4 - 5e-5 * (i == 2)]
    reply = worker.post(
        f"/workers/leases/{leased.offer['lease_id']}/records",
        content=json.dumps({"batch": 0, "records": good}),
        headers={"content-type": "application/json"},
    )
    assert reply.status_code == 200, reply.text
    end = worker.post(
        f"/workers/leases/{leased.offer['lease_id']}/finish", json={"outcome": "done"}
    )
    assert end.status_code == 200, end.text
    offer = worker.post(f"/workers/{name}/lease", params={"instance": leased.instance}).json()
    assert offer["lease"] is not None and offer["lease"]["kind"] == "finalize", offer
    return leased.job_id, offer["lease"], good


def _upload(worker, lease_id: int, library: Path, manifest: str):
    files = {
        "library": ("model.so", library.read_bytes(), "application/octet-stream"),
        "manifest": ("manifest.json", manifest, "application/json"),
    }
    return worker.post(f"/workers/leases/{lease_id}/artifact", files=files)


def test_the_server_publishes_its_own_build(serve, tmp_path) -> None:
    server = serve(workers=0)
    marker = tmp_path / "marker"
    evil = _evil_library(tmp_path, marker)
    with (
        server.client(server.token("frank")) as user,
        server.client(server.token("pool-r", kind="worker")) as worker,
    ):
        job_id, offer, good = _finalize_offer(
            server, user, worker, "pool-r-1", matmul_file(tmp_path, 8, 32, 16)
        )
        # The manifest chooses the fourth record (slower as recorded, as if a re-measurement
        # preferred it) for the job's one task: the server follows a choice of stored evidence.
        from db import canonical_trace_json, trace_hash

        chosen = trace_hash(canonical_trace_json(good[3]["trace"]))
        entry = {
            "key": offer["tasks"][0]["workload_key"],
            "name": "task",
            "candidates": [{"trace_hash": chosen, "rounds_ms": [0.15], "chosen": True}],
        }
        reply = _upload(worker, offer["lease_id"], evil, _manifest(remeasured=[entry]))
        assert reply.status_code == 200, reply.text
        job = user.get(f"/jobs/{job_id}").json()
        assert job["status"] == "succeeded", job
        assert job["artifact"]["built_by"] == "server", job["artifact"]
        assert job["artifact"]["verified"], job["artifact"]
        library = user.get(f"/jobs/{job_id}/artifacts/model.so")
        assert library.status_code == 200
        assert (
            hashlib.sha256(library.content).hexdigest()
            != hashlib.sha256(evil.read_bytes()).hexdigest()
        )
        manifest = user.get(f"/jobs/{job_id}/artifacts/manifest.json").json()
        review = manifest["server_review"]
        assert review["built_by"] == "server" and review["kind"] == "server_build", review
        assert review["verified"] and review["same_as_worker"] is False, review
        assert review["worker_sha256"] == hashlib.sha256(evil.read_bytes()).hexdigest()
        assert review["notes"] == [], review  # the chosen record is stored: followed
        assert manifest["verification"]["passed"], manifest["verification"]
        assert manifest["remeasured"] == [entry]
    assert not marker.exists(), "the worker's library was loaded somewhere"


def test_the_server_follows_the_workers_whole_model_choice(serve, tmp_path) -> None:
    """Issue 35: a worker whose final build timed the zero-trial library faster than the tuned
    one published it; the server's own build follows that choice (it times nothing), so users
    download the zero-trial library, built by the server, and its manifest says whose choice."""
    from compiler.build.runner import Timing
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target
    from tuner.final_build.final_choice import decide
    from tuner.final_build.finalize import publish_zero_trial

    server = serve(workers=0)
    marker = tmp_path / "marker"
    evil = _evil_library(tmp_path, marker)
    model = matmul_file(tmp_path, 8, 32, 16)
    rounds = [Timing(s, s, s, 5) for s in (2e-4, 2.1e-4, 1.9e-4)]
    faster = [Timing(s, s, s, 5) for s in (1e-4, 1.1e-4, 0.9e-4)]
    choice = decide(rounds, faster).to_json()
    with (
        server.client(server.token("henry")) as user,
        server.client(server.token("pool-f", kind="worker")) as worker,
    ):
        job_id, offer, _ = _finalize_offer(server, user, worker, "pool-f-1", model)
        reply = _upload(worker, offer["lease_id"], evil, _manifest(final_choice=choice))
        assert reply.status_code == 200, reply.text
        job = user.get(f"/jobs/{job_id}").json()
        assert job["status"] == "succeeded" and job["artifact"]["built_by"] == "server", job
        manifest = user.get(f"/jobs/{job_id}/artifacts/manifest.json").json()
        library = user.get(f"/jobs/{job_id}/artifacts/model.so").content
    assert manifest["server_review"]["kind"] == "server_build", manifest["server_review"]
    assert manifest["verification"]["passed"], manifest["verification"]
    final = manifest["final_choice"]
    assert final["published"] == "zero_trial" and final["decided_by"] == "worker", final
    assert final["tuned_rounds_ms"] == pytest.approx(choice["tuned_rounds_ms"])
    # The very bytes of the model's zero-trial build.
    zero = publish_zero_trial(prepare_model(model, cpu_target()), tmp_path / "zero")
    assert manifest["peers"] == zero["peers"]
    expected = hashlib.sha256((tmp_path / "zero" / "model.so").read_bytes()).hexdigest()
    assert hashlib.sha256(library).hexdigest() == expected
    assert not marker.exists(), "the worker's library was loaded somewhere"


def test_without_server_builds_the_library_runs_only_in_a_sandbox(serve, tmp_path) -> None:
    server = serve(workers=0, env={"TUNEHUB_SERVER_BUILD": "0"})
    model = matmul_file(tmp_path, 8, 32, 16)
    storage_marker = server.storage_dir / "marker"
    with (
        server.client(server.token("gina")) as user,
        server.client(server.token("pool-s", kind="worker")) as worker,
    ):
        job_id, offer, _ = _finalize_offer(server, user, worker, "pool-s-1", model)
        # The constructor prints the old success word and exits: no outputs, refused.
        evil = _evil_library(tmp_path, storage_marker)
        reply = _upload(worker, offer["lease_id"], evil, _manifest())
        assert reply.status_code == 422, reply.text
        assert "server's check" in reply.json()["detail"], reply.text
        assert not storage_marker.exists(), "the sandbox could write the server's storage"
        assert user.get(f"/jobs/{job_id}").json()["status"] == "running"

        # A library of another model with the same shapes: its outputs are wrong, refused.
        import numpy as np
        import onnx
        from onnx import helper, numpy_helper

        from tests.onnx_factory import float_input, make_model

        weight = np.random.default_rng(7).standard_normal((32, 16)).astype(np.float32)
        other = make_model(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            [float_input("x", [8, 32])],
            [float_input("y", [8, 16])],
            [numpy_helper.from_array(weight, "w")],
        )
        onnx.save(other, tmp_path / "other.onnx")
        wrong = _compile(tmp_path / "other.onnx", tmp_path / "wrong")
        reply = _upload(worker, offer["lease_id"], wrong / "model.so", _manifest())
        assert reply.status_code == 422 and "does not match" in reply.json()["detail"], reply.text

        # The worker's genuine build: checked in the sandbox against ONNX Runtime, published
        # as the worker's.
        genuine = _compile(model, tmp_path / "genuine")
        reply = _upload(
            worker, offer["lease_id"], genuine / "model.so", (genuine / "manifest.json").read_text()
        )
        assert reply.status_code == 200, reply.text
        job = user.get(f"/jobs/{job_id}").json()
        assert job["status"] == "succeeded" and job["artifact"]["built_by"] == "worker", job
        manifest = user.get(f"/jobs/{job_id}/artifacts/manifest.json").json()
        review = manifest["server_review"]
        assert review["kind"] == "sandbox_reference" and review["verified"], review
        library = user.get(f"/jobs/{job_id}/artifacts/model.so").content
        assert library == (genuine / "model.so").read_bytes()


def _compile(model: Path, out: Path) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "compile", str(model), "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out
