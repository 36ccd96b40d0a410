"""Bad input gives a clear error: the right exception type, the op's name, and the caller's file:line.

Each test records the line of the offending call with ``next_line()`` (the line right after it) and checks that
the message names ``test_errors.py:<that line>``.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import nnforge as nf

HERE = os.path.basename(__file__)


def next_line() -> str:
    """``test_errors.py:N`` for the line after the caller's."""
    frame = inspect.currentframe().f_back
    return f"{HERE}:{frame.f_lineno + 1}"


def check(excinfo, *words: str, loc: str) -> None:
    msg = str(excinfo.value)
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    assert loc in msg, f"caller location {loc!r} not in {msg!r}"


X = nf.ones(3, 4)


# ---- shapes ---------------------------------------------------------------------------------------------------
def test_broadcast_mismatch():
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        _ = X + nf.ones(5)
    check(ei, "add", "[3, 4]", "[5]", loc=loc)


def test_broadcast_mismatch_in_maximum_and_where():
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        nf.maximum(X, nf.ones(2, 1, 3))
    check(ei, "max", "[2, 1, 3]", loc=loc)
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        nf.where(X > 0, X, nf.ones(2))
    check(ei, "where", loc=loc)


def test_matmul_inner_size_mismatch():
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        _ = X @ nf.ones(5, 2)
    check(ei, "matmul", "[3, 4]", "[5, 2]", loc=loc)


def test_matmul_batch_mismatch():
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        nf.matmul(nf.ones(2, 3, 4), nf.ones(3, 4, 5))
    check(ei, "matmul", loc=loc)


def test_matmul_of_a_scalar():
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        _ = nf.tensor(2.0) @ X
    check(ei, "matmul", "1-d", loc=loc)


@pytest.mark.parametrize(("call", "words"), [
    (lambda: X.reshape(5, 3), ("reshape", "[3, 4]")),
    (lambda: X.reshape(-1, -1), ("reshape", "-1")),
    (lambda: X.sum(2), ("sum", "axis 2")),
    (lambda: X.expand(2, 5), ("expand",)),
    (lambda: X.permute(0, 0), ("permute",)),
    (lambda: X.transpose(0, 3), ("transpose",)),
    (lambda: nf.ones(2, 3, 4).transpose(0, 2, 1), ("transpose", "two axes", "permute(0, 2, 1)")),  # numpy's form
    (lambda: nf.ones(2, 3, 4).transpose((2, 0, 1)), ("transpose", "permute(2, 0, 1)")),
    (lambda: nf.ones(2, 3, 4).transpose((0, 2)), ("transpose", "transpose(0, 2)")),  # the pair as one tuple
    (lambda: nf.ones(2, 3, 4, 5).transpose(0, 2, 1), ("transpose", "all 4 axes")),
    (lambda: X[3], ("index", "3")),
    (lambda: X[0, 0, 0], ("index", "3 indices")),
    (lambda: X[..., 0, ...], ("index", "Ellipsis")),
    (lambda: X[::0], ("index", "step")),
    (lambda: nf.concat([X, nf.ones(2, 5)]), ("concat", "[2, 5]")),
    (lambda: nf.stack([X, nf.ones(3, 5)]), ("stack", "[3, 5]")),
    (lambda: X.chunk(3, 1), ("chunk", "3")),
    (lambda: X.split([1, 2], 1), ("split", "[1, 2]")),
    (lambda: X.pad(((1, 1),)), ("pad",)),
    (lambda: X.squeeze(5), ("squeeze",)),
    (lambda: X.unsqueeze(4), ("unsqueeze",)),
    (lambda: nf.zeros(2.5), ("shape", "2.5")),
    (lambda: X.softmax(2), ("axis 2",)),
])
def test_shape_errors_name_the_op_and_this_file(call, words):
    """The location is the lambda's line (in this file), not a line inside nnforge."""
    with pytest.raises(nf.ShapeError) as ei:
        call()
    check(ei, *words, loc=f"{HERE}:")
    line = int(str(ei.value).rsplit(f"{HERE}:", 1)[1].split(")")[0])
    assert line == call.__code__.co_firstlineno


# ---- dtypes ---------------------------------------------------------------------------------------------------
def test_matmul_of_int_tensors():
    a = nf.ones(2, 2, dtype="int32")
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        _ = a @ a
    check(ei, "matmul", "int32", loc=loc)


def test_an_integer_tensor_to_a_negative_power():
    a = nf.tensor(np.array([1, 2, 3]))
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        _ = a ** -2
    check(ei, "pow", "int64", "negative power -2", "cast to a float", loc=loc)


def test_bool_arithmetic():
    b = X > 0
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        _ = b + b
    check(ei, "add", "bool", loc=loc)
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        _ = b - b
    check(ei, "sub", "bool", loc=loc)
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        _ = -b
    check(ei, "neg", "bool", loc=loc)


def test_where_condition_must_be_bool():
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        nf.where(X, X, X)
    check(ei, "where", "bool", loc=loc)


def test_logical_ops_need_bool():
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        _ = X & X
    check(ei, "&", loc=loc)


def test_requires_grad_on_int_and_grad_of_int_argument():
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        nf.tensor(np.arange(3), requires_grad=True)
    check(ei, "gradients", "int64", loc=loc)
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        nf.grad(lambda a: a.sum())(np.ones(3, np.int32))
    check(ei, "grad", "int32", loc=loc)


# ---- non-tensor arguments -------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["abc", {"a": 1}, None, object()], ids=["str", "dict", "None", "object"])
def test_non_tensor_operand_of_binary_op(bad):
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        _ = X * bad
    check(ei, "mul", type(bad).__name__, loc=loc)
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        _ = bad - X
    check(ei, "sub", type(bad).__name__, loc=loc)


@pytest.mark.parametrize("bad", ["abc", {"a": 1}, object()], ids=["str", "dict", "object"])
def test_non_tensor_argument_of_functional_op(bad):
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.exp(bad)
    check(ei, "exp", type(bad).__name__, loc=loc)
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.matmul(X, bad)
    check(ei, "matmul", type(bad).__name__, loc=loc)
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.concat([X, bad])
    check(ei, "concat", type(bad).__name__, loc=loc)
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.where(X > 0, X, bad)
    check(ei, "where", type(bad).__name__, loc=loc)


def test_tensor_of_a_string():
    with pytest.raises(nf.DTypeError) as ei:
        loc = next_line()
        nf.tensor("abc")
    check(ei, "tensor", "str", loc=loc)


def test_unsupported_index_type():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        _ = X[0.5]
    check(ei, "index", "float", loc=loc)


def test_compile_of_a_non_function_and_non_array_arguments():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.compile({"not": "a function"})
    check(ei, "compile", "dict", loc=loc)
    f = nf.compile(lambda d: d["a"] * 2)
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        f({"a": object()})
    check(ei, "compile", "object", loc=loc)
    np.testing.assert_array_equal(f({"a": np.ones(2)}), [2.0, 2.0])  # a dict of arrays is fine


@pytest.mark.parametrize("dtype", [np.complex64, np.uint8])
def test_an_array_of_a_dtype_nnforge_has_not_is_named_by_its_dtype(dtype):
    f = nf.compile(lambda x: x * 2)
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        f(np.ones((3, 4), dtype))
    check(ei, "shape [3, 4]", f"no dtype for numpy {np.dtype(dtype)}", "supported: bool", loc=loc)
    assert "is not an array" not in str(ei.value)


def test_compiled_function_returning_a_string():
    f = nf.compile(lambda a: (a, "label"))
    with pytest.raises(nf.TraceError) as ei:
        f(np.ones(2))
    check(ei, "compile", "str", loc=HERE)


def test_error_inside_a_compiled_function_points_at_its_line():
    def f(a, b):
        loc.append(next_line())
        return a @ b

    loc: list[str] = []
    with pytest.raises(nf.ShapeError) as ei:
        nf.compile(f)(np.ones((2, 3)), np.ones((2, 3)))
    check(ei, "matmul", loc=loc[0])


def test_truth_value_of_a_traced_tensor():
    def f(a):
        loc.append(next_line())
        return a if a.sum() > 0 else -a

    loc: list[str] = []
    with pytest.raises(nf.TraceError) as ei:
        nf.compile(f)(np.ones(3))
    check(ei, "nf.where", loc=loc[0])


def test_unknown_backend():
    with pytest.raises(ValueError, match="gpu9"):
        nf.compile(lambda a: a, backend="gpu9")


# ---- scan -----------------------------------------------------------------------------------------------------
XS = nf.ones(5, 4)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"xs": None, "length": -1}, ValueError, ("scan: length must be 0 or more, got -1",)),
    ({"unroll": 0}, ValueError, ("scan: unroll must be 1 or more, got 0",)),
    ({"unroll": 2.5}, nf.TraceError, ("scan: unroll must be an int, got float 2.5",)),
    ({"checkpoint_every": 0}, ValueError, ("scan: checkpoint_every must be 1 or more, got 0",)),
    ({"checkpoint_every": -3}, ValueError, ("scan: checkpoint_every must be 1 or more, got -3",)),
    ({"reverse": "yes"}, nf.TraceError, ("scan: reverse must be True or False, got str 'yes'",)),
], ids=["negative length", "unroll 0", "fractional unroll", "checkpoint_every 0", "negative checkpoint_every",
        "reverse a string"])
def test_scan_arguments_out_of_range_are_refused(kwargs: dict, error: type, words: tuple) -> None:
    """A count computed wrong is refused where it is passed, not run as zero steps (C) or a numpy error at run
    time (the reference backend), nor accepted and ignored."""
    kwargs = {"xs": XS, **kwargs}
    with pytest.raises(error) as ei:
        loc = next_line()
        nf.scan(lambda c, x: (c, c), nf.zeros(4), **kwargs)
    check(ei, *words, loc=loc)


def test_scan_body_returns_wrong_carry_structure():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: ((c, c), x), nf.zeros(4), XS)
    check(ei, "scan", "carry structure", "(*, *)", loc=loc)


def test_scan_body_returns_wrong_dict_keys():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: ({"b": c["a"]}, x), {"a": nf.zeros(4)}, XS)
    check(ei, "scan", "'b'", "'a'", loc=loc)


def test_scan_body_returns_wrong_carry_shape():
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: (c.sum(), x), nf.zeros(4), XS)
    check(ei, "scan", "carry", "[4]", loc=loc)


def test_scan_body_returns_wrong_carry_dtype():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: (c.cast("float64"), x), nf.zeros(4), XS)
    check(ei, "scan", "dtype", "float64", loc=loc)


def test_scan_body_returns_a_single_value():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: c + x, nf.zeros(4), XS)
    check(ei, "scan", "(new_carry, y)", loc=loc)


def test_scan_xs_of_different_lengths():
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: (c + x[0] * x[1], None), nf.zeros(4), (nf.ones(3, 4), nf.ones(5, 4)))
    check(ei, "scan", "[3, 4]", "[5, 4]", loc=loc)


def test_scan_without_xs_or_length_and_with_0d_xs():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: (c, None), nf.zeros(4))
    check(ei, "scan", "length", loc=loc)
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: (c, None), nf.zeros(4), nf.tensor(1.0))
    check(ei, "scan", "0-d", loc=loc)


def test_scan_non_callable_body_and_non_tensor_xs():
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan("body", nf.zeros(4), XS)
    check(ei, "scan", "callable", loc=loc)
    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan(lambda c, x: (c, x), nf.zeros(4), "abc")
    check(ei, "scan", "str", loc=loc)


def test_error_inside_a_scan_body_points_into_the_body():
    def body(c, x):
        loc.append(next_line())
        return c + nf.ones(5), x

    loc: list[str] = []
    with pytest.raises(nf.ShapeError) as ei:
        nf.scan(body, nf.zeros(4), XS)
    check(ei, "add", "[4]", "[5]", loc=loc[0])


def test_scan_body_assigning_in_place():
    w = nf.zeros(4)

    def body(c, x):
        w.assign(c)
        return c, None

    with pytest.raises(nf.TraceError) as ei:
        loc = next_line()
        nf.scan(body, nf.zeros(4), XS)
    check(ei, "scan", "in place", loc=loc)


@pytest.mark.parametrize("grad", [True, False])
def test_an_nnforge_layer_behind_torch_names_the_users_line(grad: bool):
    """A layer of ``nnforge.nn`` called as a torch module (``TorchModule``) is traced inside torch's module call
    and, with gradients, its autograd function: neither torch's lines nor nnforge's are the user's."""
    import torch

    import nnforge.nn as nn
    from nnforge.torch import TorchModule

    layer = TorchModule(nn.Linear(4, 5))
    x = torch.ones(3, 6, requires_grad=grad)
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        layer(x)
    check(ei, "linear", "[3, 6]", "in_features 4", loc=loc)


@pytest.mark.parametrize(("layer", "shape", "words"), [
    ("conv", (2, 4, 9), ("conv1d", "4 channels", "expects 3")),
    ("norm", (2, 6), ("layer_norm", "[2, 6]", "[5]")),
    ("lstm_h0", (4, 2, 5), ("LSTM", "h0 has shape [1, 2, 7]", "expected [2, 2, 7]")),
    ("linear", (5, 2, 8), ("linear", "input [5, 2, 8]", "in_features 6", "[5, 6]")),
])
def test_a_layers_own_shape_checks_name_the_users_line(layer: str, shape: tuple, words: tuple):
    """The checks ``nnforge.nn`` layers make themselves (channels, normalized shapes, initial states) point at the
    user's call, also behind ``TorchModule``: those of the ops inside them always did."""
    import torch

    from nnforge.torch import TorchModule, from_torch

    torch.manual_seed(0)
    twin = {"conv": torch.nn.Conv1d(3, 4, 5), "norm": torch.nn.LayerNorm(5),
            "lstm_h0": torch.nn.LSTM(5, 7, num_layers=2), "linear": torch.nn.Linear(6, 5)}[layer]
    model = TorchModule(from_torch(twin), twin=twin)
    x = torch.randn(*shape)
    state = (torch.randn(1, 2, 7), torch.randn(1, 2, 7))
    with pytest.raises(nf.ShapeError) as ei:
        loc = next_line()
        model(x, state) if layer == "lstm_h0" else model(x)
    check(ei, *words, loc=loc)
