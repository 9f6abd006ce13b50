"""The patches on torch while an untrusted ``.pt2`` file loads (:func:`_hardened_torch_loading`):
weights-only ``torch.load``, the pickle, TorchScript and AOTInductor loaders refused, ``sympify``
inputs validated, the sample inputs never read, and pytree types this process does not know
deserialized as opaque stand-ins (:class:`_StandIn`)."""

from __future__ import annotations

import contextlib
import json
import logging
import pickle
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

from compiler.frontends.pt2_safety.constants import SAMPLE_INPUTS_DIR
from compiler.frontends.pt2_safety.expressions import validate_sympy_expr

_LOAD_LOCK = threading.Lock()


class _Refused(RuntimeError):
    """Raised by the hardened hooks when torch tries a code-executing loader."""


def _refuse(what: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise _Refused(f"TuneHub refused {what} while loading an untrusted .pt2 file")

    return refuse


class _RefusingPickleModule:
    """Stand-in for ``pickle`` inside ``torch.export.pt2_archive._package`` during a load."""

    load = staticmethod(_refuse("pickle.load"))
    loads = staticmethod(_refuse("pickle.loads"))

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


class _GuardedSympy:
    """Stand-in for ``sympy`` inside ``torch._export.serde.serialize``: validates sympify'd
    strings."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def sympify(self, a: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(a, str):
            validate_sympy_expr(a, "expr_str")
        return self._real.sympify(a, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _CaptureSwallowedError(logging.Filter):
    """torch.export.load logs load_pt2's RuntimeError and raises a vaguer one; keep the real
    cause."""

    def __init__(self) -> None:
        super().__init__()
        self.cause: BaseException | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.exc_info
            and record.exc_info[1] is not None
            and "deserializing" in str(record.msg)
        ):
            self.cause = record.exc_info[1]
            return False
        return True


@contextlib.contextmanager
def _hardened_torch_loading() -> Iterator[_CaptureSwallowedError]:
    """Patch torch so that a ``torch.export.load`` inside the block cannot reach an unsafe loader.

    Process-wide for the duration of the block (serialized by a lock): any ``torch.load`` call runs
    with ``weights_only=True``; ``pickle.load(s)`` in ``pt2_archive._package``,
    ``torch._C._pickle_load_obj``, ``torch.jit.load`` and AOTInductor loading raise; strings passed
    to ``sympy.sympify`` by the export deserializer are validated first.
    """
    import torch
    import torch._export.serde.serialize as serialize_mod
    import torch.export.pt2_archive._package as package_mod

    real_load = torch.load

    def weights_only_load(
        f: Any, map_location: Any = None, pickle_module: Any = None, **kwargs: Any
    ) -> Any:
        kwargs.pop("weights_only", None)
        mmap = kwargs.pop("mmap", None)
        return real_load(f, map_location=map_location, weights_only=True, mmap=mmap)

    import torch.utils._pytree as pytree

    real_read_bytes = package_mod.PT2ArchiveReader.read_bytes
    real_json_to_treespec = pytree._json_to_treespec  # noqa: SLF001

    def json_to_treespec(schema: Any) -> Any:
        name = schema.get("type") if isinstance(schema, dict) else None
        known = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
        if not isinstance(name, str) or _torchs_own(known.get(name)):
            return real_json_to_treespec(schema)
        saved = known.get(name)
        known[name] = _stand_in(pytree, name)  # for this node only: see _StandIn
        try:
            return real_json_to_treespec(schema)
        finally:
            if saved is None:
                known.pop(name, None)
            else:
                known[name] = saved

    def treespec_loads(serialized: str) -> Any:
        protocol, schema = json.loads(serialized)
        if protocol != 1:
            raise _Refused(f"a pytree spec of protocol {str(protocol)[:20]!r}")
        return json_to_treespec(schema)

    def read_bytes(reader: Any, name: str) -> bytes:
        if name.startswith(SAMPLE_INPUTS_DIR):
            return b""  # never deserialized: the program's example_inputs are None
        return real_read_bytes(reader, name)

    patches: list[tuple[Any, str, Any]] = [
        (torch, "load", weights_only_load),
        (package_mod.PT2ArchiveReader, "read_bytes", read_bytes),
        (pytree, "_json_to_treespec", json_to_treespec),
        (serialize_mod, "treespec_loads", treespec_loads),
        (pytree, "enum_object_hook", _refuse_enum_reference),
        (package_mod, "pickle", _RefusingPickleModule()),
        (package_mod, "_load_aoti", _refuse("loading an AOTInductor library")),
        (torch._C, "_pickle_load_obj", _refuse("torch._C._pickle_load_obj")),  # noqa: SLF001
        (torch.jit, "load", _refuse("torch.jit.load")),
        (serialize_mod, "sympy", _GuardedSympy(serialize_mod.sympy)),
    ]
    # A name this torch does not have is a loader path it does not take (torch 2.11's _package
    # imports no pickle module); the archive scan before loading is the first line either way.
    patches = [(obj, attr, value) for obj, attr, value in patches if hasattr(obj, attr)]
    capture = _CaptureSwallowedError()
    export_logger = logging.getLogger("torch.export")
    with _LOAD_LOCK:
        saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in patches]
        try:
            for obj, attr, value in patches:
                setattr(obj, attr, value)
            export_logger.addFilter(capture)
            yield capture
        finally:
            export_logger.removeFilter(capture)
            for obj, attr, value in reversed(saved):
                setattr(obj, attr, value)


class _StandIn:
    """A pytree node of a type that is not Python's or torch's (e.g. ``transformers``'
    ``DynamicCache`` in a program's input or output spec): its children and its context, kept
    as the JSON it was saved with. The graph takes and returns flat tensors, which is what
    TuneHub compiles; the type's own code (which this process may not have, and which the file
    does not choose) is never used."""

    def __init__(self, children: list[Any], context: Any) -> None:
        self.children = list(children)
        self.context = context


_STAND_INS: dict[str, type] = {}


def _torchs_own(cls: Any) -> bool:
    """Whether ``cls`` (a registered pytree node type) is Python's or torch's own."""
    module = getattr(cls, "__module__", "") or ""
    return cls is not None and module.split(".")[0] in ("builtins", "collections", "torch")


def _stand_in(pytree: Any, name: str) -> type:
    """The :class:`_StandIn` subclass for the serialized type ``name``, registered as a pytree
    node (once) without taking the name over: a type of that name this process registers
    itself (``transformers``' ``DynamicCache``) keeps it. Its context is never parsed."""
    if not re.fullmatch(r"[A-Za-z_][\w.]{0,200}", name):
        raise _Refused(f"a pytree type named {name[:100]!r} in the program's signature")
    cls = _STAND_INS.get(name)
    if cls is not None:
        return cls
    cls = _STAND_INS[name] = type(f"StandIn[{name}]", (_StandIn,), {})
    saved = pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name)
    pytree.register_pytree_node(
        cls,
        lambda node: (node.children, node.context),
        lambda children, context: cls(children, context),
        flatten_with_keys_fn=lambda node: (
            [(pytree.SequenceKey(i), child) for i, child in enumerate(node.children)],
            node.context,
        ),
        serialized_type_name=name,
        to_dumpable_context=lambda context: context,
        from_dumpable_context=lambda context: context,
    )
    if saved is None:
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.pop(name, None)
    else:
        pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE[name] = saved
    return cls


def _refuse_enum_reference(obj: dict[str, Any]) -> Any:
    """torch's JSON hook for pytree contexts imports the module an ``"__enum__"`` object names
    (``torch.utils._pytree.enum_object_hook``): a file must not choose what this process
    imports."""
    if "__enum__" in obj:
        raise _Refused(f"an enum reference to {str(obj.get('fqn'))[:100]!r} in a pytree context")
    return obj
