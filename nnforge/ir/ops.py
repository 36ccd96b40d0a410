"""The op set: one enum member per op, and the groups transforms dispatch on.

The set is small on purpose. Higher-level functions (softmax, layer norm, an LSTM cell) are compositions in the
frontend, so every transform (autodiff, reference, C, Triton) only needs a rule per member here. Binary and
ternary ops take operands of identical shape: the frontend makes broadcasting explicit with reshape + expand,
which later become index expressions of the consuming kernel instead of copies. Each op's rules (shape/dtype,
numpy, vjp) stand together in its family module under ``nnforge.ir.opdefs`` (see ``nnforge.ir.registry``).
"""

from __future__ import annotations

import enum


class Op(enum.Enum):
    # leaves
    INPUT = enum.auto()     # placeholder of a graph or loop body: attrs name, shape, dtype
    CONST = enum.auto()     # a scalar filled to a shape: attrs value, shape, dtype
    DATA = enum.auto()      # a concrete array: attrs array
    RAND = enum.auto()      # fresh random numbers on every evaluation: attrs shape, dtype, dist ("uniform"|"normal")
    FEEDER = enum.auto()    # host -> device: calls attrs fn() on every evaluation
    # elementwise
    NEG = enum.auto()
    EXP = enum.auto()
    LOG = enum.auto()
    SQRT = enum.auto()
    RECIP = enum.auto()
    SIN = enum.auto()
    COS = enum.auto()
    TANH = enum.auto()
    SIGMOID = enum.auto()
    ERF = enum.auto()
    LOG1P = enum.auto()     # log(1 + x), exact near 0 (a softplus's or log-sigmoid's tail)
    EXPM1 = enum.auto()     # exp(x) - 1, exact near 0 (an ELU's negative side)
    ABS = enum.auto()
    SIGN = enum.auto()
    ADD = enum.auto()
    SUB = enum.auto()
    MUL = enum.auto()
    DIV = enum.auto()
    POW = enum.auto()
    MAX = enum.auto()
    MIN = enum.auto()
    LT = enum.auto()
    LE = enum.auto()
    EQ = enum.auto()
    NE = enum.auto()
    WHERE = enum.auto()
    CAST = enum.auto()      # attrs dtype
    # reductions: attrs axes (sorted tuple), keepdims
    SUM = enum.auto()
    REDUCE_MAX = enum.auto()
    # contraction: [..., m, k] @ [..., k, n], batch dims equal
    MATMUL = enum.auto()
    # movement: never copies unless a pass decides so
    RESHAPE = enum.auto()   # attrs shape
    PERMUTE = enum.auto()   # attrs perm
    EXPAND = enum.auto()    # attrs shape (size-1 axes grow)
    SLICE = enum.auto()     # attrs starts, stops, steps (steps may be negative: flip)
    PAD = enum.auto()       # attrs pads ((lo, hi) per axis), value
    CONCAT = enum.auto()    # attrs axis
    # indexing by data: (x, index), index int32/int64 of x's rank; attrs axis (GATHER), axis and size (SCATTER_ADD)
    GATHER = enum.auto()       # out[i] = x[i with i[axis] replaced by index[i]] (torch.gather, take_along_axis)
    SCATTER_ADD = enum.auto()  # out = zeros(size along axis); out[i with index[i] on axis] += x[i] (its vjp)
    # structure
    PROJ = enum.auto()      # one result of a multi-result node: attrs index
    SCAN = enum.auto()      # attrs body, n_carry, n_xs, reverse, unroll, length
    LOOP = enum.auto()      # attrs body, n_state, length, with_index
    RECEIVER = enum.auto()  # device -> host: calls attrs fn(*values); no result


UNARY = frozenset({Op.NEG, Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.SIN, Op.COS, Op.TANH, Op.SIGMOID, Op.ERF,
                   Op.LOG1P, Op.EXPM1, Op.ABS, Op.SIGN})
FLOAT_ONLY = frozenset({Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.SIN, Op.COS, Op.TANH, Op.SIGMOID, Op.ERF, Op.LOG1P,
                        Op.EXPM1})
BINARY = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN})
COMPARE = frozenset({Op.LT, Op.LE, Op.EQ, Op.NE})
ELEMENTWISE = UNARY | BINARY | COMPARE | {Op.WHERE, Op.CAST}
MOVEMENT = frozenset({Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.PAD, Op.CONCAT})
REDUCE = frozenset({Op.SUM, Op.REDUCE_MAX})
LEAVES = frozenset({Op.INPUT, Op.CONST, Op.DATA, Op.RAND, Op.FEEDER})
EFFECTFUL = frozenset({Op.RAND, Op.FEEDER, Op.RECEIVER, Op.LOOP})
MULTI = frozenset({Op.SCAN, Op.LOOP, Op.RECEIVER})


def fmt_shape(shape: tuple[int, ...]) -> str:
    """A shape for an error message: the concrete sizes of this call (a traced size's symbol, ``a0.1``, means
    nothing to the user)."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"
