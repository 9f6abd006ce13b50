"""Run inside the sandbox by ``test_sandbox.py``: report what the sandboxed code can reach.

``python -m tests.tuner.sandbox_probe SECRET_FILE PORT`` writes ``probe.json`` in its working
folder: its environment, whether it can read or write ``SECRET_FILE`` (in a hidden folder),
whether it can connect to ``127.0.0.1:PORT`` (the test's listening socket), the processes it
sees, and whether it can unmount the cover over the hidden folder.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys


def _attempt(action) -> str:
    try:
        action()
    except OSError as err:
        return type(err).__name__
    return "ok"


def main(secret: str, port: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    report = {
        "env": dict(os.environ),
        "read_secret": _attempt(lambda: open(secret).read()),
        "write_beside_secret": _attempt(
            lambda: open(os.path.join(os.path.dirname(secret), "marker"), "w").write("x")
        ),
        "connect": _attempt(lambda: socket.create_connection(("127.0.0.1", int(port)), 2)),
        "processes": sorted(p for p in os.listdir("/proc") if p.isdigit()),
        "umount": libc.umount2(os.path.dirname(os.path.dirname(secret)).encode(), 2),
    }
    report["read_secret_after_umount"] = _attempt(lambda: open(secret).read())
    with open("probe.json", "w") as out:
        json.dump(report, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
