"""Plain results of the search that the worker protocol also carries: no pydantic, no TVM.

The tuning engine (:mod:`tuner.engine.search`, :mod:`tuner.engine.siblings`) produces these on every
host, including the GPU machine, which has TVM but not the service's web stack; the protocol
messages of :mod:`tuner.jobs.protocol` (pydantic) embed them as they are (pydantic validates stdlib
dataclasses by their type hints, and ``__post_init__`` checks the rest).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

_COUNT_LIMIT = 10_000_000


@dataclass(frozen=True)
class SiblingSchedule:
    """The best record of one sibling of a task (same fused operators, another shape): replayed
    on the task with tile sizes refitted (:mod:`tuner.task_scheduler.sibling_seeds`).
    ``trace`` is ``TuningRecord.as_json()[0]``; ``mod_json`` ``tvm.ir.save_json`` of the
    sibling's TIR module."""

    record_id: int
    workload_id: int
    mod_json: str
    flops: float
    mean_secs: float
    trace: list[Any] = field(default_factory=list)

    @property
    def rate(self) -> float:
        """The sibling's best FLOP/s."""
        return self.flops / self.mean_secs


@dataclass(frozen=True)
class SearchReport:
    """What the search features did in one tuning run (a lease, or a ``tunehub tune`` run):
    sibling seeds measured and how many of them ran, sibling records that did not replay, seeds
    left out as already stored, candidates dropped because the database held them, default
    schedules measured (GPU), batches drawn without evolution while the cost model ranked at
    random and batches evolved (:mod:`tuner.search_strategy.cold_start`), and the cost model
    used (``transfer`` or ``cold``).

    Raises ``ValueError`` for a count outside 0..10^7 or another cost model.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = {"extra": "forbid"}

    seeds_measured: int = 0
    seeds_valid: int = 0
    seeds_did_not_replay: int = 0
    seeds_already_stored: int = 0
    skipped_stored: int = 0
    default_schedules: int = 0
    cold_batches: int = 0
    evolved_batches: int = 0
    cost_model: Literal["transfer", "cold"] = "cold"

    def __post_init__(self) -> None:
        for name in self.counts():
            value = getattr(self, name)
            if (
                not isinstance(value, int)
                or isinstance(value, bool)
                or not (0 <= value <= _COUNT_LIMIT)
            ):
                raise ValueError(f"{name} must be an integer in 0..{_COUNT_LIMIT}, got {value!r}")
        if self.cost_model not in ("transfer", "cold"):
            raise ValueError(f"cost_model must be 'transfer' or 'cold', got {self.cost_model!r}")

    @classmethod
    def counts(cls) -> list[str]:
        """The names of the counted fields."""
        return [f.name for f in dataclasses.fields(cls) if f.name != "cost_model"]

    def __add__(self, other: SearchReport) -> SearchReport:
        """The two runs' counts summed; the cost model is ``transfer`` if either used it."""
        summed = {name: getattr(self, name) + getattr(other, name) for name in self.counts()}
        kind = "transfer" if "transfer" in (self.cost_model, other.cost_model) else "cold"
        return SearchReport(**summed, cost_model=kind)

    def with_cost_model(self, kind: str) -> SearchReport:
        return dataclasses.replace(self, cost_model=kind)  # type: ignore[arg-type]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json_text(cls, text: str | None) -> SearchReport | None:
        """The report stored as ``text`` (``None`` for none or one that does not parse)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(**data) if isinstance(data, dict) else None
        except (TypeError, ValueError):
            return None
