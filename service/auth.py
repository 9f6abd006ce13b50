"""API tokens: generation, hashing, and the local user token of the embedded default.

A token is ``th_`` + 43 url-safe random characters; the database keeps only its sha256
(``api_tokens.token_hash``), so a token is shown once, when it is created. Clients send it as
``Authorization: Bearer <token>``. A token's ``kind`` says what it may do: ``user`` tokens use the
user API (models, jobs, the tuning database) and own what they create, by the token's *name*
(several tokens of one name are one user); ``worker`` tokens use only the worker endpoints.

``tunehub serve`` on a database without any usable user token creates one named ``local`` and
writes it to ``$TUNEHUB_HOME/token`` (mode 0600), so the machine's own user and ``make demo`` can
call the API at once; every other token comes from ``tunehub token create``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from db import TuningStorage

TOKEN_PREFIX = "th_"
LOCAL_USER = "local"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's name (the owner of models and jobs) and kind."""

    name: str
    kind: str
    token_id: int


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(storage: TuningStorage, *, name: str, kind: str) -> tuple[str, int]:
    """Store a new token's hash; return ``(token, id)``. The token is not kept anywhere."""
    token = new_token()
    row = storage.add_api_token(name=name, token_hash=hash_token(token), kind=kind)
    return token, row.id


def read_token_file(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


def ensure_local_token(storage: TuningStorage, path: Path) -> tuple[str, bool]:
    """The local user token from ``path``, created (and written 0600) if missing or revoked.

    Returns ``(token, created)``.
    """
    token = read_token_file(path)
    if token is not None:
        found = storage.find_api_token(hash_token(token))
        if found is not None and found.kind == "user":
            return token, False
    token, _ = create_token(storage, name=LOCAL_USER, kind="user")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(token + "\n")
    os.replace(tmp, path)
    return token, True
