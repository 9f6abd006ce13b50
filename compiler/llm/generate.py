"""Generation from a decoder's artifact: prefill, step, greedy ``generate``.

A decoder exported the way ``transformers`` documents it for deployment
(``convert_and_export_with_cache``: inputs ``input_ids`` ``[batch, n]`` and ``cache_position``
``[n]``, logits ``[batch, n, vocabulary]`` out, the KV cache as state written in place,
:mod:`compiler.llm.state`) compiles to a library that keeps its cache between calls
(:class:`compiler.build.runner.LoadedLibrary`). :class:`Generator` drives it:

- ``prefill(ids)`` feeds a prompt in chunks of the lengths the library takes (its shape buckets
  over ``n``, largest first; one function of length 1 covers any remainder), each chunk at its
  positions, and returns the last position's logits;
- ``step(token)`` feeds one token at the next position;
- ``generate(prompt, max_new_tokens)`` is greedy decoding, timed (prefill, and each decode step).

Any length fits, up to the cache's capacity: a call that would write past it raises
``ModelError("cache_full")`` before anything runs, never wrong tokens.
:class:`TorchDecoder` runs the exported program the same way (the reference of
:func:`compiler.llm.verify.verify_generation`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compiler.errors import ModelError

IDS = "input_ids"
POSITIONS = "cache_position"


@dataclass(frozen=True)
class DecoderSignature:
    """How a stateful decoder is called: its batch size, the prompt lengths its functions take
    (``lengths``, descending), its cache ``capacity`` and the dtypes of ids and positions."""

    batch: int
    lengths: tuple[int, ...]
    capacity: int
    ids_dtype: str
    positions_dtype: str

    def chunks(self, count: int) -> list[int]:
        """``count`` tokens as chunk lengths the library takes, largest first. Raises
        ``ModelError("bad_length")`` when no sum of its lengths makes ``count``."""
        out, left = [], count
        for length in self.lengths:
            while left >= length:
                out.append(length)
                left -= length
        if left:
            raise ModelError(
                "bad_length",
                f"{count} tokens cannot be cut into the prompt lengths this library takes "
                f"({', '.join(map(str, self.lengths))}); compile it with a bucket of length 1 "
                "(e.g. --buckets SEQ=1,16,64)",
            )
        return out


def decoder_signature(model_json: dict[str, Any]) -> DecoderSignature:
    """The :class:`DecoderSignature` of an artifact's manifest ``model`` (inputs, buckets,
    state). Raises ``ModelError("not_a_decoder")`` for a model that is not a stateful decoder
    with ``input_ids`` and ``cache_position`` inputs."""
    state = model_json.get("state") or []
    functions = (model_json.get("buckets") or {}).get("functions") or [
        {"inputs": model_json.get("inputs", [])}
    ]
    tables = [{spec["name"]: spec for spec in f.get("inputs", [])} for f in functions]
    if not state or not tables or any(set(t) != {IDS, POSITIONS} for t in tables):
        raise ModelError(
            "not_a_decoder",
            "this artifact is not a decoder with a KV cache: generation needs a program exported "
            f"with inputs {IDS} and {POSITIONS} and its cache as state (transformers' "
            "convert_and_export_with_cache)",
        )
    lengths = sorted({int(t[IDS]["shape"][1]) for t in tables}, reverse=True)
    batches = {int(t[IDS]["shape"][0]) for t in tables}
    capacity = min(int(s["shape"][s["axis"]]) for s in state)
    first = tables[0]
    return DecoderSignature(
        batch=min(batches),
        lengths=tuple(lengths),
        capacity=capacity,
        ids_dtype=first[IDS]["dtype"],
        positions_dtype=first[POSITIONS]["dtype"],
    )


@dataclass(frozen=True)
class Generation:
    """A greedy generation: the new token ids (per sequence of the batch), the prefill's time
    and each decode step's time, in seconds."""

    tokens: list[list[int]]
    prefill_secs: float
    step_secs: list[float]

    @property
    def decode_ms_per_token(self) -> float | None:
        return float(np.median(self.step_secs)) * 1e3 if self.step_secs else None

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "prefill_ms": self.prefill_secs * 1e3,
            "decode_ms_per_token": self.decode_ms_per_token,
            "steps": len(self.step_secs),
        }


class _Driver:
    """Positions, chunking and greedy decoding over a ``call(ids, positions) -> logits``."""

    def __init__(self, signature: DecoderSignature) -> None:
        self.signature = signature
        self.position = 0

    def _call(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _reset(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Start over: an empty cache at position 0."""
        self._reset()
        self.position = 0

    def _ids(self, ids: Any) -> np.ndarray:
        array = np.asarray(ids, dtype=self.signature.ids_dtype)
        if array.ndim == 1:
            array = np.broadcast_to(array, (self.signature.batch, array.shape[0]))
        if array.ndim != 2 or array.shape[0] != self.signature.batch:
            raise ModelError(
                "bad_input",
                f"token ids of shape {list(array.shape)}: this decoder takes a batch of "
                f"{self.signature.batch}",
            )
        return np.ascontiguousarray(array)

    def prefill(self, ids: Any) -> np.ndarray:
        """Feed ``ids`` (``[n]`` or ``[batch, n]``) after what was fed so far; the logits of the
        last position, ``[batch, vocabulary]``. Raises ``ModelError("cache_full")`` when they
        do not fit in the cache (nothing is run then), ``bad_length`` / ``bad_input``."""
        array = self._ids(ids)
        count = array.shape[1]
        if count < 1:
            raise ModelError("bad_input", "no token ids to feed")
        if self.position + count > self.signature.capacity:
            raise ModelError(
                "cache_full",
                f"{count} more tokens after {self.position} do not fit in this decoder's KV "
                f"cache of {self.signature.capacity} positions",
            )
        logits = None
        for length in self.signature.chunks(count):
            positions = np.arange(
                self.position, self.position + length, dtype=self.signature.positions_dtype
            )
            logits = self._call(np.ascontiguousarray(array[:, :length]), positions)
            array = array[:, length:]
            self.position += length
        assert logits is not None
        return np.asarray(logits)[:, -1, :]

    def step(self, token: Any) -> np.ndarray:
        """Feed one token (per sequence of the batch); the next logits ``[batch, vocab]``."""
        return self.prefill(np.asarray(token).reshape(-1, 1) if np.ndim(token) else [token])

    def generate(self, prompt: Sequence[int] | np.ndarray, max_new_tokens: int) -> Generation:
        """Greedy decoding of ``max_new_tokens`` after ``prompt`` (``[n]``, the same for every
        sequence of the batch, or ``[batch, n]``) from an empty cache, timed. Raises
        ``ModelError("cache_full")`` before running when prompt and new tokens do not fit in
        the cache."""
        if max_new_tokens < 0:
            raise ModelError("bad_input", f"max_new_tokens must be >= 0, got {max_new_tokens}")
        count = int(np.shape(prompt)[-1])
        total = count + max_new_tokens
        if total > self.signature.capacity:
            raise ModelError(
                "cache_full",
                f"{count} prompt tokens and {max_new_tokens} new ones need "
                f"{total} positions; this decoder's KV cache holds {self.signature.capacity}",
            )
        self.reset()
        start = time.perf_counter()
        logits = self.prefill(prompt)
        prefill_secs = time.perf_counter() - start
        tokens: list[list[int]] = [[] for _ in range(self.signature.batch)]
        steps: list[float] = []
        for index in range(max_new_tokens):
            chosen = logits.argmax(axis=-1)
            for row, token in enumerate(chosen):
                tokens[row].append(int(token))
            if index == max_new_tokens - 1:
                break
            start = time.perf_counter()
            logits = self.prefill(chosen.reshape(-1, 1))
            steps.append(time.perf_counter() - start)
        return Generation(tokens, prefill_secs, steps)


class Generator(_Driver):
    """Generation from a compiled decoder (:class:`compiler.build.runner.LoadedLibrary` of a
    stateful model; see the module docstring)."""

    def __init__(self, library: Any, signature: DecoderSignature) -> None:
        super().__init__(signature)
        self.library = library

    @classmethod
    def load(cls, artifact_dir: Path, device: str = "cpu") -> _Driver:
        """The decoder of the artifact in ``artifact_dir`` (``model.so`` + ``manifest.json``):
        a :class:`Generator`, or for an ONNX decoder with ``past_key_values`` inputs and
        ``present`` outputs a :class:`compiler.llm.past_present.PastPresentGenerator`.
        Raises ``ModelError``: ``not_a_decoder``, ``bad_artifact`` (missing or unreadable),
        ``no_generation`` (a past/present artifact that cannot generate)."""
        import json  # noqa: PLC0415

        from compiler.build.runner import LoadedLibrary  # noqa: PLC0415

        folder = Path(artifact_dir)
        try:
            manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ModelError(
                "bad_artifact", f"{folder} has no readable manifest.json: {err}"
            ) from None
        if not (folder / "model.so").is_file():
            raise ModelError("bad_artifact", f"{folder} has no model.so")
        if (manifest.get("model") or {}).get("past_present"):
            from compiler.build.runner import LoadedLibrary  # noqa: PLC0415
            from compiler.llm.past_present import PastPresentGenerator  # noqa: PLC0415

            cuda = (manifest.get("target") or {}).get("kind") == "cuda"
            library = LoadedLibrary(folder / "model.so", "cuda" if cuda else device)
            return PastPresentGenerator.from_artifact(library, manifest)
        signature = decoder_signature(manifest.get("model") or {})
        device = "cuda" if (manifest.get("target") or {}).get("kind") == "cuda" else device
        return cls(LoadedLibrary(folder / "model.so", device), signature)

    def _reset(self) -> None:
        self.library.reset_state()

    def _call(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        return self.library.run([ids, positions])[0]


class TorchDecoder(_Driver):
    """The exported programs run the same way: the reference. ``programs``: by token count, the
    ``torch.export`` program that takes that many tokens (a single program: ``{n: program}``,
    see :func:`reference_programs`). Their modules share one cache: the buffers of the first
    stand in for the others' (each program's own copy would be a cache of its own)."""

    def __init__(self, programs: Mapping[int, Any], signature: DecoderSignature) -> None:
        super().__init__(signature)
        self.programs = dict(programs)
        self.modules: dict[int, Any] = {}

    def _reset(self) -> None:
        from compiler.build.verify import stateful_module  # noqa: PLC0415

        by_program: dict[int, Any] = {}  # one module a program (a symbolic one takes every count)
        for program in self.programs.values():
            by_program.setdefault(id(program), stateful_module(program))
        first, *others = by_program.values()
        shared = dict(first.named_buffers())
        for module in others:
            for name, buffer in module.named_buffers():
                if name in shared and buffer.shape == shared[name].shape:
                    owner, _, attr = name.rpartition(".")
                    setattr(module.get_submodule(owner) if owner else module, attr, shared[name])
        self.modules = {n: by_program[id(p)] for n, p in self.programs.items()}

    def _call(self, ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        import torch  # noqa: PLC0415

        from compiler.build.verify import call_program  # noqa: PLC0415

        if not self.modules:
            self._reset()
        count = ids.shape[1]
        with torch.no_grad():
            tensors = [torch.tensor(ids), torch.tensor(positions)]
            out = call_program(self.programs[count], self.modules[count], tensors)
        out = out[0] if isinstance(out, (tuple, list)) else out
        return out.detach().float().numpy()


def reference_programs(model: Any) -> dict[int, Any]:
    """By token count, the exported program of a decoder :class:`compiler.frontends.model_spec.
    LoadedModel` that takes that many tokens (one per program of a multi-program archive)."""
    parts = [b.model for b in model.buckets] or [model]
    return {next(s.shape[1] for s in part.inputs if s.name == IDS): part.source for part in parts}
