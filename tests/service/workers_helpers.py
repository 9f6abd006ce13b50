"""Helpers for tests with real ``tunehub worker`` processes talking to a real server over HTTP,
and real TVM RPC trackers and servers on loopback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.service.conftest import REPO, Server, free_port

#: Settings of the worker processes: a small search (a few trials take seconds), fast beats.
WORKER_ENV = {
    "TUNEHUB_SEARCH_POPULATION": "64",
    "TUNEHUB_SEARCH_SEED": "1",
    "TUNEHUB_HEARTBEAT_SECS": "1",
    "TUNEHUB_WORKER_POLL_SECS": "0.5",
    "TUNEHUB_WORKER_RETRY_SECS": "60",
}


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill9(self) -> None:
        """SIGKILL the worker and its builder/runner children (its process group)."""
        os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.popen.wait(timeout=30)


def start_worker(server: Server, token: str, name: str, folder: Path, *extra: str) -> Proc:
    log = folder / f"{name}.log"
    env = {
        **os.environ,
        **WORKER_ENV,
        "TUNEHUB_HOME": str(folder / name),
        "TUNEHUB_WORKER_TOKEN": token,
    }
    env.pop("TUNEHUB_DATABASE_URL", None)
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                "worker",
                "--server",
                server.url,
                "--name",
                name,
                *extra,
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Proc(name, popen, log)


def wait_exit(proc: Proc, timeout: float) -> int:
    try:
        return proc.popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.stop()
        raise AssertionError(
            f"worker {proc.name} did not finish in {timeout:.0f} s:\n{proc.text()[-4000:]}"
        ) from None


@dataclass
class RpcCluster:
    """A TVM RPC tracker and ``servers`` RPC servers registered with ``key``, all on 127.0.0.1."""

    tracker_port: int
    key: str
    procs: list[Proc]

    @property
    def tracker(self) -> str:
        return f"127.0.0.1:{self.tracker_port}"

    def server_logs(self) -> str:
        return "\n".join(p.text() for p in self.procs[1:])

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()


def start_rpc(folder: Path, *, servers: int, key: str = "tunehub-test") -> RpcCluster:
    port = free_port()
    procs: list[Proc] = []

    def spawn(name: str, args: list[str]) -> None:
        log = folder / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen(
                [sys.executable, "-m", *args],
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        procs.append(Proc(name, popen, log))

    spawn(
        "rpc-tracker",
        [
            "tvm.exec.rpc_tracker",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--port-end",
            str(port + 1),
        ],
    )
    cluster = RpcCluster(port, key, procs)
    _wait_tracker(cluster, servers=0)
    for i in range(servers):
        server_port = free_port()
        spawn(
            f"rpc-server-{i}",
            [
                "tvm.exec.rpc_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(server_port),
                "--port-end",
                str(server_port + 1),
                "--tracker",
                cluster.tracker,
                "--key",
                key,
            ],
        )
    _wait_tracker(cluster, servers=servers)
    return cluster


def _wait_tracker(cluster: RpcCluster, *, servers: int, timeout: float = 120) -> None:
    import socket

    from tvm import rpc

    deadline = time.monotonic() + timeout
    while True:
        dead = [p for p in cluster.procs if p.popen.poll() is not None]
        if dead:
            cluster.stop()
            raise RuntimeError(f"{dead[0].name} exited:\n{dead[0].text()[-3000:]}")
        try:
            # A plain connection first: TVM's own tracker client retries for a minute.
            socket.create_connection(("127.0.0.1", cluster.tracker_port), timeout=1).close()
            summary = rpc.connect_tracker("127.0.0.1", cluster.tracker_port).summary()
            free = sum(1 for s in summary["server_info"] if s["key"].endswith(f":{cluster.key}"))
            if free >= servers:
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.monotonic() > deadline:
            logs = "\n".join(p.text()[-1000:] for p in cluster.procs)
            cluster.stop()
            raise RuntimeError(f"RPC tracker/servers not ready:\n{logs}")
        time.sleep(0.5)
