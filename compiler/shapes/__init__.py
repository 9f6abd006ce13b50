"""Shapes: the static shapes a model with symbolic dimensions is compiled for.

:mod:`compiler.shapes.buckets` parses and chooses the shape buckets (plain Python: no TVM, no
torch), :mod:`~compiler.shapes.bucket_module` merges one Relax function per bucket (or per
program of a multi-program ``.pt2``) into one module, and :mod:`~compiler.shapes.padding` checks
where running an input on a larger bucket, padded, is exact. This file imports nothing.
"""
