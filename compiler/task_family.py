"""Which tuning tasks belong to one operator family (nothing here imports TVM).

Relax's FuseOps names a fused function after its operators and numbers repeated names, so the
tasks of one family compute the same operators on different shapes. The search seeds a task
from its faster siblings (:mod:`tuner.engine.siblings`) and the cost model transfers between them
(:mod:`cost_model.transfer`); both group tasks with :func:`workload_family`.
"""

from __future__ import annotations

import re


def workload_family(task_name: str) -> str:
    """The operator family of a tuning task: its name without the numeric suffix of each fused
    operator (``fused_conv2d3_add3_add4_relu2`` -> ``fused_conv2d_add_add_relu``)."""
    return re.sub(r"\d+(?=_|$)", "", task_name)
