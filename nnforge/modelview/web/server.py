"""Serving the web view: bind first (so a taken port is a clear message, not a uvicorn traceback), then run uvicorn
on the bound socket; a context manager runs it on a background thread for tests and notebooks."""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8050
WARM_WAIT_S = 10.0  # the longest a browser opened by --open (or a `running` block) waits for the start-up warm-up


class CannotServe(OSError):
    """The view cannot listen where asked (a port out of range, an unknown host, no permission); the message says
    why in the user's terms, so the command prints it as one line instead of a socket traceback."""


class PortInUse(CannotServe):
    """The requested address is taken; the message says what to do."""


def bind(host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> socket.socket:
    """A listening-ready socket on (host, port); port 0 picks a free one. SO_REUSEADDR lets a restart reuse a port
    left in TIME_WAIT, but on Linux never lets two servers listen on one port, so a live one is still detected.
    Every failure is a :class:`CannotServe` (:class:`PortInUse` when the port is taken)."""
    where = f"cannot serve on {host}:{port}"
    if not 0 <= port <= 65535:  # checked here: socket.bind raises OverflowError, not an OSError, for these
        raise CannotServe(errno.EINVAL, f"{where}: the port must be between 0 and 65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as e:  # e.g. an IPv6 address on a machine without IPv6
        raise CannotServe(e.errno, f"{where}: {e.strerror or e}") from e
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except socket.gaierror as e:  # before OSError: it is one, with a resolver code instead of an errno
        sock.close()
        raise CannotServe(errno.EINVAL, f"{where}: unknown host {host} ({e.strerror or e}); "
                                        "give an address of this machine with --host") from e
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(
                e.errno,
                f"{where}: the port is already in use (another `nnforge view`?). "
                f"Stop that server or choose another port with --port.",
            ) from e
        if e.errno == errno.EACCES:
            raise CannotServe(e.errno, f"{where}: permission denied (ports below 1024 need privileges); "
                                       "choose another port with --port") from e
        if e.errno == errno.EADDRNOTAVAIL:
            raise CannotServe(e.errno, f"{where}: {host} is not an address of this machine; "
                                       "give one with --host") from e
        raise CannotServe(e.errno, f"{where}: {e.strerror or e}") from e
    return sock


def _server(db_path: str | Path, sock: socket.socket):  # -> uvicorn.Server
    import uvicorn

    from .app import create_app

    config = uvicorn.Config(create_app(db_path, warm=True), log_level="warning", access_log=False, lifespan="off")
    return uvicorn.Server(config)


def _wait_warm(server, timeout_s: float = WARM_WAIT_S) -> None:  # server: uvicorn.Server
    """Wait for the app's start-up warm-up (figures of the latest runs), so a first visit finds them built; bounded,
    so a very big store only means a slower first page, never a server that seems not to start."""
    thread = getattr(server.config.app.state, "warm_thread", None)
    if thread is not None:
        thread.join(timeout_s)


def serve(db_path: str | Path, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, open_browser: bool = False) -> None:
    """Serve until interrupted. Raises :class:`CannotServe` (:class:`PortInUse` if the port is taken) before anything
    starts."""
    sock = bind(host, port)
    server = _server(db_path, sock)
    url = f"http://{host}:{sock.getsockname()[1]}/"
    print(f"ModelView: serving {db_path} at {url} (Ctrl-C stops)", flush=True)
    if open_browser:
        import webbrowser

        def open_when_warm() -> None:
            _wait_warm(server)
            webbrowser.open(url)

        threading.Thread(target=open_when_warm, daemon=True, name="modelview-open").start()
    server.run(sockets=[sock])


@contextmanager
def running(db_path: str | Path, host: str = DEFAULT_HOST, port: int = 0, timeout_s: float = 20.0) -> Iterator[str]:
    """The view on a background thread for the duration of a ``with`` block; yields its base URL once it is up and its
    start-up warm-up is done (as ``--open`` does), always stops it."""
    sock = bind(host, port)
    server = _server(db_path, sock)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="modelview-view")
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError("the web view did not start")
        time.sleep(0.02)
    _wait_warm(server)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()
