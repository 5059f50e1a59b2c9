"""The web console (``GET /ui``): one HTML page, one script and one style sheet shipped in the package.

Plain JavaScript over the JSON API of ``docs/api.md`` (no framework, no CDN:
it works with no network access). The files live in ``daemons/ui/`` and are
read once, at start-up, and served from memory.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

#: The console's files: URL path -> (file in daemons/ui/, Content-Type).
ASSETS = {
    "/ui": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/app.css": ("app.css", "text/css; charset=utf-8"),
}
UI_DIR = Path(__file__).with_name("ui")


def add_console_routes(router: web.UrlDispatcher) -> None:
    """Register ``GET`` of every path of :data:`ASSETS` (the file's bytes, read now, with ``no-cache``)."""
    for path, (name, content_type) in ASSETS.items():
        body = (UI_DIR / name).read_bytes()

        async def handler(request: web.Request, body: bytes = body, content_type: str = content_type) -> web.Response:
            return web.Response(body=body, headers={"Content-Type": content_type, "Cache-Control": "no-cache"})

        router.add_get(path, handler, allow_head=False)
