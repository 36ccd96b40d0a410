"""ModelView web view: ``nnforge view DB`` serves runs, filterable cells, run comparisons and single cells on
127.0.0.1 (FastAPI + Jinja2 + Plotly; the choice is explained in docs/report.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .server import DEFAULT_HOST, DEFAULT_PORT, PortInUse, bind, running, serve

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app(db_path: str | Path) -> FastAPI:
    """The FastAPI app for one store file (imported lazily: `nnforge --help` must not pay for FastAPI)."""
    from .app import create_app as _create

    return _create(db_path)


__all__ = ["DEFAULT_HOST", "DEFAULT_PORT", "PortInUse", "bind", "create_app", "running", "serve"]
