"""Issue 31: the sandbox a worker's library is checked in (:mod:`tuner.final_build.sandbox`)
inherits no environment, reaches no network, sees no other process and cannot read, write or uncover
the folders it hides."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from tuner.final_build.sandbox import SandboxLimits, run_sandboxed


def test_the_sandbox_hides_the_server(tmp_path, monkeypatch) -> None:
    home = tmp_path / "home"
    (home / "storage").mkdir(parents=True)
    secret = home / "storage" / "secret"
    secret.write_text("the database password")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("TUNEHUB_DATABASE_URL", "postgresql://user:password@db/tunehub")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        done = run_sandboxed(
            "tests.tuner.sandbox_probe", [str(secret), str(port)], workdir=work, hide=[home]
        )
    assert done.returncode == 0, done.stderr
    report = json.loads((work / "probe.json").read_text())
    assert set(report["env"]) <= {"PATH", "LANG"}, report["env"]
    assert report["read_secret"] != "ok" and report["write_beside_secret"] != "ok", report
    assert not (home / "storage" / "marker").exists()
    assert report["connect"] != "ok", report
    assert report["processes"] == ["1"], report  # its own PID namespace: nothing else
    assert report["umount"] != 0 and report["read_secret_after_umount"] != "ok", report


def test_the_sandbox_has_a_time_limit(tmp_path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run_sandboxed(
            "tests.tuner.sandbox_probe",
            ["/nonexistent", "not-a-port"],
            workdir=tmp_path,
            limits=SandboxLimits(timeout_secs=0.01),
        )
