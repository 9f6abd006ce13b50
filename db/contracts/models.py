"""The contract of uploaded models and their lists of tuning tasks."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from db.types import ModelRecord, ModelWorkload


class ModelStorage(abc.ABC):
    """Uploaded models (by owner and content) and the tuning tasks each one splits into."""

    @abc.abstractmethod
    def add_model(
        self,
        *,
        content_hash: str,
        format: str,
        filename: str,
        size: int,
        owner: str,
        buckets_json: str | None = None,
    ) -> ModelRecord:
        """Record an uploaded model; uploading the same content twice returns the first row.
        ``buckets_json``: the shape buckets it was validated with (a symbolic model)."""

    @abc.abstractmethod
    def get_model(self, model_id: int) -> ModelRecord | None:
        """The model with this id, or ``None``."""

    @abc.abstractmethod
    def list_models(self, *, owner: str | None = None) -> list[ModelRecord]:
        """Models, newest first."""

    @abc.abstractmethod
    def find_model(self, *, owner: str, content_hash: str) -> ModelRecord | None:
        """The model ``owner`` uploaded with this content, or ``None``."""

    @abc.abstractmethod
    def delete_model(self, model_id: int) -> ModelRecord:
        """Delete a model and its task list; its finished jobs keep their rows (``model_id``
        becomes ``None``).

        Raises:
            NotFoundError: no such model.
            ConflictError: a ``queued`` or ``running`` job still uses the model.
        """

    @abc.abstractmethod
    def model_content_in_use(self, content_hash: str) -> bool:
        """Whether any model row (of any owner) has this content (the file is still needed)."""

    @abc.abstractmethod
    def set_model_workloads(self, model_id: int, tasks: Sequence[ModelWorkload]) -> None:
        """Replace the list of tuning tasks of a model."""

    @abc.abstractmethod
    def model_workloads(self, model_id: int) -> list[ModelWorkload]:
        """The tuning tasks of a model."""
