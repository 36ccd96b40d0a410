"""A stand-in for the part of ``torch`` that ``runtime.staging.CudaStaging`` uses, whose streams run late.

Each stream is a thread running its queued work in order, every item after a random delay; an event is set by its
stream when the stream reaches it; device memory and pinned memory start as NaN (or a sentinel integer). Work queued
on a stream reads its operands when it runs, not when it is queued, so a copy or a step ordered wrongly against
another stream reads memory not yet written, and the values show it. A non-blocking copy from or to host memory
that is not pinned is refused (on a GPU it would quietly stall the host), and waiting for an event never recorded
is a failure, as is a stream's work still waiting after ``TIMEOUT`` seconds (a missing record, not a hang).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

TIMEOUT = 20.0


def _numpy_dtype(dtype: Any) -> np.dtype:
    if isinstance(dtype, torch.dtype):
        return torch.empty(0, dtype=dtype).numpy().dtype
    return np.dtype(dtype)


def _garbage(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    fill = np.nan if dtype.kind == "f" else np.iinfo(dtype).min + 7 if dtype.kind in "iu" else True
    return np.full(shape, fill, dtype=dtype)


class FakeStream:
    """A queue of work run in order by its own thread, each item after ``delay()`` seconds."""

    def __init__(self, name: str, delay: Callable[[], float], errors: list[BaseException]):
        self.name = name
        self._delay = delay
        self._errors = errors
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"fake-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (work := self._queue.get()) is not None:
            time.sleep(self._delay())
            try:
                work()
            except BaseException as e:  # kept for the test to raise
                self._errors.append(e)

    def enqueue(self, work: Callable[[], None]) -> None:
        self._queue.put(work)

    def wait_event(self, event: FakeEvent) -> None:
        done = event.recorded()
        self.enqueue(lambda: _wait(done, f"stream {self.name} waiting for an event"))

    def synchronize(self) -> None:
        done = threading.Event()
        self.enqueue(done.set)
        _wait(done, f"the host waiting for stream {self.name}")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(TIMEOUT)


def _wait(done: threading.Event, who: str) -> None:
    if not done.wait(TIMEOUT):
        raise AssertionError(f"{who}: not set after {TIMEOUT} s")


class FakeEvent:
    def __init__(self, cuda: FakeCuda):
        self._cuda = cuda
        self._done: threading.Event | None = None

    def record(self, stream: FakeStream | None = None) -> None:
        done = threading.Event()
        self._done = done
        (stream or self._cuda.current_stream()).enqueue(done.set)

    def recorded(self) -> threading.Event:
        assert self._done is not None, "waiting for an event that was never recorded"
        return self._done

    def synchronize(self) -> None:
        _wait(self.recorded(), "the host waiting for an event")


class FakeCuda:
    """``torch.cuda``'s streams and events, with a thread-local current stream as torch has."""

    def __init__(self, delay: Callable[[], float]):
        self.errors: list[BaseException] = []
        self._delay = delay
        self.default = FakeStream("default", delay, self.errors)
        self.streams = [self.default]
        self._local = threading.local()

    def current_stream(self, device: Any = None) -> FakeStream:
        return getattr(self._local, "stream", None) or self.default

    def Stream(self, device: Any = None) -> FakeStream:  # torch's name
        s = FakeStream(f"s{len(self.streams)}", self._delay, self.errors)
        self.streams.append(s)
        return s

    def Event(self) -> FakeEvent:  # torch's name
        return FakeEvent(self)

    @contextmanager
    def stream(self, s: FakeStream) -> Iterator[None]:
        before = getattr(self._local, "stream", None)
        self._local.stream = s
        try:
            yield
        finally:
            self._local.stream = before

    def close(self) -> None:
        for s in self.streams:
            s.close()


class FakeTensor:
    """Memory on the fake device, pinned host memory or pageable host memory (``where``)."""

    def __init__(self, array: np.ndarray, where: str, cuda: FakeCuda):
        self.array, self.where, self._cuda = array, where, cuda
        self.recorded_on: list[FakeStream] = []

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def copy_(self, src: Any, non_blocking: bool = False) -> FakeTensor:
        src_where = src.where if isinstance(src, FakeTensor) else "pageable"
        if self.where != "device" and src_where != "device":
            np.copyto(self.array, _host(src))
            return self
        host = src_where if self.where == "device" else self.where
        if non_blocking:
            assert host in ("pinned", "device"), "an asynchronous copy from or to memory that is not pinned"
        stream = self._cuda.current_stream()
        stream.enqueue(lambda: np.copyto(self.array, _host(src)))
        if not non_blocking:
            stream.synchronize()
        return self

    def __getitem__(self, index: Any) -> FakeTensor:
        return FakeTensor(self.array[index], self.where, self._cuda)  # a view, as torch's indexing is

    def record_stream(self, stream: FakeStream) -> None:
        assert self.where == "device", "record_stream on host memory"
        self.recorded_on.append(stream)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        if self.where == "device":  # as tensor.cpu(): waits for the current stream
            self._cuda.current_stream().synchronize()
        return self.array if dtype is None else self.array.astype(dtype)


def _host(src: Any) -> np.ndarray:
    return src.array if isinstance(src, FakeTensor) else np.asarray(src)


class FakeTorch:
    """The ``torch`` namespace as ``CudaStaging`` sees it: ``cuda`` and ``empty``."""

    def __init__(self, delay: Callable[[], float]):
        self.cuda = FakeCuda(delay)
        self.allocated: list[FakeTensor] = []

    def empty(self, shape: tuple[int, ...], dtype: Any, device: Any = None, pin_memory: bool = False) -> FakeTensor:
        where = "device" if device is not None else "pinned" if pin_memory else "pageable"
        t = FakeTensor(_garbage(tuple(shape), _numpy_dtype(dtype)), where, self.cuda)
        self.allocated.append(t)
        return t


class FakeDeviceProgram:
    """A compiled step program (numpy in, numpy out) as if it ran on the fake device: ``call_tensors`` queues it
    on the current stream, where it reads its inputs when it runs and writes outputs allocated at the call."""

    device = "cuda"

    def __init__(self, program: Any, api: FakeTorch):
        self.program, self.api = program, api
        self.calls = 0

    def call_tensors(self, tensors: list[FakeTensor]) -> list[FakeTensor]:
        assert all(isinstance(t, FakeTensor) and t.where == "device" for t in tensors), "a step input off the device"
        env = self.program.checked_sizes(tensors)
        outs = [self.api.empty(shape, o.dtype.np, device=self.device)
                for shape, o in zip(self.program.output_shapes(env), self.program.graph.outputs)]

        def run() -> None:
            for out, value in zip(outs, self.program([t.array for t in tensors])):
                np.copyto(out.array, value)

        self.api.cuda.current_stream().enqueue(run)
        self.calls += 1
        return outs
