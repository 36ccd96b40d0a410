"""The web view's scripts: plotly.js (a local bundle, never a CDN; see ..report.plotlyjs) and the shared plots.js.

Why this much care for two files: plotly.js (1.5 MB cartesian bundle, 4.8 MB full) is the biggest part of a first
visit. It is served at a URL naming bundle and version (``/static/plotly-cartesian-4.1.1.min.js``) with a one-year
``immutable`` cache header, so a returning browser never even revalidates it, and gzipped (a third of its size) for
remote browsers that accept it, which matters once ``--host`` puts a network between browser and server. It is
compressed once per process, on the first remote request, not per request as a gzip middleware would (level 9 on the
full bundle costs ~0.5 s of CPU per request); a browser on the same machine gets it plain, since over loopback
compressing and inflating megabytes costs more time than sending it.

What a first visit really waits for is V8 compiling plotly.js: its start-up runs a few thousand functions, each
compiled lazily on the main thread when first called (~1 s on a 2-vCPU machine). The bundle is served with V8's
explicit compile hint (the magic comment ``//# allFunctionsCalledOnLoad``, Chrome 136+; other browsers ignore a
comment), so the functions are compiled on the script-streaming thread while the file downloads and the page parses:
the main-thread work of loading plotly.js halves (measured with Chrome's trace: EvaluateScript ~1.4 s -> ~0.8 s).
"""

from __future__ import annotations

import gzip
import threading
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, Response
from starlette.middleware.gzip import GZipMiddleware
from starlette.types import Receive, Scope, Send

from ..report.plotlyjs import bundle_version, plotly_js_path
from ..report.templating import TEMPLATES as REPORT_TEMPLATES

YEAR = "public, max-age=31536000, immutable"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def plotly_url() -> str:
    """A URL naming the bundle and its version, so a year-long ``immutable`` cache never serves a stale one."""
    path = plotly_js_path()
    return f"/static/{path.name.removesuffix('.min.js')}-{bundle_version(path)}.min.js"


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
