"""Shared test set-up: every test runs in its own nnforge session (no pending effects leak between tests), compiled
shared objects go to one temporary cache per test run shared by the xdist workers (each .so is built once per run,
never read from a developer's ~/.cache), and ``backend`` runs a test on every backend this machine has."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

import nnforge as nf
from nnforge.codegen.triton import interpreted
from nnforge.codegen.triton.offline import LaunchRecorder
from nnforge.trace import fresh_session

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels on the CPU, unless a GPU run sets 0
BACKENDS = [b for b in ("reference", "cpu", "triton") if b in nf.available_backends()]


@pytest.fixture(autouse=True)
def _fresh_nnforge_session(request: pytest.FixtureRequest):
    """A session of its own per test, its random numbers (``nf.rand``, dropout masks, parameter initializations)
    and torch's (a torch model's initial weights) seeded from the test's id: a failure replays with the same draws,
    whichever tests ran before it in its worker."""
    seed = zlib.crc32(request.node.nodeid.encode())
    torch.manual_seed(seed)
    with fresh_session():
        nf.manual_seed(seed)
        yield


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id: a failure replays with the same numbers."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


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
    """Each backend in turn: the same test matrix runs on all of them (a ``whole_model`` test on Triton only where
    kernels run on a GPU: its interpreter runs one program after another, minutes per training step)."""
    if request.param == "triton" and interpreted() and request.node.get_closest_marker("whole_model"):
        pytest.skip("a whole model on Triton's interpreter takes minutes: checked on a GPU")
    return request.param


@pytest.fixture(scope="session", autouse=True)
def _recorded_launches():
    """With ``NNFORGE_RECORD_LAUNCHES=<folder>`` (``scripts/gpu-build.py``), every kernel launched under Triton's
    interpreter is noted with the test that launched it first, and written to ``<folder>/<worker>.json`` at the
    end, to be compiled for a GPU without one."""
    folder = os.environ.get("NNFORGE_RECORD_LAUNCHES")
    if not folder or not interpreted():
        yield
        return
    with LaunchRecorder(origin=lambda: os.environ.get("PYTEST_CURRENT_TEST", "").split(" (")[0]) as recorder:
        yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    Path(folder, f"{worker}.json").write_text(json.dumps(recorder.records, default=str))
