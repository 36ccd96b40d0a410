"""A program's Triton kernels compiled for a GPU on a machine without one: what each kernel would ask of the
device (shared memory) and how long Triton takes to build it.

``record_launches`` runs a call under Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton was imported) and
notes each distinct kernel launched: its module file, name, argument types, constants, meta-parameters and what Triton's
launcher specializes on (pointers and integers divisible by 16, integers equal to 1: without it loads are built element
by element, not as 16-byte vectors). ``compile_offline`` then compiles those kernels for a CUDA architecture with
Triton's own compiler and ptxas in a fresh process without the interpreter, one after another or on a thread pool, and
reports each kernel's shared memory, registers per thread and bytes spilled to local memory (a persistent scan that
spills pays a local-memory round trip every step). The first GPU run found a kernel asking for more shared memory than a
program may have (``tests/codegen/triton/test_sm90.py`` now catches that class of bug on a CPU machine);
``bench/triton_compile_time.py`` times the builds.
"""

from __future__ import annotations

import inspect
import json
import os
import re
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
    records, arch, threads, loops = json.load(open(sys.argv[1])), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    KINDS = {"BAR": "barriers", "LDG": "global_loads", "LDGSTS": "async_copies", "LDS": "shared_loads",
             "LDSM": "shared_loads", "HMMA": "mma", "HGMMA": "mma", "MUFU": "special", "LDL": "local", "STL": "local",
             "ATOMG": "atomics"}
    INS = re.compile(r"/\\*([0-9a-f]{4,})\\*/\\s+(?:@!?U?P\\w+\\s+)?([A-Z][A-Z0-9_.]*)")  # address, opcode
    JUMP = re.compile(r"/\\*([0-9a-f]{4,})\\*/[^;]*BRA\\s+`?\\(?0x([0-9a-f]+)")  # a branch's address and target
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)

    def tool(exe, data, file, *args):
        # ``exe`` run on ``data`` written to ``file`` (its suffix says what it holds): its standard output and error
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, file)
            with open(path, "wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
            done = subprocess.run([exe, *args, path], capture_output=True, text=True, check=True)
        return done.stdout, done.stderr

    def usage(ptx):
        # ptxas -v on the kernel's PTX, as Triton assembles it: registers per thread, bytes spilled to local memory
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        out = tool(get_ptxas(arch).path, ptx, "kernel.ptx", "-v", f"--gpu-name={gpu}", "-o", os.devnull)[1]
        regs = re.search(r"Used (\\d+) registers", out)
        spills = re.search(r"(\\d+) bytes spill stores", out)
        return int(regs.group(1)) if regs else None, int(spills.group(1)) if spills else 0

    def loop(cubin):
        # the kernel's longest loop in its SASS (a persistent scan's time loop): its instructions, and how many
        # of them are barriers, global loads, asynchronous copies, shared loads, MMAs, special functions, and
        # local-memory (spill) accesses
        cuobjdump = os.path.join(os.path.dirname(get_ptxas(arch).path), "cuobjdump")  # CUDA's, beside ptxas
        sass = tool(cuobjdump, cubin, "kernel.cubin", "-sass")[0]
        code = [(int(a, 16), op) for a, op in INS.findall(sass)]
        back = [(a - t, t, a) for a, t in ((int(a, 16), int(t, 16)) for a, t in JUMP.findall(sass)) if t < a]
        if not back:
            return None
        _, lo, hi = max(back)
        ops = [op.split(".")[0] for a, op in code if lo <= a <= hi]
        out = {"instructions": len(ops)} | {k: 0 for k in KINDS.values()}
        for op in ops:
            if op in KINDS:
                out[KINDS[op]] += 1
        return out

    def one(rec):
        label = rec.get("label", rec["name"])
        try:
            spec = importlib.util.spec_from_file_location("m_" + rec["name"], rec["path"])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            fn = getattr(module, rec["name"])
            consts = {(fn.arg_names.index(k),): v for k, v in rec["consts"].items()}
            # the launcher's specialization: a pointer or integer divisible by 16 is compiled as such
            attrs = {(fn.arg_names.index(k),): [["tt.divisibility", 16]] for k in rec.get("aligned", ())}
            src = triton.compiler.ASTSource(fn=fn, constexprs=consts, signature=rec["signature"], attrs=attrs)
            t0 = time.perf_counter()
            k = triton.compile(src, target=target, options=backend.parse_options(rec["meta"]).__dict__)
            seconds = time.perf_counter() - t0
            registers, spills = usage(k.asm["ptx"])
            wide = len(re.findall(r"ld\\.global(?:\\.[a-z]+)*\\.v4\\.b32", k.asm["ptx"]))  # 16 bytes a thread
            divisions = len(re.findall(r"\\bdiv\\.(?:full|rn|rz|rm|rp)\\.f32", k.asm["ptx"]))
        except Exception as e:  # the kernel's own failure, reported beside the others
            if "ptxas" in str(e) and "not found" in str(e).lower():
                raise
            return label, {"error": f"{type(e).__name__}: {str(e)[-1500:]}"}
        built = {"shared": k.metadata.shared, "seconds": seconds, "registers": registers, "spill_bytes": spills,
                 "wide_loads": wide, "divisions": divisions}
        if loops == "1":
            built["loop"] = loop(k.asm["cubin"])
        return label, built

    t0 = time.perf_counter()
    if threads == 1:
        each = [one(r) for r in records]
    else:
        with ThreadPoolExecutor(threads) as pool:
            each = list(pool.map(one, records))
    print(json.dumps({"total": time.perf_counter() - t0, "kernels": dict(each)}))
""")


# Shared memory one program may use, per CUDA architecture (bytes): what a kernel built for it must fit.
MAX_SHARED = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}


class NoPtxas(RuntimeError):
    """Triton's CUDA backend on this machine has no ptxas to build with."""


class LaunchRecorder:
    """Notes each distinct kernel launched under Triton's interpreter while it is entered (a context manager),
    in first-launch order: ``records``, as ``compile_offline`` takes them. Kernels are told apart by module file
    and name (a generated module's file is named by the hash of its source). ``origin``, where given, names what
    launched a kernel first (a test's id): each record keeps it."""

    def __init__(self, origin: Callable[[], str] | None = None) -> None:
        self.origin = origin
        self.records: list[dict[str, Any]] = []
        self._seen: set[tuple[str, str]] = set()
        self._original: Any = None

    def __enter__(self) -> LaunchRecorder:
        from triton.runtime.interpreter import InterpretedFunction

        self._original = original = InterpretedFunction.run
        recorder = self

        def run(interpreted, *args, grid, warmup, **kwargs):
            recorder._note(interpreted, args, kwargs)
            return original(interpreted, *args, grid=grid, warmup=warmup, **kwargs)

        InterpretedFunction.run = run
        return self

    def __exit__(self, *exc: object) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        InterpretedFunction.run = self._original

    def _note(self, interpreted: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        import torch

        fn = interpreted.fn
        key = (fn.__code__.co_filename, fn.__name__)
        if key in self._seen:
            return
        self._seen.add(key)
        params = list(inspect.signature(fn).parameters)
        values = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
        fixed = set(interpreted.kwargs.get("do_not_specialize") or ())
        signature, consts, aligned = {}, {}, []
        for p in params:
            v = values[p]
            if "constexpr" in str(fn.__annotations__.get(p, "")):
                signature[p], consts[p] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                signature[p] = "*" + _TYPES[str(v.dtype).removeprefix("torch.")]
                if v.data_ptr() % 16 == 0:
                    aligned.append(p)
            elif p not in fixed and int(v) == 1:  # Triton's launcher makes an integer argument of 1 a constant
                signature[p], consts[p] = "constexpr", 1
            else:
                signature[p] = "i32" if -2**31 <= int(v) < 2**31 else "i64"
                if p not in fixed and int(v) % 16 == 0:
                    aligned.append(p)
        self.records.append({"path": key[0], "name": key[1], "signature": signature, "consts": consts,
                             "aligned": aligned, "meta": {k: v for k, v in kwargs.items() if k not in params}}
                            | ({"origin": self.origin()} if self.origin else {}))


def record_launches(call: Callable[[], object]) -> list[dict[str, Any]]:
    """Each distinct kernel ``call()`` launches under Triton's interpreter, in first-launch order."""
    with LaunchRecorder() as recorder:
        call()
    return recorder.records


def held_forms(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` and, for each resident loop's kernel whose steps may hold their weights (constants ``H<j>``,
    chosen at launch: false under the interpreter's one program), the same kernel with them held, labelled
    ``<name>+held``: so both forms are built."""
    out = list(records)
    for r in records:
        flags = [k for k, v in r["consts"].items() if re.fullmatch(r"H\d+", k) and v is False]
        if flags:
            out.append(r | {"label": r["name"] + "+held", "consts": r["consts"] | dict.fromkeys(flags, True)})
    return out


def compile_offline(records: list[dict[str, Any]], arch: int = 90, threads: int = 1, timeout: float = 900,
                    keep_going: bool = False, loops: bool = False) -> dict[str, Any]:
    """Build ``records`` (from ``record_launches``) for CUDA architecture ``arch`` in a fresh process with an
    empty Triton cache: ``{"total": seconds, "kernels": {label: {"shared": bytes, "seconds": s, "registers": per
    thread, "spill_bytes": spill stores to local memory, "wide_loads": global loads of 16 bytes per thread in its
    PTX, "divisions": float32 divisions in its PTX (each a reciprocal behind range checks, or an IEEE
    sequence)}}}``, a record's label being its ``"label"`` or else its kernel's name (``seconds`` is Triton's
    build; ptxas runs again after it for the register report). With ``loops`` each kernel also has ``"loop"``:
    its longest loop in the built machine code (SASS, by ``cuobjdump``; a persistent scan's time loop, so per
    step) — ``{"instructions", "barriers", "global_loads", "async_copies" (copies from global to shared memory
    Triton's software pipeliner issues ahead), "shared_loads", "mma", "special", "local", "atomics" (global)}``,
    counts of instructions — or None where it has no loop. A kernel Triton cannot build raises ``RuntimeError``
    with the compiler's message, or with ``keep_going`` is reported as ``{"error": message}`` beside the others.
    Raises ``NoPtxas`` where Triton cannot build for CUDA here."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "launches.json")
        with open(path, "w") as f:
            json.dump(records, f)
        env["TRITON_CACHE_DIR"] = os.path.join(tmp, "cache")
        done = subprocess.run([sys.executable, "-c", _COMPILE, path, str(arch), str(threads), str(int(loops))], env=env,
                              capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        if "ptxas" in done.stderr and "not found" in done.stderr.lower():
            raise NoPtxas(done.stderr[-500:])
        raise RuntimeError(done.stderr[-3000:])
    built = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {label: k["error"] for label, k in built["kernels"].items() if "error" in k}
    if failed and not keep_going:
        raise RuntimeError("\n".join(f"{label}: {error}" for label, error in failed.items()))
    return built
