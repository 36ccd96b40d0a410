"""The Jinja2 environment shared by the report and the web view (both draw figures with the same macros)."""

from __future__ import annotations

from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).with_name("templates")


def environment(*extra_dirs: Path) -> jinja2.Environment:
    """A fresh environment (no module-level state); ``extra_dirs`` come first so the web view can add its pages."""
    loader = jinja2.FileSystemLoader([*map(str, extra_dirs), str(TEMPLATES)])
    return jinja2.Environment(loader=loader, autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True,
                              lstrip_blocks=True)
