"""A Triton program's built kernels, carried in a saved program so that loading it on a like machine builds nothing.

Triton keeps each kernel it builds in its cache as a group of files (the cubin, its metadata, the IR of each
stage) under a hash of everything the build depended on: the kernel's source and specialization, its options,
Triton's version, the target GPU and the toolchain. ``collect`` reads the groups of a generated module's kernels
built in this process; ``restore`` writes them into this machine's Triton cache under the same hashes, through
Triton's cache manager. A kernel's first launch then finds its group instead of compiling. Where anything differs
(another GPU, another Triton or ptxas) the launch computes another hash, never looks the group up, and compiles
as before: a mismatch costs a build, never a wrong kernel.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger("nnforge.codegen.triton")

Groups = dict[str, dict[str, bytes]]  # Triton's cache hash -> file name -> bytes
_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def kernel_group(kernel: Any) -> tuple[str, dict[str, bytes]] | None:
    """``(hash, files)`` of one built kernel (Triton's ``CompiledKernel``, or a finished asynchronous compile
    holding one), or None for anything else (a compile still running, an interpreted kernel)."""
    if not hasattr(kernel, "metadata_group"):
        kernel = getattr(kernel, "kernel", None)
    group, key = getattr(kernel, "metadata_group", None), getattr(kernel, "hash", None)
    if not isinstance(group, Mapping) or not isinstance(key, str):
        return None
    try:
        return key, {name: Path(path).read_bytes() for name, path in group.items()}
    except OSError as e:  # the cache was cleaned under us: the load compiles this kernel again
        log.info("kernel %s: its built files are gone from Triton's cache (%s); not saved", key, e)
        return None


def collect(module: ModuleType) -> Groups:
    """The groups of every kernel of ``module`` that Triton built in this process, on any device."""
    groups: Groups = {}
    for fn in vars(module).values():
        caches = getattr(fn, "device_caches", None)  # a JITFunction's per-device (kernel cache, ...) entries
        if not isinstance(caches, Mapping):
            continue
        for entry in list(caches.values()):
            kernels = entry[0] if isinstance(entry, tuple) and entry and isinstance(entry[0], Mapping) else {}
            for kernel in list(kernels.values()):
                found = kernel_group(kernel)
                if found is not None:
                    groups.setdefault(*found)
    return groups


def restore(groups: Groups) -> int:
    """Write ``groups`` into Triton's cache (``TRITON_CACHE_DIR`` or its default) where they are not already;
    returns how many were written."""
    if not groups:
        return 0
    from triton.runtime.cache import get_cache_manager

    written = 0
    for key, files in groups.items():
        meta = [name for name in files if name.endswith(".json") and not name.startswith("__grp__")]
        if len(meta) != 1:
            log.info("kernel %s: no single metadata file among %s; not restored", key, sorted(files))
            continue
        if not all(_FILE.fullmatch(name) for name in files):  # names become paths in the cache: plain names only
            log.info("kernel %s: a file name that is not a plain one among %s; not restored", key, sorted(files))
            continue
        cache = get_cache_manager(key)
        if cache.get_group(meta[0]) is not None:
            continue
        paths = {name: cache.put(data, name) for name, data in files.items() if not name.startswith("__grp__")}
        cache.put_group(meta[0], paths)
        written += 1
    return written
