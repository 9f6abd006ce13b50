"""State a ``torch.export`` program keeps between calls: a decoder's KV cache, updated in place.

``transformers``' ExecuTorch-style export (``convert_and_export_with_cache``: a ``StaticCache``
registered as buffers) is a program that *mutates* buffers: each call writes the new tokens'
keys and values into ``key_cache_<i>`` / ``value_cache_<i>`` at ``cache_position``
(``index_copy_``, which torch's decomposition turns into ``index_put``) and reads the whole
cache back for attention. TVM's translation drops buffer updates, so TuneHub used to refuse such
programs (and its own decoder wrappers copied the whole cache in and out every token).

:func:`lift_state` classifies every mutated buffer of a *decomposed* program:

- **state** -- written in place at positions: the buffer's only use is as the target of one
  ``index_put`` with one 1-D index tensor along one axis (``cache[:, :, pos] = new``), and that
  write is the buffer's new value. The buffer becomes an input of the compiled function (after
  the user inputs, :class:`StateSpec`), the library owns it between calls
  (:class:`compiler.build.runner.LoadedLibrary`) and the write is a kernel that stores only the new
  rows into it (:mod:`compiler.llm.cache_write`): a call's cost never includes a copy of the
  cache;
- **overwritten** -- its old value is never read (its only uses are as the destination of
  ``copy_``: ``StaticCache``'s ``cumulative_length``, set from ``cache_position`` at the start of
  every call). It stays a constant of the program; its update is dropped, which changes nothing.

Anything else (an input updated in place, a buffer read and then updated another way) is refused
with ``ModelError("mutates_state")`` naming the buffer and the operator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from compiler.errors import ModelError


@dataclass(frozen=True)
class StateSpec:
    """One tensor a stateful program keeps between calls: its placeholder ``name`` (the compiled
    function's parameter, after the user inputs), ``shape``, ``dtype``, the ``axis`` its rows
    are written along (the cache's positions; ``capacity`` = ``shape[axis]``) and the buffer it
    came from (``buffer``, e.g. ``key_cache_0``). It starts as zeros."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    axis: int
    buffer: str

    @property
    def capacity(self) -> int:
        return self.shape[self.axis]

    @property
    def nbytes(self) -> int:
        import numpy as np  # noqa: PLC0415

        return math.prod(self.shape) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "axis": self.axis,
            "buffer": self.buffer,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> StateSpec:
        return StateSpec(
            str(data["name"]),
            tuple(int(d) for d in data["shape"]),
            str(data["dtype"]),
            int(data["axis"]),
            str(data.get("buffer", data["name"])),
        )


def _refuse(message: str) -> ModelError:
    return ModelError(
        "mutates_state",
        f"the torch.export program {message}; TuneHub keeps a buffer as state only when it is "
        "written in place at positions along one axis (a StaticCache's index_copy_), or "
        "overwritten before it is read",
    )


def _write_axis(node: Any, placeholder: Any) -> int | None:
    """The axis ``node`` (an ``aten.index_put``) writes ``placeholder``'s rows along, or
    ``None`` when it is not such a write: ``placeholder`` is its target, one index tensor of
    rank 1 (others ``None``), no accumulation."""
    target = getattr(node.target, "__name__", "")
    if node.op != "call_function" or target != "index_put.default":
        return None
    args = list(node.args) + [None] * 4
    if args[0] is not placeholder or placeholder in args[2:3] or args[3]:
        return None
    indices = args[1]
    if not isinstance(indices, (list, tuple)):
        return None
    tensors = [i for i, index in enumerate(indices) if index is not None]
    if len(tensors) != 1:
        return None
    value = indices[tensors[0]].meta.get("val")
    if value is None or value.dim() != 1 or value.dtype.is_floating_point:
        return None
    return tensors[0]


def mutates_anything(program: Any) -> bool:
    """Whether ``program`` (as exported, before torch's decomposition) writes to one of its
    inputs or buffers: a graph node whose operator's schema says it writes its argument, given a
    placeholder there. Cheap: no decomposition."""
    for node in program.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None:
            continue
        for argument, value in zip(schema.arguments, node.args):
            alias = argument.alias_info
            if alias is not None and alias.is_write and getattr(value, "op", "") == "placeholder":
                return True
    return False


def decompose(program: Any, *, keep_attention: bool = False) -> Any:
    """``program.run_decompositions()``: the core ATen graph TVM's frontend translates.
    ``keep_attention``: ``scaled_dot_product_attention`` stays whole (a stateful decoder's:
    :mod:`compiler.llm.attention` reads its grouped-query cache without copying it; torch 2.13
    also fails to decompose a static-cache export with a symbolic token count otherwise).
    Raises ``ModelError("import_failed")`` when torch cannot."""
    try:
        if not keep_attention:
            return program.run_decompositions()
        import torch  # noqa: PLC0415 - .pt2 only

        table = torch.export.default_decompositions()
        table.pop(torch.ops.aten.scaled_dot_product_attention.default, None)
        return program.run_decompositions(table)
    except Exception as err:  # noqa: BLE001 - any torch failure here is the file's, refused
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ModelError(
            "import_failed",
            f"torch could not decompose the torch.export program to core ATen operators "
            f"({type(err).__name__}: {first[:300]})",
        ) from None


def program_state(program: Any) -> tuple[StateSpec, ...]:
    """The state of ``program`` as exported (:func:`classify_state` of its decomposition; none,
    without decomposing, when nothing is written in place). Raises ``ModelError`` as
    :func:`classify_state` and :func:`decompose` do."""
    if not mutates_anything(program):
        return ()
    return classify_state(decompose(program, keep_attention=True))[0]


#: The token counts a stateful decoder's symbolic token dimension is compiled for when the user
#: gives none: one (a decode step) and prefill chunks (powers of two, within its range).
DECODER_BUCKETS = (1, 16, 32, 64, 128)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def classify_state(program: Any) -> tuple[tuple[StateSpec, ...], tuple[str, ...]]:
    """The mutated buffers of the decomposed ``program``, as ``(state, overwritten buffer
    names)`` (see the module docstring). Raises ``ModelError("mutates_state")`` for a mutation
    TuneHub cannot keep, or for a user input updated in place."""
    signature = program.graph_signature
    if signature.user_inputs_to_mutate:
        inputs = ", ".join(sorted(set(signature.user_inputs_to_mutate.values())))
        raise _refuse(f"updates input(s) {inputs} in place")
    mutations = dict(signature.buffers_to_mutate)  # output node name -> buffer target
    if not mutations:
        return (), ()
    placeholders = {
        spec.target: spec.arg.name
        for spec in signature.input_specs
        if spec.kind.name == "BUFFER" and spec.target in mutations.values()
    }
    nodes = {node.name: node for node in program.graph.nodes}
    buffers = dict(program.named_buffers())
    state: list[StateSpec] = []
    overwritten: list[str] = []
    for output, buffer in mutations.items():
        placeholder = nodes[placeholders[buffer]]
        users = list(placeholder.users)
        if users and all(
            getattr(u.target, "__name__", "") == "copy.default" and u.args[0] is placeholder
            for u in users
        ):
            overwritten.append(buffer)
            continue
        axis = _write_axis(users[0], placeholder) if len(users) == 1 else None
        if axis is None or users[0].name != output:
            uses = ", ".join(sorted({str(u.target) for u in users})) or "nothing"
            raise _refuse(
                f"updates buffer(s) {buffer} in place in a way it cannot keep (read by {uses})"
            )
        value = buffers[buffer]
        if bool(value.any()):
            raise _refuse(f"starts buffer {buffer} with values other than zeros")
        state.append(
            StateSpec(
                name=placeholder.name,
                shape=tuple(int(d) for d in value.shape),
                dtype=_dtype_name(value.dtype),
                axis=axis,
                buffer=buffer,
            )
        )
    return tuple(state), tuple(overwritten)


def lift_state(program: Any, state: tuple[StateSpec, ...]) -> Any:
    """The decomposed ``program`` with each of ``state``'s buffers turned into an input after
    the user inputs (its placeholder moved to the end, its update a mutation of that input),
    so TVM translates it as a parameter of the function, never a constant. ``state`` is
    :func:`classify_state`'s; an empty one returns ``program`` unchanged."""
    if not state:
        return program
    from torch.export.graph_signature import (  # noqa: PLC0415 - torch, .pt2 only
        ExportGraphSignature,
        InputKind,
        InputSpec,
        OutputKind,
        OutputSpec,
    )

    signature = program.graph_signature
    lifted = {s.buffer: s.name for s in state}
    inputs, moved = [], []
    for spec in signature.input_specs:
        if spec.kind == InputKind.BUFFER and spec.target in lifted:
            moved.append(InputSpec(InputKind.USER_INPUT, spec.arg, target=None))
        else:
            inputs.append(spec)
    outputs = [
        OutputSpec(OutputKind.USER_INPUT_MUTATION, spec.arg, target=lifted[spec.target])
        if spec.kind == OutputKind.BUFFER_MUTATION and spec.target in lifted
        else spec
        for spec in signature.output_specs
    ]
    module = program.graph_module
    placeholders = {n.name: n for n in module.graph.nodes if n.op == "placeholder"}
    first = next(n for n in module.graph.nodes if n.op != "placeholder")
    for spec in inputs + moved:
        first.prepend(placeholders[spec.arg.name])
    module.recompile()
    state_dict = {k: v for k, v in program.state_dict.items() if k not in lifted}
    constants = {k: v for k, v in program.constants.items() if k not in lifted}
    return program._update(  # noqa: SLF001 - torch's own way to rebuild a program
        module,
        ExportGraphSignature(inputs + moved, outputs),
        state_dict=state_dict,
        constants=constants,
    )
