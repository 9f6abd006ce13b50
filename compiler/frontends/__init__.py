"""Frontends: from a user's model file to one canonical Relax module.

:mod:`compiler.frontends.loader` detects the format and loads the file (ONNX through
:mod:`~compiler.frontends.onnx_loader`; a ``.pt2`` archive opened only through
:mod:`~compiler.frontends.pt2_safety`, its inputs described by
:mod:`~compiler.frontends.pt2_loader` and its operators checked and translated by
:mod:`~compiler.frontends.pt2_ops`) into the plain description of
:mod:`~compiler.frontends.model_spec`; :mod:`~compiler.frontends.importer` imports it into Relax,
folding what depends on constants only (:mod:`~compiler.frontends.fold_constants`) and bringing
both formats to one form (:mod:`~compiler.frontends.canonicalize`), so that one network's tasks
share keys whatever it was exported as. This file imports nothing: each module imports TVM or
torch only where it did before (the loader, ``onnx_loader`` and ``model_spec`` import neither).
"""
