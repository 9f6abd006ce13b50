"""Decoders exported the way ``transformers`` documents it for deployment.

- :func:`static_cache_program`: ``transformers.integrations.executorch.
  convert_and_export_with_cache`` (ExecuTorch's path): a ``StaticCache`` of ``max_cache_len``
  positions registered as buffers the program updates in place; inputs ``input_ids`` ``[1, n]``
  and ``cache_position`` ``[n]`` (keywords), logits out; :func:`static_cache_archive` packs
  programs of several ``n`` (a prefill and a decode step) in one file.
- :func:`dynamic_cache_program`: ``export_with_dynamic_cache`` (a ``DynamicCache`` as input, the
  prompt's keys and values out): its archive's sample inputs pickle the ``DynamicCache``.

The models are :mod:`examples.decoders`' tiny specs (or any :class:`DecoderSpec`), with seeded
random weights, nothing downloaded. ``transformers`` is a development dependency.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from examples.decoders import DecoderSpec, get_decoder
from examples.export import _atomic_write

#: Positions of the static cache the tests use.
DEFAULT_CACHE = 64


def causal_lm(spec: DecoderSpec | str) -> Any:
    """The ``transformers`` causal LM of ``spec`` in eval mode, seeded, with the cache on."""
    spec = get_decoder(spec) if isinstance(spec, str) else spec
    model = spec.build().model
    model.config.use_cache = True
    return model


def static_cache_program(
    spec: DecoderSpec | str, max_cache_len: int = DEFAULT_CACHE, tokens: int = 1
) -> torch.export.ExportedProgram:
    """``convert_and_export_with_cache`` of ``spec`` with a static cache of ``max_cache_len``
    positions (batch 1), taking ``tokens`` tokens per call (1: its default, a decode step; more:
    a prefill of that many); :func:`static_cache_prefill_program` exports a symbolic count."""
    from transformers import GenerationConfig  # noqa: PLC0415 - a development dependency
    from transformers.integrations.executorch import (  # noqa: PLC0415
        convert_and_export_with_cache,
    )

    model = causal_lm(spec)
    model.generation_config = GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        cache_config={"batch_size": 1, "max_cache_len": max_cache_len},
    )
    if tokens == 1:
        return convert_and_export_with_cache(model)
    return convert_and_export_with_cache(
        model,
        example_input_ids=torch.zeros((1, tokens), dtype=torch.int64),
        example_cache_position=torch.arange(tokens, dtype=torch.int64),
    )


def static_cache_prefill_program(
    spec: DecoderSpec | str,
    max_cache_len: int = DEFAULT_CACHE,
    max_tokens: int = 32,
    batch: int = 1,
) -> torch.export.ExportedProgram:
    """``convert_and_export_with_cache`` of ``spec`` with a symbolic token count from 1 to
    ``max_tokens`` (``strict=True``; traced on 8 tokens) for ``batch`` sequences: one program
    that decodes (1 token) and prefills chunks of the prompt. TuneHub compiles it for the token
    counts 1, 16, 32, ... (its shape buckets) and feeds any prompt in chunks of those."""
    return static_cache_export(causal_lm(spec), max_cache_len, max_tokens, batch)


def static_cache_export(
    model: Any, max_cache_len: int, max_tokens: int, batch: int = 1
) -> torch.export.ExportedProgram:
    """:func:`static_cache_prefill_program` of an already built causal LM ``model`` (in its
    own dtype, on the CPU), for ``batch`` sequences at once (a static cache has its batch size
    built in: one export per batch size)."""
    from transformers import GenerationConfig  # noqa: PLC0415 - a development dependency
    from transformers.integrations.executorch import (  # noqa: PLC0415
        convert_and_export_with_cache,
    )

    model.generation_config = GenerationConfig(
        use_cache=True,
        cache_implementation="static",
        cache_config={"batch_size": batch, "max_cache_len": max_cache_len},
    )
    tokens = torch.export.Dim("tokens", min=1, max=max_tokens)
    example = min(8, max_tokens)
    return convert_and_export_with_cache(
        model,
        example_input_ids=torch.zeros((batch, example), dtype=torch.int64),
        example_cache_position=torch.arange(example, dtype=torch.int64),
        dynamic_shapes={"input_ids": {1: tokens}, "cache_position": {0: tokens}},
        strict=True,
    )


def static_cache_archive(
    spec: DecoderSpec | str,
    path: str | os.PathLike[str],
    max_cache_len: int = DEFAULT_CACHE,
    prompts: tuple[int, ...] = (1, 16),
) -> Path:
    """One ``.pt2`` archive of :func:`static_cache_program` exports of ``spec`` at each token
    count of ``prompts`` (programs ``tokens_<n>``), the same cache in each: a decoder that
    prefills ``max(prompts)`` tokens per call and decodes one. Written atomically; returns the
    path."""
    from torch.export.pt2_archive._package import package_pt2  # noqa: PLC0415

    programs = {
        f"tokens_{n}": static_cache_program(spec, max_cache_len, n) for n in sorted(set(prompts))
    }
    return _atomic_write(Path(path), lambda f: package_pt2(f, exported_programs=programs))


def dynamic_cache_program(spec: DecoderSpec | str, seq: int = 8) -> torch.export.ExportedProgram:
    """``export_with_dynamic_cache`` of ``spec`` on ``[1, seq]`` token ids and an all-ones
    attention mask."""
    from transformers.integrations.executorch import export_with_dynamic_cache  # noqa: PLC0415

    model = causal_lm(spec)
    ids = torch.arange(1, seq + 1, dtype=torch.int64).reshape(1, seq)
    return export_with_dynamic_cache(model, ids, torch.ones_like(ids))


def save(program: torch.export.ExportedProgram, path: str | os.PathLike[str]) -> Path:
    """``torch.export.save`` ``program`` to ``path`` atomically; returns the path."""
    return _atomic_write(Path(path), lambda f: torch.export.save(program, f))
