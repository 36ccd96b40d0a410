"""Everything measured besides time: machine peaks, memory, hardware counters, GPU telemetry, the environment.

Each probe degrades to "unavailable: why" instead of failing: a VM without PMU access, a machine without NVML or a
CPU-only torch must still produce a complete sweep, and the row must say what could not be measured.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import importlib.metadata
import os
import platform
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

# -- environment ----------------------------------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def git_commit(start: str | Path | None = None) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout containing ``start`` (default: the current directory)."""
    cwd = str(start or Path.cwd())
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
        )
        return {"git_commit": commit, "git_dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}


def library_versions(names: Iterable[str] = (
    "torch", "numpy", "scipy", "pandas", "onnx", "onnxruntime", "triton", "torch_tensorrt", "nvidia-ml-py", "nnforge",
)) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


def environment(threads: int) -> dict[str, Any]:
    """The fingerprint stored with every run (peaks are added by the runner once measured)."""
    import torch

    env: dict[str, Any] = {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_available": available_cpus(),
        "threads": threads,
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "torch_config": {
            "mkldnn": torch.backends.mkldnn.is_available(),
            "openmp": torch.backends.openmp.is_available(),
        },
        "libraries": library_versions(),
        "gpu_model": None,
        "gpu_driver": None,
        "cuda": torch.version.cuda,
        **git_commit(Path(__file__).resolve().parent),
    }
    env["torch"] = env["libraries"].get("torch")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env["gpu_model"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu_memory_bytes"] = props.total_memory
        env["gpu_sm_count"] = props.multi_processor_count
        env["gpu_capability"] = f"{props.major}.{props.minor}"
        env["cudnn"] = torch.backends.cudnn.version()
        env["torch_config"]["cuda_matmul_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        env["torch_config"]["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32
        with contextlib.suppress(Exception):
            import pynvml

            pynvml.nvmlInit()
            env["gpu_driver"] = _s(pynvml.nvmlSystemGetDriverVersion())
            h = nvml_handle(pynvml, 0, cuda_uuid(0))
            env["gpu_power_limit_w"] = pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            env["gpu_sm_clock_max_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
    return env


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


# -- machine peaks ---------------------------------------------------------------------------------------------------


def machine_peaks(device: str, dtypes: Iterable[str], budget_s: float = 2.0) -> dict[str, Any]:
    """Measured (not datasheet) peaks, best of several tries: matmul FLOP/s per dtype and copy bandwidth.
    Achieved FLOP/s and bytes/s of a cell are reported as fractions of these."""
    import torch

    dev = torch.device(device)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def best(fn: Callable[[], Any], tries: int, limit: float) -> float:
        fn()
        sync()
        out = float("inf")
        t_end = time.perf_counter() + limit
        for _ in range(tries):
            t0 = time.perf_counter()
            fn()
            sync()
            out = min(out, time.perf_counter() - t0)
            if time.perf_counter() > t_end:
                break
        return out

    per = budget_s / (len(list(dtypes)) + 1)
    flops: dict[str, float] = {}
    for name in dtypes:
        dt = getattr(torch, name)
        n = 4096 if dev.type == "cuda" else (1024 if name in ("float32", "float64") else 512)
        try:
            a = torch.randn(n, n, device=dev).to(dt)
            b = torch.randn(n, n, device=dev).to(dt)
            t = best(lambda a=a, b=b: torch.mm(a, b), 10, per)
            flops[name] = 2 * n**3 / t
        except Exception as e:  # e.g. no half-precision matmul kernel on this CPU
            flops[name] = float("nan")
            flops[f"{name}_error"] = f"{type(e).__name__}: {e}"  # type: ignore[assignment]
    nbytes = (1 << 30) if dev.type == "cuda" else (1 << 27)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    t = best(lambda: dst.copy_(src), 10, per)
    bw = 2 * nbytes / t  # read + write
    return {
        "peak_flops": flops.get("float32", next(iter(flops.values()), float("nan"))),
        "peak_flops_by_dtype": flops,
        "peak_bytes_per_s": bw,
        "peak_method": f"best-of torch.mm n×n and a {nbytes >> 20} MiB copy on {device}",
    }


# -- memory ----------------------------------------------------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Reset the kernel's resident-set high-water mark (VmHWM) of this process; Linux >= 4.0."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    """VmHWM of this process, bytes."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        return None


def current_rss() -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return None


# -- CPU hardware counters (perf_event_open) -------------------------------------------------------------------------

_PERF_SYSCALL = {"x86_64": 298, "aarch64": 241, "ppc64le": 319}
_PERF_TYPE_HARDWARE = 0
_HW = {"cycles": 0, "instructions": 1}
_IOC_ENABLE, _IOC_DISABLE, _IOC_RESET = 0x2400, 0x2401, 0x2403


class PerfCounters:
    """Instructions and cycles of this process's user-space code, counted by the kernel (what ``perf stat`` reads),
    opened per thread so intra-op worker threads count too. ``available`` is False with ``reason`` when the kernel or
    the VM does not expose the PMU."""

    def __init__(self) -> None:
        self.fds: dict[str, list[int]] = {k: [] for k in _HW}
        self.available = False
        self.reason = ""
        nr = _PERF_SYSCALL.get(platform.machine())
        if nr is None:
            self.reason = f"perf_event_open syscall number unknown on {platform.machine()}"
            return
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._libc = libc
        try:
            tids = [int(t) for t in os.listdir("/proc/self/task")]
        except OSError as e:
            self.reason = f"cannot list threads: {e}"
            return
        for name, config in _HW.items():
            # struct perf_event_attr, PERF_ATTR_SIZE_VER0 = 64 bytes: type, size, config, sample_period, sample_type,
            # read_format, flags (disabled=bit0, exclude_kernel=bit5, exclude_hv=bit6), wakeup_events, bp_type, bp_addr
            flags = (1 << 0) | (1 << 5) | (1 << 6)
            attr = struct.pack("IIQQQQQIIQ", _PERF_TYPE_HARDWARE, 64, config, 0, 0, 0, flags, 0, 0, 0)
            buf = ctypes.create_string_buffer(attr, 64)
            for tid in tids:
                fd = libc.syscall(nr, buf, ctypes.c_int(tid), ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0))
                if fd < 0:
                    err = ctypes.get_errno()
                    if not self.fds[name]:
                        self.close()
                        self.reason = f"perf_event_open({name}) failed: {errno.errorcode.get(err, err)} " + (
                            "(no PMU access: VM or kernel.perf_event_paranoid)"
                        )
                        return
                    continue  # a thread that exited meanwhile
                self.fds[name].append(fd)
        self.available = True

    def _ioctl(self, req: int) -> None:
        for fds in self.fds.values():
            for fd in fds:
                self._libc.ioctl(fd, req, 0)

    def count(self, fn: Callable[[], Any], calls: int) -> dict[str, float]:
        """Counts per call of ``fn`` over ``calls`` calls."""
        self._ioctl(_IOC_RESET)
        self._ioctl(_IOC_ENABLE)
        for _ in range(calls):
            fn()
        self._ioctl(_IOC_DISABLE)
        out = {}
        for name, fds in self.fds.items():
            total = sum(struct.unpack("Q", os.read(fd, 8))[0] for fd in fds)
            out[f"{name}_per_call"] = total / calls
        if out.get("cycles_per_call"):
            out["ipc"] = out["instructions_per_call"] / out["cycles_per_call"]
        return out

    def close(self) -> None:
        for fds in self.fds.values():
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            fds.clear()


# -- GPU: NVML sampler and kernel profile ----------------------------------------------------------------------------


def cuda_uuid(device_index: int) -> str | None:
    """The UUID CUDA reports for its device ``device_index`` (as ``torch.cuda.get_device_properties`` prints it)."""
    try:
        import torch

        return str(torch.cuda.get_device_properties(device_index).uuid)
    except Exception:
        return None


def nvml_handle(nv: Any, device_index: int, uuid: str | None) -> Any:
    """NVML's handle of the GPU that CUDA calls ``device_index``, matched by UUID.

    NVML numbers all GPUs of the machine in PCI order, CUDA only the visible ones (``CUDA_VISIBLE_DEVICES``), by
    default fastest first: the same index can name different GPUs, and the sampler would then report another GPU's
    clocks and power. NVML spells UUIDs "GPU-<uuid>"; the index is the fallback when no UUID matches."""
    if uuid:
        for candidate in (uuid,) if uuid.startswith("GPU-") else (f"GPU-{uuid}", uuid):
            with contextlib.suppress(Exception):
                return nv.nvmlDeviceGetHandleByUUID(candidate)
    return nv.nvmlDeviceGetHandleByIndex(device_index)


NVML_WINDOW_S = 0.5  # seconds each backend runs alone under the NVML sampler, after its timing


def nvml_field_number(value: Any) -> float:
    """The number in an NVML field value (``c_nvmlFieldValue_t``), read through the member its ``valueType`` names."""
    member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[int(value.valueType)]
    return float(getattr(value.value, member))


class NvmlSampler:
    """Samples SM clock, board power, temperature and throttle reasons every ``period_s`` on a thread, attributing each
    sample (and the energy counter's increase) to the label set by :meth:`label`.

    The telemetry of a backend is taken in a :meth:`window` in which it runs alone, not during the interleaved timing
    rounds: a round gives a backend a few milliseconds, and NVML cannot tell such slices apart — the board power that
    ``nvmlDeviceGetPowerUsage`` reports is a one-second average on recent GPUs (on an H100 every backend of a setting
    read the same ~125 W, whatever its load), and the energy counter's steps landed in whichever slice was open (one
    backend's energy per call implied 1.1 kW on a 700 W board). Power is read as the instantaneous field
    (``NVML_FI_DEV_POWER_INSTANT``) where the driver has it."""

    def __init__(self, device_index: int = 0, period_s: float = 0.01) -> None:
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self._h = nvml_handle(pynvml, device_index, cuda_uuid(device_index))
        self._period = period_s
        self._label: str | None = None
        self._lock = threading.Lock()
        self._data: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._power_field: int | None = getattr(pynvml, "NVML_FI_DEV_POWER_INSTANT", None)
        self.power_source = "instantaneous" if self._power_field is not None else "nvmlDeviceGetPowerUsage"
        self._energy_mark = self._energy()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _energy(self) -> float | None:
        try:
            return float(self._nv.nvmlDeviceGetTotalEnergyConsumption(self._h))  # mJ
        except Exception:
            return None

    def _power_w(self) -> float:
        """Board power in W: the instantaneous field if the driver answers it, else the (averaged) power usage."""
        if self._power_field is not None:
            try:
                (v,) = self._nv.nvmlDeviceGetFieldValues(self._h, [self._power_field])
                if int(v.nvmlReturn) == 0:
                    return nvml_field_number(v) / 1000.0  # mW
            except Exception:
                pass
            self._power_field = None  # not supported here: fall back for good
            self.power_source = "nvmlDeviceGetPowerUsage"
        return self._nv.nvmlDeviceGetPowerUsage(self._h) / 1000.0

    def _bucket(self, label: str) -> dict[str, Any]:
        return self._data.setdefault(
            label, {"sm_clock_mhz": [], "power_w": [], "temp_c": [], "throttle": 0, "energy_mj": 0.0, "window_s": 0.0}
        )

    def label(self, name: str | None) -> None:
        with self._lock:
            e = self._energy()
            if self._label is not None and e is not None and self._energy_mark is not None:
                self._bucket(self._label)["energy_mj"] += e - self._energy_mark
            self._energy_mark = e
            self._label = name

    def window(self, name: str, call: Callable[[], Any], sync: Callable[[], None], min_s: float = NVML_WINDOW_S
               ) -> int:
        """Run ``call`` alone for at least ``min_s`` (and once at least) under the label ``name``; returns the number
        of calls. The device is synchronised before the label opens and before it closes, so the window holds exactly
        this backend's work, launch gaps included: they are part of what a call costs."""
        sync()
        self.label(name)
        t0 = time.perf_counter()
        calls = 0
        try:
            while calls == 0 or time.perf_counter() - t0 < min_s:
                call()
                calls += 1
            sync()
        finally:
            elapsed = time.perf_counter() - t0
            self.label(None)
        self._bucket(name)["window_s"] += elapsed
        return calls

    def _run(self) -> None:
        nv = self._nv
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        reasons = reasons or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self._stop.is_set():
            with self._lock:
                if self._label is not None:
                    b = self._bucket(self._label)
                    with contextlib.suppress(Exception):
                        b["sm_clock_mhz"].append(nv.nvmlDeviceGetClockInfo(self._h, nv.NVML_CLOCK_SM))
                        b["power_w"].append(self._power_w())
                        b["temp_c"].append(nv.nvmlDeviceGetTemperature(self._h, nv.NVML_TEMPERATURE_GPU))
                        b["throttle"] |= int(reasons(self._h))
            time.sleep(self._period)

    def __enter__(self) -> NvmlSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.label(None)
        self._stop.set()
        self._thread.join(timeout=1)

    def summary(self, label: str, calls: int, seconds_per_call: float | None = None) -> dict[str, Any]:
        """The telemetry of window ``label`` (``calls`` calls). ``energy_per_call_j`` is the window's mean board power
        times ``seconds_per_call`` — the timed median — when it is given. Calls inside the window ran up to 2.2× slower
        than in the timing on an H100 where the host sets the pace (eager ``lstm_manual``: 9.4 ms against a 5.3 ms
        median; the window runs beside the sampling thread, whose NVML queries took ~6 ms each there), so the window's
        energy over its own calls (``nvml_window_energy_per_call_j``, from the energy counter, which advanced in
        ~100 ms steps there) overstates what a call costs; ``nvml_window_call_s`` shows the window's pace."""
        b = self._data.get(label)
        if not b or not b["sm_clock_mhz"]:
            return {"nvml": "no samples"}
        import numpy as np

        power = float(np.mean(b["power_w"])) if b["power_w"] else None
        window_energy = (b["energy_mj"] / 1000.0 / calls) if calls and b["energy_mj"] else None
        return {
            "sm_clock_mhz_mean": float(np.mean(b["sm_clock_mhz"])),
            "sm_clock_mhz_min": float(np.min(b["sm_clock_mhz"])),
            "power_w_mean": power,
            "temp_c_max": float(np.max(b["temp_c"])) if b["temp_c"] else None,
            "throttle_reasons": throttle_names(b["throttle"]),
            "energy_per_call_j": power * seconds_per_call if power and seconds_per_call else window_energy,
            "nvml_window_energy_per_call_j": window_energy,
            "nvml_samples": len(b["sm_clock_mhz"]),
            "nvml_window_s": b["window_s"],
            "nvml_window_calls": calls,
            "nvml_window_call_s": b["window_s"] / calls if calls else None,
            "nvml_power": self.power_source,
        }


_THROTTLE_BITS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


def throttle_names(mask: int) -> list[str]:
    return [n for bit, n in _THROTTLE_BITS.items() if mask & bit]


def device_activity_kind(name: str, is_user_annotation: bool) -> str | None:
    """What a device-side profiler event is: "kernel", "memcpy" or "memset", or None for a range that is no GPU work.

    torch.profiler lists, as CUDA events, the kernels and the copies and fills the driver does without a kernel
    ("Memcpy HtoD ...", "Memset (Device)"; a CUDA-graph backend's input copy is one per call). Kineto can also place
    ``record_function`` ranges on the GPU timeline (``is_user_annotation``): counted as kernels, such a range would
    inflate the launch count and its span would double-count the kernel time of everything under it."""
    if is_user_annotation:
        return None
    low = name.lower()
    if low.startswith("memcpy"):
        return "memcpy"
    if low.startswith("memset"):
        return "memset"
    return "kernel"


def gpu_kernel_profile(call: Callable[[], Any], calls: int = 5) -> dict[str, Any]:
    """Kernel launches and summed kernel time per call, from torch.profiler's CUDA activity; driver copies and fills
    are counted apart (``memcpy_per_call``, ``memset_per_call``) and user annotations not at all."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    counts = {"kernel": 0, "memcpy": 0, "memset": 0}
    kernel_us = 0.0
    for evt in prof.events():
        if evt.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = device_activity_kind(evt.name, bool(getattr(evt, "is_user_annotation", False)))
        if kind is None:
            continue
        counts[kind] += 1
        if kind == "kernel":
            kernel_us += evt.time_range.elapsed_us()  # a device-side event's own duration
    return {
        "kernels_per_call": counts["kernel"] / calls,
        "kernel_time_per_call_s": kernel_us / 1e6 / calls,
        "memcpy_per_call": counts["memcpy"] / calls,
        "memset_per_call": counts["memset"] / calls,
    }
