"""A grammar fuzzer: random small programs run by nnforge (eager and compiled) and by torch, values and gradients.

A program is a list of steps over a growing pool of values. Each step picks an op from a small grammar (elementwise
unary/binary with broadcasting and Python scalars, reductions, softmax family, matmul against a fresh weight,
movement ops, slicing with any step, concat, pad, where, a scan over a value's leading axis, a Conv1d of a [N, C, L]
value with a fresh weight, a layer norm over the last axis, a linear layer with its activation and maybe a layer
norm, the last axis split into two heads moved before the axis ahead of it as attention does) and operands of
fitting shapes from the pool, half the time the value just made (a chain, where kernels fuse). ``run`` interprets
the same program with either library, so the torch result is the same computation built independently. The loss is
a random projection of every value in the pool, so every step's gradient is checked. The test runs on every backend
(the ``backend`` fixture): each example is also compiled for it, one C build per example on ``cpu`` (~0.7 s; the 60
examples add ~40 s with ``-n 2``).

``make test`` runs a fixed set of examples. For more, ``NNFORGE_FUZZ_EXAMPLES=N`` runs N of that set (the first ones
are make test's), and ``NNFORGE_FUZZ_SEED=S`` draws them from seed S instead: another seed, other programs. A failure
replays with the same two variables (hypothesis prints the example and shrinks it).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, note, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

import nnforge as nf
import nnforge.nn.functional as NF

from .compiled import run_compiled
from .scan_util import py_scan
from .utils import assert_close, to_torch, torch_getitem

MAX_EXAMPLES = int(os.environ.get("NNFORGE_FUZZ_EXAMPLES", "60"))
FUZZ_SEED = os.environ.get("NNFORGE_FUZZ_SEED")
UNARY = ["neg", "tanh", "sigmoid", "sin", "cos", "exp_tanh", "log1p_sq", "sqrt1p_sq", "abs", "relu", "sq", "cube",
         "recip1p_sq", "cast_roundtrip"]
BINARY = ["add", "sub", "mul", "div_safe", "maximum", "minimum"]


def broadcastable(a: tuple, b: tuple) -> bool:
    return all(x == y or x == 1 or y == 1 for x, y in zip(a[::-1], b[::-1]))


def bshape(a: tuple, b: tuple) -> tuple:
    return tuple(np.broadcast_shapes(a, b))


# ---- the interpreter ------------------------------------------------------------------------------------------
def unary(lib: str, op: str, a):
    if op == "neg":
        return -a
    if op == "tanh":
        return a.tanh()
    if op == "sigmoid":
        return a.sigmoid()
    if op == "sin":
        return a.sin()
    if op == "cos":
        return a.cos()
    if op == "exp_tanh":
        return a.tanh().exp()
    if op == "log1p_sq":
        return (a * a).log1p()
    if op == "sqrt1p_sq":
        return (1 + a * a).sqrt()
    if op == "abs":
        return a.abs()
    if op == "relu":
        return a.relu()
    if op == "sq":
        return a ** 2
    if op == "cube":
        return a ** 3
    if op == "recip1p_sq":
        return 1.0 / (1 + a * a)
    if op == "cast_roundtrip":
        return a.to(torch.float32).to(torch.float64) if lib == "torch" else a.cast("float32").cast("float64")
    raise AssertionError(op)


def binary(lib: str, op: str, a, b):
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div_safe":
        return a / (b * b + 1)
    mod = torch if lib == "torch" else nf
    if not hasattr(a, "shape"):
        a = torch.tensor(a, dtype=torch.float64) if lib == "torch" else nf.tensor(a, dtype="float64")
    if not hasattr(b, "shape"):
        b = torch.tensor(b, dtype=torch.float64) if lib == "torch" else nf.tensor(b, dtype="float64")
    return mod.maximum(a, b) if op == "maximum" else mod.minimum(a, b)


def reduce(lib: str, op: str, a, axis, keep: bool):
    if lib == "nf":
        return {"sum": a.sum, "mean": a.mean, "max": a.max, "min": a.min, "var": a.var}[op](axis, keepdims=keep)
    if axis is None:
        out = {"sum": a.sum, "mean": a.mean, "max": a.amax, "min": a.amin, "var": a.var}[op]()
        return out.reshape((1,) * a.ndim) if keep else out
    fn = {"sum": a.sum, "mean": a.mean, "max": a.amax, "min": a.amin, "var": a.var}[op]
    return fn(axis, keepdim=keep)


def scan_step(lib: str, template: int, xs, c0, w, reverse: bool):
    scan = nf.scan if lib == "nf" else py_scan

    def body(c, x):
        if template == 0:
            c2 = (c * w + x).tanh()
            return c2, c2 * 2
        if template == 1:
            c2 = c * x.sigmoid() + w.sin()
            return c2, c * x
        c2 = (c @ w + x).tanh()  # w: [D, D]
        return c2, c2.sum(-1)

    c, ys = scan(body, c0, xs, reverse=reverse)
    return [c, ys]


def run(program: list, lib: str, inputs: list, n_first: int) -> list:
    """The pool after running ``program``: the first ``n_first`` inputs, then one value per step result.

    An ``("input", k)`` step brings in ``inputs[k]`` (a weight made for a matmul or scan step).
    """
    pool = list(inputs[:n_first])
    for step in program:
        kind = step[0]
        if kind == "input":
            pool.append(inputs[step[1]])
        elif kind == "unary":
            pool.append(unary(lib, step[1], pool[step[2]]))
        elif kind == "binary":
            _, op, i, j = step
            pool.append(binary(lib, op, pool[i], pool[j]))
        elif kind == "binary_scalar":
            _, op, i, s, left = step
            pool.append(binary(lib, op, s, pool[i]) if left else binary(lib, op, pool[i], s))
        elif kind == "reduce":
            _, op, i, axis, keep = step
            pool.append(reduce(lib, op, pool[i], axis, keep))
        elif kind == "softmax":
            _, op, i, axis = step
            a = pool[i]
            pool.append(a.softmax(axis) if op == "softmax" else a.log_softmax(axis) if op == "log_softmax"
                        else a.logsumexp(axis))
        elif kind == "matmul":
            _, i, w = step
            pool.append(pool[i] @ pool[w])
        elif kind == "reshape":
            pool.append(pool[step[1]].reshape(*step[2]))
        elif kind == "permute":
            pool.append(pool[step[1]].permute(*step[2]))
        elif kind == "transpose":
            pool.append(pool[step[1]].transpose(step[2], step[3]))
        elif kind == "expand":
            pool.append(pool[step[1]].unsqueeze(0).expand(*step[2]))
        elif kind == "index":
            a = pool[step[1]]
            pool.append(torch_getitem(a, step[2]) if lib == "torch" else a[step[2]])
        elif kind == "flip":
            pool.append(pool[step[1]].flip(step[2]))
        elif kind == "squeeze":
            pool.append(pool[step[1]].unsqueeze(step[2]).squeeze(step[2]) * 1.5)
        elif kind == "concat":
            _, i, j, axis = step
            pool.append(torch.cat([pool[i], pool[j]], axis) if lib == "torch" else nf.concat([pool[i], pool[j]], axis))
        elif kind == "stack":
            _, i, j, axis = step
            pool.append(torch.stack([pool[i], pool[j]], axis) if lib == "torch"
                        else nf.stack([pool[i], pool[j]], axis))
        elif kind == "pad":
            _, i, pads = step
            a = pool[i]
            flat = tuple(v for lo_hi in reversed(pads) for v in lo_hi)
            pool.append(F.pad(a, flat, value=0.5) if lib == "torch" else a.pad(pads, value=0.5))
        elif kind == "where":
            _, i, j = step
            a, b = pool[i], pool[j]
            pool.append(torch.where(a > b, a, b * 0.5) if lib == "torch" else nf.where(a > b, a, b * 0.5))
        elif kind == "scan":
            _, template, x, c, w, reverse = step
            pool.extend(scan_step(lib, template, pool[x], pool[c], pool[w], reverse))
        elif kind == "layer_norm":
            _, i, w, b = step
            a = pool[i]
            weight, bias = (None if k is None else pool[k] for k in (w, b))
            norm = F.layer_norm if lib == "torch" else NF.layer_norm
            pool.append(norm(a, (a.shape[-1],), weight, bias, 1e-5))
        elif kind == "linear":
            _, i, w, b, act, norm = step
            y = pool[i] @ pool[w] + pool[b]
            y = y if act == "none" else unary(lib, act, y)
            pool.append((F.layer_norm if lib == "torch" else NF.layer_norm)(y, (y.shape[-1],)) if norm else y)
        elif kind == "heads":
            a = pool[step[1]]
            pool.append(a.reshape(*a.shape[:-1], 2, a.shape[-1] // 2).transpose(-2, -3))
        elif kind == "conv1d":
            _, i, w, b, stride, padding, dilation = step
            conv = F.conv1d if lib == "torch" else NF.conv1d
            pool.append(conv(pool[i], pool[w], None if b is None else pool[b], stride, padding, dilation))
        else:
            raise AssertionError(kind)
    return pool


# ---- the generator --------------------------------------------------------------------------------------------
ranks = st.sampled_from([0, 1, 2, 2, 3, 3, 3])  # mostly 2-d and 3-d: that is where movement ops get interesting
shapes = ranks.flatmap(lambda r: st.lists(st.integers(1, 4), min_size=r, max_size=r)).map(tuple)


@st.composite
def programs(draw):
    """(program, input shapes): each step's operands are drawn among pool values of fitting shapes."""
    in_shapes = draw(st.lists(shapes, min_size=1, max_size=3))
    pool = list(in_shapes)
    n_inputs = len(pool)
    extra: list[tuple] = []  # weights created by matmul/scan steps (extra inputs)
    program = []

    def new_input(shape):
        extra.append(tuple(shape))
        program.append(("input", n_inputs + len(extra) - 1))
        pool.append(tuple(shape))
        return len(pool) - 1

    def pick(pred=lambda s: True):
        cands = [k for k, s in enumerate(pool) if pred(s)]
        return draw(st.sampled_from(cands)) if cands else None

    for _ in range(draw(st.integers(3, 8))):
        kind = draw(st.sampled_from(["unary", "binary", "binary", "binary_scalar", "reduce", "softmax", "matmul",
                                     "reshape", "permute", "transpose", "expand", "index", "flip", "squeeze",
                                     "concat", "stack", "pad", "where", "scan", "scan", "conv1d", "layer_norm",
                                     "linear", "heads"]))
        i = len(pool) - 1 if draw(st.booleans()) else pick()  # half the time a chain: where kernels fuse
        s = pool[i]
        if kind == "unary":
            program.append(("unary", draw(st.sampled_from(UNARY)), i))
            pool.append(s)
        elif kind in ("binary", "where"):
            j = pick(lambda t, s=s: broadcastable(s, t))
            program.append(("binary", draw(st.sampled_from(BINARY)), i, j) if kind == "binary" else ("where", i, j))
            pool.append(bshape(s, pool[j]))
        elif kind == "binary_scalar":
            scalar = draw(st.sampled_from([0.5, -1.5, 2.0, 3]))
            program.append(("binary_scalar", draw(st.sampled_from(BINARY)), i, scalar, draw(st.booleans())))
            pool.append(s)
        elif kind == "reduce":
            op = draw(st.sampled_from(["sum", "mean", "max", "min", "var"]))
            nd = len(s)
            axis = draw(st.one_of(st.none(), st.integers(-nd, nd - 1), st.tuples(st.integers(0, nd - 1),
                                                                                 st.integers(0, nd - 1))
                                  .filter(lambda t: t[0] != t[1]))) if nd else None
            count = int(np.prod([s[a] for a in ([axis] if isinstance(axis, int) else axis or range(nd))]))
            if op == "var" and count < 2:
                op = "sum"
            keep = draw(st.booleans())
            program.append(("reduce", op, i, axis, keep))
            axes = set(range(nd)) if axis is None else {axis % nd} if isinstance(axis, int) else set(axis)
            pool.append(tuple(1 if k in axes else d for k, d in enumerate(s)) if keep
                        else tuple(d for k, d in enumerate(s) if k not in axes))
        elif kind == "softmax" and s:
            axis = draw(st.integers(-len(s), len(s) - 1))
            op = draw(st.sampled_from(["softmax", "log_softmax", "logsumexp"]))
            program.append(("softmax", op, i, axis))
            pool.append(s if op != "logsumexp" else tuple(d for k, d in enumerate(s) if k != axis % len(s)))
        elif kind == "matmul" and s:
            if draw(st.booleans()):
                w = new_input((s[-1], draw(st.integers(1, 4))))
                out = (*s[:-1], pool[w][1])
            else:
                w = new_input((s[-1],))
                out = s[:-1]
            program.append(("matmul", i, w))
            pool.append(out)
        elif kind == "reshape" and s:
            target = draw(st.sampled_from([(int(np.prod(s)),), s[::-1], (1, *s), (-1, s[-1])]))
            program.append(("reshape", i, target))
            pool.append(tuple(np.empty(s).reshape(target).shape))
        elif kind == "permute" and len(s) >= 2:
            perm = tuple(draw(st.permutations(range(len(s))).filter(lambda p: list(p) != sorted(p))))
            program.append(("permute", i, perm))
            pool.append(tuple(s[p] for p in perm))
        elif kind == "transpose" and len(s) >= 2:
            a, b = draw(st.integers(0, len(s) - 1)), draw(st.integers(-len(s), -1))
            program.append(("transpose", i, a, b))
            t = list(s)
            t[a], t[b] = t[b], t[a]
            pool.append(tuple(t))
        elif kind == "expand" and len(s) <= 2:
            target = (draw(st.integers(2, 3)), *s)
            program.append(("expand", i, target))
            pool.append(target)
        elif kind == "index" and s:
            idx = []
            for d in s:
                choice = draw(st.sampled_from(["all", "int", "slice", "none"]))
                if choice == "int":
                    idx.append(draw(st.integers(-d, d - 1)))
                elif choice == "slice":
                    step_ = draw(st.sampled_from([1, 2, -1, -2, 3]))
                    sl = slice(draw(st.one_of(st.none(), st.integers(-d - 1, d))),
                               draw(st.one_of(st.none(), st.integers(-d - 1, d))), step_)
                    if np.arange(d)[sl].size == 0:
                        sl = slice(None, None, step_)
                    idx.append(sl)
                elif choice == "none":
                    idx.extend([None, slice(None)])
                else:
                    idx.append(slice(None))
            if draw(st.booleans()) and len(idx) > 1 and isinstance(idx[-1], slice) and idx[-1] == slice(None):
                idx = [*idx[:-1], Ellipsis]
            index = tuple(idx)
            program.append(("index", i, index))
            pool.append(np.empty(s)[index].shape)
        elif kind == "flip" and s:
            axes = tuple(sorted(set(draw(st.lists(st.integers(0, len(s) - 1), min_size=1, max_size=len(s))))))
            program.append(("flip", i, axes))
            pool.append(s)
        elif kind == "squeeze":
            ax = draw(st.integers(-len(s) - 1, len(s)))
            program.append(("squeeze", i, ax))
            pool.append(s)
        elif kind in ("concat", "stack") and s:
            axis = draw(st.integers(-len(s), len(s) - 1))
            if kind == "concat":
                ax = axis % len(s)
                j = pick(lambda t, s=s, ax=ax: len(t) == len(s) and all(
                    a == b for k, (a, b) in enumerate(zip(s, t)) if k != ax))
                out = list(s)
                out[axis] = s[axis] + pool[j][axis]
            else:
                j = pick(lambda t, s=s: t == s)
                out = list(s)
                out.insert(axis % (len(s) + 1) if axis >= 0 else len(s) + 1 + axis, 2)
            program.append((kind, i, j, axis))
            pool.append(tuple(out))
        elif kind == "pad" and s:
            pads = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in s)
            program.append(("pad", i, pads))
            pool.append(tuple(d + lo + hi for d, (lo, hi) in zip(s, pads)))
        elif kind == "layer_norm" and s:  # a row kernel; after a matmul, one led by its GEMM
            w = new_input((s[-1],)) if draw(st.booleans()) else None
            b = new_input((s[-1],)) if draw(st.booleans()) else None
            program.append(("layer_norm", i, w, b))
            pool.append(s)
        elif kind == "linear" and s:  # the bias and activation on the GEMM's accumulator
            n = draw(st.integers(1, 4))
            w, b = new_input((s[-1], n)), new_input((n,))
            program.append(("linear", i, w, b, draw(st.sampled_from(["none", "relu", "tanh", "sigmoid"])),
                            draw(st.booleans())))  # then a layer norm of its rows: one kernel led by the GEMM
            pool.append((*s[:-1], n))
        elif kind == "heads" and len(s) >= 2 and s[-1] % 2 == 0:  # work before the split moves onto a product
            program.append(("heads", i))
            pool.append((*s[:-2], 2, s[-2], s[-1] // 2))
        elif kind == "conv1d" and len(s) == 3:  # [N, C, L]: an im2col, a grouped or a channels-last product
            k, stride, dilation = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
            span = dilation * (k - 1) + 1
            padding = max(draw(st.integers(0, 2)), (span - s[2] + 1) // 2)  # at least one output position
            cout = draw(st.sampled_from([1, 2, 3, 64]))  # 64: channels as columns (nn.functional's other form)
            w = new_input((cout, s[1], k))
            b = new_input((cout,)) if draw(st.booleans()) else None
            program.append(("conv1d", i, w, b, stride, padding, dilation))
            pool.append((s[0], cout, (s[2] + 2 * padding - span) // stride + 1))
        elif kind == "scan" and len(s) >= 2:
            carry = s[1:]
            template = draw(st.integers(0, 2))
            c = pick(lambda t, carry=carry: t == carry)
            if c is None or draw(st.booleans()):
                c = new_input(carry)
            if template == 2:
                w = new_input((carry[-1], carry[-1]))
                ys = (s[0], *carry[:-1])
            else:
                w = pick(lambda t, carry=carry: broadcastable(carry, t) and bshape(carry, t) == carry)
                if w is None:
                    w = new_input(carry)
                ys = s
            program.append(("scan", template, i, c, w, draw(st.booleans())))
            pool.extend([carry, ys])
    return program, list(in_shapes) + extra, n_inputs, pool


def _loss(values, projections):
    total = 0.0
    for v, p in zip(values, projections):
        total = total + (v * p).sum()
    return total


@pytest.fixture
def base_seed(rng: np.random.Generator) -> int:
    """Drawn once per test (not per example) from the test id's generator; each example's inputs come from it and
    the example's own ``seed``, so a shrunk or replayed example sees the same numbers."""
    return int(rng.integers(2 ** 63))


def _seeded(test):
    """The examples of ``NNFORGE_FUZZ_SEED`` where it is set, else the derandomized set."""
    return hypothesis_seed(int(FUZZ_SEED))(test) if FUZZ_SEED else test


# The backend fixture is function-scoped and the same for every example of one test: nothing to reset between them.
@_seeded
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=FUZZ_SEED is None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(case=programs(), seed=st.integers(0, 2 ** 32 - 1))
def test_random_programs_match_torch(backend, base_seed, case, seed):
    """Every value of the pool, the loss and its gradients against torch: eagerly (the reference backend's part
    of the matrix), then as one program compiled for ``backend`` that returns them all (one build per example).

    Every value is float64 (a cast round-trip through float32 rounds the same way everywhere), so the compiled C
    code keeps the float64 tolerances: its reassociated sums and vector libm are off by a few ulps, far inside them.
    """
    program, in_shapes, n_first, _ = case
    note(f"program: {program}")
    note(f"input shapes: {in_shapes}")
    r = np.random.default_rng([base_seed, seed])
    ins = [np.asarray(r.standard_normal(s) + 0.1) for s in in_shapes]  # 0-d too: an array, not a static float
    argnums = tuple(range(len(ins)))

    tin = [to_torch(a, requires_grad=True) for a in ins]
    t_values = run(program, "torch", tin, n_first)
    projections = [r.standard_normal(tuple(v.shape)) for v in t_values]
    t_loss = _loss(t_values, [to_torch(p) for p in projections])
    t_grads = [torch.zeros_like(t) if g is None else g
               for t, g in zip(tin, torch.autograd.grad(t_loss, tin, allow_unused=True))]

    def check(values, value, grads, how):
        assert len(values) == len(t_values), how
        for k, (nv, tv) in enumerate(zip(values, t_values)):
            assert tuple(nv.shape) == tuple(tv.shape), f"{how} value {k}: shape {tuple(nv.shape)} vs {tuple(tv.shape)}"
            assert_close(nv, tv, "float64", what=f"{how} value {k}")
        assert_close(value, t_loss, "float64", what=f"{how} loss")
        assert len(grads) == len(t_grads), how
        for k, (g, tg) in enumerate(zip(grads, t_grads)):
            assert_close(g, tg, "float64", grad=True, what=f"{how} grad of input {k}")

    def loss_fn(*args):
        return _loss(run(program, "nf", list(args), n_first), projections)

    if backend == "reference":
        check(run(program, "nf", [nf.tensor(a) for a in ins], n_first),
              *nf.value_and_grad(loss_fn, argnums=argnums)(*ins), "eager")

    # the same program compiled (traced once, optimized by the pass pipeline, built for ``backend``) agrees too
    def values_and_grads(*args):
        return run(program, "nf", list(args), n_first), *nf.value_and_grad(loss_fn, argnums=argnums)(*args)

    # No op of the grammar is known to be left to the interpreter: ``run_compiled`` raises ``Fallback`` (a failure
    # of this example) when the program ran there instead of as compiled code.
    values, value, grads = run_compiled(values_and_grads, ins, backend)
    check(values, value, grads, f"compiled ({backend})")
