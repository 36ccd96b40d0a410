"""Issue 3's CPU speed table, every figure a ratio measured in the same run (interleaved rounds, medians).

For each shape (T, N, I, H), float32, 2 threads:

* one LSTM layer, inference: nnforge ``backend="cpu"`` vs ``torch.nn.LSTM`` (the anchor), ONNX Runtime's LSTM
  kernel (``nn.LSTM`` exported with ``torch.onnx``, spinning disabled as in bench/basecaller_cpu.py), an eager
  PyTorch cell loop, a TorchScript-scripted loop and ``torch.compile`` (the cell compiled, the loop in Python:
  compiling the unrolled loop of T steps takes minutes); the torch loops get the input projection hoisted out of
  the loop, as nnforge does, so they are the strong form of that code;
* a training step (forward + backward to the weights) vs ``nn.LSTM`` forward + backward;
* two cells cuDNN/oneDNN cannot run: a layer-norm LSTM and a GRU with the reset gate applied before the
  recurrent matmul (Cho et al. 2014), vs their TorchScript and torch.compile versions, and vs nn.LSTM's time.

Also the machine's matmul peak (best of torch sgemm and nnforge's own GEMM at 1536^3) and GFLOP/s of each run.
Usage: ``python bench/cells_cpu.py [--rounds 3] [--calls-per-turn 3] [--t-div 10] [--full-lstm]``
(``--full-lstm``: the LSTM forward at the issue's full T, everything else at T / t-div).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from basecaller_cpu import onnx_session
from lstm_cpu import lstm as nf_lstm  # the LSTM of bench/lstm_cpu.py, written as a user would

import nnforge as nf

SHAPES = [(2000, 64, 96, 96), (1000, 64, 384, 384), (100, 64, 512, 512)]
GOALS = {(64, 96, 96): 1.5, (64, 384, 384): 1.2, (64, 512, 512): 1.0}
ORT_GOALS = {(64, 96, 96): 1.3}  # nnforge inference vs ONNX Runtime's LSTM kernel


# ---- nnforge models -----------------------------------------------------------------------------------------
def _nf_ln(v, eps=1e-5):
    mu = v.mean(-1, keepdims=True)
    d = v - mu
    return d / nf.sqrt((d * d).mean(-1, keepdims=True) + eps)


def nf_ln_lstm(x, h0, c0, w_ih, w_hh, b):
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (_nf_ln(x_t @ w_ih.T) + _nf_ln(h @ w_hh.T) + b).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(_nf_ln(c))
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x)
    return ys, h, c


def nf_gru_cho(x, h0, w_ih, w_hrz, w_hn, b):
    def cell(h, x_t):
        xr, xz, xn = (x_t @ w_ih.T + b).chunk(3, axis=-1)
        hr, hz = (h @ w_hrz.T).chunk(2, axis=-1)
        r, z = nf.sigmoid(xr + hr), nf.sigmoid(xz + hz)
        n = nf.tanh(xn + (r * h) @ w_hn.T)
        h = (1.0 - z) * n + z * h
        return h, h

    h, ys = nf.scan(cell, h0, x)
    return ys, h


def nf_peephole_lstm(x, h0, c0, w_ih, w_hh, b, p):
    """An LSTM whose input and forget gates see the cell state and whose output gate sees the new one (Gers and
    Schmidhuber's peepholes, ``p`` = [p_i, p_f, p_o], each of width H): no cuDNN kernel runs it."""
    p_i, p_f, p_o = p.chunk(3, axis=-1)

    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
        c = nf.sigmoid(f + p_f * c) * c + nf.sigmoid(i + p_i * c) * nf.tanh(g)
        h = nf.sigmoid(o + p_o * c) * nf.tanh(c)
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x)
    return ys, h, c


# ---- torch loops (input projection hoisted) -----------------------------------------------------------------
def t_lstm_cell(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_hh: torch.Tensor):
    i, f, g, o = (gx + h @ w_hh.t()).chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return h, c


def t_ln_lstm_cell(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_hh: torch.Tensor, b: torch.Tensor):
    gh = h @ w_hh.t()
    i, f, g, o = (gx + F.layer_norm(gh, gh.shape[-1:]) + b).chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(F.layer_norm(c, c.shape[-1:]))
    return h, c


def t_gru_cho_cell(gx: torch.Tensor, h: torch.Tensor, w_hrz: torch.Tensor, w_hn: torch.Tensor):
    xr, xz, xn = gx.chunk(3, 1)
    hr, hz = (h @ w_hrz.t()).chunk(2, 1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + (r * h) @ w_hn.t())
    return (1.0 - z) * n + z * h


def t_peephole_cell(gx: torch.Tensor, h: torch.Tensor, c: torch.Tensor, w_hh: torch.Tensor, p: torch.Tensor):
    i, f, g, o = (gx + h @ w_hh.t()).chunk(4, 1)
    p_i, p_f, p_o = p.chunk(3, 0)
    c = torch.sigmoid(f + p_f * c) * c + torch.sigmoid(i + p_i * c) * torch.tanh(g)
    h = torch.sigmoid(o + p_o * c) * torch.tanh(c)
    return h, c


def t_lstm_loop(x, h, c, w_ih, w_hh, b):
    gx = (x @ w_ih.t() + b).unbind(0)
    ys = []
    for t in range(len(gx)):
        h, c = t_lstm_cell(gx[t], h, c, w_hh)
        ys.append(h)
    return torch.stack(ys)


def t_ln_lstm_loop(x, h, c, w_ih, w_hh, b):
    gxa = x @ w_ih.t()
    gx = F.layer_norm(gxa, gxa.shape[-1:]).unbind(0)
    ys = []
    for t in range(len(gx)):
        h, c = t_ln_lstm_cell(gx[t], h, c, w_hh, b)
        ys.append(h)
    return torch.stack(ys)


def t_peephole_loop(x, h, c, w_ih, w_hh, b, p):
    gx = (x @ w_ih.t() + b).unbind(0)
    ys = []
    for t in range(len(gx)):
        h, c = t_peephole_cell(gx[t], h, c, w_hh, p)
        ys.append(h)
    return torch.stack(ys)


def t_gru_cho_loop(x, h, w_ih, w_hrz, w_hn, b):
    gx = (x @ w_ih.t() + b).unbind(0)
    ys = []
    for t in range(len(gx)):
        h = t_gru_cho_cell(gx[t], h, w_hrz, w_hn)
        ys.append(h)
    return torch.stack(ys)


def compiled_loop(loop: Callable, cell_name: str) -> tuple[Callable, Callable]:
    """(loop with its cell replaced by torch.compile of the cell, a reset function)."""
    cell = globals()[cell_name]
    holder = {"fn": torch.compile(cell)}

    def run(*args):
        g = loop.__globals__
        old = g[cell_name]
        g[cell_name] = holder["fn"]
        try:
            return loop(*args)
        finally:
            g[cell_name] = old

    return run, holder


# ---- timing -----------------------------------------------------------------------------------------------
def timed(fn: Callable, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Schedule:
    """How candidates are timed: ``n`` interleaved rounds of one turn per candidate, ``per_turn`` calls a turn."""

    n: int
    per_turn: int = 1


def rounds(cands: dict[str, Callable[[], object]], sched: Schedule) -> dict[str, float]:
    """Median seconds per candidate over ``sched.n`` interleaved rounds (one warm-up call each first).

    With ``sched.per_turn`` > 1 each candidate's turn in a round is ``per_turn`` calls, the first untimed: what ran
    before it (another library's OpenMP threads still spinning on the two cores, its data in the caches) then
    slows no candidate's timed calls, each measured as a user calling it repeatedly would see it; the turns still
    interleave, so the machine's drift reaches every candidate alike."""
    for f in cands.values():
        f()
    ts: dict[str, list[float]] = {k: [] for k in cands}
    for _ in range(sched.n):
        for k, f in cands.items():
            if sched.per_turn > 1:
                f()
            ts[k] += [timed(f) for _ in range(max(sched.per_turn - 1, 1))]
    return {k: statistics.median(v) for k, v in ts.items()}


def matmul_peak() -> tuple[float, float]:
    """(torch sgemm, nnforge GEMM) best GFLOP/s at 1536^3, float32, on this machine now."""
    n = 1536
    a, b = torch.randn(n, n), torch.randn(n, n)
    best_t = min(timed(torch.matmul, a, b) for _ in range(8))
    mm = nf.compile(lambda x, y: x @ y, backend="cpu")
    an, bn = a.numpy(), b.numpy()
    mm(an, bn)
    best_n = min(timed(mm, an, bn) for _ in range(8))
    return 2 * n**3 / best_t / 1e9, 2 * n**3 / best_n / 1e9


def lstm_flops(T: int, N: int, I: int, H: int) -> float:
    return 2.0 * T * N * 4 * H * (I + H)


# ---- one shape ----------------------------------------------------------------------------------------------
def bench_lstm(T: int, N: int, I: int, H: int, n: Schedule, extras: bool) -> dict[str, float]:
    torch.manual_seed(0)
    ref = torch.nn.LSTM(I, H)
    x = torch.randn(T, N, I)
    h0, c0 = torch.zeros(N, H), torch.zeros(N, H)
    w_ih, w_hh = ref.weight_ih_l0.detach(), ref.weight_hh_l0.detach()
    b = (ref.bias_ih_l0 + ref.bias_hh_l0).detach()
    args = [t.numpy() for t in (x, h0, c0, w_ih, w_hh, b)]
    fn = nf.compile(nf_lstm, backend="cpu")
    with torch.no_grad():
        want = ref(x)[0].numpy()
    err = float(np.abs(fn(*args)[0] - want).max())
    cands: dict[str, Callable[[], object]] = {"nnforge": lambda: fn(*args)}

    def lstm_ref():
        with torch.no_grad():
            return ref(x)

    cands["nn.LSTM"] = lstm_ref
    sess = onnx_session(ref, (x, (h0[None], c0[None])), ["x", "h0", "c0"], ["y", "h", "c"],
                        {"x": {0: "t", 1: "n"}, "h0": {1: "n"}, "c0": {1: "n"}, "y": {0: "t", 1: "n"}})
    feeds = {"x": args[0], "h0": args[1][None], "c0": args[2][None]}
    ort_err = float(np.abs(sess.run(None, feeds)[0] - want).max())  # y: [T, N, H], as nn.LSTM's
    cands["onnxruntime"] = lambda: sess.run(None, feeds)
    out: dict[str, float] = {"max_err": err, "ort_err": ort_err}
    if extras:
        scripted = torch.jit.script(t_lstm_loop)
        comp, _ = compiled_loop(t_lstm_loop, "t_lstm_cell")
        targs = (x, h0, c0, w_ih, w_hh, b)
        with torch.no_grad():
            t0 = time.perf_counter()
            comp(*targs)
            out["torch.compile first call s"] = time.perf_counter() - t0

        def nograd(f: Callable) -> Callable[[], object]:
            def run():
                with torch.no_grad():
                    return f(*targs)
            return run

        cands["eager loop"] = nograd(t_lstm_loop)
        cands["TorchScript"] = nograd(scripted)
        cands["torch.compile"] = nograd(comp)
        # training: forward + backward to the weights
        def loss(*a):
            return (nf_lstm(*a)[0] * 1.0).sum()

        g = nf.compile(nf.grad(loss, argnums=(3, 4, 5)), backend="cpu")
        refp = [p for p in ref.parameters()]

        def train_ref():
            for p in refp:
                p.grad = None
            ref(x)[0].sum().backward()

        cands["nnforge train"] = lambda: g(*args)
        cands["nn.LSTM train"] = train_ref
    out.update(rounds(cands, n))
    return out


def bench_custom(T: int, N: int, I: int, H: int, n: Schedule) -> dict[str, dict[str, float]]:
    torch.manual_seed(1)
    s = 1.0 / H**0.5
    x, h0, c0 = torch.randn(T, N, I), torch.zeros(N, H), torch.zeros(N, H)
    res: dict[str, dict[str, float]] = {}
    # layer-norm LSTM
    w_ih, w_hh, b = torch.randn(4 * H, I) * s, torch.randn(4 * H, H) * s, torch.randn(4 * H) * s
    nfn = nf.compile(nf_ln_lstm, backend="cpu")
    nargs = [t.numpy() for t in (x, h0, c0, w_ih, w_hh, b)]
    targs = (x, h0, c0, w_ih, w_hh, b)
    res["layer-norm LSTM"] = _custom_rounds(nfn, nargs, t_ln_lstm_loop, "t_ln_lstm_cell", targs, n)
    # GRU, reset gate before the recurrent matmul
    w_ih, w_hrz, w_hn, b = (torch.randn(3 * H, I) * s, torch.randn(2 * H, H) * s, torch.randn(H, H) * s,
                            torch.randn(3 * H) * s)
    nfn = nf.compile(nf_gru_cho, backend="cpu")
    nargs = [t.numpy() for t in (x, h0, w_ih, w_hrz, w_hn, b)]
    targs = (x, h0, w_ih, w_hrz, w_hn, b)
    res["GRU (reset before matmul)"] = _custom_rounds(nfn, nargs, t_gru_cho_loop, "t_gru_cho_cell", targs, n)
    return res


def _custom_rounds(nfn, nargs, loop, cell_name, targs, n: Schedule) -> dict[str, float]:
    scripted = torch.jit.script(loop)
    comp, _ = compiled_loop(loop, cell_name)
    with torch.no_grad():
        want = loop(*targs).numpy()
        t0 = time.perf_counter()
        comp(*targs)
        first = time.perf_counter() - t0
    err = float(np.abs(nfn(*nargs)[0] - want).max())
    I, H = targs[0].shape[2], targs[1].shape[1]
    ref = torch.nn.LSTM(I, H)
    x = targs[0]

    def ng(f: Callable) -> Callable[[], object]:
        def run():
            with torch.no_grad():
                return f(*targs)
        return run

    def lstm_ref():
        with torch.no_grad():
            return ref(x)

    out = rounds({"nnforge": lambda: nfn(*nargs), "TorchScript": ng(scripted), "torch.compile": ng(comp),
                  "nn.LSTM": lstm_ref}, n)
    out["max_err"] = err
    out["torch.compile first call s"] = first
    return out


def _ort_goal(N: int, I: int, H: int) -> str:
    return f" (goal >= {ORT_GOALS[(N, I, H)]}x)" if (N, I, H) in ORT_GOALS else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--t-div", type=int, default=10, help="T divided by this for all but --full-lstm runs")
    ap.add_argument("--full-lstm", action="store_true", help="the nnforge vs nn.LSTM forward at full T too")
    ap.add_argument("--shapes", default="0,1,2")
    ap.add_argument("--calls-per-turn", type=int, default=3,
                    help="calls per candidate per round, the first untimed (1: one timed call, no settling call)")
    a = ap.parse_args()
    sched = Schedule(a.rounds, a.calls_per_turn)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, load average {os.getloadavg()}; "
          f"{a.rounds} rounds of {a.calls_per_turn} calls per candidate")
    pt, pn = matmul_peak()
    peak = max(pt, pn)
    print(f"matmul peak at 1536^3: torch {pt:.1f}, nnforge {pn:.1f} GFLOP/s (peak used below: {peak:.1f})")
    for k in map(int, a.shapes.split(",")):
        T, N, I, H = SHAPES[k]
        if a.full_lstm:
            r = bench_lstm(T, N, I, H, sched, extras=False)
            fl = lstm_flops(T, N, I, H)
            print(f"\n== LSTM {T},{N},{I},{H} (full T) inference: nnforge {r['nnforge'] * 1e3:.1f} ms, "
                  f"nn.LSTM {r['nn.LSTM'] * 1e3:.1f} ms, ratio {r['nn.LSTM'] / r['nnforge']:.2f}x "
                  f"(goal >= {GOALS[(N, I, H)]}x); ONNX Runtime {r['onnxruntime'] * 1e3:.1f} ms, ratio "
                  f"{r['onnxruntime'] / r['nnforge']:.2f}x{_ort_goal(N, I, H)}; nnforge "
                  f"{fl / r['nnforge'] / 1e9:.1f} GFLOP/s ({100 * fl / r['nnforge'] / 1e9 / peak:.0f}% of peak), "
                  f"nn.LSTM {fl / r['nn.LSTM'] / 1e9:.1f}; max err {r['max_err']:.1e} (ORT {r['ort_err']:.1e})")
        Tq = max(T // a.t_div, 10)
        r = bench_lstm(Tq, N, I, H, sched, extras=True)
        fl = lstm_flops(Tq, N, I, H)
        base = r["nn.LSTM"]
        print(f"\n== LSTM {Tq},{N},{I},{H} (T/{a.t_div}); load {os.getloadavg()[0]:.1f}; max err {r['max_err']:.1e}; "
              f"torch.compile first call {r['torch.compile first call s']:.1f} s")
        print(f"{'variant':>16} {'ms':>9} {'nn.LSTM time / this':>20} {'GFLOP/s':>8} {'% peak':>7}")
        for k2 in ("nnforge", "nn.LSTM", "onnxruntime", "eager loop", "TorchScript", "torch.compile"):
            print(f"{k2:>16} {r[k2] * 1e3:9.1f} {base / r[k2]:20.2f} {fl / r[k2] / 1e9:8.1f} "
                  f"{100 * fl / r[k2] / 1e9 / peak:7.0f}")
        print(f"{'':>16} nnforge vs ONNX Runtime: {r['onnxruntime'] / r['nnforge']:.2f}x{_ort_goal(N, I, H)}; "
              f"ORT max err {r['ort_err']:.1e}")
        for k2, b2 in (("nnforge train", "nn.LSTM train"), ("nn.LSTM train", "nn.LSTM train")):
            print(f"{k2:>16} {r[k2] * 1e3:9.1f} {r[b2] / r[k2]:20.2f} {3 * fl / r[k2] / 1e9:8.1f} "
                  f"{100 * 3 * fl / r[k2] / 1e9 / peak:7.0f}   (train ratio vs nn.LSTM fwd+bwd; 3x fwd flops)")
        for name, c in bench_custom(Tq, N, I, H, sched).items():
            print(f"  {name}: nnforge {c['nnforge'] * 1e3:.1f} ms; "
                  f"vs TorchScript {c['TorchScript'] / c['nnforge']:.2f}x, "
                  f"vs torch.compile {c['torch.compile'] / c['nnforge']:.2f}x (goal >= 3x); "
                  f"time / nn.LSTM time {c['nnforge'] / c['nn.LSTM']:.2f} (goal <= 1.1); "
                  f"torch.compile first call {c['torch.compile first call s']:.1f} s; max err {c['max_err']:.1e}")


if __name__ == "__main__":
    main()
