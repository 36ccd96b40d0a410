"""A streamed loop's transfers on a GPU (``runtime.staging.CudaStaging``), proved on a stand-in for torch.cuda
whose streams run late (``fake_cuda``): the loop's step — the real C program — runs on the fake compute stream,
batches are copied on a copy stream from pinned memory, Receiver values copied back into pinned memory and waited
for on the delivery thread. Every value must equal a run of the same program with plain host copies, bit for bit:
a copy ordered wrongly against the step reads memory still NaN. The same for the synchronous paths
(``prefetch=0`` / ``pending=0``), a Feeder that raises (every earlier value delivered, none after, no batch
skipped or taken twice) and a slow Receiver (the loop runs at most ``pending`` steps ahead of it).

What the fake cannot show, a GPU test does (``test_a_streamed_loop_copies_on_its_own_stream``)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
from fake_cuda import FakeDeviceProgram, FakeTorch

import nnforge as nf
from nnforge.codegen import build_program
from nnforge.codegen.streamed import StreamedProgram, streamed_loops
from nnforge.codegen.triton import interpreted
from nnforge.runtime.staging import CudaStaging, HostStaging, TensorStaging, staging_for
from nnforge.runtime.timeline import copy_overlap

STEPS = 9


def _loop(rng: np.random.Generator, prefetch: int, pending: int, fail_at: int | None = None,
          on_loss: Callable[[], None] = lambda: None):
    """An SGD loop with the index read by the body, a float and an int32 Feeder, a captured table, and two
    Receivers (one of two values); what the Feeders made and the Receivers got is recorded."""
    feats = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(STEPS)]
    labels = [rng.integers(0, 4, size=(5,)).astype(np.int32) for _ in range(STEPS)]
    log: dict[str, list] = {"made": [], "loss": [], "pair": []}
    calls = {"x": 0}

    def feed_x() -> np.ndarray:
        k = calls["x"]
        calls["x"] += 1
        if k == fail_at:
            raise RuntimeError(f"chunk {k} unreadable")
        log["made"].append(k)
        return feats[k]

    it_y = iter(labels)

    def fn(w, table):
        w = w * 1

        def body(i):
            x = nf.Feeder(feed_x, shape=[5, 3], name="x", prefetch=prefetch)
            y = nf.Feeder(lambda: next(it_y), shape=[5], dtype=nf.int32, name="y", prefetch=prefetch)
            target = nf.index_select(table, 0, y) + 0.1 * i.cast(nf.float32)
            loss, g = nf.value_and_grad(lambda v: ((nf.tanh(x @ v) - target) ** 2).mean())(w)
            w.assign(w - 0.2 * g)

            def got_loss(v: np.ndarray) -> None:
                on_loss()
                log["loss"].append(v)

            nf.Receiver(got_loss, [loss], name="loss", pending=pending)
            nf.Receiver(lambda a, b: log["pair"].append((a, b)), [g, i], name="pair", pending=pending)

        nf.loop(STEPS, body)
        return w

    args = [(rng.standard_normal((3, 2)) * 0.5).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)]
    return fn, args, log


def _program(fn, args) -> StreamedProgram:
    graph = nf.compile(fn).trace(*args)
    program = build_program("cpu", graph)
    assert isinstance(program, StreamedProgram) and len(streamed_loops(graph)) == 1
    return program


def _on_fake_gpu(program: StreamedProgram, api: FakeTorch) -> dict:
    """Swap each compiled step's staging for CudaStaging on ``api``; the fake device programs, by loop."""
    fakes = {}
    for key, step in program.steps.items():
        fakes[key] = FakeDeviceProgram(step.program, api)
        program.steps[key] = dataclasses.replace(step, staging=lambda f=fakes[key]: CudaStaging(f, api=api))
    return fakes


def _delays(seed: int):
    r = np.random.default_rng(seed)
    lock = threading.Lock()

    def delay() -> float:
        with lock:
            return float(r.uniform(0, 2e-3))

    return delay


@pytest.mark.parametrize("prefetch,pending", [(2, 2), (1, 1), (0, 0), (3, 0)])
def test_cuda_staging_orders_copies_and_steps(prefetch: int, pending: int, rng: np.random.Generator):
    seed = int(rng.integers(1 << 31))
    fn, args, want = _loop(np.random.default_rng(seed), prefetch, pending)
    (w_want,) = _program(fn, args)(args)
    fn, args, got = _loop(np.random.default_rng(seed), prefetch, pending)
    program = _program(fn, args)
    api = FakeTorch(_delays(seed))
    try:
        fakes = _on_fake_gpu(program, api)
        (w,) = program(args)
    finally:
        api.cuda.close()
    assert not api.cuda.errors, api.cuda.errors
    assert [f.calls for f in fakes.values()] == [STEPS]
    np.testing.assert_array_equal(w, w_want)
    assert got["made"] == want["made"] == list(range(STEPS))
    assert len(got["loss"]) == len(got["pair"]) == STEPS
    np.testing.assert_array_equal(np.array(got["loss"]), np.array(want["loss"]))
    for (g, i), (g_want, i_want) in zip(got["pair"], want["pair"], strict=True):
        np.testing.assert_array_equal(g, g_want)
        assert i.dtype == np.int64 and int(i) == int(i_want)
    assert [int(i) for _, i in got["pair"]] == list(range(STEPS))
    # every batch crossed from pinned memory; its device memory was handed to the compute stream
    batches = [t for t in api.allocated if t.where == "device" and t.shape == (5, 3)]
    assert len(batches) == STEPS and all(t.recorded_on == [api.cuda.default] for t in batches)


@pytest.mark.parametrize("prefetch,pending", [(2, 2), (0, 0)])
def test_a_failing_feeder_stops_the_loop_after_delivering_the_steps_before(prefetch: int, pending: int,
                                                                           rng: np.random.Generator):
    fail_at = 5
    fn, args, got = _loop(rng, prefetch, pending, fail_at=fail_at)
    program = _program(fn, args)
    api = FakeTorch(_delays(int(rng.integers(1 << 31))))
    try:
        _on_fake_gpu(program, api)
        with pytest.raises(RuntimeError, match="chunk 5 unreadable") as caught:
            program(args)
    finally:
        api.cuda.close()
    assert not api.cuda.errors, api.cuda.errors
    assert any("Feeder 'x'" in note for note in getattr(caught.value, "__notes__", []))
    assert got["made"] == list(range(fail_at))
    assert [int(i) for _, i in got["pair"]] == list(range(fail_at))
    assert len(got["loss"]) == fail_at and all(np.isfinite(v).all() for v in got["loss"])


def test_a_slow_receiver_holds_the_loop_back(rng: np.random.Generator):
    """With ``pending=1`` a loss waits for its callback while the loop runs at most one step further (it blocks
    sending the next): when the k-th callback starts, at most k + 2 steps have been called."""
    calls: list[int] = []
    fakes: dict = {}

    def slow() -> None:
        (fake,) = fakes.values()
        calls.append(fake.calls)
        time.sleep(0.01)

    fn, args, got = _loop(rng, prefetch=2, pending=1, on_loss=slow)
    program = _program(fn, args)
    api = FakeTorch(lambda: 0.0)
    try:
        fakes.update(_on_fake_gpu(program, api))
        program(args)
    finally:
        api.cuda.close()
    assert len(got["loss"]) == STEPS
    assert all(c <= k + 2 for k, c in enumerate(calls)), calls
    assert calls[0] < STEPS  # the loop waited for the deliveries: it did not run to the end first


@pytest.mark.parametrize("pending", [2, 0])
def test_a_failed_copy_back_names_its_receiver(pending: int, rng: np.random.Generator):
    """A device error while waiting for a Receiver's values (threaded or not) stops the loop with that error,
    noted with the Receiver's name, as a callback's error is."""
    fn, args, got = _loop(rng, prefetch=2, pending=pending)
    program = _program(fn, args)
    api = FakeTorch(lambda: 0.0)

    class Broken(CudaStaging):
        def download(self, values):
            def wait():
                raise RuntimeError("an illegal memory access was encountered")
            return wait

    try:
        for key, step in program.steps.items():
            fake = FakeDeviceProgram(step.program, api)
            program.steps[key] = dataclasses.replace(step, staging=lambda f=fake: Broken(f, api=api))
        with pytest.raises(RuntimeError, match="illegal memory access") as caught:
            program(args)
    finally:
        api.cuda.close()
    assert any("Receiver 'loss'" in note for note in getattr(caught.value, "__notes__", []))
    assert got["loss"] == [] and got["pair"] == []


def test_each_program_gets_the_staging_of_where_it_runs():
    class Host:
        def __call__(self, inputs):
            return inputs

    class OnCpu(Host):
        device = "cpu"

        def call_tensors(self, tensors):
            return tensors

    assert type(staging_for(Host())) is HostStaging
    assert type(staging_for(OnCpu())) is TensorStaging


@pytest.mark.gpu
@pytest.mark.triton
@pytest.mark.skipif(not torch.cuda.is_available() or interpreted(), reason="needs a CUDA GPU (real kernel launches)")
def test_a_streamed_loop_copies_on_its_own_stream(rng: np.random.Generator, tmp_path):
    """On a GPU: the loop's values match the interpreter's, and its per-step copies (two batches up, three values
    down, per step; the step index is a launch argument, not a copy) ran on a stream no kernel ran on, as torch's
    profiler recorded them."""
    seed = int(rng.integers(1 << 31))
    fn, args, want = _loop(np.random.default_rng(seed), 2, 2)
    w_want = nf.compile(fn, backend="reference")(*args)
    fn, args, got = _loop(np.random.default_rng(seed), 2, 2)
    f = nf.compile(fn, backend="triton")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        w = f(*args)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    np.testing.assert_allclose(w, w_want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.array(got["loss"]), np.array(want["loss"]), rtol=1e-5, atol=1e-6)
    assert [int(i) for _, i in got["pair"]] == list(range(STEPS))
    o = copy_overlap(path)
    for direction, per_step in (("HtoD", 2), ("DtoH", 3)):
        c = o.copies[direction]
        assert c.streams - o.kernel_streams, (direction, c.streams, o.kernel_streams)
        assert c.count >= per_step * STEPS, (direction, c.count)
