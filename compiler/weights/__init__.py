"""Weights: how a model's weights are stored, from load to the artifact.

:mod:`compiler.weights.weight_formats` puts weights on an 8- or 4-bit grid at load (``--weights
q8_0`` / ``q4_0``), :mod:`~compiler.weights.quantized_gather` gathers an embedding table from its
codes (a lowering step), :mod:`~compiler.weights.external` keeps a large model's weights beside its
library (``params.bin``) instead of inside it, and :mod:`~compiler.weights.weight_packing` holds
weights on a grid in that format in the file. This file imports nothing (``weight_formats`` and
``weight_packing`` do not import TVM either).
"""
