"""Errors raised at trace time. Each names the op, the shapes or dtypes and the user's source line."""

from __future__ import annotations

import os
import sys

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class NNForgeError(Exception):
    """Base class of every error nnforge raises on purpose."""


class ShapeError(NNForgeError, ValueError):
    """Shapes that do not fit an op."""


class DTypeError(NNForgeError, TypeError):
    """A dtype an op does not accept."""


class TraceError(NNForgeError, TypeError):
    """A traced function or body was called or returned the wrong thing."""


def user_location() -> str:
    """``file:line`` of the innermost stack frame outside the nnforge package (the user's line)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR + os.sep):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def at(message: str) -> str:
    """Append the user's source location to an error message."""
    return f"{message} (at {user_location()})"
