"""Dependencies of the routes, as ``Annotated`` aliases (FastAPI full-stack template style).

``StorageDep`` the process's storage; ``FilesDep`` the file store; ``SettingsDep``;
``CurrentUser`` a caller with a *user* token; ``WorkerAuth`` a caller with a *worker* token.
A missing or unknown token is 401 (with ``WWW-Authenticate: Bearer``), a token of the wrong kind
is 403.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param

import db
from service.api.errors import ApiError
from service.auth import Principal, hash_token
from service.files import FileStore
from service.history_cache import HistoryCache
from service.settings import Settings

API_PREFIX = "/api/v1"
_MISS = object()


@dataclass
class ServiceState:
    """What the app holds for its whole life (``app.state.tunehub``)."""

    settings: Settings
    storage: db.TuningStorage
    files: FileStore
    owns_storage: bool = True
    #: token hash -> (principal or None, expiry): status pages are polled often, and a token
    #: lookup is a database round trip. A revoked token stops working within the TTL.
    token_cache: dict[str, tuple[Principal | None, float]] = field(default_factory=dict)
    token_cache_lock: threading.Lock = field(default_factory=threading.Lock)
    #: job id -> (status page, owner, expiry): a micro-cache for the most polled endpoint.
    job_cache: dict[int, tuple[object, str | None, float]] = field(default_factory=dict)
    #: jobs' whole histories, extended with new records on the next read (the dashboard's).
    history: HistoryCache = field(default_factory=HistoryCache)

    def cached_principal(self, token: str) -> Principal | None | object:
        """The cached answer for ``token``, or ``_MISS``."""
        cached = self.token_cache.get(hash_token(token))
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        return _MISS

    def principal(self, token: str) -> Principal | None:
        digest = hash_token(token)
        now = time.monotonic()
        row = self.storage.find_api_token(digest)
        found = None if row is None else Principal(name=row.name, kind=row.kind, token_id=row.id)
        ttl = self.settings.token_cache_secs
        if ttl > 0:
            with self.token_cache_lock:
                if len(self.token_cache) > 10_000:
                    self.token_cache.clear()
                self.token_cache[digest] = (found, now + ttl)
        return found


async def get_state(request: Request) -> ServiceState:
    return request.app.state.tunehub


async def get_storage(request: Request) -> db.TuningStorage:
    return request.app.state.tunehub.storage


async def get_files(request: Request) -> FileStore:
    return request.app.state.tunehub.files


async def get_settings(request: Request) -> Settings:
    return request.app.state.tunehub.settings


StateDep = Annotated[ServiceState, Depends(get_state)]
StorageDep = Annotated[db.TuningStorage, Depends(get_storage)]
FilesDep = Annotated[FileStore, Depends(get_files)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

bearer = HTTPBearer(
    auto_error=False,
    description="an API token from `tunehub token create` (or $TUNEHUB_HOME/token)",
)


#: Where :mod:`service.api.request_guard` leaves the principal it resolved (``request.state``),
#: so that the route's dependency does not look the token up a second time.
GUARD_PRINCIPAL = "tunehub_principal"
MISSING_TOKEN = "missing API token: send 'Authorization: Bearer <token>'"
INVALID_TOKEN = "invalid or revoked API token"


def _unauthorized(detail: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, {"WWW-Authenticate": "Bearer"})


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header as :data:`bearer` reads it;
    ``None`` when the header is absent, empty or of another scheme."""
    scheme, token = get_authorization_scheme_param(authorization)
    if not (authorization and scheme and token) or scheme.lower() != "bearer":
        return None
    return token


async def authenticate(state: ServiceState, token: str | None) -> Principal:
    """The principal of ``token``; raises :class:`ApiError` 401 (with ``WWW-Authenticate:
    Bearer``) for a missing, unknown or revoked one. Only a token-cache miss reads the database,
    in a worker thread: the event loop never waits on it."""
    if not token:
        raise _unauthorized(MISSING_TOKEN)
    principal = state.cached_principal(token)
    if principal is _MISS:
        principal = await anyio.to_thread.run_sync(state.principal, token)
    if principal is None:
        raise _unauthorized(INVALID_TOKEN)
    return principal  # type: ignore[return-value]


def require_kind(principal: Principal, kind: str) -> Principal:
    """``principal`` when its token is of ``kind`` (``user`` or ``worker``); else
    :class:`ApiError` 403."""
    if principal.kind == kind:
        return principal
    if kind == "user":
        raise ApiError(403, "forbidden", f"a {principal.kind} token cannot use the user API")
    raise ApiError(403, "forbidden", f"this endpoint needs a {kind} token")


async def get_principal(
    request: Request,
    state: StateDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    # Dependencies are async so that a request makes one thread hop (its endpoint), not one per
    # dependency. The request guard has usually resolved the token already (before the body
    # was read); it is the same header.
    resolved = getattr(request.state, GUARD_PRINCIPAL, None)
    if resolved is not None:
        return resolved
    return await authenticate(state, credentials.credentials if credentials else None)


async def get_current_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    return require_kind(principal, "user")


async def get_worker(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    return require_kind(principal, "worker")


CurrentUser = Annotated[Principal, Depends(get_current_user)]
WorkerAuth = Annotated[Principal, Depends(get_worker)]
