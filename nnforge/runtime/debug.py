"""``NNFORGE_DEBUG``: 1 timings, 2 passes applied and fusions refused (with reasons), 3 generated code.

Everything goes through the ``logging`` module under the ``nnforge`` logger; setting the variable only attaches a
stderr handler at the matching level, so applications can route the messages like any other log.
"""

from __future__ import annotations

import logging
import os
import sys


def debug_level() -> int:
    try:
        return int(os.environ.get("NNFORGE_DEBUG", "0") or 0)
    except ValueError:
        return 0


def setup_logging() -> None:
    """Attach one stderr handler to the ``nnforge`` logger when NNFORGE_DEBUG >= 1 (idempotent)."""
    level = debug_level()
    logger = logging.getLogger("nnforge")
    if level <= 0 or any(getattr(h, "_nnforge", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("nnforge %(name)s: %(message)s"))
    handler._nnforge = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if level == 1 else logging.DEBUG)
