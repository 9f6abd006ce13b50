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
  :func:`bench.llm_peer_llama_cpp.find_llama_cpp_source`; the converter's pre-tokenizer check is
  bypassed because the tokenizer is synthetic) and run through ``llama-cpp-python``'s
  **low-level** API (``llama_model_load_from_file``, ``llama_init_from_model``,
  ``llama_batch_init``, ``llama_decode``, ``llama_get_logits_ith``): a context of
  ``n_seq_max`` = batch, ``n_ctx`` = batch x capacity, ``n_threads`` = ``n_threads_batch`` =
  threads, otherwise llama.cpp's defaults (``n_batch`` 2048, ``n_ubatch`` 512, flash attention
  ``auto``, an f16 K/V cache). Batch 4 is four sequences in one ``llama_batch``.

:func:`bench.llm_limit.physical_limit` gives the bound no runtime can beat: weight bytes read
per decoded token (:func:`bench.llm_models.weight_bytes_per_token`) over the machine's copy
bandwidth (:func:`bench.llm_limit.measure_bandwidth`), at fp32, bf16, 8-bit and 4-bit weights.

``onnxruntime-genai`` and ``llama-cpp-python`` are optional (the ``bench-llm`` extra):
:meth:`Runtime.unavailable` says why a runtime cannot run here, and :func:`measure` returns a
result whose ``error`` says so instead of raising.

The modules: :mod:`bench.llm_runtime` (:class:`Settings`, :class:`PreparedModel`,
:class:`Runtime`, :class:`PeerResult`), one per peer family (:mod:`bench.llm_peer_torch`,
:mod:`bench.llm_peer_ort`, :mod:`bench.llm_peer_llama_cpp`), :mod:`bench.llm_limit` (the
physical limit); this one holds the peers by name and the harness.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from bench.llm_models import LLMSpec, prompt_ids
from bench.llm_peer_llama_cpp import LlamaCppRuntime
from bench.llm_peer_ort import OrtGenAIRuntime
from bench.llm_peer_torch import TorchRuntime
from bench.llm_runtime import PeerResult, PreparedModel, Runtime, RuntimeFactory, Settings

log = logging.getLogger(__name__)


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
