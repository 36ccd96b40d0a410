"""Opt-in search of the Triton backend's block sizes and warps on a GPU, cached per device.

``tune_triton()`` times an LSTM layer (inference and a training step, float16) at representative shapes with
each candidate ``Tiles``, one axis at a time, and writes the fastest to ``<cache>/tune/triton-<device>.json``;
``TritonBackend`` uses the cached tiles on a device of that name (``load_triton_tiles``) and the defaults
elsewhere. Under Triton's interpreter it refuses: the interpreter runs programs one after another on the CPU, so
its timings say nothing about a GPU. Tuning never runs implicitly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from ..codegen.c.toolchain import cache_dir
from ..codegen.triton.target import Tiles
from ..errors import NNForgeError
from .coordinate import coordinate_search, load_result, save_result

AXES: dict[str, tuple[int, ...]] = {
    "scan_rows": (8, 16, 32, 64),  # batch rows per persistent program: fewer programs, wider tl.dot
    "scan_warps": (4, 8),
    "scan_stages": (1, 2, 3),     # the time loop's pipeline: Triton's default, or input tiles 1 or 2 steps ahead
    # a row of 96 as tiles of 64 + 32 or one of 128, each as [rows, width] tiles or [width, rows] (the rows the
    # MMA's N side), together: transposed rows fill the MMA best as one padded tile (sm_90: 627 instructions a
    # step, 64 MMAs, against 742 and 48 in pieces), which neither change alone reaches from the default
    "scan_pieces+scan_transposed": ((True, False), (False, False), (True, True), (False, True)),
    "gemm_m": (32, 64, 128),      # the input projection's and the weight gradients' GEMM tiles
    "gemm_n": (32, 64, 128),
    "gemm_k": (32, 64),
    "gemm_group": (0, 8, 32),     # row tiles a GEMM's programs take together (0: all of them, row tiles fastest)
    "gemm_warps": (4, 8),
    # the large half-precision GEMMs' tile (a wide layer's projection, step and weight gradients) and the fewest
    # programs that take it (0: never)
    "gemm_big_programs": (0, 64, 128, 256),
    "gemm_big_n": (128, 256),
    "gemm_big_warps": (4, 8),
    "flat": (512, 1024, 2048),    # elements per elementwise program
    "row_elements": (1024, 4096, 16384),  # values a program of whole rows takes (a layer norm's, a softmax's)
    "warps": (4, 8),
}

# (T, batch, hidden): a basecaller's narrow layer in its persistent kernel, a wider one in its host loop
SHAPES: tuple[tuple[int, int, int], ...] = ((2000, 1024, 96), (500, 256, 384))


def _path(device: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", device).strip("-").lower() or "device"
    return cache_dir().parent / "tune" / f"triton-{slug}.json"


def load_triton_tiles(device: str) -> Tiles | None:
    """The tiles tuned on a device named ``device`` (``torch.cuda.get_device_name()``), or None."""
    return load_result(_path(device), "tiles", Tiles)


def _time_tiles(tiles: Tiles, shapes: Sequence[tuple[int, int, int]], repeats: int) -> float:
    """Seconds of one LSTM layer's forward, one training step and a layer norm of its input projection's rows
    (T x N rows of 4H, as a layer-norm LSTM's) per shape, float16, each the best of ``repeats`` calls timed with
    CUDA events after a warm-up (the first call compiles)."""
    import numpy as np
    import torch

    from .. import compile as nf_compile
    from .. import grad, scan, sigmoid, tanh
    from ..codegen.triton import TritonBackend
    from ..nn.functional import layer_norm

    def lstm(x, h0, c0, w_ih, w_hh, b):
        def cell(carry, x_t):
            h, c = carry
            i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
            c = sigmoid(f) * c + sigmoid(i) * tanh(g)
            h = sigmoid(o) * tanh(c)
            return (h, c), h

        return scan(cell, (h0, c0), x)[1]

    def loss(x, h0, c0, w_ih, w_hh, b):
        ys = lstm(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum()

    def normalized(x, h0, c0, w_ih, w_hh, b):
        rows = (x @ w_ih.T).reshape(-1, w_ih.shape[0])  # a layer-norm LSTM's input projection, its rows whole
        return layer_norm(rows, rows.shape[-1:], b, b)

    backend = TritonBackend(tiles=tiles)
    rng = np.random.default_rng(0)
    total = 0.0
    for T, N, H in shapes:
        host = [(rng.standard_normal(s) * 0.1).astype(np.float16)
                for s in ((T, N, H), (N, H), (N, H), (4 * H, H), (4 * H, H), (4 * H,))]
        dev = [torch.from_numpy(a).cuda() for a in host]
        for fn in (lstm, grad(loss, argnums=(3, 4, 5)), normalized):
            program = backend(nf_compile(fn).trace(*host))
            program.call_tensors(dev)  # type: ignore[attr-defined]
            best = float("inf")
            for _ in range(repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                program.call_tensors(dev)  # type: ignore[attr-defined]
                end.record()
                end.synchronize()
                best = min(best, start.elapsed_time(end) / 1e3)
            total += best
    return total


def tune_triton(shapes: Sequence[tuple[int, int, int]] = SHAPES, axes: dict[str, Sequence[int]] | None = None,
                repeats: int = 3, device: str | None = None,
                timer: Callable[[Tiles], float] | None = None) -> Tiles:
    """Coordinate search over ``axes`` (one axis at a time, keeping the best value so far), each candidate timed
    by ``timer`` (default: ``_time_tiles`` on ``shapes`` on the current CUDA device); caches and returns the
    fastest tiles for ``device`` (default: the current device's name). A candidate that fails (a tile too large
    for the device's shared memory) is logged and skipped."""
    from ..codegen.triton import interpreted

    if timer is None:
        import torch

        if interpreted() or not torch.cuda.is_available():
            raise NNForgeError("tune_triton times kernels on a CUDA GPU: none here, or TRITON_INTERPRET is set "
                               "(the interpreter's timings say nothing about a GPU)")
        device = device or torch.cuda.get_device_name()
        timer = lambda tiles: _time_tiles(tiles, shapes, repeats)  # noqa: E731
    if device is None:
        raise NNForgeError("tune_triton with a timer of its own needs the device name to cache the result under")
    # a candidate the device cannot run (a tile too large for its shared memory) loses; the search goes on
    best, results = coordinate_search(Tiles(), axes or AXES, timer, failures_lose=True)
    save_result(_path(device), {"device": device, "tiles": asdict(best), "timings_s": results})
    return best
