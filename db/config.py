"""Where the tuning database and the service's storage folder live.

The URL comes from, in order: an explicit ``--db URL``, the environment variable
``TUNEHUB_DATABASE_URL``, then the embedded default ``sqlite:///<home>/tunehub.db`` where home is
``$TUNEHUB_HOME`` or ``~/.tunehub``. The service's settings class reads the same variable.
"""

from __future__ import annotations

import os
from pathlib import Path

DATABASE_URL_ENV = "TUNEHUB_DATABASE_URL"
HOME_ENV = "TUNEHUB_HOME"
STORAGE_DIR_ENV = "TUNEHUB_STORAGE_DIR"


def tunehub_home() -> Path:
    """The directory TuneHub keeps its local state in (not created here)."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.home() / ".tunehub"


def default_storage_dir() -> Path:
    """The service's storage folder (artifacts, uploads, scratch): ``$TUNEHUB_STORAGE_DIR``,
    else ``$TUNEHUB_HOME/storage``; absolute, not created here."""
    configured = os.environ.get(STORAGE_DIR_ENV)
    root = Path(configured) if configured else tunehub_home() / "storage"
    return root.expanduser().absolute()


def default_database_url() -> str:
    """The embedded default: an SQLite file in :func:`tunehub_home`."""
    return f"sqlite:///{tunehub_home() / 'tunehub.db'}"


def resolve_database_url(explicit: str | None = None) -> tuple[str, bool]:
    """Return ``(url, is_embedded_default)`` for an optional explicit URL.

    ``is_embedded_default`` is true only when neither ``explicit`` nor the environment gave a URL:
    that database belongs to this machine's TuneHub and may be created or upgraded on first use.
    """
    if explicit:
        return explicit, False
    from_env = os.environ.get(DATABASE_URL_ENV)
    if from_env:
        return from_env, False
    return default_database_url(), True
