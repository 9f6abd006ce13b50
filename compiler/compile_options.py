"""How a CPU target lowers convolutions and weights: the target-level compile options.

A :class:`CompileOptions` says which layout convolutions are tuned and built in and whether
weights are prepacked (see :mod:`compiler.lowering.conv_layout` and
:mod:`compiler.lowering.prepack`). It is part of the CPU target's fingerprint (``"compile"``), hence
of :attr:`TargetSpec.key`: records tuned under one set of options are never evidence for another
(their workload keys differ anyway), and tuning and the final build read the same options off the
same :class:`TargetSpec`, so they always produce the same task keys.

:data:`CPU_DEFAULT` is the choice for every CPU target, decided by measurement
(``bench/bench_levers.py``; ``bench/results/levers_2026-12-01.md``, an 8-thread Xeon
``emeraldrapids``, 64 trials per variant, random cost model, one seed): ResNet-18's 3x3 conv
64→64 at 56² ran 0.939 ms in NCHW, 0.879 prepacked, 0.802 in NHWC and 0.441 in NHWC prepacked,
against 0.498 in ONNX Runtime, side by side; an earlier run (``../shared/STACK.md``) had the
256→256 conv at 14² 2.8–2.9x faster in NHWC or prepacked than in NCHW. MobileNetV2's depthwise
3x3 (144 ch, 56²) was about equal in every variant (NCHW 0.059 ms, NHWC prepacked 0.064, ONNX
Runtime 0.131), so one global layout costs it nothing. Whole ResNet-18 on a 2-thread Zen 3, 100
trials per path side by side (``bench/results/models_2026-12-01.md``): 162.5 ms NCHW, 78.1 ms NHWC
prepacked. BERT's dense case is not measured yet. It is one constant for all CPU targets (only one
CPU has been measured); a target's options are fixed when its spec is made, so tuning and the
final build always agree. A stored target without the
``"compile"`` field (made before these options existed) means :data:`LEGACY`: NCHW, no
prepacking, the path its records were tuned with. CUDA targets carry no options and keep their
own path (DLight fallbacks, tensor-core spaces).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from compiler.weights.weight_formats import WEIGHT_FORMATS

ConvLayout = Literal["NCHW", "NHWC"]
_LAYOUTS: tuple[str, ...] = ("NCHW", "NHWC")


@dataclass(frozen=True)
class CompileOptions:
    """``conv_layout``: the data layout of every 2-D convolution (``"NCHW"`` as imported, or
    ``"NHWC"`` with ``HWIO`` weights). ``prepack``: weights are marked layout-free before task
    extraction (MetaSchedule's ``RewriteLayout`` may tile them) and the tiling is folded into the
    constants at build time. ``weights``: the weight format applied at load, one of
    :data:`compiler.weights.weight_formats.WEIGHT_FORMATS` (a user's choice, not measured: ``q8_0``
    changes the model's numbers). A target of another weight format is another target, so its
    jobs and records never mix with the float32 model's."""

    conv_layout: ConvLayout = "NCHW"
    prepack: bool = False
    weights: str = "as_exported"

    def __post_init__(self) -> None:
        if self.conv_layout not in _LAYOUTS:
            raise ValueError(f"conv_layout must be one of {_LAYOUTS}, got {self.conv_layout!r}")
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f"weights must be one of {WEIGHT_FORMATS}, got {self.weights!r}")

    @property
    def is_legacy(self) -> bool:
        """True for the path TuneHub took before these options (plain ``compile_relax``)."""
        return self == LEGACY

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"conv_layout": self.conv_layout, "prepack": self.prepack}
        if self.weights != "as_exported":  # absent as before: the keys of existing targets hold
            out["weights"] = self.weights
        return out

    @staticmethod
    def from_json(data: dict[str, Any] | None) -> CompileOptions:
        """Options from a fingerprint's ``"compile"`` field; ``None`` (absent) is :data:`LEGACY`."""
        if not data:
            return LEGACY
        return CompileOptions(
            conv_layout=str(data.get("conv_layout", "NCHW")),  # type: ignore[arg-type]
            prepack=bool(data.get("prepack", False)),
            weights=str(data.get("weights", "as_exported")),
        )

    def describe(self) -> str:
        weights = "" if self.weights == "as_exported" else f", weights {self.weights}"
        return f"{self.conv_layout}{' prepacked' if self.prepack else ''}{weights}"


LEGACY = CompileOptions("NCHW", False)

#: The options of every CPU target (:func:`compiler.target.cpu_target`); see the module docstring.
CPU_DEFAULT = CompileOptions("NHWC", True)
