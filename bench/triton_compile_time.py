"""Compile time of a program's Triton kernels for a Hopper GPU, without one: one after another (as Triton compiles
them at their first launches) against a thread pool (``nnforge/codegen/triton/warm.py`` on a GPU).

The program is a 5-layer LSTM stack (H = ``--hidden``, float16, alternating direction, batch ``--batch``). Its
kernels' launches are recorded while Triton's interpreter runs it once (``TRITON_INTERPRET=1``, three steps: the
kernels do not depend on T); each round then compiles every recorded kernel for sm_90 with Triton's own ptxas in a
fresh process and an empty Triton cache, in sequence and on ``--threads`` threads, the order alternating by round.
Printed: per-kernel seconds, each round's totals, and the median of per-round sequence / pool ratios (> 1: the pool
is faster). On a shared machine only the same-round ratio means anything. Usage: ``python
bench/triton_compile_time.py [--rounds 3] [--threads 2] [--hidden 96] [--batch 16]``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap

COMPILE = textwrap.dedent("""
    import importlib.util, json, sys, time
    from concurrent.futures import ThreadPoolExecutor
    import triton
    from triton.backends.compiler import GPUTarget
    target = GPUTarget("cuda", 90, 32)
    backend = triton.compiler.make_backend(target)
    records, threads = json.load(open(sys.argv[1])), int(sys.argv[2])

    def one(rec):
        spec = importlib.util.spec_from_file_location("m_" + rec["name"], rec["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, rec["name"])
        consts = {(fn.arg_names.index(k),): v for k, v in rec["consts"].items()}
        src = triton.compiler.ASTSource(fn=fn, constexprs=consts, signature=rec["signature"])
        t0 = time.perf_counter()
        triton.compile(src, target=target, options=backend.parse_options(rec["meta"]).__dict__)
        return rec["name"], time.perf_counter() - t0

    t0 = time.perf_counter()
    if threads == 1:
        each = [one(r) for r in records]
    else:
        with ThreadPoolExecutor(threads) as pool:
            each = list(pool.map(one, records))
    print(json.dumps({"total": time.perf_counter() - t0, "each": each}))
""")

_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
          "int32": "i32", "uint8": "u8", "int8": "i8", "bool": "i1"}


def record(hidden: int, batch: int, path: str) -> list[str]:
    """Run the stack once under the interpreter (in this process) and write each distinct kernel launch's module
    file, name, argument types and meta-parameters to ``path``; the kernels' names."""
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    import torch
    from triton.runtime.interpreter import InterpretedFunction

    import nnforge as nf

    def lstm(x, h0, c0, w_ih, w_hh, b, reverse):
        def cell(carry, x_t):
            h, c = carry
            i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
            c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
            h = nf.sigmoid(o) * nf.tanh(c)
            return (h, c), h

        return nf.scan(cell, (h0, c0), x, reverse=reverse)[1]

    def stack(x, h0, c0, *ws):
        for k in range(5):
            x = lstm(x, h0, c0, *ws[3 * k:3 * k + 3], reverse=bool(k % 2))
        return x

    rng = np.random.default_rng(0)
    H = hidden
    ws = [(rng.standard_normal(s) * 0.1).astype(np.float16) for _ in range(5)
          for s in ((4 * H, H), (4 * H, H), (4 * H,))]
    x, h0, c0 = ((rng.standard_normal(s) * 0.1).astype(np.float16) for s in ((3, batch, H), (batch, H), (batch, H)))
    seen: dict[tuple, dict] = {}
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
        nf.compile(stack, backend="triton")(x, h0, c0, *ws)
    finally:
        InterpretedFunction.run = original
    with open(path, "w") as f:
        json.dump(list(seen.values()), f)
    return [r["name"] for r in seen.values()]


def compile_once(path: str, threads: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    with tempfile.TemporaryDirectory() as cache:
        env["TRITON_CACHE_DIR"] = cache
        done = subprocess.run([sys.executable, "-c", COMPILE, path, str(threads)], env=env, capture_output=True,
                              text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--batch", type=int, default=16)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NNFORGE_CACHE_DIR"] = tmp  # the generated modules, where the compile processes import them
        path = os.path.join(tmp, "launches.json")
        names = record(a.hidden, a.batch, path)
        import triton

        print(f"5-layer LSTM stack, H={a.hidden}, batch {a.batch}, float16: {len(names)} kernels {names}; "
              f"compiled for sm_90 by Triton {triton.__version__} on {os.cpu_count()} CPUs")
        ratios = []
        for r in range(a.rounds):
            order = (1, a.threads) if r % 2 == 0 else (a.threads, 1)
            got = {t: compile_once(path, t) for t in order}
            seq, pool = got[1]["total"], got[a.threads]["total"]
            ratios.append(seq / pool)
            each = ", ".join(f"{n} {s:.2f}" for n, s in got[1]["each"])
            print(f"round {r + 1}: in sequence {seq:.2f} s ({each}); {a.threads} threads {pool:.2f} s")
        print(f"sequence / {a.threads} threads: median {statistics.median(ratios):.2f}x "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
