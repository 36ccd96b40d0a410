"""Memory planning (``codegen.c.memplan``): buffers with disjoint lifetimes share workspace bytes, never two
that are live in the same part; results are unchanged and the workspace of a training step shrinks."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c.memplan import lifetimes, plan, slot_bytes_function

needs_cpu = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def test_lifetimes_match_whole_names_only() -> None:
    parts = [["b1[i] = x;"], ["b12[i] = b1[i];"], ["y = b12[0] + b3;"]]
    assert lifetimes(parts, ["b1", "b12", "b3", "b9"]) == {"b1": (0, 1), "b12": (1, 2), "b3": (2, 2),
                                                           "b9": (0, 3)}


def test_disjoint_lifetimes_share_a_slot_overlapping_never() -> None:
    parts = [["a = 1;"], ["a; c;"], ["b;"], ["c; d;"]]
    allocs = [("a", "float", "400"), ("b", "float", "800"), ("c", "float", "(S[0] * 4)"), ("d", "float", "400")]
    slots, where = plan(parts, allocs)
    life = lifetimes(parts, [a[0] for a in allocs])
    for i in range(len(allocs)):
        for j in range(i + 1, len(allocs)):
            (f1, l1), (f2, l2) = life[allocs[i][0]], life[allocs[j][0]]
            if not (l1 < f2 or l2 < f1):
                assert where[i] != where[j], (allocs[i][0], allocs[j][0])
    assert where[0] == where[1]  # a (parts 0-1) and b (part 2)
    assert slots[where[0]].members() == (800, [])  # the larger member
    assert len(slots) == 2 and where[3] == where[0]  # {a, b, d} and {c}: d overlaps only c


def test_run_time_sizes_take_the_maximum() -> None:
    slots, where = plan([["a;"], ["b;"]], [("a", "float", "(S[0] * 4)"), ("b", "float", "64")])
    assert where == [0, 0] and slots[0].members() == (64, ["(S[0] * 4)"])
    assert "    b[0] = nf_max64(64, z0);" in slot_bytes_function(slots)


def test_each_run_time_size_is_computed_once_and_the_text_stays_linear() -> None:
    """Slot sizes grow by one term per member: a member repeated in a slot or across slots is one local."""
    sizes = [f"(S[0] * {k % 5 + 1})" for k in range(40)]
    parts = [[f"a{k};"] for k in range(40)]
    slots, _ = plan(parts, [(f"a{k}", "float", s) for k, s in enumerate(sizes)])
    text = "\n".join(slot_bytes_function(slots))
    assert len(slots) == 1 and text.count("const int64_t z") == 5
    assert text.count("nf_max64") == 4 and len(text) < 600


@needs_cpu
def test_training_step_workspace_shrinks_and_results_match(rng: np.random.Generator) -> None:
    from test_scan import lstm

    from nnforge.codegen.c import CpuBackend, GemmConfig

    def lstm_loss(*args):
        ys, h, c = lstm(*args)
        return (ys * ys).mean() + (h * c).sum()

    T, N, I, H = 7, 5, 6, 8
    args = [(rng.standard_normal(s) * 0.5).astype(np.float32)
            for s in [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]]
    grad = nf.grad(lstm_loss, argnums=tuple(range(6)))
    graph = nf.compile(grad).trace(*args)
    shared = CpuBackend(gemm=GemmConfig(share_buffers=True))(graph)
    separate = CpuBackend(gemm=GemmConfig(share_buffers=False))(graph)
    (sym,) = shared.sizes.dynamic
    for t in (T, 100, 2000):  # 16 % less here: most [T, N, H] values of a step are live until the backward scan
        assert shared.workspace_bytes({sym: t}) < 0.9 * separate.workspace_bytes({sym: t}), t
    want = nf.compile(grad)(*args)
    for got in (shared(args), separate(args)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
