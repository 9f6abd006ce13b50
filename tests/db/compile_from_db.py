"""Run in a NEW process by test_db_tuning.py: compile the matmul from the database only.

Usage: python compile_from_db.py URL NUM_CORES. Prints one JSON object on stdout: the canonical
trace of the schedule MetaSchedule applied, whether the result is numerically right, and what
queries for other targets returned.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tvm
from db_test_helpers import matmul_mod
from tvm.s_tir import meta_schedule as ms

import db
from compiler.target import cpu_target


def main(url: str, cores: int) -> None:
    storage = db.open_storage(url)  # no upgrade: the schema must already be there
    target = cpu_target(cores)
    database = db.MetaScheduleDatabase(storage, target)
    mod = matmul_mod()
    sch = ms.tir_integration.compile_tir(database, mod, target.tvm_target())
    applied = None
    max_err = None
    if sch is not None:
        record = ms.database.TuningRecord(sch.trace, ms.database.Workload(mod))
        applied = db.canonical_trace_json(record.as_json()[0])
        lib = tvm.compile(sch.mod, target=target.tvm_target())
        dev = tvm.cpu()
        rng = np.random.default_rng(0)
        a = rng.random((64, 64), dtype="float32")
        b = rng.random((64, 64), dtype="float32")
        c = tvm.runtime.tensor(np.zeros((64, 64), "float32"), dev)
        lib(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
        max_err = float(np.abs(c.numpy() - a @ b).max())
    other = {}
    for name, spec in {"one_core": cpu_target(1 if cores != 1 else 2)}.items():
        found = ms.tir_integration.compile_tir(database, mod, spec.tvm_target())
        other[name] = None if found is None else "FOUND"
        scoped = db.MetaScheduleDatabase(storage, spec)
        other[name + "_own_db"] = (
            None if scoped.query_tuning_record(mod, spec.tvm_target(), "main") is None else "FOUND"
        )
    print(json.dumps({"applied_trace": applied, "max_abs_err": max_err, "other": other}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
