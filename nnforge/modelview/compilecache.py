"""Whether a backend's compile found its on-disk cache: a compile time of 0.3 s and one of 40 s are the same
backend, cold or warm, and a table of compile times means nothing without saying which.

The check is the same for every compiler: the files of its cache directory before and after the backend's prepare and
first call. New files: it compiled ("miss"); none: everything came from the cache ("hit"). Backends without an
on-disk cache say "n/a".
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dirs(backend: str) -> list[Path]:
    """The on-disk compile caches a backend may use (none for eager, TorchScript, ONNX Runtime)."""
    if backend.startswith("compile"):
        d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if not d:
            try:
                from torch._inductor.runtime.cache_dir_utils import cache_dir

                d = cache_dir()
            except Exception:
                return []
        return [Path(d)]
    if backend.startswith("nnforge.") and backend != "nnforge.reference":
        root = os.environ.get("NNFORGE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nnforge")
        # nnforge caches the generated module; Triton builds its kernels into a cache of its own
        return [Path(root), *([triton_cache_dir()] if backend.startswith("nnforge.triton") else [])]
    return []


def triton_cache_dir() -> Path:
    """Where Triton keeps the kernels it builds: ``$TRITON_CACHE_DIR``, else Triton's own default."""
    if os.environ.get("TRITON_CACHE_DIR"):
        return Path(os.environ["TRITON_CACHE_DIR"])
    try:
        from triton import knobs

        return Path(knobs.cache.dir)
    except Exception:  # an older Triton without knobs: its documented default
        return Path(os.path.expanduser("~")) / ".triton" / "cache"


def snapshot(dirs: list[Path]) -> set[str]:
    """The files under ``dirs`` (paths as text); a missing directory is empty."""
    out: set[str] = set()
    for d in dirs:
        for root, _, files in os.walk(d):
            out.update(os.path.join(root, f) for f in files)
    return out


def verdict(dirs: list[Path], before: set[str], after: set[str]) -> dict[str, object]:
    """``compile_cache``: hit / miss / n/a, with the number of files the compile wrote."""
    if not dirs:
        return {"compile_cache": "n/a"}
    new = len(after - before)
    return {"compile_cache": "miss" if new else "hit", "compile_cache_new_files": new,
            "compile_cache_dir": ", ".join(str(d) for d in dirs)}
