"""The contract between the LLM benchmark's harness (:func:`bench.llm_peers.measure`) and the
runtimes it times: what a run measures (:class:`Settings`), the model a runtime prepares from
(:class:`PreparedModel`), the hook every runtime implements (:class:`Runtime`) and what a
measurement returns (:class:`PeerResult`); plus the helpers the peers share (the greedy choice
without the eos id, a logged child process)."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from bench.llm_models import LLMSpec, model_root

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Settings:
    """What :func:`measure` runs; the defaults are the real benchmark's."""

    threads: int = 2
    prefill: tuple[int, ...] = (128, 512)
    contexts: tuple[int, ...] = (128, 1024)
    batch4_contexts: tuple[int, ...] = (128,)
    decode_tokens: int = 16
    warmup_tokens: int = 2
    repeats: int = 3
    seed: int = 0

    def capacity(self, context: int) -> int:
        """KV positions a decode case at ``context`` needs (prompt, warm-up, timed, one spare)."""
        return context + self.warmup_tokens + self.decode_tokens + 1


@dataclass(frozen=True)
class PreparedModel:
    """What a runtime prepares from: the spec, its ``save_pretrained`` folder, a cache root.

    ``cache_dir`` is where a runtime keeps what it derives from the folder (converted files),
    ``<work_dir>/models/<name>-s<seed>``; ``work_dir`` is the benchmark's work dir.
    """

    spec: LLMSpec
    folder: Path
    cache_dir: Path
    work_dir: Path
    seed: int = 0

    @classmethod
    def of(cls, spec: LLMSpec, folder: Path, work_dir: Path, seed: int = 0) -> PreparedModel:
        return cls(spec, Path(folder), model_root(spec, work_dir, seed), Path(work_dir), seed)


@dataclass(frozen=True)
class PeerResult:
    """One runtime variant on one model: the measurements, all medians, in milliseconds.

    ``prefill_ms[P]``: a prefill of P tokens at batch 1. ``decode_ms[C]``: one decode step at
    batch 1 after a context of C tokens (ms/token). ``decode_b4_ms[C]``: one step at batch 4
    (four tokens). ``batch4_note``: why ``decode_b4_ms`` is empty, when it is. ``tokens[case]``
    (case ``"b1c128"``, ``"b4c128"``, ...): the greedy tokens of row 0. ``error``: why nothing
    was measured (then the mappings are empty). ``extra``: runtime details (file sizes, options,
    the limit's bandwidth) for the JSON.
    """

    runtime: str
    variant: str
    precision: str
    model: str
    threads: int
    prefill_ms: Mapping[int, float] = field(default_factory=dict)
    decode_ms: Mapping[int, float] = field(default_factory=dict)
    decode_b4_ms: Mapping[int, float] = field(default_factory=dict)
    batch4_note: str | None = None
    setup_s: float | None = None
    compile_s: float | None = None
    tokens: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"{self.runtime} {self.variant}"

    def to_json(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "variant": self.variant,
            "precision": self.precision,
            "model": self.model,
            "threads": self.threads,
            "prefill_ms": {str(k): v for k, v in self.prefill_ms.items()},
            "decode_ms": {str(k): v for k, v in self.decode_ms.items()},
            "decode_b4_ms": {str(k): v for k, v in self.decode_b4_ms.items()},
            "batch4_note": self.batch4_note,
            "setup_s": self.setup_s,
            "compile_s": self.compile_s,
            "tokens": {k: list(v) for k, v in self.tokens.items()},
            "error": self.error,
            "extra": dict(self.extra),
        }


@runtime_checkable
class Runtime(Protocol):
    """A runtime variant the harness can time: the hook every peer (and TuneHub) implements.

    Life cycle: ``unavailable()`` -> ``prepare(model, settings)`` once -> any number of
    ``start(batch, capacity)`` each followed by one ``prefill`` and any number of ``step`` ->
    ``close()``. Token arrays are ``int64``; ``prefill`` and ``step`` return the next greedy
    token of each sequence (``int64 [batch]``, argmax without the eos id).
    """

    runtime: str
    """Family name in the table, e.g. ``"llama.cpp"``."""
    variant: str
    """Variant within the family, e.g. ``"Q8_0"``."""
    precision: str
    """Weight precision class: ``"fp32"``, ``"bf16"``, ``"8-bit"`` or ``"4-bit"``."""
    compiles: bool
    """True when warm-up calls compile (their time is reported as ``compile_s``)."""

    def unavailable(self) -> str | None:
        """Why this runtime cannot run here (a package missing...), or None."""
        ...

    def batch_unsupported(self, batch: int) -> str | None:
        """Why ``batch`` sequences at once are not supported, or None."""
        ...

    def prepare(self, model: PreparedModel, settings: Settings) -> None:
        """Convert (cached under ``model.cache_dir``) and load; threads = ``settings.threads``."""
        ...

    def start(self, batch: int, capacity: int) -> None:
        """Begin ``batch`` new empty sequences with room for ``capacity`` positions each."""
        ...

    def prefill(self, ids: np.ndarray, *, measured: bool = True) -> np.ndarray:
        """Run the prompt ``ids`` (``[batch, P]``) from position 0; the next greedy tokens.

        ``measured=False``: only the cache state matters (a decode case's set-up); a runtime
        may take a slower path that leaves the same cache.
        """
        ...

    def step(self, tokens: np.ndarray) -> np.ndarray:
        """Decode ``tokens`` (``[batch]``, the last returned) at the next position."""
        ...

    def describe(self) -> dict[str, Any]:
        """Details for the JSON (versions, files, options); called after ``prepare``."""
        ...

    def close(self) -> None:
        """Release the model and caches."""
        ...


RuntimeFactory = Callable[[], Runtime]


def _greedy(logits: np.ndarray, eos: int) -> np.ndarray:
    """Argmax over the last axis with ``eos`` excluded; ``int64 [rows]``."""
    logits = np.array(logits, dtype=np.float32, copy=True).reshape(-1, logits.shape[-1])
    logits[:, eos] = -np.inf
    return logits.argmax(axis=-1).astype(np.int64)


def _run_logged(cmd: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    log.info("running %s (log %s)", " ".join(cmd), log_path)
    with open(log_path, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{cmd[:4]} failed (exit {proc.returncode}); log {log_path}:\n{tail}")
