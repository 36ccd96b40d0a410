"""``nnforge.torch.from_torch`` keeps what torch's model does after conversion: code reading ``self.training``
follows the converted model's modes, what torch shares stays shared, a layer's settings are converted or refused by
name, arrays given eagerly are tensors, a transformer layer's activation is any torch callable. Each against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import nnforge as nf
import nnforge.nn as nn
from nnforge.errors import NNForgeError
from nnforge.torch import TorchModule, from_torch

# ---- train/eval modes ------------------------------------------------------------------------------------------


class _Dropped(torch.nn.Module):
    """Mode-dependent code in both of torch's spellings: ``training=self.training`` and a value chosen by it."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 6)

    def forward(self, x):
        h = self.proj(x) * (2.0 if self.training else 0.5)
        return TF.dropout(h, p=0.5, training=self.training), h


def _check_dropped(got: tuple, model: torch.nn.Module, x: np.ndarray, training: bool) -> None:
    """In eval both outputs are torch's; in training the scaled value is torch's and the dropout keeps each element
    doubled or zeroes it (its mask is nnforge's own draw), some of each."""
    dropped, h = (np.asarray(g) for g in got)
    want = model(torch.tensor(x))[1].detach().numpy()
    np.testing.assert_allclose(h, want, rtol=1e-12, atol=1e-12)
    if not training:
        np.testing.assert_allclose(dropped, want, rtol=1e-12, atol=1e-12)
        return
    kept = dropped != 0
    assert kept.any() and not kept.all()
    np.testing.assert_allclose(dropped[kept], 2 * want[kept], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("converted_in", ["train", "eval"])
def test_code_reading_self_training_follows_the_converted_models_mode(backend: str, rng: np.random.Generator,
                                                                     converted_in: str) -> None:
    """fx reads ``self.training`` once, as a bool: the converted model was fixed to the mode it was converted in."""
    model = _Dropped().double().train(converted_in == "train")
    ours = from_torch(model)
    assert model.training == (converted_in == "train")  # the torch model's mode is left as it was
    f = nf.compile(lambda v: ours(v), backend=backend)
    for training in (False, True, False):
        ours.train(training)
        model.train(training)
        x = rng.standard_normal((8, 4))
        _check_dropped(f(x), model, x, training)


class _Scaled(torch.nn.Module):
    """A part no call of the converted model reaches: its weight is read, its code is the model's graph."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x):
        return x @ self.weight * (2.0 if self.training else 0.5)


class _Parts(torch.nn.Module):
    """Two parts reading their own mode, and a batch norm."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.bn = _Scaled(), _Scaled(), torch.nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(self.b(self.a(x)))


def test_each_part_keeps_its_own_mode(backend: str, rng: np.random.Generator) -> None:
    """A part set apart (a frozen batch norm, a block in eval inside a model in training) converts in its mode, and
    runs in the modes its model was captured in: every part in training, in eval, or as when converted. Any other
    mix is refused, naming the modes."""
    model = _Parts().double().train()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    model.b.eval()
    model.bn.eval()
    ours = from_torch(model)
    assert (ours.training, ours.a.training, ours.b.training, ours.bn.training) == (True, True, False, False)
    f = nf.compile(lambda v: ours(v), backend=backend)

    def check() -> None:
        x = rng.standard_normal((5, 3))
        np.testing.assert_allclose(np.asarray(f(x)), model(torch.tensor(x)).detach().numpy(), rtol=1e-10,
                                   atol=1e-12)

    check()
    ours.b.train()  # only the mode of a part no call reaches: the compiled function traces again
    model.b.train()
    check()
    for training in (False, True):
        ours.train(training)
        model.train(training)
        check()
    ours.a.eval()
    with pytest.raises(NNForgeError, match=r"^from_torch: _Parts.forward reads self.training, .* not with 'a' in "
                                           r"eval mode, 'b' in train mode: set the modes"):
        ours(nf.tensor(rng.standard_normal((5, 3))))


def test_torch_module_follows_torchs_mode_switch(rng: np.random.Generator) -> None:
    """``TorchModule(from_torch(m), twin=m).eval()`` in torch's loop: torch's eval values and gradients."""
    model = _Dropped().double().train()
    wrapped = TorchModule(from_torch(model), twin=model)
    wrapped.eval()
    x, w = torch.tensor(rng.standard_normal((8, 4))), torch.tensor(rng.standard_normal((8, 6)))
    got = wrapped(x)[0]
    (got * w).sum().backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    want = model(x)[0]
    (want * w).sum().backward()
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)
    for k, p in model.named_parameters():
        np.testing.assert_allclose(grads[k].numpy(), p.grad.numpy(), rtol=1e-12, atol=1e-12, err_msg=k)


# ---- what torch shares -------------------------------------------------------------------------------------------


class _Tied(torch.nn.Module):
    """GPT's weight tying (the head declared first, so torch names the shared weight after it, though the
    embedding is called first), a layer called under two names, a buffer two modules hold, a buffer kept out of
    the state dict."""

    def __init__(self, vocab: int = 7, d: int = 4):
        super().__init__()
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)
        self.wte = torch.nn.Embedding(vocab, d)
        self.wte.weight = self.lm_head.weight
        self.mix = torch.nn.Linear(d, d)
        self.again = self.mix
        self.register_buffer("gain", torch.linspace(0.5, 1.5, d, dtype=torch.float64))
        self.register_buffer("offset", torch.linspace(-1.0, 1.0, d, dtype=torch.float64), persistent=False)
        self.post = torch.nn.Module()
        self.post.register_buffer("gain", self.gain)

    def forward(self, idx):
        h = torch.tanh(self.wte(idx)) * self.gain + self.offset
        return self.lm_head(self.again(torch.tanh(self.mix(h))) * self.post.gain)


def test_what_torch_shares_stays_shared(backend: str, rng: np.random.Generator) -> None:
    """One parameter for a tied pair: its gradient is the sum over both uses, and two Adam steps keep one weight,
    torch's; parameter names and the state dict's keys are torch's, in its order."""
    model = _Tied().double()
    ours = from_torch(model)
    assert [k for k, _ in ours.named_parameters()] == [k for k, _ in model.named_parameters()]
    assert list(ours.state_dict()) == list(model.state_dict())
    assert ours.wte.weight is ours.lm_head.weight and ours.again is ours.mix and ours.post.gain is ours.gain
    opt = nn.optim.Adam(ours.parameters(), lr=1e-2)
    torch_opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    @nf.compile(backend=backend)
    def step(idx, w):
        opt.zero_grad()
        loss = (ours(idx) * w).sum()
        loss.backward()
        grads = {k: p.grad for k, p in ours.named_parameters()}
        opt.step()
        return loss, grads

    for _ in range(2):
        idx, w = rng.integers(0, 7, (2, 3)), rng.standard_normal((2, 3, 7))
        loss, grads = step(idx, w)
        torch_opt.zero_grad()
        want = (model(torch.tensor(idx)) * torch.tensor(w)).sum()
        want.backward()
        torch_opt.step()
        np.testing.assert_allclose(float(loss), want.item(), rtol=1e-12)
        for k, p in model.named_parameters():
            np.testing.assert_allclose(np.asarray(grads[k]), p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)
    for k, v in model.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[k], v.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_a_tied_model_runs_in_torchs_own_loop(rng: np.random.Generator) -> None:
    """``TorchModule(from_torch(m), twin=m)`` finds the tied weight under torch's name: torch's gradients."""
    model = _Tied().double()
    twin = _Tied().double()
    twin.load_state_dict(model.state_dict())
    wrapped = TorchModule(from_torch(twin), twin=twin)
    idx, w = torch.tensor(rng.integers(0, 7, (2, 3))), torch.tensor(rng.standard_normal((2, 3, 7)))
    (wrapped(idx) * w).sum().backward()
    (model(idx) * w).sum().backward()
    for (k, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


# ---- layer settings --------------------------------------------------------------------------------------------


class _Holds(torch.nn.Module):
    def __init__(self, layer: torch.nn.Module):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Identity(), layer)

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize(("layer", "setting"), [
    (torch.nn.MultiheadAttention(8, 2, add_zero_attn=True), "add_zero_attn=True"),
    (torch.nn.MultiheadAttention(8, 2, add_bias_kv=True), "add_bias_kv=True"),
    (torch.nn.MultiheadAttention(8, 2, kdim=4, vdim=6), r"kdim=4, vdim=6 \(other than embed_dim=8\)"),
    (torch.nn.Embedding(8, 4, max_norm=1.0), "max_norm=1.0"),
    (torch.nn.Embedding(8, 4, scale_grad_by_freq=True), "scale_grad_by_freq=True"),
])
def test_a_setting_nnforge_lacks_is_refused_by_name(layer: torch.nn.Module, setting: str) -> None:
    """Not converted without it (a different output or gradient), nor refused for a side effect of it."""
    with pytest.raises(NNForgeError, match=rf"^from_torch: {type(layer).__name__} at 'inner.1': {setting} is not "
                                           r"supported by its nnforge counterpart \[.*test_from_torch_fidelity.py:"
                                           r"\d+\]$"):
        from_torch(_Holds(layer))


class _Settings(torch.nn.Module):
    """Settings torch keeps on a layer or its parts: a weighted cross-entropy, softmaxes without a dim (torch's
    implicit one), an encoder whose layers were changed after it copied them."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.TransformerEncoder(
            torch.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, batch_first=True), 2, enable_nested_tensor=False)
        self.encoder.layers[1].norm1.eps = 0.5
        self.encoder.layers[0].linear2 = torch.nn.Linear(8, 4, bias=False)
        self.loss = torch.nn.CrossEntropyLoss(weight=torch.linspace(0.5, 2.0, 4))
        self.soft, self.log_soft, self.soft_min = torch.nn.Softmax(), torch.nn.LogSoftmax(), torch.nn.Softmin()

    def forward(self, x, labels):  # [N, T, 4], [N]
        h = self.encoder(x)
        return (self.loss(h[:, 0], labels), self.soft(h), self.log_soft(h[0]), self.soft_min(h[:, :, None]),
                TF.softmax(h[0, 0]))


@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
def test_settings_torch_keeps_convert(rng: np.random.Generator) -> None:
    model = _Settings().double()
    ours = from_torch(model)
    assert list(ours.state_dict()) == list(model.state_dict())
    x, labels = rng.standard_normal((3, 5, 4)), rng.integers(0, 4, 3)
    got = ours(nf.tensor(x), nf.tensor(labels))
    want = model(torch.tensor(x, requires_grad=True), torch.tensor(labels))
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), e.detach().numpy(), rtol=1e-10, atol=1e-12)


# ---- eager arrays and activations ------------------------------------------------------------------------------


class _Methods(torch.nn.Module):
    """Methods numpy has under torch's names with other meanings (transpose, repeat, max, std) or lacks."""

    def forward(self, x, pair):
        a, b = pair
        return (x.transpose(0, 1), x * x.size(1), x.softmax(-1), x.repeat(1, 2), x.max(-1)[0], x.std(1),
                x.flatten(0), a @ b)


def test_arrays_given_eagerly_are_tensors(rng: np.random.Generator) -> None:
    """nnforge's own layers take numpy arrays: a converted model does too, inside lists and tuples as well."""
    x, a, b = rng.standard_normal((2, 3)), rng.standard_normal((2, 4)), rng.standard_normal((4, 3))
    got = from_torch(_Methods())(x, (a, b))
    want = _Methods()(torch.tensor(x), (torch.tensor(a), torch.tensor(b)))
    for g, e in zip(got, want, strict=True):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("activation", [
    torch.nn.GELU(), torch.nn.GELU(approximate="tanh"), TF.silu, torch.nn.PReLU(),
    lambda x: TF.gelu(x, approximate="tanh") * torch.sigmoid(x)], ids=["GELU", "GELU-tanh", "silu", "PReLU", "lambda"])
def test_a_transformer_layers_activation_is_any_torch_callable(backend: str, rng: np.random.Generator,
                                                               activation: object) -> None:
    """A module (its parameters too: PReLU's slope at torch's key), a function, a lambda: outputs and every
    parameter's gradient against torch's, through an encoder of two such layers."""
    model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(4, 2, 8, dropout=0.0, activation=activation),
                                       2, enable_nested_tensor=False).double()
    ours = from_torch(model)
    assert list(ours.state_dict()) == list(model.state_dict())
    x, w = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4))

    @nf.compile(backend=backend)
    def step(v, weights):
        ours.zero_grad()
        out = ours(v)
        (out * weights).sum().backward()
        return out, {k: p.grad for k, p in ours.named_parameters()}

    out, grads = step(x, w)
    want = model(torch.tensor(x))
    (want * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(np.asarray(out), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    for k, p in model.named_parameters():
        np.testing.assert_allclose(np.asarray(grads[k]), p.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=k)


def test_t_transposes_a_matrix_and_keeps_a_vector(backend: str, rng: np.random.Generator) -> None:
    """``w.t()``, as the TorchScript tutorial's cells write their products, converts (a vector stays as it is)."""

    class Cell(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64))
            self.b = torch.nn.Parameter(torch.randn(5, dtype=torch.float64))

        def forward(self, x):
            return torch.tanh(x @ self.w.t() + self.b.t())

    torch.manual_seed(int(rng.integers(1 << 31)))
    model = Cell()
    x = rng.standard_normal((4, 3))
    got = nf.compile(from_torch(model), backend=backend)(x)
    torch.testing.assert_close(torch.as_tensor(np.asarray(got)), model(torch.tensor(x)).detach(), rtol=1e-12,
                               atol=1e-12)
