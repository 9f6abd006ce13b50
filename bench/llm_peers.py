"""The peer runtimes of the LLM benchmark (issue 32), each measured the same way.

Every peer is a :class:`Runtime`: an object that converts/loads a model folder written by
:func:`bench.llm_models.save_model_folder` and then runs greedy generation on token ids. The
harness :func:`measure` times every runtime alike and returns one frozen :class:`PeerResult`:

- **prefill** at each P of ``Settings.prefill`` (batch 1, from an empty cache): one untimed
  warm-up prefill, then ``Settings.repeats`` timed ones, each after :meth:`Runtime.start`
  (empty cache); the median in ms. The time covers the forward over the P prompt tokens and the
  greedy choice of the next token (its logits only).
- **decode** at each context C of ``Settings.contexts`` (batch 1) and of
  ``Settings.batch4_contexts`` (batch 4): a prompt of C tokens is prefilled (untimed, with
  ``measured=False``), then ``Settings.warmup_tokens`` untimed and ``Settings.decode_tokens``
  timed steps of greedy decoding, one token per sequence each; the median step in ms. A step at
  batch 4 decodes four tokens (one per sequence): tokens/s = 4000 / ms.
- **greedy tokens** of each decode case (row 0 of a batch; prompts from
  :func:`bench.llm_models.prompt_ids`, so row 0 at batch 4 is the batch-1 prompt): the token
  after the prompt, then each decoded one. Greedy is the argmax over the vocabulary *without
  the eos id* in every runtime (ONNX Runtime GenAI's ``min_length`` does the same), so no run
  stops early and runs stay comparable.
- **setup**: :meth:`Runtime.prepare` (conversion, cached on disk, plus loading) is timed apart
  and excluded; so is the warm-up, reported as ``compile_s`` for runtimes that compile
  (``Runtime.compiles``): the wall time of every warm-up call, which includes compiling each
  new shape.

Threads are ``Settings.threads`` (2 by default) in every runtime. Peers (:data:`PEERS`):

- ``torch-eager`` / ``torch-compile``: ``transformers``' model loaded from the folder, fp32,
  ``sdpa`` attention, our own loop over its ``forward`` with a ``StaticCache`` of the requested
  capacity (``cache_position`` per step, the last logits cloned each step); ``torch.compile``
  with ``mode="default"`` (``max-autotune-no-cudagraphs`` by option; ``reduce-overhead`` is
  CUDA graphs, for GPUs), static shapes: one compilation per prefill length and per decode
  (batch, capacity); the decode set-up's prefill runs eager (same weights, same cache).
- ``ort-genai-fp32`` / ``ort-genai-int4``: ONNX Runtime GenAI's model builder run offline from
  the folder (``python -m onnxruntime_genai.models.builder -i HF -o OUT -p fp32|int4 -e cpu
  -c CACHE``; int4 is its default ``MatMulNBits``, block 32, accuracy level 4 on CPU: int8
  activations), loaded with ``intra_op_num_threads`` overlaid; ``Generator.append_tokens``
  for the prompt, ``generate_next_token`` per step (greedy search, ``max_length`` = the
  capacity, batch size by ``set_search_options``).
- ``llama.cpp-f32`` / ``-bf16`` / ``-q8_0``: the folder converted by llama.cpp's own
  ``convert_hf_to_gguf.py`` (from the ``llama-cpp-python`` source distribution, see
  :func:`find_llama_cpp_source`; the converter's pre-tokenizer check is bypassed because the
  tokenizer is synthetic) and run through ``llama-cpp-python``'s **low-level** API
  (``llama_model_load_from_file``, ``llama_init_from_model``, ``llama_batch_init``,
  ``llama_decode``, ``llama_get_logits_ith``): a context of ``n_seq_max`` = batch,
  ``n_ctx`` = batch x capacity, ``n_threads`` = ``n_threads_batch`` = threads, otherwise
  llama.cpp's defaults (``n_batch`` 2048, ``n_ubatch`` 512, flash attention ``auto``, an f16
  K/V cache). Batch 4 is four sequences in one ``llama_batch``.

:func:`physical_limit` gives the bound no runtime can beat: weight bytes read per decoded token
(:func:`bench.llm_models.weight_bytes_per_token`) over the machine's copy bandwidth
(:func:`measure_bandwidth`), at fp32, bf16, 8-bit and 4-bit weights.

``onnxruntime-genai`` and ``llama-cpp-python`` are optional (the ``bench-llm`` extra):
:meth:`Runtime.unavailable` says why a runtime cannot run here, and :func:`measure` returns a
result whose ``error`` says so instead of raising.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import numpy as np

from bench.llm_models import (
    BYTES_PER_WEIGHT,
    LLMSpec,
    kv_bytes_per_token,
    model_root,
    prompt_ids,
    weight_bytes_per_token,
)

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


# --------------------------------------------------------------------------------------------
# torch eager and torch.compile


class TorchRuntime:
    """``transformers``' model with a ``StaticCache``, eager or through ``torch.compile``."""

    runtime = "torch"
    precision = "fp32"

    def __init__(self, compiled: bool = False, compile_mode: str = "default") -> None:
        self.compiled = compiled
        self.compile_mode = compile_mode
        self.variant = f"compile ({compile_mode})" if compiled else "eager"
        self.compiles = compiled
        self.model: Any = None
        self.fn: Any = None
        self.cache: Any = None
        self.pos = 0

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("transformers") is None:
            return "transformers is not installed (pip install -e '.[dev]')"
        return None

    def batch_unsupported(self, batch: int) -> str | None:
        return None

    def prepare(self, model: PreparedModel, settings: Settings) -> None:
        import torch

        from bench.llm_models import load_saved_model

        torch.set_num_threads(settings.threads)
        self.eos = model.spec.special_ids[1]
        self.model = load_saved_model(model.folder)
        self.fn = self.model
        if self.compiled:
            import torch._dynamo as dynamo

            # one graph per prefill length and per decode (batch, capacity): more than the
            # default limit of 8 recompilations in a long run
            for key in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo.config, key):
                    setattr(dynamo.config, key, 64)
            self.fn = torch.compile(self.model, mode=self.compile_mode, dynamic=False)

    def start(self, batch: int, capacity: int) -> None:
        from transformers import StaticCache

        self.cache = None
        gc.collect()
        self.cache = StaticCache(config=self.model.config, max_cache_len=capacity)
        self.pos = 0

    def _forward(self, fn: Any, ids: Any) -> np.ndarray:
        import torch

        n = ids.shape[1]
        with torch.inference_mode():
            out = fn(
                input_ids=ids,
                cache=self.cache,
                cache_position=torch.arange(self.pos, self.pos + n),
                use_cache=True,
                logits_to_keep=1,
            )
            logits = out.logits[:, -1].clone()
            logits[:, self.eos] = -torch.inf
            nxt = logits.argmax(-1)
        self.pos += n
        return nxt.numpy().astype(np.int64)

    def prefill(self, ids: np.ndarray, *, measured: bool = True) -> np.ndarray:
        import torch

        fn = self.fn if measured else self.model
        return self._forward(fn, torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        import torch

        ids = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1, 1))
        return self._forward(self.fn, ids)

    def describe(self) -> dict[str, Any]:
        import torch
        import transformers

        return {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "attention": "sdpa",
            "cache": "StaticCache (fp32), capacity per case",
            "compile_mode": self.compile_mode if self.compiled else None,
            "torch_threads": torch.get_num_threads(),
        }

    def close(self) -> None:
        self.fn = self.model = self.cache = None
        if self.compiled:
            import torch._dynamo as dynamo

            dynamo.reset()
        gc.collect()


# --------------------------------------------------------------------------------------------
# ONNX Runtime GenAI

ORT_PRECISIONS = {"fp32": "fp32", "int4": "4-bit", "int8": "8-bit"}


def build_ort_genai(
    model: PreparedModel, precision: str, extra_options: tuple[str, ...] = ()
) -> Path:
    """The model builder's output folder for ``precision``, built once (cached, atomic).

    Runs ``python -m onnxruntime_genai.models.builder -i HF -o OUT -p PRECISION -e cpu
    -c CACHE [--extra_options ...]`` with ``HF_HUB_OFFLINE=1``; its log is ``OUT/../*.log``.
    """
    tag = f"ort-genai-{precision}" + (f"-{'-'.join(extra_options)}" if extra_options else "")
    out = model.cache_dir / tag
    if (out / "genai_config.json").is_file():
        return out
    tmp = model.cache_dir / f"{tag}.partial"
    cache = model.cache_dir / f"{tag}.cache"
    for d in (tmp, cache):
        shutil.rmtree(d, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(model.folder), "-o", str(tmp), "-p", precision, "-e", "cpu", "-c", str(cache),
    ]  # fmt: skip
    if extra_options:
        cmd += ["--extra_options", *extra_options]
    _run_logged(cmd, model.cache_dir / f"{tag}.log")
    shutil.rmtree(cache, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _run_logged(cmd: list[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    log.info("running %s (log %s)", " ".join(cmd), log_path)
    with open(log_path, "w") as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"{cmd[:4]} failed (exit {proc.returncode}); log {log_path}:\n{tail}")


class OrtGenAIRuntime:
    """ONNX Runtime GenAI on its model builder's export (fp32, int4 or int8 weights)."""

    runtime = "onnxruntime-genai"
    compiles = False

    def __init__(self, precision: str = "fp32", extra_options: tuple[str, ...] = ()) -> None:
        if precision not in ORT_PRECISIONS:
            raise ValueError(f"precision {precision!r} not in {sorted(ORT_PRECISIONS)}")
        self.variant = precision
        self.precision = ORT_PRECISIONS[precision]
        self.extra_options = extra_options
        self.model: Any = None
        self.generator: Any = None
        self.path: Path | None = None

    def unavailable(self) -> str | None:
        for module, dist in (("onnxruntime_genai", "onnxruntime-genai"), ("onnx_ir", "onnx-ir")):
            if importlib.util.find_spec(module) is None:
                return f"{dist} is not installed (pip install -e '.[bench-llm]')"
        return None

    def batch_unsupported(self, batch: int) -> str | None:
        return None

    def prepare(self, model: PreparedModel, settings: Settings) -> None:
        import onnxruntime_genai as og

        self.path = build_ort_genai(model, self.variant, self.extra_options)
        config = og.Config(str(self.path))
        session = {"intra_op_num_threads": settings.threads, "inter_op_num_threads": 1}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
        self.model = og.Model(config)
        self.og = og

    def start(self, batch: int, capacity: int) -> None:
        self.generator = None
        params = self.og.GeneratorParams(self.model)
        # min_length = max_length: the eos logit is masked, so no sequence ends early
        params.set_search_options(max_length=capacity, min_length=capacity, batch_size=batch)
        self.generator = self.og.Generator(self.model, params)

    def prefill(self, ids: np.ndarray, *, measured: bool = True) -> np.ndarray:
        self.generator.append_tokens(np.ascontiguousarray(ids, dtype=np.int32))
        # the logits are computed; this call only picks the next tokens (no forward)
        self.generator.generate_next_token()
        return np.asarray(self.generator.get_next_tokens(), dtype=np.int64).copy()

    def step(self, tokens: np.ndarray) -> np.ndarray:
        # runs the forward over the tokens picked last time, then picks the next ones
        self.generator.generate_next_token()
        return np.asarray(self.generator.get_next_tokens(), dtype=np.int64).copy()

    def describe(self) -> dict[str, Any]:
        import onnxruntime_genai as og

        assert self.path is not None
        return {
            "onnxruntime_genai": og.__version__,
            "export": str(self.path),
            "export_bytes": _dir_bytes(self.path),
            "builder_extra_options": list(self.extra_options),
            "builder_defaults": (
                "MatMulNBits block 32, symmetric, accuracy_level 4 (int8 activations) on CPU"
                if self.variant in ("int4", "int8") and not self.extra_options
                else None
            ),
        }

    def close(self) -> None:
        self.generator = self.model = None
        gc.collect()


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# --------------------------------------------------------------------------------------------
# llama.cpp

GGUF_TYPES = {"f32": "fp32", "bf16": "bf16", "q8_0": "8-bit"}

#: The converter's BPE pre-tokenizer name per architecture: the synthetic tokenizer's hash is
#: unknown to ``get_vocab_base_pre``, so the benchmark names the architecture's own.
GGUF_PRE_TOKENIZER = {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama-bpe"}

_CONVERTER_SHIM = """
import sys
src, pre = sys.argv[1], sys.argv[2]
sys.path.insert(0, src)
sys.argv = ["convert_hf_to_gguf.py"] + sys.argv[3:]
import convert_hf_to_gguf as conv
try:
    from conversion.base import TextModel  # llama.cpp's converter split into a package
except ImportError:
    TextModel = conv.TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
conv.main()
"""


def find_llama_cpp_source(work_dir: Path) -> Path:
    """The ``vendor/llama.cpp`` folder of the installed ``llama-cpp-python``'s source distribution.

    Looks, in order, at ``$LLAMA_CPP_SRC`` (a folder holding ``convert_hf_to_gguf.py``), at
    ``<work_dir>/llama-cpp-src/llama_cpp_python-<version>/vendor/llama.cpp``, and otherwise
    fetches the sdist of the installed version with ``pip download --no-deps --no-binary :all:``
    (from pip's cache when it is there) into ``<work_dir>/llama-cpp-src`` and unpacks it.
    """
    env = os.environ.get("LLAMA_CPP_SRC")
    if env:
        if not (Path(env) / "convert_hf_to_gguf.py").is_file():
            raise FileNotFoundError(f"LLAMA_CPP_SRC={env} has no convert_hf_to_gguf.py")
        return Path(env)
    from importlib.metadata import version

    ver = version("llama-cpp-python")
    base = Path(work_dir) / "llama-cpp-src"
    src = base / f"llama_cpp_python-{ver}" / "vendor" / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").is_file():
        return src
    base.mkdir(parents=True, exist_ok=True)
    sdists = list(base.glob(f"llama_cpp_python-{ver}.tar.gz"))
    if not sdists:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={ver}", "-d", str(base)]  # fmt: skip
        _run_logged(cmd, base / "pip-download.log")
        sdists = list(base.glob(f"llama_cpp_python-{ver}.tar.gz"))
    if not sdists:
        raise FileNotFoundError(f"no llama_cpp_python-{ver}.tar.gz in {base}")
    prefix = f"llama_cpp_python-{ver}/vendor/llama.cpp/"
    with tarfile.open(sdists[0]) as tar:
        members = [
            m
            for m in tar.getmembers()
            if m.name.startswith(prefix)
            and any(
                m.name.startswith(prefix + p)
                for p in ("convert_hf_to_gguf.py", "conversion/", "gguf-py/", "LICENSE")
            )
        ]
        tar.extractall(base, members=members, filter="data")
    return src


def convert_gguf(model: PreparedModel, outtype: str) -> Path:
    """``<cache_dir>/gguf/<name>-<outtype>.gguf``, converted once by llama.cpp's converter.

    ``python convert_hf_to_gguf.py HF --outtype f32|bf16|q8_0 --outfile FILE``, run in a child
    process through a shim that fixes the BPE pre-tokenizer name (see
    :data:`GGUF_PRE_TOKENIZER`); the converter's own ``gguf-py`` is used; its log lies beside
    the file.
    """
    if outtype not in GGUF_TYPES:
        raise ValueError(f"outtype {outtype!r} not in {sorted(GGUF_TYPES)}")
    out = model.cache_dir / "gguf" / f"{model.spec.name}-{outtype}.gguf"
    if out.is_file():
        return out
    src = find_llama_cpp_source(model.work_dir)
    pre = GGUF_PRE_TOKENIZER[model.spec.model_class]
    tmp = out.with_suffix(".partial")
    cmd = [sys.executable, "-c", _CONVERTER_SHIM, str(src), pre, str(model.folder),
           "--outtype", outtype, "--outfile", str(tmp)]  # fmt: skip
    _run_logged(cmd, out.with_suffix(".log"))
    os.replace(tmp, out)
    return out


_GGML_TYPES = {0: "f32", 1: "f16", 8: "q8_0", 30: "bf16"}
"""ggml type ids of the K/V cache types llama.cpp offers here, for the JSON."""

_LLAMA_LOG_CALLBACK: Any = None


def _quiet_llama(llama_cpp: Any) -> None:
    """Silence llama.cpp's logging (once per process; the callback must stay referenced)."""
    global _LLAMA_LOG_CALLBACK
    if _LLAMA_LOG_CALLBACK is None:

        @llama_cpp.llama_log_callback
        def _silent(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            return None

        _LLAMA_LOG_CALLBACK = _silent
        llama_cpp.llama_log_set(_LLAMA_LOG_CALLBACK, ctypes.c_void_p(0))


class LlamaCppRuntime:
    """llama.cpp through ``llama-cpp-python``'s low-level API, on a GGUF of one type."""

    runtime = "llama.cpp"
    compiles = False

    def __init__(self, outtype: str = "f32") -> None:
        if outtype not in GGUF_TYPES:
            raise ValueError(f"outtype {outtype!r} not in {sorted(GGUF_TYPES)}")
        self.outtype = outtype
        self.variant = outtype.upper() if outtype == "q8_0" else outtype
        self.precision = GGUF_TYPES[outtype]
        self.model: Any = None
        self.ctx: Any = None
        self.ctx_key: tuple[int, int] | None = None
        self.batch: Any = None
        self.batch_size = 0
        self.path: Path | None = None

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("llama_cpp") is None:
            return (
                "llama-cpp-python is not installed (pip install -e '.[bench-llm]': "
                "built from source, minutes)"
            )
        if importlib.util.find_spec("sentencepiece") is None:
            return "sentencepiece is not installed (llama.cpp's converter imports it)"
        return None

    def batch_unsupported(self, batch: int) -> str | None:
        return None

    def prepare(self, model: PreparedModel, settings: Settings) -> None:
        import llama_cpp

        self.ll = llama_cpp
        self.threads = settings.threads
        self.eos = model.spec.special_ids[1]
        self.path = convert_gguf(model, self.outtype)
        _quiet_llama(llama_cpp)
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        self.model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        if self.n_vocab != model.spec.vocab_size:
            raise RuntimeError(f"GGUF vocabulary {self.n_vocab} != {model.spec.vocab_size}")

    def _free_ctx(self) -> None:
        if self.batch is not None:
            self.ll.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx is not None:
            self.ll.llama_free(self.ctx)
            self.ctx = None
            self.ctx_key = None

    def start(self, batch: int, capacity: int) -> None:
        ll = self.ll
        key = (batch, capacity)
        if self.ctx is not None and self.ctx_key == key:
            ll.llama_memory_clear(ll.llama_get_memory(self.ctx), True)
        else:
            self._free_ctx()
            cp = ll.llama_context_default_params()
            cp.n_ctx = batch * capacity
            cp.n_seq_max = batch
            cp.n_threads = self.threads
            cp.n_threads_batch = self.threads
            self.ctx = ll.llama_init_from_model(self.model, cp)
            if not self.ctx:
                raise RuntimeError(f"llama.cpp could not create a context {key}")
            self.ctx_key = key
            self.n_batch = ll.llama_n_batch(self.ctx)
            self.batch = ll.llama_batch_init(self.n_batch, 0, batch)
        self.batch_size = batch
        self.pos = 0

    def _decode(self, tokens: list[tuple[int, int, int, bool]]) -> list[np.ndarray]:
        """Decode ``(token, position, sequence, want_logits)`` entries in chunks of n_batch."""
        ll, out = self.ll, []
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            b = self.batch
            b.n_tokens = len(chunk)
            wanted = []
            for i, (tok, pos, seq, want) in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = pos
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = 1 if want else 0
                if want:
                    wanted.append(i)
            rc = ll.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for i in wanted:
                ptr = ll.llama_get_logits_ith(self.ctx, i)
                out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)))
        return out

    def prefill(self, ids: np.ndarray, *, measured: bool = True) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        n = ids.shape[1]
        entries = [
            (int(ids[s, p]), p, s, p == n - 1) for s in range(ids.shape[0]) for p in range(n)
        ]
        logits = self._decode(entries)
        self.pos = n
        return _greedy(np.stack(logits), self.eos)

    def step(self, tokens: np.ndarray) -> np.ndarray:
        entries = [(int(t), self.pos, s, True) for s, t in enumerate(np.asarray(tokens))]
        logits = self._decode(entries)
        self.pos += 1
        return _greedy(np.stack(logits), self.eos)

    def describe(self) -> dict[str, Any]:
        import llama_cpp

        assert self.path is not None
        cp = llama_cpp.llama_context_default_params()
        return {
            "llama_cpp_python": llama_cpp.__version__,
            "system_info": llama_cpp.llama_print_system_info().decode().strip(),
            "gguf": str(self.path),
            "gguf_bytes": self.path.stat().st_size,
            "n_batch": cp.n_batch,
            "n_ubatch": cp.n_ubatch,
            "flash_attn_type": {-1: "auto", 0: "disabled", 1: "enabled"}.get(
                cp.flash_attn_type, cp.flash_attn_type
            ),
            "kv_cache_type_k": _GGML_TYPES.get(cp.type_k, cp.type_k),
            "kv_cache_type_v": _GGML_TYPES.get(cp.type_v, cp.type_v),
            "api": "low-level (llama_decode / llama_get_logits_ith)",
        }

    def close(self) -> None:
        if getattr(self, "ll", None) is None:
            return
        self._free_ctx()
        if self.model is not None:
            self.ll.llama_model_free(self.model)
            self.model = None
        gc.collect()


#: The peers by name (the benchmark's default set, in its order); each call of a factory gives
#: a fresh, unprepared runtime.
PEERS: Mapping[str, RuntimeFactory] = MappingProxyType(
    {
        "torch-eager": lambda: TorchRuntime(compiled=False),
        "torch-compile": lambda: TorchRuntime(compiled=True),
        "ort-genai-fp32": lambda: OrtGenAIRuntime("fp32"),
        "ort-genai-int4": lambda: OrtGenAIRuntime("int4"),
        "llama.cpp-f32": lambda: LlamaCppRuntime("f32"),
        "llama.cpp-bf16": lambda: LlamaCppRuntime("bf16"),
        "llama.cpp-q8_0": lambda: LlamaCppRuntime("q8_0"),
    }
)

#: Variants run only when named: inductor's GEMM autotuning (long compiles) and ONNX Runtime
#: GenAI's 8-bit ``MatMulNBits`` (the other 8-bit format, beside llama.cpp's Q8_0).
OPTIONAL_PEERS: Mapping[str, RuntimeFactory] = MappingProxyType(
    {
        "torch-compile-max-autotune": lambda: TorchRuntime(
            compiled=True, compile_mode="max-autotune-no-cudagraphs"
        ),
        "ort-genai-int8": lambda: OrtGenAIRuntime("int8"),
    }
)

# --------------------------------------------------------------------------------------------
# the harness


def measure(rt: Runtime, model: PreparedModel, settings: Settings) -> PeerResult:
    """Prepare ``rt`` on ``model`` and time it as the module docstring says; then close it.

    Never raises for a runtime's failure: the result's ``error`` holds the reason (a missing
    package, a converter or runtime error with its traceback's last line).
    """
    base = {
        "runtime": rt.runtime,
        "variant": rt.variant,
        "precision": rt.precision,
        "model": model.spec.name,
        "threads": settings.threads,
    }
    reason = rt.unavailable()
    if reason:
        return PeerResult(**base, error=f"unavailable: {reason}")
    try:
        t0 = time.perf_counter()
        rt.prepare(model, settings)
        setup_s = time.perf_counter() - t0
        state = _Timings()
        _measure_prefill(rt, model.spec, settings, state)
        for ctx in settings.contexts:
            _measure_decode(rt, model.spec, settings, state, 1, ctx)
        note = rt.batch_unsupported(4) if settings.batch4_contexts else None
        if note is None:
            for ctx in settings.batch4_contexts:
                _measure_decode(rt, model.spec, settings, state, 4, ctx)
        extra = rt.describe()
        return PeerResult(
            **base,
            prefill_ms=MappingProxyType(state.prefill),
            decode_ms=MappingProxyType(state.decode[1]),
            decode_b4_ms=MappingProxyType(state.decode[4]),
            batch4_note=note if settings.batch4_contexts else "not asked",
            setup_s=setup_s,
            compile_s=state.warmup_s if rt.compiles else None,
            tokens=MappingProxyType(state.tokens),
            extra=MappingProxyType({**extra, "warmup_s": state.warmup_s}),
        )
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a result, not a crash
        log.warning("%s %s failed:\n%s", rt.runtime, rt.variant, traceback.format_exc())
        return PeerResult(**base, error=f"{type(exc).__name__}: {str(exc)[-500:]}")
    finally:
        with contextlib.suppress(Exception):
            rt.close()


@dataclass
class _Timings:
    prefill: dict[int, float] = field(default_factory=dict)
    decode: dict[int, dict[int, float]] = field(default_factory=lambda: {1: {}, 4: {}})
    tokens: dict[str, tuple[int, ...]] = field(default_factory=dict)
    warmup_s: float = 0.0


def _measure_prefill(rt: Runtime, spec: LLMSpec, settings: Settings, state: _Timings) -> None:
    for p in settings.prefill:
        ids = prompt_ids(spec, 1, p, settings.seed)
        rt.start(1, p + 1)
        t0 = time.perf_counter()
        rt.prefill(ids)
        state.warmup_s += time.perf_counter() - t0
        times = []
        for _ in range(settings.repeats):
            rt.start(1, p + 1)
            t0 = time.perf_counter()
            rt.prefill(ids)
            times.append(time.perf_counter() - t0)
        state.prefill[p] = statistics.median(times) * 1e3


def _measure_decode(
    rt: Runtime, spec: LLMSpec, settings: Settings, state: _Timings, batch: int, context: int
) -> None:
    ids = prompt_ids(spec, batch, context, settings.seed)
    rt.start(batch, settings.capacity(context))
    tok = rt.prefill(ids, measured=False)
    tokens = [int(tok[0])]
    times = []
    for k in range(settings.warmup_tokens + settings.decode_tokens):
        t0 = time.perf_counter()
        tok = rt.step(tok)
        dt = time.perf_counter() - t0
        if k < settings.warmup_tokens:
            state.warmup_s += dt
        else:
            times.append(dt)
        tokens.append(int(tok[0]))
    state.decode[batch][context] = statistics.median(times) * 1e3
    state.tokens[f"b{batch}c{context}"] = tuple(tokens)


# --------------------------------------------------------------------------------------------
# the physical limit


def measure_bandwidth(
    threads: int = 2, mib: int = 512, repeats: int = 5
) -> dict[str, float | int | str]:
    """Copy bandwidth in GB/s (STREAM's convention: bytes read + bytes written, best of N).

    Two float64 arrays of ``mib`` MiB each (far larger than the caches): ``np.copyto`` on one
    thread, and ``threads`` Python threads each copying its slice (numpy releases the GIL
    while copying); ``best_gbs`` is the larger.
    """
    n = mib * 2**20 // 8
    src = np.ones(n)
    dst = np.zeros(n)
    np.copyto(dst, src)
    nbytes = 2 * src.nbytes

    def one() -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            np.copyto(dst, src)
            best = min(best, time.perf_counter() - t0)
        return nbytes / best / 1e9

    def many() -> float:
        bounds = np.linspace(0, n, threads + 1).astype(int)
        best = float("inf")
        for _ in range(repeats):
            barrier = threading.Barrier(threads + 1)

            def work(lo: int, hi: int, barrier: threading.Barrier = barrier) -> None:
                barrier.wait()
                np.copyto(dst[lo:hi], src[lo:hi])

            pool = [
                threading.Thread(target=work, args=(bounds[i], bounds[i + 1]))
                for i in range(threads)
            ]
            for t in pool:
                t.start()
            t0 = time.perf_counter()
            barrier.wait()
            for t in pool:
                t.join()
            best = min(best, time.perf_counter() - t0)
        return nbytes / best / 1e9

    single = one()
    out: dict[str, float | int | str] = {"copy_1thread_gbs": single, "best_gbs": single}
    if threads > 1:
        multi = many()
        out[f"copy_{threads}threads_gbs"] = multi
        out["best_gbs"] = max(single, multi)
    out["array_mib"] = mib
    out["method"] = "np.copyto, float64, 2 x bytes per copy, best of repeats"
    return out


def physical_limit(
    spec: LLMSpec, bandwidth_gbs: float, settings: Settings, bandwidth: Mapping[str, Any]
) -> list[PeerResult]:
    """One result per weight precision: decode ms/token >= weight bytes / bandwidth.

    ``decode_ms[C]`` (and ``decode_b4_ms``: a batch-4 step reads the weights once) is the
    weights-only bound at every context; ``extra`` also gives the K/V bytes a token reads at
    each context (fp32 cache) and the bound with them.
    """
    out = []
    for precision, bpw in BYTES_PER_WEIGHT.items():
        wbytes = weight_bytes_per_token(spec, bpw)
        ms = wbytes / (bandwidth_gbs * 1e9) * 1e3
        contexts = sorted(set(settings.contexts) | set(settings.batch4_contexts))
        kv = {c: kv_bytes_per_token(spec, c) for c in contexts}
        out.append(
            PeerResult(
                runtime="limit",
                variant=precision,
                precision=precision,
                model=spec.name,
                threads=settings.threads,
                decode_ms=MappingProxyType({c: ms for c in settings.contexts}),
                decode_b4_ms=MappingProxyType({c: ms for c in settings.batch4_contexts}),
                extra=MappingProxyType(
                    {
                        "weight_bytes_per_token": wbytes,
                        "bytes_per_weight": bpw,
                        "bandwidth": dict(bandwidth),
                        "kv_bytes_per_token_fp32": {str(c): v for c, v in kv.items()},
                        "ms_with_kv": {
                            str(c): (wbytes + v) / (bandwidth_gbs * 1e9) * 1e3
                            for c, v in kv.items()
                        },
                    }
                ),
            )
        )
    return out
