"""A large model's weights beside its library (``params.bin``), not inside it.

A model's weights reach TVM as constants and stay constants through lowering (so that the
prepacked layouts are folded at compile time). Linked into ``model.so`` they become one data
section: past 2 GiB the shared library no longer links, and a 1.2 B-parameter decoder has 5 GB of
fp32 weights. So when a lowered module's constants total more than :data:`EXTERNAL_BYTES`,
:func:`lift_weights` turns every constant of at least :data:`MIN_LIFTED_BYTES` into a parameter of
each public function (after the user inputs and the state, in one order shared by all functions,
each distinct array once: programs and buckets importing the same weights share them), and the
build returns :class:`ExternalWeights`: the executable and the arrays, which
:func:`compiler.build.builder.export_library` writes as ``params.bin`` beside the library
(``tvm.runtime.save_param_dict_to_file``; weights on an 8- or 4-bit grid in that format:
:mod:`compiler.weights.weight_packing`). :class:`compiler.build.runner.LoadedLibrary` loads them
once and passes them to every call.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from compiler.weights.weight_packing import PackedWeight, pack

#: Constants above this total (bytes) are kept beside the library.
EXTERNAL_BYTES = 1 << 30
#: Smaller constants (biases, norms' scales) stay in the library.
MIN_LIFTED_BYTES = 1 << 16
#: The file beside ``model.so``; its arrays are named ``p0``, ``p1``, ...
PARAMS_NAME = "params.bin"


@dataclass(frozen=True)
class ExternalWeights:
    """An executable whose weights are parameters (``params``, in their order)."""

    executable: Any
    params: tuple[Any, ...]

    @property
    def nbytes(self) -> int:
        return sum(tensor_nbytes(p) for p in self.params)


def tensor_nbytes(array: Any) -> int:
    """The bytes of a tensor's values (from its shape and dtype: nothing is copied)."""
    size = 1
    for dim in array.shape:
        size *= int(dim)
    return size * np.dtype(str(array.dtype)).itemsize


def _constants(func: relax.Function) -> list[Any]:
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, tvm.ir.expr.GenericConst):
            found.append(node)

    relax.analysis.post_order_visit(func.body, visit)
    return found


def _digest(value: Any) -> str:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{value.dtype}{tuple(value.shape)}".encode())
    array = np.ascontiguousarray(value.numpy())
    # Viewed as bytes: memoryview cannot cast ml_dtypes' bfloat16 ('E') directly.
    digest.update(memoryview(array.view(np.uint8)).cast("B"))
    return digest.hexdigest()


def lift_weights(
    mod: tvm.IRModule, external_bytes: int | None = None
) -> tuple[tvm.IRModule, tuple[Any, ...]]:
    """``mod`` with its large constants as trailing parameters of every public Relax function,
    and their arrays in that order; ``(mod, ())`` unchanged when its constants total at most
    ``external_bytes`` (default :data:`EXTERNAL_BYTES`; see the module docstring)."""
    if external_bytes is None:
        external_bytes = EXTERNAL_BYTES
    functions = {
        gvar: func
        for gvar, func in mod.functions.items()
        if isinstance(func, relax.Function) and func.attrs and "global_symbol" in func.attrs
    }
    constants = {gvar: _constants(func) for gvar, func in functions.items()}
    seen: set[int] = set()
    total = 0
    for found in constants.values():
        for const in found:
            if id(const) not in seen and tensor_nbytes(const.value) >= MIN_LIFTED_BYTES:
                seen.add(id(const))
                total += tensor_nbytes(const.value)
    if total <= external_bytes:
        return mod, ()
    order: dict[str, int] = {}
    arrays: list[Any] = []
    key_of: dict[Any, str] = {}
    for found in constants.values():
        for const in found:
            if tensor_nbytes(const.value) < MIN_LIFTED_BYTES or const in key_of:
                continue
            key = key_of[const] = _digest(const.value)
            if key not in order:
                order[key] = len(arrays)
                arrays.append(const.value)
    out = mod.clone() if hasattr(mod, "clone") else mod
    for gvar, func in functions.items():
        params = [
            relax.Var(f"w{i}", relax.TensorType(list(a.shape), str(a.dtype)))
            for i, a in enumerate(arrays)
        ]
        replacement = {const: params[order[key]] for const, key in key_of.items()}
        body = _Replace(replacement).visit_expr(func.body)
        lifted = relax.Function(
            list(func.params) + params, body, func.ret_ty, func.is_pure, func.attrs
        )
        out[gvar] = lifted
    return out, tuple(arrays)


@mutator
class _Replace(PyExprMutator):
    """Each constant of ``replacement`` as its parameter."""

    def __init__(self, replacement: dict[Any, relax.Var]) -> None:
        super().__init__()
        self.replacement = replacement

    def visit_generic_const_(self, op: Any) -> Any:
        return self.replacement.get(op, op)


def share_constants(mod: tvm.IRModule, pool: dict[str, Any]) -> tvm.IRModule:
    """``mod`` with each large constant (at least :data:`MIN_LIFTED_BYTES`) equal in content to
    one of ``pool`` (by content digest) replaced by the pooled one, and the others added to
    ``pool``: the shape buckets of a model, imported one by one, then hold one copy of their
    weights rather than one each (``_import_buckets`` in :mod:`compiler.frontends.importer`; a
    decoder's five token-count buckets held five copies of 2 GB)."""
    out = mod
    for gvar, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function):
            continue
        replacement: dict[Any, Any] = {}
        for const in _constants(func):
            if const in replacement or tensor_nbytes(const.value) < MIN_LIFTED_BYTES:
                continue
            pooled = pool.setdefault(_digest(const.value), const)
            if not pooled.same_as(const):
                replacement[const] = pooled
        if replacement:
            body = _Replace(replacement).visit_expr(func.body)
            out[gvar] = relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)
    return out


def save_params(params: tuple[Any, ...], path: Any) -> None:
    """Write ``params`` as ``path``: array ``i`` as ``p<i>``, or, where its values lie on an 8- or
    4-bit grid (a model compiled with ``--weights q8_0``/``q4_0``), in that format
    (:func:`compiler.weights.weight_packing.pack`) as ``p<i>:<format>:<axis>:codes`` and
    ``p<i>:<format>:<axis>:scales``. :func:`load_params` reads either back as the same values."""
    entries: dict[str, Any] = {}
    for index, param in enumerate(params):
        packed = pack(_host_view(param)) if str(param.dtype) == "float32" else None
        if packed is None:
            entries[f"p{index}"] = param
            continue
        stem = f"p{index}:{packed.fmt}:{packed.axis}"
        entries[f"{stem}:codes"] = tvm.runtime.tensor(packed.codes)
        entries[f"{stem}:scales"] = tvm.runtime.tensor(packed.scales)
    tvm.runtime.save_param_dict_to_file(entries, str(path))


def _host_view(param: Any) -> np.ndarray:
    """``param``'s values as a numpy array: a view of a CPU tensor's memory (DLPack, no copy:
    :func:`compiler.weights.weight_packing.pack` rejects most float32 weights from one line of
    them), a copy of any other's."""
    if param.device.dlpack_device_type() == tvm.cpu().dlpack_device_type():
        return np.from_dlpack(param)
    return param.numpy()


def load_params(path: Any, device: Any) -> list[Any]:
    """The arrays of a ``params.bin`` (:func:`save_params`) in order, on ``device``; packed
    arrays come back as their float32 values. A plain array the file gave on ``device``
    already is kept as it is, and each array read is let go once it is placed: the weights are
    held once, not twice (loading a 4.4 GB float32 decoder peaked at 9.1 GB with a copy each)."""
    loaded = dict(tvm.runtime.load_param_dict_from_file(str(path)).items())
    arrays: dict[int, Any] = {}
    for name in list(loaded):
        index, _, packing = str(name)[1:].partition(":")
        if not packing:
            array = loaded.pop(name)
            arrays[int(index)] = array if array.device == device else array.copyto(device)
        elif packing.endswith(":codes"):
            fmt, axis, _ = packing.split(":")
            scales = loaded.pop(f"p{index}:{fmt}:{axis}:scales").numpy()
            weight = PackedWeight(fmt, int(axis), loaded.pop(name).numpy(), scales)
            arrays[int(index)] = tvm.runtime.tensor(weight.values(), device)
    return [arrays[i] for i in range(len(arrays))]
