"""Running many small test cases as ONE compiled program, and telling compiled runs from interpreter fallbacks.

Compiling one C program per op-table case would cost a gcc run (~0.4 s) each, over a thousand times. Instead the
cases of one (mode, dtype) form a group: one traced function takes every member's inputs and returns every
member's outputs, so the group costs one trace and one gcc run, and each member's test asserts its own slice of
the results (a failure still names the case). A member that the C generator does not cover, or whose trace raises,
is kept out of the group and recorded; a group that fails to build is re-run member by member, so the error names
the one member that causes it.

A graph the C backend does not cover runs on the reference interpreter with a WARNING (once per reason): a test
that asked for ``cpu`` must not pass on that. ``fallback_reason`` says whether a compiled function's programs
are real compiled code.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nnforge as nf


@dataclass
class Member:
    """One case of a group: ``fn(*args)`` returns a flat list of tensors."""

    key: Any
    fn: Callable
    args: Sequence[np.ndarray]


class Fallback(AssertionError):
    """The case ran on the reference interpreter instead of as compiled code."""


def unsupported_reason(backend: str, graph: Any) -> str | None:
    """Why ``backend`` would run ``graph`` (an optimized graph) on the interpreter; None when it compiles it."""
    from nnforge.schedule import Unsupported

    if backend == "cpu":
        from nnforge.codegen.c import lower, prepare
    elif backend == "triton":
        from nnforge.codegen.triton import lower, prepare
    else:
        return None
    try:
        lower(prepare(graph))
    except Unsupported as e:
        return str(e)
    return None


def fallback_reason(cf: nf.compile, backend: str) -> str | None:
    """None when every program ``cf`` built is compiled code for ``backend``, else why not."""
    if backend == "reference":
        return None
    from nnforge.codegen.c.program import CProgram
    from nnforge.codegen.triton.program import TritonProgram

    compiled = {"cpu": CProgram, "triton": TritonProgram}[backend]
    # CompiledFunction keeps its programs per traced signature (as tests/codegen/test_recycle.py reads them).
    for entry in cf._entries:
        for program in entry.programs.values():
            if not isinstance(program, compiled):
                return unsupported_reason(backend, program.graph) or f"{type(program).__name__} is not compiled"
    return None


def run_compiled(fn: Callable, args: Sequence[np.ndarray], backend: str) -> Any:
    """``fn(*args)`` compiled for ``backend`` (its outputs as numpy arrays, in ``fn``'s structure); raises
    ``Fallback`` when it ran on the interpreter instead."""
    cf = nf.compile(fn, backend=backend)
    outs = cf(*args)
    reason = fallback_reason(cf, backend)
    if reason is not None:
        raise Fallback(f"backend {backend!r} ran this on the reference interpreter: {reason}")
    return outs


@contextmanager
def _build_lock(name: str):
    """Serializes building one group across xdist workers: the second worker finds the shared object in the
    on-disk cache (tests/conftest.py gives every worker the same cache) instead of running gcc again."""
    d = os.environ.get("NNFORGE_CACHE_DIR")
    if not d:
        yield
        return
    path = Path(d) / f"group-{hashlib.sha256(name.encode()).hexdigest()[:16]}.lock"
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@dataclass
class Groups:
    """Results of compiled groups, computed on first use and kept for the test session (per xdist worker)."""

    backend: str
    results: dict[Any, dict[Any, Any]] = field(default_factory=dict)  # group -> member key -> outputs | error
    fallbacks: dict[Any, str] = field(default_factory=dict)            # member key -> reason, for the report

    def outputs(self, group: Any, key: Any, members: Callable[[], list[Member]]) -> list[np.ndarray]:
        """Member ``key``'s outputs from ``group`` (built from ``members()`` the first time); re-raises the
        member's own error (its trace error, its ``Fallback``, its build error)."""
        if group not in self.results:
            self.results[group] = self._run(str(group), members())
        r = self.results[group][key]
        if isinstance(r, BaseException):
            raise r
        return r

    def alone(self, member: Member) -> list[np.ndarray]:
        """The member compiled by itself (to tell a miscompiled case from an interaction inside its group)."""
        return run_compiled(member.fn, member.args, self.backend)

    def _run(self, name: str, members: list[Member]) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        grouped = []
        for m in members:
            try:
                graph = nf.compile(m.fn, backend=self.backend).trace(*m.args)
            except Exception as e:
                out[m.key] = e
                continue
            reason = unsupported_reason(self.backend, graph)
            if reason is not None:
                self.fallbacks[m.key] = reason
                out[m.key] = Fallback(f"backend {self.backend!r} runs this on the reference interpreter: {reason}")
                continue
            grouped.append(m)
        if not grouped:
            return out
        spans, flat = [], []
        for m in grouped:
            spans.append((len(flat), len(m.args)))
            flat.extend(m.args)

        def group_fn(*arrays):
            return [list(m.fn(*arrays[s:s + n])) for m, (s, n) in zip(grouped, spans)]

        try:
            with _build_lock(name):
                results = run_compiled(group_fn, flat, self.backend)
        except Exception:
            for m in grouped:
                try:
                    out[m.key] = self.alone(m)
                except Exception as e:
                    out[m.key] = e
            return out
        for m, r in zip(grouped, results):
            out[m.key] = list(r)
        return out


def on_backend(fn: Callable, backend: str) -> Callable:
    """``fn`` the way ``backend``'s part of the test matrix runs it: called eagerly on the reference backend (the
    eager API runs on the reference interpreter, as test_ops.py's reference cases do), compiled for any other
    backend (``run_compiled``: numpy outputs, ``Fallback`` when the interpreter ran it instead)."""
    if backend == "reference":
        return fn
    return lambda *args: run_compiled(fn, args, backend)


def expect_fallback(reason: str | None, check: Callable[[], Any]) -> Any:
    """Runs ``check``. ``reason`` None: as is (a ``Fallback`` fails the test). Otherwise the case is listed as
    known to run on the interpreter (float16 on ``cpu``): it must raise ``Fallback``, and the test is skipped with
    its message (a skip, as in test_ops.py); a listed case that runs compiled fails, so the list stays true."""
    import pytest

    if reason is None:
        return check()
    try:
        check()
    except Fallback as e:
        pytest.skip(f"not compiled: {e}")
    pytest.fail(f"ran compiled although listed as falling back ({reason}): update the list")


def skip_where_unrunnable(backend: str, *dtypes: str) -> None:
    """Skips a case on a backend that cannot check it here: bfloat16 on Triton's interpreter, whose bfloat16
    arithmetic is wrong (numpy has no bfloat16; the case runs on a GPU, with ``TRITON_INTERPRET=0``). Not while
    ``scripts/gpu-build.py`` records launches (``NNFORGE_RECORD_LAUNCHES``): it runs such cases only for the
    kernels they launch, to build those for a GPU, and does not count their values."""
    import os

    import pytest

    from nnforge.codegen.triton import interpreted

    if backend == "triton" and "bfloat16" in dtypes and interpreted() and not os.environ.get(
            "NNFORGE_RECORD_LAUNCHES"):
        pytest.skip("bfloat16 arithmetic is wrong in Triton's interpreter: checked on a GPU only")
