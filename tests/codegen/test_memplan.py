"""The workspace plan in C (``schedule.memory`` plans, ``codegen.c.memplan`` prints): slot sizes stay linear in
the number of buffers, the lifetimes the records give cover every top-level function that names a buffer, and the
workspace of a training step shrinks with results unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c.emit import Emitter
from nnforge.codegen.c.memplan import slot_bytes_function
from nnforge.schedule.memory import plan

needs_cpu = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def test_run_time_sizes_take_the_maximum() -> None:
    slots, where = plan([(0, 0), (1, 1)], ["(S[0] * 4)", "64"])
    assert where == [0, 0] and slots[0].members() == (64, ["(S[0] * 4)"])
    assert "    b[0] = nf_max64(64, z0);" in slot_bytes_function(slots)


def test_each_run_time_size_is_computed_once_and_the_text_stays_linear() -> None:
    """Slot sizes grow by one term per member: a member repeated in a slot or across slots is one local."""
    sizes = [f"(S[0] * {k % 5 + 1})" for k in range(40)]
    slots, _ = plan([(k, k) for k in range(40)], sizes)
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
    for t in (T, 100, 2000):  # 8-10 % less here: most [T, N, H] values of a step are live until the backward scan
        assert shared.workspace_bytes({sym: t}) < 0.95 * separate.workspace_bytes({sym: t}), t
    want = nf.compile(grad)(*args)
    for got in (shared(args), separate(args)):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


@needs_cpu
@pytest.mark.parametrize("train", [False, True])
def test_record_lifetimes_cover_every_function_naming_the_buffer(rng: np.random.Generator, train: bool) -> None:
    """Independent of the records: in the generated C, each top-level function (a step) that names a workspace
    buffer lies inside the lifetime the plan used for it, so no two buffers sharing bytes are ever both in use."""
    import re

    from test_gemm import ln_lstm

    from nnforge.codegen.c import lower, prepare

    def loss(*args):
        ys, h, c = ln_lstm(*args)
        return (ys * ys).mean() + (h * c).sum()

    T, N, I, H = 5, 12, 6, 8
    args = [(rng.standard_normal(s) * 0.5).astype(np.float32)
            for s in [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]]
    fn = nf.grad(loss, argnums=tuple(range(6))) if train else ln_lstm
    low = lower(prepare(nf.compile(fn).trace(*args)))
    em = Emitter(low.names)  # the top-level code once more, to cut it where the C is cut into functions
    low.marks.clear()
    low.lower_block(low.program.block, [f"in{k}" for k in range(len(args))],
                    [f"out{k}" for k in range(len(low.graph.outputs))], em, [])
    code = em.lines
    life = {name: span for (name, _, _), span in zip(low.allocs, low.lives)}
    parts = [code[a:b] for a, b in zip([0, *low.marks], [*low.marks, len(code)])]
    checked = set()
    for step, part in enumerate(parts):
        for tok in set(re.findall(r"\b[A-Za-z_][A-Za-z_0-9]*\b", "\n".join(part))) & life.keys():
            first, last = life[tok]
            assert first <= step <= last, (tok, step, (first, last))
            checked.add(tok)
    assert len(checked) > 10  # the check saw many buffers
