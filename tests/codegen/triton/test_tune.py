"""The opt-in tile search (``nnforge.tune.tune_triton``): coordinate search over the axes with an injected timer
(the real one needs a GPU), the winner cached per device name and used by ``TritonBackend`` on that device only;
refused under the interpreter; the tiles it picks reach the generated launches."""

from __future__ import annotations

import json

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.triton import Tiles, TritonBackend
from nnforge.errors import NNForgeError
from nnforge.tune import load_triton_tiles, tune_triton
from nnforge.tune.triton import AXES

pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(not TritonBackend().available, reason="Triton does not import here")]


def _cost(t: Tiles) -> float:
    """A made-up timing with one best value per axis (64 rows, 8 warps, 64 x 32 GEMM tiles in groups of 32 row
    tiles, 2048 elements, 3 stages, the large GEMM tile 128 x 256 on 4 warps from 64 programs, 16384 values a
    program of whole rows)."""
    return (abs(t.scan_rows - 64) + abs(t.scan_warps - 8) + abs(t.gemm_m - 64) + abs(t.gemm_n - 32)
            + abs(t.gemm_k - 32) + abs(t.flat - 2048) / 64 + abs(t.warps - 4) + (t.gemm_warps == 8) * 1e6
            + abs(t.scan_stages - 3) + abs(t.gemm_group - 32) + abs(t.gemm_big_programs - 64) / 64
            + abs(t.gemm_big_n - 256) / 128 + abs(t.gemm_big_warps - 4) + abs(t.row_elements - 16384) / 1024)


def test_the_search_keeps_each_axis_best_and_caches_it_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path))
    seen: list[Tiles] = []

    def timer(t: Tiles) -> float:
        seen.append(t)
        return _cost(t)

    best = tune_triton(timer=timer, device="NVIDIA H200")
    assert best == Tiles(scan_rows=64, scan_warps=8, gemm_m=64, gemm_n=32, gemm_k=32, gemm_warps=4, flat=2048,
                         warps=4, scan_stages=3, gemm_group=32, gemm_big_programs=64, gemm_big_n=256,
                         gemm_big_warps=4, row_elements=16384)
    # each candidate timed once, one axis at a time: the defaults, then each other value of each axis
    assert len(seen) == len(set(seen)) == 1 + sum(len(values) - 1 for values in AXES.values())
    assert load_triton_tiles("NVIDIA H200") == best and load_triton_tiles("NVIDIA H100 80GB HBM3") is None
    saved = json.loads(next((tmp_path / "tune").glob("triton-*.json")).read_text())
    assert saved["device"] == "NVIDIA H200" and len(saved["timings_s"]) == len(seen)


def test_a_candidate_that_fails_loses_and_the_search_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path))

    def timer(t: Tiles) -> float:
        if t.scan_rows == 64:
            raise RuntimeError("out of resource: shared memory")
        return _cost(t)

    assert tune_triton(timer=timer, device="gpu", axes={"scan_rows": (16, 32, 64)}).scan_rows == 32


def test_fields_that_pay_only_together_are_one_axis(tmp_path, monkeypatch):
    """Rows of 96 padded to one tile (``scan_pieces`` off) and held transposed: here faster only together, each
    alone slower than the default; one axis at a time never leaves the default, the joint axis finds them."""
    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path))

    def timer(t: Tiles) -> float:
        return {(True, False): 2.0, (False, False): 3.0, (True, True): 3.0, (False, True): 1.0}[
            (t.scan_pieces, t.scan_transposed)]

    apart = {"scan_pieces": (True, False), "scan_transposed": (False, True)}
    best = tune_triton(timer=timer, device="gpu", axes=apart)
    assert (best.scan_pieces, best.scan_transposed) == (True, False)
    best = tune_triton(timer=timer, device="gpu")
    assert (best.scan_pieces, best.scan_transposed) == (False, True)


def test_tuning_needs_a_gpu_not_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(NNForgeError, match=r"CUDA GPU.*interpreter"):
        tune_triton()


def test_chosen_tiles_reach_the_launches_and_compute_the_same(rng: np.random.Generator):
    """A GEMM's tile and warps, a reduction's; and a GEMM leading the row sums after it (one kernel of whole
    rows) takes its K step and warps from the GEMM's."""
    def f(x, w):
        return nf.tanh(x @ w).sum(axis=0) + 1.0

    def rows(x, w):
        return nf.tanh(x @ w).sum(axis=1) + 1.0

    args = [rng.standard_normal((40, 24)).astype(np.float32), rng.standard_normal((24, 48)).astype(np.float32)]
    tiles = Tiles(gemm_m=32, gemm_m_f32=64, gemm_n=16, gemm_k=16, gemm_warps=8, flat=256, warps=2, reduce_cols=32)
    for fn, launches in ((f, ("BM=64, BN=16, BK=16, num_warps=8", "num_warps=2")), (rows, ("BK=16, num_warps=8",))):
        program = TritonBackend(tiles=tiles)(nf.compile(fn).trace(*args))
        assert all(launch in program.source for launch in launches), program.source
        np.testing.assert_allclose(program(args)[0], nf.compile(fn)(*args), rtol=2e-5, atol=2e-5)


def test_the_backend_uses_the_tiles_tuned_for_its_device(tmp_path, monkeypatch):
    """On a GPU (stood in for: the interpreter off, the device's name) the backend renders with the tiles cached for
    that device's name; another device, or the interpreter, gets the defaults."""
    import torch

    import nnforge.codegen.triton as nft

    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path))
    tuned = tune_triton(timer=_cost, device="NVIDIA H200")
    monkeypatch.setattr(nft, "interpreted", lambda: True)
    assert TritonBackend().device_tiles == Tiles()
    monkeypatch.setattr(nft, "interpreted", lambda: False)
    for name, want in (("NVIDIA H200", tuned), ("NVIDIA A100-SXM4-80GB", Tiles())):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, n=name: n)
        assert TritonBackend().device_tiles == want
