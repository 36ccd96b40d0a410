"""Which machine measured a row: a fingerprint of the hardware, and a readable id derived from it.

Rows from several machines end up in one store (a Ray cluster's nodes, ``nnforge merge``); numbers from different
machines must never be compared as if they were one machine's, so every row carries the id of the machine that
measured it. The fingerprint is read without importing torch (it is taken whenever a store is first written to).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import socket
from collections.abc import Mapping
from typing import Any

from .metrics import cpu_model


def _memory_bytes() -> int | None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def _gpu_names() -> list[str]:
    """Every GPU NVML sees (none without the driver or nvidia-ml-py)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            n = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(n.decode() if isinstance(n, bytes) else str(n))
        return names
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def fingerprint() -> dict[str, Any]:
    """What makes two machines' timings incomparable: host, CPU model and count, memory, GPUs, OS."""
    return {
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "gpus": _gpu_names(),
        "platform": platform.platform(),
    }


def machine_id(fp: Mapping[str, Any]) -> str:
    """``hostname-xxxxxx``: readable in a filter list, and distinct for two machines that share a host name."""
    digest = hashlib.sha1(json.dumps(dict(fp), sort_keys=True).encode()).hexdigest()[:6]
    return f"{fp.get('hostname') or 'unknown'}-{digest}"


def describe(fp: Mapping[str, Any]) -> str:
    """'host: AMD EPYC 7B13, 2 CPUs, 23 GiB' (+ ', 1× NVIDIA H100')."""
    parts = [str(fp.get("cpu_model") or "unknown CPU"), f"{fp.get('cpu_count')} CPUs"]
    if fp.get("memory_bytes"):
        parts.append(f"{fp['memory_bytes'] / 2**30:.0f} GiB")
    gpus = list(fp.get("gpus") or [])
    for name in sorted(set(gpus)):
        parts.append(f"{gpus.count(name)}× {name}")
    return f"{fp.get('hostname')}: " + ", ".join(parts)
