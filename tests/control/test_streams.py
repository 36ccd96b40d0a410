"""Feeders called ahead on a thread, Receivers delivered behind in order (nnforge/codegen/streams.py).

Every test is deterministic: threads are made to meet through events and conditions (each wait has a generous
timeout that only turns a hang into a failure), never through sleeps or wall-clock measurements. Compiled tests
run on every backend; graphs with Feeders run on the reference interpreter under each of them.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import nnforge as nf

N, STEPS, LR = 16, 12, 0.05
WAIT = 60.0  # seconds before a wait that should succeed at once counts as a hang


def _batches(rng: np.random.Generator, count: int) -> tuple[np.ndarray, list[np.ndarray]]:
    true_w = rng.standard_normal((4, 1)).astype(np.float32)
    out = []
    for _ in range(count):
        x = rng.standard_normal((N, 4)).astype(np.float32)
        out.append(np.concatenate([x, x @ true_w + 0.1 * rng.standard_normal((N, 1)).astype(np.float32)], 1))
    return rng.standard_normal((4, 1)).astype(np.float32), out


def _train(backend: str, w0: np.ndarray, feed: Callable[[], Any], receive: Callable[[np.ndarray], None],
           steps: int = STEPS, prefetch: int = 2, pending: int = 2) -> np.ndarray:
    """SGD on a linear regression, as one compiled nf.loop fed by ``feed`` and reporting each loss to ``receive``."""

    def train(w):
        w = w * 1

        def step():
            d = nf.Feeder(feed, shape=[N, 5], name="batches", prefetch=prefetch)
            loss, g = nf.value_and_grad(lambda v: ((d[:, :4] @ v - d[:, 4:]) ** 2).mean())(w)
            w.assign(w - LR * g)
            nf.Receiver(receive, [loss], name="losses", pending=pending)

        nf.loop(steps, step)
        return w

    return nf.compile(train, backend=backend)(w0)


def _torch_sgd(w0: np.ndarray, batches: list[np.ndarray]) -> tuple[list[float], np.ndarray]:
    tw = torch.tensor(w0, requires_grad=True)
    losses = []
    for b in batches:
        bt = torch.from_numpy(b)
        loss = ((bt[:, :4] @ tw - bt[:, 4:]) ** 2).mean()
        losses.append(loss.item())
        (g,) = torch.autograd.grad(loss, tw)
        with torch.no_grad():
            tw -= LR * g
    return losses, tw.detach().numpy()


def _no_stream_threads() -> bool:
    return not any(t.name.startswith("nnforge-") for t in threading.enumerate())


def _notes(e: BaseException) -> str:
    return "\n".join(getattr(e, "__notes__", []))


@pytest.mark.parametrize(("prefetch", "pending"), [(2, 2), (1, 1), (5, 3), (0, 0), (2, 0), (0, 2)])
def test_streamed_training_matches_the_synchronous_run_and_torch(backend: str, rng: np.random.Generator,
                                                                 prefetch: int, pending: int):
    w0, batches = _batches(rng, STEPS + 3)
    results = {}
    for p, q in ((prefetch, pending), (0, 0)):
        it = iter(batches)
        losses: list[float] = []
        w = _train(backend, w0, lambda it=it: next(it), lambda v, out=losses: out.append(float(v)), prefetch=p,
                   pending=q)
        assert next(it) is batches[STEPS]  # exactly STEPS calls: the next batch was not popped
        results[p, q] = w, losses
    (w, losses), (w_sync, losses_sync) = results[prefetch, pending], results[0, 0]
    assert losses == losses_sync  # bit for bit: the same arrays in the same order
    np.testing.assert_array_equal(w, w_sync)
    ref_losses, ref_w = _torch_sgd(w0, batches[:STEPS])
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w, ref_w, rtol=1e-4, atol=1e-6)
    assert _no_stream_threads()


def test_feeder_runs_ahead_on_its_own_thread(backend: str, rng: np.random.Generator):
    """Step 0's Receiver (on the loop's thread: pending=0) waits for the Feeder's second call: only a Feeder running
    ahead on another thread can make it while step 0 is still running."""
    w0, batches = _batches(rng, STEPS)
    started = [threading.Event() for _ in batches]
    feeder_threads: list[int] = []
    receiver_threads: list[int] = []
    ahead: list[bool] = []

    def feed():
        k = len(feeder_threads)
        feeder_threads.append(threading.get_ident())
        started[k].set()
        return batches[k]

    def receive(loss):
        k = len(receiver_threads)
        receiver_threads.append(threading.get_ident())
        if k + 1 < STEPS and all(ahead):  # one miss is enough: do not wait again
            ahead.append(started[k + 1].wait(WAIT))

    _train(backend, w0, feed, receive, prefetch=1, pending=0)
    assert ahead == [True] * (STEPS - 1)
    main = threading.get_ident()
    assert len(feeder_threads) == STEPS and main not in feeder_threads
    assert set(receiver_threads) == {main}


def test_receivers_deliver_copies_in_order_on_another_thread(rng: np.random.Generator):
    """Two Receivers in one body: one delivery thread keeps their interleaving; each value is a copy."""
    acc = nf.tensor(rng.standard_normal(3).astype(np.float32))
    start = acc.numpy().copy()
    log: list[tuple[str, int, np.ndarray]] = []
    threads: set[int] = set()

    def receiver(tag):
        def fn(i, a):
            threads.add(threading.get_ident())
            log.append((tag, int(i), a))
        return fn

    def body(i):
        nf.Receiver(receiver("before"), [i, acc])
        acc.assign(acc + i.cast(nf.float32))
        nf.Receiver(receiver("after"), [i, acc])

    nf.loop(6, body)
    nf.execute()
    assert [(t, i) for t, i, _ in log] == [(t, i) for i in range(6) for t in ("before", "after")]
    total = start.copy()
    for tag, i, a in log:
        if tag == "after":
            total = total + i
        np.testing.assert_allclose(a, total, rtol=1e-6)
    assert threading.get_ident() not in threads and len(threads) == 1
    assert _no_stream_threads()


def _two_feeders(data: np.ndarray, prefetch: int) -> tuple[list[tuple[str, int]], np.ndarray]:
    """A loop whose second Feeder returns the row number its first Feeder just set; (calls, received values)."""
    calls: list[tuple[str, int]] = []
    state = {"row": -1}
    busy = threading.Lock()
    got: list[np.ndarray] = []

    def guarded(fn: Callable[[], np.ndarray]) -> Callable[[], np.ndarray]:
        def call() -> np.ndarray:
            assert busy.acquire(blocking=False), "two Feeder calls at once"
            try:
                return fn()
            finally:
                busy.release()
        return call

    def first() -> np.ndarray:
        state["row"] += 1
        calls.append(("x", state["row"]))
        return data[state["row"]]

    def second() -> np.ndarray:
        calls.append(("y", state["row"]))
        return np.full(3, state["row"], np.float32)

    def step():
        x = nf.Feeder(guarded(first), shape=[3], prefetch=prefetch)
        y = nf.Feeder(guarded(second), shape=[3], prefetch=prefetch)
        nf.Receiver(got.append, [x * 10 + y])

    nf.loop(len(data), step)
    nf.execute()
    return calls, np.stack(got)


def test_feeders_are_called_in_the_body_order_never_concurrently(rng: np.random.Generator):
    """Two Feeders, the second reading what the first set: one thread calls them as a synchronous run does."""
    data = rng.standard_normal((STEPS, 3)).astype(np.float32)
    calls, got = _two_feeders(data, prefetch=3)
    sync_calls, sync_got = _two_feeders(data, prefetch=0)
    assert calls == sync_calls == [(f, k) for k in range(STEPS) for f in ("x", "y")]
    np.testing.assert_array_equal(got, sync_got)
    np.testing.assert_array_equal(got, data * 10 + np.arange(STEPS, dtype=np.float32)[:, None])


def test_a_feeder_refilling_one_buffer_is_copied_before_it_waits(rng: np.random.Generator):
    data = rng.standard_normal((STEPS, 4)).astype(np.float32)
    buffer = np.empty(4, np.float32)
    count = iter(range(STEPS))
    got: list[np.ndarray] = []

    def refill():
        buffer[:] = data[next(count)]
        return buffer

    nf.loop(STEPS, lambda: nf.Receiver(got.append, [nf.Feeder(refill, shape=[4], prefetch=4) * 1]))
    nf.execute()
    np.testing.assert_array_equal(np.stack(got), data)


@pytest.mark.parametrize("k", [0, 3, STEPS - 1])
def test_feeder_error_at_batch_k_propagates_after_the_steps_before(backend: str, rng: np.random.Generator, k: int):
    w0, batches = _batches(rng, STEPS)
    sync_losses: list[float] = []
    _train(backend, w0, iter(batches).__next__, lambda v: sync_losses.append(float(v)), prefetch=0, pending=0)
    calls = []
    losses: list[float] = []

    def feed():
        calls.append(len(calls))
        if len(calls) == k + 1:
            raise ValueError(f"unreadable batch {k}")
        return batches[len(calls) - 1]

    with pytest.raises(ValueError, match=f"unreadable batch {k}") as info:
        _train(backend, w0, feed, lambda v: losses.append(float(v)), prefetch=2, pending=2)
    assert calls == list(range(k + 1))  # the thread stopped at the failed call
    assert losses == sync_losses[:k]  # every step before the error delivered, none twice
    assert "Feeder 'batches'" in _notes(info.value) and "test_streams.py:" in _notes(info.value)
    assert _no_stream_threads()


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_exhausted_iterator_stops_the_loop_with_its_stop_iteration(backend: str, rng: np.random.Generator,
                                                                      prefetch: int):
    """A Feeder popping a finite source raises StopIteration when it runs out: the caller gets that exception with
    its note on every backend (a compiled step once called Feeders inside a generator, which turned it into
    ``RuntimeError: generator raised StopIteration``)."""
    w0, batches = _batches(rng, STEPS)
    losses: list[float] = []
    with pytest.raises(StopIteration) as info:
        _train(backend, w0, iter(batches[:5]).__next__, lambda v: losses.append(float(v)), prefetch=prefetch,
               pending=0)
    assert len(losses) == 5 and "Feeder 'batches'" in _notes(info.value)
    assert _no_stream_threads()


@pytest.mark.parametrize("k", [0, 4, STEPS - 1])
def test_receiver_error_at_batch_k_propagates_and_delivers_nothing_after(backend: str, rng: np.random.Generator,
                                                                         k: int):
    w0, batches = _batches(rng, STEPS)
    sync_losses: list[float] = []
    _train(backend, w0, iter(batches).__next__, lambda v: sync_losses.append(float(v)), prefetch=0, pending=0)
    delivered: list[float] = []
    calls = []
    fed = []

    def receive(v):
        calls.append(float(v))
        if len(calls) == k + 1:
            raise KeyError(f"disk full at {k}")
        delivered.append(float(v))

    def feed():
        fed.append(1)
        return batches[len(fed) - 1]

    with pytest.raises(KeyError, match=f"disk full at {k}") as info:
        _train(backend, w0, feed, receive, prefetch=2, pending=2)
    assert delivered == sync_losses[:k] and calls == sync_losses[:k + 1]
    assert len(fed) <= STEPS
    assert "Receiver 'losses'" in _notes(info.value) and "test_streams.py:" in _notes(info.value)
    assert _no_stream_threads()


@pytest.mark.parametrize(("prefetch", "pending"), [(2, 2), (1, 3), (3, 1)])
def test_a_slow_receiver_holds_the_loop_back(rng: np.random.Generator, prefetch: int, pending: int):
    """Delivery k waits until the Feeder has made every call the bounds allow, then lets go. At each Feeder call,
    calls made - deliveries done <= prefetch + pending + 1: the batch in use, ``prefetch`` made ahead, the
    ``pending`` undelivered losses of the steps before. More would mean an unbounded queue."""
    data = rng.standard_normal((STEPS, 2)).astype(np.float32)
    done = threading.Condition()
    counts = {"calls": 0, "delivered": 0}
    excess: list[int] = []
    reached: list[bool] = []
    bound = prefetch + pending + 1

    def feed():
        with done:
            counts["calls"] += 1
            excess.append(counts["calls"] - counts["delivered"])
            done.notify_all()
            return data[counts["calls"] - 1]

    def receive(v):
        with done:
            target = min(STEPS, counts["delivered"] + bound)
            reached.append(all(reached) and done.wait_for(lambda: counts["calls"] >= target, WAIT))
            counts["delivered"] += 1

    nf.loop(STEPS, lambda: nf.Receiver(receive, [nf.Feeder(feed, shape=[2], prefetch=prefetch).sum()],
                                       pending=pending))
    nf.execute()
    assert reached == [True] * STEPS
    assert max(excess) == bound and counts["calls"] == STEPS


@pytest.mark.parametrize(("returned", "dtype", "message"), [
    (np.ones(3, np.float32), nf.float32, r"Feeder 'bad_feed'.*expected shape \[2\].*\[3\]"),
    (np.ones(2, np.float64), nf.float32, None),  # same kind: cast, no error
    (np.ones(2, np.float32), nf.int32, r"Feeder 'bad_feed'.*expected nf\.int32, its function returned float32"),
    (np.ones(2, np.complex64), nf.float32, r"Feeder 'bad_feed'.*no dtype for numpy complex64"),
    (None, nf.float32, r"Feeder 'bad_feed'.*expected shape \[2\], its function returned None$"),
])
def test_feeder_validation_on_the_prefetch_thread_keeps_its_message(backend: str, returned: np.ndarray,
                                                                     dtype: Any, message: str | None):
    def f(x):
        x = x * 1
        nf.loop(3, lambda: x.assign(x + nf.Feeder(lambda: returned, shape=[2], dtype=dtype, name="bad_feed")
                                    .cast(nf.float32)))
        return x

    g = nf.compile(f, backend=backend)
    if message is None:
        np.testing.assert_array_equal(g(np.zeros(2, np.float32)), np.full(2, 3, np.float32))
    else:
        with pytest.raises(nf.NNForgeError, match=message):
            g(np.zeros(2, np.float32))
    assert _no_stream_threads()


@pytest.mark.parametrize("where", ["feeder", "receiver", "loop"])
def test_a_keyboard_interrupt_leaves_no_thread_behind(rng: np.random.Generator, where: str):
    """An interrupt raised in a Feeder's call, a Receiver's call or on the loop's own thread (a pending=0 Receiver
    in a loop that also prefetches) stops the loop with KeyboardInterrupt, and both threads are joined."""
    data = rng.standard_normal((STEPS, 2)).astype(np.float32)
    fed = iter(range(STEPS))
    seen: list[int] = []

    def feed():
        i = next(fed)
        if where == "feeder" and i == 5:
            raise KeyboardInterrupt
        return data[i]

    def receive(i, v):
        if int(i) == 5 and where != "feeder":
            raise KeyboardInterrupt
        seen.append(int(i))

    pending = 0 if where == "loop" else 2
    nf.loop(STEPS, lambda i: nf.Receiver(receive, [i, nf.Feeder(feed, shape=[2]) * 2], pending=pending))
    with pytest.raises(KeyboardInterrupt):
        nf.execute()
    assert seen == list(range(len(seen))) and len(seen) <= 5
    assert _no_stream_threads()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread()
                    or signal.getsignal(signal.SIGINT) is not signal.default_int_handler,
                    reason="needs Python's own Ctrl-C handler on the main thread")
def test_ctrl_c_leaves_no_thread_behind(rng: np.random.Generator):
    """A real SIGINT (sent by a Feeder call, so it lands while the loop runs or waits for a batch)."""
    data = rng.standard_normal((200, 2)).astype(np.float32)
    fed = iter(range(200))
    seen: list[np.ndarray] = []

    def feed():
        i = next(fed)
        if i == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return data[i]

    nf.loop(200, lambda: nf.Receiver(seen.append, [nf.Feeder(feed, shape=[2]) * 2]))
    with pytest.raises(KeyboardInterrupt):
        nf.execute()
    for t in threading.enumerate():  # joined already, unless the interrupt landed in the join itself
        if t.name.startswith("nnforge-"):
            t.join(WAIT)
    assert _no_stream_threads() and len(seen) < 200
    np.testing.assert_array_equal(np.reshape(seen, (-1, 2)), data[:len(seen)] * 2)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_depths_must_be_non_negative_ints(bad: Any):
    with pytest.raises(nf.TraceError, match="prefetch must be a non-negative int"):
        nf.Feeder(lambda: np.ones(2), shape=[2], prefetch=bad)
    with pytest.raises(nf.TraceError, match="pending must be a non-negative int"):
        nf.Receiver(print, [nf.zeros(2)], pending=bad)
