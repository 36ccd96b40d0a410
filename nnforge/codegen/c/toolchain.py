"""Compiling generated C with the system compiler, and the on-disk cache of shared objects.

The cache key is a SHA-256 of the source, the compiler's identity and the flags. Each entry is ``<key>.so`` plus
``<key>.json`` recording the SHA-256 of the .so bytes; an entry whose bytes do not match, that fails to load,
or whose embedded ``nf_key()`` differs is rebuilt, never trusted. Writes go to a temporary file first and are
renamed into place, so concurrent test workers sharing the cache never see half-written files.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("nnforge.codegen.c")

FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math",
         "-std=gnu11", "-w")


def cache_dir() -> Path:
    """``$NNFORGE_CACHE_DIR`` or ``~/.cache/nnforge``; shared objects live in its ``c/`` folder."""
    root = os.environ.get("NNFORGE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nnforge")
    return Path(root) / "c"


def find_compiler() -> str | None:
    """``$CC`` when set (the user's choice is used or reported, never silently replaced), else the first of cc,
    gcc, clang on PATH."""
    chosen = os.environ.get("CC")
    if chosen:
        return shutil.which(chosen)
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def missing_compiler_reason() -> str:
    """Why backend 'cpu' cannot build here, in one line naming what to fix."""
    chosen = os.environ.get("CC")
    if chosen and shutil.which(chosen) is None:
        return f"backend 'cpu': $CC is {chosen!r}, which is not an executable on PATH (unset CC to use cc/gcc/clang)"
    if chosen:
        return f"backend 'cpu': $CC ({chosen!r}) cannot build a test OpenMP shared object"
    return "backend 'cpu' needs a C compiler with OpenMP (cc, gcc or clang on PATH, or $CC)"


class CompileError(RuntimeError):
    """The C compiler rejected generated code (a bug in nnforge's code generator)."""


@dataclass
class Toolchain:
    """A C compiler, its identity and a cache of loaded libraries (an explicit object, not module state)."""

    cc: str
    flags: tuple[str, ...] = FLAGS
    loaded: dict[str, ctypes.CDLL] = field(default_factory=dict)
    last_compile_s: float = 0.0
    compiles: int = 0
    jobs: int = field(default_factory=lambda: usable_cores(4))

    def _build_units(self, units: list[str], tmp: Path, out: Path) -> subprocess.CompletedProcess:
        """Compile the units as separate objects at the same time (gcc's time is per function, so the split
        divides it among the cores), then link them; returns the first failure or the link's result."""
        procs = []
        objs = []
        for k, text in enumerate(units):
            src, obj = tmp / f"unit{k}.c", tmp / f"unit{k}.o"
            src.write_text(text)
            objs.append(str(obj))
            procs.append(subprocess.Popen([self.cc, *self.flags, "-c", str(src), "-o", str(obj)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        failed = None
        for pr in procs:
            err = pr.communicate()[1]
            if pr.returncode != 0 and failed is None:
                failed = subprocess.CompletedProcess(pr.args, pr.returncode, "", err)
        if failed is not None:
            return failed
        return subprocess.run([self.cc, *self.flags, *objs, "-o", str(out), "-lm"], capture_output=True, text=True)

    @functools.cached_property
    def identity(self) -> str:
        try:
            out = subprocess.run([self.cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        return f"{self.cc}\n{out.splitlines()[0] if out else ''}"

    @functools.cached_property
    def vector_bytes(self) -> int:
        """The widest vector registers the compiler targets under these flags: 64 where it defines AVX-512F, else
        32 (AVX2, or narrower vectors the compiler splits GCC vector types into)."""
        try:
            out = subprocess.run([self.cc, *(f for f in self.flags if f.startswith("-m")), "-dM", "-E", "-x", "c",
                                  os.devnull], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        return 64 if "__AVX512F__" in out else 32

    def key(self, source: str) -> str:
        h = hashlib.sha256()
        for part in (source, self.identity, " ".join(self.flags)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def load(self, source: str) -> tuple[ctypes.CDLL, str]:
        """The library for ``source`` (compiled on first use, then from memory or disk)."""
        key = self.key(source)
        if key in self.loaded:
            return self.loaded[key], key
        d = cache_dir()
        so, meta = d / f"{key}.so", d / f"{key}.json"
        lib = cached_library(key, so, meta)
        if lib is None:
            self._compile(source, key, so, meta)
            lib = cached_library(key, so, meta)
            if lib is None:
                raise CompileError(f"freshly built {so} does not validate")
        self.loaded[key] = lib
        return lib, key

    def _compile(self, source: str, key: str, so: Path, meta: Path) -> None:
        d = so.parent
        d.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=d) as tmp:
            c_file = Path(tmp) / f"{key}.c"
            full = source + f'\nconst char* nf_key(void) {{ return "{key}"; }}\n'
            c_file.write_text(full)
            out = Path(tmp) / f"{key}.so"
            units = split_units(full, self.jobs)
            if len(units) > 1:
                proc = self._build_units(units, Path(tmp), out)
            else:
                proc = subprocess.run([self.cc, *self.flags, str(c_file), "-o", str(out), "-lm"],
                                      capture_output=True, text=True)
            if proc.returncode != 0:
                keep = d / f"{key}.failed.c"
                keep.write_text(c_file.read_text())
                raise CompileError(f"{self.cc} failed ({proc.returncode}); source kept at {keep}:\n"
                                   f"{proc.stderr[-4000:]}")
            data = out.read_bytes()
            os.replace(out, so)
            tmp_meta = Path(tmp) / "meta.json"
            tmp_meta.write_text(json.dumps({"key": key, "sha256": hashlib.sha256(data).hexdigest(),
                                            "cc": self.identity, "flags": list(self.flags)}))
            os.replace(tmp_meta, meta)
        self.last_compile_s = time.perf_counter() - t0
        self.compiles += 1
        log.info("compiled %s in %.2fs", so.name, self.last_compile_s)


def cached_library(key: str, so: Path, meta: Path) -> ctypes.CDLL | None:
    """The cache entry for ``key`` loaded, or None when it is missing, corrupt (bytes not matching the recorded
    SHA-256), built for another key or does not load."""
    try:
        info = json.loads(meta.read_text())
        data = so.read_bytes()
    except (OSError, ValueError):
        return None
    if info.get("key") != key or info.get("sha256") != hashlib.sha256(data).hexdigest():
        log.info("cache entry %s is corrupt or stale; rebuilding", so.name)
        return None
    try:
        lib = ctypes.CDLL(str(so))
        lib.nf_key.restype = ctypes.c_char_p
        if lib.nf_key().decode() != key:
            return None
    except (OSError, AttributeError):
        log.info("cache entry %s does not load", so.name)
        return None
    return lib


def library_bytes(key: str) -> bytes:
    """The bytes of the cached shared object ``key``, checked against the hash recorded when it was built."""
    d = cache_dir()
    so, meta = d / f"{key}.so", d / f"{key}.json"
    try:
        data = so.read_bytes()
        ok = json.loads(meta.read_text()).get("sha256") == hashlib.sha256(data).hexdigest()
    except (OSError, ValueError):
        ok = False
    if not ok:
        raise CompileError(f"the shared object {so} is missing or altered since it was built (the cache was "
                           "cleared?): call the function again on a fresh nf.compile to rebuild it")
    return data


def install_library(key: str, data: bytes) -> ctypes.CDLL | None:
    """A shared object from elsewhere (a saved program) put into the cache under its key and loaded; None when it
    does not load here. No compiler is needed."""
    d = cache_dir()
    so, meta = d / f"{key}.so", d / f"{key}.json"
    lib = cached_library(key, so, meta)
    if lib is not None:
        return lib
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        tmp_so, tmp_meta = Path(tmp) / f"{key}.so", Path(tmp) / "meta.json"
        tmp_so.write_bytes(data)
        tmp_meta.write_text(json.dumps({"key": key, "sha256": hashlib.sha256(data).hexdigest(),
                                        "installed": "from a saved program"}))
        os.replace(tmp_so, so)
        os.replace(tmp_meta, meta)
    return cached_library(key, so, meta)


def usable_cores(cap: int) -> int:
    """Cores this process may run on (its affinity mask where the OS has one), at most ``cap``."""
    affinity = getattr(os, "sched_getaffinity", None)
    n = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(1, min(cap, n))


def split_units(source: str, jobs: int) -> list[str]:
    """``source`` as up to ``jobs`` translation units: the text before the first ``UNIT_MARK`` (the header) is
    repeated in each; the marked sections are dealt, largest first, to the unit with the fewest lines so far;
    the last section (prototypes and ``nf_main``) joins the smallest unit. One unit when there is nothing to
    split or one job."""
    from .parts import UNIT_MARK

    pieces = source.split(UNIT_MARK)
    if jobs <= 1 or len(pieces) < 3:
        return [source]
    header, sections = pieces[0], pieces[1:]
    n = min(jobs, len(sections))
    groups: list[list[str]] = [[] for _ in range(n)]
    sizes = [0] * n
    for sec in sorted(sections[:-1], key=lambda t: -t.count("\n")):
        k = sizes.index(min(sizes))
        groups[k].append(sec)
        sizes[k] += sec.count("\n")
    groups[sizes.index(min(sizes))].append(sections[-1])
    return [header + "".join(g) for g in groups if g]


def works(cc: str | None) -> bool:
    """Whether ``cc`` builds and loads an OpenMP shared object here."""
    if cc is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("#include <omp.h>\nint nf_probe(void) { return omp_get_max_threads() > 0; }\n")
        out = Path(tmp) / "probe.so"
        try:
            proc = subprocess.run([cc, *FLAGS, str(src), "-o", str(out)], capture_output=True, timeout=60)
            if proc.returncode != 0:
                return False
            return ctypes.CDLL(str(out)).nf_probe() == 1
        except (OSError, subprocess.SubprocessError):
            return False
