"""One of several processes committing at once (run by test_db_concurrency.py).

Usage: python commit_worker.py URL WORKLOAD_ID TARGET_ID WORKER_INDEX GO_FILE N_SHARED N_UNIQUE
Commits N_SHARED traces that every worker also commits (with its own timings) and N_UNIQUE traces
of its own, alternating single-record transactions and small batches.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import db


def shared_secs(j: int, worker: int) -> float:
    return 1e-3 * (1 + ((j * 7 + worker * 13) % 17) / 10)


def main() -> None:
    url, workload_id, target_id, worker, go_file, n_shared, n_unique = sys.argv[1:8]
    workload_id, target_id, worker = int(workload_id), int(target_id), int(worker)
    storage = db.open_storage(url)
    records = []
    for j in range(int(n_shared)):
        records.append(
            db.NewTuningRecord(
                workload_id,
                target_id,
                f'[["shared",{j}]]',
                (shared_secs(j, worker),),
                worker=f"w{worker}",
            )
        )
    for j in range(int(n_unique)):
        records.append(
            db.NewTuningRecord(
                workload_id,
                target_id,
                f'[["w{worker}",{j}]]',
                (2e-3 + j * 1e-6,),
                worker=f"w{worker}",
            )
        )
    # Interleave so that shared traces collide with other workers throughout.
    records = records[::2] + records[1::2]
    deadline = time.monotonic() + 120
    while not Path(go_file).exists():
        if time.monotonic() > deadline:
            raise SystemExit("no go signal")
        time.sleep(0.005)
    i = 0
    while i < len(records):
        if (i // 10) % 2 == 0:
            storage.commit_record(records[i])
            i += 1
        else:
            storage.commit_records(records[i : i + 10])
            i += 10
    storage.close()
    print("done", worker)


if __name__ == "__main__":
    main()
