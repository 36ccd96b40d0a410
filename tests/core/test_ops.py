"""Every frontend op against torch: forward in each dtype, vjp against torch autograd, float64 finite differences.

One table (``CASES``) drives one parametrized test (``test_op``). A row names the op, the nnforge and torch
functions (often the same lambda, since the method names agree), and its inputs: shape, value domain (log and
sqrt get positive numbers, kinks are kept away from finite-difference steps) and, for inputs that must not
follow the tested dtype (a ``where`` condition, an index), a fixed dtype.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import BACKENDS  # tests/conftest.py: the backends of the ``backend`` fixture

import nnforge as nf
import nnforge.nn.functional as NF

from .compiled import Fallback, Groups, Member, skip_where_unrunnable
from .utils import (
    ALL_DTYPES,
    FD_STEP,
    FD_TOL,
    FLOATS,
    INTS,
    assert_close,
    np_dtype,
    rand_array,
    seed_of,
    to_np,
    to_torch,
    torch_dtype,
    torch_getitem,
)


@dataclass(frozen=True)
class In:
    """One input: shape, value domain (see ``rand_array``), a fixed dtype or None (the tested dtype)."""

    shape: tuple
    domain: str = "real"
    dtype: str | None = None


@dataclass(frozen=True)
class OpCase:
    name: str
    nf_fn: Callable
    torch_fn: Callable | None  # None: the same function works on torch tensors
    inputs: tuple
    grad: bool = True          # gradient vs torch autograd (float32, float64)
    fd: bool = True            # finite differences (float64)
    dtypes: tuple = FLOATS     # forward dtypes


def R(*shape: int, domain: str = "real", dtype: str | None = None) -> In:
    return In(tuple(shape), domain, dtype)


def same(name: str, fn: Callable, *inputs: In, **kw) -> OpCase:
    return OpCase(name, fn, None, tuple(inputs), **kw)


def pair(name: str, nf_fn: Callable, torch_fn: Callable, *inputs: In, **kw) -> OpCase:
    return OpCase(name, nf_fn, torch_fn, tuple(inputs), **kw)


def cast_case(name: str, target: str, sources: tuple) -> OpCase:
    float_src = sources == FLOATS
    return pair(name, lambda a: nf.cast(a, target), lambda a: a.to(torch_dtype(target)), R(3, 4), dtypes=sources,
                grad=float_src and target in ("float32", "float64"), fd=float_src and target == "float64")


# ---- the table ------------------------------------------------------------------------------------------------
add, sub, mul, div, pw = operator.add, operator.sub, operator.mul, operator.truediv, operator.pow
X34, X234 = R(3, 4), R(2, 3, 4)
STATS = (np.array([0.5, -1.0, 0.25]), np.array([0.5, 2.0, 1.5]))  # running mean and variance of 3 channels

CASES: list[OpCase] = [
    # arithmetic: tensor/tensor, broadcasting, Python scalars on either side
    same("add", add, X34, R(3, 4)),
    same("add_bcast", add, R(2, 1, 4), R(3, 1)),
    same("add_scalar", lambda a: a + 2.5, X34),
    same("radd_scalar", lambda a: 2.5 + a, X34),
    same("add_int_scalar", lambda a: a + 3, X34),
    same("sub", sub, X34, R(3, 4)),
    same("sub_bcast", sub, R(4), R(3, 1)),
    same("rsub_scalar", lambda a: 3 - a, X34),
    same("sub_scalar", lambda a: a - 0.75, X34),
    same("mul", mul, X34, R(3, 4)),
    same("mul_bcast", mul, R(2, 3, 1), R(3, 4)),
    same("mul_scalar", lambda a: a * -1.5, X34),
    same("rmul_scalar", lambda a: 2 * a, X34),
    same("div", div, X34, R(3, 4, domain="away0")),
    same("div_bcast", div, R(2, 1, 4), R(3, 1, domain="away0")),
    same("div_scalar", lambda a: a / 0.7, X34),
    same("rdiv_scalar", lambda a: 2.0 / a, R(3, 4, domain="away0")),
    same("pow", pw, R(3, 4, domain="positive"), R(3, 4)),
    same("pow_bcast", pw, R(3, 1, domain="positive"), R(4)),
    same("pow_int_exponent", lambda a: a ** 3, X34),
    same("pow_two", lambda a: a ** 2, X34),
    same("pow_half", lambda a: a ** 0.5, R(3, 4, domain="positive")),
    same("pow_minus_one", lambda a: a ** -1, R(3, 4, domain="away0")),
    same("pow_float_exponent", lambda a: a ** 2.5, R(3, 4, domain="positive")),
    same("pow_neg_float_exponent", lambda a: a ** -1.5, R(3, 4, domain="positive")),
    same("rpow_scalar", lambda a: 2.0 ** a, X34),
    same("neg", operator.neg, X34),
    pair("neg_fn", nf.neg, torch.neg, X34),
    # integer arithmetic (forward only, exact)
    same("add_int", add, R(3, 4), R(4), dtypes=INTS, grad=False, fd=False),
    same("sub_int", sub, R(3, 4), R(3, 4), dtypes=INTS, grad=False, fd=False),
    same("mul_int", mul, R(3, 4), R(3, 1), dtypes=INTS, grad=False, fd=False),
    same("truediv_int", div, R(3, 4), R(3, 4, domain="away0"), dtypes=INTS, grad=False, fd=False),
    same("pow_int", lambda a: a ** 3, R(3, 4), dtypes=INTS, grad=False, fd=False),
    same("rpow_int", lambda a: 2 ** a, R(3, 4, domain="positive"), dtypes=INTS, grad=False, fd=False),
    # negative exponents too: 1 for 1, +-1 for -1, 0 otherwise (0 ** -k included), as torch
    same("pow_int_tensors", pw, R(4, 6, domain="smallint"), R(4, 6, domain="smallint"), dtypes=INTS, grad=False,
         fd=False),
    same("rpow_int_tensor", lambda a: 3 ** a, R(3, 4, domain="smallint"), dtypes=INTS, grad=False, fd=False),
    same("neg_int", operator.neg, X34, dtypes=INTS, grad=False, fd=False),
    # comparisons (small integers, so ties happen), every dtype
    *[same(f"cmp_{n}", op, R(3, 4, domain="smallint"), R(4, domain="smallint"), dtypes=ALL_DTYPES, grad=False,
           fd=False)
      for n, op in [("lt", operator.lt), ("le", operator.le), ("gt", operator.gt), ("ge", operator.ge),
                    ("eq", operator.eq), ("ne", operator.ne)]],
    same("cmp_lt_scalar", lambda a: a < 1, R(3, 4, domain="smallint"), dtypes=(*INTS, *FLOATS), grad=False,
         fd=False),
    same("cmp_rge_scalar", lambda a: 0.5 >= a,  # noqa: SIM300 (the reflected operator is the point)
         R(3, 4, domain="smallint"), dtypes=(*INTS, *FLOATS), grad=False, fd=False),
    same("cmp_eq_scalar", lambda a: a == 1, R(3, 4, domain="smallint"), dtypes=ALL_DTYPES[1:], grad=False,
         fd=False),
    # unary
    pair("exp", nf.exp, torch.exp, X34),
    pair("log", nf.log, torch.log, R(3, 4, domain="positive")),
    pair("sqrt", nf.sqrt, torch.sqrt, R(3, 4, domain="positive")),
    pair("rsqrt", nf.rsqrt, torch.rsqrt, R(3, 4, domain="positive")),
    pair("sin", nf.sin, torch.sin, X34),
    pair("cos", nf.cos, torch.cos, X34),
    pair("tanh", nf.tanh, torch.tanh, X34),
    pair("sigmoid", nf.sigmoid, torch.sigmoid, X34),
    pair("sigmoid_large", nf.sigmoid, torch.sigmoid, R(3, 4, domain="large"), fd=False),
    pair("tanh_large", nf.tanh, torch.tanh, R(3, 4, domain="large"), fd=False),
    pair("relu", nf.relu, torch.relu, R(3, 4, domain="away0")),
    pair("abs", nf.abs, torch.abs, R(3, 4, domain="away0")),
    pair("sign", nf.sign, torch.sign, R(3, 4, domain="away0")),
    pair("reciprocal", nf.reciprocal, torch.reciprocal, R(3, 4, domain="away0")),
    same("exp_method", lambda a: a.exp().sin().sqrt(), R(3, 4, domain="unit")),
    pair("silu", nf.silu, F.silu, X34),
    pair("gelu_tanh", lambda a: nf.gelu(a, approximate="tanh"), lambda a: F.gelu(a, approximate="tanh"), X34),
    pair("log1p", nf.log1p, torch.log1p, R(3, 4, domain="unit")),
    pair("log1p_method", lambda a: a.log1p(), lambda a: a.log1p(), R(3, 4, domain="positive")),
    pair("log1p_below_minus_one", nf.log1p, torch.log1p, X34, grad=False, fd=False),  # NaN there
    pair("expm1", nf.expm1, torch.expm1, X34),
    pair("expm1_overflow", lambda a: a.expm1(), lambda a: a.expm1(), R(3, 4, domain="large"), grad=False, fd=False),
    pair("square", nf.square, torch.square, X34),
    pair("square_int", lambda a: a.square(), lambda a: a.square(), X34, dtypes=INTS, grad=False, fd=False),
    # activations of nnforge.nn.functional; a "_large" row checks that the branch a ``where`` does not take
    # (an exp of 1e4) leaves no NaN in the gradient
    pair("softplus", NF.softplus, F.softplus, X34),
    pair("softplus_beta", lambda a: NF.softplus(a, beta=2.0, threshold=1.5),
         lambda a: F.softplus(a, beta=2.0, threshold=1.5), X34),
    pair("softplus_large", NF.softplus, F.softplus, R(3, 4, domain="large"), fd=False),
    pair("logsigmoid", NF.logsigmoid, F.logsigmoid, X34),
    pair("logsigmoid_large", NF.logsigmoid, F.logsigmoid, R(3, 4, domain="large"), fd=False),
    pair("leaky_relu", lambda a: NF.leaky_relu(a, 0.2), lambda a: F.leaky_relu(a, 0.2), R(3, 4, domain="away0")),
    pair("elu", lambda a: NF.elu(a, 0.7), lambda a: F.elu(a, 0.7), R(3, 4, domain="away0")),
    pair("elu_large", NF.elu, F.elu, R(3, 4, domain="large"), fd=False),
    pair("selu", NF.selu, F.selu, R(3, 4, domain="away0")),
    pair("celu", lambda a: NF.celu(a, 0.5), lambda a: F.celu(a, 0.5), R(3, 4, domain="away0")),
    pair("hardtanh", lambda a: NF.hardtanh(a, -0.5, 0.8), lambda a: F.hardtanh(a, -0.5, 0.8), X34),
    pair("relu6", lambda a: NF.relu6(a * 4), lambda a: F.relu6(a * 4), R(3, 4, domain="away0")),
    # torch's own float64 hardsigmoid gradient multiplies by a float32 1/6 (3e-8 off): its formula, written out
    pair("hardsigmoid", lambda a: NF.hardsigmoid(a * 3),
         lambda a: torch.where(a * 3 <= -3, 0.0, torch.where(a * 3 >= 3, 1.0, (a * 3 + 3) / 6)), X34),
    pair("hardsigmoid_torch", NF.hardsigmoid, F.hardsigmoid, X34, grad=False, fd=False),
    pair("hardswish", lambda a: NF.hardswish(a * 3), lambda a: F.hardswish(a * 3), X34),
    pair("softsign", NF.softsign, F.softsign, X34),
    pair("mish", NF.mish, F.mish, X34),
    # forward only: its gradient at 1e4 is x * (1 - tanh^2), where a float32 tanh that saturates one ulp below 1
    # (Triton's, clamped at 9) leaves 1e-3; the overflow guard it relies on is softplus_large's
    pair("mish_large", NF.mish, F.mish, R(3, 4, domain="large"), grad=False, fd=False),
    pair("instance_norm", lambda a, w, b: NF.instance_norm(a, weight=w, bias=b),
         lambda a, w, b: F.instance_norm(a, weight=w, bias=b), R(2, 3, 5), R(3), R(3)),
    pair("instance_norm_running_stats", lambda a: NF.instance_norm(
        a, nf.tensor(STATS[0]).cast(a.dtype), nf.tensor(STATS[1]).cast(a.dtype), use_input_stats=False),
         lambda a: F.instance_norm(a, torch.tensor(STATS[0], dtype=a.dtype), torch.tensor(STATS[1], dtype=a.dtype),
                                   use_input_stats=False), R(2, 3, 5)),
    pair("prelu", NF.prelu, F.prelu, R(2, 3, 4, domain="away0"), R(3)),
    pair("prelu_one_slope", NF.prelu, F.prelu, R(3, 4, domain="away0"), R(1)),
    pair("threshold", lambda a: NF.threshold(a, 0.3, -2.0), lambda a: F.threshold(a, 0.3, -2.0), X34),
    pair("softmin", lambda a: NF.softmin(a, 1), lambda a: F.softmin(a, 1), X34),
    pair("tanhshrink", NF.tanhshrink, F.tanhshrink, X34),
    pair("softshrink", lambda a: NF.softshrink(a, 0.4), lambda a: F.softshrink(a, 0.4), X34),
    pair("hardshrink", lambda a: NF.hardshrink(a, 0.4), lambda a: F.hardshrink(a, 0.4), X34),
    pair("glu", NF.glu, F.glu, R(3, 4)),
    pair("glu_dim0", lambda a: NF.glu(a, 0), lambda a: F.glu(a, 0), R(4, 3)),
    # pooling along the last axis
    pair("max_pool1d", lambda a: NF.max_pool1d(a, 3, 2, 1), lambda a: F.max_pool1d(a, 3, 2, 1), R(2, 3, 9)),
    pair("max_pool1d_dilated_ceil", lambda a: NF.max_pool1d(a, 2, 3, 1, 2, True),
         lambda a: F.max_pool1d(a, 2, 3, 1, 2, True), R(2, 10)),
    pair("max_pool1d_indices", lambda a: NF.max_pool1d(a, 4, 3, 2, return_indices=True)[1],
         lambda a: F.max_pool1d(a, 4, 3, 2, return_indices=True)[1], R(2, 3, 9), grad=False, fd=False),
    pair("avg_pool1d", lambda a: NF.avg_pool1d(a, 3, 2, 1), lambda a: F.avg_pool1d(a, 3, 2, 1), R(2, 3, 9)),
    pair("avg_pool1d_ceil_no_pad_count", lambda a: NF.avg_pool1d(a, 4, 3, 2, True, False),
         lambda a: F.avg_pool1d(a, 4, 3, 2, True, False), R(2, 3, 10)),
    pair("adaptive_avg_pool1d", lambda a: NF.adaptive_avg_pool1d(a, 3), lambda a: F.adaptive_avg_pool1d(a, 3),
         R(2, 3, 10)),
    pair("adaptive_max_pool1d", lambda a: NF.adaptive_max_pool1d(a, 2), lambda a: F.adaptive_max_pool1d(a, 2),
         R(2, 3, 10)),
    pair("lp_pool1d", lambda a: NF.lp_pool1d(a, 2.0, 3, 2), lambda a: F.lp_pool1d(a, 2.0, 3, 2), R(2, 3, 9)),
    pair("lp_pool1d_cubic_ceil", lambda a: NF.lp_pool1d(a, 3.0, 2, None, True),
         lambda a: F.lp_pool1d(a, 3.0, 2, None, True), R(2, 3, 9, domain="positive")),
    pair("interpolate_nearest", lambda a: NF.interpolate(a, scale_factor=2), lambda a: F.interpolate(
        a, scale_factor=2), R(2, 3, 4)),
    pair("interpolate_nearest_exact", lambda a: NF.interpolate(a, size=3, mode="nearest-exact"),
         lambda a: F.interpolate(a, size=3, mode="nearest-exact"), R(2, 3, 7)),
    pair("interpolate_linear", lambda a: NF.interpolate(a, size=9, mode="linear"),
         lambda a: F.interpolate(a, size=9, mode="linear"), R(2, 3, 5)),
    pair("interpolate_linear_corners", lambda a: NF.interpolate(a, scale_factor=1.5, mode="linear",
                                                                align_corners=True),
         lambda a: F.interpolate(a, scale_factor=1.5, mode="linear", align_corners=True), R(2, 3, 5)),
    pair("normalize", lambda a: NF.normalize(a, dim=-1), lambda a: F.normalize(a, dim=-1), X234),
    pair("normalize_p1", lambda a: NF.normalize(a, 1.0, 0), lambda a: F.normalize(a, 1.0, 0), X34),
    pair("normalize_inf", lambda a: NF.normalize(a, float("inf"), -1), lambda a: F.normalize(a, float("inf"), -1),
         X34),
    *[pair(f"vector_norm_{k}", (lambda order: lambda a: NF.vector_norm(a, order, -1))(o),
           (lambda order: lambda a: torch.linalg.vector_norm(a, order, -1))(o), X234, **kw)
      for k, (o, kw) in enumerate([(2.0, {}), (3.0, {}), (float("-inf"), {}), (0, dict(grad=False, fd=False))])],
    pair("group_norm", lambda a, w, b: NF.group_norm(a, 2, w, b), lambda a, w, b: F.group_norm(a, 2, w, b),
         R(2, 4, 3), R(4), R(4)),
    pair("group_norm_2d", lambda a: NF.group_norm(a, 3, eps=1e-3), lambda a: F.group_norm(a, 3, eps=1e-3), R(3, 6)),
    pair("rms_norm", lambda a, w: NF.rms_norm(a, (4,), w), lambda a, w: F.rms_norm(a, (4,), w), X234, R(4)),
    pair("rms_norm_two_axes", lambda a: NF.rms_norm(a, (3, 4), eps=1e-3), lambda a: F.rms_norm(a, (3, 4), eps=1e-3),
         X234),
    pair("abs_int", nf.abs, torch.abs, X34, dtypes=INTS, grad=False, fd=False),
    pair("sign_int", nf.sign, torch.sign, X34, dtypes=INTS, grad=False, fd=False),
    pair("exp_int", nf.exp, torch.exp, X34, dtypes=INTS, grad=False, fd=False),
    pair("sqrt_int", nf.sqrt, torch.sqrt, R(3, 4, domain="positive"), dtypes=INTS, grad=False, fd=False),
    # selection
    pair("where", nf.where, torch.where, R(3, 4, dtype="bool"), X34, R(4)),
    pair("where_bcast_cond", nf.where, torch.where, R(3, 1, dtype="bool"), R(1, 4), R(3, 4)),
    pair("where_scalar", lambda c, a: nf.where(c, a, 0.5), lambda c, a: torch.where(c, a, 0.5),
         R(3, 4, dtype="bool"), X34),
    pair("where_int", nf.where, torch.where, R(3, 4, dtype="bool"), X34, R(3, 4), dtypes=INTS, grad=False, fd=False),
    pair("maximum", nf.maximum, torch.maximum, X34, R(3, 4)),
    pair("minimum", nf.minimum, torch.minimum, X34, R(3, 4)),
    pair("maximum_bcast", nf.maximum, torch.maximum, R(2, 3, 1), R(4)),
    pair("minimum_bcast", nf.minimum, torch.minimum, R(3, 1), R(1, 4)),
    pair("maximum_ties", nf.maximum, torch.maximum, R(3, 4, domain="smallint"), R(3, 4, domain="smallint"), fd=False),
    pair("minimum_ties", nf.minimum, torch.minimum, R(3, 4, domain="smallint"), R(3, 4, domain="smallint"), fd=False),
    pair("maximum_scalar", lambda a: nf.maximum(a, 0.25), lambda a: torch.clamp(a, min=0.25), X34),
    pair("maximum_int", nf.maximum, torch.maximum, X34, R(3, 4), dtypes=INTS, grad=False, fd=False),
    # a 0-d operand: a scalar load beside a block (Triton's interpreter once failed on its NaN test)
    pair("maximum_0d", nf.maximum, torch.maximum, R(), R(4)),
    pair("minimum_0d", nf.minimum, torch.minimum, R(4), R()),
    pair("maximum_0d_int", nf.maximum, torch.maximum, R(), R(4), dtypes=INTS, grad=False, fd=False),
    pair("clamp", lambda a: nf.clamp(a, -0.5, 0.5), lambda a: torch.clamp(a, -0.5, 0.5), X34),
    pair("clamp_min", lambda a: a.clamp(min=0.0), lambda a: a.clamp(min=0.0), R(3, 4, domain="away0")),
    pair("clamp_max", lambda a: a.clamp(max=0.3), lambda a: a.clamp(max=0.3), X34),
    # reductions
    same("sum_all", lambda a: a.sum(), X234),
    same("sum_axis", lambda a: a.sum(1), X234),
    same("sum_neg_axis", lambda a: a.sum(-1), X234),
    same("sum_tuple_keep", lambda a: a.sum((0, 2), True), X234),
    pair("sum_fn", lambda a: nf.sum(a, axis=(0, 1)), lambda a: torch.sum(a, dim=(0, 1)), X234),
    pair("sum_int", lambda a: a.sum(1), lambda a: a.sum(1), X234, dtypes=(*INTS, "bool"), grad=False, fd=False),
    same("mean_all", lambda a: a.mean(), X234),
    same("mean_axis", lambda a: a.mean(0), X234),
    same("mean_tuple_keep", lambda a: a.mean((1, 2), True), X234),
    pair("max_all", lambda a: a.max(), lambda a: a.amax(), X234),
    pair("max_axis", lambda a: a.max(1), lambda a: a.amax(1), X234),
    pair("max_tuple_keep", lambda a: a.max((0, 2), keepdims=True), lambda a: a.amax((0, 2), keepdim=True), X234),
    pair("max_ties", lambda a: a.max(1), lambda a: a.amax(1), R(2, 5, 3, domain="smallint"), fd=False),
    pair("max_fn", lambda a: nf.max(a, -1), lambda a: torch.amax(a, -1), X234),
    pair("min_all", lambda a: a.min(), lambda a: a.amin(), X234),
    pair("min_axis", lambda a: a.min(-1), lambda a: a.amin(-1), X234),
    pair("min_tuple_keep", lambda a: nf.min(a, (0, 1), keepdims=True), lambda a: a.amin((0, 1), keepdim=True), X234),
    pair("max_int", lambda a: a.max(0), lambda a: a.amax(0), X234, dtypes=INTS, grad=False, fd=False),
    pair("min_int", lambda a: a.min(0), lambda a: a.amin(0), X234, dtypes=INTS, grad=False, fd=False),
    # argmax / argmin: int64 indices, the first of ties, NaN ranked beyond every number (the edge mode); the
    # methods take the same positional arguments in nnforge and torch
    *[same(f"{f}{k}", operator.methodcaller(f, *args), inp, dtypes=dts, grad=False, fd=False)
      for f in ("argmax", "argmin")
      for k, args, inp, dts in [("", (), X234, FLOATS), ("_axis", (1,), X234, FLOATS),
                                ("_all_keep", (None, True), X234, FLOATS),
                                ("_ties", (0,), R(5, 3, domain="smallint"), FLOATS),
                                ("_int", (-1,), R(3, 5, domain="smallint"), INTS)]],
    pair("argmax_fn_keep", lambda a: nf.argmax(a, -1, keepdims=True), lambda a: torch.argmax(a, -1, keepdim=True),
         X234, grad=False, fd=False),
    pair("argmin_fn", lambda a: nf.argmin(a, 0), lambda a: torch.argmin(a, 0), X234, grad=False, fd=False),
    # running sums and products: one scan along the axis
    same("cumsum", lambda a: a.cumsum(0), X234),
    same("cumsum_last", lambda a: a.cumsum(-1), X234),
    pair("cumsum_fn_mid", lambda a: nf.cumsum(a, 1), lambda a: torch.cumsum(a, 1), X234),
    same("cumsum_int", lambda a: a.cumsum(1), X234, dtypes=(*INTS, "bool"), grad=False, fd=False),
    same("cumprod", lambda a: a.cumprod(-1), R(3, 5)),
    same("cumprod_zeros", lambda a: a.cumprod(0), R(4, 3, domain="smallint"), fd=False),
    pair("var_all", lambda a: a.var(), lambda a: a.var(), X234),
    pair("var_axis", lambda a: a.var(1), lambda a: a.var(1), X234),
    pair("var_tuple_keep", lambda a: a.var((0, 2), keepdims=True), lambda a: a.var((0, 2), keepdim=True), X234),
    pair("var_biased", lambda a: a.var(-1, correction=0), lambda a: a.var(-1, correction=0), X234),
    pair("std_axis", lambda a: nf.std(a, 2), lambda a: torch.std(a, 2), X234),
    # softmax family, also at 1e4 where a naive exp overflows
    pair("softmax", lambda a: a.softmax(-1), lambda a: a.softmax(-1), X234),
    pair("softmax_axis0", lambda a: nf.softmax(a, 0), lambda a: torch.softmax(a, 0), X234),
    pair("log_softmax", lambda a: a.log_softmax(-1), lambda a: a.log_softmax(-1), X234),
    pair("log_softmax_axis1", lambda a: nf.log_softmax(a, 1), lambda a: F.log_softmax(a, 1), X234),
    pair("logsumexp", lambda a: a.logsumexp(-1), lambda a: a.logsumexp(-1), X234),
    pair("logsumexp_keep", lambda a: nf.logsumexp(a, 1, keepdims=True), lambda a: a.logsumexp(1, keepdim=True), X234),
    pair("logsumexp_tuple", lambda a: a.logsumexp((0, 2)), lambda a: a.logsumexp((0, 2)), X234),
    pair("softmax_large", lambda a: a.softmax(-1), lambda a: a.softmax(-1), R(3, 4, domain="large"), fd=False),
    pair("log_softmax_large", lambda a: a.log_softmax(-1), lambda a: a.log_softmax(-1), R(3, 4, domain="large"),
         fd=False),
    pair("logsumexp_large", lambda a: a.logsumexp(-1), lambda a: a.logsumexp(-1), R(3, 4, domain="large"), fd=False),
    # matmul
    pair("matmul_1d_1d", nf.matmul, torch.matmul, R(4), R(4)),
    pair("matmul_1d_2d", nf.matmul, torch.matmul, R(4), R(4, 3)),
    pair("matmul_2d_1d", nf.matmul, torch.matmul, R(3, 4), R(4)),
    same("matmul_2d_2d", operator.matmul, R(3, 4), R(4, 5)),
    same("matmul_batched", operator.matmul, R(2, 3, 4), R(2, 4, 5)),
    same("matmul_bcast_batch", operator.matmul, R(2, 1, 3, 4), R(5, 4, 2)),
    same("matmul_2d_batched", operator.matmul, R(3, 4), R(2, 4, 5)),
    same("matmul_batched_1d", operator.matmul, R(2, 3, 4), R(4)),
    same("matmul_1d_batched", operator.matmul, R(4), R(2, 4, 3)),
    # movement
    same("reshape", lambda a: a.reshape(6, 4), X234),
    same("reshape_minus1", lambda a: a.reshape(4, -1), X234),
    same("reshape_tuple", lambda a: a.reshape((2, 12)), X234),
    pair("reshape_fn", lambda a: nf.reshape(a, (3, 8)), lambda a: torch.reshape(a, (3, 8)), X234),
    same("view", lambda a: a.view(24), X234),
    same("permute", lambda a: a.permute(2, 0, 1), X234),
    pair("permute_fn", lambda a: nf.permute(a, (1, 2, 0)), lambda a: torch.permute(a, (1, 2, 0)), X234),
    same("transpose", lambda a: a.transpose(0, 2), X234),
    same("transpose_neg", lambda a: a.transpose(-1, -2), X234),
    same("T", lambda a: a.T, R(3, 4)),
    same("mT", lambda a: a.mT, X234),
    same("expand", lambda a: a.expand(2, 3, 4), R(3, 1)),
    same("expand_minus1", lambda a: a.expand(-1, 5), R(3, 1)),
    same("unflatten", lambda a: a.unflatten(2, (2, -1)), X234),
    same("unfold", lambda a: a.unfold(2, 2, 1), X234),
    same("unfold_strided", lambda a: a.unfold(0, 2, 3), R(7, 2)),
    same("repeat", lambda a: a.repeat(2, 1, 3), R(3, 4)),
    same("repeat_tuple", lambda a: a.repeat((1, 2)), R(3, 1)),
    pair("tile", lambda a: nf.tile(a, (2,)), lambda a: torch.tile(a, (2,)), X234),
    same("repeat_interleave", lambda a: a.repeat_interleave(2, 1), X234),
    pair("repeat_interleave_flat", lambda a: nf.repeat_interleave(a, 3), lambda a: torch.repeat_interleave(a, 3),
         R(2, 3)),
    same("squeeze_all", lambda a: a.squeeze(), R(1, 3, 1, 4)),
    same("squeeze_axis", lambda a: a.squeeze(2), R(1, 3, 1, 4)),
    same("squeeze_noop_axis", lambda a: a.squeeze(1), R(1, 3, 1, 4)),
    same("squeeze_tuple", lambda a: a.squeeze((0, 2)), R(1, 3, 1, 4)),
    same("unsqueeze", lambda a: a.unsqueeze(0), R(3, 4)),
    same("unsqueeze_neg", lambda a: a.unsqueeze(-1), R(3, 4)),
    same("unsqueeze_mid", lambda a: a.unsqueeze(-2), R(3, 4)),
    pair("flip", lambda a: a.flip(0), lambda a: a.flip(0), X234),
    pair("flip_many", lambda a: nf.flip(a, (0, 2)), lambda a: torch.flip(a, (0, 2)), X234),
    # indexing and slicing (torch_getitem emulates numpy for negative steps)
    *[pair(f"index_{k}", (lambda i: lambda a: a[i])(idx), (lambda i: lambda a: torch_getitem(a, i))(idx), R(*shape))
      for k, (idx, shape) in enumerate([
          (1, (5, 4)), (-1, (5, 4)), (slice(1, 3), (5, 4)), (slice(None, None, 2), (5, 4)),
          (slice(None, None, -1), (5, 4)), (slice(None, None, -2), (5, 4)), (slice(3, 0, -2), (5, 4)),
          (slice(-1, -5, -1), (5, 4)), ((Ellipsis, 1), (2, 3, 4)), ((None, slice(None), None), (3, 4)),
          ((1, Ellipsis, None), (2, 3, 4)), ((slice(None), slice(-3, -1)), (3, 5)),
          ((slice(None), slice(1, 4, 2), slice(None, None, -1)), (2, 5, 3)), ((slice(1, None), -2), (4, 3)),
          ((slice(4, 1, -1), None, slice(None, None, 3)), (5, 7)), ((Ellipsis, slice(None, None, -3)), (2, 7)),
          ((0, 1, 2), (2, 3, 4)), (slice(10, None), (5, 4)), (slice(-100, 100), (5, 4)),
      ])],
    # assignment as a new tensor: x[index] = value
    *[pair(f"set_at_{k}", (lambda i, c: lambda a, *v: nf.set_at(a, i, v[0] if v else c))(idx, const),
           (lambda i, c: lambda a, *v: _torch_set(a, i, v[0] if v else c))(idx, const), R(*shape), *values)
      for k, (idx, const, shape, values) in enumerate([
          ((slice(None), 0), 2.5, (3, 4), ()), ((slice(1, 3),), None, (3, 4), (R(2, 4),)),
          ((Ellipsis, slice(1, 3)), None, (2, 3, 4), (R(2),)), ((1, slice(None), 2), None, (2, 3, 4), (R(1),)),
          ((slice(None), slice(-2, None)), None, (3, 4), (R(3, 2),)),
      ])],
    # masks
    pair("masked_fill", lambda a, m: a.masked_fill(m, -2.5), lambda a, m: a.masked_fill(m, -2.5), X34,
         R(4, dtype="bool")),
    pair("masked_fill_tensor", lambda a, m, v: nf.masked_fill(a, m, v), lambda a, m, v: torch.masked_fill(a, m, v),
         X234, R(3, 1, dtype="bool"), R()),
    pair("masked_fill_int", lambda a, m: a.masked_fill(m, 7), lambda a, m: a.masked_fill(m, 7), X34,
         R(3, 4, dtype="bool"), dtypes=(*INTS, "bool"), grad=False, fd=False),
    same("tril", lambda a: a.tril(), X234),
    pair("tril_below", lambda a: nf.tril(a, -1), lambda a: torch.tril(a, -1), R(4, 3)),
    same("triu_above", lambda a: a.triu(2), R(3, 5)),
    same("triu_int", lambda a: a.triu(), R(3, 4), dtypes=ALL_DTYPES, grad=False, fd=False),
    # einsum: one batched matmul per pair of operands, sums, diagonals, broadcasting
    *[pair(f"einsum_{k}", (lambda e: lambda *a: nf.einsum(e, *a))(eq), (lambda e: lambda *a: torch.einsum(e, *a))(eq),
           *ins)
      for k, (eq, ins) in enumerate([
          ("ij,jk->ik", (R(3, 4), R(4, 5))), ("bhqd,bhkd->bhqk", (R(2, 2, 3, 4), R(2, 2, 5, 4))),
          ("...ij,...jk->...ik", (R(2, 1, 3, 4), R(5, 4, 2))), ("ij->ji", (R(3, 4),)), ("bij->", (X234,)),
          ("i,j", (R(3), R(4))), ("ii->i", (R(3, 3),)), ("ij,jk,kl->il", (R(2, 3), R(3, 4), R(4, 2))),
          ("bn,anm,bm->ba", (R(2, 3), R(4, 3, 5), R(2, 5))), ("ij,jk->ik", (R(3, 1), R(4, 5))),
          ("bij,bj->bi", (X234, R(2, 4))),
      ])],
    # joining and splitting
    pair("concat", lambda a, b: nf.concat([a, b], 0), lambda a, b: torch.cat([a, b], 0), R(2, 3), R(4, 3)),
    pair("concat_neg_axis", lambda a, b, c: nf.cat([a, b, c], -1), lambda a, b, c: torch.cat([a, b, c], -1),
         R(2, 3), R(2, 1), R(2, 4)),
    pair("stack", lambda a, b: nf.stack([a, b]), lambda a, b: torch.stack([a, b]), R(3, 4), R(3, 4)),
    pair("stack_last", lambda a, b, c: nf.stack([a, b, c], -1), lambda a, b, c: torch.stack([a, b, c], -1),
         R(3, 4), R(3, 4), R(3, 4)),
    pair("chunk", lambda a: nf.chunk(a, 2, 1), lambda a: torch.chunk(a, 2, 1), R(3, 4)),
    pair("chunk_last", lambda a: a.chunk(3, axis=-1), lambda a: a.chunk(3, dim=-1), R(2, 6)),
    pair("split_int", lambda a: a.split(2, 1), lambda a: a.split(2, 1), R(3, 5)),
    pair("split_sizes", lambda a: nf.split(a, [1, 3], axis=-1), lambda a: torch.split(a, [1, 3], dim=-1), R(2, 4)),
    pair("pad", lambda a: a.pad(((1, 2), (0, 3))), lambda a: F.pad(a, (0, 3, 1, 2)), R(3, 4)),
    pair("pad_value", lambda a: nf.pad(a, ((0, 0), (2, 1), (1, 0)), value=1.5),
         lambda a: F.pad(a, (1, 0, 2, 1, 0, 0), value=1.5), X234),
    # torch's F.pad: sizes from the last dimension backwards, negative ones crop; mirrored, repeated, wrapped edges
    pair("F_pad", lambda a: NF.pad(a, (1, 2, 0, 1), value=0.5), lambda a: F.pad(a, (1, 2, 0, 1), value=0.5), X234),
    pair("F_pad_crop", lambda a: NF.pad(a, (-1, 2, 1, -2)), lambda a: F.pad(a, (-1, 2, 1, -2)), X234),
    pair("F_pad_reflect", lambda a: NF.pad(a, (2, 4), mode="reflect"), lambda a: F.pad(a, (2, 4), mode="reflect"),
         R(2, 3, 5)),
    pair("F_pad_reflect_2d", lambda a: NF.pad(a, (1, 2, 2, 0), mode="reflect"),
         lambda a: F.pad(a, (1, 2, 2, 0), mode="reflect"), R(2, 3, 5)),
    pair("F_pad_replicate", lambda a: NF.pad(a, (3, 1), mode="replicate"),
         lambda a: F.pad(a, (3, 1), mode="replicate"), X234),
    pair("F_pad_circular", lambda a: NF.pad(a, (1, 1, 2, 3), mode="circular"),
         lambda a: F.pad(a, (1, 1, 2, 3), mode="circular"), R(2, 3, 5)),
    # casts
    *[cast_case(f"cast_to_{d}", d, FLOATS) for d in ALL_DTYPES],
    *[cast_case(f"cast_int_to_{d}", d, (*INTS, "bool")) for d in ALL_DTYPES],
]

# bfloat16 rounding of 1e4-sized values is ~40 absolute, more than the exp differences it feeds: skip that pair.
_SKIP_FORWARD = {("log_softmax_large", "bfloat16"), ("logsumexp_large", "bfloat16")}


# Compiled backends run every mode but ``fd`` (see ``_params``). The C backend has no half precision, so a float16
# or bfloat16 graph runs on the interpreter there: ``test_op`` checks that those cases do raise ``Fallback`` and
# reports them as skipped with the reason; a listed case that runs compiled fails until this list is updated.
def _falls_back(backend: str, case: OpCase, mode: str, dtype: str) -> str | None:
    halves = ("float16", "bfloat16")
    if backend != "cpu":
        return None
    if dtype in halves or (case.name.startswith("cast_") and case.name.endswith(halves)):
        return "the C backend has no float16/bfloat16: the graph runs on the reference interpreter"
    return None


def _params():
    for backend in BACKENDS:
        for case, mode, dtype in _modes():
            if mode == "fd" and backend != "reference":
                # fd checks the vjp rules, which live in the traced IR, not in a backend; the compiled gradient is
                # checked against torch autograd by the grad mode on every backend.
                continue
            yield pytest.param(case, mode, dtype, backend, id=f"{backend}-{case.name}-{mode}-{dtype}")


def _torch_set(a: torch.Tensor, index: tuple, value) -> torch.Tensor:
    out = a.clone()
    out[index] = value
    return out


def _modes():
    for c in CASES:
        for d in c.dtypes:
            if (c.name, d) not in _SKIP_FORWARD:
                yield c, "forward", d
        if "float64" in c.dtypes:
            yield c, "edge", "float64"
            yield c, "shapes", "float64"
        if c.grad:
            for d in ("float32", "float64"):
                yield c, "grad", d
        if c.fd:
            yield c, "fd", "float64"


def _inputs(case: OpCase, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(seed_of(case.name, dtype))
    return [rand_array(rng, s.shape, s.domain, s.dtype or dtype) for s in case.inputs]


def _flat(out) -> list:
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _torch_fn(case: OpCase) -> Callable:
    return case.torch_fn or case.nf_fn


EDGES = {"real": (0.0, -0.0, np.inf, -np.inf, np.nan, 1.0), "positive": (0.0, np.inf, np.nan, 1.0),
         "away0": (np.inf, -np.inf, np.nan, 1.0), "unit": (0.0, -0.0, 0.5), "smallint": (0.0, -0.0, 2.0),
         "large": (np.inf, -np.inf, 0.0)}
"""Edge values per input domain: signed zeros, infinities, NaN, and the same value in every input (exact ties)."""


def _with_edges(case: OpCase, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Every float input gets the edge values of its domain at the same positions, so binary ops see ties
    (x == y), zeros against zeros, inf against inf; the other entries stay random."""
    out = []
    for s, a in zip(case.inputs, arrays):
        a = a.copy()
        if a.dtype.kind == "f" and s.dtype is None and a.size:
            edges = EDGES[s.domain]
            for k in range(min(a.size, len(edges))):
                a.flat[k] = edges[k]
        out.append(a)
    return out


SHAPES = [(), (0,), (2, 0)]  # the shapes mode: every input 0-d or empty


def _reshaped(case: OpCase, dtype: str, shape: tuple) -> list[np.ndarray]:
    rng = np.random.default_rng(seed_of(case.name, dtype, shape))
    return [rand_array(rng, shape, s.domain, s.dtype or dtype) for s in case.inputs]


def _diff(case: OpCase, arrays: list[np.ndarray]) -> list[int]:
    """The differentiated inputs: float inputs that follow the tested dtype."""
    return [i for i, (s, a) in enumerate(zip(case.inputs, arrays)) if a.dtype.kind == "f" and s.dtype is None]


def _cotangents(case: OpCase, outs: list) -> list[np.ndarray]:
    rng = np.random.default_rng(seed_of(case.name, "cotangent"))
    return [rng.standard_normal(tuple(np.shape(o))).astype(_np_dtype_of(o)) for o in outs]


def _np_dtype_of(o) -> np.dtype:
    if isinstance(o, torch.Tensor):
        return np_dtype(str(o.dtype).removeprefix("torch."))
    return np.asarray(o).dtype


def _vjp_fn(case: OpCase, arrays: list[np.ndarray]) -> Callable:
    """``g(*inputs, *cotangents)``: the vjp of the case w.r.t. its differentiated inputs, traceable (every input a
    graph input, so the compiled program computes the gradient itself)."""
    diff, n = _diff(case, arrays), len(arrays)

    def g(*a):
        vals, cts = list(a[:n]), list(a[n:])

        def f(*diff_vals):
            v = list(vals)
            for i, x in zip(diff, diff_vals):
                v[i] = x
            return _flat(case.nf_fn(*v))

        return list(nf.vjp(f, *[vals[i] for i in diff])[1](cts))

    return g


# ---- compiled backends: one program per (backend, mode, dtype) group; each test reads its own case's outputs --------
_GROUPS: dict[str, Groups] = {}


def _forward_fn(case: OpCase) -> Callable:
    return lambda *a: _flat(case.nf_fn(*a))


def _members(mode: str, dtype: str) -> list[Member]:
    """Every case of one (mode, dtype) group, with the same inputs as the eager test of that case."""
    out = []
    for c in CASES:
        if mode == "forward" and dtype in c.dtypes and (c.name, dtype) not in _SKIP_FORWARD:
            out.append(Member(c.name, _forward_fn(c), _inputs(c, dtype)))
        elif mode == "edge" and "float64" in c.dtypes:
            out.append(Member(c.name, _forward_fn(c), _with_edges(c, _inputs(c, dtype))))
        elif mode == "shapes" and "float64" in c.dtypes:
            out.extend(Member((c.name, shape), _forward_fn(c), _reshaped(c, dtype, shape)) for shape in SHAPES)
        elif mode == "grad" and c.grad:
            arrays = _inputs(c, dtype)
            ref = _flat(_torch_fn(c)(*[to_torch(a) for a in arrays]))
            out.append(Member(c.name, _vjp_fn(c, arrays), [*arrays, *_cotangents(c, ref)]))
    return out


def _compiled(backend: str, mode: str, dtype: str, key) -> list[np.ndarray]:
    """The outputs of case ``key`` from its group's compiled program (built on first use in this worker)."""
    groups = _GROUPS.setdefault(backend, Groups(backend))
    return groups.outputs((backend, mode, dtype), key, lambda: _members(mode, dtype))


def _checked(backend: str, mode: str, dtype: str, key, check: Callable[[list], None]) -> None:
    """``check`` the case's outputs from its group; if they fail, compile the case alone to say whether the case
    itself miscompiles or only its group does."""
    try:
        check(_compiled(backend, mode, dtype, key))
    except AssertionError as e:
        if isinstance(e, Fallback):
            raise
        member = next(m for m in _members(mode, dtype) if m.key == key)
        try:
            check(_GROUPS[backend].alone(member))
        except AssertionError:
            raise e from None
        raise AssertionError(f"passes compiled alone, fails in its group's program: {e}") from e


def _outputs(case: OpCase, arrays: list[np.ndarray], backend: str, mode: str, dtype: str, key) -> list:
    """The case's outputs on ``backend``: eager tensors on the reference backend, compiled arrays elsewhere."""
    if backend == "reference":
        return _flat(case.nf_fn(*[nf.tensor(a) for a in arrays]))
    return _compiled(backend, mode, dtype, key)


def _agree_with_torch(case: OpCase, arrays: list[np.ndarray], what: str, backend: str = "reference",
                      mode: str = "edge", key=None) -> None:
    """Same values (NaN where torch has NaN), shapes and dtypes as torch; an error where torch raises one."""
    key = case.name if key is None else key
    try:
        ref = _flat(_torch_fn(case)(*[to_torch(a) for a in arrays]))
    except (RuntimeError, IndexError, ValueError, TypeError):
        with pytest.raises(nf.NNForgeError):
            out = _outputs(case, arrays, backend, mode, "float64", key)
            _flat(out)[0].numpy() if backend == "reference" else None
        return

    def check(out):
        assert len(out) == len(ref), what
        for k, (o, r) in enumerate(zip(out, ref)):
            assert tuple(o.shape) == tuple(r.shape), f"{what}: shape {tuple(o.shape)} vs {tuple(r.shape)}"
            assert _dtype_name(o) == str(r.dtype).removeprefix("torch."), f"{what}: dtype {o.dtype} vs {r.dtype}"
            a, e = to_np(o), to_np(r)
            if a.dtype.kind != "f":
                np.testing.assert_array_equal(a, e, err_msg=what)
            else:
                assert np.array_equal(np.isnan(a), np.isnan(e)), f"{what} output {k}: NaN at {a} vs {e}"
                # float64 against torch's own float64: 1e-12 relative is ~5e3 ulps, room for two libms (glibc's
                # vectorized and scalar forms in the C backend, numpy's, torch's) yet far below any wrong formula.
                np.testing.assert_allclose(a, e, rtol=1e-12, atol=1e-300, equal_nan=True, err_msg=f"{what} output {k}")

    if backend == "reference":
        check(_outputs(case, arrays, backend, mode, "float64", key))
    else:
        _checked(backend, mode, "float64", key, check)


def _dtype_name(o) -> str:
    """An output's dtype name: an nf.Tensor's, or a numpy array's (bfloat16 included)."""
    if isinstance(o, nf.Tensor):
        return o.dtype.value
    d = np.asarray(o).dtype
    return "bfloat16" if d == np_dtype("bfloat16") else str(d)


def check_op(case: OpCase, mode: str, dtype: str, backend: str = "reference") -> None:
    """The one driver of every op test (forward, grad vs torch autograd, finite differences, edge values, 0-d and
    empty inputs), on ``backend``: eagerly on the reference interpreter, compiled elsewhere."""
    if mode == "edge":
        _agree_with_torch(case, _with_edges(case, _inputs(case, dtype)), f"{case.name} at edge values", backend)
        return
    if mode == "shapes":
        for shape in SHAPES:  # every input 0-d or empty: torch's result, or an error where it raises
            _agree_with_torch(case, _reshaped(case, dtype, shape), f"{case.name} on {shape} inputs", backend,
                              "shapes", (case.name, shape))
        return
    arrays = _inputs(case, dtype)
    diff = _diff(case, arrays)
    if mode == "forward":
        ref = _flat(_torch_fn(case)(*[to_torch(a) for a in arrays]))

        def check(out):
            assert len(out) == len(ref)
            for k, (o, r) in enumerate(zip(out, ref)):
                if backend == "reference":
                    assert isinstance(o, nf.Tensor), f"{case.name}: output {k} is a {type(o).__name__}"
                    assert o.numpy().dtype == np_dtype(o.dtype.value), f"{case.name}: value dtype differs from o.dtype"
                name = _dtype_name(o)
                assert name == str(r.dtype).removeprefix("torch."), f"{case.name}: dtype {name} vs {r.dtype}"
                assert tuple(o.shape) == tuple(r.shape), f"{case.name}: shape {tuple(o.shape)} vs {tuple(r.shape)}"
                v = o.numpy() if isinstance(o, nf.Tensor) else np.asarray(o)
                if "large" in case.name:
                    assert np.isfinite(v.astype(np.float64)).all(), f"{case.name}: inf/nan at large inputs"
                if name in FLOATS:
                    assert_close(v, r, name, what=f"{case.name} output {k}")
                else:
                    np.testing.assert_array_equal(v, r.numpy(), err_msg=case.name)

        if backend == "reference":
            check(_flat(case.nf_fn(*[nf.tensor(a) for a in arrays])))
        else:
            _checked(backend, mode, dtype, case.name, check)
        return

    if backend != "reference":  # grad, compiled: the vjp program of every case of this dtype at once
        assert mode == "grad", mode
        targs = [to_torch(a, requires_grad=i in diff) for i, a in enumerate(arrays)]
        tout = _flat(_torch_fn(case)(*targs))
        cts = _cotangents(case, tout)
        tg = torch.autograd.grad(tout, [targs[i] for i in diff], [to_torch(c) for c in cts], allow_unused=True)

        def check_grads(grads):
            assert len(grads) == len(diff)
            for i, g, r in zip(diff, grads, tg):
                g = np.asarray(g)
                assert g.shape == arrays[i].shape and g.dtype == arrays[i].dtype, f"{case.name}: grad {i}"
                assert np.isfinite(g).all(), f"{case.name}: gradient {i} not finite"
                r = torch.zeros_like(targs[i]) if r is None else r
                assert_close(g, r, dtype, grad=True, what=f"{case.name} grad of input {i}")

        _checked(backend, mode, dtype, case.name, check_grads)
        return

    def f(*diff_vals):
        vals = list(arrays)
        vals = [nf.tensor(v) for v in vals]
        for i, v in zip(diff, diff_vals):
            vals[i] = v
        return _flat(case.nf_fn(*vals))

    out, vjp_fn = nf.vjp(f, *[arrays[i] for i in diff])
    cts = _cotangents(case, out)
    grads = vjp_fn(cts)
    assert len(grads) == len(diff)
    for i, g in zip(diff, grads):
        assert np.shape(g) == arrays[i].shape and np.asarray(g).dtype == arrays[i].dtype, f"{case.name}: grad {i}"
        assert np.isfinite(g).all(), f"{case.name}: gradient {i} not finite"

    if mode == "grad":
        targs = [to_torch(a, requires_grad=i in diff) for i, a in enumerate(arrays)]
        tout = _flat(_torch_fn(case)(*targs))
        tg = torch.autograd.grad(tout, [targs[i] for i in diff], [to_torch(c) for c in cts], allow_unused=True)
        for i, g, r in zip(diff, grads, tg):
            r = torch.zeros_like(targs[i]) if r is None else r
            assert_close(g, r, dtype, grad=True, what=f"{case.name} grad of input {i}")
        return

    # finite differences of <f(x), ct> in float64, element by element
    def phi(vals):
        return sum(float(np.sum(o.numpy() * c)) for o, c in zip(f(*[nf.tensor(v) for v in vals]), cts))

    base = [arrays[i].copy() for i in diff]
    for k, g in enumerate(grads):
        num = np.zeros_like(base[k])
        for idx in np.ndindex(*base[k].shape):
            plus = [b.copy() for b in base]
            minus = [b.copy() for b in base]
            plus[k][idx] += FD_STEP
            minus[k][idx] -= FD_STEP
            num[idx] = (phi(plus) - phi(minus)) / (2 * FD_STEP)
        assert_close(g, num, rtol=FD_TOL[0], atol=FD_TOL[1], what=f"{case.name} fd of input {diff[k]}")


@pytest.mark.parametrize(("case", "mode", "dtype", "backend"), list(_params()))
def test_op(case: OpCase, mode: str, dtype: str, backend: str) -> None:
    skip_where_unrunnable(backend, dtype, *(["bfloat16"] if case.name.endswith("_bfloat16") else []))
    reason = _falls_back(backend, case, mode, dtype)
    if reason is None:
        check_op(case, mode, dtype, backend)
        return
    try:
        check_op(case, mode, dtype, backend)
    except Fallback as e:
        error = str(e)
    else:
        pytest.fail(f"ran compiled on {backend} although listed as falling back ({reason}): update _falls_back")
    # a skip, not an xfail: pytest formats an xfailed test's traceback (0.1 s each here, 40 s for these cases)
    pytest.skip(f"not compiled: {error}")


def test_table_covers_required_ops() -> None:
    """The table is the contract: every required op has at least one row."""
    names = " ".join(c.name for c in CASES)
    required = ["add", "sub", "mul", "div", "pow", "cmp_lt", "cmp_eq", "neg", "exp", "log", "sqrt", "rsqrt", "sin",
                "cos", "tanh", "sigmoid", "relu", "abs", "sign", "reciprocal", "where", "maximum", "minimum",
                "clamp", "sum_", "mean_", "max_", "min_", "var_", "softmax", "log_softmax", "logsumexp",
                "matmul_1d_1d", "matmul_bcast_batch", "reshape", "view", "permute", "transpose", "T", "expand",
                "squeeze", "unsqueeze", "flip", "index_", "concat", "stack", "chunk", "split", "pad", "cast_to_"]
    missing = [r for r in required if r not in names]
    assert not missing, missing
    assert len({c.name for c in CASES}) == len(CASES), "duplicate case names"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_logsumexp_with_infinite_slices_matches_torch(dtype):
    """A fully masked row (all -inf) gives -inf, a row holding +inf gives +inf: not inf - inf = nan."""
    a = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0], [np.inf, 1.0, 2.0], [30.0, 29.0, -np.inf]],
                 dtype=np_dtype(dtype))
    for axis in (-1, 0):
        assert_close(nf.tensor(a).logsumexp(axis), to_torch(a).logsumexp(axis), dtype, what=f"axis {axis}")
    t = to_torch(a, requires_grad=True)
    ct = np.array([0.0, 1.5, 0.0, -2.0], dtype=np_dtype(dtype))
    (t.logsumexp(-1) * to_torch(ct)).sum().backward()
    g = nf.grad(lambda x: (x.logsumexp(-1) * ct).sum())(a)
    np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-5, equal_nan=True)
    assert np.isfinite(g[[1, 3]]).all()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_log1p_expm1_exact_near_zero(backend, dtype):
    """log1p and expm1 keep their relative precision where x is tiny (``log(1 + x)`` and ``exp(x) - 1`` lose all
    of it below eps: the table's absolute tolerance could not tell), and give torch's specials: -inf at -1, NaN
    below it, -1 far below 0, inf past overflow."""
    rng = np.random.default_rng(seed_of("log1p_expm1", backend, dtype))
    tiny = np.concatenate([np.geomspace(1e-30, 1e-2, 29), -np.geomspace(1e-30, 1e-2, 29)]) * rng.uniform(1, 2, 58)
    special = [0.0, -0.0, -1.0, -2.5, np.inf, -np.inf, np.nan, -800.0, 800.0, 0.5]
    x = np.concatenate([tiny, special]).astype(np_dtype(dtype))
    f = lambda a: (nf.log1p(a), nf.expm1(a))  # noqa: E731
    out = f(nf.tensor(x)) if backend == "reference" else nf.compile(f, backend=backend)(x)
    for got, ref in zip(out, (torch.log1p(to_torch(x)), torch.expm1(to_torch(x)))):
        got, ref = np.asarray(got.numpy() if isinstance(got, nf.Tensor) else got), ref.numpy()
        assert np.array_equal(np.isnan(got), np.isnan(ref)), (x, got, ref)
        finite = np.isfinite(ref)
        assert np.array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
        ulps = 4 * np.finfo(np_dtype(dtype)).eps  # a few ulps, relative, at every magnitude
        np.testing.assert_allclose(got[finite], ref[finite], rtol=ulps, atol=0)


@pytest.mark.parametrize(("equation", "shapes", "message"), [
    ("ij,jk->ik", [(3, 4), (5, 2)], r"einsum: subscript 'j' of 'ij,jk->ik' is 4 in an earlier operand and 5 in "
                                    r"operand 1 \(operands \[3, 4\], \[5, 2\]\)"),
    ("ij,jk->ik", [(3, 4)], r"names 2 operand\(s\), 1 were given"),
    ("ijk->i", [(3, 4)], r"operand 0 has 2 dimension\(s\), the term 'ijk' of 'ijk->i' names 3"),
    ("ij->jj", [(3, 4)], "names a subscript twice"),
    ("ij->z", [(3, 4)], "output subscript 'z' of 'ij->z' is not in any operand"),
    ("i1,j->i", [(3, 4), (2,)], "character '1'"),
    ("ii->i", [(3, 4)], "subscript 'i' repeats in operand 0's term of 'ii->i' over axes of sizes 3 and 4"),
])
def test_einsum_errors_name_the_equation(equation, shapes, message):
    rng = np.random.default_rng(seed_of("einsum_errors", equation))
    with pytest.raises(nf.ShapeError, match=message):
        nf.einsum(equation, *[rng.standard_normal(s) for s in shapes])


@pytest.mark.parametrize("index", [(slice(None, None, -1),), (slice(3, 0, -1), 1), (Ellipsis, slice(-1, -4, -1)),
                                   (slice(2, 2, -1),)])
def test_set_at_reversed_slices_as_numpy(backend: str, index: tuple, request: pytest.FixtureRequest) -> None:
    """Steps of -1 (torch has none: numpy is the reference), the value in the selection's order."""
    rng = np.random.default_rng(seed_of(request.node.name))
    x = rng.standard_normal((4, 3, 5))
    value = rng.standard_normal(x[index].shape)
    expected = x.copy()
    expected[index] = value
    got = nf.compile(lambda a, v: nf.set_at(a, index, v), backend=backend)(x, value)
    np.testing.assert_array_equal(np.asarray(got), expected)


def test_set_at_errors() -> None:
    x = nf.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(nf.ShapeError, match=r"set_at: slice steps \(1, 2\) on \[2, 3\]: an assignment takes steps"):
        nf.set_at(x, (slice(None), slice(None, None, 2)), 0.0)
    with pytest.raises(nf.ShapeError, match=r"set_at: a value of \[3\] does not broadcast to the selection \[2, 2\]"):
        nf.set_at(x, (slice(None), slice(1, 3)), nf.tensor(np.ones(3)))
    with pytest.raises(nf.ShapeError, match=r"index: 2 out of range for axis 0 of size 2"):
        nf.set_at(x, 2, 1.0)


def test_masked_fill_errors():
    x = nf.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(nf.DTypeError, match=r"masked_fill: the mask must be bool, got nf\.int64"):
        x.masked_fill(np.ones((2, 3), np.int64), 0.0)
    with pytest.raises(nf.ShapeError, match=r"a mask of \[4, 2, 3\] does not broadcast to the tensor's \[2, 3\]"):
        x.masked_fill(np.ones((4, 2, 3), bool), 0.0)
    with pytest.raises(nf.ShapeError, match=r"the value must be a number or a 0-d tensor, got \[3\]"):
        x.masked_fill(np.ones((2, 3), bool), nf.tensor(np.ones(3)))
    with pytest.raises(nf.ShapeError, match=r"tril: needs at least 2 dimensions, got \[3\]"):
        nf.tril(np.ones(3))
