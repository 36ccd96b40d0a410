"""A persistent scan's step as a GPU would run it, built without one: for each pipeline depth (``Tiles.scan_stages``)
and tiling of rows (``Tiles.scan_pieces``: H = 96 as tiles of 64 + 32, or one of 128), and orientation of its tiles
(``Tiles.scan_transposed``: the batch rows on the inner axis, the MMA's N side), warps, rows per program and other
fields of ``Tiles`` or the target (``--variant``, as bench/lstm_gpu.py's: ``chunk_bytes=65536`` computes the input
projection in the scan, ``hoist_step_work=1`` takes a layer norm of it out) each scan kernel's registers, spill,
shared memory and the machine code of its time loop — one step — counted.

The models are bench/precision_gpu.py's (H = ``--hidden``, float16, batch ``--batch``): the LSTM layer, and with
``--cells`` the layer-norm LSTM, GRU and peephole LSTM; each its forward and a training step (the gradients of its
weights). Their launches are recorded while Triton's interpreter runs them once (three steps: the kernels do
not depend on T), then each scan kernel is built for sm_90 by Triton's compiler and ptxas and its SASS read with
cuobjdump (``nnforge/codegen/triton/offline.py``, ``loops=True``). Per step: instructions, barriers, global loads
into registers (made where the step uses them, or a step ahead where Triton's pipeliner carries them across the
loop: the kernel's TTGIR tells which), asynchronous copies into shared memory (issued ahead), shared-memory loads,
MMAs, special functions (exp, reciprocal), local-memory accesses (spill) and global atomics (a resident loop's
barriers: with ``--variant resident_steps=1`` at a width whose loop is not split by rows, e.g. ``--hidden 384
--batch 128``, its kernel, and where a step may hold its weights that form too, ``+held``). Counts, not times:
what a step costs is a GPU measurement (bench/lstm_gpu.py). Usage: ``python bench/scan_sass.py [--stages 1 2 3]
[--pieces 1 0] [--transposed 0 1] [--warps 4 8] [--rows 8 16] [--variant - hoist_step_work=1] [--hidden 96]
[--batch 1024] [--cells]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the launches are recorded by its interpreter

import numpy as np
import triton
from lstm_gpu import variant_options  # this folder, on sys.path when run as a script
from precision_gpu import MODELS

import nnforge as nf
from nnforge.codegen.triton.offline import compile_offline, held_forms, record_launches
from nnforge.codegen.triton.target import Tiles

COLUMNS = ("instructions", "barriers", "global_loads", "async_copies", "shared_loads", "mma", "special", "local",
           "atomics")


def models(H: int, N: int, cells: bool) -> dict[str, tuple]:
    """name -> (function of the stacked outputs, arguments, the weights a training step differentiates), from
    bench/precision_gpu.py's table of the models."""
    rng = np.random.default_rng(96)

    def rnd(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float16)

    out = {}
    for name, (model, _, weights, n_states) in MODELS.items():
        if name == "LSTM" or cells:
            args = (rnd(3, N, H), *(rnd(N, H) for _ in range(n_states)), *(rnd(*w(H)) for w in weights.values()))
            out[name] = (lambda *a, m=model: m(*a)[0], args, tuple(range(1 + n_states, len(args))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--pieces", type=int, nargs="+", default=[1, 0], help="1: rows in power-of-two tiles, 0: padded")
    ap.add_argument("--transposed", type=int, nargs="+", default=[0], help="1: [width, rows] tiles, 0: [rows, width]")
    ap.add_argument("--warps", type=int, nargs="+", default=[Tiles().scan_warps], help="warps per scan program")
    ap.add_argument("--rows", type=int, nargs="+", default=[Tiles().scan_rows], help="batch rows per scan program")
    ap.add_argument("--variant", nargs="+", default=["-"], metavar="NAME=VALUE,...",
                    help="other fields of Tiles or triton_target() (- for none), e.g. hoist_step_work=1")
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--cells", action="store_true", help="also the layer-norm LSTM, GRU and peephole LSTM")
    a = ap.parse_args()
    print(f"H={a.hidden}, batch {a.batch}, float16; built for sm_90 by Triton {triton.__version__}; per step of each "
          "persistent scan kernel:")
    print(f"{'model':26s} {'mode':9s} {'kernel':36s} stages pieces transp warps rows {'variant':20s} regs spill "
          "sharedKiB " + " ".join(COLUMNS))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NNFORGE_CACHE_DIR"] = tmp  # the generated modules, where the build process imports them
        for name, (fn, args, weights) in models(a.hidden, a.batch, a.cells).items():
            def loss(*xs, fn=fn):
                ys = fn(*xs)
                return (ys * ys).sum()

            for mode, step in (("inference", fn), ("training", nf.grad(loss, argnums=weights))):
                for stages, pieces, tr, warps, rows, spec in (
                        (s, p, t, w, r, g) for s in a.stages for p in a.pieces for t in a.transposed for w in a.warps
                        for r in a.rows for g in a.variant):
                    tiles = Tiles(scan_stages=stages, scan_pieces=bool(pieces), scan_transposed=bool(tr),
                                  scan_warps=warps, scan_rows=rows)
                    options = {"tiles": tiles} | (variant_options(spec, tiles) if spec != "-" else {})
                    compiled = nf.compile(step, backend="triton", options=options)
                    scans = held_forms([r for r in record_launches(lambda c=compiled, xs=args: c(*xs))
                                        if "_scan_" in r["name"] or "_resident_" in r["name"]])
                    for kernel, k in compile_offline(scans, arch=90, loops=True)["kernels"].items():
                        step_counts = " ".join(f"{k['loop'][c]:{len(c)}d}" for c in COLUMNS)
                        print(f"{name:26s} {mode:9s} {kernel[:36]:36s} {stages:6d} {pieces:6d} {tr:6d} {warps:5d} "
                              f"{rows:4d} {spec:20s} {k['registers']:4d} {k['spill_bytes']:5d} "
                              f"{k['shared'] // 1024:9d} {step_counts}", flush=True)


if __name__ == "__main__":
    main()
