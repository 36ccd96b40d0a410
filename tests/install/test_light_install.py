"""`pip install nnforge` (no extras) into a clean venv: the compiler works, ModelView says which extra it needs.

A real install from a copy of the source tree (so the checkout gets no build/ or egg-info), with pip resolving the
dependencies the package declares: an import of pandas, torch or scipy anywhere on the compiler's path fails here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

LSTM = textwrap.dedent(
    """
    import sys
    import numpy as np
    import nnforge as nf

    def lstm(x, h0, c0, w_ih, w_hh, b):
        def cell(carry, x_t):
            h, c = carry
            i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
            c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
            h = nf.sigmoid(o) * nf.tanh(c)
            return (h, c), h
        (h, c), ys = nf.scan(cell, (h0, c0), x)
        return ys, h, c

    rng = np.random.default_rng(17)
    T, N, I, H = 7, 3, 5, 4
    args = [rng.standard_normal(s) for s in [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]]
    compiled = nf.compile(lstm, backend="cpu")
    got = compiled(*args)
    want = nf.compile(lstm, backend="reference")(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    assert np.abs(got[0]).max() > 0.01
    heavy = sorted(m for m in ("torch", "pandas", "scipy", "psutil", "plotly", "ray", "onnxruntime")
                   if m in sys.modules)
    assert not heavy, heavy
    print("lstm ok", type(compiled._entries[0].programs[next(iter(compiled._entries[0].programs))]).__name__)
    """
)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, **kw)


@pytest.mark.slow
def test_pip_install_without_extras_gives_the_compiler_and_a_hint_for_modelview(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "nnforge", src / "nnforge", ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py, nnforge = venv / "bin" / "python", venv / "bin" / "nnforge"
    r = _run([str(py), "-m", "pip", "install", "-q", str(src)])
    assert r.returncode == 0, r.stderr[-3000:]

    missing = _run([str(py), "-c", "import importlib.util as u; print([m for m in ('torch', 'pandas', 'scipy', "
                    "'psutil', 'plotly', 'jinja2', 'fastapi', 'ray', 'onnxruntime', 'triton') if u.find_spec(m)])"])
    assert missing.stdout.strip() == "[]", f"the plain install pulled in {missing.stdout}"

    r = _run([str(py), "-c", LSTM], cwd=tmp_path)  # not the checkout: the installed package, not the source tree
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "lstm ok CProgram", r.stdout

    for command in (["sweep", "-v", "lstm"], ["report", "x.db"], ["view", "x.db"], ["merge", "a.db", "-o", "b.db"]):
        r = _run([str(nnforge), *command], cwd=tmp_path)
        lines = r.stdout.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, (command, r.stdout, r.stderr)
        assert f"nnforge {command[0]} needs ModelView: pip install 'nnforge[modelview]' (missing: torch," in lines[0]
    assert _run([str(nnforge), "--help"]).returncode == 0
