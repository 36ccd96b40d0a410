"""Where generated C is written: lines at an indentation, and the names generated for them.

Every printer of the C renderer writes into an ``Emitter`` instead of building lists of indented strings: the
emitter knows how deep the code it is given sits, so a printer says ``open``/``close`` for a block and never
spells indentation; the names it makes come from the program's one ``Names``, so no two printers can make the
same name.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

INDENT = "    "


class Names:
    """The C identifiers generated for one program: ``prefix`` then a counter (one counter for all prefixes),
    with ``_`` between them when the prefix ends in a digit (else ``b1`` + 238 and ``b`` + 1238 would both be
    ``b1238``). ``made`` lists them: a part function's locals are renumbered from them (``parts``)."""

    def __init__(self) -> None:
        self.counter = 0
        self.made: set[str] = set()

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        name = f"{prefix}_{self.counter}" if prefix[-1:].isdigit() else f"{prefix}{self.counter}"
        self.made.add(name)
        return name


class Emitter:
    """C lines under construction, ``depth`` blocks deep. ``sub()`` gives an emitter of its own lines at the same
    depth (code printed apart and placed later: what runs before a loop, a tile's vector form kept only if it
    can be spelled), ``place`` puts such lines at a mark taken with ``mark()``."""

    def __init__(self, names: Names, depth: int = 0):
        self.names = names
        self.depth = depth
        self.lines: list[str] = []

    def fresh(self, prefix: str) -> str:
        """A new C identifier (see ``Names``)."""
        return self.names.fresh(prefix)

    @property
    def indent(self) -> str:
        return INDENT * self.depth

    def __call__(self, *stmts: str) -> None:
        """Each statement on a line of its own at the current depth."""
        self.lines.extend(self.indent + s for s in stmts)

    def each(self, stmts: Iterable[str]) -> None:
        """``stmts`` (a body's statements) at the current depth."""
        self.lines.extend(self.indent + s for s in stmts)

    def open(self, head: str) -> None:
        """A line that opens a block (``for (...) {``, or a lone ``{``): what follows is one level deeper."""
        self(head)
        self.depth += 1

    def close(self, tail: str = "}") -> None:
        """Ends the innermost open block."""
        self.depth -= 1
        self(tail)

    @contextmanager
    def block(self, head: str, tail: str = "}") -> Iterator[None]:
        """``head``, what the ``with`` body writes one level deeper, then ``tail``."""
        self.open(head)
        yield
        self.close(tail)

    def sub(self, depth: int | None = None) -> Emitter:
        """An emitter of separate lines sharing these names, at ``depth`` (by default this one's)."""
        return Emitter(self.names, self.depth if depth is None else depth)

    def mark(self) -> int:
        """Where the next line will go (for ``place`` and for cutting the code into parts)."""
        return len(self.lines)

    def place(self, at: int, lines: Iterable[str]) -> None:
        """Already indented ``lines`` (another emitter's) inserted at mark ``at``."""
        self.lines[at:at] = list(lines)

    def append(self, other: Emitter) -> None:
        """Another emitter's lines, as they are, after these."""
        self.lines.extend(other.lines)
