"""A decoder artifact's ``params.bin`` in float32 against its weights held in their format.

    python -m bench.bench_params_file ARTIFACT_DIR [--rounds 3] [--steps 8] [--tag T]
        [--out bench/results]

``ARTIFACT_DIR`` is a decoder artifact whose weights live beside its library (``params.bin``;
compiled with ``--weights q8_0`` or ``q4_0``, written by this or an older TuneHub). Its arrays are
written twice into a temporary folder, each time beside a copy of the library and manifest: as
float32 arrays (what TuneHub wrote before :mod:`compiler.weights.weight_packing`) and by
:func:`compiler.weights.external.save_params` (weights on a grid in their format). The table gives
each file's bytes, the time to write it, and :func:`compiler.weights.external.load_params`'s time to
read it (alternating rounds, medians); then both artifacts generate ``--steps`` greedy tokens from
one prompt (:class:`compiler.llm.generate.Generator`), which must agree bit for bit in their logits.
Writes ``params_file_<date>[_<tag>].md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.llm_compare import machine

REPO = Path(__file__).resolve().parents[1]


def _artifact_copy(source: Path, dest: Path) -> Path:
    """``dest`` with ``source``'s library and manifest (hard links where possible)."""
    dest.mkdir(parents=True)
    for name in ("model.so", "manifest.json"):
        try:
            (dest / name).hardlink_to(source / name)
        except OSError:
            shutil.copy(source / name, dest / name)
    return dest


def _generate(folder: Path, prompt: np.ndarray, steps: int) -> tuple[list[int], list[np.ndarray]]:
    from compiler.llm.generate import Generator

    generator = Generator.load(folder)
    logits = generator.prefill(prompt)
    tokens, all_logits = [], [np.array(logits)]
    for _ in range(steps):
        token = np.asarray(logits, dtype=np.float32).argmax(axis=-1)
        tokens.append(int(token[0]))
        logits = generator.step(token)
        all_logits.append(np.array(logits))
    return tokens, all_logits


def main(argv: list[str] | None = None) -> int:
    import tvm

    from compiler.weights.external import PARAMS_NAME, load_params, save_params

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    source = args.artifact
    if not (source / PARAMS_NAME).is_file():
        parser.error(f"{source} has no {PARAMS_NAME}: its weights are inside its library")
    arrays = load_params(source / PARAMS_NAME, tvm.cpu())
    writers = {
        "float32": lambda path: tvm.runtime.save_param_dict_to_file(
            {f"p{i}": a for i, a in enumerate(arrays)}, str(path)
        ),
        "in the format": lambda path: save_params(tuple(arrays), path),
    }
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="tunehub-params-", dir=source.parent) as tmp:
        folders = {}
        for index, (name, write) in enumerate(writers.items()):
            folder = folders[name] = _artifact_copy(source, Path(tmp) / f"a{index}")
            start = time.perf_counter()
            write(folder / PARAMS_NAME)
            rows[name] = {
                "bytes": (folder / PARAMS_NAME).stat().st_size,
                "write_s": time.perf_counter() - start,
            }
        loads: dict[str, list[float]] = {name: [] for name in folders}
        for round_index in range(args.rounds):
            order = list(folders) if round_index % 2 == 0 else list(reversed(folders))
            for name in order:
                start = time.perf_counter()
                loaded = load_params(folders[name] / PARAMS_NAME, tvm.cpu())
                loads[name].append(time.perf_counter() - start)
                if round_index == 0:
                    assert all(
                        np.array_equal(a.numpy(), b.numpy())
                        for a, b in zip(loaded, arrays, strict=True)
                    ), f"{name}: the arrays read back differ"
                del loaded
        for name, samples in loads.items():
            rows[name]["load_s"] = statistics.median(samples)
        arrays.clear()  # free the memory before the libraries load
        prompt = np.random.default_rng(0).integers(0, 1000, 16).astype(np.int64)
        generated = {
            name: _generate(folder, prompt, args.steps) for name, folder in folders.items()
        }
    (tokens_a, logits_a), (tokens_b, logits_b) = generated.values()
    same = tokens_a == tokens_b and all(
        np.array_equal(a, b) for a, b in zip(logits_a, logits_b, strict=True)
    )
    date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    info = machine(0)
    plain = rows["float32"]["bytes"]
    lines = [
        f"# A decoder's params.bin in float32 and in its weights' format ({date})",
        "",
        f"- Machine: {info['cpu']}; {info['cores_available']} cores; {info.get('memory_gib')} GiB.",
        f"- Artifact: `{source}` (its manifest's weights: "
        f"{_weights_line(source)}). Command: `python -m bench.bench_params_file {source} "
        f"--rounds {args.rounds} --steps {args.steps}`.",
        f"- `load s`: `load_params` into CPU memory, median of {args.rounds} alternating rounds.",
        "",
        "| params.bin | bytes | vs float32 | write s | load s |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['bytes']:,} | {row['bytes'] / plain:.3f}x | {row['write_s']:.1f} "
            f"| {row['load_s']:.2f} |"
        )
    lines += [
        "",
        f"Both artifacts, 16 prompt tokens then {args.steps} greedy steps: tokens "
        f"{tokens_a} and {tokens_b}; every logit equal bit for bit: **{same}**.",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"params_file_{date}{'_' + args.tag if args.tag else ''}.md"
    path.write_text("\n".join(lines) + "\n")
    print(path.read_text())
    return 0 if same else 1


def _weights_line(folder: Path) -> str:
    import json

    model = json.loads((folder / "manifest.json").read_text()).get("model", {})
    weights = model.get("weights") or {}
    return (
        f"format {weights.get('format')}, {weights.get('tensors')} tensors, "
        f"{weights.get('float32_bytes', 0):,} bytes in float32"
    )


if __name__ == "__main__":
    raise SystemExit(main())
