"""Exchange records with MetaSchedule JSON databases (``tunehub db import/export DIR``).

A MetaSchedule JSON database is a directory with ``database_workload.json`` (one line per
workload: ``[structural_hash, base64 module]``) and ``database_tuning_record.json`` (one line per
record: ``[workload_index, [trace, run_secs, target, args_info]]``), as written by
``ms.database.JSONDatabase``.

Import merges best-of: records are identified by (workload, target, trace hash), so importing the
same directory twice, or a directory that overlaps the database, adds nothing and keeps the better
measurement of each schedule. Records whose own target differs from the import target (another
``mcpu``, core count or GPU) are skipped unless ``any_target=True``: they are not evidence for
this hardware. Export writes every record (valid and failed) of one target.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm.s_tir import meta_schedule as ms

from compiler.keys import workload_key
from compiler.target import TargetSpec
from db.base import TuningStorage
from db.metaschedule_database import describe_workload, estimate_flops, same_target
from db.types import NewTuningRecord, TargetRecord, dumps_compact

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


@dataclass(frozen=True)
class ImportReport:
    workloads_read: int
    workloads_new: int
    records_read: int
    records_new: int
    records_other_target: int


@dataclass(frozen=True)
class ExportReport:
    workloads: int
    records: int
    directory: str


def _lines(path: Path) -> Iterator[tuple[int, object]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not JSON ({err.msg})") from err


def import_json_database(
    storage: TuningStorage,
    directory: str | os.PathLike,
    target: TargetSpec | TargetRecord,
    *,
    any_target: bool = False,
    batch_size: int = 2000,
    worker: str | None = None,
) -> ImportReport:
    """Merge a MetaSchedule JSON database into ``storage`` under ``target``.

    Raises:
        FileNotFoundError: a file is missing.
        ValueError: a line is not a valid workload or record (the message names file and line).
    """
    directory = Path(directory)
    spec = target.spec() if isinstance(target, TargetRecord) else target
    target_row = storage.ensure_target(spec)
    workload_path, record_path = directory / WORKLOAD_FILE, directory / RECORD_FILE
    for path in (workload_path, record_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist (not a MetaSchedule JSON database?)")

    index_to_id: list[int] = []
    workloads_new = 0
    for number, obj in _lines(workload_path):
        try:
            mod = ms.database.Workload.from_json(obj).mod
        except Exception as err:  # noqa: BLE001 - TVM raises assorted errors on bad input
            raise ValueError(f"{workload_path}:{number}: not a MetaSchedule workload") from err
        key = workload_key(mod)
        known = storage.workload_ids([key])
        if key in known:
            index_to_id.append(known[key])
            continue
        mod_json = tvm.ir.save_json(mod)
        row = storage.ensure_workload(
            key, mod_json, flops=estimate_flops(mod), summary=describe_workload(mod, mod_json)
        )
        workloads_new += 1
        index_to_id.append(row.id)

    before = storage.count_records(target_id=target_row.id)
    batch: list[NewTuningRecord] = []
    records_read = other_target = 0
    target_checked: dict[str, bool] = {}
    for number, obj in _lines(record_path):
        records_read += 1
        try:
            index, entry = obj  # type: ignore[misc]
            record_target = entry[2]
            workload_id = index_to_id[int(index)]
            record = NewTuningRecord.from_metaschedule_json(
                workload_id, target_row.id, entry, worker=worker
            )
        except (TypeError, ValueError, IndexError) as err:
            raise ValueError(f"{record_path}:{number}: not a MetaSchedule tuning record") from err
        if record_target is not None and not any_target:
            text = json.dumps(record_target, sort_keys=True)
            if text not in target_checked:
                target_checked[text] = same_target(spec.target_json, record_target)
            if not target_checked[text]:
                other_target += 1
                continue
        batch.append(record)
        if len(batch) >= batch_size:
            storage.commit_records(batch)
            batch = []
    storage.commit_records(batch)
    after = storage.count_records(target_id=target_row.id)
    return ImportReport(
        workloads_read=len(index_to_id),
        workloads_new=workloads_new,
        records_read=records_read,
        records_new=after - before,
        records_other_target=other_target,
    )


def export_json_database(
    storage: TuningStorage,
    directory: str | os.PathLike,
    target: TargetSpec | TargetRecord,
    *,
    valid_only: bool = False,
) -> ExportReport:
    """Write ``target``'s workloads and records as a MetaSchedule JSON database.

    Existing files in ``directory`` are replaced (each written to a temporary file first).
    ``ms.database.JSONDatabase(work_dir=directory)`` reads the result.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    spec = target.spec() if isinstance(target, TargetRecord) else target
    target_row = storage.get_target(spec.key)
    target_obj = json.loads(spec.target_json)
    workloads = [] if target_row is None else storage.list_workloads(target_id=target_row.id)
    index = {w.id: i for i, w in enumerate(workloads)}

    def write(name: str, lines: Iterator[str]) -> int:
        count = 0
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                for line in lines:
                    handle.write(line)
                    handle.write("\n")
                    count += 1
            os.replace(tmp, directory / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return count

    def workload_lines() -> Iterator[str]:
        for w in workloads:
            yield dumps_compact(ms.database.Workload(tvm.ir.load_json(w.mod_json)).as_json())

    def record_lines() -> Iterator[str]:
        if target_row is None:
            return
        for r in storage.iter_records(target_id=target_row.id, valid_only=valid_only):
            run_secs = None if r.run_secs is None else list(r.run_secs)
            entry = [
                json.loads(r.trace_json),
                run_secs,
                target_obj,
                json.loads(r.args_info_json),
            ]
            yield dumps_compact([index[r.workload_id], entry])

    n_workloads = write(WORKLOAD_FILE, workload_lines())
    n_records = write(RECORD_FILE, record_lines())
    return ExportReport(workloads=n_workloads, records=n_records, directory=str(directory))
