"""The bodies of ``nnforge report`` and ``nnforge view`` (nnforge/cli.py only declares their options): turning the
expected failures (no database, unknown run, an output path that cannot be written, an address that cannot be served
on) into one clear line and exit code 2, never a traceback."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from ...cli import _fail  # one error line for every command


def _check_out(console: Console, out: Path) -> None:
    """Refuse an output path that cannot be a file before the report is built (seconds for a big run): a directory,
    or a path under an existing file. Other failures (no permission, a read-only place) are said when writing."""
    if out.is_dir():
        _fail(console, f"cannot write report {out}: it is a directory")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                _fail(console, f"cannot write report {out}: {parent} is not a directory")
            return


def report_command(db: Path, out: Path, run: str | None, console: Console) -> None:
    """``nnforge report``: build the run's report and write it, every expected failure one line."""
    import sqlite3

    from .build import build_report, render_html, write_html
    from .data import StoreNotFound

    _check_out(console, out)
    try:
        html = render_html(build_report(db, run))
    except StoreNotFound as e:
        _fail(console, str(e))
    except KeyError as e:
        _fail(console, str(e.args[0]) if e.args else str(e))
    except sqlite3.Error as e:
        _fail(console, f"cannot use store {db}: {e}")
    try:
        path = write_html(html, out)
    except OSError as e:  # the temporary file next to it names the directory as the place that refused
        where = f"cannot create a file in {out.parent}: " if ".report-" in str(e.filename or "") else ""
        _fail(console, f"cannot write report {out}: {where}{e.strerror or e}")
    console.print(f"report written to {escape(path)}", highlight=False, soft_wrap=True, emoji=False)


def view_command(db: Path, host: str, port: int, open_browser: bool, console: Console) -> None:
    """``nnforge view``: serve until Ctrl-C; a missing store or an address it cannot listen on is one line."""
    from ..web.server import CannotServe, serve
    from .data import StoreNotFound

    try:
        serve(db, host=host, port=port, open_browser=open_browser)
    except StoreNotFound as e:
        _fail(console, str(e))
    except CannotServe as e:
        _fail(console, e.strerror or str(e))
    except KeyboardInterrupt:
        pass
