"""The worker's HTTP client against real HTTP servers on loopback: it waits out a server that is
down or overloaded (connection refused, 503) with backoff, gives up after its retry window, and
does not retry a refusal (4xx)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from service.worker_client import HttpClient, ServerUnavailable, WorkerApiError
from tests.service.conftest import free_port


def _serve(port: int, answers: list[tuple[int, dict]], seen: list[str]) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's naming
            seen.append(f"{self.path} {self.headers.get('Authorization')}")
            status, body = answers.pop(0) if len(answers) > 1 else answers[0]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_waits_for_a_server_that_is_down_then_overloaded() -> None:
    port = free_port()
    seen: list[str] = []
    holder: dict = {}
    starter = threading.Timer(
        1.5,
        lambda: holder.setdefault(
            "server",
            _serve(
                port,
                [
                    (503, {"detail": "busy", "code": "unavailable"}),
                    (200, {"lease": None, "pending_jobs": 3}),
                ],
                seen,
            ),
        ),
    )
    starter.start()
    client = HttpClient(f"http://127.0.0.1:{port}", "th_secret", retry_secs=60)
    started = time.monotonic()
    try:
        offer, pending = client.lease("w1")
    finally:
        client.close()
        starter.join()
        holder["server"].shutdown()
    assert (offer, pending) == (None, 3)
    assert time.monotonic() - started >= 1.5  # refused connections were retried
    assert seen == ["/api/v1/workers/w1/lease Bearer th_secret"] * 2  # then the 503 once


def test_gives_up_after_its_retry_window() -> None:
    client = HttpClient(f"http://127.0.0.1:{free_port()}", "t", retry_secs=2)
    started = time.monotonic()
    with pytest.raises(ServerUnavailable, match="ConnectError"):
        client.lease("w1")
    assert 1.0 <= time.monotonic() - started < 10
    client.close()


def test_a_refusal_is_not_retried() -> None:
    port = free_port()
    seen: list[str] = []
    server = _serve(
        port, [(409, {"detail": "task lease 7 is expired", "code": "lease_lost"})], seen
    )
    client = HttpClient(f"http://127.0.0.1:{port}", "t", retry_secs=30)
    try:
        with pytest.raises(WorkerApiError) as info:
            client.finish(7, "done")
    finally:
        client.close()
        server.shutdown()
    assert (info.value.status, info.value.code) == (409, "lease_lost")
    assert len(seen) == 1
