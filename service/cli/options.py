"""Argument types and options shared by several ``tunehub`` commands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME=D0,D1,...`` (an ``argparse`` type)."""
    name, sep, dims = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid input shape {text!r}: expected NAME=D0,D1,... with integer dimensions"
        ) from None
    return name, shape


#: ``--weights`` choices (:data:`compiler.weights.weight_formats.WEIGHT_FORMATS`, spelled here so
#: that the CLI's help does not import the compiler).
WEIGHT_FORMATS = ("as_exported", "q8_0", "q4_0")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an ONNX file or a .pt2 file saved by torch.export.save")
    parser.add_argument(
        "--input-shape",
        type=input_shape,
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="static shape for an input with symbolic dimensions (repeatable)",
    )
    parser.add_argument(
        "--buckets",
        type=bucket_option,
        action="append",
        default=[],
        metavar="NAME=V1,V2,...",
        help="shape buckets of a symbolic dimension (repeatable; NAME is the symbol, an ONNX "
        "dim_param or the .pt2's s0-style name, or INPUT.AXIS): one static specialization "
        "per value, each tuned; or NAME~SIZE:COUNT,...[/BUCKETS], a histogram of expected "
        "sizes to derive the buckets from; a symbol given none gets powers of two from 16 to "
        "128; --input-shape pins one shape instead",
    )
    parser.add_argument(
        "--bucket-histogram",
        type=histogram_file_option,
        action="append",
        default=[],
        dest="buckets",
        metavar="NAME=FILE[:BUCKETS]",
        help="derive NAME's buckets from FILE, the expected sizes: one size per line, or "
        "'SIZE COUNT' per line (e.g. request lengths from a log), divided into BUCKETS "
        "buckets (default 4); the same as --buckets NAME~SIZE:COUNT,.../BUCKETS",
    )
    parser.add_argument("--target", default="cpu", help="compilation target (default: cpu)")
    parser.add_argument(
        "--num-cores", type=int, default=None, help="cores for the CPU target (default: all usable)"
    )
    parser.add_argument(
        "--weights",
        choices=WEIGHT_FORMATS,
        default="as_exported",
        help="weight format: as_exported (default), q8_0 or q4_0 (llama.cpp's 8- and 4-bit "
        "blocks: a CPU decoder reads a quarter or an eighth of the bytes; the weight matrices "
        "are quantized at load and the model verified as quantized)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON summary on stdout")


def bucket_option(text: str) -> str:
    """Check the syntax of one ``--buckets NAME=V1,V2,...`` (an ``argparse`` type: a bad one
    is a usage error, exit 2); the options are merged by
    :func:`compiler.shapes.buckets.merge_bucket_options`."""
    from compiler.errors import ModelError
    from compiler.shapes.buckets import parse_bucket_option

    try:
        parse_bucket_option(text)
    except ModelError as err:
        raise argparse.ArgumentTypeError(err.message) from None
    return text


def histogram_file_option(text: str) -> str:
    """Read ``NAME=FILE[:BUCKETS]`` (``--bucket-histogram``) into the ``NAME~SIZE:COUNT,...``
    form of ``--buckets``: FILE holds one size per line or ``SIZE COUNT`` per line (blank lines
    and ``#`` comments skipped). A missing or bad file is a usage error (exit 2)."""
    from collections import Counter

    name, sep, path = text.partition("=")
    head, colon, buckets = path.rpartition(":")
    if colon and buckets.isdigit():
        path = head
    else:
        buckets = ""
    if not sep or not name.strip() or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE[:BUCKETS], got {text!r}")
    counts: Counter[int] = Counter()
    try:
        with open(path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                fields = line.split("#", 1)[0].split()
                if not fields:
                    continue
                if len(fields) > 2:
                    raise ValueError(f"line {number}: expected SIZE or SIZE COUNT")
                counts[int(fields[0])] += int(fields[1]) if len(fields) == 2 else 1
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"cannot read histogram file {path!r}: {err.strerror}"
        ) from None
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"bad histogram file {path!r}: {err}") from None
    if not counts:
        raise argparse.ArgumentTypeError(f"histogram file {path!r} holds no sizes")
    option = f"{name.strip()}~" + ",".join(f"{s}:{c}" for s, c in sorted(counts.items()))
    return bucket_option(option + (f"/{buckets}" if buckets else ""))


def print_json(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="tuning database URL (default: $TUNEHUB_DATABASE_URL or the embedded SQLite file)",
    )


def open_storage_from_args(args: argparse.Namespace):
    """Open the database named by ``--db`` (or the environment, or the embedded default).

    Only the embedded default is created or upgraded on the fly; any other database with an old
    schema is refused with the exact ``tunehub db upgrade`` command (a CliError, exit 2).
    """
    import db
    from service.cli.errors import CliError

    url, embedded = db.resolve_database_url(args.db)
    if embedded:
        db.tunehub_home().mkdir(parents=True, exist_ok=True)
    try:
        return db.open_storage(url, upgrade=embedded)
    except db.StorageError as err:
        raise CliError(str(err)) from None


def add_target_options(parser: argparse.ArgumentParser) -> None:
    """``--target`` and ``--num-cores`` for commands that name a target without a model."""
    parser.add_argument("--target", default="cpu", help="target of the records (default: cpu)")
    parser.add_argument(
        "--num-cores", type=int, default=None, help="cores for the CPU target (default: all usable)"
    )


def target_from_args(args: argparse.Namespace):
    """The :class:`compiler.target.TargetSpec` of ``--target``/``--num-cores`` (CliError if bad)."""
    from compiler.errors import ModelError
    from compiler.target import resolve_target
    from service.cli.errors import CliError

    try:
        return resolve_target(args.target, args.num_cores)
    except ModelError as err:
        raise CliError(str(err)) from None
