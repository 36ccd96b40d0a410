"""The web view's scripts: plotly.js (from the installed plotly package, never a CDN) and the shared plots.js.

Why this much care for two files: plotly.js is 4.8 MB, the biggest part of a first visit. It is served at a versioned
URL (``/static/plotly-<version>.min.js``) with a one-year ``immutable`` cache header, so a returning browser never even
revalidates it, and gzipped (about 1.4 MB) for remote browsers that accept it, which matters once ``--host`` puts a
network between browser and server. It is compressed once per process, on the first remote request, not per request as
a gzip middleware would (level 9 on 4.8 MB costs ~0.5 s of CPU per request); a browser on the same machine gets it
plain, since over loopback compressing and inflating 4.8 MB costs more time than sending it.

What a first visit really waits for is V8 compiling plotly.js: its start-up runs a few thousand functions, each
compiled lazily on the main thread when first called (~1 s on a 2-vCPU machine). The bundle is served with V8's
explicit compile hint (the magic comment ``//# allFunctionsCalledOnLoad``, Chrome 136+; other browsers ignore a
comment), so the functions are compiled on the script-streaming thread while the file downloads and the page parses:
the main-thread work of loading plotly.js halves (measured with Chrome's trace: EvaluateScript ~1.4 s -> ~0.8 s).
"""

from __future__ import annotations

import gzip
import threading
from functools import lru_cache
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import Receive, Scope, Send

from ..report.templating import TEMPLATES as REPORT_TEMPLATES

YEAR = "public, max-age=31536000, immutable"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def plotly_js_path() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@lru_cache(maxsize=1)
def plotly_version() -> str:
    """plotly.js's version, read from the bundle's banner ("plotly.js v4.1.1"); plotly.py's version if unreadable."""
    with open(plotly_js_path(), encoding="utf-8", errors="replace") as f:
        head = f.read(300)
    for word in head.split():
        if word.startswith("v") and word[1:2].isdigit():
            return word[1:]
    import plotly

    return f"py{plotly.__version__}"


def plotly_url() -> str:
    return f"/static/plotly-{plotly_version()}.min.js"


COMPILE_HINT = b"//# allFunctionsCalledOnLoad\n"
_lock = threading.Lock()
_bodies: dict[tuple[Path, bool], bytes] = {}


def plotly_body(gzipped: bool = False) -> bytes:
    """plotly.min.js as served (compile hint first), plain or gzipped; built on first use, kept for the process."""
    path = plotly_js_path()
    with _lock:
        if (path, False) not in _bodies:
            _bodies[(path, False)] = COMPILE_HINT + path.read_bytes()
        if gzipped and (path, True) not in _bodies:
            _bodies[(path, True)] = gzip.compress(_bodies[(path, False)], compresslevel=6, mtime=0)
        return _bodies[(path, gzipped)]


class GZipPages(GZipMiddleware):
    """Gzip for pages and figure JSON (5-10x smaller), never for /static/: plotly.js is compressed once, here, and
    only for remote browsers; the middleware would compress its 4.8 MB on every request."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/static/"):
            await self.app(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def add_static_routes(app: FastAPI) -> None:
    """``/static/plotly-<version>.min.js`` (cached for a year), ``/static/plotly.min.js`` (the old URL, a day) and
    ``/static/plots.js``."""

    def plotly_response(request: Request, cache: str) -> Response:
        headers = {"Cache-Control": cache, "Vary": "Accept-Encoding"}
        local = request.client is not None and request.client.host in LOOPBACK
        if not local and "gzip" in request.headers.get("accept-encoding", ""):
            return Response(plotly_body(gzipped=True), media_type="text/javascript",
                            headers={**headers, "Content-Encoding": "gzip"})
        return Response(plotly_body(), media_type="text/javascript", headers=headers)

    @app.get(plotly_url())
    def plotly_js_versioned(request: Request) -> Response:
        return plotly_response(request, YEAR)

    @app.get("/static/plotly.min.js")
    def plotly_js(request: Request) -> Response:
        return plotly_response(request, "max-age=86400")

    @app.get("/static/plots.js")
    def plots_js() -> FileResponse:
        return FileResponse(REPORT_TEMPLATES / "plots.js", media_type="text/javascript")
