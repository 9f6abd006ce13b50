"""Dependencies of the routes, as ``Annotated`` aliases (FastAPI full-stack template style).

``StorageDep`` the process's storage; ``FilesDep`` the file store; ``SettingsDep``;
``CurrentUser`` a caller with a *user* token; ``WorkerAuth`` a caller with a *worker* token.
A missing or unknown token is 401 (with ``WWW-Authenticate: Bearer``), a token of the wrong kind
is 403.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

import db
from service.api.errors import ApiError
from service.auth import Principal, hash_token
from service.files import FileStore
from service.settings import Settings

API_PREFIX = "/api/v1"


@dataclass
class ServiceState:
    """What the app holds for its whole life (``app.state.tunehub``)."""

    settings: Settings
    storage: db.TuningStorage
    files: FileStore
    owns_storage: bool = True


def get_state(request: Request) -> ServiceState:
    return request.app.state.tunehub


def get_storage(request: Request) -> db.TuningStorage:
    return request.app.state.tunehub.storage


def get_files(request: Request) -> FileStore:
    return request.app.state.tunehub.files


def get_settings(request: Request) -> Settings:
    return request.app.state.tunehub.settings


StateDep = Annotated[ServiceState, Depends(get_state)]
StorageDep = Annotated[db.TuningStorage, Depends(get_storage)]
FilesDep = Annotated[FileStore, Depends(get_files)]
SettingsDep = Annotated[Settings, Depends(get_settings)]

bearer = HTTPBearer(
    auto_error=False,
    description="an API token from `tunehub token create` (or $TUNEHUB_HOME/token)",
)


def _unauthorized(detail: str) -> ApiError:
    return ApiError(401, "unauthorized", detail, {"WWW-Authenticate": "Bearer"})


def get_principal(
    storage: StorageDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    if credentials is None or not credentials.credentials:
        raise _unauthorized("missing API token: send 'Authorization: Bearer <token>'")
    token = storage.find_api_token(hash_token(credentials.credentials))
    if token is None:
        raise _unauthorized("invalid or revoked API token")
    return Principal(name=token.name, kind=token.kind, token_id=token.id)


def get_current_user(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if principal.kind != "user":
        raise ApiError(403, "forbidden", f"a {principal.kind} token cannot use the user API")
    return principal


def get_worker(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    if principal.kind != "worker":
        raise ApiError(403, "forbidden", "this endpoint needs a worker token")
    return principal


CurrentUser = Annotated[Principal, Depends(get_current_user)]
WorkerAuth = Annotated[Principal, Depends(get_worker)]
