"""The bodies of ``nnforge report`` and ``nnforge view`` (nnforge/cli.py only declares their options): turning the
expected failures (no database, unknown run, port in use) into one clear line and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console


def _fail(console: Console, message: str) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def report_command(db: Path, out: Path, run: str | None, console: Console) -> None:
    from .build import write_report
    from .data import StoreNotFound

    try:
        path = write_report(db, out, run)
    except StoreNotFound as e:
        _fail(console, str(e))
    except KeyError as e:
        _fail(console, str(e.args[0]) if e.args else str(e))
    console.print(f"report written to {path}", highlight=False, soft_wrap=True)


def view_command(db: Path, host: str, port: int, open_browser: bool, console: Console) -> None:
    from ..web.server import PortInUse, serve
    from .data import StoreNotFound

    try:
        serve(db, host=host, port=port, open_browser=open_browser)
    except StoreNotFound as e:
        _fail(console, str(e))
    except PortInUse as e:
        _fail(console, e.strerror or str(e))
    except KeyboardInterrupt:
        pass
