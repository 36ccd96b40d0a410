"""A Bonito-style CRF basecaller (conv front end, five LSTMs alternating direction with frozen ``bias_hh``, a
linear CRF head) loaded from a Bonito-layout torch checkpoint in one call and trained for a few AdamW steps with
the CTC-CRF loss: every loss and every weight matches a plain-torch port of the same steps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_crf import ctc_crf_loss as torch_ctc_crf_loss

import nnforge as nf
import nnforge.nn as nn
import nnforge.nn.functional as F
from nnforge.nn import optim

STATE_LEN, FEATURES, SCALE = 2, 12, 5.0
REVERSE = [True, False, True, False, True]
# float32 through 3 convs, 5 LSTM layers of 20 steps, log-space recursions over 16 states and 3 AdamW steps,
# summed in other orders on each side: a few hundred ulps, far below a wrong edge or gate (O(1e-2) or more).
RTOL, ATOL = 5e-4, 5e-5


class _Conv(torch.nn.Module):  # Bonito's Convolution: .conv then swish
    def __init__(self, c_in, c_out, ks, stride=1):
        super().__init__()
        self.conv = torch.nn.Conv1d(c_in, c_out, ks, stride=stride, padding=ks // 2, bias=True)

    def forward(self, x):
        return torch.nn.functional.silu(self.conv(x))


class _Permute(torch.nn.Module):
    def forward(self, x):
        return x.permute(2, 0, 1)


class _LSTM(torch.nn.Module):  # Bonito's RNNWrapper: one torch LSTM under .rnn, bias_hh frozen at zero
    def __init__(self, size, reverse):
        super().__init__()
        self.rnn, self.reverse = torch.nn.LSTM(size, size), reverse
        self.rnn.bias_hh_l0.requires_grad = False
        with torch.no_grad():
            self.rnn.bias_hh_l0.zero_()

    def forward(self, x):
        y, _ = self.rnn(x.flip(0) if self.reverse else x)
        return y.flip(0) if self.reverse else y


class _CRFHead(torch.nn.Module):  # Bonito's LinearCRFEncoder: linear, tanh, scale
    def __init__(self, size):
        super().__init__()
        self.linear = torch.nn.Linear(size, 5 * 4 ** STATE_LEN)

    def forward(self, x):
        return torch.tanh(self.linear(x)) * SCALE


class TorchModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Sequential(_Conv(1, 4, 5), _Conv(4, 8, 5), _Conv(8, FEATURES, 9, stride=3),
                                           _Permute(), *[_LSTM(FEATURES, r) for r in REVERSE], _CRFHead(FEATURES))

    def forward(self, x):
        return self.encoder(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, 4, 5, padding=2), nn.SiLU(), nn.Conv1d(4, 8, 5, padding=2), nn.SiLU(),
                                  nn.Conv1d(8, FEATURES, 9, stride=3, padding=4), nn.SiLU())
        self.rnn = nn.LSTM(FEATURES, FEATURES, num_layers=5, reverse=REVERSE)
        self.head = nn.Linear(FEATURES, 5 * 4 ** STATE_LEN)
        for k in range(5):
            getattr(self.rnn, f"bias_hh_l{k}").requires_grad = False

    def forward(self, x):
        out, _ = self.rnn(self.conv(x).permute(2, 0, 1))
        return self.head(out).tanh() * SCALE


def load_bonito(model: Model, sd: dict) -> None:
    """The documented one-call load of a Bonito checkpoint into the stacked model."""
    sd = nn.stack_rnn_layers(sd, [f"encoder.{i}.rnn." for i in range(4, 9)], into="rnn.")
    model.load_state_dict(nn.rename_prefixes(sd, {"encoder.0.conv.": "conv.0.", "encoder.1.conv.": "conv.2.",
                                                  "encoder.2.conv.": "conv.4.", "encoder.9.linear.": "head."}))


@pytest.mark.whole_model
def test_bonito_crf_model_trains_like_its_torch_port(backend, rng):
    torch.manual_seed(int(rng.integers(1 << 31)))
    t_model, n_model = TorchModel(), Model()
    load_bonito(n_model, t_model.state_dict())
    before = n_model.state_dict()
    t_opt = torch.optim.AdamW(t_model.parameters(), lr=2e-3)   # frozen biases included, as Bonito passes them
    n_opt = optim.AdamW(n_model.parameters(), lr=2e-3)

    @nf.compile(backend=backend)
    def train_step(x, targets, lengths):
        n_opt.zero_grad()
        loss = F.ctc_crf_loss(n_model(x), targets, lengths, STATE_LEN)
        loss.backward()
        n_opt.step()
        return loss

    n, samples, width = 3, 60, 8
    for _ in range(3):
        x = rng.standard_normal((n, 1, samples)).astype(np.float32)
        lengths = rng.integers(STATE_LEN + 1, width + 1, n)
        targets = rng.integers(1, 5, (n, width))
        targets[np.arange(width)[None, :] >= lengths[:, None]] = 0
        t_opt.zero_grad()
        t_loss = torch_ctc_crf_loss(t_model(torch.tensor(x)), torch.tensor(targets), torch.tensor(lengths),
                                    STATE_LEN)
        t_loss.backward()
        t_opt.step()
        np.testing.assert_allclose(train_step(x, targets, lengths), t_loss.item(), rtol=RTOL, atol=ATOL)
    assert train_step.trace_count == 1
    want = nn.rename_prefixes(nn.stack_rnn_layers(
        {k: v.detach() for k, v in t_model.state_dict().items()}, [f"encoder.{i}.rnn." for i in range(4, 9)],
        into="rnn."), {"encoder.0.conv.": "conv.0.", "encoder.1.conv.": "conv.2.", "encoder.2.conv.": "conv.4.",
                       "encoder.9.linear.": "head."})
    got = n_model.state_dict()
    assert got.keys() == want.keys()
    for k, v in want.items():
        np.testing.assert_allclose(got[k], v.numpy(), rtol=RTOL, atol=ATOL, err_msg=k)
        if "bias_hh" in k:  # frozen: never updated, by weight decay neither
            np.testing.assert_array_equal(got[k], 0, err_msg=k)
        else:
            assert np.abs(got[k] - before[k]).max() > 1e-4, f"{k} did not train"
