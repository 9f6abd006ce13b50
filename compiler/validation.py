"""Validate an uploaded model file and describe it as plain data (no TVM objects).

:func:`validate_upload` is what the service runs, in a separate process, on every upload: the same
load -> validate -> import -> partition as :func:`compiler.prepare.prepare_model`, with external
data refused whatever it names (an upload's folder is the service's staging area). The result is
a :class:`ValidatedModel` of plain values that crosses a process boundary by pickle: the model's
description, its tuning tasks and each task's workload as ``tvm.ir.save_json`` text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compiler.frontends.model_spec import ModelFormat, ModelLimits
from compiler.partition import TaskInfo
from compiler.shapes.buckets import BucketSpec
from compiler.target import TargetSpec


@dataclass(frozen=True)
class ValidatedModel:
    """An accepted upload: format, content hash and size, and its tasks with their workloads
    (``workload_json[i]`` is ``tvm.ir.save_json`` of ``tasks[i]``'s dispatched TIR module)."""

    format: ModelFormat
    sha256: str
    size_bytes: int
    tasks: tuple[TaskInfo, ...]
    workload_json: tuple[str, ...]
    #: A symbolic model's shape buckets (``ShapeBuckets.to_json()``), ``None`` for a static one.
    buckets: dict[str, Any] | None = None


def validate_upload(
    path: Path,
    target: TargetSpec,
    *,
    limits: ModelLimits,
    expected_format: ModelFormat | None = None,
    display_name: str = "<upload>",
    buckets: Mapping[str, BucketSpec] | None = None,
) -> ValidatedModel:
    """Load, validate, import and partition the uploaded file at ``path`` for ``target``.

    External data is refused; messages name the file ``display_name``. A model with symbolic
    dimensions is validated with its shape ``buckets`` (:mod:`compiler.shapes.buckets`; defaults for
    a symbol given none). Raises :class:`compiler.errors.ModelError` for anything wrong with
    the file or the buckets.
    """
    import tvm  # noqa: PLC0415 - TVM in the validating child only

    from compiler.prepare import prepare_model  # noqa: PLC0415 - as above

    prepared = prepare_model(
        path,
        target,
        limits=limits,
        expected_format=expected_format,
        allow_external_data=False,
        display_name=display_name,
        buckets=buckets,
    )
    spec = prepared.model.bucket_spec
    return ValidatedModel(
        format=prepared.model.format,
        sha256=prepared.model.sha256,
        size_bytes=prepared.model.size_bytes,
        tasks=prepared.partition.tasks,
        workload_json=tuple(
            tvm.ir.save_json(task.dispatched[0]) for task in prepared.partition.extracted
        ),
        buckets=None if spec is None else spec.to_json(),
    )
