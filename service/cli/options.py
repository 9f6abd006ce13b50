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
    parser.add_argument("--target", default="cpu", help="compilation target (default: cpu)")
    parser.add_argument(
        "--num-cores", type=int, default=None, help="cores for the CPU target (default: all usable)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON summary on stdout")


def print_json(payload: Any) -> None:
    json.dump(payload, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
