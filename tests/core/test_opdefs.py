"""The op tables: every op defined once, its rules side by side in one family module, vjps built on IR nodes."""

from __future__ import annotations

import numpy as np
import pytest

from nnforge import dtypes
from nnforge.codegen.reference import INTERPRETED
from nnforge.ir import builders as b
from nnforge.ir.build import make
from nnforge.ir.node import Node
from nnforge.ir.ops import COMPARE, LEAVES, Op
from nnforge.ir.registry import NUMPY, SHAPE_RULES, VJP

NOT_DIFFERENTIABLE = COMPARE | LEAVES | {Op.PROJ, Op.SCAN, Op.LOOP, Op.RECEIVER}


def test_every_op_has_a_shape_rule_and_exactly_one_evaluator():
    assert set(SHAPE_RULES) == set(Op)
    assert not set(NUMPY) & set(INTERPRETED), "an op is both a numpy rule and an interpreter case"
    assert set(NUMPY) | set(INTERPRETED) == set(Op)


def test_vjps_cover_exactly_the_differentiable_ops():
    assert set(VJP) == set(Op) - NOT_DIFFERENTIABLE


@pytest.mark.parametrize("op", sorted(Op, key=lambda o: o.value), ids=lambda o: o.name.lower())
def test_an_ops_rules_stand_in_one_family_module(op: Op):
    modules = {rule.__module__ for rule in (SHAPE_RULES.get(op), NUMPY.get(op), VJP.get(op)) if rule is not None}
    assert len(modules) == 1 and modules.pop().startswith("nnforge.ir.opdefs."), op


def _data(rng: np.random.Generator, shape: tuple, dtype=np.float64) -> Node:
    arr = rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f" else rng.integers(0, 3, shape)
    arr.setflags(write=False)
    return make(Op.DATA, (), {"array": arr})


def _cases(rng: np.random.Generator) -> list[Node]:
    """One node per differentiable op, on float64 data."""
    x, y = _data(rng, (2, 3)), _data(rng, (2, 3))
    idx = make(Op.DATA, (), {"array": rng.integers(0, 3, (2, 3))})
    unary = [make(op, (x,)) for op in (Op.NEG, Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.SIN, Op.COS, Op.TANH,
                                       Op.SIGMOID, Op.ERF, Op.LOG1P, Op.EXPM1, Op.ABS, Op.SIGN)]
    binary = [make(op, (x, y)) for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.POW, Op.MAX, Op.MIN)]
    return [
        *unary, *binary,
        b.where(b.lt(x, y), x, y),
        b.cast(x, dtypes.float32),
        make(Op.SUM, (x,), {"axes": (1,), "keepdims": False}),
        make(Op.REDUCE_MAX, (x,), {"axes": (0,), "keepdims": True}),
        b.matmul(x, b.transpose(y)),
        make(Op.RESHAPE, (x,), {"shape": (3, 2)}),
        make(Op.PERMUTE, (x,), {"perm": (1, 0)}),
        make(Op.EXPAND, (_data(rng, (1, 3)),), {"shape": (4, 3)}),
        make(Op.SLICE, (x,), {"starts": (1, 2), "stops": (-1, 0), "steps": (-1, -2)}),
        make(Op.PAD, (x,), {"pads": ((1, 0), (2, 1)), "value": 0}),
        make(Op.CONCAT, (x, y), {"axis": 1}),
        b.gather(x, idx, 1),
        b.scatter_add(x, idx, 1, 4),
    ]


def test_vjps_build_ir_nodes_shaped_like_the_sources(rng: np.random.Generator):
    cases = _cases(rng)
    assert {n.op for n in cases} == set(VJP)
    for n in cases:
        g = b.const(1.0, n.shape, n.dtype)
        cts = VJP[n.op](n, g)
        assert len(cts) == len(n.srcs), n.op
        for s, ct in zip(n.srcs, cts):
            if ct is None:
                continue
            assert isinstance(ct, Node), (n.op, type(ct))
            assert tuple(map(int, ct.shape)) == tuple(map(int, s.shape)) and ct.dtype == s.dtype, n.op


def test_numpy_rules_widen_half_precision_once(rng: np.random.Generator):
    """float16 math runs in float32 and rounds once: exp of a float16 equals float32 exp rounded."""
    x = _data(rng, (5,), np.float16)
    got = NUMPY[Op.EXP](make(Op.EXP, (x,)), [x.attrs["array"]])
    want = np.exp(x.attrs["array"].astype(np.float32)).astype(np.float16)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)
