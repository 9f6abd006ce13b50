"""Helpers for the issue-18 tests: a one-task job on a real server and a worker speaking the
protocol by hand (httpx), with real traces of the leased workload."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.service.conftest import Server, upload


def cpu(cores: int):
    from compiler.target import cpu_target

    return cpu_target(cores)


def worker_body(name: str, cores: int = 1) -> dict:
    target = cpu(cores)
    return {
        "name": name,
        "target": {
            "kind": target.kind,
            "target_json": target.target_json,
            "fingerprint_json": target.fingerprint_json,
            "tvm_version": target.tvm_version,
        },
    }


def register(client: httpx.Client, name: str, cores: int = 1) -> str:
    reply = client.post("/workers/register", json=worker_body(name, cores))
    assert reply.status_code == 200, reply.text
    return reply.json().get("instance")  # None before issue 18 (no instances)


def matmul_file(folder: Path, rows: int = 8, inner: int = 32, cols: int = 16) -> Path:
    import onnx

    from tests.onnx_factory import matmul_model

    path = folder / f"matmul-{rows}-{inner}-{cols}.onnx"
    onnx.save(matmul_model(rows=rows, inner=inner, cols=cols), path)
    return path


def _plain(value):
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    try:
        return [_plain(v) for v in value]
    except TypeError:
        return value.value if hasattr(value, "value") else str(value)


def records_for(mod_json: str, n: int, secs: float = 1e-4) -> list[dict]:
    """``n`` distinct real records of the workload (loop splits), each ``secs`` long."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    mod = tvm.ir.load_json(mod_json)
    args = _plain([a.as_json() for a in ms.arg_info.ArgInfo.from_entry_func(mod, True)])
    out = []
    for factor in (1, 2, 4, 8, 16, 32, 64)[:n]:
        sch = tvm.s_tir.Schedule(mod)
        func = next(gv.name_hint for gv in mod.get_global_vars())
        sch.work_on(func)
        block = sch.get_child_blocks(sch.get_sblock("root", func_name=func))[0]
        loops = sch.get_loops(block)
        if factor > 1:
            sch.split(loops[0], factors=[None, factor])
        trace = json.loads(json.dumps(_plain(sch.trace.as_json())))
        out.append({"trace": trace, "run_secs": [secs], "args_info": args})
    assert len(out) == n
    return out


@dataclass
class Leased:
    job_id: int
    offer: dict
    instance: str


def job_with_lease(
    server: Server,
    user: httpx.Client,
    worker: httpx.Client,
    name: str,
    model: Path,
    budget: int = 4,
    cores: int = 1,
) -> Leased:
    """A one-task job of ``model`` on the ``cores``-core CPU target (one per test: no other
    test's jobs are offered) and a tune lease of it held by worker ``name``."""
    created = upload(user, model)
    assert created.status_code in (200, 201), created.text
    instance = register(worker, name, cores)
    job = user.post(
        "/jobs",
        json={"model_id": created.json()["id"], "trial_budget": budget, "target": cpu(cores).key},
    )
    assert job.status_code in (200, 201), job.text
    for _ in range(20):
        offer = worker.post(f"/workers/{name}/lease", params={"instance": instance}).json()["lease"]
        if offer is not None and offer["job_id"] == job.json()["id"] and offer["kind"] == "tune":
            return Leased(job.json()["id"], offer, instance)
        if offer is not None:  # an older job's work: give it back
            worker.post(f"/workers/leases/{offer['lease_id']}/finish", json={"outcome": "returned"})
    raise AssertionError("no lease for the job")


def job_records(server: Server, job_id: int) -> list:
    with server.storage() as storage:
        return storage.list_records(job_id=job_id, limit=10_000)
