"""One LSTM layer on a GPU: nnforge backend="triton" against cuDNN (torch.nn.LSTM, one single-layer module: only
then can cuDNN pick its persistent kernels), measured in the same process, interleaved; with
``--cells``, custom cells against TorchScript and torch.compile loops; FlashRNN's LSTM where it is installed
(``pip install flashrnn``; on a machine without a network ``make gpu-wheels`` fetches it to carry): its fused CUDA
kernel with one head (compiled by torch's extension loader on first use: it needs nvcc) and its fused Triton
kernel where one head fits its limit of 64 (``--flashrnn`` picks; a backend that cannot run is reported with the
reason). FlashRNN takes the input projection precomputed; here torch computes it in the timed call, as nnforge and
cuDNN do theirs.

Per shape (T, batch, hidden; input size = hidden, input projection included) and mode (inference: forward;
training: forward + backward of ``(ys * cot).sum()`` into the weights), each round times every candidate once
with CUDA events after a warm-up; the table shows the median time per call, microseconds per step, achieved
TFLOP/s and GB/s (the fewest bytes the layer must move, ``fewest_bytes``) and the ratio anchor time / nnforge time
(> 1: nnforge faster). Also printed: the device's name, its measured dense-GEMM peak in the dtype and its copy
bandwidth, and per hidden size the error of nnforge and of cuDNN against a float64
reference (cuDNN's LSTM in float64 on the same weights; ``|out - ref| / |ref|`` over all elements, at the
smallest batch of that hidden size; in training of the weight gradients too). An anchor that fails at a shape
is reported with its error; on a GPU every anchor's first call at every shape runs first in a child process
(``probe_anchors``), so one that ends its process's CUDA context (cuDNN at batch 8448 on an H200) is left out
with its reason instead of ending the run. Record results in docs/benchmarks.md with the device and date.

Usage: ``python bench/lstm_gpu.py [--hidden 96 384 1024 --batch 128 1024] [--steps 2000] [--dtype float16]
[--mode inference training] [--rounds 5] [--cells BATCH HIDDEN] [--cuda-graphs] [--flashrnn auto]
[--variant scan_pieces=0 ...] [--cell-variant hoist_step_work=1 ...] [--profile]``; without
``--hidden``/``--batch`` the shapes of issue 14's table (H 96 at batch 1024 and 8448 = 64 per SM of a 132-SM
part; H 384 and 1024 at 128 and 1024).
``--variant`` also times nnforge with other tiles or target thresholds (fields of ``Tiles`` or ``Target``,
``name=value`` joined by commas, each replacing that of the tiles the backend uses on the device or of
``triton_target()``), interleaved with the default, as ``nnforge[scan_pieces=0]`` with its time over the
default's: one choice compared in one run (``split_k_outputs=0``: weight gradients summed over K in one program
per tile of results, not in parts). ``--cell-variant`` does the same for each custom cell of ``--cells``
(``hoist_step_work=1``: a layer norm of the input projection computed before the persistent scan, not in it).
Each such form's results (the outputs, or the weight gradients) are compared with the default's on the same
arguments and the largest relative difference printed, marked DISAGREES above 1e-2 (a resident loop's barrier
that let a program read before another stored would show here, not only in the tests; the layer-norm LSTM is
chaotic in half precision, so its forms differ by its own error against float64).
``--profile`` prints, after each shape's times, one nnforge call's time by kernel (torch's profiler): where a
training step's time goes. ``--smoke`` runs tiny shapes on the CPU under Triton's interpreter (with
``TRITON_INTERPRET=1`` set by the script, anchors on the CPU; ``nnforge±graphs`` there are the same program
uncaptured): it proves the script runs, its times mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

SMOKE = "--smoke" in sys.argv
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import cells_cpu  # noqa: E402  (this folder, on sys.path when run as a script)
import lstm_cpu  # noqa: E402
import torch  # noqa: E402

import nnforge as nf  # noqa: E402
from nnforge.codegen.triton import TritonBackend  # noqa: E402
from nnforge.codegen.triton.target import Tiles, triton_target  # noqa: E402


def lstm(x, h0, c0, w_ih, w_hh, b):
    """bench/lstm_cpu.py's layer, its stacked outputs only."""
    return lstm_cpu.lstm(x, h0, c0, w_ih, w_hh, b)[0]


FLASHRNN_HEAD_LIMIT = 64  # FlashRNN's fused Triton kernel takes heads of at most 64 values (its README)


def flashrnn_backends(H: int, device: str, wanted: str) -> list[str]:
    """The FlashRNN backends timed for one head of width ``H`` (``wanted``: "auto", "none" or a comma-separated
    list): on a GPU its fused CUDA kernel, and its fused Triton kernel up to the head limit; on the CPU (smoke
    runs) its PyTorch loop, "vanilla", which checks the wiring; none where flashrnn is not installed."""
    if wanted == "none":
        return []
    try:
        import flashrnn  # noqa: F401
    except ImportError:
        return []
    if wanted != "auto":
        return wanted.split(",")
    if device != "cuda":
        return ["vanilla"]
    return ["cuda_fused"] + (["triton_fused"] if H <= FLASHRNN_HEAD_LIMIT else [])


def flashrnn_lstm(x, h0, c0, w_ih, w_hh, b, backend: str) -> torch.Tensor:
    """The layer through FlashRNN's LSTM, one head (gate order i, f, g, o, as torch's): the input projection by
    torch, batch-major as FlashRNN takes it; its stacked outputs [T, N, H]."""
    import flashrnn

    T, N, H = x.shape
    wx = (x.transpose(0, 1) @ w_ih.T).reshape(N, T, 4, 1, H)
    states = torch.stack([h0, c0]).reshape(2, N, 1, 1, H)
    h, _ = flashrnn.flashrnn(wx, w_hh.reshape(4, 1, H, H), b.reshape(4, 1, H), states=states, function="lstm",
                             backend=backend, dtype=str(x.dtype).removeprefix("torch."))
    return h[0].reshape(N, T, H).transpose(0, 1)


TABLE = [(96, 1024), (96, 8448), (384, 128), (384, 1024), (1024, 128), (1024, 1024)]  # (hidden, batch)


def flops(T: int, N: int, H: int, training: bool) -> float:
    fwd = 2.0 * T * N * 4 * H * (H + H)
    return 3 * fwd if training else fwd


class Clock:
    """Wall time of a call on the device: CUDA events on a GPU, perf_counter on the CPU (smoke runs)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def fewest_bytes(T: int, N: int, H: int, itemsize: int, training: bool) -> int:
    """Bytes a layer must move at least: each input read once, each output written once (x, h0, c0, the weights
    and bias in, ys out; in training also the cotangent in and the weight gradients out)."""
    weights = 2 * 4 * H * H + 4 * H
    io = 2 * T * N * H + 2 * N * H + weights
    return itemsize * (io + T * N * H + weights if training else io)


def copy_peak(device: str, clock: Clock) -> float:
    """Device memory bandwidth measured as a large device-to-device copy (bytes read plus written), GB/s."""
    n = 1 << 30 if device == "cuda" else 1 << 22
    a = torch.empty(n, dtype=torch.uint8, device=device).random_()
    b = torch.empty_like(a)
    b.copy_(a)
    return 2 * n / min(clock(lambda: b.copy_(a)) for _ in range(5)) / 1e9


def gemm_peak(device: str, dtype: torch.dtype, clock: Clock) -> float:
    n = 8192 if device == "cuda" else 256
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    return 2 * n ** 3 / min(clock(lambda: a @ b) for _ in range(5)) / 1e12


def _nnforge_forms(graphs: bool, variants: tuple[str, ...] = ()) -> dict[str, dict]:
    """nnforge as a user gets it (CUDA graphs where the program has a host loop), with ``graphs`` also with
    graphs forced off and on, and one form per variant (``variant_options``)."""
    forms: dict[str, dict] = {"nnforge.triton": {}}
    if graphs:
        forms |= {"nnforge-graphs": {"cuda_graphs": False}, "nnforge+graphs": {"cuda_graphs": True}}
    return forms | {f"nnforge[{v}]": variant_options(v) for v in variants}


def variant_options(spec: str, tiles: Tiles | None = None) -> dict:
    """The backend's options for ``spec`` (``name=value,...``): ``tiles`` (by default those it uses here: tuned
    for this GPU, else the defaults) and ``triton_target()``, with the fields of either that ``spec`` sets."""
    if tiles is None:
        tiles = TritonBackend().device_tiles if torch.cuda.is_available() else Tiles()
    bases = {"tiles": tiles, "target": triton_target()}
    fields = {f.name: key for key, base in bases.items() for f in dataclasses.fields(base)
              if isinstance(getattr(base, f.name), int)}
    changes: dict[str, dict] = {"tiles": {}, "target": {}}
    for item in spec.split(","):
        name, _, value = item.partition("=")
        if name not in fields or not value.lstrip("-").isdigit():
            sys.exit(f"--variant {spec}: {item!r} is not name=integer for a field of Tiles or Target "
                     f"({', '.join(fields)})")
        base = bases[fields[name]]
        changes[fields[name]][name] = type(getattr(base, name))(int(value))
    return {key: dataclasses.replace(bases[key], **c) for key, c in changes.items() if c}


def candidates(T: int, N: int, H: int, dtype: torch.dtype, device: str, training: bool,
               flash: str = "auto", graphs: bool = False, nnforge: bool = True,
               variants: tuple[str, ...] = ()) -> dict[str, Callable]:
    """name -> a call running one forward (or forward + backward) on the same weights and inputs; with
    ``graphs``, also nnforge with CUDA graphs forced off and on, and nnforge with each tiles variant
    (``_nnforge_forms``)."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(H, H).to(device=device, dtype=dtype)
    x = torch.randn(T, N, H, device=device, dtype=dtype)
    h0 = torch.randn(N, H, device=device, dtype=dtype) * 0.1
    c0 = torch.randn(N, H, device=device, dtype=dtype) * 0.1
    cot = torch.randn(T, N, H, device=device, dtype=dtype)
    w_ih, w_hh = ref.weight_ih_l0.detach(), ref.weight_hh_l0.detach()
    b = (ref.bias_ih_l0 + ref.bias_hh_l0).detach()
    out: dict[str, Callable] = {}
    anchor = "cudnn" if device == "cuda" else "nn.LSTM"
    if training:
        def loss(x, h0, c0, w_ih, w_hh, b, cot):
            return (lstm(x, h0, c0, w_ih, w_hh, b) * cot).sum()

        for name, options in _nnforge_forms(graphs, variants).items() if nnforge else ():
            step = nf.compile(nf.grad(loss, argnums=(3, 4, 5)), backend="triton", options=options)
            out[name] = lambda step=step: step(x, h0, c0, w_ih, w_hh, b, cot)

        def cudnn() -> None:
            ref.zero_grad(set_to_none=True)
            ys, _ = ref(x, (h0[None], c0[None]))
            ys.backward(cot)

        out[anchor] = cudnn
        leaves = [w.detach().clone().requires_grad_() for w in (w_ih, w_hh, b)]
        for fb in flashrnn_backends(H, device, flash):
            def flash_step(fb: str = fb) -> None:
                for w in leaves:
                    w.grad = None
                (flashrnn_lstm(x, h0, c0, *leaves, fb) * cot).sum().backward()

            out[f"flashrnn.{fb}"] = flash_step
    else:
        for name, options in _nnforge_forms(graphs, variants).items() if nnforge else ():
            fwd = nf.compile(lstm, backend="triton", options=options)
            out[name] = lambda fwd=fwd: fwd(x, h0, c0, w_ih, w_hh, b)

        def cudnn_inference() -> None:
            with torch.no_grad():
                ref(x, (h0[None], c0[None]))

        out[anchor] = cudnn_inference
        for fb in flashrnn_backends(H, device, flash):
            def flash_inference(fb: str = fb) -> None:
                with torch.no_grad():
                    flashrnn_lstm(x, h0, c0, w_ih, w_hh, b, fb)

            out[f"flashrnn.{fb}"] = flash_inference
    return out


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.double() - ref).norm() / ref.norm())


def print_disagreement(results: dict[str, object], base: str = "nnforge.triton") -> None:
    """Print each other nnforge form's largest relative difference (``rel``, over its results) from ``base``'s,
    marked DISAGREES above 1e-2: a variant (other tiles, a resident loop's barrier) must compute the same
    function, or its time means nothing."""
    def parts(r: object) -> list[torch.Tensor]:
        return [t for t in (r if isinstance(r, tuple | list) else [r]) if isinstance(t, torch.Tensor)]

    want = parts(results[base])
    for name, r in results.items():
        if name != base and name.startswith("nnforge"):
            d = max((rel(g, w.double()) for g, w in zip(parts(r), want, strict=True)), default=0.0)
            print(f"  {name:16s} differs from {base} by {d:.2e}" + ("  DISAGREES" if d > 1e-2 else ""))


def accuracy(T: int, H: int, dtype: torch.dtype, device: str, training: bool, N: int, flash: str = "auto") -> None:
    """Error of nnforge, cuDNN and FlashRNN in ``dtype`` against the same layer in float64 (forward outputs; in
    training also the gradients of the weights): a fast kernel must also compute the same function."""
    torch.manual_seed(1)
    ref = torch.nn.LSTM(H, H).to(device=device, dtype=torch.float64)
    x = torch.randn(T, N, H, device=device, dtype=torch.float64)
    h0, c0 = (torch.randn(N, H, device=device, dtype=torch.float64) * 0.1 for _ in range(2))
    cot = torch.randn(T, N, H, device=device, dtype=torch.float64)
    ws = [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0 + ref.bias_hh_l0]
    ys64, _ = ref(x, (h0[None], c0[None]))
    low = torch.nn.LSTM(H, H).to(device=device, dtype=dtype)
    low.load_state_dict(ref.state_dict())
    cast = [t.to(dtype) for t in (x, h0, c0)]
    low_ws = [w.detach().to(dtype) for w in ws]
    if not training:
        with torch.no_grad():
            got = nf.compile(lstm, backend="triton")(*cast, *(w.detach().to(dtype) for w in ws))
            cudnn, _ = low(cast[0], (cast[1][None], cast[2][None]))
        print(f"  error vs float64 (N={N}): nnforge {rel(got, ys64.detach()):.2e}  "
              f"cudnn {rel(cudnn, ys64.detach()):.2e}" + "".join(
                  f"  flashrnn.{fb} {_flash_error(lambda fb=fb: rel(flashrnn_lstm(*cast, *low_ws, fb), ys64.detach()))}"
                  for fb in flashrnn_backends(H, device, flash)))
        return
    g64 = torch.autograd.grad((ys64 * cot).sum(), [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0])

    def loss(x, h0, c0, w_ih, w_hh, b, cot):
        return (lstm(x, h0, c0, w_ih, w_hh, b) * cot).sum()

    mine = nf.compile(nf.grad(loss, argnums=(3, 4, 5)), backend="triton")(
        *cast, *(w.detach().to(dtype) for w in ws), cot.to(dtype))
    ys, _ = low(cast[0], (cast[1][None], cast[2][None]))
    theirs = torch.autograd.grad((ys * cot.to(dtype)).sum(), [low.weight_ih_l0, low.weight_hh_l0, low.bias_ih_l0])
    names = ("w_ih", "w_hh", "b")
    print(f"  gradient error vs float64 (N={N}): " + "  ".join(
        f"{n} nnforge {rel(m, g):.2e} cudnn {rel(t, g):.2e}" for n, m, t, g in zip(names, mine, theirs, g64)))
    for fb in flashrnn_backends(H, device, flash):
        def flash_grads(fb: str = fb) -> str:
            leaves = [w.detach().clone().requires_grad_() for w in low_ws]
            grads = torch.autograd.grad((flashrnn_lstm(*cast, *leaves, fb) * cot.to(dtype)).sum(), leaves)
            return "  ".join(f"{n} {rel(m, g):.2e}" for n, m, g in zip(names, grads, g64))

        print(f"  gradient error vs float64, flashrnn.{fb}: {_flash_error(flash_grads)}")


def _flash_error(measure: Callable[[], object]) -> str:
    """An anchor's error, or why it could not run (its kernel may not build here)."""
    try:
        out = measure()
    except Exception as e:  # reported, as a failing anchor in bench()
        return f"failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return f"{out:.2e}" if isinstance(out, float) else str(out)


Case = tuple[str, int, int]  # (mode, hidden, batch)


def probe_anchors(cases: list[Case], T: int, dtype: str, flash: str) -> dict[Case, dict[str, str]]:
    """Each anchor's first call at each case, in child processes: an anchor that faults (cuDNN's LSTM at batch
    8448 on an H200 makes an illegal memory access, which ends the process's CUDA context) is left out of this
    run with its reason instead of ending it. Returns case -> {anchor: why it failed}."""
    items = [(case, name) for case in cases for name in ("cudnn", *(f"flashrnn.{fb}" for fb in
                                                                      flashrnn_backends(case[1], "cuda", flash)))]
    failed: dict[Case, dict[str, str]] = {}
    k = 0
    while k < len(items):
        done = subprocess.run([sys.executable, __file__, "--probe", json.dumps(items[k:]), "--steps", str(T),
                               "--dtype", dtype, "--flashrnn", flash], capture_output=True, text=True)
        reported = [line.split("\t") for line in done.stdout.splitlines() if line.startswith(("ok\t", "fail\t"))]
        for verdict, _, *why in reported:
            case, name = items[k]
            if verdict == "fail":
                failed.setdefault(tuple(case), {})[name] = why[0]
            k += 1
        if k < len(items) and (not reported or done.returncode not in (0, 3)):  # died inside that call
            case, name = items[k]
            tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
            failed.setdefault(tuple(case), {})[name] = f"the process died: {tail}"
            k += 1
    return failed


def probe_child(items: list, T: int, dtype: torch.dtype, flash: str) -> None:
    """``--probe``: call each (case, anchor) once in order, printing ok / fail; stop at the first failure (exit
    status 3), since it may have ended this process's CUDA context."""
    for (mode, H, N), name in items:
        try:
            candidates(T, N, H, dtype, "cuda", mode == "training", flash, nnforge=False)[name]()
            torch.cuda.synchronize()
        except Exception as e:
            print(f"fail\t{name}\t{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            sys.exit(3)
        print(f"ok\t{name}", flush=True)


def kernel_profile(fn: Callable[[], object], device: str, top: int = 12) -> None:
    """Where one call's time goes: each kernel (on a CPU, each operator) by its total time under torch's profiler,
    with its share and launch count — the kernels of a program have the names of what they fuse."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if device == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    field = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    rows = sorted(((getattr(e, field), e.count, e.key) for e in prof.key_averages()), reverse=True)
    total = sum(us for us, _, _ in rows) or 1.0
    print(f"  nnforge.triton, one call by {'kernel' if device == 'cuda' else 'operator'} ({total / 1e3:.3f} ms):")
    for us, count, key in rows[:top]:
        print(f"    {us / 1e3:9.3f} ms {100 * us / total:5.1f} %  x{count:<5d} {key[:90]}")


def first_calls(fns: dict[str, Callable[[], object]], device: str, failed: dict[str, str]) -> dict[str, object]:
    """Each candidate's first call's result; a candidate that cannot run here (cuDNN at batch 8448, FlashRNN
    unbuilt) leaves ``fns`` with its reason in ``failed`` — but nnforge's own failure is raised."""
    results: dict[str, object] = {}
    for name, fn in list(fns.items()):
        try:
            results[name] = fn()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:
            if name == "nnforge.triton":
                raise
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            del fns[name]
    return results


def interleaved(fns: dict[str, Callable[[], object]], rounds: int, clock: Clock) -> dict[str, float]:
    """Each candidate's median time over ``rounds`` rounds, each round timing every candidate once in turn."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(clock(fn))
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench(T: int, N: int, H: int, dtype: torch.dtype, device: str, training: bool, rounds: int,
          clock: Clock, flash: str = "auto", graphs: bool = False, known: dict[str, str] | None = None,
          variants: tuple[str, ...] = (), profile: bool = False) -> None:
    """Time nnforge and its anchors at one shape, interleaved; ``known``: anchors that failed in a probe (left
    out, reported); ``variants``: nnforge with other tiles or thresholds (``variant_options``); ``profile``:
    then one call of nnforge's by kernel (``kernel_profile``)."""
    known = known or {}
    fns = {k: f for k, f in candidates(T, N, H, dtype, device, training, flash, graphs, variants=variants).items()
           if k not in known}
    t0 = time.perf_counter()
    fns["nnforge.triton"]()  # trace, render, and compile every kernel
    if device == "cuda":
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    failed = {name: f"{why} (in a separate process)" for name, why in known.items()}
    results = first_calls(fns, device, failed)
    med = interleaved(fns, rounds, clock)
    mine = med["nnforge.triton"]
    mode = "training" if training else "inference"
    print(f"T={T} N={N} H={H} {str(dtype).removeprefix('torch.')} {mode}: first call (compile) {first:.2f} s")
    for name, t in med.items():
        ratio = "" if name == "nnforge.triton" else f"  {name} / nnforge = {t / mine:.2f}"
        print(f"  {name:16s} {t * 1e3:9.3f} ms  {t / T * 1e6:8.2f} us/step  "
              f"{flops(T, N, H, training) / t / 1e12:7.2f} TFLOP/s  "
              f"{fewest_bytes(T, N, H, dtype.itemsize, training) / t / 1e9:7.1f} GB/s{ratio}")
    for name, why in failed.items():
        print(f"  {name:16s} failed: {why}")
    print_disagreement({k: v for k, v in results.items() if k in fns})
    if profile:
        kernel_profile(fns["nnforge.triton"], device)


def bench_cells(T: int, N: int, H: int, dtype: torch.dtype, device: str, rounds: int, clock: Clock,
                variants: tuple[str, ...] = ()) -> None:
    """Cells cuDNN cannot run (layer-norm LSTM, GRU with the reset gate before its matmul, peephole LSTM),
    inference: nnforge (and nnforge with each of ``variants``, ``variant_options``) against the same cell as a
    TorchScript loop and as a Python loop of a ``torch.compile``-d cell (bench/cells_cpu.py's definitions, input
    projection hoisted), and cuDNN's standard LSTM at the same shape (what a custom cell should come close to)."""
    torch.manual_seed(2)
    s = 1.0 / H ** 0.5

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device) * s).to(dtype)

    x, h0, c0 = torch.randn(T, N, H, device=device, dtype=dtype), rnd(N, H), rnd(N, H)
    cudnn = torch.nn.LSTM(H, H).to(device=device, dtype=dtype)
    models = {
        "layer-norm LSTM": (cells_cpu.nf_ln_lstm, cells_cpu.t_ln_lstm_loop, "t_ln_lstm_cell",
                            (x, h0, c0, rnd(4 * H, H), rnd(4 * H, H), rnd(4 * H))),
        "GRU (reset before matmul)": (cells_cpu.nf_gru_cho, cells_cpu.t_gru_cho_loop, "t_gru_cho_cell",
                                      (x, h0, rnd(3 * H, H), rnd(2 * H, H), rnd(H, H), rnd(3 * H))),
        "peephole LSTM": (cells_cpu.nf_peephole_lstm, cells_cpu.t_peephole_loop, "t_peephole_cell",
                          (x, h0, c0, rnd(4 * H, H), rnd(4 * H, H), rnd(4 * H), rnd(3 * H))),
    }
    for name, (nf_model, loop, cell, args) in models.items():
        fwd = nf.compile(nf_model, backend="triton")
        others = {f"nnforge[{v}]": nf.compile(nf_model, backend="triton", options=variant_options(v)) for v in variants}
        scripted = torch.jit.script(loop)
        compiled, _ = cells_cpu.compiled_loop(loop, cell)
        with torch.no_grad():
            want = loop(*(a.double() for a in args))
            eager = rel(loop(*args), want)
            t0 = time.perf_counter()
            compiled(*args)
            torch.cuda.synchronize() if device == "cuda" else None
            first = time.perf_counter() - t0
            err = rel(fwd(*args)[0], want)

            fns = {"nnforge.triton": lambda f=fwd, a=args: f(*a), "TorchScript": lambda f=scripted, a=args: f(*a),
                   "torch.compile": lambda f=compiled, a=args: f(*a),
                   "cuDNN std LSTM": lambda: cudnn(x, (h0[None], c0[None]))}
            fns |= {k: lambda f=f, a=args: f(*a) for k, f in others.items()}
            results = {k: fn() for k, fn in fns.items()}
            med = interleaved(fns, rounds, clock)
        mine = med["nnforge.triton"]
        print(f"{name} T={T} N={N} H={H} {str(dtype).removeprefix('torch.')} inference "
              f"(error vs float64: nnforge {err:.2e}, the eager loop {eager:.2e}; "
              f"torch.compile first call {first:.1f} s)")
        for k, t in med.items():
            ratio = "" if k == "nnforge.triton" else f"  {k} / nnforge = {t / mine:.2f}"
            print(f"  {k:16s} {t * 1e3:9.3f} ms  {t / T * 1e6:8.2f} us/step{ratio}")
        print_disagreement(results)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, nargs="+", help="with --batch: every pair (default: the issue's table)")
    p.add_argument("--batch", type=int, nargs="+")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    p.add_argument("--mode", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--cells", type=int, nargs=2, metavar=("BATCH", "HIDDEN"),
                   help="also time the custom cells (layer-norm LSTM, GRU, peephole LSTM) at this shape, inference")
    p.add_argument("--flashrnn", default="auto", metavar="BACKENDS",
                   help="FlashRNN anchors: auto (cuda_fused, and triton_fused where H <= 64), none, or a list")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also time nnforge with CUDA graphs forced off (nnforge-graphs) and on (nnforge+graphs); "
                        "nnforge.triton is the default: graphs where a program has a host loop")
    p.add_argument("--variant", nargs="+", default=[], metavar="NAME=VALUE,...",
                   help="also time nnforge with these tiles or target thresholds (e.g. scan_pieces=0 or "
                        "split_k_outputs=0), interleaved with the default")
    p.add_argument("--cell-variant", nargs="+", default=[], metavar="NAME=VALUE,...",
                   help="with --cells, also time each custom cell with these tiles or target thresholds (e.g. "
                        "hoist_step_work=1), interleaved")
    p.add_argument("--profile", action="store_true", help="also print one nnforge call's time by kernel")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under Triton's interpreter")
    p.add_argument("--probe", help=argparse.SUPPRESS)  # probe_anchors' child: a JSON list of (case, anchor)
    a = p.parse_args()
    if a.probe:
        return probe_child(json.loads(a.probe), a.steps, getattr(torch, a.dtype), a.flashrnn)
    if a.smoke:
        a.hidden, a.batch, a.steps, a.rounds, a.dtype, a.cells = [16], [4], 3, 1, "float32", (4, 16)
    device = "cpu" if a.smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/lstm_gpu.py needs a CUDA device (or --smoke)")
    dtype = getattr(torch, a.dtype)
    clock = Clock(device)
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (Triton interpreter, smoke run)"
    print(f"device: {name}; dense {a.dtype} GEMM peak measured {gemm_peak(device, dtype, clock):.1f} TFLOP/s, "
          f"copy {copy_peak(device, clock):.0f} GB/s (read + write)")
    shapes = [(H, N) for H in a.hidden or [96, 384, 1024] for N in a.batch or []] or list(TABLE)
    cases = [(mode, H, N) for mode in a.mode for H, N in shapes]
    known = probe_anchors(cases, a.steps, a.dtype, a.flashrnn) if device == "cuda" else {}
    for mode in a.mode:
        for H in dict.fromkeys(H for H, _ in shapes):
            for N in (N for h, N in shapes if h == H):
                bench(a.steps, N, H, dtype, device, mode == "training", a.rounds, clock, a.flashrnn,
                      a.cuda_graphs, known.get((mode, H, N)), tuple(a.variant), a.profile)
            accuracy(a.steps, H, dtype, device, mode == "training", min(N for h, N in shapes if h == H), a.flashrnn)
    if a.cells:
        bench_cells(a.steps, a.cells[0], a.cells[1], dtype, device, a.rounds, clock, tuple(a.cell_variant))


if __name__ == "__main__":
    main()
