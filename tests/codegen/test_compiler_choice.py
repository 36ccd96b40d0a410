"""``$CC`` picks the C compiler; a ``$CC`` that is missing or broken is a clear error naming it, never a silent
fallback to another compiler. Each case runs in a fresh process (the backend probes its compiler once)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import numpy as np, nnforge as nf
print("cpu" in nf.available_backends())
try:
    print(nf.compile(lambda x: x + 1, backend="cpu")(np.ones(3, np.float32)).tolist())
except RuntimeError as e:
    print("error:", e)
"""


def _run(cc: str) -> list[str]:
    env = {**os.environ, "CC": cc}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()


def test_a_missing_cc_is_named() -> None:
    lines = _run("/no/such/compiler")
    assert lines[0] == "False"
    assert lines[1] == ("error: backend 'cpu': $CC is '/no/such/compiler', which is not an executable on PATH "
                        "(unset CC to use cc/gcc/clang)")


def test_a_broken_cc_is_named() -> None:
    lines = _run("false")
    assert lines == ["False", "error: backend 'cpu': $CC ('false') cannot build a test OpenMP shared object"]


@pytest.mark.skipif(subprocess.run(["which", "gcc"], capture_output=True).returncode != 0, reason="no gcc")
def test_cc_is_used() -> None:
    assert _run("gcc") == ["True", "[2.0, 2.0, 2.0]"]
