"""``tunehub db ...``: schema upgrades, statistics, import and export (filled in by the database work)."""
from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    del subparsers
