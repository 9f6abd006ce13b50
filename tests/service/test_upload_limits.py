"""Uploads cannot exhaust the service (issue 18, cases 3, 4, 5 and the zip points of 7), over real
HTTP against a real ``tunehub serve``: every bad file is a 4xx with a clear message, the API
process keeps answering and does not grow, other users' uploads are not held up, and nothing is
left behind."""

from __future__ import annotations

import threading
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.onnx_factory import (
    add_chain_model,
    constant_of_shape_bomb,
    external_data_model,
    two_layer_model,
)
from tests.service.conftest import upload
from tests.service.request_helpers import tmp_leftovers

#: The API process may grow this much while refusing a bomb (it never builds the tensor).
RSS_BOUND = 100 * 1024 * 1024


@pytest.fixture(scope="module")
def server(serve):
    """Default limits, except a validation time limit short enough for a test."""
    return serve(workers=0, env={"TUNEHUB_VALIDATION_TIMEOUT_SECS": "6"})


@pytest.fixture(scope="module")
def runtime_server(serve):
    """The static constant checks turned off: only the run-time bounds (the validation process's
    512 MiB memory limit, the folded-constant check) stand between a bomb and the service."""
    return serve(
        workers=0,
        env={
            "TUNEHUB_MAX_CONSTANT_ELEMENTS": str(10**13),
            "TUNEHUB_MAX_CONSTANT_BYTES": str(10**14),
            "TUNEHUB_VALIDATION_MEMORY_BYTES": str(512 * 1024 * 1024),
        },
    )


def _client(server, name: str) -> httpx.Client:
    return server.client(server.token(name))


def _rss(server) -> int:
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _assert_clean(server) -> None:
    assert tmp_leftovers(server.storage_dir) == []
    files = {p.name for p in (server.storage_dir / "models").iterdir()}
    with server.storage() as storage:
        assert files == {m.content_hash for m in storage.list_models()}


def _refused(response: httpx.Response, code: str) -> str:
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert body["code"] == code, body
    return body["detail"]


@pytest.mark.parametrize("which", ["server", "runtime_server"])
@pytest.mark.parametrize("shape", [[1_000_000, 1_000_000], [250_000_000]], ids=["1e12", "2.5e8"])
def test_constant_of_shape_bomb_is_4xx_and_the_server_is_untouched(
    request, which, shape, tmp_path
) -> None:
    server = request.getfixturevalue(which)
    bomb = _write(tmp_path, "bomb.onnx", constant_of_shape_bomb(shape).SerializeToString())
    assert bomb.stat().st_size < 200
    before = _rss(server)
    with _client(server, "mallory") as mallory:
        response = upload(mallory, bomb)
    # Refused by the static check, or (checks off) by the validation process's memory limit.
    detail = _refused(response, "constant_too_large" if which == "server" else "out_of_memory")
    assert ("ConstantOfShape" if which == "server" else "memory limit") in detail
    assert httpx.get(f"{server.api}/health", timeout=5).status_code == 200
    assert _rss(server) - before < RSS_BOUND
    assert server.alive()
    _assert_clean(server)


def test_many_nodes_refused_at_once(server, tmp_path) -> None:
    chain = _write(tmp_path, "chain.onnx", add_chain_model(25_000).SerializeToString())
    started = time.monotonic()
    with _client(server, "mallory") as mallory:
        detail = _refused(upload(mallory, chain), "too_many_nodes")
    assert "25000" in detail and time.monotonic() - started < 5
    _assert_clean(server)


def test_slow_upload_neither_blocks_others_nor_runs_past_its_time_limit(server, tmp_path) -> None:
    """A 10,000-node chain (seconds of TVM import) is stopped at the 6 s limit; another user's
    small upload, sent while it validates, is answered within seconds."""
    chain = _write(tmp_path, "chain.onnx", add_chain_model(10_000).SerializeToString())
    small = _write(tmp_path, "small.onnx", two_layer_model(batch=3).SerializeToString())
    slow: dict[str, object] = {}

    def send_slow() -> None:
        started = time.monotonic()
        with _client(server, "mallory") as mallory:
            slow["response"] = upload(mallory, chain)
        slow["secs"] = time.monotonic() - started

    thread = threading.Thread(target=send_slow)
    thread.start()
    time.sleep(1.5)  # the chain is validating now
    started = time.monotonic()
    with _client(server, "alice") as alice:
        response = upload(alice, small)
    small_secs = time.monotonic() - started
    thread.join(60)
    assert response.status_code == 201, response.text
    assert small_secs < 5, f"small upload took {small_secs:.1f} s behind the slow one"
    assert "response" in slow, "slow upload did not finish"
    detail = _refused(slow["response"], "validation_timeout")  # type: ignore[arg-type]
    assert "6 s" in detail
    assert slow["secs"] < 15
    _assert_clean(server)


def test_external_data_naming_a_staged_file_is_refused(server, tmp_path) -> None:
    """The staging folder holds other users' uploads in progress: a model naming a file there as
    its external data is refused, whatever the file is."""
    staged = server.storage_dir / "tmp" / "upload-other-user"
    staged.write_bytes(np.ones(16, np.float32).tobytes())
    try:
        model = _write(
            tmp_path, "ext.onnx", external_data_model("upload-other-user").SerializeToString()
        )
        with _client(server, "mallory") as mallory:
            detail = _refused(upload(mallory, model), "external_data")
        assert "self-contained" in detail
    finally:
        staged.unlink()
    _assert_clean(server)


# ------------------------------------------------------------------------------- .pt2 zip points


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    import torch

    from tests.pt2_factory import Genuine, TinyNet

    model = TinyNet().eval()
    example = torch.randn(1, 3, 8, 8)
    path = tmp_path_factory.mktemp("pt2") / "tiny.pt2"
    torch.export.save(torch.export.export(model, (example,)), path)
    return Genuine(path, model, example, "tiny")


@pytest.mark.parametrize("deflated", [False, True], ids=["stored", "deflated"])
def test_pt2_member_understating_its_size_is_refused(server, genuine, tmp_path, deflated) -> None:
    from tests.pt2_factory import understated_member

    path = understated_member(genuine, tmp_path / "lie.pt2", deflated=deflated)
    with _client(server, "mallory") as mallory:
        response = upload(mallory, path)
        detail = _refused(response, "pt2_too_large")
        assert "extra/payload" in detail
        assert not [m for m in mallory.get("/models").json()["data"] if m["filename"] == "lie.pt2"]
    _assert_clean(server)


def test_zip_bomb_message_names_the_upload_not_a_server_temp_file(
    server, genuine, tmp_path
) -> None:
    path = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(genuine.path) as zin, zipfile.ZipFile(path, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, zin.read(name))
        zout.writestr("tiny/extra/bomb", b"\0" * (16 * 1024**2), compress_type=zipfile.ZIP_DEFLATED)
    with _client(server, "mallory") as mallory:
        detail = _refused(upload(mallory, path), "pt2_too_large")
    assert "zip bomb" in detail and "'bomb.pt2'" in detail
    assert "upload-" not in detail and "/tmp" not in detail
    _assert_clean(server)
