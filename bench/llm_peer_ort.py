"""The ``ort-genai-*`` peers of the LLM benchmark (:mod:`bench.llm_peers`): ONNX Runtime GenAI
on its model builder's export of the model folder (built once, cached)."""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bench.llm_runtime import PreparedModel, Settings, _run_logged

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
