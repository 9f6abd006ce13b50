"""The ``torch-eager`` and ``torch-compile`` peers of the LLM benchmark (:mod:`bench.llm_peers`):
``transformers``' model with a ``StaticCache``, eager or through ``torch.compile``."""

from __future__ import annotations

import gc
import importlib.util
from typing import Any

import numpy as np

from bench.llm_runtime import PreparedModel, Settings


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
