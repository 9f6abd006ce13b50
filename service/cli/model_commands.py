"""``tunehub inspect`` and ``tunehub compile``: the model path."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    del subparsers
