"""Where a streamed loop's arrays cross between the host and the memory its step program runs on, and when.

A compiled ``nf.loop`` step (``codegen/streamed.py``) is called once per iteration with the loop's state, its
constants and one batch per Feeder, and hands values to Receivers. A ``Staging`` says how those cross: the state and
constants once (``place``), each batch ``upload``-ed on the thread that made it and ``use``-d on the loop's thread,
each Receiver's values ``download``-ed on the loop's thread and waited for on the thread that delivers them.

On a host (C programs; Triton's interpreter) these are plain copies. On a GPU the split is what hides the transfers
(``CudaStaging``): the loop's step runs on the compute stream (torch's current one, where Triton launches), copies
run on a stream of their own and are ordered against it by events, and host memory is pinned so a copy does not
wait for the CPU. The loop's thread never waits for a copy: it only queues the compute stream behind a batch's copy
and the copy stream behind the step whose values it reads back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..interop.convert import to_numpy, to_torch

Download = Callable[[], list[np.ndarray]]  # waits for a download's copies; the host arrays, owned by the caller


def host_copy(value: Any) -> np.ndarray:
    """A value as a numpy array of its own (a Receiver keeps what it is given)."""
    return np.array(to_numpy(value), copy=True)


class HostStaging:
    """A program called on numpy arrays (the C backend, the reference): every crossing is the array itself,
    or a copy where the program may reuse its result's memory."""

    def __init__(self, program: Callable[[Sequence[Any]], list[Any]]):
        self.program = program

    def place(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        """The loop's state and constants where the program reads them (once, before the first step)."""
        return list(arrays)

    def upload(self, array: np.ndarray) -> Any:
        """Start moving a Feeder's batch to the program (any thread); what ``use`` takes."""
        return array

    def use(self, uploaded: Any) -> Any:
        """The batch as the program's input, on the loop's thread, just before the step that reads it."""
        return uploaded

    def call(self, inputs: list[Any]) -> list[Any]:
        return self.program(inputs)

    def download(self, values: Sequence[Any]) -> Download:
        """Start copying a step's Receiver values to the host (loop's thread, after the step)."""
        copies = [host_copy(v) for v in values]
        return lambda: copies

    def host(self, value: Any) -> np.ndarray:
        """A final state's value on the host (the loop has ended)."""
        return value if isinstance(value, np.ndarray) else host_copy(value)


class TensorStaging(HostStaging):
    """A program called on torch tensors on its device (``call_tensors``), copied synchronously: Triton's
    interpreter (CPU tensors) and any device without streams."""

    def __init__(self, program: Any):
        super().__init__(program)
        self.device = program.device

    def place(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        return [to_torch(a).to(self.device) for a in arrays]

    def upload(self, array: np.ndarray) -> Any:
        return to_torch(array).to(self.device)

    def call(self, inputs: list[Any]) -> list[Any]:
        return self.program.call_tensors(inputs)

    def host(self, value: Any) -> np.ndarray:
        return host_copy(value)


class CudaStaging(TensorStaging):
    """Asynchronous copies on a CUDA device: the compute stream is torch's current stream when the loop starts,
    the copy stream one of this run's own.

    A batch is copied into pinned memory on the Feeder thread and from there to the device on the copy stream; the
    compute stream waits for that copy's event, not the host. A Receiver's values are copied back on the copy stream
    after an event marking the step, into pinned memory the delivering thread reads once the copies' event has
    completed. Memory crossing streams is handed to torch's caching allocators with ``record_stream`` (a batch's
    device memory is not reused before the step that reads it ran; a pinned block not before its copy did).
    ``api``: the torch namespace, or a test's stand-in for it whose streams run late.
    """

    def __init__(self, program: Any, api: Any = None):
        if api is None:
            import torch as api
        super().__init__(program)
        self.torch = api
        self.compute = api.cuda.current_stream(self.device)
        self.copies = api.cuda.Stream(self.device)

    def _empty_like(self, src: Any, **where: Any) -> Any:
        return self.torch.empty(tuple(src.shape), dtype=src.dtype, **where)

    def place(self, arrays: Sequence[np.ndarray]) -> list[Any]:
        placed = []
        for a in arrays:
            src = to_torch(a)
            placed.append(self._empty_like(src, device=self.device).copy_(src))  # a blocking copy, once
        return placed

    def upload(self, array: np.ndarray) -> tuple[Any, Any]:
        cuda = self.torch.cuda
        src = to_torch(array)
        pinned = self._empty_like(src, pin_memory=True).copy_(src)
        with cuda.stream(self.copies):
            on_device = self._empty_like(src, device=self.device)
            on_device.copy_(pinned, non_blocking=True)
            copied = cuda.Event()
            copied.record(self.copies)
        return on_device, copied

    def use(self, uploaded: tuple[Any, Any]) -> Any:
        on_device, copied = uploaded
        self.compute.wait_event(copied)
        on_device.record_stream(self.compute)
        return on_device

    def download(self, values: Sequence[Any]) -> Download:
        cuda = self.torch.cuda
        stepped = cuda.Event()
        stepped.record(self.compute)
        self.copies.wait_event(stepped)
        hosts = []
        with cuda.stream(self.copies):
            for v in values:
                pinned = self._empty_like(v, pin_memory=True)
                pinned.copy_(v, non_blocking=True)
                v.record_stream(self.copies)
                hosts.append(pinned)
            copied = cuda.Event()
            copied.record(self.copies)

        def wait() -> list[np.ndarray]:
            copied.synchronize()
            return [host_copy(h) for h in hosts]

        return wait


def staging_for(program: Any) -> HostStaging:
    """How a step program's arrays cross: asynchronously on a CUDA device, by copies elsewhere."""
    if not hasattr(program, "call_tensors"):
        return HostStaging(program)
    if str(program.device).startswith("cuda"):
        return CudaStaging(program)
    return TensorStaging(program)
