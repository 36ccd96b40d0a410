"""Triton spellings of dtypes, sizes, literals and elementwise op formulas: one row per op.

Operands are already-evaluated Triton values (names of SSA temporaries); a formula returns the expression of the
op's result in the node's dtype. Math functions that the Triton interpreter does not provide (``libdevice`` is
not patched under ``TRITON_INTERPRET=1``) are small ``@triton.jit`` helpers in ``PRELUDE``, so the source that
runs on a GPU is the source the CPU-only tests check.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from ...dtypes import DType
from ...ir.dims import Dim
from ...ir.ops import Op
from ...passes.rows import ROWS
from ...schedule import Unsupported

TL_DTYPE = {DType.bool: "tl.int1", DType.int32: "tl.int32", DType.int64: "tl.int64", DType.float16: "tl.float16",
            DType.bfloat16: "tl.bfloat16", DType.float32: "tl.float32", DType.float64: "tl.float64"}
TORCH_DTYPE = {DType.bool: "torch.bool", DType.int32: "torch.int32", DType.int64: "torch.int64",
               DType.float16: "torch.float16", DType.bfloat16: "torch.bfloat16", DType.float32: "torch.float32",
               DType.float64: "torch.float64"}


def tl_dtype(dt: DType) -> str:
    if dt not in TL_DTYPE:
        raise Unsupported(f"the Triton renderer has no {dt.value} support")
    return TL_DTYPE[dt]


def rounded(expr: str, dt: DType) -> str:
    """A float32 result (of a product, a sum, a half op computed wide) in ``dt``: rounded once for half
    precision, as it is elsewhere. Half precision (``DType.is_half``): every op computes in float32 and rounds
    its result once (the reference's semantics, PyTorch's on CPUs); products and sums accumulate in float32."""
    return f"({expr}).to({tl_dtype(dt)})" if dt.is_half else expr


PRELUDE = '''\
# Under Triton's interpreter (numpy) nf_ex2 and nf_rcp compute exactly; compiled for a GPU they are its
# special-function unit's instructions, which the interpreter cannot run (no inline assembly). The source is the
# same in both: this constant, not the renderer, tells them apart (an offline build compiles what was recorded).
NF_INTERPRETED = tl.constexpr(os.environ.get("TRITON_INTERPRET", "") not in ("", "0"))


@triton.jit
def nf_ex2(x):
    """2^x of float32: on a GPU ex2.approx.ftz.f32 (2 ulp; below 2^-126 it is 0, from 2^128 inf), which Triton's
    exp2 and exp are without .ftz, at three more instructions; interpreted, tl.exp2 (inf where it overflows,
    without numpy's warning)."""
    if NF_INTERPRETED:
        return tl.where(x >= 128.0, float("inf"), tl.exp2(tl.minimum(x, 127.0, propagate_nan=tl.PropagateNan.ALL)))
    else:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def nf_rcp(x):
    """1 / x of float32: on a GPU rcp.approx.ftz.f32 (1 ulp; 0 where |x| passes 2^126), which a float32 division
    (div.full.f32) is behind four instructions of range checks; interpreted, a division."""
    if NF_INTERPRETED:
        return 1.0 / x
    else:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)


@triton.jit
def nf_tanh(x):
    """float32: the rational fit of the C prelude (max relative error 2.7e-7, clamped at 9, NaN kept), its
    denominator (1 to 420) inverted by ``nf_rcp``; float64: from exp(-2|x|), whose cancellation near 0 stays far
    below float64 tolerances."""
    if x.dtype == tl.float32:
        c = tl.maximum(x, -9.0, propagate_nan=tl.PropagateNan.ALL)  # one instruction each, NaN kept
        c = tl.minimum(c, 9.0, propagate_nan=tl.PropagateNan.ALL)
        s = c * c
        p = (((1.3737804e-08 * s + 2.0890167e-05) * s + 0.003512878) * s + 0.13395657) * s + 1.0
        q = (((7.9347086e-07 * s + 0.00033137616) * s + 0.025942983) * s + 0.46728981) * s + 1.0
        return c * p * nf_rcp(q)
    else:
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)


@triton.jit
def nf_sigmoid(x):
    """1 / (1 + e^-x): float32 by ``nf_ex2`` and ``nf_rcp`` (four instructions on a GPU; far below 0, e^-x is
    inf and its reciprocal 0); float64 from e^-|x| on both sides, without overflow."""
    if x.dtype == tl.float32:
        return nf_rcp(1.0 + nf_ex2(x * -1.4426950408889634))
    else:
        e = tl.exp(-tl.abs(x))
        return tl.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@triton.jit
def nf_log1p(x):
    """log(1 + x) without the cancellation of 1 + x: on a GPU libdevice's; interpreted, Kahan's form
    log(u) * x / (u - 1) of u = 1 + x, exact to a few ulps (the rounding of u cancels in the quotient)."""
    if NF_INTERPRETED:
        u = 1.0 + x
        inside = (u > 0.0) & (u != 1.0) & (u != float("inf"))  # false at NaN
        s = tl.where(inside, u, 2.0)  # where the quotient is not taken
        r = tl.where(u == 1.0, x, tl.log(s) * (x / (s - 1.0)))
        outside = tl.where(u == float("inf"), u, tl.where(u == 0.0, float("-inf"), float("nan")))
        return tl.where(inside | (u == 1.0), r, outside)
    else:
        return tl.extra.cuda.libdevice.log1p(x)


@triton.jit
def nf_expm1(x):
    """exp(x) - 1 without cancellation near 0: on a GPU libdevice's; interpreted, Kahan's form
    (u - 1) * x / log(u) of u = exp(x), where u's rounding cancels."""
    if NF_INTERPRETED:
        u = tl.exp(x)
        s = tl.where((u == 1.0) | (u == 0.0) | (u == float("inf")), 2.0, u)  # where the quotient is not taken
        r = (s - 1.0) * (x / tl.log(s))
        r = tl.where(u == 1.0, x, r)
        return tl.where((u == 0.0) | (u == float("inf")), u - 1.0, r)
    else:
        return tl.extra.cuda.libdevice.expm1(x)


@triton.jit
def nf_max(x, AXIS: tl.constexpr):
    """The maximum of float ``x`` along ``AXIS``, NaN where any value is (as numpy, torch and the reference):
    compiled for a GPU, ``tl.max`` takes the larger of a number and NaN to be the number."""
    return tl.where(tl.max((x != x).to(tl.int32), axis=AXIS) > 0, float("nan"), tl.max(x, axis=AXIS))


@triton.jit
def nf_halves(x, TR: tl.constexpr):
    """The two halves of a step tile's row values ([ROWS, 2w], or [2w, ROWS] transposed), as [ROWS, w] tiles:
    a row reduction over tiles of several widths folds the wider ones to the narrowest, element by element, then
    reduces across the row once (each reduction across a program's warps is a shared-memory round trip between
    barriers)."""
    if TR:
        h = tl.permute(tl.reshape(x, (2, x.shape[0] // 2, x.shape[1])), (1, 2, 0))
    else:
        h = tl.permute(tl.reshape(x, (x.shape[0], 2, x.shape[1] // 2)), (0, 2, 1))
    return tl.split(h)


@triton.jit
def nf_fold_sum(x, TR: tl.constexpr):
    """``x``'s halves added (``nf_halves``)."""
    a, b = nf_halves(x, TR)
    return a + b


@triton.jit
def nf_fold_max(x, TR: tl.constexpr):
    """``x``'s halves' maximum, NaN kept (``nf_halves``)."""
    a, b = nf_halves(x, TR)
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def nf_pow(a, b):
    """C's pow from exp and log: a negative base takes an integer exponent's sign (else NaN), a signed zero
    keeps its sign under an odd exponent, and pow(1, y), pow(x, 0), pow(-1, +-inf) are 1 even at NaN."""
    a, b = tl.broadcast(a, b)  # one shape for every mask below (a scalar exponent, a block of bases)
    r = tl.exp(b * tl.log(tl.abs(a)))
    whole = tl.floor(b) == b
    odd = whole & (tl.floor(b * 0.5) * 2.0 != b)
    negative = (a < 0) | ((a == 0) & (1.0 / a < 0))
    r = tl.where(negative & odd, -r, r)
    r = tl.where((a < 0) & ~whole, float("nan"), r)
    r = tl.where((tl.abs(a) == 1.0) & (tl.abs(b) == float("inf")), 1.0, r)
    return tl.where((b == 0) | (a == 1.0), 1.0, r)


@triton.jit
def nf_ipow(a, b):
    """Integer power by squaring (wrapping on overflow, as numpy's); exponents are at most 63 bits. A negative
    power is torch's: 1 for 1, +-1 for -1, else 0 (the quotient's integer part)."""
    one = a * 0 + 1
    r = one
    base = a
    e = b
    for _ in tl.static_range(63):
        r = tl.where((e & 1) != 0, r * base, r)
        base = base * base
        e = e >> 1
    fraction = tl.where(a == 1, one, tl.where(a == -1, tl.where((b & 1) != 0, -one, one), one * 0))
    return tl.where(b < 0, fraction, r)


@triton.jit
def nf_floordiv(a, b):
    """Integer division rounding down (numpy), where Triton's ``//`` truncates toward zero."""
    q = a // b
    return q - ((a % b != 0) & ((a < 0) != (b < 0))).to(q.dtype)


@triton.jit
def nf_grid_sync(sync, target):
    """Wait until ``target`` arrivals are counted at ``sync`` (an int64 in device memory), this program's one
    among them: the barrier between the kernels and steps of a resident loop, whose programs are all resident (a
    cooperative launch). Its threads' stores are done first (a CTA barrier) and published by the count's release
    (built for sm_90: MEMBAR.GPU before the atomic); the acquire of the count (for the last to arrive, its own
    increment's) orders its threads' later loads after the others' stores (an L1 invalidation after the load)."""
    tl.debug_barrier()
    seen = tl.atomic_add(sync, 1, sem="acq_rel", scope="gpu") + 1
    while seen < target:
        seen = tl.atomic_add(sync, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


def nf_resident_programs(dev):
    """The most programs a resident loop's launch may have: one per SM of the GPU, all resident at once; one
    under the interpreter, which runs programs one after another (a barrier among several would wait forever)."""
    if NF_INTERPRETED:
        return 1
    return torch.cuda.get_device_properties(dev).multi_processor_count


def nf_cooperative():
    """Whether a resident loop launches cooperatively (the driver checks that every program fits at once)."""
    return not NF_INTERPRETED


def nf_launch(kernel, grid, *args, **meta):
    """Launch unless the grid is empty (a zero-size result)."""
    if all(g > 0 for g in grid):
        kernel[grid](*args, **meta)


def nf_k_parts(k, most, least):
    """(K per part, parts) of a GEMM summing K in at most ``most`` parts, each a multiple of ``least`` long: as
    few parts as that leaves, one at least (an empty K is one empty part, which stores zeros)."""
    chunk = -(-max(1, -(-k // most)) // least) * least
    return chunk, max(1, -(-k // chunk))


def nf_mix64(z):
    """SplitMix64's finalizer on a Python int (the C prelude's nf_mix64)."""
    z = (z + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def nf_key(seed, draw, *counters):
    """A draw's Philox key: the call's seed mixed with the draw's number and the host loops' counters, below
    2**63 (an int64 kernel argument)."""
    z = nf_mix64(seed ^ nf_mix64(draw))
    for t in counters:
        z = nf_mix64(z ^ int(t))
    return z & 0x7FFFFFFFFFFFFFFF
'''


def literal(value: object, dt: DType) -> str:
    """A Python literal Triton reads as a weak scalar of ``dt``'s kind."""
    if dt == DType.bool:
        return "1" if value else "0"
    if dt.is_int:
        return str(int(value))
    v = float(value)
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else '-float("inf")'
    return repr(v)


class Sizes:
    """Renders sizes: run-time symbols as the kernel (and launcher) arguments ``S0, S1, ...`` in ``dynamic``
    order, the row-split batch symbol as ``rows`` (a persistent program's row block), everything else as
    literals. Derived run-time sizes (``T * N``) are printed as expressions of those arguments."""

    def __init__(self, dynamic: Sequence[str]):
        self.dynamic = list(dynamic)
        self.arg = {name: f"S{k}" for k, name in enumerate(self.dynamic)}

    def __call__(self, d: object) -> str:
        if isinstance(d, Dim):
            if not self._dynamic(d.expr):
                return str(int(d))
            return self._r(d.expr)
        return str(int(d))  # type: ignore[call-overload]

    def is_static(self, d: object) -> bool:
        return not (isinstance(d, Dim) and self._dynamic(d.expr))

    def _dynamic(self, e: tuple) -> bool:
        if e[0] == "sym":
            return e[1] in self.arg or e[1] == ROWS
        if e[0] == "const":
            return False
        return self._dynamic(e[1]) or self._dynamic(e[2])

    def _r(self, e: tuple) -> str:
        if e[0] == "const":
            return str(e[1])
        if e[0] == "sym":
            if e[1] == ROWS:
                return "rows"
            return self.arg[e[1]] if e[1] in self.arg else str(e[2])
        a, b = self._r(e[1]), self._r(e[2])
        return f"({a} {dict(add='+', sub='-', mul='*', floordiv='//', mod='%')[e[0]]} {b})"

    def prod(self, shape: Sequence[object]) -> str:
        if all(self.is_static(d) for d in shape):
            return str(math.prod(int(d) for d in shape))  # type: ignore[call-overload]
        return " * ".join(f"({self(d)})" for d in shape)


def mul(a: str, b: str) -> str:
    if a == "0" or b == "0":
        return "0"
    if a == "1":
        return b
    if b == "1":
        return a
    return f"({a}) * ({b})"


def add(a: str, b: str) -> str:
    if a == "0":
        return b
    if b == "0":
        return a
    return f"{a} + {b}"


def sliced(i: str, start: str, step: int = 1) -> str:
    """The source index that index ``i`` of a slice (``start``, ``step``) reads (one spelling for every user, so
    equal indices are equal strings: a constant start adds into the constant an index begins with, so a slice of
    a slice at 96 + 64 reads where a tile at 160 is held)."""
    lead = _LEAD.fullmatch(i)
    if step == 1 and start.isdigit() and lead:
        return add(str(int(start) + int(lead[1])), lead[2])
    return add(start, mul(i, str(step)))


_LEAD = re.compile(r"(\d+) \+ (.+)")  # an index that begins by adding a constant


def flat(idx: Sequence[str], shape: Sequence[str]) -> str:
    """Row-major offset of ``idx`` in a contiguous buffer of ``shape``."""
    if not idx:
        return "0"
    out = idx[0]
    for i, d in zip(idx[1:], shape[1:]):
        out = i if out == "0" else f"({out}) * {d} + {i}"
    return out


_UNARY = {Op.EXP: "tl.exp({a})", Op.LOG: "tl.log({a})", Op.SQRT: "tl.sqrt({a})", Op.SIN: "tl.sin({a})",
          Op.COS: "tl.cos({a})", Op.ERF: "tl.erf({a})", Op.TANH: "nf_tanh({a})", Op.SIGMOID: "nf_sigmoid({a})",
          Op.LOG1P: "nf_log1p({a})", Op.EXPM1: "nf_expm1({a})", Op.NEG: "(-{a})", Op.RECIP: "(1.0 / {a})"}
_COMPARE = {Op.LT: "<", Op.LE: "<=", Op.EQ: "==", Op.NE: "!="}


def formula(op: Op, dt: DType, src_dts: Sequence[DType], args: Sequence[str], attrs: Mapping) -> str:
    """The Triton expression of one elementwise op on evaluated operands, with the reference's semantics (NaN
    propagating max/min, sign 0 at NaN, integer division rounding down, float -> int casts truncating)."""
    if dt.is_half and op not in (Op.CAST, Op.WHERE, Op.NEG, Op.ABS):
        wide = [f"{x}.to(tl.float32)" if s.is_half else x for x, s in zip(args, src_dts)]
        return rounded(formula(op, DType.float32, [DType.float32] * len(args), wide, attrs), dt)
    a = args[0]
    b = args[1] if len(args) > 1 else ""
    fl = dt.is_float
    if op in _UNARY:
        if not fl and op != Op.NEG:
            raise Unsupported(f"no Triton form of {op.name.lower()} on {dt.value}")
        if op == Op.NEG and dt == DType.bool:
            return a
        return _UNARY[op].format(a=a)
    if op == Op.ABS:
        return a if dt == DType.bool else f"tl.abs({a})"
    if op == Op.SIGN:
        if dt == DType.bool:
            return a
        if fl:
            return f"tl.where({a} > 0, 1.0, tl.where({a} < 0, -1.0, 0.0)).to({tl_dtype(dt)})"
        return f"(({a} > 0).to({tl_dtype(dt)}) - ({a} < 0).to({tl_dtype(dt)}))"
    if op == Op.ADD:
        return f"({a} | {b})" if dt == DType.bool else f"({a} + {b})"
    if op == Op.SUB:
        return f"({a} - {b})"
    if op == Op.MUL:
        return f"({a} & {b})" if dt == DType.bool else f"({a} * {b})"
    if op == Op.DIV:
        return f"({a} / {b})" if fl else f"nf_floordiv({a}, {b})"
    if op == Op.POW:
        return f"nf_pow({a}, {b})" if fl else f"nf_ipow({a}, {b})"
    if op in (Op.MAX, Op.MIN):
        if fl:  # NaN where either is (torch's maximum); one max.NaN / min.NaN instruction on a GPU
            return f"tl.{'maximum' if op == Op.MAX else 'minimum'}({a}, {b}, propagate_nan=tl.PropagateNan.ALL)"
        return f"tl.where(({a} {'>' if op == Op.MAX else '<'} {b}), {a}, {b})"
    if op in _COMPARE:
        return f"({a} {_COMPARE[op]} {b})"
    if op == Op.WHERE:
        return f"tl.where({a}, {b}, {args[2]})"
    if op == Op.CAST:
        if dt == DType.bool:
            return f"({a} != 0)"
        if src_dts[0].is_float and dt in (DType.int32, DType.int64):
            # out of range (NaN, +-inf, |a| >= 2^(bits-1)) gives the lowest integer, as x86 (numpy, the C
            # backend) does; a GPU's conversion would saturate +inf to the highest
            bits = 8 * dt.itemsize - 1
            return f"tl.where({a} < {float(2 ** bits)!r}, {a}.to({tl_dtype(dt)}), {1 - 2 ** bits} - 1)"
        return f"{a}.to({tl_dtype(dt)})"
    raise Unsupported(f"no Triton formula for {op.name.lower()}")


def dot(a: str, b: str, dt: DType) -> str:
    """``tl.dot`` of ``dt`` operands accumulating in ``acc_dtype(dt)``: float32 in IEEE precision (TF32 would miss
    float32 tolerances), half precision on tensor cores into float32 (``rounded`` makes the result ``dt``)."""
    if dt == DType.float32:
        return f"tl.dot({a}, {b}, input_precision=\"ieee\")"
    if dt == DType.float64:
        return f"tl.dot({a}, {b}, out_dtype=tl.float64)"
    if dt.is_half:
        return f"tl.dot({a}, {b}, out_dtype=tl.float32)"
    raise Unsupported(f"no Triton GEMM on {dt.value}")


def tile_ids(rows: str, cols: str, group: int = 0) -> list[str]:
    """A GEMM program's tile from its one-axis program id, then the batch index ``pid_b``. One axis because CUDA
    caps a grid's second and third at 65535 programs, which a batch of products (attention's batch x heads)
    passes; the first takes 2^31 - 1, so the ids are worked out in int32 (an int64 division by a run-time value,
    a tile count, is a subroutine call on a GPU: built for sm_90 it spilled registers) and widened after.

    Programs run roughly in id order, so the order decides what the L2 cache can share. With ``group`` 0, ``pid_m``
    runs fastest over all row tiles (as a two-axis grid would order them): programs launched together share a
    column tile of B, and every row tile of A is read again for each column tile, long after it left the cache —
    a tall product such as an RNN's input projection (A: steps x batch rows, 393 MB at T = 2000, N = 1024, H =
    96, against a 50 MB L2) reads A from memory once per column tile (12 times). With ``group`` G, the row tiles
    are taken G at a time, and all column tiles of those G run before the next G: A's tiles are read once while
    they are in cache, B's (the weights) whenever it stays there."""
    head = ["pid = tl.program_id(0)", f"tiles_m = tl.cast(({rows} + BM - 1) // BM, tl.int32)",
            f"tiles_n = tl.cast(({cols} + BN - 1) // BN, tl.int32)", "tile = pid % (tiles_m * tiles_n)"]
    if group == 0:
        order = ["pid_m = tile % tiles_m", "pid_n = tile // tiles_m"]
    else:
        order = [f"first_m = tile // ({group} * tiles_n) * {group}", f"in_group = tile % ({group} * tiles_n)",
                 f"group_m = tl.minimum(tiles_m - first_m, {group})", "pid_m = first_m + in_group % group_m",
                 "pid_n = in_group // group_m"]
    return [*head, *order, "pid_b = (pid // (tiles_m * tiles_n)).to(tl.int64)",
            "rm = (pid_m.to(tl.int64) * BM + tl.arange(0, BM))[:, None]",
            "rn = (pid_n.to(tl.int64) * BN + tl.arange(0, BN))[None, :]"]


def tile_mask(rows: str, cols: str) -> str:
    """``mo``: which elements of a GEMM program's ``BM`` x ``BN`` tile (``tile_ids``) lie inside the result."""
    return f"mo = (rm < {rows}) & (rn < {cols})"


def acc_dtype(dt: DType) -> str:
    """The accumulator type of a product or sum in ``dt`` (``DType.accumulator``)."""
    if not (dt.is_float or dt.is_int):
        raise Unsupported(f"no Triton accumulation in {dt.value}")
    return tl_dtype(dt.accumulator)
