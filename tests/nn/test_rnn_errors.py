"""Errors a user can act on: concrete shapes (never traced size symbols), the user's line, and for recurrent
layers the layout they expect and the likely fix."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf
import nnforge.nn as nn
from nnforge.errors import DTypeError, ShapeError


def test_compiled_shape_errors_show_concrete_shapes_and_the_users_line() -> None:
    with pytest.raises(ShapeError, match=r"^matmul: inner sizes differ: \[2, 3\] @ \[4, 5\] \(at .*test_rnn_errors"):
        nf.compile(lambda a, b: a @ b)(np.ones((2, 3)), np.ones((4, 5)))
    with pytest.raises(ShapeError, match=r"cannot broadcast shapes \[2, 3\], \[4, 5\]"):
        nf.compile(lambda a, b: a + b)(np.ones((2, 3)), np.ones((4, 5)))


@pytest.mark.parametrize("batch_first", [False, True])
def test_lstm_fed_channels_first_says_so(batch_first: bool) -> None:
    lstm = nn.LSTM(4, 8, batch_first=batch_first)
    x = np.ones((2, 4, 10), np.float32)  # a Conv1d's [N, C, T]
    with pytest.raises(ShapeError) as info:
        nf.compile(lambda x: lstm(x))(x)
    msg = str(info.value)
    assert "has 10 features in its last axis, expected 4" in msg and "test_rnn_errors.py" in msg
    assert ("[N, T, features]" if batch_first else "[T, N, features]") in msg
    assert ("permute(2, 0, 1)" in msg) != batch_first


def test_lstm_fed_integers_or_the_wrong_rank_says_so() -> None:
    lstm = nn.GRU(4, 8)
    with pytest.raises(DTypeError, match=r"GRU: the input must be floating point \(the weights are float32\), "
                                         r"got int64"):
        nf.compile(lambda x: lstm(x))(np.ones((10, 2, 4), np.int64))
    with pytest.raises(ShapeError, match=r"GRU: expected a 3-d \[T, N, features\].*got \[3, 4, 5, 6\]"):
        lstm(nf.tensor(np.ones((3, 4, 5, 6), np.float32)))


@pytest.mark.parametrize("layer", [nn.LSTM(3, 4), nn.GRU(3, 4), nn.RNN(3, 4), nn.LSTMCell(3, 4), nn.GRUCell(3, 4)],
                         ids=lambda m: type(m).__name__)
def test_a_half_precision_input_to_float32_weights_runs_in_float32(layer: nn.Module) -> None:
    """Its products with the weights promote; the state did not, and the scan refused a carry changing dtype."""
    x = np.random.default_rng(44).standard_normal((2, 3) if "Cell" in type(layer).__name__ else (5, 2, 3))
    half = nf.tensor(x.astype(np.float16))
    for inputs in (half, half.cast(nf.bfloat16)):
        got, expected = layer(inputs), layer(inputs.cast(nf.float32))
        for g, e in zip(_leaves(got), _leaves(expected), strict=True):
            assert g.dtype == nf.float32
            np.testing.assert_array_equal(g.numpy(), e.numpy())


def _leaves(value) -> list:
    return [v for item in value for v in _leaves(item)] if isinstance(value, tuple) else [value]


def test_an_integer_initial_state_says_so() -> None:
    with pytest.raises(DTypeError, match=r"LSTM: c0 must be floating point, got int64 \(at .*test_rnn_errors"):
        nn.LSTM(3, 4)(nf.tensor(np.ones((5, 2, 3), np.float32)), (np.ones((1, 2, 4), np.float32),
                                                                     np.ones((1, 2, 4), np.int64)))


@pytest.mark.parametrize(("cell", "state", "message"), [
    (nn.LSTMCell(3, 4), (np.ones((2, 5)), np.ones((2, 4))), r"LSTMCell: h has shape \[2, 5\], expected \[2, 4\]"),
    (nn.LSTMCell(3, 4), (np.ones((2, 4)), np.ones((3, 4))), r"LSTMCell: c has shape \[3, 4\], expected \[2, 4\]"),
    (nn.GRUCell(3, 4), np.ones((3, 4)), r"GRUCell: h has shape \[3, 4\], expected \[2, 4\]"),
    (nn.RNNCell(3, 4), np.ones(4), r"RNNCell: h has shape \[4\], expected \[2, 4\]"),
], ids=["lstm-h", "lstm-c", "gru", "rnn"])
def test_a_cells_state_of_the_wrong_shape_names_the_cell(cell: nn.Module, state, message: str) -> None:
    """It failed inside the step's product or sum, named `matmul` or `add`."""
    x = nf.tensor(np.random.default_rng(46).standard_normal((2, 3)).astype(np.float32))
    with pytest.raises(ShapeError, match=message + r" for an input of \[2, 3\] \(at .*test_rnn_errors"):
        cell(x, state)


def test_an_embedding_of_float_indices_names_the_users_line() -> None:
    with pytest.raises(DTypeError, match=r"embedding: needs integer indices, got .*float32 \(at .*test_rnn_errors"):
        nn.Embedding(10, 3)(nf.tensor(np.ones(2, np.float32)))
