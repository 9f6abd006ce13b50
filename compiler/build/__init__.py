"""Build and artifact: from a lowered module to a verified artifact folder, and running it.

:mod:`compiler.build.builder` builds a Relax module into a library for a target (with a tuning
database's records, or zero-trial) and exports it; :mod:`~compiler.build.verify` compares a
library with the model's own framework; :mod:`~compiler.build.artifact` publishes ``model.so`` and
``manifest.json``, verified as loaded from disk, all or nothing, where
:mod:`~compiler.build.artifact_layout` says artifacts live; :mod:`~compiler.build.runner` loads an
artifact and runs or times it. This file imports nothing (``artifact_layout`` and ``verify`` do not
import TVM at module level either).
"""
