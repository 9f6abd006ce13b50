"""Which transformer decoder definitions import through TuneHub, from each format (issue 20).

    python -m bench.bench_decoder_import [--names llama gpt2 ...] [--seq 16] [--out FILE]

Every decoder of :data:`examples.decoders.ALL_DECODERS` (``transformers`` definitions, tiny
configs, seeded random weights, ``use_cache=False``) is exported at ``[1, seq]`` token ids to
``.pt2`` (``torch.export.save``) and to ONNX (torch's dynamo exporter). Each file then takes the
upload path in a separate process that never imports ``transformers`` (as a validation process
does: a ``.pt2`` calling an operator that only ``transformers`` registers does not even load
there): :func:`compiler.prepare.prepare_model` (load with external data refused, validate,
import, partition for this machine's CPU target), an untuned build (TVM's default schedules,
:func:`compiler.build.builder.build`), and :func:`compiler.build.verify.verify` against the model's
own framework (torch for ``.pt2``, ONNX Runtime for ONNX) on its seeded inputs, plus one set of
token ids drawn over the whole vocabulary (``verify`` draws ids 0 and 1 only).

Writes ``bench/results/decoders_import_<date>.md``: one row per definition and format (imported
and verified with the largest absolute error, or refused with TuneHub's message), and the task
list of each imported model with the part of the decoder each task computes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import multiprocessing
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FORMATS = ("pt2", "onnx")


# ------------------------------------------------------------------ the upload path (child process)


def _role(name: str, shapes: list[tuple[str, list[int], str]], vocab: int) -> str:
    """What part of a decoder a task computes, read from its fused operator names and shapes."""
    ops = name.lower()
    if "take" in ops:
        return "embedding lookup"
    if "topk" in ops or "gather" in ops or "one_hot" in ops:
        return "expert routing"
    if "softmax" in ops:
        return "attention softmax" if len(shapes[0][1]) >= 3 else "router softmax"
    if "matmul" in ops or "dense" in ops:
        output = shapes[-1][1] if shapes else []
        if len(output) >= 3 and len(set(output[-2:])) == 1 or "add" in ops and len(output) >= 4:
            return "attention scores / context (batched matmul)"
        if output and output[-1] == vocab:
            return "LM head"
        return "projection (GEMM)" + (" + bias/residual" if "add" in ops else "")
    if "tanh" in ops or "erf" in ops:
        return "GELU"
    if "rsqrt" in ops or "mean" in ops and "sqrt" in ops:
        return "RMSNorm"
    if "mean" in ops or "variance" in ops or "layer_norm" in ops:
        return "LayerNorm"
    if "power" in ops:
        return "RMSNorm: square"
    if "negative" in ops and "concatenate" in ops:
        return "rotary embedding (+ head split)"
    if "sigmoid" in ops:
        return "SiLU(gate) x up"
    if "relu" in ops or "maximum" in ops:
        return "ReLU"
    if "less" in ops and "where" in ops:
        return "token id wrap (negative ids)"
    if "isnan" in ops or "logical_not" in ops:
        return "softmax guard (fully masked rows)"
    if "transpose" in ops and "multiply" in ops:
        return "head split + attention scale"
    if "sum" in ops or "divide" in ops:
        return "expert mixing (routing weights)"
    if "add" in ops:
        return "mask / residual add"
    if "multiply" in ops:
        return "scale"
    layout = {
        "reshape",
        "transpose",
        "broadcast",
        "to",
        "squeeze",
        "expand",
        "dims",
        "strided",
        "slice",
        "concatenate",
        "split",
        "cast",
        "fused",
        "copy",
        "",
    }
    if all(part.rstrip("0123456789") in layout for part in ops.split("_")):
        return "layout (reshape/transpose)"
    return "other"


def check_file(path: str, fmt: str, vocab: int, seq: int) -> dict[str, Any]:
    """The upload path for one exported file; plain data back (runs in the child process)."""
    import numpy as np

    from compiler.build.builder import build
    from compiler.build.runner import LoadedLibrary
    from compiler.build.verify import compare, reference_outputs, verify
    from compiler.errors import CompileError, ModelError
    from compiler.prepare import prepare_model
    from compiler.target import cpu_target

    result: dict[str, Any] = {"transformers_loaded": "transformers" in sys.modules}
    target = cpu_target(2)
    result["target"] = target.describe()
    start = time.perf_counter()
    try:
        prepared = prepare_model(
            Path(path), target, allow_external_data=False, display_name=Path(path).name
        )
    except ModelError as err:
        result.update(status="refused", code=err.code, message=err.message)
        return result
    except Exception as err:  # noqa: BLE001 - a crash on a file is a result here, not a stop
        result.update(status="failed", message=f"{type(err).__name__}: {err}"[:500])
        return result
    result["prepare_s"] = time.perf_counter() - start
    result["tasks"] = [
        {
            "name": t.name,
            "key": t.key,
            "weight": t.weight,
            "flops": t.flops,
            "tunable": t.tunable,
            "role": _role(t.name, [(n, list(s), d) for n, s, d in t.shapes], vocab),
        }
        for t in prepared.partition.tasks
    ]
    start = time.perf_counter()
    try:
        library = LoadedLibrary.from_executable(build(prepared.mod, target))
    except CompileError as err:
        result.update(status="build failed", message=str(err)[:500])
        return result
    result["build_s"] = time.perf_counter() - start
    seeded = verify(prepared.model, library.run)
    ids = np.random.default_rng(1).integers(0, vocab, size=(1, seq)).astype(np.int64)
    whole = compare(library.run([ids]), reference_outputs(prepared.model, [ids]), seeded.reference)
    result.update(
        status="verified" if seeded.passed and whole.passed else "mismatch",
        reference=seeded.reference,
        seeded_error=seeded.max_abs_error,
        vocab_error=whole.max_abs_error,
        message=seeded.message if not seeded.passed else whole.message,
    )
    return result


# ------------------------------------------------------------------------------- driver (parent)


def _export(name: str, fmt: str, folder: Path, seq: int) -> tuple[Path | None, str, float]:
    from examples.decoders import export

    start = time.perf_counter()
    try:
        path = export(name, fmt, folder / f"{name}.{fmt}", seq)
    except Exception as err:  # noqa: BLE001 - an exporter failure is a row of the table
        lines = [line for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        detail = next((line for line in lines if "No ONNX function" in line), lines[0])
        return None, f"{type(err).__name__}: {detail.strip()[:300]}", 0.0
    return path, "", time.perf_counter() - start


def _run(names: list[str], seq: int) -> list[dict[str, Any]]:
    from examples.decoders import get_decoder

    rows: list[dict[str, Any]] = []
    context = multiprocessing.get_context("spawn")
    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context)
    try:
        with tempfile.TemporaryDirectory(prefix="decoders-") as tmp:
            for name in names:
                spec = get_decoder(name)
                for fmt in FORMATS:
                    row: dict[str, Any] = {"name": name, "format": fmt, "features": spec.features}
                    path, error, seconds = _export(name, fmt, Path(tmp), seq)
                    row["export_s"] = seconds
                    if path is None:
                        row.update(status="export failed", message=error)
                    else:
                        row["bytes"] = path.stat().st_size
                        try:
                            row.update(
                                pool.submit(
                                    check_file, str(path), fmt, spec.vocab_size, seq
                                ).result()
                            )
                        except concurrent.futures.process.BrokenProcessPool:
                            row.update(status="failed", message="the checking process died")
                            pool = concurrent.futures.ProcessPoolExecutor(
                                max_workers=1, mp_context=context
                            )
                    rows.append(row)
                    print(_summary(row), flush=True)
    finally:
        pool.shutdown()
    return rows


def _summary(row: dict[str, Any]) -> str:
    text = f"{row['name']:>20} {row['format']:>4}: {row['status']}"
    if row["status"] in ("verified", "mismatch"):
        text += f", {len(row['tasks'])} tasks, max abs error {row['vocab_error']:.2g}"
    if row.get("message") and row["status"] != "verified":
        text += f" -- {row['message']}"
    return text


def _versions() -> str:
    from importlib import metadata

    names = ("torch", "apache-tvm", "transformers", "onnx", "onnxruntime", "onnxscript")
    return ", ".join(f"{n} {metadata.version(n)}" for n in names)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(rows: list[dict[str, Any]], seq: int, command: str) -> str:
    target = next((row["target"] for row in rows if "target" in row), "cpu")
    lines = [
        f"# Decoder import coverage, {dt.date.today().isoformat()}",
        "",
        f"`{command}` on {platform.node() or 'this machine'} ({target}); {_versions()}.",
        "",
        f"Tiny `transformers` definitions (2 layers, hidden 64, vocabulary 512, seeded random "
        f"weights, `use_cache=False`), `input_ids` int64 `[1, {seq}]`, exported to `.pt2` "
        "(`torch.export.save`) and ONNX (torch's dynamo exporter, opset 18). Each file takes "
        "the upload path in a process without `transformers` (load, validate, import, "
        "partition), is built untuned (TVM's default schedules) and verified against torch or "
        "ONNX Runtime: max abs error on `verify`'s seeded ids / on ids over the whole "
        "vocabulary (logits are O(1)).",
        "",
        "| decoder | what it exercises | format | result | tasks | max abs error | "
        "refusal / note |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row["status"] in ("verified", "mismatch"):
            result = "imported, verified" if row["status"] == "verified" else "MISMATCH"
            tasks = str(len(row["tasks"]))
            error = f"{row['seeded_error']:.2g} / {row['vocab_error']:.2g}"
            note = "" if row["status"] == "verified" else row["message"]
        else:
            result, tasks, error = row["status"], "", ""
            note = (f"`{row['code']}`: " if row.get("code") else "") + row.get("message", "")
        lines.append(
            f"| {row['name']} | {_cell(row['features'])} | {row['format']} | {result} | "
            f"{tasks} | {error} | {_cell(note)} |"
        )
    lines += [
        "",
        "## Tasks the two formats share",
        "",
        "Tasks are keyed by the structural hash of their TIR (`compiler.keys`): a task of "
        "the `.pt2` import with the key of an ONNX import's task is tuned once for both.",
        "",
        "| decoder | .pt2 tasks | ONNX tasks | shared | share of the .pt2 FLOPs | shared parts |",
        "|---|---|---|---|---|---|",
    ]
    by_model = {(row["name"], row["format"]): row for row in rows if "tasks" in row}
    for name in dict.fromkeys(row["name"] for row in rows):
        pt2, onnx_row = by_model.get((name, "pt2")), by_model.get((name, "onnx"))
        if pt2 is None or onnx_row is None:
            continue
        keys = {task["key"] for task in onnx_row["tasks"]}
        shared = [task for task in pt2["tasks"] if task["key"] in keys]
        total = sum(task["flops"] * task["weight"] for task in pt2["tasks"]) or 1.0
        flops = sum(task["flops"] * task["weight"] for task in shared) / total
        parts = ", ".join(sorted({task["role"] for task in shared}))
        lines.append(
            f"| {name} | {len(pt2['tasks'])} | {len(onnx_row['tasks'])} | {len(shared)} | "
            f"{flops:.0%} | {parts} |"
        )
    lines += [
        "",
        "## Tasks",
        "",
        "Each imported model's tasks as `compiler.partition` lists them (heaviest first): "
        "weight x fused operators, and the part of the decoder they compute (read from "
        "the names and shapes by the benchmark).",
        "",
    ]
    for row in rows:
        if "tasks" not in row:
            continue
        lines += [
            f"### {row['name']} ({row['format']}): {len(row['tasks'])} tasks",
            "",
            "| weight | task | part | MFLOP | tunable |",
            "|---|---|---|---|---|",
        ]
        for task in row["tasks"]:
            lines.append(
                f"| {task['weight']} | `{task['name']}` | {task['role']} | "
                f"{task['flops'] / 1e6:.3g} | {'yes' if task['tunable'] else 'no'} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from examples.decoders import ALL_DECODERS, DEFAULT_SEQ

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--names",
        nargs="+",
        choices=sorted(ALL_DECODERS),
        default=list(ALL_DECODERS),
        help="decoders to try (default: all)",
    )
    parser.add_argument("--seq", type=int, default=DEFAULT_SEQ, help="static sequence length")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="markdown file (default: bench/results/decoders_import_<date>.md)",
    )
    args = parser.parse_args(argv)
    out = args.out or REPO / "bench" / "results" / (
        f"decoders_import_{dt.date.today().isoformat()}.md"
    )
    try:
        rows = _run(args.names, args.seq)
    except Exception:  # noqa: BLE001 - say where the benchmark itself broke, then fail
        traceback.print_exc()
        return 1
    command = (
        "python -m bench.bench_decoder_import"
        + (f" --seq {args.seq}" if args.seq != DEFAULT_SEQ else "")
        + (f" --names {' '.join(args.names)}" if args.names != list(ALL_DECODERS) else "")
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(rows, args.seq, command))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
