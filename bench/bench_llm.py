"""The LLM benchmark of issue 32: TuneHub beside ONNX Runtime GenAI, llama.cpp and torch.

``python -m bench.bench_llm --models qwen2.5-0.5b [--runtimes ...] [--tuned-trials N]`` runs
:mod:`bench.llm_compare` (the peers, the bandwidth limit, the report in ``bench/results/``)
with TuneHub's runtimes registered:

- ``tunehub-zero``: the decoder exported the way ``transformers`` documents it for deployment
  (``convert_and_export_with_cache``: a static KV cache, a symbolic token count from 1 to
  :data:`MAX_TOKENS`) from the same ``save_pretrained`` folder the peers convert, compiled by
  ``tunehub compile`` with no tuning (library peers and TVM's default schedules), run through
  :class:`compiler.llm.generate.Generator` (the cache kept as the library's state, written in
  place; a prompt fed in chunks of the compiled token counts);
- ``tunehub-zero-bf16``: the same exported in bfloat16 (named with ``--runtimes``);
- ``tunehub-zero-q8`` / ``-q4``: the float32 export compiled with ``--weights q8_0`` /
  ``q4_0`` (llama.cpp's 8- and 4-bit blocks, applied at load:
  :mod:`compiler.weights.weight_formats`);
- ``tunehub-tuned``: the same after ``tunehub tune --trials N`` (named with ``--runtimes``).

Compiling happens once per model (cached under the work dir, like the peers' conversions) and
is reported as ``setup_s``. Batch 4 is a separate export and artifact (a static cache has its
batch size built in), compiled the same way when the settings ask for batch 4.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.llm_compare import main, register_runtime
from bench.llm_runtime import PreparedModel, Settings

#: The largest prompt chunk the export takes (TuneHub compiles 1, 16, 32, 64, 128).
MAX_TOKENS = 128
REPO = Path(__file__).resolve().parents[1]


def _export(
    folder: Path, path: Path, capacity: int, dtype: str = "float32", batch: int = 1
) -> None:
    """The deployment export of the model in ``folder`` in ``dtype`` for ``batch`` sequences
    (:func:`examples.hf_exports.static_cache_export`), written atomically to ``path`` in a child
    process (torch's export holds the model's memory)."""
    code = f"""
import torch
from pathlib import Path
from bench.llm_models import load_saved_model
from examples.export import _atomic_write
from examples.hf_exports import static_cache_export
model = load_saved_model(Path({str(folder)!r})).to(torch.{dtype})
program = static_cache_export(model, {capacity}, {MAX_TOKENS}, {batch})
_atomic_write(Path({str(path)!r}), lambda f: torch.export.save(program, f))
"""
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


class TuneHubRuntime:
    """TuneHub's compiled decoder (see the module docstring)."""

    runtime = "tunehub"
    precision = "fp32"
    compiles = False

    def __init__(self, trials: int = 0, precision: str = "fp32") -> None:
        self.trials = trials
        self.precision = precision
        self.dtype = "bfloat16" if precision == "bf16" else "float32"
        self.weights = {"8-bit": "q8_0", "4-bit": "q4_0"}.get(precision, "as_exported")
        self.variant = f"tuned ({trials} trials)" if trials else "zero-trial"
        if self.weights != "as_exported":
            self.variant += f" {self.weights.upper()}"
        self.generator: Any = None
        self.generators: dict[int, Any] = {}  # by batch size: one artifact each
        self.details: dict[str, Any] = {}

    def unavailable(self) -> str | None:
        return None

    def batch_unsupported(self, batch: int) -> str | None:
        return None if batch in (1, 4) else "batch 1 and 4 are compiled (one export each)"

    def prepare(self, model: PreparedModel, settings: Settings) -> None:
        from compiler.llm.generate import Generator

        os.environ["TVM_NUM_THREADS"] = str(settings.threads)
        capacity = max(settings.capacity(c) for c in settings.contexts)
        capacity = -(-capacity // 64) * 64
        folder = model.cache_dir / "tunehub"
        folder.mkdir(parents=True, exist_ok=True)
        # The export is in the dtype; a weight format is applied to it at compile.
        dtype_tag = "-bf16" if self.dtype == "bfloat16" else ""
        weights_tag = "" if self.weights == "as_exported" else f"-{self.weights}"
        start = time.perf_counter()
        batches = [1] + ([4] if settings.batch4_contexts else [])
        artifacts = {}
        for batch in batches:  # every compile before any library is loaded: memory
            batch_tag = f"-b{batch}" if batch > 1 else ""
            tag = dtype_tag + weights_tag + batch_tag
            program = folder / f"static-{capacity}{dtype_tag}{batch_tag}.pt2"
            if not program.is_file():
                _export(model.folder, program, capacity, self.dtype, batch)
            out = folder / ((f"tuned-{self.trials}" if self.trials else "zero-trial") + tag)
            if not (out / "manifest.json").is_file():
                self._compile(program, out, folder, settings.threads)
            artifacts[batch] = out
        for batch, out in artifacts.items():
            self.generators[batch] = Generator.load(out)
            manifest = json.loads((out / "manifest.json").read_text())
            if batch == 1:
                self.details["generation_check"] = (manifest.get("generation") or {}).get("message")
                self.details["weights_bytes"] = (manifest.get("weights") or {}).get("bytes")
            else:
                self.details[f"generation_check_b{batch}"] = (manifest.get("generation") or {}).get(
                    "message"
                )
        self.details.update(
            {
                "setup_s": time.perf_counter() - start,
                "capacity": capacity,
                "export": "convert_and_export_with_cache, tokens 1..128 symbolic",
                "batches": batches,
            }
        )
        self.generator = self.generators[1]
        self.eos = model.spec.special_ids[1]

    def _compile(self, program: Path, out: Path, folder: Path, threads: int) -> None:
        env = {**os.environ, "TVM_NUM_THREADS": str(threads)}
        if self.trials:
            command = [
                "tune", str(program), "--trials", str(self.trials), "-o", str(out),
                "--db", f"sqlite:///{folder / 'tunehub.db'}", "--num-cores", str(threads),
            ]  # fmt: skip
        else:
            command = ["compile", str(program), "-o", str(out), "--num-cores", str(threads)]
        command += ["--weights", self.weights]
        subprocess.run(
            [sys.executable, "-m", "service.cli", *command], cwd=REPO, env=env, check=True
        )

    def start(self, batch: int, capacity: int) -> None:
        self.generator = self.generators[batch]
        if capacity > self.generator.signature.capacity:
            raise ValueError(
                f"capacity {capacity} > the export's {self.generator.signature.capacity}"
            )
        self.generator.reset()

    def _next(self, logits: np.ndarray) -> np.ndarray:
        logits = np.array(logits, dtype=np.float32, copy=True)
        logits[:, self.eos] = -np.inf
        return logits.argmax(axis=-1).astype(np.int64)

    def prefill(self, ids: np.ndarray, *, measured: bool = True) -> np.ndarray:
        return self._next(self.generator.prefill(np.asarray(ids, dtype=np.int64)))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        return self._next(self.generator.step(np.asarray(tokens, dtype=np.int64).reshape(-1, 1)))

    def describe(self) -> dict[str, Any]:
        return dict(self.details)

    def close(self) -> None:
        self.generator = None
        self.generators = {}


def run(argv: list[str] | None = None) -> int:
    """Register TuneHub's runtimes (``--tuned-trials N``: the tuned one too) and run the
    comparison."""
    args = list(sys.argv[1:] if argv is None else argv)
    trials = 0
    if "--tuned-trials" in args:
        index = args.index("--tuned-trials")
        trials = int(args[index + 1])
        del args[index : index + 2]
    register_runtime("tunehub-zero", TuneHubRuntime)
    # bfloat16 weights and activations, as exported (a CPU with AVX512_BF16 or AMX runs them
    # natively; elsewhere LLVM widens them): named with --runtimes.
    register_runtime("tunehub-zero-bf16", lambda: TuneHubRuntime(precision="bf16"), default=False)
    register_runtime("tunehub-zero-q8", lambda: TuneHubRuntime(precision="8-bit"), default=False)
    register_runtime("tunehub-zero-q4", lambda: TuneHubRuntime(precision="4-bit"), default=False)
    if trials:
        register_runtime("tunehub-tuned", lambda: TuneHubRuntime(trials))
    return main(args)


if __name__ == "__main__":
    sys.exit(run())
