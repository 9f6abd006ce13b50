"""Which cost model a tuning run uses, and what it reports about it afterwards.

Modes (``tunehub tune --cost-model``, the ``cost_model`` argument of
:func:`tuner.jobs.job.tune_model`):

``auto`` (default)
    the target's persisted transferred model (:func:`cost_model.store.load_model`) when there is
    one for this feature and TVM version, else MetaSchedule's cold ``XGBModel``;
``transfer``
    the persisted model, or :class:`CostModelUnavailable` when there is none;
``cold``
    MetaSchedule's cold ``XGBModel`` (what plain ``tune_relax`` uses; a random model where
    xgboost is not installed, see :func:`tuner.engine.search.default_cost_model`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any

COST_MODEL_MODES = ("auto", "transfer", "cold")


class CostModelUnavailable(ValueError):
    """``--cost-model transfer`` was asked for but the target has no usable persisted model."""


@dataclass
class CostModelChoice:
    """The MetaSchedule cost model of a run plus what to say about it in the summary."""

    model: Any  # a PyCostModel instance, or None: MetaSchedule's default (tuner.engine.search)
    kind: str  # "transfer" or "cold"
    model_id: int | None = None
    trained_on: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """JSON for the run summary: kind, persisted model id and size, guard fallbacks."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "model_id": self.model_id,
            "trained_on_records": self.trained_on,
        }
        log = getattr(self.model, "guard_log", None) if self.kind == "transfer" else None
        if log:
            families = {d.workload: d.family for d in log}
            on_cold = {d.family: d.uses_cold for d in log}  # the last decision for each family
            out["families_on_cold_model"] = sorted(f for f, cold in on_cold.items() if cold)
            out["workloads_on_cold_model"] = sorted(k for k, f in families.items() if on_cold[f])
            out["guard_switches"] = guard_switches(log)
            out["batches_scored"] = len(log)
        return out


def guard_switches(log) -> list[dict[str, Any]]:
    """Every change of model in a guard log, in order: the batch index (0-based, over all
    scored batches), family, the model switched to, and the two window accuracies then."""
    switches, current = [], {}
    for index, decision in enumerate(log):
        if decision.uses_cold != current.get(decision.family, False):
            switches.append(
                {
                    "batch": index,
                    "family": decision.family,
                    "to": "cold" if decision.uses_cold else "transferred",
                    "transfer_accuracy": round(decision.transfer_accuracy, 3),
                    "cold_accuracy": round(decision.cold_accuracy, 3),
                }
            )
        current[decision.family] = decision.uses_cold
    return switches


def choose_cost_model(storage, target, mode: str = "auto") -> CostModelChoice:
    """The cost model for tuning ``target`` (a :class:`compiler.target.TargetSpec`).

    Raises ``ValueError`` for an unknown mode and :class:`CostModelUnavailable` for
    ``transfer`` without a persisted model.
    """
    if mode not in COST_MODEL_MODES:
        raise ValueError(
            f"unknown cost model {mode!r}; choose one of {', '.join(COST_MODEL_MODES)}"
        )
    if mode == "cold":
        return CostModelChoice(None, "cold")
    if importlib.util.find_spec("xgboost") is None:  # e.g. a GPU host with the TVM runtime only
        if mode == "transfer":
            raise CostModelUnavailable("the transferred cost model needs xgboost, not installed")
        return CostModelChoice(None, "cold")
    from cost_model.store import load_model  # noqa: PLC0415 - only with xgboost

    trained = load_model(storage, target)
    if trained is None:
        if mode == "transfer":
            raise CostModelUnavailable(
                f"no trained cost model for target {target.describe()}; "
                "run `tunehub cost-model train` first"
            )
        return CostModelChoice(None, "cold")
    return transfer_choice(trained)


def resolve_cost_model(storage, target, cost_model: str | CostModelChoice) -> CostModelChoice:
    """``cost_model`` itself when it is already a choice, else :func:`choose_cost_model` of
    that mode (same errors)."""
    if isinstance(cost_model, CostModelChoice):
        return cost_model
    return choose_cost_model(storage, target, cost_model)


def transfer_choice(trained) -> CostModelChoice:
    """A fresh :class:`cost_model.transfer.TransferCostModel` (new guard state) for one run."""
    from cost_model.transfer import TransferCostModel  # noqa: PLC0415 - only when used

    model = TransferCostModel(trained.booster, trained.config())
    return CostModelChoice(model, "transfer", trained.model_id, trained.n_samples)
