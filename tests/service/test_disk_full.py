"""A full disk (issue 31, case 10): an upload or an artifact that cannot be written is a 507
``storage_full`` with a clear message, never a bare 500, and leaves no partial file.

The disk is made full for the one file the request writes, in-process (FastAPI's TestClient):
the store's temp path is a symlink to ``/dev/full``, whose writes fail with ``ENOSPC`` in the
kernel, so the real write path of the route meets the real error.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi import FastAPI, HTTPException
from fastapi.testclient import TestClient

from service.api.errors import install_error_handlers, is_disk_full
from service.app import create_app
from service.auth import create_token
from service.files import FileStore
from service.settings import Settings
from tests.service.request_helpers import tmp_leftovers

DEV_FULL = Path("/dev/full")
pytestmark = pytest.mark.skipif(not DEV_FULL.exists(), reason="needs /dev/full (Linux)")


@pytest.fixture
def service(tmp_path):
    """The app without its lifespan (no validation fork server: nothing here validates), and
    a user and a worker token."""
    app = create_app(Settings(home=tmp_path, max_upload_bytes=8 << 20))
    storage = app.state.tunehub.storage
    user = create_token(storage, name="alice", kind="user")[0]
    worker = create_token(storage, name="pool", kind="worker")[0]
    client = TestClient(app, raise_server_exceptions=False)
    yield SimpleNamespace(app=app, client=client, user=user, worker=worker, home=tmp_path)
    client.close()
    storage.close()


def _storage_full(response) -> None:
    assert response.status_code == 507, response.text
    body = response.json()
    assert body["code"] == "storage_full" and "storage is full" in body["detail"], body


def test_model_upload_on_a_full_disk_is_507_and_leaves_nothing(service, monkeypatch) -> None:
    real = FileStore.new_temp_file

    def on_full_disk(self, *args, **kwargs) -> Path:
        path = real(self, *args, **kwargs)
        path.unlink()
        path.symlink_to(DEV_FULL)
        return path

    monkeypatch.setattr(FileStore, "new_temp_file", on_full_disk)
    for size in (100_000, 3 << 20):  # written at the end, and flushed while receiving
        response = service.client.post(
            "/api/v1/models",
            headers={"Authorization": f"Bearer {service.user}"},
            files={"file": ("m.onnx", os.urandom(size), "application/octet-stream")},
        )
        _storage_full(response)
        assert tmp_leftovers(service.home / "storage") == []
        assert list((service.home / "storage" / "models").iterdir()) == []
        assert service.app.state.tunehub.storage.list_models() == []


def test_artifact_upload_on_a_full_disk_is_507_and_leaves_nothing(service, monkeypatch) -> None:
    """The route stages the library and manifest in a temp folder: the library's file is on the
    full disk. (The lease check is stubbed: the route gets as far as staging.)"""
    from service.api.routes import workers

    real = FileStore.new_temp_dir

    def on_full_disk(self, *args, **kwargs) -> Path:
        folder = real(self, *args, **kwargs)
        (folder / "model.so").symlink_to(DEV_FULL)
        return folder

    monkeypatch.setattr(FileStore, "new_temp_dir", on_full_disk)
    monkeypatch.setattr(
        workers.coordinator, "owned_lease", lambda *a, **k: SimpleNamespace(job_id=1)
    )
    response = service.client.post(
        "/api/v1/workers/leases/1/artifact",
        headers={"Authorization": f"Bearer {service.worker}"},
        files={
            "library": ("model.so", os.urandom(2 << 20), "application/octet-stream"),
            "manifest": ("manifest.json", b'{"verification": {"passed": true}}', "text/json"),
        },
    )
    _storage_full(response)
    assert tmp_leftovers(service.home / "storage") == []
    assert list((service.home / "storage" / "artifacts").iterdir()) == []


def test_a_full_disk_under_fastapis_form_parsing_is_507_too() -> None:
    """FastAPI turns an error while it spools a form part to disk into a 400 raised from the
    OSError; a full disk there is a 507 as well. Other errors keep their answers."""
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/spool")
    def spool():
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as err:
            raise HTTPException(400, "There was an error parsing the body") from err

    @app.get("/quota")
    def quota():
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    @app.get("/other")
    def other():
        raise OSError(errno.EACCES, "Permission denied")

    with TestClient(app, raise_server_exceptions=False) as client:
        _storage_full(client.get("/spool"))
        _storage_full(client.get("/quota"))
        response = client.get("/other")
        assert response.status_code == 500 and response.json()["code"] == "internal"
    assert not is_disk_full(None) and not is_disk_full(ValueError("x"))
