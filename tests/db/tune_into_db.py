"""Run in a subprocess by test_db_tuning.py: tune the 64x64x64 matmul for 8 trials through
``MetaScheduleDatabase`` into the database at URL, and print a JSON summary.

Usage: python tune_into_db.py URL NUM_CORES

The first TuneContext imports ``tvm.s_tir.tensor_intrin``, whose CUDA and ROCm parts take most
of 40-150 s on this 2-core machine; tuning for an llvm target never uses them, so this process
(and only this process) replaces those two modules with empty stand-ins.
"""

from __future__ import annotations

import json
import sys
import time
import types

for _name in ("cuda", "rocm"):
    _full = f"tvm.s_tir.tensor_intrin.{_name}"
    sys.modules.setdefault(_full, types.ModuleType(_full))

from db_test_helpers import default_callbacks, tune_matmul  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402

import db  # noqa: E402
from compiler.target import cpu_target  # noqa: E402


def main(url: str, cores: int) -> None:
    started = time.perf_counter()
    storage = db.open_storage(url)
    target = cpu_target(cores)
    database = db.MetaScheduleDatabase(storage, target, worker="test-tuner")
    callbacks = default_callbacks() + [db.RecordErrorsCallback(database)]
    assert isinstance(callbacks[0], ms.measure_callback.AddToDatabase)
    tune_matmul(database, target.tvm_target(), trials=8, per_iter=4, callbacks=callbacks)
    print(json.dumps({"records": len(database), "secs": time.perf_counter() - started}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
