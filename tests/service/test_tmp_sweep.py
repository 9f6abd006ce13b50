"""Issue 31, case 9: ``kill -9`` leaves no temp file behind for good, and no validation outlives
its server.

A process's temporary files live in a folder it holds a lock on (:class:`service.files.FileStore`
``scratch``); a start-up sweep removes the folders of dead processes and keeps live ones'. Against
a real server: kill it during an upload's validation, and the validation process dies with it;
restart it, and ``storage/tmp`` holds only the new server's own folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

from service.files import FileStore
from tests.service.conftest import REPO, start_server, stop_server

_HOLD = """
import sys, time
from pathlib import Path
from service.files import FileStore
store = FileStore(Path(sys.argv[1])).ensure()
(store.scratch / "upload-part").write_bytes(b"x" * 100)
print(store.scratch, flush=True)
time.sleep(600)
"""


def _holder(root: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    return proc, Path(proc.stdout.readline().strip())


def test_a_sweep_removes_what_dead_processes_left_and_keeps_live_ones(tmp_path) -> None:
    root = tmp_path / "storage"
    dead, dead_folder = _holder(root)
    live, live_folder = _holder(root)
    try:
        dead.kill()
        dead.wait()
        legacy = FileStore(root).tmp / "upload-abc123"  # a loose file of an older version
        legacy.write_bytes(b"partial")
        store = FileStore(root).ensure()
        mine = store.scratch
        assert store.sweep_tmp() == 2
        assert not dead_folder.exists() and not legacy.exists()
        assert (live_folder / "upload-part").is_file() and mine.is_dir()
    finally:
        live.kill()
        live.wait()
    assert FileStore(root).sweep_tmp() == 1 and not live_folder.exists()


def _validation_processes(server_pid: int) -> list[psutil.Process]:
    """The server's fork server's children: upload validations."""
    out = []
    for proc in psutil.Process(server_pid).children(recursive=True):
        try:
            if "forkserver" in " ".join(proc.parent().cmdline()):
                out.append(proc)
        except psutil.Error:
            continue
    return out


@pytest.mark.slow
def _status(proc: psutil.Process) -> str:
    try:
        return proc.status()
    except psutil.NoSuchProcess:
        return psutil.STATUS_DEAD


def test_kill_9_during_a_validation(tmp_path) -> None:
    import onnx

    from tests.onnx_factory import two_layer_model

    model = tmp_path / "model.onnx"
    onnx.save(two_layer_model(), model)
    home = tmp_path / "home"
    # A validation that takes a while: the fork server imports the compiler first.
    server = start_server(home, workers=0)
    stuck: list[psutil.Process] = []
    try:
        token = server.local_token()

        def upload() -> None:
            try:
                with open(model, "rb") as handle:
                    httpx.post(
                        f"{server.api}/models",
                        headers={"Authorization": f"Bearer {token}"},
                        files={"file": ("model.onnx", handle, "application/octet-stream")},
                        timeout=120,
                    )
            except httpx.HTTPError:
                pass  # the server is killed under it

        thread = threading.Thread(target=upload, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not stuck and time.monotonic() < deadline:
            stuck = _validation_processes(server.proc.pid)
            time.sleep(0.05)
        assert stuck, "no validation process was seen"
        leftovers = list((server.storage_dir / "tmp").iterdir())
        assert leftovers, "the upload left nothing to sweep"
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(timeout=10)
        # At once: a validation left alone would run on to its end (seconds; 3 s here).
        gone, alive = psutil.wait_procs(stuck, timeout=1.5)
        # A zombie has ended: it only waits for a parent (init, in some containers) to reap it.
        running = [proc for proc in alive if _status(proc) != psutil.STATUS_ZOMBIE]
        assert not running, "a validation outlived its server"
    finally:
        for proc in stuck:
            try:
                proc.kill()
            except psutil.Error:
                pass
        stop_server(server)
    restarted = start_server(home, workers=0)
    try:
        entries = list((restarted.storage_dir / "tmp").iterdir())
        assert not any(e in entries for e in leftovers), entries
    finally:
        stop_server(restarted)
