"""Backend-parametrized fixtures. Compiled shared objects go to one temporary cache per test run, shared by the
xdist workers (so each .so is built once per run, never read from a developer's ~/.cache)."""

from __future__ import annotations

import os

import pytest

import nnforge as nf

BACKENDS = [b for b in ("reference", "cpu") if b in nf.available_backends()]


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "nnforge-cache"
    shared.mkdir(parents=True, exist_ok=True)
    old = os.environ.get("NNFORGE_CACHE_DIR")
    os.environ["NNFORGE_CACHE_DIR"] = str(shared)
    yield shared
    if old is None:
        os.environ.pop("NNFORGE_CACHE_DIR", None)
    else:
        os.environ["NNFORGE_CACHE_DIR"] = old


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param

