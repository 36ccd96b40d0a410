"""nf.loop under a compiled backend. One that calls no Python is compiled as a loop of its own (``passes.dce.
pure_loops``); one that calls Feeders and Receivers runs its body as the backend's step program, one call per
iteration (nnforge/codegen/streamed.py). Checked against the reference interpreter per element, on every backend,
with the loop index, several Feeders and Receivers, loop constants and random draws; and that the loop or step
really is compiled where it can be and interpreted where its streams sit deeper."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen import build_program
from nnforge.codegen.reference import ReferenceProgram
from nnforge.codegen.streamed import StreamedProgram, streamed_loops
from nnforge.ir.ops import Op
from nnforge.passes.dce import pure_loops
from nnforge.runtime.program import CompiledProgram

STEPS = 7


def _model(rng: np.random.Generator):
    """A compiled function of (w, table): an SGD loop on a feature Feeder and an int32 label Feeder, the loop index
    read by the body, a captured table (a loop constant), a 0-d state (the losses' running sum), two Receivers (one
    of two values); the Feeders' inputs and everything delivered are recorded."""
    feats = [rng.standard_normal((6, 4)).astype(np.float32) for _ in range(STEPS)]
    labels = [rng.integers(0, 3, size=(6,)).astype(np.int32) for _ in range(STEPS)]
    got: dict[str, list] = {"loss": [], "pair": []}

    def fn(w, table):
        w = w * 1
        total = (w * 0).sum()
        it_x, it_y = iter(feats), iter(labels)

        def body(i):
            x = nf.Feeder(lambda: next(it_x), shape=[6, 4], name="x")
            y = nf.Feeder(lambda: next(it_y), shape=[6], dtype=nf.int32, name="y")
            target = nf.index_select(table, 0, y) * (1.0 + 0.1 * i.cast(nf.float32))
            loss, g = nf.value_and_grad(lambda v: ((nf.tanh(x @ v) - target) ** 2).mean())(w)
            w.assign(w - 0.3 * g)
            total.assign(total + loss)
            nf.Receiver(lambda v: got["loss"].append(float(v)), [loss], name="loss")
            nf.Receiver(lambda a, b: got["pair"].append((a, b)), [g, i], name="pair")

        nf.loop(STEPS, body)
        return w, total

    return fn, got


def _args(rng: np.random.Generator) -> list[np.ndarray]:
    return [(rng.standard_normal((4, 2)) * 0.5).astype(np.float32), rng.standard_normal((3, 2)).astype(np.float32)]


def test_a_streamed_loop_matches_the_interpreter(backend: str, rng: np.random.Generator):
    seed = int(rng.integers(1 << 31))
    results = {}
    for b in ("reference", backend):
        r = np.random.default_rng(seed)
        fn, got = _model(r)
        w, total = nf.compile(fn, backend=b)(*_args(r))
        results[b] = (w, total, got)
    (w_ref, total_ref, ref), (w, total, got) = results["reference"], results[backend]
    np.testing.assert_allclose(w, w_ref, rtol=1e-5, atol=1e-6)
    assert total.shape == () and abs(float(total) - float(total_ref)) < 1e-5 * abs(float(total_ref))
    np.testing.assert_allclose(got["loss"], ref["loss"], rtol=1e-5, atol=1e-6)
    assert len(got["pair"]) == STEPS
    for (g, i), (g_ref, i_ref) in zip(got["pair"], ref["pair"]):
        np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-6)
        assert i.dtype == np.int64 and int(i) == int(i_ref)
    assert [int(i) for _, i in got["pair"]] == list(range(STEPS))


def test_the_step_is_compiled_once_and_called_per_iteration(backend: str, rng: np.random.Generator,
                                                            caplog: pytest.LogCaptureFixture):
    fn, _ = _model(rng)
    graph = nf.compile(fn).trace(*_args(rng))
    (loop,) = streamed_loops(graph)
    with caplog.at_level(logging.INFO, logger="nnforge.codegen"):
        program = build_program(backend, graph)
    if backend == "reference":
        assert isinstance(program, ReferenceProgram)
        return
    assert isinstance(program, StreamedProgram)
    step = program.steps[id(loop)]
    assert isinstance(step.program, CompiledProgram)  # generated code, not the interpreter
    assert [f.attrs["name"] for f in step.feeders] == ["x", "y"]
    assert [(r.attrs["name"], m) for r, m in step.receivers] == [("loss", 1), ("pair", 2)]
    assert any("runs its step as compiled code" in r.getMessage() for r in caplog.records)


def test_streams_nested_deeper_keep_the_loop_interpreted(backend: str, rng: np.random.Generator):
    """A Feeder in an inner nf.loop: the outer loop is not a compiled step (the interpreter runs both, with their
    threads), and the values are right."""
    batches = [rng.standard_normal(3).astype(np.float32) for _ in range(6)]
    feed = iter(batches)

    def fn(x):
        x = x * 1

        def outer():
            nf.loop(2, lambda: x.assign(x + nf.Feeder(lambda: next(feed), shape=[3], name="inner")))
            x.assign(x * 0.5)

        nf.loop(3, outer)
        return x

    x0 = rng.standard_normal(3).astype(np.float32)
    f = nf.compile(fn, backend=backend)
    assert not streamed_loops(f.trace(x0))
    want = x0.copy()
    for k in range(3):
        want = (want + batches[2 * k] + batches[2 * k + 1]) * 0.5
    np.testing.assert_allclose(f(x0), want, rtol=1e-6)


def test_random_draws_in_a_compiled_step_are_fresh_each_iteration(backend: str):
    """Each call of the step draws anew (the C program's seed comes from the session's generator per call), and
    nf.manual_seed repeats the run."""

    def run() -> list[np.ndarray]:
        seen: list[np.ndarray] = []

        def fn(x):
            x = x * 1

            def body():
                noise = nf.rand([64])
                x.assign(x + noise)
                nf.Receiver(lambda v: seen.append(v), [noise])

            nf.loop(4, body)
            return x

        nf.manual_seed(1234)
        out = nf.compile(fn, backend=backend)(np.zeros(64, np.float32))
        np.testing.assert_allclose(out, sum(seen), rtol=1e-5)
        return seen

    first, again = run(), run()
    assert all(((v >= 0) & (v < 1)).all() for v in first)
    assert all(not np.array_equal(first[k], first[k + 1]) for k in range(3))
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_a_step_the_backend_cannot_compile_still_runs(backend: str, rng: np.random.Generator):
    """A float16 step has no C spelling: the CPU backend interprets it (with its warning) and the loop is right."""
    feed = iter([rng.standard_normal(5).astype(np.float16) for _ in range(3)])
    batches: list[np.ndarray] = []

    def take() -> np.ndarray:
        batches.append(next(feed))
        return batches[-1]

    def fn(x):
        x = x * 1
        nf.loop(3, lambda: x.assign(x + nf.Feeder(take, shape=[5], dtype=nf.float16, name="half")))
        return x

    x0 = rng.standard_normal(5).astype(np.float16)
    out = nf.compile(fn, backend=backend)(x0)
    want = x0
    for b in batches:
        want = (want + b).astype(np.float16)
    np.testing.assert_array_equal(out, want)


def test_a_loop_that_calls_no_python_is_compiled_as_a_loop(backend: str, rng: np.random.Generator,
                                                          caplog: pytest.LogCaptureFixture):
    """Five SGD steps over a captured dataset indexed by the loop counter, no Feeder or Receiver: on the CPU the
    whole function is one C program (a loop in it), not the interpreter; every backend agrees with the
    reference."""
    data = rng.standard_normal((5, 8, 4)).astype(np.float32)
    target = rng.standard_normal((5, 8, 1)).astype(np.float32)

    def fn(w):
        w = w * 1

        def body(i):
            x = nf.index_select(data, 0, i.reshape(1)).reshape(8, 4)
            y = nf.index_select(target, 0, i.reshape(1)).reshape(8, 1)
            g = nf.grad(lambda v: ((nf.tanh(x @ v) - y) ** 2).mean())(w)
            w.assign(w - 0.5 * g)

        nf.loop(5, body)
        return w

    w0 = (rng.standard_normal((4, 1)) * 0.5).astype(np.float32)
    f = nf.compile(fn, backend=backend)
    with caplog.at_level(logging.WARNING):
        got = f(w0)
    np.testing.assert_allclose(got, nf.compile(fn)(w0), rtol=1e-5, atol=1e-6)
    graph = f.trace(w0)
    assert [e.op for e in graph.effects] == [Op.LOOP] and not pure_loops(graph).effects
    if backend == "cpu":
        assert isinstance(build_program("cpu", graph), CompiledProgram)
        assert not [r for r in caplog.records if "reference interpreter" in r.getMessage()]


def test_loops_that_call_python_stay_effects(rng: np.random.Generator):
    """A Receiver in the body, or a Feeder in a scan nested in it, keeps the loop an effect."""
    feed = iter([np.ones(2, np.float32)] * 4)

    def with_receiver(x):
        x = x * 1
        nf.loop(2, lambda: (x.assign(x + 1), nf.Receiver(lambda v: None, [x])))
        return x

    def with_nested_feeder(x):
        x = x * 1

        def body():
            _, ys = nf.scan(lambda c, t: (c, c + nf.Feeder(lambda: next(feed), shape=[2])), x, nf.zeros([2, 2]))
            x.assign(ys.sum(0))

        nf.loop(2, body)
        return x

    for fn in (with_receiver, with_nested_feeder):
        graph = nf.compile(fn).trace(np.zeros(2, np.float32))
        assert pure_loops(graph) is graph and graph.effects


def test_a_negative_or_non_integer_count_is_refused_at_the_call(backend: str, rng: np.random.Generator) -> None:
    """``nf.loop(n, body)`` with ``n < 0`` would run zero times, as ``range`` does, hiding the bug that computed
    the count: it is an error naming the call's line, eagerly and compiled; so is a count that is no int."""
    x = nf.tensor(rng.standard_normal(3).astype(np.float32))
    for n in (-1, np.int64(-3)):
        with pytest.raises(ValueError, match=r"loop: n must be a count of iterations, 0 or more, got -\d \(at "
                                             r".*test_compiled_loops\.py:\d+"):
            nf.loop(n, lambda: x.assign(x + 1))
    for n in (2.0, True):
        with pytest.raises(nf.TraceError, match=r"loop: n must be an int .*got (float 2\.0|bool True)"):
            nf.loop(n, lambda: x.assign(x + 1))
    f = nf.compile(lambda v, k: nf.loop(k - 5, lambda: v.assign(v + 1)) or v, backend=backend)
    with pytest.raises(ValueError, match="got -2"):
        f(rng.standard_normal(3).astype(np.float32), 3)
    nf.loop(0, lambda: x.assign(x + 1))
    nf.execute()
