"""Where artifacts live, defined once (nothing here imports TVM).

An artifact is a folder holding :data:`LIBRARY_NAME` (the compiled library) and
:data:`MANIFEST_NAME` (what it is, how it was verified, its schedule table). A job's artifact is
published to :func:`job_artifact_dir` of the service's storage folder, whichever way the job ran
(``tunehub tune`` without ``-o``, an embedded worker, a lease worker's upload), so the service
serves every job's artifact from one place (the folder itself is the settings' rule:
:func:`db.config.default_storage_dir`).
"""

from __future__ import annotations

from pathlib import Path

LIBRARY_NAME = "model.so"
MANIFEST_NAME = "manifest.json"


def job_artifact_dir(storage_dir: Path, job_id: int) -> Path:
    """The folder job ``job_id``'s artifact is published to under ``storage_dir``."""
    return Path(storage_dir) / "artifacts" / f"job-{int(job_id)}"
