"""The workspace plan (``schedule.memory``): lifetimes read off the program's records, buffers with disjoint
lifetimes share a slot, never two that are live in the same step."""

from __future__ import annotations

import numpy as np

import nnforge as nf
from nnforge.codegen.c import prepare
from nnforge.codegen.c.target import cpu_target
from nnforge.schedule import Loop, schedule
from nnforge.schedule.memory import lifetimes, plan


def test_disjoint_lifetimes_share_a_slot_overlapping_never() -> None:
    lives = [(0, 1), (2, 2), (1, 3), (3, 3)]
    sizes = [400, 800, "(S[0] * 4)", "400"]
    slots, where = plan(lives, sizes)
    for i in range(len(lives)):
        for j in range(i + 1, len(lives)):
            (f1, l1), (f2, l2) = lives[i], lives[j]
            if not (l1 < f2 or l2 < f1):
                assert where[i] != where[j], (i, j)
    assert where[0] == where[1] == where[3]  # 0 (steps 0-1), 1 (step 2), 3 (step 3)
    assert slots[where[0]].members() == (800, [])  # the largest member; "400" counts as a number
    assert len(slots) == 2


def test_run_time_sizes_take_the_maximum() -> None:
    slots, where = plan([(0, 0), (1, 1)], ["(S[0] * 4)", 64])
    assert where == [0, 0] and slots[0].members() == (64, ["(S[0] * 4)"])


def test_a_value_lives_until_its_last_reader(rng: np.random.Generator) -> None:
    """``a`` is read by the GEMM of step 1 and, through a view, by the elementwise kernel of step 3; ``b`` (the
    GEMM's result) by the reduction of step 2 only."""

    def fn(x, w):
        a = nf.tanh(x) * 2.0
        b = a @ w
        s = b.sum(0)
        return s, a.T * 3.0

    x, w = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    prog = schedule(prepare(nf.compile(fn).trace(x, w)), cpu_target())
    k = prog.block.kernels
    life = lifetimes(prog)
    assert [type(x).__name__ for x in k] == ["Elementwise", "Gemm", "Reduce", "Elementwise"]
    assert life[k[0].out.name] == (0, 3) and life[k[1].out.name] == (1, 2)
    assert k[2].out.name not in life and k[3].out.name not in life  # results of the graph: not workspace


def test_a_loop_result_lives_until_the_next_layer_reads_it(rng: np.random.Generator) -> None:
    def two_layers(x, h0, w1, w2):
        _, ys = nf.scan(lambda h, x_t: (nf.tanh(h @ w1 + x_t),) * 2, h0, x)
        h, _ = nf.scan(lambda h, x_t: (nf.tanh(h @ w2 + x_t),) * 2, h0, ys)
        return h

    args = [rng.standard_normal(s).astype(np.float32) for s in ((6, 3, 4), (3, 4), (4, 4), (4, 4))]
    prog = schedule(prepare(nf.compile(two_layers).trace(*args)), cpu_target())
    steps = prog.block.kernels
    first, second = (i for i, k in enumerate(steps) if isinstance(k, Loop))
    life = lifetimes(prog)
    ys = steps[first].results[1]
    assert ys.output is None and life[ys.name] == (first, second)
