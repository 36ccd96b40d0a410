"""Cold compile time of a 5-layer LSTM stack on the GPU backend, and new sequence lengths that build nothing.

Issue 14's goal: a 5-layer stack (bench/lstm_cpu.py's layer, alternating direction, H = ``--hidden``, batch
``--batch``, float16) compiles in at most 5 s cold, and any later T without recompiling. Each measurement runs in a
fresh process whose nnforge and Triton caches are empty, after torch has initialized the device (a user's script has
imported torch before its first call): the first call at T = ``--steps`` (trace, passes, render, every kernel built —
in parallel before the first launch, ``codegen/triton/warm.py``), then calls at 1.5 T and T again, each with the files
it added to Triton's cache (0: nothing was built), and below the first what nnforge logged of its stages (trace,
passes, program built, kernels compiled ahead and launchers built on the pool). Modes: ``inference`` (the stack's
forward) and ``training`` (forward and backward into every weight). The anchor, measured the same way in a fresh
process with empty caches: torch.compile of one LSTM step, the cell a Python loop calls (cells_cpu.py's; what a custom
cell costs in torch today — compiling the whole stack's loop unrolls it and takes minutes), its first call at T (in
training with the backward through it); printed as the ratio anchor / nnforge (> 1: nnforge compiles faster). Rounds
alternate the order.

Usage: ``python bench/compile_gpu.py [--rounds 3] [--hidden 96] [--batch 1024] [--steps 2000]``; ``--smoke``
runs tiny shapes on the CPU under Triton's interpreter (it builds nothing: the times mean nothing).
Record results in docs/benchmarks.md with the device and date.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def files(folder: str) -> int:
    return sum(len(f) for _, _, f in os.walk(folder))


def child(mode: str, what: str, T: int, N: int, H: int, device: str, triton_cache: str) -> dict:
    """One cold measurement in this (fresh) process; its caches were set empty by the parent."""
    import cells_cpu
    import lstm_cpu
    import torch

    import nnforge as nf

    dtype = torch.float16 if device == "cuda" else torch.float32
    torch.manual_seed(0)

    def rnd(*shape):
        return (torch.randn(*shape, device=device) * 0.1).to(dtype)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    ws = [rnd(*s) for _ in range(5) for s in ((4 * H, H), (4 * H, H), (4 * H,))]
    h0, c0 = rnd(N, H), rnd(N, H)
    rnd(8, 8).sum().item()  # the device initialized, as in a user's script before its first call
    out: dict = {}

    said: list[str] = []  # what nnforge logs of its stages (trace, passes, build, kernels compiled ahead)
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())
    logging.getLogger("nnforge").addHandler(handler)
    logging.getLogger("nnforge").setLevel(logging.INFO)

    def timed(label, fn, *args):
        before, heard = files(triton_cache), len(said)
        t0 = time.perf_counter()
        fn(*args)
        sync()
        out[label] = {"s": time.perf_counter() - t0, "built": files(triton_cache) - before, "log": said[heard:]}

    if what == "torch.compile":
        compiled, _ = cells_cpu.compiled_loop(cells_cpu.t_lstm_loop, "t_lstm_cell")
        x, w = rnd(T, N, H), [t.requires_grad_(mode == "training") for t in ws[:3]]

        def step():
            ys = compiled(x, h0, c0, *w)
            if mode == "training":
                (ys * ys).sum().backward()

        timed(f"T={T}", step)
        return out

    fn = nf.compile(lstm_cpu.stack_step(mode), backend="triton")
    for steps in (T, T * 3 // 2, T):
        timed(f"T={steps}" + (" again" if f"T={steps}" in out else ""), fn, rnd(steps, N, H), h0, c0, *ws)
    return out


def measure(mode: str, what: str, a: argparse.Namespace) -> dict:
    """One measurement in a fresh process with empty nnforge, Triton and Inductor caches."""
    with tempfile.TemporaryDirectory(prefix="nnforge-cold-") as tmp:
        env = os.environ | {"NNFORGE_CACHE_DIR": f"{tmp}/nnforge", "TRITON_CACHE_DIR": f"{tmp}/triton",
                            "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor", "PYTHONPATH": os.pathsep.join(
                                [str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        if a.smoke:
            env["TRITON_INTERPRET"] = "1"
        Path(tmp, "triton").mkdir()
        args = [mode, what, str(a.steps), str(a.batch), str(a.hidden), "cpu" if a.smoke else "cuda", f"{tmp}/triton"]
        done = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True,
                              timeout=1800)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        mode, what, T, N, H, device, cache = sys.argv[i + 1:i + 8]
        print(json.dumps(child(mode, what, int(T), int(N), int(H), device, cache)))
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--mode", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU under Triton's interpreter")
    a = p.parse_args()
    if a.smoke:
        a.steps, a.batch, a.hidden, a.rounds = 4, 4, 16, 1
    else:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: run on a GPU, or --smoke for the CPU form")
        print(f"device: {torch.cuda.get_device_name()}")
    T = a.steps
    print(f"5-layer LSTM stack, H={a.hidden}, batch {a.batch}, {'float32 (smoke)' if a.smoke else 'float16'}; "
          f"cold: a fresh process, empty nnforge / Triton / Inductor caches; built = files added to Triton's cache")
    for mode in a.mode:
        firsts, anchors = [], []
        for r in range(a.rounds):
            order = [("nnforge", mode), ("torch.compile", mode)]
            for what, m in (order if r % 2 == 0 else order[::-1]):
                got = measure(m, what, a)
                if "error" in got:
                    print(f"  {mode} round {r + 1} {what}: failed: {got['error']}")
                    continue
                cells = "  ".join(f"{k} {v['s']:.2f} s (built {v['built']})" for k, v in got.items())
                print(f"  {mode} round {r + 1} {what:13s} {cells}")
                for line in got[f"T={T}"]["log"]:
                    print(f"      {line}")
                (firsts if what == "nnforge" else anchors).append(got[f"T={T}"]["s"])
        if firsts and anchors:
            f, t = statistics.median(firsts), statistics.median(anchors)
            print(f"{mode}: first call median {f:.2f} s (goal <= 5 s); torch.compile of one LSTM step {t:.2f} s; "
                  f"torch.compile / nnforge = {t / f:.2f}")


if __name__ == "__main__":
    main()
