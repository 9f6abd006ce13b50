"""Headless Chromium for the dashboard's tests, benchmark and screenshots.

Debian's ``chromium`` package (``apt-get install -y chromium``; ``scripts/run-tests.sh`` installs
it when missing) driven by Playwright for Python. Playwright's own browser downloads are never
used: the browser comes from the system package, so everything works offline.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM = Path(os.environ.get("TUNEHUB_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> Path:
    """The Chromium binary; raises ``FileNotFoundError`` saying how to install it."""
    if CHROMIUM.exists():
        return CHROMIUM
    found = shutil.which("chromium")
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"no Chromium at {CHROMIUM}: install Debian's package (apt-get install -y chromium; "
        "scripts/run-tests.sh does it) or set TUNEHUB_CHROMIUM"
    )


def launch(playwright):
    """A headless Chromium browser (Playwright ``Browser``)."""
    return playwright.chromium.launch(executable_path=str(chromium_path()), args=CHROMIUM_ARGS)
