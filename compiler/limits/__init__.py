"""Limits: the bounds on what an untrusted model may make TuneHub compute while it is imported.

:mod:`compiler.limits.graph_limits` bounds an ONNX graph's node count and compile-time constants
from the graph alone, before TVM sees it, with the small shape values of
:mod:`~compiler.limits.shape_values` computed in plain numpy;
:mod:`~compiler.limits.constant_limits` is the bound behind it for both formats, on the Relax
module after each folding step. The bounds themselves are ``ModelLimits``
(:mod:`compiler.frontends.model_spec`). This file imports nothing (``graph_limits`` and
``shape_values`` do not import TVM either).
"""
