"""Browser-facing security headers on every response: a pure ASGI middleware.

Every answer (the API's JSON, the dashboard's pages and files, errors) gets
``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY``, ``Referrer-Policy: no-referrer``
and a ``Content-Security-Policy``:

- :data:`CSP`, everywhere but the API docs: only this server's own scripts, styles, images and
  API (the dashboard loads its modules, CSS and the vendored uPlot from ``/dashboard/static``,
  has no inline script or style, and sets styles through the CSSOM, which a CSP allows); no
  plugins, no ``<base>``, no framing.
- :data:`DOCS_CSP`, for ``/docs`` and ``/redoc`` (FastAPI's Swagger UI and ReDoc pages): they load
  their bundles from the jsDelivr CDN (fonts from Google for ReDoc) and start them with an
  inline script, so the policy allows those hosts and inline code, and still no framing.

A header the response already has is left as it is.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
DOCS_CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net",
        "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net https://fonts.googleapis.com",
        "img-src 'self' data: https://fastapi.tiangolo.com https://cdn.redoc.ly",
        "font-src 'self' https://fonts.gstatic.com",
        "connect-src 'self'",
        "worker-src 'self' blob:",
        "object-src 'none'",
        "base-uri 'none'",
        "frame-ancestors 'none'",
    ]
)
#: Paths of the API documentation pages (they get :data:`DOCS_CSP`).
DOCS_PATHS = ("/docs", "/redoc")

_COMMON = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def policy_for(path: str) -> str:
    """The Content-Security-Policy of a response to ``path``."""
    if any(path == p or path.startswith(p + "/") for p in DOCS_PATHS):
        return DOCS_CSP
    return CSP


class SecurityHeaders:
    """Adds the headers above to each HTTP response's start message."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = policy_for(scope.get("path", ""))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                headers = MutableHeaders(scope=message)
                for name, value in (*_COMMON.items(), ("Content-Security-Policy", csp)):
                    if name not in headers:
                        headers.append(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
