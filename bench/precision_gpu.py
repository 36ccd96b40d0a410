"""Error of backend="triton" against float64, per dtype and model: forward outputs and the weight gradients of a
training step.

Models: an LSTM layer (bench/lstm_cpu.py) and the custom cells of bench/cells_cpu.py — layer-norm LSTM, GRU with
its reset gate before the matmul, peephole LSTM. Per model and dtype, inputs and weights are drawn once (seeded, in
float64) and rounded to the dtype; nnforge's Triton backend runs the model in the dtype, and the reference
interpreter runs it in float64 on the same rounded values: the error printed is the implementation's and the
dtype's arithmetic, not the rounding of the inputs. For context, the same model as a torch eager loop in the dtype
(cells_cpu's loops; forward only). Per output: max |got - ref| / max |ref| and ||got - ref|| / ||ref||. Training:
gradients of ``(ys * cot).sum()`` with respect to every weight.

On a GPU: float32, float16 and bfloat16 at ``--steps``/``--batch``/``--hidden`` (default 512 x 256 x 96; the
layer-norm LSTM at 64 steps at most, ``MAX_STEPS``).
``--interpret``: under Triton's interpreter on the CPU (``TRITON_INTERPRET=1`` set here), tiny shapes, float32 and
float16 only (the interpreter's bfloat16 arithmetic is wrong). Usage: ``python bench/precision_gpu.py
[--interpret] [--steps T --batch N --hidden H] [--dtypes float32 float16 bfloat16]``. Record in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import zlib

INTERPRET = "--interpret" in sys.argv
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import cells_cpu  # noqa: E402  (this folder, on sys.path when run as a script)
import lstm_cpu  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import nnforge as nf  # noqa: E402
from nnforge.dtypes import as_dtype  # noqa: E402
from nnforge.interop.convert import to_torch  # noqa: E402

# name: (nnforge model, torch eager loop, weights: name -> shape as a function of H, number of initial states)
MODELS = {
    "LSTM": (lstm_cpu.lstm, cells_cpu.t_lstm_loop,
             {"w_ih": lambda H: (4 * H, H), "w_hh": lambda H: (4 * H, H), "b": lambda H: (4 * H,)}, 2),
    "layer-norm LSTM": (cells_cpu.nf_ln_lstm, cells_cpu.t_ln_lstm_loop,
                        {"w_ih": lambda H: (4 * H, H), "w_hh": lambda H: (4 * H, H), "b": lambda H: (4 * H,)}, 2),
    "GRU (reset before matmul)": (cells_cpu.nf_gru_cho, cells_cpu.t_gru_cho_loop,
                                  {"w_ih": lambda H: (3 * H, H), "w_hrz": lambda H: (2 * H, H),
                                   "w_hn": lambda H: (H, H), "b": lambda H: (3 * H,)}, 1),
    "peephole LSTM": (cells_cpu.nf_peephole_lstm, cells_cpu.t_peephole_loop,
                      {"w_ih": lambda H: (4 * H, H), "w_hh": lambda H: (4 * H, H), "b": lambda H: (4 * H,),
                       "p": lambda H: (3 * H,)}, 2),
}

# Steps at most per model. The layer-norm LSTM (no learned gains) is chaotic with random weights: a float32
# evaluation of it leaves float64 by 7e-6 at T = 16, 2e-4 at 64 and 5e-2 at 256, and its weight gradients grow
# past float16's range (1e6 at T = 256, batch 64). At 64 steps float32 still measures nnforge; half precision's
# error there is the model's amplification for any implementation (the eager loop's is printed beside it).
MAX_STEPS = {"layer-norm LSTM": 64}


def errors(got: np.ndarray, ref: np.ndarray) -> str:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    worst = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-300)
    rms = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-300)
    return f"max {worst:.1e} rms {rms:.1e}"


def measure(name: str, T: int, N: int, H: int, dtype: str, device: str) -> None:
    model, loop, weights, n_states = MODELS[name]
    rng = np.random.default_rng(zlib.crc32(f"{name} {T} {N} {H}".encode()))
    np_dtype = as_dtype(dtype).np
    scale = 1.0 / np.sqrt(H)
    draws = [rng.standard_normal((T, N, H))] + [rng.standard_normal((N, H)) * 0.5 for _ in range(n_states)]
    draws += [rng.standard_normal(shape(H)) * scale for shape in weights.values()]
    low = [d.astype(np_dtype) for d in draws]  # the dtype's values
    exact = [d.astype(np.float64) for d in low]  # the same values in float64
    n_in = 1 + n_states
    low.append(rng.standard_normal((T, N, H)).astype(np_dtype))  # the training step's cotangent, last
    exact.append(low[-1].astype(np.float64))

    def loss(*a):
        *args, cot = a
        return (model(*args)[0] * cot).sum()

    on = [to_torch(a).to(device) for a in low]
    got = [o.cpu() if hasattr(o, "cpu") else o for o in nf.compile(model, backend="triton")(*on[:-1])]
    ref = nf.compile(model, backend="reference")(*exact[:-1])
    with torch.no_grad():
        eager = loop(*on[:-1]).float().cpu().numpy()
    outs = ["ys", "h", "c"][:len(ref)]
    print(f"{name} {dtype} T={T} N={N} H={H}")
    for k, (g, r) in enumerate(zip(got, ref, strict=True)):
        g = g.float().numpy() if isinstance(g, torch.Tensor) else g
        extra = f"   (torch eager loop in {dtype}: {errors(eager, r)})" if k == 0 else ""
        print(f"  {outs[k]:4s} {errors(g, r)}{extra}")
    argnums = tuple(range(n_in, len(low) - 1))
    grads = nf.compile(nf.grad(loss, argnums=argnums), backend="triton")(*on)
    ref_grads = nf.compile(nf.grad(loss, argnums=argnums), backend="reference")(*exact)
    for w, g, r in zip(weights, grads, ref_grads, strict=True):
        g = g.float().cpu().numpy() if isinstance(g, torch.Tensor) else g
        print(f"  d{w:5s} {errors(g, r)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interpret", action="store_true", help="Triton's interpreter on the CPU, tiny shapes")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--dtypes", nargs="+")
    p.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    a = p.parse_args()
    device = "cpu" if a.interpret else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/precision_gpu.py needs a CUDA device (or --interpret)")
    T = a.steps or (16 if a.interpret else 512)
    N = a.batch or (4 if a.interpret else 256)
    H = a.hidden or (16 if a.interpret else 96)
    dtypes = a.dtypes or (["float32", "float16"] if a.interpret else ["float32", "float16", "bfloat16"])
    if a.interpret and "bfloat16" in dtypes:
        sys.exit("bfloat16 under the interpreter is wrong arithmetic, not a measurement: run it on a GPU")
    where = "CPU, Triton interpreter" if a.interpret else torch.cuda.get_device_name()
    print(f"device: {where}; error vs float64 on the same rounded inputs (max: max|err| / max|ref|; rms: "
          "||err|| / ||ref||)")
    for name in a.models:
        for dtype in dtypes:
            measure(name, min(T, MAX_STEPS.get(name, T)), N, H, dtype, device)


if __name__ == "__main__":
    main()
