"""Host threads for the Feeders and Receivers of an ``nf.loop``: batches made ahead, results delivered behind.

A training loop that calls ``next_batch()`` and ``log(loss)`` on its own thread waits for both on every step. The
trip count of ``nf.loop`` is known before it starts, so one thread can call the loop's Feeders ahead of use
(``prefetch`` calls each, default 2) while the step runs, and another can run its Receivers' callbacks behind the
loop (at most ``pending`` values each waiting, default 2), so host work overlaps the step instead of adding to it.

What stays exactly as in a synchronous run (``prefetch=0`` / ``pending=0``):

* each callback is called as often, with the same values, in the same order relative to the others of its kind:
  one thread calls a loop's Feeders in the order the body runs them, iteration after iteration, and makes exactly
  ``trips`` rounds, never one more (a Feeder popping a finite iterator loses nothing); one thread calls its
  Receivers in the order the loop sends to them;
* an exception from a callback propagates from the loop: the same object, with a note naming the node and the
  user's line; a Feeder's surfaces when the loop reaches the batch that failed, so every earlier step runs and
  every earlier value is delivered, and nothing after a failed delivery is;
* every delivery has happened when the loop returns, and no thread outlives the loop (a KeyboardInterrupt stops
  them too: queued deliveries are dropped, the threads joined; they are daemons, so the process can always exit).

What changes: a Feeder is called up to ``prefetch`` steps before its batch is used, so one that reads what a
Receiver saw (a curriculum) sees it late, and when the loop stops early the Feeders may have been called up to
``prefetch`` times more than the loop used. Only the Feeders and Receivers directly in a loop's body are threaded
(a nested ``nf.loop`` gets its own threads); the rest run synchronously on the interpreter's thread.

Nothing here is module state: each run of a loop makes its own threads and queues and joins them on exit.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import numpy as np

from ..dtypes import from_numpy
from ..errors import NNForgeError
from ..ir.node import Graph, Node
from ..ir.ops import Op

PREFETCH = 2  # nf.Feeder's default: batches made ahead of the one in use
PENDING = 2   # nf.Receiver's default: values sent and not yet delivered


def _name(node: Node, kind: str) -> str:
    return node.attrs.get("name") or getattr(node.attrs["fn"], "__qualname__", kind.lower())


def _note(e: BaseException, node: Node, kind: str) -> None:
    e.add_note(f"in {kind} {_name(node, kind)!r} (created at {node.loc})")


def fetch(node: Node, own: bool = False) -> np.ndarray:
    """Call a Feeder's function once; its array, checked against the node's shape and cast to its dtype.

    ``own=True`` copies an array the function returned as is: a function may refill one buffer on every call,
    which is harmless when the batch is used at once and wrong when it waits in a prefetch queue.
    """
    from ..interop.convert import to_numpy

    try:
        raw = node.attrs["fn"]()
        value = to_numpy(raw)
    except Exception as e:
        _note(e, node, "Feeder")
        raise
    returned = value
    name = _name(node, "Feeder")
    shape = tuple(map(int, node.shape))
    if tuple(value.shape) != shape:
        got = "None" if raw is None else list(value.shape)  # a function that forgot its return
        raise NNForgeError(f"Feeder {name!r} (created at {node.loc}) expected shape {list(shape)}, "
                           f"its function returned {got}")
    try:
        from_numpy(value.dtype)
    except TypeError as e:
        raise NNForgeError(f"Feeder {name!r} (created at {node.loc}): {e}") from None
    if value.dtype != node.dtype.np:
        if not np.can_cast(value.dtype, node.dtype.np, casting="same_kind"):
            raise NNForgeError(f"Feeder {name!r} (created at {node.loc}) expected {node.dtype}, "
                               f"its function returned {value.dtype}")
        value = value.astype(node.dtype.np)
    value = np.ascontiguousarray(value)
    return value.copy() if own and np.may_share_memory(value, returned) else value


def deliver(node: Node, arrays: Sequence[np.ndarray]) -> None:
    """Call a Receiver's function with its values (copies the caller made)."""
    try:
        node.attrs["fn"](*arrays)
    except Exception as e:
        _note(e, node, "Receiver")
        raise


def _thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread running ``target`` in a copy of the caller's context, so a callback that uses nnforge sees
    the same session as it would on the loop's thread."""
    return threading.Thread(target=contextvars.copy_context().run, args=(target,), name=name, daemon=True)


class _Failed:
    """What a worker puts in a queue in place of the value it could not make."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


Values = Sequence[np.ndarray] | Callable[[], Sequence[np.ndarray]]  # a Receiver's arrays, or a wait for them

_DONE = object()  # the end of a Deliveries queue (an immutable marker, not state)


def arrived(node: Node, values: Values) -> Sequence[np.ndarray]:
    """A Receiver's arrays, waiting for a device's copies where they were sent as a wait (an error there names the
    Receiver, as a callback's does)."""
    if not callable(values):
        return values
    try:
        return values()
    except Exception as e:
        _note(e, node, "Receiver")
        raise


class Prefetcher:
    """Calls a loop's Feeders ahead of the loop, on one thread, in the body's order, ``trips`` rounds.

    A semaphore of ``depth`` slots per Feeder bounds the calls made and not yet taken: the thread takes a slot
    before each call, the loop gives it back when it takes the array. A failed call is put in the queue in place
    of its array and ends the thread, so the loop meets the error at the step that would have met it. ``upload``
    (a compiled step's staging) starts each array's way to the step's device on this thread, off the loop's.
    """

    def __init__(self, feeders: Sequence[Node], trips: int, depth: int,
                 upload: Callable[[np.ndarray], Any] | None = None):
        self._feeders = tuple(feeders)
        self._trips = trips
        self._upload = upload
        self._ready: queue.SimpleQueue[tuple[Node, Any] | _Failed] = queue.SimpleQueue()
        self._slots = threading.Semaphore(depth * len(self._feeders))
        self._stop = threading.Event()
        self._thread = _thread(self._run, "nnforge-feeders")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        for _ in range(self._trips):
            for node in self._feeders:
                self._slots.acquire()
                if self._stop.is_set():
                    return
                try:
                    value = fetch(node, own=True)
                    item: tuple[Node, Any] | _Failed = (node, self._upload(value) if self._upload else value)
                except BaseException as e:  # handed to the loop's thread, which raises it
                    self._ready.put(_Failed(e))
                    return
                self._ready.put(item)

    def take(self, node: Node) -> Any:
        """The next array of ``node`` (uploaded, if the thread uploads; waits for it), or the exception its
        function raised."""
        item = self._ready.get()
        if isinstance(item, _Failed):
            raise item.error
        got, value = item
        if got is not node:
            raise NNForgeError(f"internal: the loop asked for Feeder {_name(node, 'Feeder')!r}, the prefetch thread "
                               f"made {_name(got, 'Feeder')!r} next")
        self._slots.release()
        return value

    def close(self) -> None:
        """Stop making arrays (after the call in progress) and join the thread."""
        self._stop.set()
        self._slots.release()  # wakes the thread if it waits for a slot
        self._thread.join()


class Deliveries:
    """Runs a loop's Receiver callbacks on one thread, in the order the loop sends values to them.

    Each Receiver has ``pending`` slots: ``send`` takes one (blocking the loop while the callback lags that far
    behind), the thread gives it back once the callback returned, so memory stays bounded. After a callback
    raised, the thread drops what is still queued (nothing after the error is delivered) and the next ``send`` or
    ``finish`` raises the error on the loop's thread. Values sent as a function (a download from a device) are
    waited for on the thread, just before their callback.
    """

    def __init__(self, receivers: Sequence[Node]):
        self._slots = {id(n): threading.Semaphore(int(n.attrs.get("pending", PENDING))) for n in receivers}
        self._queue: queue.SimpleQueue[tuple[Node, Values] | object] = queue.SimpleQueue()
        self._drop = threading.Event()
        self.error: BaseException | None = None
        self._thread = _thread(self._run, "nnforge-receivers")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while (item := self._queue.get()) is not _DONE:
            node, values = item  # type: ignore[misc]
            try:
                if not self._drop.is_set():
                    deliver(node, arrived(node, values))
            except BaseException as e:  # handed to the loop's thread, which raises it
                self.error = e
                self._drop.set()
            finally:
                self._slots[id(node)].release()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def send(self, node: Node, values: Values) -> None:
        """Queue ``node``'s values for delivery; waits while ``pending`` of them are undelivered."""
        self._check()
        self._slots[id(node)].acquire()
        if self.error is not None:
            self._slots[id(node)].release()
            self._check()
        self._queue.put((node, values))

    def finish(self) -> None:
        """Wait until every value sent has been delivered; raise the first callback error."""
        self._queue.put(_DONE)
        try:
            self._thread.join()
        except BaseException:  # interrupted while waiting: deliver nothing more
            self._drop.set()
            raise
        self._check()

    def close(self, deliver_queued: bool) -> None:
        """End the thread after delivering what is queued (or dropping it) and join it; raises nothing."""
        if not deliver_queued:
            self._drop.set()
        self._queue.put(_DONE)
        try:
            self._thread.join()
        except BaseException:
            self._drop.set()
            raise


class LoopStreams:
    """The Feeder and Receiver threads of one run of a loop body, as a context manager around the iterations.

    ``nodes`` are the Feeders and Receivers it serves (the interpreter routes them to ``take`` and ``send``).
    A loop whose Feeders include one with ``prefetch=0`` calls all of them on its own thread, and one whose
    Receivers include one with ``pending=0`` delivers to all of them there: the relative order of the callbacks
    of one kind never depends on timing.
    """

    def __init__(self, body: Graph, trips: int, upload: Callable[[np.ndarray], Any] | None = None):
        feeders = [n for n in body.order if n.op == Op.FEEDER]
        receivers = [n for n in body.order if n.op == Op.RECEIVER]
        depth = min((int(n.attrs.get("prefetch", PREFETCH)) for n in feeders), default=0)
        threaded = trips > 0 and bool(receivers) and all(int(n.attrs.get("pending", PENDING)) > 0
                                                         for n in receivers)
        self.feeders = Prefetcher(feeders, trips, depth, upload) if trips > 0 and depth > 0 else None
        self.receivers = Deliveries(receivers) if threaded else None
        self.nodes: list[Node] = (feeders if self.feeders else []) + (receivers if self.receivers else [])

    def take(self, node: Node) -> Any:
        assert self.feeders is not None
        return self.feeders.take(node)

    def send(self, node: Node, values: Values) -> None:
        assert self.receivers is not None
        self.receivers.send(node, values)

    def __enter__(self) -> LoopStreams:
        if self.feeders:
            self.feeders.start()
        if self.receivers:
            try:
                self.receivers.start()
            except BaseException:
                if self.feeders:
                    self.feeders.close()
                raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        """Join the threads. On success wait for every delivery (and raise a delivery's error). On an error,
        deliver what the finished steps sent (as a synchronous run would have) unless it is an interrupt, and
        raise a delivery's error in its place: it came from an earlier step, so a synchronous run met it first."""
        try:
            if self.feeders:
                self.feeders.close()
        finally:
            if self.receivers:
                if error is None:
                    self.receivers.finish()
                else:
                    interrupted = not isinstance(error, Exception)
                    self.receivers.close(deliver_queued=not interrupted)
                    first = self.receivers.error
                    if first is not None and first is not error and not interrupted:
                        raise first
