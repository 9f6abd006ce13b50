"""Lowering: the target-dependent Relax and TIR passes that tuning and the final build share.

:mod:`compiler.lowering.pipeline` is the one pass sequence (tasks are keyed by the structural
hash of what it produces, so tuning and the build must run the same one); its steps are the
modules beside it: the convolution layout (:mod:`~compiler.lowering.conv_layout`), prepacked
weights (:mod:`~compiler.lowering.prepack`), vectorizable transcendental ops
(:mod:`~compiler.lowering.fast_math`), TVM's default schedules for tasks without a record
(:mod:`~compiler.lowering.default_schedules`, with the CUDA rules of
:mod:`~compiler.lowering.gpu_gemv` and :mod:`~compiler.lowering.gpu_split_reduction`), the tensor
intrinsics a target needs (:mod:`~compiler.lowering.intrinsics`) and TVM's pattern rewrite without
its cost in a model's weights (:mod:`~compiler.lowering.relax_rewrite`, which the frontends use
too). The library peers that the pipeline applies are a role of their own,
:mod:`compiler.peers`. This file imports nothing: importing the package does not import TVM.
"""
