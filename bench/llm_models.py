"""Decoder configurations of the LLM benchmark (issue 32), built at run time with random weights.

Nothing is downloaded: each :class:`LLMSpec` is a ``transformers`` config class and its values;
:func:`build_model` instantiates the causal LM with seeded random weights (eval mode, fp32) and
:func:`save_model_folder` writes it the way a user hands a model to the peer runtimes'
converters: ``save_pretrained`` (``config.json``, ``generation_config.json``,
``model.safetensors``) plus a tokenizer written here (see below). ``HF_HUB_OFFLINE=1`` works.

The configurations (:data:`LLM_SPECS`):

- ``qwen2.5-0.5b``: ``Qwen2Config``, hidden 896, 24 layers, 14 query / 2 key-value heads (GQA,
  head size 64), SiLU-gated MLP of 4864, vocabulary 151,936, tied embeddings, rope theta 1e6,
  RMSNorm eps 1e-6, 32,768 positions; q/k/v biases (Qwen2's). 494 M parameters.
- ``tinyllama-1.1b``: ``LlamaConfig``, hidden 2048, 22 layers, 32 / 4 heads (head size 64), MLP
  of 5632, vocabulary 32,000, untied LM head, rope theta 1e4, eps 1e-5, 2,048 positions. 1.10 B.
- ``qwen2.5-tiny`` and ``tinyllama-tiny``: the same architectures (GQA, tied / untied head,
  biases) at hidden 64, 2 layers, vocabulary 512, for tests; their weights have a larger standard
  deviation (0.1, like :data:`examples.decoders.INIT_STD`) so the logits have clear maxima and
  greedy tokens can be compared across runtimes.

**Contract of a model folder** (:func:`save_model_folder`): ``<work_dir>/models/<name>-s<seed>/hf``
holds a folder that ``AutoModelForCausalLM.from_pretrained`` loads offline into the very weights
:func:`build_model` gives for the same ``(spec, seed)``; it is written once and reused (a
``bench_complete.json`` marker, written last, records the spec; a folder without it or of another
spec is rewritten). Never inside the repository: callers pass a work dir (default
``/tmp/tunehub-llm-bench``).

**The tokenizer** is a byte-level BPE written with the ``tokenizers`` package: the 256 byte
symbols, then synthetic merges (every pair of byte symbols, then longer strings) up to the
vocabulary size less three, then three special tokens at the last ids: ``<|bos|>``,
``<|endoftext|>`` (eos: the name Qwen2's tokenizer class expects, else it adds a token),
``<|pad|>`` (also the config's ``bos/eos/pad_token_id``). It encodes nothing meaningful: the
benchmark feeds token ids and never tokenizes; the file exists because llama.cpp's
``convert_hf_to_gguf.py`` and ONNX Runtime GenAI's model builder read a tokenizer from the
folder. Prompts are drawn with :func:`prompt_ids` from ``[0, vocab - 3)``, never a special token.

Weight bytes read per decoded token (:func:`weight_bytes_per_token`) count every linear layer's
weight (q, k, v, o, gate, up, down; the LM head) at the given bytes per weight, plus the vectors
(norm weights, biases) and one embedding row at fp32; a tied embedding counts once, as the head.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

DEFAULT_WORK_DIR = Path("/tmp/tunehub-llm-bench")
"""Where model folders and converted files are cached unless the caller says otherwise."""

N_SPECIAL = 3
"""Special tokens at the end of every vocabulary: bos, eos, pad (in that order)."""

MARKER = "bench_complete.json"

#: Bytes per weight of the formats the physical limit is computed for: fp32, bf16, 8-bit as
#: llama.cpp's Q8_0 (blocks of 32 int8 + one fp16 scale: 34 bytes / 32 weights) and 4-bit as
#: Q4_0 (16 bytes of nibbles + one fp16 scale: 18 bytes / 32). ONNX Runtime GenAI's int4
#: ``MatMulNBits`` (block 32, fp32 scales) reads 20 / 32 bytes a weight: a little more.
BYTES_PER_WEIGHT: Mapping[str, float] = MappingProxyType(
    {"fp32": 4.0, "bf16": 2.0, "8-bit": 34 / 32, "4-bit": 18 / 32}
)


@dataclass(frozen=True)
class LLMSpec:
    """A decoder configuration: ``config_class`` of ``transformers`` with ``values``.

    ``model_class`` is the causal-LM class (``Qwen2ForCausalLM``/``LlamaForCausalLM``).
    ``init_std`` overrides ``initializer_range`` (the weight standard deviation).
    """

    name: str
    model_class: str
    config_class: str
    values: Mapping[str, Any]
    init_std: float
    description: str

    @property
    def vocab_size(self) -> int:
        return int(self.values["vocab_size"])

    @property
    def max_positions(self) -> int:
        return int(self.values["max_position_embeddings"])

    @property
    def special_ids(self) -> tuple[int, int, int]:
        """``(bos, eos, pad)``: the last three ids of the vocabulary."""
        v = self.vocab_size
        return v - 3, v - 2, v - 1

    def make_config(self) -> Any:
        """The ``transformers`` config object (fp32, eager-free defaults: ``sdpa`` attention)."""
        import transformers

        bos, eos, pad = self.special_ids
        cls = getattr(transformers, self.config_class)
        config = cls(
            **dict(self.values),
            initializer_range=self.init_std,
            bos_token_id=bos,
            eos_token_id=eos,
            pad_token_id=pad,
        )
        config.architectures = [self.model_class]
        config.dtype = "float32"
        return config

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model_class": self.model_class,
            "config_class": self.config_class,
            "values": dict(self.values),
            "init_std": self.init_std,
        }


def _qwen2(name: str, description: str, init_std: float, **values: Any) -> LLMSpec:
    base = {
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "use_sliding_window": False,
        "hidden_act": "silu",
    }
    return LLMSpec(
        name,
        "Qwen2ForCausalLM",
        "Qwen2Config",
        MappingProxyType({**base, **values}),
        init_std,
        description,
    )


def _llama(name: str, description: str, init_std: float, **values: Any) -> LLMSpec:
    base = {
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0},
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    return LLMSpec(
        name,
        "LlamaForCausalLM",
        "LlamaConfig",
        MappingProxyType({**base, **values}),
        init_std,
        description,
    )


LLM_SPECS: dict[str, LLMSpec] = {
    spec.name: spec
    for spec in (
        _qwen2(
            "qwen2.5-0.5b",
            "Qwen2.5-0.5B shape: hidden 896, 24 layers, GQA 14/2, vocab 151,936, tied",
            0.02,
            vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
            num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32_768,
            max_window_layers=24,
        ),
        _llama(
            "tinyllama-1.1b",
            "TinyLlama-1.1B shape: hidden 2048, 22 layers, GQA 32/4, vocab 32,000, untied",
            0.02,
            vocab_size=32_000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
            num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
        ),
        _qwen2(
            "qwen2.5-tiny",
            "Qwen2.5 architecture for tests: hidden 64, 2 layers, GQA 4/2, vocab 512, tied",
            0.1,
            vocab_size=512, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
            max_window_layers=2,
        ),
        _llama(
            "tinyllama-tiny",
            "TinyLlama architecture for tests: hidden 64, 2 layers, GQA 4/2, vocab 512, untied",
            0.1,
            vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        ),
    )
}  # fmt: skip
"""The benchmark's decoders by name: the two real shapes and their tiny test versions."""

TINY_SPECS = ("qwen2.5-tiny", "tinyllama-tiny")
REAL_SPECS = ("qwen2.5-0.5b", "tinyllama-1.1b")


def get_spec(name: str) -> LLMSpec:
    """The spec named ``name``; ``KeyError`` naming the known ones otherwise."""
    try:
        return LLM_SPECS[name]
    except KeyError:
        raise KeyError(f"unknown LLM spec {name!r}; known: {sorted(LLM_SPECS)}") from None


def build_model(spec: LLMSpec, seed: int = 0) -> Any:
    """The causal LM of ``spec``: eval mode, fp32, weights a function of ``seed`` alone.

    The caller's global torch RNG state is saved and restored. Attention is ``sdpa``.
    """
    import torch
    import transformers

    config = spec.make_config()
    config._attn_implementation = "sdpa"  # noqa: SLF001 - transformers' documented switch
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, spec.model_class)(config)
    return model.to(torch.float32).eval()


def count_parameters(spec: LLMSpec) -> int:
    """Parameters of ``spec`` (a tied embedding counted once), from the config alone."""
    m = _matrix_sizes(spec)
    return m["linear"] + m["head"] + m["embedding"] + m["vectors"]


def _matrix_sizes(spec: LLMSpec) -> dict[str, int]:
    v = spec.values
    h, i, n = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    heads, kv = int(v["num_attention_heads"]), int(v["num_key_value_heads"])
    d = int(v.get("head_dim") or h // heads)
    vocab = spec.vocab_size
    q, kvd = heads * d, kv * d
    per_layer = h * q + 2 * h * kvd + q * h + 3 * h * i
    biases = (q + 2 * kvd) if spec.model_class == "Qwen2ForCausalLM" else 0
    vectors = n * (2 * h + biases) + h  # two RMSNorms a layer, biases, the final norm
    tied = bool(v.get("tie_word_embeddings"))
    return {
        "linear": n * per_layer,
        "head": vocab * h,
        "embedding": 0 if tied else vocab * h,
        "vectors": vectors,
        "hidden": h,
        "tied": int(tied),
        "kv_per_position": n * 2 * kvd,
    }


def weight_bytes_per_token(spec: LLMSpec, bytes_per_weight: float) -> float:
    """Bytes of weights one decoded token reads (see the module docstring)."""
    m = _matrix_sizes(spec)
    return (m["linear"] + m["head"]) * bytes_per_weight + (m["vectors"] + m["hidden"]) * 4.0


def kv_bytes_per_token(spec: LLMSpec, context: int, bytes_per_value: float = 4.0) -> float:
    """Bytes of K/V cache one decoded token reads at ``context`` positions (fp32 by default)."""
    return _matrix_sizes(spec)["kv_per_position"] * context * bytes_per_value


def prompt_ids(spec: LLMSpec, batch: int, length: int, seed: int = 0) -> np.ndarray:
    """``int64 [batch, length]`` token ids, uniform over ``[0, vocab - 3)`` (no special id).

    Row ``r`` depends on ``(seed, r, length)`` only, so batch 1 is row 0 of batch 4.
    """
    rows = [
        np.random.default_rng([seed, r, length]).integers(0, spec.vocab_size - N_SPECIAL, length)
        for r in range(batch)
    ]
    return np.stack(rows).astype(np.int64)


def _byte_symbols() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 printable symbols of byte-level BPE, in order."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def write_tokenizer(spec: LLMSpec, folder: Path) -> None:
    """Write a byte-level BPE tokenizer of exactly ``spec.vocab_size`` ids into ``folder``.

    ``tokenizer.json`` and ``tokenizer_config.json`` (through ``transformers``'
    ``PreTrainedTokenizerFast.save_pretrained``); see the module docstring for the layout.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    n_plain = spec.vocab_size - N_SPECIAL
    if n_plain < 256:
        raise ValueError(f"{spec.name}: a vocabulary of {spec.vocab_size} has no room for bytes")
    symbols = _byte_symbols()
    vocab: dict[str, int] = {s: i for i, s in enumerate(symbols)}
    merges: list[tuple[str, str]] = []
    level = symbols
    while len(vocab) < n_plain:
        nxt: list[str] = []
        for left in level:
            for right in symbols:
                if len(vocab) >= n_plain:
                    break
                token = left + right
                if token in vocab:
                    continue
                vocab[token] = len(vocab)
                merges.append((left, right))
                nxt.append(token)
            if len(vocab) >= n_plain:
                break
        level = nxt
    bpe = models.BPE(vocab=vocab, merges=merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|bos|>", "<|endoftext|>", "<|pad|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    got = [tok.token_to_id(s) for s in specials]
    if got != list(spec.special_ids):
        raise AssertionError(f"special tokens at {got}, expected {list(spec.special_ids)}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=specials[0],
        eos_token=specials[1],
        pad_token=specials[2],
        model_max_length=spec.max_positions,
    )
    fast.save_pretrained(str(folder))


def model_root(spec: LLMSpec, work_dir: Path, seed: int = 0) -> Path:
    """``<work_dir>/models/<name>-s<seed>``: the folder of everything derived from the weights."""
    return Path(work_dir) / "models" / f"{spec.name}-s{seed}"


def save_model_folder(spec: LLMSpec, work_dir: Path = DEFAULT_WORK_DIR, seed: int = 0) -> Path:
    """The ``save_pretrained`` folder of ``(spec, seed)`` under ``work_dir``, written if needed.

    Returns ``<work_dir>/models/<name>-s<seed>/hf`` (see the module docstring's contract).
    Refuses a ``work_dir`` inside this repository (a guard against writing gigabytes into it).
    """
    root = model_root(spec, work_dir, seed)
    folder = root / "hf"
    expected = {"spec": spec.to_json(), "seed": seed}
    marker = folder / MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == expected:
                return folder
        except (OSError, ValueError):
            pass
    _refuse_repo_path(folder)
    if folder.exists():
        shutil.rmtree(folder)
    tmp = root / "hf.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model = build_model(spec, seed)
    model.save_pretrained(str(tmp), safe_serialization=True)
    del model
    write_tokenizer(spec, tmp)
    (tmp / MARKER).write_text(json.dumps(expected, indent=1))
    os.replace(tmp, folder)
    log.info("wrote %s", folder)
    return folder


def _refuse_repo_path(path: Path) -> None:
    here = Path(__file__).resolve().parent.parent
    try:
        Path(path).resolve().relative_to(here)
    except ValueError:
        return
    raise ValueError(f"{path} is inside the repository {here}: pass a work dir outside it")


def load_saved_model(folder: Path) -> Any:
    """``AutoModelForCausalLM.from_pretrained(folder)`` in eval mode, fp32, ``sdpa``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.eval()
