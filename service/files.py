"""The service's file store: uploaded models by content hash, job artifacts, upload staging.

Layout under the storage directory (``$TUNEHUB_HOME/storage`` by default, shared with workers)::

    models/<sha256>          one file per distinct model content (several owners may share it)
    artifacts/job-<id>/      model.so + manifest.json, published atomically by the tuner
    tmp/<owner>/             one folder per live process (:attr:`FileStore.scratch`): uploads
                             being received or validated, artifacts being reviewed

A file enters ``models/`` only by an atomic rename from ``tmp/`` after validation, so a crash
leaves at most a stray file in ``tmp/``, never a half-written model. Each process keeps its
temporary files in a folder of its own under ``tmp/``, holding an exclusive ``flock`` on the
folder's ``.owner`` file for its whole life: the lock ends with the process however it ends
(``kill -9`` included), so :meth:`FileStore.sweep_tmp` (at the service's start-up) removes
exactly the folders no live process owns, even when several processes share the store.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

from compiler.build.artifact_layout import job_artifact_dir

OWNER = ".owner"
#: A process's folder is created under a name starting with this and renamed once its owner
#: lock is held; a sweep leaves such a folder alone for :data:`NEW_GRACE_SECS`.
NEW_PREFIX = ".new-"
NEW_GRACE_SECS = 3600.0


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.models = root / "models"
        self.artifacts = root / "artifacts"
        self.tmp = root / "tmp"
        self._scratch: Path | None = None
        self._scratch_pid: int | None = None
        self._owner_fd: int | None = None

    def ensure(self) -> FileStore:
        for folder in (self.models, self.artifacts, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def scratch(self) -> Path:
        """This process's own folder under ``tmp/`` (created on first use, owned until the
        process ends; see the module docstring). Its temporary files go here."""
        if self._scratch is None or self._scratch_pid != os.getpid():
            fresh = Path(tempfile.mkdtemp(prefix=NEW_PREFIX, dir=self.tmp))
            fd = os.open(fresh / OWNER, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
            folder = fresh.with_name(f"proc-{os.getpid()}-{fresh.name[len(NEW_PREFIX) :]}")
            fresh.rename(folder)
            self._scratch, self._owner_fd, self._scratch_pid = folder, fd, os.getpid()
        return self._scratch

    def sweep_tmp(self) -> int:
        """Remove everything under ``tmp/`` that no live process owns: folders whose owner lock
        is free (their process ended), and loose entries of older versions. Returns how many
        entries were removed. Never raises for an entry it cannot remove."""
        removed = 0
        for entry in list(self.tmp.iterdir()):
            if entry == self._scratch or not self._abandoned(entry):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed += 1
        return removed

    @staticmethod
    def _abandoned(entry: Path) -> bool:
        if entry.name.startswith(NEW_PREFIX):  # a process is setting it up (or died doing so)
            with contextlib.suppress(OSError):
                return time.time() - entry.stat().st_mtime > NEW_GRACE_SECS
            return False
        owner = entry / OWNER
        if not entry.is_dir() or not owner.is_file():
            return True
        try:
            fd = os.open(owner, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its process is alive
        finally:
            os.close(fd)
        return True

    def new_temp_file(self, prefix: str = "upload-") -> Path:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=self.scratch)
        os.close(fd)
        return Path(name)

    def new_temp_dir(self, prefix: str) -> Path:
        """A new empty folder in this process's :attr:`scratch` folder."""
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.scratch))

    def model_path(self, content_hash: str) -> Path:
        if len(content_hash) != 64 or any(c not in "0123456789abcdef" for c in content_hash):
            raise ValueError(f"not a sha256 hex digest: {content_hash!r}")
        return self.models / content_hash

    def adopt_model(self, temp: Path, content_hash: str) -> bool:
        """Move a validated upload into place; ``False`` if that content is already stored (the
        temp file is removed then)."""
        final = self.model_path(content_hash)
        if final.exists():
            temp.unlink(missing_ok=True)
            return False
        os.replace(temp, final)
        return True

    def remove_model(self, content_hash: str) -> None:
        self.model_path(content_hash).unlink(missing_ok=True)

    def artifact_dir(self, job_id: int) -> Path:
        return job_artifact_dir(self.root, job_id)
