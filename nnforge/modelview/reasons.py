"""The one-line reason of a cell without a time, for tables and summaries.

Stored errors keep everything (a traceback, a faulthandler dump after "worker killed by SIGSEGV"), but a summary line
must say *why*: the harness's own first line when it wrote one, else the exception line of the traceback — never
"Traceback (most recent call last):" nor the last frame of a dump.
"""

from __future__ import annotations

TRACEBACK = "Traceback (most recent call last):"
_NOT_THE_EXCEPTION = ("Traceback", "During handling of the above exception", "The above exception", "...", "---")


def failure_reason(error: str | None) -> str:
    """The line that says why, from a stored ``error`` (see module doc)."""
    lines = [ln.rstrip() for ln in (error or "").strip().splitlines() if ln.strip()]
    if not lines:
        return "no reason recorded"
    first = lines[0]
    if not first.endswith(TRACEBACK):
        return first  # the harness's own words: "worker killed by SIGSEGV (during timing)", "max abs err ..."
    prefix = first[: -len(TRACEBACK)].strip()
    for ln in reversed(lines[1:]):
        if not ln[:1].isspace() and not ln.startswith(_NOT_THE_EXCEPTION) and not ln.startswith("^"):
            return f"{prefix} {ln}".strip()
    return first
