"""One error body for every failure: ``{"detail": "<message for people>", "code": "<stable>"}``.

Routes raise :class:`ApiError`; the handlers installed by :func:`install_error_handlers` also turn
FastAPI's own errors (validation, 404/405), model-validation errors, storage errors, a full disk
(507 ``storage_full``) and anything unexpected into that shape, so clients can always read
``code``.
"""

from __future__ import annotations

import errno
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import db
from compiler.errors import ModelError

logger = logging.getLogger("tunehub.api")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    503: "unavailable",
    507: "storage_full",
}

#: ``OSError`` numbers of a full disk or an exhausted quota.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})

#: ModelError codes that are not "422 Unprocessable Content".
_MODEL_ERROR_STATUS = {"too_large": 413, "wrong_format": 415, "not_found": 404}


class ApiError(Exception):
    """An HTTP error with a stable ``code`` and a message written for the client."""

    def __init__(self, status: int, code: str, detail: str, headers: dict | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = headers


def not_found(kind: str, ident: object) -> ApiError:
    return ApiError(404, "not_found", f"{kind} {ident} not found")


def model_error(err: ModelError) -> ApiError:
    return ApiError(_MODEL_ERROR_STATUS.get(err.code, 422), err.code, err.message)


def is_disk_full(err: BaseException | None) -> bool:
    """Whether ``err`` (or the error it was raised from) is a full disk or an exhausted quota."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def storage_full() -> ApiError:
    """The answer to a request that could not be stored because the disk is full (507)."""
    return ApiError(
        507,
        "storage_full",
        "the server's storage is full: nothing of this request was kept; retry later",
        {"Retry-After": "60"},
    )


def storage_unavailable() -> ApiError:
    """The answer while the tuning database cannot be reached (503, retry in a few seconds)."""
    return ApiError(
        503, "unavailable", "the tuning database is unavailable, retry later", {"Retry-After": "5"}
    )


def error_response(status: int, code: str, detail: str, headers=None, **extra) -> JSONResponse:
    return JSONResponse({"detail": detail, "code": code, **extra}, status, headers=headers)


def _validation_message(err: RequestValidationError) -> str:
    parts = []
    for item in err.errors()[:5]:
        where = ".".join(str(p) for p in item.get("loc", ()) if p != "body") or "request"
        parts.append(f"{where}: {item.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status, err.code, err.detail, err.headers)

    @app.exception_handler(ModelError)
    async def _model_error(_request: Request, err: ModelError) -> JSONResponse:
        api = model_error(err)
        return error_response(api.status, api.code, api.detail)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))}
            for e in err.errors()[:20]
        ]
        return error_response(422, "invalid_request", _validation_message(err), errors=errors)

    def _storage_full(request: Request, err: BaseException) -> JSONResponse:
        # Receiving an upload, staging an artifact: the route has removed what it wrote.
        logger.error("storage full in %s %s: %s", request.method, request.url.path, err)
        full = storage_full()
        return error_response(full.status, full.code, full.detail, full.headers)

    @app.exception_handler(OSError)
    async def _os_error(request: Request, err: OSError) -> JSONResponse:
        if is_disk_full(err):
            return _storage_full(request, err)
        raise err  # any other OSError is unexpected: the 500 below, logged with its traceback

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code == 400 and is_disk_full(err.__cause__):
            # FastAPI's form parsing spools a part to a temp file: a full disk there is its
            # "error parsing the body", raised from the OSError.
            return _storage_full(request, err)
        code = _STATUS_CODES.get(err.status_code, "error")
        detail = err.detail if isinstance(err.detail, str) else str(err.detail)
        return error_response(err.status_code, code, detail, getattr(err, "headers", None))

    @app.exception_handler(db.NotFoundError)
    async def _missing(_request: Request, err: db.NotFoundError) -> JSONResponse:
        return error_response(404, "not_found", str(err))

    @app.exception_handler(db.ConflictError)
    async def _conflict(_request: Request, err: db.ConflictError) -> JSONResponse:
        return error_response(409, "conflict", str(err))

    @app.exception_handler(db.InvalidTransitionError)
    async def _transition(_request: Request, err: db.InvalidTransitionError) -> JSONResponse:
        return error_response(409, "conflict", str(err))

    @app.exception_handler(db.StorageUnavailableError)
    async def _unavailable(_request: Request, err: db.StorageUnavailableError) -> JSONResponse:
        logger.warning("database unavailable: %s", err)
        down = storage_unavailable()
        return error_response(down.status, down.code, down.detail, down.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        return error_response(500, "internal", "internal server error (logged on the server)")
