"""``Target``: the shared passes take every threshold from the record a backend hands them, and the C backend
renders what the passes prepared with the same record (one predicate, no re-derivation)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c.gemm import GemmConfig
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.reference import ReferenceProgram
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.rows import NotSeparable, RowSplit, worth_splitting
from nnforge.schedule import Target

sys.path.insert(0, str(Path(__file__).parents[1] / "codegen"))
from test_c_row_split import _lstm_args, ln_lstm, lstm


def _scans(g):
    return [n for n in g.order if n.op == Op.SCAN]


def _optimized(fn, args):
    return nf.compile(fn).trace(*args)


def test_the_row_split_policy_reads_the_target(rng: np.random.Generator) -> None:
    (scan,) = _scans(_optimized(lstm, _lstm_args(rng, 4, 16, 5, 8)))
    cpu = cpu_target()
    assert isinstance(worth_splitting(scan, cpu), RowSplit)
    few = worth_splitting(scan, replace(cpu, min_split_rows=17))
    assert isinstance(few, NotSeparable) and "batch 16 is too small to split" in str(few)
    heavy = worth_splitting(scan, replace(cpu, max_split_weight_bytes=1024))  # W_hh: 8 x 32 float32 = 1 KB
    assert isinstance(heavy, RowSplit)
    heavy = worth_splitting(scan, replace(cpu, max_split_weight_bytes=1023))
    assert isinstance(heavy, NotSeparable) and "exceed 0 KB" in str(heavy)


def test_hoisting_follows_the_targets_split_decision(rng: np.random.Generator) -> None:
    """Where the target splits the loop, hoist lifts only the step's GEMM part (the rest stays in the row-split
    loop, which runs it without barriers); where it does not, the whole carry-free value goes."""
    g = _optimized(ln_lstm, _lstm_args(rng, 4, 16, 5, 8))
    split = run_pipeline(g, pipeline(cpu_target()))
    shared = run_pipeline(g, pipeline(replace(cpu_target(), min_split_rows=10**6)))
    (a,), (b,) = _scans(split), _scans(shared)
    assert isinstance(worth_splitting(a, cpu_target()), RowSplit)
    # the layer norm of x_t W_ih is carry-free: lifted out of the work-shared loop, kept in the row-split one
    assert len(a.attrs["body"].order) > len(b.attrs["body"].order)


def test_a_target_may_hoist_a_row_split_loops_step_work_whole(rng: np.random.Generator) -> None:
    """``Target.hoist_step_work``: the loop is still split by rows, and the layer norm of x_t W_ih leaves it with
    its GEMM, as it leaves a work-shared loop (the body as small as that loop's); the results are unchanged."""
    args = _lstm_args(rng, 4, 16, 5, 8)
    g = _optimized(ln_lstm, args)
    whole = replace(cpu_target(), hoist_step_work=True)
    (kept,), (lifted,) = _scans(run_pipeline(g, pipeline(cpu_target()))), _scans(run_pipeline(g, pipeline(whole)))
    (shared,) = _scans(run_pipeline(g, pipeline(replace(cpu_target(), min_split_rows=10**6))))
    assert isinstance(worth_splitting(lifted, whole), RowSplit)
    assert len(lifted.attrs["body"].order) == len(shared.attrs["body"].order) < len(kept.attrs["body"].order)
    want = ReferenceProgram(g)(list(args))
    got = ReferenceProgram(run_pipeline(g, pipeline(whole)))(list(args))
    for w, o in zip(want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6)


def test_weight_gradient_sums_follow_the_targets_budget(rng: np.random.Generator) -> None:
    def loss(*args):
        return (lstm(*args)[0] ** 2).sum()

    g = _optimized(nf.grad(loss, argnums=(3, 4, 5)), _lstm_args(rng, 5, 3, 7, 16))
    keep = run_pipeline(g, pipeline(cpu_target()))  # dW_hh 16 x 64 float32: 4 KB, far below 512 KB
    hoisted = run_pipeline(g, pipeline(replace(cpu_target(), reduction_hoist_bytes=0)))

    def carries(h):
        return sorted(s.attrs["n_carry"] for s in _scans(h))

    assert carries(hoisted) < carries(keep)


def test_the_backend_renders_with_the_target_the_passes_used(rng: np.random.Generator) -> None:
    from nnforge.codegen.c import lower, prepare

    gemm = GemmConfig()
    g = _optimized(lstm, _lstm_args(rng, 4, 12, 5, 8))
    low = lower(prepare(g, gemm), gemm)
    target = low.program.target
    assert target == cpu_target(gemm) and target.min_split_rows == 2 * gemm.mr
    (loop,) = low.program.loops()
    assert loop.parallel is not None and loop.row_block == gemm.mr  # H = 8: the 6 x 16 tile
    (note,) = [k.note for k in low.listing if k.kind == "scan"]
    assert "batch rows split" in note  # and the C renders the recorded split


def test_a_target_refuses_negative_thresholds() -> None:
    with pytest.raises(ValueError, match="chunk_bytes must be >= 0"):
        Target("gpu", min_split_rows=1, max_split_weight_bytes=0, reduction_hoist_bytes=0, chunk_bytes=-1,
               max_chunk_steps=1)
