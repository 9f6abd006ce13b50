"""A real ``tunehub serve`` (uvicorn + embedded worker subprocess) on a free loopback port, with
SQLite and the file store in a temporary home; httpx clients with user tokens.

The server is started once per test module (``serve`` fixture factory) because starting one costs
a few seconds (TVM import). Search population is small (``TUNEHUB_SEARCH_POPULATION=64``) so a
tuning job of a few trials takes about a minute here.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
UPLOAD_LIMIT = 8 * 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    home: Path
    proc: subprocess.Popen
    log: Path
    database_url: str | None = None

    @property
    def api(self) -> str:
        return f"{self.url}/api/v1"

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'tunehub.db'}"

    @property
    def storage_dir(self) -> Path:
        return self.home / "storage"

    def local_token(self) -> str:
        return (self.home / "token").read_text().strip()

    def token(self, name: str, kind: str = "user") -> str:
        """A new token in this server's database (what `tunehub token create` does; the CLI
        itself is tested in test_cli_tokens.py)."""
        from service.auth import create_token

        with self.storage() as storage:
            return create_token(storage, name=name, kind=kind)[0]

    def client(self, token: str | None, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.api, headers=headers, timeout=60, **kwargs)

    def storage(self):
        import db

        return db.open_storage(self.db_url)

    def alive(self) -> bool:
        return self.proc.poll() is None


def start_server(
    home: Path, *, workers: int = 1, env: dict[str, str] | None = None, db_url: str | None = None
) -> Server:
    """``db_url``: a database other than the embedded SQLite file (upgraded beforehand)."""
    port = free_port()
    log = home / "serve.log"
    home.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "TUNEHUB_HOME": str(home),
        "TUNEHUB_SEARCH_POPULATION": "64",
        "TUNEHUB_SEARCH_SEED": "1",
        "TUNEHUB_MAX_UPLOAD_BYTES": str(UPLOAD_LIMIT),
        "TUNEHUB_WORKER_POLL_SECS": "0.5",
        "TUNEHUB_HEARTBEAT_SECS": "2",
        "TUNEHUB_WORKER_NICE": "0",  # tests share a busy machine: tune at normal priority
        **(env or {}),
    }
    full_env.pop("TUNEHUB_DATABASE_URL", None)
    args = [
        sys.executable,
        "-m",
        "service.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--log-level",
        "warning",
    ]
    if db_url is not None:
        args += ["--db", db_url]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            args,
            cwd=REPO,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", home, proc, log, db_url)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"tunehub serve exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{server.api}/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_server(server)
            raise RuntimeError(f"tunehub serve did not become ready: {log.read_text()[-3000:]}")
        time.sleep(0.3)


def stop_server(server: Server) -> None:
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def serve(tmp_path_factory) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(**kwargs) -> Server:
        server = start_server(tmp_path_factory.mktemp("home"), **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        stop_server(server)


def wait_for_job(
    client: httpx.Client, job_id: int, statuses: set[str], timeout: float = 400
) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] in statuses:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['status']}: {job}"
        time.sleep(0.5)


def upload(client: httpx.Client, path: Path, **fields) -> httpx.Response:
    with open(path, "rb") as handle:
        return client.post(
            "/models", files={"file": (path.name, handle, "application/octet-stream")}, data=fields
        )
