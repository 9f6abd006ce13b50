"""The model path up to tuning: load → validate → import → partition, in one call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from compiler.frontends.importer import import_model
from compiler.frontends.loader import load_model
from compiler.frontends.model_spec import LoadedModel, ModelFormat, ModelLimits
from compiler.limits.constant_limits import bounded_folding, check_relax_constants
from compiler.partition import Partition, partition
from compiler.shapes.buckets import BucketSpec
from compiler.target import TargetSpec


@dataclass(frozen=True, eq=False)
class PreparedModel:
    """A model ready to tune and build: the loaded file, its Relax module and its tasks."""

    model: LoadedModel
    mod: tvm.IRModule = field(repr=False)
    partition: Partition
    target: TargetSpec


def prepare_model(
    source: bytes | Path,
    target: TargetSpec,
    *,
    limits: ModelLimits | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    buckets: Mapping[str, BucketSpec] | None = None,
    expected_format: ModelFormat | None = None,
    allow_external_data: bool = True,
    display_name: str | None = None,
) -> PreparedModel:
    """Load, validate, import and partition a model for ``target``.

    ``input_shapes``, ``buckets``, ``allow_external_data`` and ``display_name`` are passed to
    :func:`load_model`, and the target's weight format (``target.compile_options.weights``) with
    them (a model with symbolic dimensions is prepared as one module with a
    function per shape bucket: :mod:`compiler.shapes.bucket_module`). Every tensor
    TVM folds is bounded by ``limits`` (:mod:`compiler.limits.constant_limits`), and running out of
    memory while folding is a ``ModelError("out_of_memory")``. Raises
    :class:`compiler.errors.ModelError` (or its subclass for unsupported operators) for anything
    wrong with the input.
    """
    limits = limits or ModelLimits()
    model = load_model(
        source,
        limits=limits,
        input_shapes=input_shapes,
        buckets=buckets,
        expected_format=expected_format,
        allow_external_data=allow_external_data,
        display_name=display_name,
        weights=target.compile_options.weights,
    )
    with bounded_folding("importing the model"):
        mod = import_model(model)
    check_relax_constants(mod, limits, "importing the model")
    with bounded_folding("partitioning the model into tasks"):
        parts = partition(mod, target, _bucket_shares(model))
    check_relax_constants(parts.fused, limits, "partitioning the model into tasks")
    return PreparedModel(model, mod, parts, target)


def _bucket_shares(model: LoadedModel) -> dict[str, float] | None:
    """Each bucket function's share of the expected inputs, when a histogram gave them."""
    spec = model.bucket_spec
    if not model.buckets or spec is None or not spec.shares:
        return None
    return {
        bucket.function: share for bucket, share in zip(model.buckets, spec.specialization_shares())
    }
