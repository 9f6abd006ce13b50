"""``tunehub generate``: greedy generation from a decoder's artifact.

``tunehub generate ARTIFACT_DIR --prompt-ids 1,2,3 --max-new-tokens N [--json]`` loads the
library of a decoder compiled from a stateful export (:mod:`compiler.llm.generate`), feeds the
prompt and decodes greedily. It prints the generated ids, the prefill's time and the decode time
per token (the median step). Bad input (no such artifact, not a decoder, ids that are not
integers, a generation past the cache's capacity) is a message and exit code 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from service.cli.errors import CliError
from service.cli.options import print_json


def _ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompt-ids takes comma-separated integers, got {text!r}"
        ) from None
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError("--prompt-ids needs at least one non-negative id")
    return ids


def register(subparsers: argparse._SubParsersAction) -> None:
    generate = subparsers.add_parser(
        "generate", help="greedy generation from a compiled decoder (prefill, then decode)"
    )
    generate.add_argument("artifact", type=Path, metavar="ARTIFACT_DIR")
    generate.add_argument("--prompt-ids", type=_ids, required=True, metavar="ID,ID,...")
    generate.add_argument("--max-new-tokens", type=int, default=16, metavar="N")
    generate.add_argument("--json", action="store_true", help="print the result as JSON")
    generate.set_defaults(handler=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from compiler.errors import ModelError
    from compiler.llm.generate import Generator

    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    try:
        generator = Generator.load(args.artifact)
        generator.generate(args.prompt_ids[:1], 1)  # warm-up: the first call sets the VM up
        result = generator.generate(args.prompt_ids, args.max_new_tokens)
    except ModelError as err:
        raise CliError(str(err)) from None
    if args.json:
        print_json({"prompt_ids": args.prompt_ids, **result.to_json()})
        return 0
    for row in result.tokens:
        print(",".join(map(str, row)))
    per_token = result.decode_ms_per_token
    print(
        f"prefill {len(args.prompt_ids)} tokens: {result.prefill_secs * 1e3:.2f} ms; decode: "
        + (f"{per_token:.2f} ms/token" if per_token is not None else "one token, no step")
    )
    return 0
