"""A program's Triton kernels compiled for a GPU on a machine without one: what each kernel would ask of the
device (shared memory) and how long Triton takes to build it.

``record_launches`` runs a call under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton was
imported) and notes each distinct kernel launched: its module file, name, argument types, constants and
meta-parameters. ``compile_offline`` then compiles those kernels for a CUDA architecture with Triton's own
compiler and ptxas in a fresh process without the interpreter, one after another or on a thread pool, and reports
each kernel's shared memory, registers per thread and bytes spilled to local memory (a persistent scan that spills
pays a local-memory round trip every step). The first
GPU run found a kernel asking for more shared memory than a program may have (``tests/codegen/triton/
test_sm90.py`` now catches that class of bug on a CPU machine); ``bench/triton_compile_time.py`` times the builds.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from typing import Any

_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
          "int32": "i32", "uint8": "u8", "int8": "i8", "bool": "i1"}

_COMPILE = textwrap.dedent("""
    import importlib.util, json, os, re, subprocess, sys, tempfile, time
    from concurrent.futures import ThreadPoolExecutor
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    records, arch, threads = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3])
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)

    def usage(ptx):
        # ptxas -v on the kernel's PTX, as Triton assembles it: registers per thread, bytes spilled to local memory
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.ptx")
            with open(path, "w") as f:
                f.write(ptx)
            gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
            out = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", path, "-o", os.devnull],
                                 capture_output=True, text=True, check=True).stderr
        regs = re.search(r"Used (\\d+) registers", out)
        spills = re.search(r"(\\d+) bytes spill stores", out)
        return int(regs.group(1)) if regs else None, int(spills.group(1)) if spills else 0

    def one(rec):
        spec = importlib.util.spec_from_file_location("m_" + rec["name"], rec["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, rec["name"])
        consts = {(fn.arg_names.index(k),): v for k, v in rec["consts"].items()}
        src = triton.compiler.ASTSource(fn=fn, constexprs=consts, signature=rec["signature"])
        t0 = time.perf_counter()
        k = triton.compile(src, target=target, options=backend.parse_options(rec["meta"]).__dict__)
        seconds = time.perf_counter() - t0
        registers, spills = usage(k.asm["ptx"])
        return rec["name"], {"shared": k.metadata.shared, "seconds": seconds, "registers": registers,
                             "spill_bytes": spills}

    t0 = time.perf_counter()
    if threads == 1:
        each = [one(r) for r in records]
    else:
        with ThreadPoolExecutor(threads) as pool:
            each = list(pool.map(one, records))
    print(json.dumps({"total": time.perf_counter() - t0, "kernels": dict(each)}))
""")


class NoPtxas(RuntimeError):
    """Triton's CUDA backend on this machine has no ptxas to build with."""


def record_launches(call: Callable[[], object]) -> list[dict[str, Any]]:
    """Each distinct kernel ``call()`` launches under Triton's interpreter, in first-launch order."""
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    seen: dict[tuple[str, str], dict[str, Any]] = {}
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        params = list(inspect.signature(fn).parameters)
        values = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
        signature, consts = {}, {}
        for p in params:
            v = values[p]
            if "constexpr" in str(fn.__annotations__.get(p, "")):
                signature[p], consts[p] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                signature[p] = "*" + _TYPES[str(v.dtype).removeprefix("torch.")]
            else:
                signature[p] = "i32" if -2**31 <= int(v) < 2**31 else "i64"
        seen.setdefault((fn.__code__.co_filename, fn.__name__), {
            "path": fn.__code__.co_filename, "name": fn.__name__, "signature": signature, "consts": consts,
            "meta": {k: v for k, v in kwargs.items() if k not in params}})
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    InterpretedFunction.run = run
    try:
        call()
    finally:
        InterpretedFunction.run = original
    return list(seen.values())


def compile_offline(records: list[dict[str, Any]], arch: int = 90, threads: int = 1,
                    timeout: float = 900) -> dict[str, Any]:
    """Build ``records`` (from ``record_launches``) for CUDA architecture ``arch`` in a fresh process with an
    empty Triton cache: ``{"total": seconds, "kernels": {name: {"shared": bytes, "seconds": s, "registers": per
    thread, "spill_bytes": spill stores to local memory}}}`` (``seconds`` is Triton's build; ptxas runs again
    after it for the register report). Raises
    ``NoPtxas`` where Triton cannot build for CUDA here, ``RuntimeError`` with the compiler's output otherwise."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.json")
        with open(path, "w") as f:
            json.dump(records, f)
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")
        done = subprocess.run([sys.executable, "-c", _COMPILE, path, str(arch), str(threads)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        if "ptxas" in done.stderr and "not found" in done.stderr.lower():
            raise NoPtxas(done.stderr[-500:])
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])
