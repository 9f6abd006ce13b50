"""The service's file store: uploaded models by content hash, job artifacts, upload staging.

Layout under the storage directory (``$TUNEHUB_HOME/storage`` by default, shared with workers)::

    models/<sha256>          one file per distinct model content (several owners may share it)
    artifacts/job-<id>/      model.so + manifest.json, published atomically by the tuner
    tmp/                     uploads being received or validated; emptied at start-up

A file enters ``models/`` only by an atomic rename from ``tmp/`` after validation, so a crash
leaves at most a stray file in ``tmp/``, never a half-written model.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from compiler.artifact_layout import job_artifact_dir


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.models = root / "models"
        self.artifacts = root / "artifacts"
        self.tmp = root / "tmp"

    def ensure(self) -> FileStore:
        for folder in (self.models, self.artifacts, self.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    def clean_tmp(self) -> None:
        """Remove leftovers of interrupted uploads (call when no upload can be running)."""
        for entry in self.tmp.iterdir():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def new_temp_file(self, prefix: str = "upload-") -> Path:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=self.tmp)
        os.close(fd)
        return Path(name)

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
