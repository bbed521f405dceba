"""The browser chat page: GET / (index.html) and its assets under /static/ (app.js, markdown.js, app.css).

The files live in `blazr/server/static/` inside the package (shipped as package data): plain HTML, CSS and
ES modules — no CDN, nothing built at install. The page itself is public even with `--api-key` (the
middleware guards /v1/* only); it asks for the key when the API answers 401 and then sends it as
`Authorization: Bearer`. Cache headers: `no-cache` on everything, so a browser revalidates (ETag /
Last-Modified → 304) and never runs a page older than the server that serves it.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

STATIC_DIR = Path(__file__).resolve().parent / "static"
CACHE_CONTROL = "no-cache"  # revalidate every time: cheap (304) and never stale after an upgrade


class _RevalidatedFiles(StaticFiles):
    """StaticFiles (content types, ETag, 304) with `Cache-Control: no-cache` on every answer."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Cache-Control"] = CACHE_CONTROL
        return response


def install_chat_page(app: FastAPI) -> None:
    """Serve the chat page at / and its assets at /static/ (both left out of the OpenAPI schema)."""

    @app.get("/", include_in_schema=False)
    async def chat_page() -> FileResponse:
        return FileResponse(
            STATIC_DIR / "index.html",
            media_type="text/html; charset=utf-8",
            headers={"Cache-Control": CACHE_CONTROL},
        )

    app.mount("/static", _RevalidatedFiles(directory=STATIC_DIR), name="static")
