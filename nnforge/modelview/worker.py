"""The worker process: measures the backends of one setting and appends a row per cell to the store.

Run as ``python -m nnforge.modelview.worker JOB.json``. It is a separate process (never a fork of the parent) so that
a segfault, a hang or a runaway allocation in one setting cannot take the sweep with it; see ``isolation.py`` for the
parent side. The worker reports progress as JSON lines to the job's ``events`` file (phase markers, heartbeats, rows)
so that the parent can enforce a no-progress timeout and, after a crash, knows which backend was running.

Order within a setting: build the float64 module and inputs once → eager float64 reference → for each backend:
prepare (compile time), first call, numerical check → time all passing backends together in interleaved rounds →
per-backend counters → one row each.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _limit_memory(memory_mb: int, device: str) -> None:
    """RLIMIT_AS makes a runaway allocation fail inside the worker (a clean 'oom' row) instead of swapping the
    machine. CUDA maps huge virtual ranges, so on GPU runs — and with a CUDA build of torch, for CPU cells too —
    only the parent's resident-set watchdog applies."""
    if memory_mb <= 0 or device != "cpu" or _cuda_build():
        return
    try:
        import resource

        limit = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, ValueError, OSError):
        pass


def _cuda_build() -> bool:
    """Whether the torch this worker imports is a CUDA build. Such a build maps gigabytes of CUDA libraries at import
    and reserves more address space when CUDA initialises (which torch.compile may do for a CPU cell too): on an H100
    machine the CPU workers of the isolation tests, limited to 2 GiB of address space, failed before running a cell."""
    try:
        import torch
    except ImportError:
        return False
    return torch.version.cuda is not None


def _die_with_parent() -> None:
    """If the parent is killed (even with -9), the worker gets SIGKILL too instead of running on unobserved. A parent
    that died while this interpreter started (a Ray worker killed mid-task) is caught by the parent pid check."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    parent = os.environ.get("MODELVIEW_PARENT_PID")
    if parent and os.getppid() != int(parent):
        os._exit(1)


class Events:
    """Append-only JSON lines, flushed per line: what the parent reads to follow the worker."""

    def __init__(self, path: str) -> None:
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the worker

    def emit(self, event: str, **fields: Any) -> None:
        self._f.write(json.dumps({"event": event, "t": time.time(), **fields}) + "\n")
        self._f.flush()


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return "out of memory" in text or "can't allocate memory" in text or "outofmemoryerror" in text


def energy_per_item(metrics: dict[str, Any], items: float) -> dict[str, float]:
    """Joules per item of the cell's throughput (a vector, a sequence, a raw sample: what one inference is), from
    the NVML energy per call; nothing where that is unknown."""
    energy = metrics.get("energy_per_call_j")
    if not isinstance(energy, int | float) or not items > 0:
        return {}
    return {"energy_per_item_j": energy / items}


def free_cuda_cache() -> None:
    """After a GPU out-of-memory error in one cell, what the failed attempt allocated goes back to the device, so
    the setting's next backends run on the same GPU (the cell itself is an "oom" row)."""
    import torch

    gc.collect()
    torch.cuda.empty_cache()


def error_text(exc: BaseException, limit: int = 4000) -> str:
    tb = "".join(traceback.format_exception(exc))
    return tb if len(tb) <= limit else tb[: limit // 4] + "\n...\n" + tb[-3 * limit // 4 :]


def _flatten(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, list | tuple):
        return [t for o in out for t in _flatten(o)]
    raise TypeError(f"outputs must be tensors or (nested) tuples of tensors, got {type(out).__name__}")


def check_close(got: list[Any], ref: list[Any], atol: float, rtol: float) -> tuple[bool, float, str]:
    """(ok, max |error|, message). Per output, element-wise |got - ref| <= atol·scale + rtol·|ref| with
    scale = max(1, max |ref|) of that output, computed in float64.

    Why the scale: a weight gradient is a sum over batch and time (N·T products), and its rounding error grows
    with the size of its largest elements, not with each element's own size. Measured on a 256-wide LSTM at
    N = 64, T = 64, eager PyTorch itself was off by up to 2 % of the gradient's largest element in bfloat16 and
    0.2 % in float16 (elements up to ~70), which a fixed atol of 0.1 / 0.03 called a mismatch for every backend.
    Outputs within [-1, 1] (an LSTM's) are judged exactly as before."""
    import torch

    if len(got) != len(ref):
        return False, float("inf"), f"{len(got)} outputs, reference has {len(ref)}"
    max_err, worst, msg = 0.0, 0.0, ""
    for i, (g, r) in enumerate(zip(got, ref)):
        if g is None:
            return False, float("inf"), f"output/gradient {i} is missing"
        g64 = g.detach().to("cpu", torch.float64)
        if tuple(g64.shape) != tuple(r.shape):
            return False, float("inf"), f"output {i} has shape {tuple(g64.shape)}, reference {tuple(r.shape)}"
        if not torch.isfinite(g64).all():
            return False, float("inf"), f"output {i} has non-finite values"
        diff = (g64 - r).abs()
        scale = max(1.0, float(r.abs().max())) if r.numel() else 1.0
        bound = atol * scale + rtol * r.abs()
        ratio = float((diff / bound).max()) if diff.numel() else 0.0
        err = float(diff.max()) if diff.numel() else 0.0
        max_err = max(max_err, err)
        if ratio > worst:
            worst = ratio
            idx = int((diff / bound).argmax())
            msg = (
                f"output {i}: |err| = {float(diff.flatten()[idx]):.3g} at flat index {idx} exceeds "
                f"atol·scale + rtol·|ref| = {float(bound.flatten()[idx]):.3g} (atol={atol:g}, rtol={rtol:g}, "
                f"scale = max(1, max |ref|) = {scale:.3g})"
            )
    return worst <= 1.0, max_err, msg


def cuda_peak_bytes(max_allocated: int, allocated_before: int) -> int:
    """A backend's CUDA peak: the allocator's high-water mark since the reset, less what was allocated before the
    backend's module copy and inputs were made (the setting's earlier backends, still alive in this worker). Without
    the subtraction every backend's figure would include those of the backends prepared before it."""
    return max(0, int(max_allocated) - int(allocated_before))


def cpu_peak_bytes(peak_rss: int | None, rss_before: int | None) -> int | None:
    """A backend's own CPU memory: the worker's resident high-water mark since the reset, less its resident set at the
    reset (interpreter, torch, the model's reference copy and the earlier backends, ~300 MB that every row showed)."""
    if peak_rss is None:
        return None
    return max(0, int(peak_rss) - int(rss_before or 0))


def float32_is_float32() -> None:
    """Make float32 cells compute in float32 on GPUs. cuDNN's default lets RNNs and convolutions round their float32
    operands to TF32 (a 10-bit mantissa) while cuBLAS matmuls stay in float32, so ``torch.nn.LSTM`` and a hand-written
    LSTM of the same float32 cell were measured at different precisions — and the TF32 one failed the float64 check in
    training on an H100 (weight-gradient error 7e-3, every backend alike). TF32 is not a ModelView dtype."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def _warm_gpu_libraries(module64: Any, inputs64: tuple[Any, ...], cot: list[Any], device: Any, dtype: Any,
                        training: bool) -> None:
    """One eager call (and backward) of a throw-away copy before any backend: cuBLAS allocates its workspace per
    stream on first use (32 MiB on Hopper GPUs) and keeps it, so without this the first backend of a setting — eager —
    had that workspace in its peak memory and the others did not. Best effort: a module that fails here fails again,
    with its own row, in the backends that run it."""
    import copy

    import torch

    with contextlib.suppress(Exception):
        warm = copy.deepcopy(module64).to(device, dtype).train(training)
        xs = tuple(x.to(device, dtype) if x.is_floating_point() else x.to(device) for x in inputs64)
        if training:
            torch.autograd.backward(_flatten(warm(*xs)), [c.to(device, dtype) for c in cot])
        else:
            with torch.no_grad():
                warm(*xs)
        torch.cuda.synchronize()


class Harness:
    """One setting in one process. Holds the job, the store connection and the event stream."""

    def __init__(self, job: dict[str, Any]) -> None:
        from .spec import Cell, TimingConfig
        from .store import Store, cell_identity

        self.job = job
        self.cells = [Cell.from_dict(c) for c in job["cells"]]
        self.timing = TimingConfig(**job["timing"])
        self.events = Events(job["events"])
        self.store = Store(job["db"])
        self.run_id = job["run_id"]
        self.peaks = job.get("peaks") or {}
        self.done: set[str] = set()
        self._identity = cell_identity

    # -- rows ----------------------------------------------------------------------------------------------------
    def write(self, cell: Any, status: str, started: float, **fields: Any) -> None:
        row = self._identity(self.run_id, cell) | {"status": status, "started": started, "finished": time.time()}
        row |= fields
        self.store.append_cell(row)
        self.done.add(cell.key)
        self.events.emit("row", cell_key=cell.key, backend=cell.backend, status=status)

    def fail_remaining(self, status: str, error: str, started: float) -> None:
        for cell in self.cells:
            if cell.key not in self.done:
                self.write(cell, status, started, error=error)

    # -- the setting ---------------------------------------------------------------------------------------------
    def run(self) -> None:
        started = time.time()
        self.events.emit("phase", phase="setup", backend=None)
        if self.cells[0].device == "cuda":
            import torch

            if not torch.cuda.is_available():
                for cell in self.cells:
                    self.write(cell, "skipped", started, error="no CUDA device on this machine")
                return
        try:
            setup = self._setup()
        except Exception as e:
            self.fail_remaining("oom" if is_oom(e) else "failed", "setting setup failed: " + error_text(e), started)
            return
        ready: dict[str, dict[str, Any]] = {}
        for cell in self.cells:
            st = self._prepare_and_check(cell, setup)
            if st is not None:
                ready[cell.backend] = st
        if ready:
            self._time_and_record(ready, setup)

    def _setup(self) -> dict[str, Any]:
        import random

        import torch

        from .registry import load_ref
        from .variants.base import Request

        threads = int(self.job["threads"])
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # settable only before any inter-op parallel work
            torch.set_num_interop_threads(1)
        first = self.cells[0]
        variant = load_ref(self.job["variant_ref"])()
        req = Request(first.batch, first.seq_len, first.layout, first.params_dict)
        seed = int(self.job["seed"])
        torch.manual_seed(seed)
        random.seed(seed)
        module64 = variant.module(req).to(torch.float64)
        gen = torch.Generator().manual_seed(seed + 1)
        inputs64 = [tuple(variant.inputs(req, gen)) for _ in range(self.timing.rotate_inputs)]
        training = first.mode == "training"
        module64.train(training)
        if training:
            out = module64(*inputs64[0])
            ref_out = [t.detach() for t in _flatten(out)]
            cot = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in ref_out]
            params = [p for p in module64.parameters() if p.requires_grad]
            grads = torch.autograd.grad(_flatten(out), params, cot, allow_unused=True)
            ref_grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)]
        else:
            with torch.no_grad():
                ref_out = [t.detach() for t in _flatten(module64(*inputs64[0]))]
            cot, ref_grads = [], []
        device = torch.device(first.device)
        dtype = getattr(torch, first.dtype)
        if device.type == "cuda":
            float32_is_float32()
            _warm_gpu_libraries(module64, inputs64[0], cot, device, dtype, training)
        return {
            "variant": variant,
            "request": req,
            "module64": module64,
            "inputs64": inputs64,
            "ref": ref_out + ref_grads,
            "cotangents": cot,
            "device": device,
            "dtype": dtype,
            "threads": threads,
            "training": training,
        }

    def _cast_inputs(self, setup: dict[str, Any]) -> list[tuple[Any, ...]]:
        dev, dt = setup["device"], setup["dtype"]
        return [
            tuple(x.to(dev, dt) if x.is_floating_point() else x.to(dev) for x in inputs) for inputs in setup["inputs64"]
        ]

    def _make_step(self, prepared: Any, ctx: Any, setup: dict[str, Any]) -> Any:
        import torch

        fn = prepared.fn
        if not setup["training"]:

            def infer(*inputs: Any) -> Any:
                with torch.no_grad():
                    return fn(*inputs)

            return infer
        params = prepared.parameters if prepared.parameters is not None else list(ctx.module.parameters())
        params = [p for p in params if p.requires_grad]
        cots = [c.to(setup["device"], setup["dtype"]) for c in setup["cotangents"]]
        if prepared.train is not None:
            own = prepared.train(cots)
            own.params = params  # type: ignore[attr-defined]
            return own

        def train_step(*inputs: Any) -> Any:
            for p in params:
                p.grad = None
            out = fn(*inputs)
            torch.autograd.backward(_flatten(out), cots)
            return out

        train_step.params = params  # type: ignore[attr-defined]
        return train_step

    def _sync(self, setup: dict[str, Any]) -> None:
        if setup["device"].type == "cuda":
            import torch

            torch.cuda.synchronize()

    def _prepare_and_check(self, cell: Any, setup: dict[str, Any]) -> dict[str, Any] | None:
        import copy

        import torch

        from . import compilecache
        from .backends.base import Context
        from .metrics import peak_rss, reset_peak_rss
        from .registry import load_ref

        started = time.time()
        self.events.emit("phase", phase="prepare", backend=cell.backend)
        cuda = setup["device"].type == "cuda"
        cuda_before = 0
        rss_before = None if cuda else (reset_peak_rss() and peak_rss())  # before the module copy, as on CUDA
        if cuda:
            # Earlier backends of this setting keep their modules, inputs, graphs and pools alive in this process:
            # the backend's own peak is measured from what is allocated before its module copy and inputs exist.
            self._sync(setup)
            torch.cuda.reset_peak_memory_stats()
            cuda_before = torch.cuda.memory_allocated()
        try:
            backend = load_ref(self.job["backend_refs"][cell.backend])()
            module = copy.deepcopy(setup["module64"]).to(setup["device"], setup["dtype"])
            module.train(setup["training"])
            inputs = self._cast_inputs(setup)
            ctx = Context(cell, setup["variant"], setup["request"], module, inputs[0], setup["device"],
                          setup["dtype"], setup["threads"])
            reason = backend.skip_reason(ctx)
            oom = False
        except Exception as e:
            self.write(cell, "oom" if is_oom(e) else "failed", started, error=error_text(e))
            oom = True if is_oom(e) else None
        if oom is not False:  # out of the except block: the failed attempt's frames (and tensors) are gone
            if oom and cuda:
                free_cuda_cache()
            return None
        if reason is not None:
            self.write(cell, "skipped", started, error=reason)
            return None
        compile_s = first_s = None
        cache_dirs = compilecache.cache_dirs(cell.backend)
        cache_before = compilecache.snapshot(cache_dirs)
        try:
            t0 = time.perf_counter()
            prepared = backend.prepare(ctx)
            step = self._make_step(prepared, ctx, setup)
            if backend.lazy:
                step(*inputs[0])
                self._sync(setup)
            compile_s = time.perf_counter() - t0 if backend.compiles else None
            cache = compilecache.verdict(cache_dirs, cache_before, compilecache.snapshot(cache_dirs))
            self.events.emit("phase", phase="check", backend=cell.backend)
            t0 = time.perf_counter()
            out = step(*inputs[0])
            self._sync(setup)
            first_s = time.perf_counter() - t0
            got = [t.detach().clone() for t in _flatten(out)]
            if setup["training"]:
                got += [p.grad.detach().clone() if p.grad is not None else None for p in step.params]
            process_peak = None if cuda else peak_rss()
            peak = (cuda_peak_bytes(torch.cuda.max_memory_allocated(), cuda_before) if cuda
                    else cpu_peak_bytes(process_peak, rss_before))
            oom = False
        except Exception as e:
            self.write(cell, "oom" if is_oom(e) else "failed", started, error=error_text(e),
                       compile_s=compile_s, first_call_s=first_s)
            oom = True if is_oom(e) else None
        if oom is not False:
            if oom and cuda:
                free_cuda_cache()
            return None
        atol, rtol = self.job["tolerance"]
        if self.job.get("check", True):
            ok, max_err, msg = check_close(got, setup["ref"], atol, rtol)
        else:
            ok, max_err, msg = True, None, ""
        mem = {"peak_mem_kind": "cuda_max_memory_allocated_over_before" if cuda else "process_vmhwm_over_before",
               "rss_before_bytes": rss_before or None, **cache}
        if not cuda:
            mem["process_peak_rss_bytes"] = process_peak
        if cuda:
            mem["cuda_allocated_before_bytes"] = cuda_before
        if not ok:
            self.write(cell, "mismatch", started, error=msg, compile_s=compile_s, first_call_s=first_s,
                       max_abs_err=max_err, peak_mem_bytes=peak, artifact=prepared.artifact,
                       metrics_json={**mem, **prepared.info})
            return None
        calls = [(lambda s=step, x=x: s(*x)) for x in inputs]
        return {"cell": cell, "started": started, "compile_s": compile_s, "first_call_s": first_s,
                "max_abs_err": max_err, "peak": peak, "prepared": prepared, "calls": calls, "mem": mem}

    def _time_and_record(self, ready: dict[str, dict[str, Any]], setup: dict[str, Any]) -> None:
        import random

        import torch

        from . import metrics as mt
        from .stats import median_ci, percentiles
        from .timer import CpuClock, CudaEventClock, measure, measure_naive

        cfg = self.timing
        cuda = setup["device"].type == "cuda"
        clock = CudaEventClock() if cuda else CpuClock(cfg.clock)

        def rotating(calls: list[Any]) -> Any:
            state = {"i": 0}

            def call() -> Any:
                c = calls[state["i"] % len(calls)]
                state["i"] += 1
                return c()

            return call

        fns = {b: rotating(st["calls"]) for b, st in ready.items()}
        flush = None
        if cfg.flush_cache:
            buf = torch.empty(cfg.flush_bytes // 4, dtype=torch.float32, device=setup["device"])

            def flush() -> None:
                buf.add_(1.0)
                self._sync(setup)

        sampler = None
        if cuda and cfg.nvml:
            try:
                sampler = mt.NvmlSampler(setup["device"].index or 0)
            except Exception as e:
                for st in ready.values():
                    st["mem"]["nvml"] = f"unavailable: {type(e).__name__}: {e}"
        sync = functools.partial(self._sync, setup)
        interleaved = len(ready) > 1 and cfg.method == "adaptive"
        self.events.emit("phase", phase="timing", backend=None, backends=list(ready))

        def heartbeat(rounds: int, series: Any) -> None:
            self.events.emit("heartbeat", rounds=rounds)

        t_timing = time.time()
        load_start = _loadavg()
        if cfg.method == "naive":
            series = {}
            for b, fn in fns.items():
                self.events.emit("phase", phase="timing", backend=b, backends=[b])
                try:
                    series[b] = measure_naive(fn, cfg, clock)
                except Exception as e:
                    from .timer import Series

                    series[b] = Series(error=f"{type(e).__name__}: {e}", done=True)
        else:
            series = measure(fns, cfg, clock, flush, heartbeat, random.Random())
        perf = mt.PerfCounters() if (cfg.perf_counters and not cuda) else None
        with contextlib.ExitStack() as cleanup:
            if perf is not None:
                cleanup.callback(perf.close)
            if sampler is not None:  # its thread samples only inside each backend's window (NvmlSampler.window)
                cleanup.enter_context(sampler)
            for b, st in ready.items():
                cell, s = st["cell"], series[b]
                if s.error:
                    self.write(cell, "failed", st["started"], error=s.error, compile_s=st["compile_s"],
                               first_call_s=st["first_call_s"])
                    continue
                self.events.emit("phase", phase="metrics", backend=b)
                med, lo, hi = median_ci(s.samples, cfg.confidence)
                variant, req = setup["variant"], setup["request"]
                itemsize = torch.empty((), dtype=setup["dtype"]).element_size()
                flops = float(variant.flops(req)) * (3.0 if setup["training"] else 1.0)
                nbytes = float(variant.min_bytes(req, itemsize)) * (2.0 if setup["training"] else 1.0)
                m: dict[str, Any] = {
                    **st["mem"],
                    **st["prepared"].info,
                    "latency_s": percentiles(s.samples),
                    "samples": len(s.samples),
                    "sample_rounds": s.rounds,  # the units of stats.estimate: ratios are taken inside a round
                    "round_samples": cfg.round_samples,
                    "calls_per_sample": s.inner,
                    "warmup_calls": s.warmup_calls,
                    "warmup_s": s.warmup_s,
                    "warmup_steady": s.steady,
                    "ci_converged": s.converged,
                    "stop_reason": s.stop_reason,
                    "rel_ci": (max(med - lo, hi - med) / med) if med > 0 else None,
                    "interleaved": interleaved,
                    "alone": bool(self.job.get("alone")),
                    "process_repeat": self.job.get("repeat"),
                    "timing_method": cfg.method,
                    "clock": clock.name,
                    **_secondary(s, cfg.clock, setup["threads"]),
                    "threads": setup["threads"],
                    "rotate_inputs": cfg.rotate_inputs,
                    "flush_cache": cfg.flush_cache,
                    "timing_wall_s": time.time() - t_timing,
                    "loadavg_1m": [load_start, _loadavg()],  # a busy machine (load > CPUs) explains a wide CI
                }
                peak_f = (self.peaks.get("peak_flops_by_dtype") or {}).get(cell.dtype)
                peak_b = self.peaks.get("peak_bytes_per_s")
                ach_f, ach_b = flops / med, nbytes / med
                m["flops_fraction_of_peak"] = ach_f / peak_f if peak_f and peak_f == peak_f else None
                m["bytes_fraction_of_peak"] = ach_b / peak_b if peak_b else None
                m.update(_counters(b, fns[b], med, perf, cuda and cfg.profile_kernels, sampler, sync))
                m.update(energy_per_item(m, variant.items(req)))
                self.write(
                    cell, "ok", st["started"],
                    compile_s=st["compile_s"], first_call_s=st["first_call_s"],
                    median_s=med, ci_low_s=lo, ci_high_s=hi,
                    throughput=variant.items(req) / med, throughput_unit=variant.throughput_unit,
                    flops=flops, bytes=nbytes, achieved_flops=ach_f, achieved_bytes_per_s=ach_b,
                    peak_mem_bytes=st["peak"], max_abs_err=st["max_abs_err"],
                    metrics_json=m, samples_json=s.samples, artifact=st["prepared"].artifact,
                )


def _counters(name: str, fn: Callable[[], Any], median_s: float, perf: Any, profile_kernels: bool, sampler: Any,
              sync: Callable[[], None]) -> dict[str, Any]:
    """A backend's counters, taken after the timing by calling ``fn`` again: CPU perf counters (``perf``, for
    ~0.2 s of calls), the GPU kernel profile, NVML telemetry in the backend's own window (``sampler``). A counter
    that fails or is unavailable says so under its key; the timing stands either way."""
    from . import metrics as mt

    m: dict[str, Any] = {}

    def take(key: str, read: Callable[[], dict[str, Any]]) -> None:
        try:
            m.update(read())
        except Exception as e:
            m[key] = f"failed: {type(e).__name__}: {e}"

    if perf is not None and not perf.available:
        m["perf"] = f"unavailable: {perf.reason}"
    elif perf is not None:
        take("perf", lambda: perf.count(fn, max(1, min(1000, int(0.2 / max(median_s, 1e-9))))))
    if profile_kernels:
        take("kernel_profile", lambda: mt.gpu_kernel_profile(fn))
    if sampler is not None:
        take("nvml", lambda: sampler.summary(name, sampler.window(name, fn, sync), median_s))
    return m


def _secondary(series: Any, primary: str, threads: int) -> dict[str, Any]:
    """The other clock's median, and the fraction of wall time the process spent on a CPU (per thread): well below 1
    with one thread means the process waited for a core — the cell was measured on a busy machine."""
    if not series.secondary:
        return {}
    import numpy as np

    other = float(np.median(series.secondary))
    main = float(np.median(series.samples))
    wall, cpu = (main, other) if primary == "wall" else (other, main)
    name = "cpu_time_median_s" if primary == "wall" else "wall_time_median_s"
    return {name: other, "on_cpu_fraction": (cpu / wall / max(1, threads)) if wall > 0 else None}


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def run_peaks(job: dict[str, Any]) -> None:
    """Measure machine peaks and the environment with the sweep's thread setting; writes JSON to job['out']."""
    import torch

    from .metrics import environment, machine_peaks

    threads = int(job["threads"])
    torch.set_num_threads(threads)
    device = job["device"] if job["device"] != "cuda" or torch.cuda.is_available() else "cpu"
    if device == "cuda":
        float32_is_float32()  # as in the setting workers: the float32 peak is a float32 peak
    env = environment(threads)
    if job.get("measure_peaks", True):
        try:
            env.update(machine_peaks(device, job["dtypes"]))
        except Exception as e:
            env["peak_error"] = f"{type(e).__name__}: {e}"
    Path(job["out"]).write_text(json.dumps(env, default=str))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(argv[0]).read_text())
    _die_with_parent()
    _limit_memory(int(job.get("memory_mb", 0)), job.get("device", "cpu"))
    if job["kind"] == "peaks":
        run_peaks(job)
        return 0
    harness = Harness(job)
    try:
        harness.run()
    except BaseException as e:  # a bug in the harness itself must still leave rows
        harness.fail_remaining("oom" if is_oom(e) else "failed", "worker error: " + error_text(e), time.time())
        raise
    finally:
        harness.events.emit("exit")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
