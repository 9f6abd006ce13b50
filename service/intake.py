"""Model intake: validate an uploaded file with the compiler, then store it, all or nothing.

Runs in a worker thread, which waits while the validation runs in a memory- and time-limited
child process (:mod:`service.validation`). The order keeps every failure clean: validate the temp
file first (nothing stored yet); then, under a process lock,
move the file into ``models/<sha256>``, add the model row and its task list; if any of that fails,
the row is deleted and the file removed unless another row still uses the content.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from functools import lru_cache

import db
from compiler.errors import ModelError
from compiler.frontends.model_spec import ModelLimits
from compiler.shapes.buckets import BucketSpec
from compiler.target import TargetSpec, resolve_target
from service.files import FileStore
from service.uploads import ReceivedUpload
from service.validation import ValidationLimits, validate_in_child
from tuner.jobs.workloads import register_workloads

#: Serializes file adoption/removal with the rows that reference the files.
FILE_LOCK = threading.Lock()


@lru_cache(maxsize=8)
def _named_target(name: str, weights: str = "as_exported") -> TargetSpec:
    return resolve_target(name, weights=weights)


def target_for(
    storage: db.TuningStorage, name: str, *, weights: str = "as_exported"
) -> db.TargetRecord:
    """``name`` is ``cpu`` (this machine's CPU, with the weight format ``weights``) or the 16-hex
    key of a stored target (which has its own weight format: ``weights`` must be its or the
    default). Raises ``ModelError`` (``bad_target``, ``bad_weights``)."""
    if len(name) == 16 and all(c in "0123456789abcdef" for c in name):
        row = storage.get_target(name)
        if row is None:
            raise ModelError("bad_target", f"no target with key {name!r} is known")
        own = row.spec().compile_options.weights
        if weights not in ("as_exported", own):
            raise ModelError(
                "bad_weights",
                f"target {name} has weights {own}; name 'cpu' with weights {weights} instead",
            )
        return row
    return storage.ensure_target(_named_target(name, weights))


def validate_and_store(
    storage: db.TuningStorage,
    files: FileStore,
    upload: ReceivedUpload,
    *,
    owner: str,
    target: str,
    expected_format: str | None,
    limits: ModelLimits,
    process_limits: ValidationLimits,
    buckets: Mapping[str, BucketSpec] | None = None,
) -> db.ModelRecord:
    """Validate ``upload`` in a limited child process (:mod:`service.validation`) and record it
    for ``owner``, with the shape buckets it was validated with (a model with symbolic
    dimensions: ``buckets``, defaults for a symbol given none). Raises ModelError for a bad
    model or bad buckets (the temp file is removed then)."""
    try:
        spec = target_for(storage, target).spec()
        validated = validate_in_child(
            upload.path,
            spec,
            limits=limits,
            expected_format=expected_format,  # type: ignore[arg-type]
            display_name=upload.filename,
            process_limits=process_limits,
            buckets=buckets,
            tmp_root=files.scratch,
        )
    except BaseException:
        upload.path.unlink(missing_ok=True)
        raise
    content_hash = validated.sha256
    with FILE_LOCK:
        files.adopt_model(upload.path, content_hash)
        model = None
        try:
            model = storage.add_model(
                content_hash=content_hash,
                format=validated.format,
                filename=upload.filename,
                size=validated.size_bytes,
                owner=owner,
                buckets_json=None
                if validated.buckets is None
                else json.dumps(validated.buckets, sort_keys=True),
            )
            register_workloads(storage, validated.tasks, validated.workload_json, model.id)
        except BaseException:
            if model is not None:
                try:
                    storage.delete_model(model.id)
                except db.StorageError:
                    pass
            try:
                in_use = storage.model_content_in_use(content_hash)
            except db.StorageError:
                in_use = True  # cannot tell: keep the file rather than break another model
            if not in_use:
                files.remove_model(content_hash)
            raise
    return model


def delete_model(storage: db.TuningStorage, files: FileStore, model_id: int) -> db.ModelRecord:
    """Delete the row, then the file if no other owner's row has the same content."""
    with FILE_LOCK:
        model = storage.delete_model(model_id)
        if not storage.model_content_in_use(model.content_hash):
            files.remove_model(model.content_hash)
    return model
