"""The ``tunehub`` command line.

Each command group lives in its own module exposing ``register(subparsers)``; the group's handler
functions take the parsed ``argparse.Namespace`` and return an exit code. Heavy imports (TVM,
torch) happen inside handlers so that ``tunehub --help`` stays fast.

Exit codes: 0 success, 1 an internal failure (a bug or a failed verification), 2 bad input or
usage (the message goes to stderr, nothing half-written stays behind).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from service.cli import (
    cost_model_commands,
    db_commands,
    demo_command,
    generate_command,
    model_commands,
    serve_command,
    token_commands,
    tune_commands,
)
from service.cli.errors import CliError

COMMAND_GROUPS = (
    model_commands,
    generate_command,
    tune_commands,
    db_commands,
    cost_model_commands,
    demo_command,
    serve_command,
    token_commands,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tunehub", description="Autotuning compiler service around TVM MetaSchedule."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tunehub`` command and return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except CliError as err:
        print(f"tunehub: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("tunehub: interrupted", file=sys.stderr)
        return 130


def entry_point() -> None:
    sys.exit(main())
