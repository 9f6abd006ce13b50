"""The request guard: a pure ASGI middleware that checks a request's token and bounds its body
before a byte of the body is read.

FastAPI reads and parses a request's whole body before it solves the route's dependencies, so
the token check of :mod:`service.api.deps` alone comes after an anonymous client's 300 MiB are in
memory. The guard runs first, for every HTTP request, from a table it derives once from the
app's routes (:func:`route_table`):

1. **Token.** A route whose dependencies include :func:`~service.api.deps.get_principal` needs
   a token: missing, unknown or revoked is the deps' 401 (``WWW-Authenticate: Bearer``); one of
   the wrong kind (the route depends on ``get_current_user`` or ``get_worker``) is their 403.
   The lookup is :func:`~service.api.deps.authenticate` (the token cache, else the database in a
   worker thread). The principal is handed to the route's dependency, which still runs.
2. **Size.** Each route has a body limit (:class:`BodyLimits`, settings): a ``Content-Length``
   over it is 413 at once; a body without one is counted as it arrives, and the request ends
   with 413 when the count crosses the limit. Nothing the route did with the refused request
   is answered (it cleans up as on any error: uploads remove their temp files).
3. **JSON depth.** A route that parses a JSON body gets it whole (bounded as above) only after
   :mod:`service.json_limits` found it nested at most :data:`MAX_JSON_DEPTH` deep (else 422).
   A route that takes no body gets none: one sent all the same is read (bounded as above) and
   dropped, so that an oversized one is a 413 there too.

A request the table has no route for (404, 405) passes with the default limit: no route reads
its body. Refusals are the project's error body, ``{"detail", "code"}``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio.to_thread
from fastapi import params
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import db
from service import json_limits
from service.api.deps import (
    GUARD_PRINCIPAL,
    ServiceState,
    authenticate,
    bearer_token,
    get_current_user,
    get_principal,
    get_worker,
    require_kind,
)
from service.api.errors import ApiError, error_response, storage_unavailable
from service.json_limits import MAX_JSON_DEPTH
from service.settings import Settings
from service.uploads import MULTIPART_OVERHEAD, too_large

logger = logging.getLogger("tunehub.api")
#: A JSON body at least this long is measured in a worker thread, not on the event loop.
THREAD_DEPTH_CHECK_BYTES = 256 * 1024


@dataclass(frozen=True)
class BodyLimits:
    """Largest request body per route class, in bytes."""

    #: every route but those below (JSON bodies of a few KiB)
    json: int
    #: a worker's measured batch (``POST /workers/leases/{id}/records``)
    batch: int
    #: a model upload (``POST /models``): the upload limit plus multipart overhead
    model_upload: int
    #: what a model upload's refusal names (the file's limit, as the route's own check does)
    model_upload_shown: int
    #: a worker's artifact (``POST /workers/leases/{id}/artifact``: library and manifest)
    artifact: int

    @classmethod
    def from_settings(cls, settings: Settings) -> BodyLimits:
        return cls(
            json=settings.max_json_body_bytes,
            batch=settings.max_batch_body_bytes,
            model_upload=settings.upload_limit + MULTIPART_OVERHEAD,
            model_upload_shown=settings.upload_limit,
            artifact=settings.artifact_body_limit,
        )


#: How a route reads its body: FastAPI parses it as JSON (the guard reads it whole and checks
#: its depth first); the route reads the stream itself (the guard counts it as it goes, as for a
#: form); or it takes none (the guard drops one sent all the same).
JSON, STREAM, NONE = "json", "stream", "none"


@dataclass(frozen=True)
class RouteRule:
    """What the guard checks for one route."""

    #: ``None``: public; ``"any"``: a valid token; ``"user"`` / ``"worker"``: of that kind
    auth: str | None
    #: largest body, bytes
    limit: int
    #: the 413's message
    too_large: str
    #: :data:`JSON`, :data:`STREAM` or :data:`NONE`
    body: str = STREAM


class BodyTooLarge(HTTPException):
    """Raised from the guarded ``receive`` when a streamed body crosses its route's limit (an
    ``HTTPException``, which FastAPI's body parsing passes on unchanged)."""

    def __init__(self, rule: RouteRule) -> None:
        super().__init__(413, rule.too_large)


def _too_large_message(limit: int) -> str:
    return f"the request body is over this route's limit of {limit} bytes"


def _dependency_calls(dependant: Any) -> set[Callable[..., Any]]:
    calls: set[Callable[..., Any]] = set()
    for sub in getattr(dependant, "dependencies", ()):
        if sub.call is not None:
            calls.add(sub.call)
        calls |= _dependency_calls(sub)
    return calls


def _auth_of(dependant: Any) -> str | None:
    calls = _dependency_calls(dependant)
    if get_worker in calls:
        return "worker"
    if get_current_user in calls:
        return "user"
    if get_principal in calls:
        return "any"
    return None


def _body_kind(dependant: Any, reads_itself: bool) -> str:
    body = getattr(dependant, "body_params", ())
    if reads_itself or any(isinstance(p.field_info, params.Form) for p in body):
        return STREAM
    return JSON if body else NONE


def _api_routes(routes: Sequence[BaseRoute]) -> Iterator[Any]:
    """The app's routes with a dependant, in matching order, included routers flattened."""
    try:
        from fastapi.routing import iter_route_contexts  # noqa: PLC0415 - newer FastAPI only
    except ImportError:  # older FastAPI copies included routes into the app's list
        candidates: Iterable[Any] = routes
    else:
        candidates = iter_route_contexts(routes)
    for route in candidates:
        if getattr(route, "dependant", None) is not None and hasattr(route, "path_regex"):
            yield route


def _special_limits(limits: BodyLimits) -> dict[Callable[..., Any], tuple[int, str, bool]]:
    """The routes with a limit of their own, by endpoint function: (limit, the 413's message,
    whether the endpoint reads the request's stream itself)."""
    from service.api.routes import models, workers  # noqa: PLC0415 - routes import the deps

    upload = too_large(limits.model_upload_shown).detail
    return {
        models.upload_model: (limits.model_upload, upload, True),
        workers.upload_artifact: (limits.artifact, _too_large_message(limits.artifact), False),
        workers.upload_batch: (limits.batch, _too_large_message(limits.batch), False),
    }


class RouteTable:
    """The guard's rule for each route of an app (:func:`route_table`)."""

    def __init__(
        self, entries: list[tuple[Any, frozenset[str] | None, RouteRule]], default: RouteRule
    ) -> None:
        self.entries = entries
        self.default = default

    def rule_for(self, scope: Scope) -> RouteRule:
        """The rule of the first route matching the request's path and method, as the router
        picks it; the default (public, JSON limit) for a path no route serves with that
        method."""
        path = _route_path(scope)
        method = scope.get("method", "GET")
        for regex, methods, rule in self.entries:
            if (methods is None or method in methods) and regex.match(path):
                return rule
        return self.default


def route_table(routes: Sequence[BaseRoute], limits: BodyLimits) -> RouteTable:
    """Each route's :class:`RouteRule`, derived from its dependencies (which token it needs,
    whether it parses JSON, reads a form or takes no body) and, for the three upload routes
    (models, artifacts, measured batches), their own limits in :class:`BodyLimits`. Raises
    ``RuntimeError`` when one of those is missing from ``routes`` (it would get the small JSON
    limit)."""
    special = _special_limits(limits)
    found: set[Callable[..., Any]] = set()
    entries = []
    for route in _api_routes(routes):
        endpoint = getattr(route, "endpoint", None)
        limit, message, reads_itself = special.get(
            endpoint, (limits.json, _too_large_message(limits.json), False)
        )
        if endpoint in special:
            found.add(endpoint)
        rule = RouteRule(
            auth=_auth_of(route.dependant),
            limit=limit,
            too_large=message,
            body=_body_kind(route.dependant, reads_itself),
        )
        methods = getattr(route, "methods", None)
        entries.append((route.path_regex, frozenset(methods) if methods else None, rule))
    missing = [f.__name__ for f in special if f not in found]
    if missing:
        raise RuntimeError(f"the request guard found no route for {', '.join(missing)}")
    default = RouteRule(auth=None, limit=limits.json, too_large=_too_large_message(limits.json))
    return RouteTable(entries, default)


def _route_path(scope: Scope) -> str:
    """The path the router matches (Starlette's ``get_route_path``: without the root path)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and (path == root or path[len(root)] == "/"):
        return path[len(root) :]
    return path


def _declared_length(headers: Headers) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


def _may_be_json(headers: Headers) -> bool:
    """FastAPI parses a body as JSON when its type is ``application/json`` or ``+json``; one
    without a type is checked too."""
    kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return not kind or kind == "application/json" or kind.endswith("+json")


def _has_body(headers: Headers) -> bool:
    return "transfer-encoding" in headers or (_declared_length(headers) or 0) > 0


class RequestGuard:
    """The ASGI middleware (see the module docstring). ``routes`` returns the app's routes; the
    table is built from them on the first request, when every route is registered."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        state: ServiceState,
        routes: Callable[[], Sequence[BaseRoute]],
        limits: BodyLimits,
    ) -> None:
        self.app = app
        self.state = state
        self.routes = routes
        self.limits = limits
        self._table: RouteTable | None = None

    def table(self) -> RouteTable:
        if self._table is None:
            self._table = route_table(self.routes(), self.limits)
        return self._table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rule = self.table().rule_for(scope)
        headers = Headers(scope=scope)
        try:
            if rule.auth is not None:
                try:
                    principal = await authenticate(
                        self.state, bearer_token(headers.get("authorization"))
                    )
                except db.StorageUnavailableError as err:
                    logger.warning("database unavailable: %s", err)
                    raise storage_unavailable() from None
                if rule.auth != "any":
                    require_kind(principal, rule.auth)
                scope.setdefault("state", {})[GUARD_PRINCIPAL] = principal
            declared = _declared_length(headers)
            if declared is not None and declared > rule.limit:
                raise ApiError(413, "too_large", rule.too_large)
            checked = rule.body == JSON and _may_be_json(headers)
            if (checked or rule.body == NONE) and _has_body(headers):
                body = await _read_whole(receive, rule)
                if body is None:
                    return  # the client went away: nobody to answer
                if checked:
                    await _check_depth(body)
                receive = _replay(body if checked else b"", receive)
        except ApiError as err:
            await error_response(err.status, err.code, err.detail, err.headers)(
                scope, receive, send
            )
            return
        await _run_counted(self.app, scope, receive, send, rule)


async def _read_whole(receive: Receive, rule: RouteRule) -> bytes | None:
    """The whole body, or ``None`` when the client disconnects first; :class:`ApiError` 413 as
    soon as it is longer than the rule's limit."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > rule.limit:
            raise ApiError(413, "too_large", rule.too_large)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _check_depth(body: bytes) -> None:
    if len(body) >= THREAD_DEPTH_CHECK_BYTES:
        deep = await anyio.to_thread.run_sync(json_limits.nesting_exceeds, body)
    else:
        deep = json_limits.nesting_exceeds(body)
    if deep:
        raise ApiError(
            422,
            "too_deep",
            f"the JSON body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
        )


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the app the body read already, then waits on the client's."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _run_counted(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send, rule: RouteRule
) -> None:
    """Run ``app`` with a ``receive`` that counts the body: past the rule's limit it raises
    :class:`BodyTooLarge` (and again on every later call); whatever the app then answers is
    dropped and the guard answers 413, unless the app had already started its response."""
    size = 0
    exceeded = False
    started = False

    async def counted() -> Message:
        nonlocal size, exceeded
        if exceeded:
            raise BodyTooLarge(rule)
        message = await receive()
        if message["type"] == "http.request":
            size += len(message.get("body", b""))
            if size > rule.limit:
                exceeded = True
                raise BodyTooLarge(rule)
        return message

    async def guarded_send(message: Message) -> None:
        nonlocal started
        if exceeded and not started:
            return
        if message["type"] == "http.response.start":
            started = True
        await send(message)

    try:
        await app(scope, counted, guarded_send)
    except Exception:
        if not exceeded or started:
            raise
    if exceeded and not started:
        await error_response(413, "too_large", rule.too_large)(scope, receive, send)
