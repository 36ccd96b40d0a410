"""Loading checkpoints laid out differently: per-layer RNN keys into a stacked LSTM, renamed prefixes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn


class _TorchReverse(torch.nn.Module):
    """Bonito's LSTM layer wrapper: a single-layer torch LSTM under ``.rnn``, run backwards when ``reverse``."""

    def __init__(self, size: int, reverse: bool):
        super().__init__()
        self.rnn, self.reverse = torch.nn.LSTM(size, size), reverse

    def forward(self, x):
        y, _ = self.rnn(x.flip(0) if self.reverse else x)
        return y.flip(0) if self.reverse else y


def test_stacked_lstm_loads_per_layer_checkpoint_keys(backend, rng):
    reverse = [True, False, True, False, True]
    encoder = torch.nn.Sequential(torch.nn.Identity(), *[_TorchReverse(6, r) for r in reverse])
    sd = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    lstm = nn.LSTM(6, 6, num_layers=5, reverse=reverse)
    lstm.load_state_dict(nn.stack_rnn_layers(sd, [f"encoder.{i}.rnn." for i in range(1, 6)], into=""))
    x = rng.standard_normal((7, 2, 6)).astype(np.float32)
    out = nf.compile(lambda x: lstm(x)[0], backend=backend)(x)
    np.testing.assert_allclose(out, encoder(torch.tensor(x)).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_checkpoint_key_helpers_name_what_is_wrong():
    sd = {"a.rnn.weight_ih_l0": 1, "a.rnn.weight_ih_l1": 2, "head.w": 3}
    with pytest.raises(KeyError, match=r"'a\.rnn\.weight_ih_l1' under 'a\.rnn\.' is not a single-layer RNN key"):
        nn.stack_rnn_layers(sd, ["a.rnn."], into="rnn.")
    with pytest.raises(KeyError, match=r"no RNN keys under 'b\.rnn\.'"):
        nn.stack_rnn_layers({"a.rnn.bias_hh_l0_reverse": 1}, ["a.rnn.", "b.rnn."], into="rnn.")
    assert nn.stack_rnn_layers({"a.rnn.bias_hh_l0_reverse": 1, "x": 2}, ["a.rnn."], "rnn.") == {
        "rnn.bias_hh_l0_reverse": 1, "x": 2}
    assert nn.rename_prefixes({"encoder.0.conv.weight": 1, "encoder.0.x": 2, "y": 3},
                              {"encoder.0.conv.": "conv.", "encoder.": "enc."}) == {
        "conv.weight": 1, "enc.0.x": 2, "y": 3}
