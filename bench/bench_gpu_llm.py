"""LLM decode and prefill on the H200 (issue 34): TuneHub's zero-trial CUDA build of a decoder
exported the way ``transformers`` documents it, beside torch on the same weights, in one run.

    python -m bench.bench_gpu_llm [--model qwen2.5-0.5b] [--dtype bf16] [--contexts 128 1024]
        [--prefill 512] [--steps 64] [--batch 1] [--out DIR] [--tag T]

- The model: :mod:`bench.llm_models`' configuration (random weights, nothing downloaded) in
  ``--dtype``; exported by ``convert_and_export_with_cache`` (a ``StaticCache`` of capacity
  ``max(contexts, prefill) + steps`` rounded up to 64, token count symbolic 1..128, ``--batch``
  sequences: a static cache has its batch size built in), prepared for the
  GPU's CUDA target and built with no tuning (:func:`tuner.final_build.finalize.publish_zero_trial`:
  DLight's default GPU schedules, CUDA graphs on), verified (greedy tokens against the exported
  program on the CPU) and loaded from disk (:class:`compiler.llm.generate.Generator`: the cache is
  device state written in place).
- **TuneHub**: decode ms/token at each context (the prompt fed first, then ``--steps`` steps, the
  median step; a step is the library call with the token's ids copied in and the logits copied
  out), prefill of ``--prefill`` tokens (chunks of 128; the library returns the last
  position's logits, :mod:`compiler.llm.last_logits`). At ``--batch`` B every sequence gets the
  same prompt and a step feeds B tokens: its time is per step (B tokens).
- **torch eager** and **torch.compile(mode="reduce-overhead")** (CUDA graphs): the same weights
  on the GPU, a decode loop over the model's forward with ``transformers``' ``StaticCache`` of the
  same capacity (the compiled step is ``fullgraph``; ``generate()`` with it fails under CUDA
  graphs), greedy argmax on the device, one ``.item()``-free sync per step; the prefill
  computes the last position's logits only (``logits_to_keep=1``, as ``generate`` does).
- **The limit**: weight bytes read per token (every parameter once; tied embeddings once, as the
  LM head) divided by the measured device-to-device copy bandwidth (bytes read + written).

Writes ``gpu_llm_<date>[_tag].json`` / ``.md`` into ``--out`` after every stage.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
MAX_TOKENS = 128


def copy_bandwidth(nbytes: int = 1 << 30, repeat: int = 20) -> float:
    """Bytes per second a device-to-device copy moves (read + write), the median of ``repeat``."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeat + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * nbytes / statistics.median(times[2:])


def export_static(model: Any, capacity: int, path: Path, batch: int = 1) -> None:
    """``convert_and_export_with_cache`` of ``model`` (on the CPU): a static cache of ``capacity``
    positions for ``batch`` sequences, 1..:data:`MAX_TOKENS` tokens a call, saved to ``path``."""
    import torch

    from examples.hf_exports import static_cache_export

    torch.export.save(static_cache_export(model, capacity, MAX_TOKENS, batch), path)


def build_tunehub(program: Path, out: Path) -> dict[str, Any]:
    """The zero-trial CUDA library of ``program`` in ``out`` (verified); its manifest's summary."""
    from compiler.frontends.model_spec import ModelLimits
    from compiler.prepare import prepare_model
    from compiler.target import cuda_target, detect_gpu
    from tuner.final_build.finalize import publish_zero_trial

    gpu = detect_gpu()
    if gpu is None:
        raise RuntimeError("no CUDA GPU here")
    start = time.perf_counter()
    # The CLI's limits for a local file (the upload default of 512 MiB is below a 0.5 B model).
    big = ModelLimits(max_bytes=1 << 33, max_constant_bytes=1 << 33, max_constant_elements=1 << 32)
    prepared = prepare_model(program, cuda_target(gpu), limits=big)
    prepared_s = time.perf_counter() - start
    manifest = publish_zero_trial(prepared, out, force=True)
    return {
        "prepare_s": prepared_s,
        "build_and_verify_s": time.perf_counter() - start - prepared_s,
        "tasks": len(prepared.partition.tasks),
        "generation_check": (manifest.get("generation") or {}).get("message"),
        "verified": manifest.get("verification"),
        "peers": manifest.get("peers"),
    }


def time_tunehub(out: Path, prompt: np.ndarray, contexts: list[int], steps: int, prefill: int):
    """Decode ms/token at each context and prefill ms of ``prefill`` tokens (medians), plus the
    greedy tokens of the first context's steps."""
    from compiler.llm.generate import Generator

    generator = Generator.load(out)
    result: dict[str, Any] = {"decode_ms": {}, "tokens": None}
    for context in contexts:
        generator.reset()
        generator.prefill(prompt[:context])
        logits = generator.prefill(prompt[context : context + 1])
        times, tokens = [], []
        for _ in range(steps):
            token = logits.astype(np.float32).argmax(axis=-1)  # one per sequence
            tokens.append(int(token[0]))
            start = time.perf_counter()
            logits = generator.step(token)
            times.append(time.perf_counter() - start)
        result["decode_ms"][str(context)] = statistics.median(times[3:]) * 1e3
        if result["tokens"] is None:
            result["tokens"] = tokens
    prefills = []
    for _ in range(5):
        generator.reset()
        start = time.perf_counter()
        generator.prefill(prompt[:prefill])
        prefills.append(time.perf_counter() - start)
    result["prefill_ms"] = statistics.median(prefills[1:]) * 1e3
    result["vm_step_ms"] = vm_step_ms(generator.library, contexts[0], generator.signature.batch)
    result["kernels"], result["kernel_ms"] = kernel_profile(lambda: generator.step(1), 20)
    chunk = prompt[:MAX_TOKENS]
    result["prefill_kernels"], result["prefill_kernel_ms"] = kernel_profile(
        lambda: (generator.reset(), generator.prefill(chunk)), 3
    )
    return result


def vm_step_ms(library: Any, position: int, batch: int = 1) -> float:
    """Median ms of the one-token function's VM call alone (its inputs already on the device:
    no copies in or out, no Python), to split a step's time into the library's and the host's."""
    ids = np.ones((batch, 1), dtype="int64")
    positions = np.array([position], dtype="int64")
    function = library.function_for([ids, positions])
    library.vm.set_input(function, *library._to_device([ids, positions]))  # noqa: SLF001
    evaluator = library.vm.time_evaluator("invoke_stateful", library.device, number=20, repeat=7)
    return float(np.median(evaluator(function).results)) * 1e3


def kernel_profile(call: Any, calls: int) -> tuple[list[dict[str, Any]], float]:
    """The GPU kernels ``calls`` calls of ``call`` launch (CUPTI through ``torch.profiler``, which
    sees TVM's kernels too): name, launches per call, device ms per call; the top 15, and the
    device ms per call of all of them."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
    rows = []
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0)
        if total:
            rows.append(
                {
                    "kernel": event.key[:90],
                    "per_call": event.count / calls,
                    "ms_per_call": total / 1e3 / calls,
                }
            )
    total = sum(r["ms_per_call"] for r in rows)
    return sorted(rows, key=lambda r: -r["ms_per_call"])[:15], total


def time_torch(
    model: Any, mode: str, capacity: int, prompt: np.ndarray, contexts, steps, prefill, batch=1
):
    """The same measurements as :func:`time_tunehub` for torch on the GPU: ``mode`` ``eager`` or a
    ``torch.compile`` mode for the one-token step (prefill stays eager)."""
    import torch
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=capacity)

    def forward(ids, positions, keep=0):
        return model(
            input_ids=ids,
            cache_position=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=keep,
        ).logits

    def step_fn(ids, positions):
        return forward(ids, positions)[:, -1].argmax(dim=-1, keepdim=True)

    step = step_fn if mode == "eager" else torch.compile(step_fn, mode=mode, fullgraph=True)
    ids = torch.as_tensor(prompt, device="cuda").reshape(1, -1).expand(batch, -1).contiguous()
    result: dict[str, Any] = {"decode_ms": {}, "tokens": None}
    with torch.no_grad():
        for context in contexts:
            cache.reset()
            forward(ids[:, :context], torch.arange(context, device="cuda"))
            token = forward(ids[:, context : context + 1], torch.tensor([context], device="cuda"))
            token = token[:, -1].argmax(dim=-1, keepdim=True)
            times, tokens = [], []
            for index in range(steps):
                position = torch.tensor([context + 1 + index], device="cuda")
                tokens.append(token[0])
                torch.cuda.synchronize()
                start = time.perf_counter()
                token = step(token.clone(), position).clone()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
            result["decode_ms"][str(context)] = statistics.median(times[3:]) * 1e3
            if result["tokens"] is None:
                result["tokens"] = [int(t.item()) for t in tokens]
        prefills = []
        for _ in range(5):
            cache.reset()
            torch.cuda.synchronize()
            start = time.perf_counter()
            forward(ids[:, :prefill], torch.arange(prefill, device="cuda"), keep=1)
            torch.cuda.synchronize()
            prefills.append(time.perf_counter() - start)
        result["prefill_ms"] = statistics.median(prefills[1:]) * 1e3
    return result


def write_report(out: Path, report: dict[str, Any]) -> None:
    """The JSON and a Markdown table of ``report`` (written after every stage)."""
    stem = out / f"gpu_llm_{report['date']}{('_' + report['tag']) if report['tag'] else ''}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    limit = report.get("limit_ms")
    contexts = report["contexts"]
    lines = [
        f"# LLM decode on the GPU, {report['model']} {report['dtype']} ({report['date']})",
        "",
        f"Machine: {report.get('gpu')}; {report.get('versions')}. Random weights; batch "
        f"{report.get('batch', 1)} (a decode step feeds one token per sequence); "
        f"a static cache of {report['capacity']} positions. Command: `{report['command']}`.",
        "",
        f"Weights read per token: {report.get('weight_bytes', 0) / 1e6:.0f} MB; copy bandwidth "
        f"{(report.get('bandwidth') or 0) / 1e12:.2f} TB/s; **limit "
        f"{limit if limit is None else round(limit, 3)} ms/token**.",
        "",
        "| runtime | "
        + " | ".join(f"decode ms/token @ {c}" for c in contexts)
        + " | % of limit (first context) | prefill "
        + f"{report['prefill']} ms | greedy tokens = torch eager's |",
        "|---|" + "---|" * (len(contexts) + 3),
    ]
    eager_tokens = (report["runs"].get("torch eager") or {}).get("tokens")
    for name, run in report["runs"].items():
        if "error" in run:
            lines.append(f"| {name} | error: {run['error'][:160]} |")
            continue
        decode = run["decode_ms"]
        first = decode.get(str(contexts[0]))
        share = f"{100 * limit / first:.0f} %" if limit and first else "-"
        same = "-" if not eager_tokens or name == "torch eager" else run["tokens"] == eager_tokens
        lines.append(
            f"| {name} | "
            + " | ".join(f"{decode.get(str(c), float('nan')):.3f}" for c in contexts)
            + f" | {share} | {run['prefill_ms']:.2f} | {same} |"
        )
    tunehub = report["runs"].get("TuneHub zero-trial") or {}
    if tunehub.get("vm_step_ms") is not None:
        step = tunehub["decode_ms"].get(str(contexts[0]))
        lines += [
            "",
            f"A TuneHub step at context {contexts[0]}: {step:.3f} ms in all, of which the "
            f"library's VM call {tunehub['vm_step_ms']:.3f} ms (inputs already on the device) "
            f"and its kernels {tunehub['kernel_ms']:.3f} ms of device time (CUPTI).",
        ]
    for key, what in (("kernels", "one decode step"), ("prefill_kernels", "a 128-token chunk")):
        kernels = tunehub.get(key)
        if not kernels:
            continue
        lines += ["", f"TuneHub's kernels in {what} (CUPTI, the top 15):", ""]
        lines += ["| kernel | launches | ms |", "|---|---|---|"]
        lines += [
            f"| `{k['kernel']}` | {k['per_call']:g} | {k['ms_per_call']:.4f} |" for k in kernels
        ]
    if report.get("build"):
        lines += ["", f"TuneHub build: `{json.dumps(report['build'], default=str)[:600]}`"]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--contexts", type=int, nargs="+", default=[128, 1024])
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--work", type=Path, default=Path("/tmp/tunehub-gpu-llm"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--skip", nargs="*", default=[], help="runtimes to leave out")
    parser.add_argument("--layers", type=int, default=0, help="keep this many layers (0: all)")
    parser.add_argument("--batch", type=int, default=1, help="sequences decoded together")
    args = parser.parse_args(argv)

    import torch

    from bench.llm_models import build_model, count_parameters, get_spec, prompt_ids

    spec = get_spec(args.model)
    if args.layers:  # a shallower copy: per-layer kernels as in the full model, a faster build
        values = {**spec.values, "num_hidden_layers": args.layers}
        spec = dataclasses.replace(spec, name=f"{spec.name}-{args.layers}l", values=values)
    capacity = -(-(max(*args.contexts, args.prefill) + args.steps + 8) // 64) * 64
    dtype = getattr(torch, DTYPES[args.dtype])
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    params = count_parameters(spec)
    report: dict[str, Any] = {
        "model": spec.name,
        "dtype": args.dtype,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "tag": args.tag,
        "command": "python -m bench.bench_gpu_llm " + " ".join(argv or sys.argv[1:]),
        "contexts": args.contexts,
        "prefill": args.prefill,
        "batch": args.batch,
        "capacity": capacity,
        "parameters": params,
        "weight_bytes": params * torch.finfo(dtype).bits // 8,
        "gpu": torch.cuda.get_device_name(0),
        "versions": f"torch {torch.__version__}",
        "runs": {},
    }
    report["bandwidth"] = copy_bandwidth()
    report["limit_ms"] = report["weight_bytes"] / report["bandwidth"] * 1e3
    prompt = prompt_ids(spec, 1, max(max(args.contexts), args.prefill) + 1, seed=0)[0]
    write_report(args.out, report)

    model = build_model(spec).to(dtype).eval()
    name = f"{spec.name}-{args.dtype}-{capacity}" + (f"-b{args.batch}" if args.batch > 1 else "")
    program = args.work / f"{name}.pt2"
    artifact = args.work / f"{name}-zero-trial"
    stages = [
        (
            "export",
            lambda: program.is_file() or export_static(model, capacity, program, args.batch),
        ),
        (
            "build",
            lambda: (
                (artifact / "manifest.json").is_file()
                or report.__setitem__("build", build_tunehub(program, artifact))
            ),
        ),
    ]
    for stage, action in stages:
        start = time.perf_counter()
        try:
            action()
        except Exception as err:  # noqa: BLE001 - reported in the table
            traceback.print_exc()
            failure = f"{stage}: {type(err).__name__}: {err}"
            report["runs"]["TuneHub zero-trial"] = {"error": failure}
            break
        report[f"{stage}_s"] = time.perf_counter() - start
        print(f"{stage}: {report[f'{stage}_s']:.1f} s", flush=True)
        write_report(args.out, report)
    runs: list[tuple[str, Any]] = []
    if "TuneHub zero-trial" not in report["runs"]:
        runs.append(
            (
                "TuneHub zero-trial",
                lambda: time_tunehub(artifact, prompt, args.contexts, args.steps, args.prefill),
            )
        )
    gpu_model = model.to("cuda")
    for mode in ("eager", "reduce-overhead"):
        name = "torch eager" if mode == "eager" else f'torch.compile "{mode}"'
        runs.append(
            (
                name,
                lambda mode=mode: time_torch(
                    gpu_model,
                    mode,
                    capacity,
                    prompt,
                    args.contexts,
                    args.steps,
                    args.prefill,
                    args.batch,
                ),
            )
        )
    for name, run in runs:
        if name in args.skip:
            continue
        try:
            report["runs"][name] = run()
        except Exception as err:  # noqa: BLE001 - reported in the table
            traceback.print_exc()
            report["runs"][name] = {"error": f"{type(err).__name__}: {err}"}
        print(name, json.dumps(report["runs"][name])[:400], flush=True)
        write_report(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
