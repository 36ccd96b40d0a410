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


def _library_prefixes() -> tuple[str, ...]:
    """Directories whose frames are not the user's: nnforge's and torch's (an nnforge layer behind ``TorchModule``
    runs inside torch's module call and autograd function, whose lines say nothing of the user's code)."""
    skipped = [_PACKAGE_DIR + os.sep]
    torch = sys.modules.get("torch")
    if getattr(torch, "__file__", None):
        skipped.append(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)  # type: ignore[union-attr]
    return tuple(skipped)


def user_location() -> str:
    """``file:line`` of the innermost stack frame outside the nnforge package and torch's: the user's line."""
    prefixes = _library_prefixes()
    frame = sys._getframe(1)
    while frame is not None:
        if not os.path.abspath(frame.f_code.co_filename).startswith(prefixes):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def user_stacklevel() -> int:
    """The ``warnings.warn`` stack level, for a warning raised by the caller, of the innermost frame outside
    nnforge and torch: a warning then points at the user's line, as ``user_location`` does."""
    prefixes = _library_prefixes()
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(prefixes):
        frame, level = frame.f_back, level + 1
    return level


def at(message: str) -> str:
    """Append the user's source location to an error message."""
    return f"{message} (at {user_location()})"
