"""The model path up to tuning: load → validate → import → partition, in one call."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from compiler.importer import import_model
from compiler.loader import load_model
from compiler.model_spec import LoadedModel, ModelFormat, ModelLimits
from compiler.partition import Partition, partition
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
    expected_format: ModelFormat | None = None,
) -> PreparedModel:
    """Load, validate, import and partition a model for ``target``.

    Raises :class:`compiler.errors.ModelError` (or its subclass for unsupported operators) for
    anything wrong with the input.
    """
    model = load_model(
        source, limits=limits, input_shapes=input_shapes, expected_format=expected_format
    )
    mod = import_model(model)
    return PreparedModel(model, mod, partition(mod, target), target)
