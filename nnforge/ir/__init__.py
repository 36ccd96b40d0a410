"""The IR: the op set, immutable nodes and graphs, symbolic sizes, builders, printer and verifier.

Importing the package defines every op (``opdefs`` registers each family's rules), so the op tables are
complete before any node is built, whichever module of the package is imported first.
"""

from . import opdefs

__all__ = ["opdefs"]
