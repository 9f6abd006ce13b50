"""The dashboard: a few static pages under ``/dashboard`` that read the public JSON API.

The pages hold no data of their own and no server-side rendering: every number comes from
``/api/v1`` with the user's bearer token, which the page asks for once and keeps in the
browser's ``localStorage``. The page files themselves (HTML, JS modules, CSS, the vendored
uPlot) are served without a token, they contain nothing private. Nothing is fetched from
outside the server: the pages work offline.

``install_dashboard(app)`` adds the page routes and the static files to the FastAPI app.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"
DASHBOARD_PREFIX = "/dashboard"
#: Client-side routes: each serves the one page, whose script renders the view for the path.
PAGE_PATHS = ("/", "/jobs/{job_id:int}", "/models", "/workers", "/stats")


def install_dashboard(app: FastAPI) -> None:
    """Serve the dashboard's pages under ``/dashboard`` and its files under
    ``/dashboard/static``."""
    index = STATIC_DIR / "index.html"

    async def page() -> FileResponse:
        # The page is tiny and changes with the code: always revalidate it.
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    for path in PAGE_PATHS:
        app.add_api_route(
            DASHBOARD_PREFIX + path,
            page,
            methods=["GET"],
            include_in_schema=False,
            response_class=FileResponse,
        )

    async def bare() -> RedirectResponse:
        return RedirectResponse(DASHBOARD_PREFIX + "/")

    app.add_api_route(DASHBOARD_PREFIX, bare, methods=["GET"], include_in_schema=False)
    app.mount(
        DASHBOARD_PREFIX + "/static", StaticFiles(directory=STATIC_DIR), name="dashboard-static"
    )
