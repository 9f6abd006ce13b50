"""Loading untrusted ``.pt2`` files (``torch.export.save`` archives) without running code from them.

Why this package exists -- what ``torch.export.load`` really does in PyTorch 2.13
==================================================================================

Read from the installed sources (``torch/export/__init__.py``,
``torch/export/pt2_archive/_package.py``, ``torch/_export/serde/serialize.py``,
``torch/serialization.py``, ``torch/export/_unlift.py``):

* ``torch.export.load`` (``torch/export/__init__.py``) calls ``pt2_archive._package.load_pt2``. If
  that raises ``RuntimeError`` it logs the error and falls back to the pre-2.8 layout (top-level
  ``serialized_*.json`` / ``serialized_*.pt`` members read with :mod:`zipfile`).
* Plain weights and constants are **not** pickled in 2.13: ``_package_state_dict`` /
  ``_package_constants`` write the raw storage bytes (``data/weights/weight_N``,
  ``data/constants/tensor_N``) and describe them in ``data/weights/<model>_weights_config.json`` /
  ``data/constants/<model>_constants_config.json``. The graph itself is JSON
  (``models/<model>.json``).
* Pickles are still read, and **not** safely:

  - ``_package._load_state_dict`` / ``_load_constants``: an entry whose config says
    ``"use_pickle": true`` (tensor subclasses) is read with
    ``torch.load(io.BytesIO(...), weights_only=False)`` -- the full, code-executing unpickler;
    legacy ``data/weights/<model>.pt`` / ``data/constants/<model>.pt`` go to
    ``deserialize_torch_artifact`` (below).
  - ``_package._load_constants``: ``data/constants/opaque_obj_N`` -> plain ``pickle.loads``;
    ``data/constants/custom_obj_N`` -> ``torch._C._pickle_load_obj`` (TorchScript/torchbind
    unpickler).
  - ``serialize.deserialize_torch_artifact`` (used for ``data/sample_inputs/<model>.pt``, which
    every genuine archive contains as a nested ``torch.save`` zip): tries
    ``torch.load(weights_only=True)`` and, on **any** exception, retries with
    ``torch.load(weights_only=False)``. So a malicious sample-inputs pickle is refused by the
    weights-only unpickler and then executed by the fallback.
  - ``torch.load(weights_only=False)`` on a zip that looks like TorchScript dispatches to
    ``torch.jit.load``.
  - ``load_pt2`` loads an AOTInductor package (``data/aotinductor/<model>/...``, a compiled shared
    library) whenever such members exist: native code from the file.
* Not pickle, but code from the file all the same:

  - ``serialize.GraphModuleDeserializer._parse_sym_expr`` passes every ``expr_str`` string of the
    JSON to ``sympy.sympify``, which ``eval``\\ s it: ``"__import__('os').system(...)"`` runs during
    ``torch.export.load`` (verified with torch 2.13 / sympy 1.14).
  - ``guards_code`` strings from the JSON are pasted into Python source and ``exec``\\ d by
    ``torch/export/_unlift.py:_convert_guards_code_to_fn`` when ``ep.module()`` is built; the guard
    expressions then run on every call of that module.
  - ``call_function`` targets are looked up by dotted name from ``torch``/``operator``/``math`` (so
    ``"torch.os.system"`` resolves); the ``torch._export.verifier.Verifier`` run by
    ``ExportedProgram`` rejects non-operator targets, and :func:`load_exported_program` re-checks
    this.

What this package does about it
===============================

1. :func:`inspect_pt2_archive` examines the raw bytes before torch sees them: zip structure and
   limits, member names, that every member torch would unpickle is a pickle (or a nested
   ``torch.save`` zip whose ``data.pkl`` is) referencing only :data:`ALLOWED_GLOBALS` with data-only
   opcodes, no opaque/torchbind objects, no AOTInductor payload, and that every ``expr_str`` /
   ``guards_code`` string is a plain arithmetic expression over an allowlist of names.
2. :func:`load_exported_program` runs the inspection and then calls ``torch.export.load`` inside
   :func:`~compiler.frontends.pt2_safety.hardened._hardened_torch_loading`, which for the duration
   of the call forces ``torch.load`` to ``weights_only=True`` (so the ``weights_only=False`` call
   sites and the fallback above reach only the weights-only unpickler), makes ``pickle.loads`` in
   ``_package`` / ``torch._C._pickle_load_obj`` / ``torch.jit.load`` / AOTInductor loading raise,
   re-validates every string handed to ``sympy.sympify`` by the deserializer, and never reads
   the sample inputs (``data/sample_inputs/``: torch is handed empty ones, so the program's
   ``example_inputs`` is ``None``). Nothing needs them to compile, and a genuine archive's may
   pickle objects that are not tensors (``transformers``' ``export_with_dynamic_cache`` pickles a
   ``DynamicCache``): they are accepted as bytes that are never unpickled, whatever they hold.
   A pytree type of the program's signature that this process does not know (that same
   ``DynamicCache``) is deserialized as an opaque stand-in (the graph is flat tensors), and a
   pytree context that names an enum (which torch would import by name) is refused. So if the
   scanner had a gap, torch's weights-only unpickler is a second barrier for pickles (the tests
   check both layers separately). The patches are process-wide while a load runs (loads are
   serialized by a lock); other threads' ``torch.load`` calls in that window are weights-only
   too.

``tests/compiler/test_pt2_safety.py`` shows plain ``torch.export.load`` executing payloads through
the sample-inputs fallback, a ``use_pickle`` weight, an opaque constant and an ``expr_str``, and the
same files being refused here -- with and without the scanner.

The modules, one concern each
-----------------------------
- :mod:`~compiler.frontends.pt2_safety.constants`: the limits and torch 2.13's archive layout;
- :mod:`~compiler.frontends.pt2_safety.pickles`: the pickle scanner and its allowlist of
  globals/opcodes;
- :mod:`~compiler.frontends.pt2_safety.expressions`: the ``expr_str`` / ``guards_code`` validators;
- :mod:`~compiler.frontends.pt2_safety.zipcheck`: the zip container (structure, names, sizes, CRCs);
- :mod:`~compiler.frontends.pt2_safety.archive`: the ``.pt2`` layout on top of it
  (:func:`inspect_pt2_archive`);
- :mod:`~compiler.frontends.pt2_safety.hardened`: the patches on torch while a load runs;
- :mod:`~compiler.frontends.pt2_safety.loading`: the entry points (:func:`load_exported_programs`).

Error codes (all :class:`~compiler.errors.ModelError`)
------------------------------------------------------
``bad_pt2`` not a zip / corrupt / malformed pickle or JSON / torch failed to load it;
``pt2_truncated`` the archive is cut short; ``pt2_too_large`` sizes over the limits or a zip bomb;
``pt2_too_many_members``; ``pt2_too_many_programs`` more programs than the limit (checked before
any is loaded); ``pt2_bad_member_name`` absolute path, ``..``, duplicate or otherwise
unsafe member name; ``pt2_symlink``; ``unsafe_pickle`` a pickle that references a global outside the
allowlist or uses a non-data opcode; ``unsafe_pt2`` code-bearing content that is not a pickle
(AOTInductor library, TorchScript, executable expressions in the JSON).
``unsupported_ops`` the graph calls an operator PyTorch does not define (one that a library such as
``transformers`` registers when imported), so torch cannot load it.

Residual trust: ``torch._C.PyTorchFileReader`` (miniz) still parses the zip, and the weights-only
unpickler and JSON deserializer still run on the (checked) content; attribute look-ups of dotted
operator names may import torch submodules (torch's own code).
"""

from compiler.frontends.pt2_safety.archive import Pt2ArchiveReport, Pt2Member, inspect_pt2_archive
from compiler.frontends.pt2_safety.constants import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_PROGRAMS,
    DEFAULT_MAX_UNCOMPRESSED_BYTES,
)
from compiler.frontends.pt2_safety.expressions import validate_guard_code, validate_sympy_expr
from compiler.frontends.pt2_safety.loading import load_exported_program, load_exported_programs
from compiler.frontends.pt2_safety.pickles import ALLOWED_GLOBALS, PickleScan, scan_pickle

__all__ = [
    "ALLOWED_GLOBALS",
    "DEFAULT_MAX_MEMBERS",
    "DEFAULT_MAX_PROGRAMS",
    "DEFAULT_MAX_UNCOMPRESSED_BYTES",
    "PickleScan",
    "Pt2ArchiveReport",
    "Pt2Member",
    "inspect_pt2_archive",
    "load_exported_program",
    "load_exported_programs",
    "scan_pickle",
    "validate_guard_code",
    "validate_sympy_expr",
]
