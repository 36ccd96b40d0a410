"""The packed-A, K-sliced large-M GEMM path (opt-in through ``GemmConfig``) and the tile-size search."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c import CpuBackend, lower, prepare
from nnforge.codegen.c.gemm import GemmConfig

needs_cpu = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")
PACKED = GemmConfig(pack_a=True, mca=12, kc=40, packed_a_min_m=8)
PACKED_6X16 = GemmConfig(pack_a=True, mca=12, kc=40, packed_a_min_m=8, narrow_k=0)  # small K on the 6 x 16 tile


def _run(fn, cfg: GemmConfig, *args):
    be = CpuBackend(gemm=cfg)
    be._gemm_for = lambda _g: cfg
    return be(nf.compile(fn, backend="reference").trace(*args))(list(args))


@needs_cpu
@pytest.mark.parametrize("m,k,n", [(37, 41, 19), (13, 97, 33), (50, 7, 17), (12, 80, 16)])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("cfg", [PACKED, PACKED_6X16], ids=["4x24", "6x16"])
def test_packed_a_gemm_with_epilogue(m, k, n, dt, cfg):
    rng = np.random.default_rng(m + k + n)
    a, w, b = (rng.standard_normal(s).astype(dt) for s in [(m, k), (n, k), (n,)])
    (got,) = _run(lambda x, y, z: nf.tanh(x @ y.T + z), cfg, a, w, b)
    tol = 1e-4 if dt == np.float32 else 1e-10
    np.testing.assert_allclose(got, np.tanh(a @ w.T + b), rtol=tol, atol=tol)


@needs_cpu
def test_packed_a_gemm_cast_epilogue_does_not_split_k():
    rng = np.random.default_rng(1)
    a, w = rng.standard_normal((30, 90)), rng.standard_normal((90, 20))
    (got,) = _run(lambda x, y: (x @ y).astype(nf.float32), PACKED, a, w)
    np.testing.assert_allclose(got, (a @ w).astype(np.float32), rtol=1e-5, atol=1e-5)


@needs_cpu
def test_packed_a_only_outside_loops_and_when_enabled():
    rng = np.random.default_rng(2)
    a, w = rng.standard_normal((40, 30)).astype(np.float32), rng.standard_normal((30, 24)).astype(np.float32)
    g = prepare(nf.compile(lambda x, y: x @ y, backend="reference").trace(a, w))
    assert "nf_ukrp_4x24_f32(k1_" in lower(g, PACKED).text  # K = 30, 24 columns: the 4 x 24 tile
    assert "nf_ukrp_f32(k1_" in lower(g, PACKED_6X16).text
    assert "(k1_" not in lower(g, GemmConfig()).text


def test_tune_gemm_searches_axes_and_caches(tmp_path, monkeypatch):
    if "cpu" not in nf.available_backends():
        pytest.skip("no working C compiler")
    from nnforge.tune import load_gemm_config, tune_gemm

    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path))
    best = tune_gemm(shapes=((48, 20, 40),), axes={"nc": (32, 64), "pack_a": (False, True), "kc": (8, 16)},
                     repeats=1)
    assert load_gemm_config() == best
    data = json.loads((tmp_path / "tune" / "gemm.json").read_text())
    assert len(data["timings_s"]) >= 3


@needs_cpu
@pytest.mark.parametrize("m", [24, 29, 7, 130])
def test_large_k_packs_a_only_when_a_is_read_down_its_columns(m: int):
    """xᵀ @ dy (a weight gradient, K = T * N) is packed and K-sliced; x @ w with the same large K is not (its
    unit-stride rows stream well unpacked), and both stay exact. ``m`` rows of the result: whole micro-panels of
    xᵀ, a partial one after them, only a partial one, and several row blocks."""
    rng = np.random.default_rng(3 + m)
    x, w = rng.standard_normal((600, m)).astype(np.float32), rng.standard_normal((600, 40)).astype(np.float32)
    cfg = GemmConfig(packed_a_min_k=512, kc=256)
    trace = nf.compile(lambda a, b: a.T @ b, backend="reference").trace(x, w)
    assert "nf_ukrp_f32(k1_" in lower(prepare(trace), cfg).text
    (got,) = _run(lambda a, b: a.T @ b, cfg, x, w)
    np.testing.assert_allclose(got, x.T.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    a, b = rng.standard_normal((24, 600)).astype(np.float32), rng.standard_normal((600, 40)).astype(np.float32)
    trace = nf.compile(lambda a, b: a @ b, backend="reference").trace(a, b)
    assert "nf_ukrp_f32(k1_" not in lower(prepare(trace), cfg).text
    (got,) = _run(lambda a, b: a @ b, cfg, a, b)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
