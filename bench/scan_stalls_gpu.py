"""The persistent scan kernels of an LSTM layer, launched once each, for Nsight Compute to say where a step waits.

An H = 96 LSTM step takes 2.6 µs on an H200 (docs/benchmarks.md), about 5,200 cycles for some 800 instructions a
warp: the step waits far more than it issues, and only the hardware's stall counters say on what (barriers,
shared-memory loads, the MMA's results, global memory...). This script runs the layer's forward (``--mode
inference``) and a training step (its forward and backward scans) with the tiles in use, or those of ``--variant``
(``Tiles`` or ``Target`` fields, ``name=value,...``), after a first call that builds every kernel, so that the launches
``scripts/gpu-check.sh``'s ``stalls`` step hands to ``ncu`` (kernels named ``*scan*`` inside the NVTX range
``profiled``) are the built, steady form. What each stall reason means: Nsight Compute's "Warp State Statistics"
(cycles a warp spends per issued instruction, by reason). Usage: ``ncu --kernel-name regex:scan ... python
bench/scan_stalls_gpu.py [--hidden 96] [--batch 1024] [--steps 200] [--mode inference training] [--variant
scan_transposed=1,scan_pieces=0]``; ``--smoke`` runs tiny shapes on the CPU under Triton's interpreter (no counters:
it checks the script).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import lstm_cpu  # this folder, on sys.path when run as a script
import torch
from lstm_gpu import variant_options  # sets TRITON_INTERPRET for --smoke before triton is imported

import nnforge as nf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=200, help="T: enough steps for a steady state, few for ncu")
    ap.add_argument("--mode", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    ap.add_argument("--variant", default="", metavar="NAME=VALUE,...")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under Triton's interpreter")
    a = ap.parse_args()
    if a.smoke:
        a.hidden, a.batch, a.steps = 16, 4, 3
    device = "cpu" if a.smoke else "cuda"
    dtype = torch.float32 if a.smoke else torch.float16
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/scan_stalls_gpu.py needs a CUDA device (or --smoke)")
    torch.manual_seed(0)
    T, N, H = a.steps, a.batch, a.hidden
    x = torch.randn(T, N, H, device=device, dtype=dtype)
    h0, c0 = (torch.randn(N, H, device=device, dtype=dtype) * 0.1 for _ in range(2))
    w_ih, w_hh = (torch.randn(4 * H, H, device=device, dtype=dtype) * H ** -0.5 for _ in range(2))
    b = torch.randn(4 * H, device=device, dtype=dtype) * 0.1
    options = variant_options(a.variant) if a.variant else {}

    def loss(x, h0, c0, w_ih, w_hh, b):
        return (lstm_cpu.lstm(x, h0, c0, w_ih, w_hh, b)[0] ** 2).sum()

    forms = {"inference": nf.compile(lambda *v: lstm_cpu.lstm(*v)[0], backend="triton", options=options),
             "training": nf.compile(nf.grad(loss, argnums=(3, 4, 5)), backend="triton", options=options)}
    for mode in a.mode:
        for call in ("build", "profiled"):  # the first call builds every kernel; ncu reads the second's
            with torch.cuda.nvtx.range(call) if device == "cuda" else contextlib.nullcontext():
                out = forms[mode](x, h0, c0, w_ih, w_hh, b)
                if device == "cuda":
                    torch.cuda.synchronize()
            first = out[0] if isinstance(out, tuple | list) else out
            print(f"{mode} T={T} N={N} H={H} {str(dtype).removeprefix('torch.')} {a.variant or 'tiles in use'}: "
                  f"{call} call, output {tuple(first.shape)} finite {bool(torch.isfinite(first).all())}", flush=True)


if __name__ == "__main__":
    main()
