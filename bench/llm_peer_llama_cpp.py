"""The ``llama.cpp-*`` peers of the LLM benchmark (:mod:`bench.llm_peers`): the model folder
converted to GGUF by llama.cpp's own converter (from ``llama-cpp-python``'s source distribution)
and run through ``llama-cpp-python``'s low-level API."""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import os
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from bench.llm_runtime import PreparedModel, Settings, _greedy, _run_logged
from compiler.target import cpu_flags

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
        if self.outtype == "q8_0" and "amx_int8" in cpu_flags():
            return (
                "llama.cpp's Q8_0 segfaults on this AMX-int8 CPU for batches of 4+ tokens "
                "(llama-cpp-python 0.3.36, in GOMP_parallel; 1 token works)"
            )
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
