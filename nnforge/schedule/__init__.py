"""The schedule: decisions shared by every backend, taken once, from what a backend says of its machine (``Target``)."""

from .target import Target

__all__ = ["Target"]
