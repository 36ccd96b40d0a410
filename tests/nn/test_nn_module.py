"""Module mechanics: registration, torch-identical state_dict keys, loading, error messages, modes, copies."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn

TWINS = [
    (lambda m: m.Linear(3, 4), "linear"),
    (lambda m: m.Conv1d(2, 4, 3, groups=2, bias=False), "conv"),
    (lambda m: m.LSTM(3, 4, num_layers=2, bidirectional=True), "lstm"),
    (lambda m: m.GRU(3, 4, num_layers=3, bias=False), "gru"),
    (lambda m: m.LSTMCell(3, 4), "lstmcell"),
    (lambda m: m.GRUCell(3, 4), "grucell"),
    (lambda m: m.LayerNorm(4), "layernorm"),
    (lambda m: m.BatchNorm1d(4), "batchnorm"),
    (lambda m: m.Embedding(5, 3), "embedding"),
    (lambda m: m.TransformerEncoderLayer(8, 2, 16), "transformer"),
    (lambda m: m.Sequential(m.Conv1d(1, 4, 5), m.SiLU(), m.Dropout(0.1), m.LayerNorm(4)), "sequential"),
]


@pytest.mark.parametrize("make", [t[0] for t in TWINS], ids=[t[1] for t in TWINS])
def test_state_dict_keys_shapes_and_order_match_torch(make) -> None:
    t_mod, n_mod = make(torch.nn), make(nn)
    t_sd, n_sd = t_mod.state_dict(), n_mod.state_dict()
    assert list(n_sd) == list(t_sd)
    for k in t_sd:
        assert n_sd[k].shape == tuple(t_sd[k].shape), k
        assert n_sd[k].dtype == t_sd[k].numpy().dtype, k
    assert [k for k, _ in n_mod.named_parameters()] == [k for k, _ in t_mod.named_parameters()]


@pytest.mark.parametrize("make", [t[0] for t in TWINS], ids=[t[1] for t in TWINS])
def test_state_dict_round_trip(make) -> None:
    nf.manual_seed(1)
    a, b = make(nn), make(nn)
    b.load_state_dict(a.state_dict())
    for (k, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(va, vb, err_msg=k)
    t_mod = make(torch.nn)
    b.load_state_dict(t_mod.state_dict())  # torch tensors load directly
    for k, v in t_mod.state_dict().items():
        np.testing.assert_array_equal(b.state_dict()[k], v.numpy(), err_msg=k)


def test_state_dict_is_a_copy() -> None:
    m = nn.Linear(2, 2)
    sd = m.state_dict()
    sd["weight"][:] = 5.0
    assert not np.any(m.weight.numpy() == 5.0)


def test_load_errors_name_the_key_and_shapes() -> None:
    m = nn.LSTM(3, 4)
    sd = m.state_dict()
    bad = dict(sd, weight_ih_l0=np.zeros((16, 5), np.float32))
    with pytest.raises(KeyError, match=r"'weight_ih_l0'.*\[16, 5\].*\[16, 3\]"):
        m.load_state_dict(bad)
    missing = {k: v for k, v in sd.items() if k != "bias_hh_l0"}
    with pytest.raises(KeyError, match="missing keys: 'bias_hh_l0'"):
        m.load_state_dict(missing)
    with pytest.raises(KeyError, match="unexpected keys: 'weight_ih_l1'"):
        m.load_state_dict(dict(sd, weight_ih_l1=np.zeros((16, 4), np.float32)))
    before = m.weight_ih_l0.numpy().copy()
    with pytest.raises(KeyError):  # a failing load changes nothing
        m.load_state_dict(dict(missing, weight_ih_l0=np.ones((16, 3), np.float32)))
    np.testing.assert_array_equal(m.weight_ih_l0.numpy(), before)
    missing_keys, unexpected = m.load_state_dict(dict(missing, extra=np.ones(1)), strict=False)
    assert missing_keys == ["bias_hh_l0"] and unexpected == ["extra"]


def test_load_casts_dtype() -> None:
    m = nn.Linear(2, 3)
    m.load_state_dict({"weight": np.ones((3, 2), np.float64), "bias": np.zeros(3, np.float64)})
    assert m.weight.dtype == nf.float32 and m.weight.requires_grad


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3)
        self.blocks = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)])
        self.scale = nn.Parameter(np.ones(1, np.float32))
        self.register_buffer("steps", np.zeros((), np.int64))
        self.note = "plain attribute"

    def forward(self, x):
        h = self.conv(x).mT
        for b in self.blocks:
            h = b(h).relu()
        return h * self.scale


def test_registration_and_traversal() -> None:
    net = _Net()
    names = [k for k, _ in net.named_parameters()]
    assert names == ["scale", "conv.weight", "conv.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
                     "blocks.1.bias"]
    assert list(net.state_dict()) == ["scale", "steps", "conv.weight", "conv.bias", "blocks.0.weight",
                                      "blocks.0.bias", "blocks.1.weight", "blocks.1.bias"]
    assert all(p.requires_grad for p in net.parameters())
    assert [k for k, _ in net.named_buffers()] == ["steps"]
    assert len(list(net.modules())) == 5 and net.note == "plain attribute"
    with pytest.raises(TypeError, match="scale"):
        net.scale = np.ones(1)
    with pytest.raises(AttributeError, match="missing"):
        _ = net.missing
    shared = nn.Sequential(net.blocks[0], net.blocks[0])
    assert len(list(shared.parameters())) == 2  # a shared module's parameters are listed once


def test_train_eval_zero_grad_and_backward_fills_grads() -> None:
    net = _Net()
    assert net.training and all(m.training for m in net.modules())
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    x = nf.tensor(np.random.default_rng(0).standard_normal((2, 1, 6)).astype(np.float32))
    net(x).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_a_compiled_function_follows_the_mode_of_the_modules_it_calls(backend: str, rng: np.random.Generator,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Switched with ``eval()`` / ``train()`` between calls, a model's dropout and batch norm compute what the mode
    says in a compiled function as eagerly: each mode keeps its trace, but an eval trace, which bakes the running
    statistics in, is traced again once training calls have moved them, and from then on reads them at each
    call (no third eval trace after more training)."""
    nf.manual_seed(int(rng.integers(1 << 31)))
    model = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.Dropout(0.5))
    f = nf.compile(lambda x: model(x), backend=backend)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    dropped = np.asarray(f(x))
    assert (dropped == 0).any()
    model.eval()
    with caplog.at_level("INFO", logger="nnforge.compile"):
        evaluated = np.asarray(f(x))
    assert "switched between train() and eval()" in caplog.text
    np.testing.assert_allclose(evaluated, model(nf.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)  # running statistics
    assert not (evaluated == 0).any()
    assert f.trace_count == 2
    model.train()
    assert (np.asarray(f(x)) == 0).any()
    assert f.trace_count == 2  # the training trace again: it reads the running statistics at call time
    model.eval()
    with caplog.at_level("INFO", logger="nnforge.compile"):
        again = np.asarray(f(x))
    assert "a tensor it baked in" in caplog.text and f.trace_count == 3
    np.testing.assert_allclose(again, model(nf.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert not np.allclose(again, evaluated)  # the statistics moved
    np.testing.assert_array_equal(np.asarray(f(x)), again)
    assert f.trace_count == 3
    model.train()  # more training: the statistics move again, and the eval trace now reads them at each call
    f(x)
    model.eval()
    np.testing.assert_allclose(np.asarray(f(x)), model(nf.tensor(x)).numpy(), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 3


class _Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        return self.head(self.body(x).tanh())


@pytest.mark.parametrize("how", ["submodule", "parameter", "buffer", "cast"])
def test_a_compiled_function_sees_what_a_module_holds_now(how: str, backend: str,
                                                         rng: np.random.Generator) -> None:
    """A sub-module, parameter or buffer assigned anew after a compiled function called the module (a new head
    for fine-tuning), or the module cast to another dtype, is what the next call computes with: the old tensors,
    even while something else keeps them alive, are no longer read."""
    nf.manual_seed(int(rng.integers(1 << 31)))
    model = _Head()
    if how == "buffer":
        model.head.register_buffer("shift", nf.tensor(rng.standard_normal(3).astype(np.float32)))
        model.head.forward = lambda x, m=model.head: nn.Linear.forward(m, x) + m.shift
    f = nf.compile(lambda x: model(x), backend=backend)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    before = np.asarray(f(x))
    old = model.head  # still alive: its weights must not be read any more
    if how == "submodule":
        model.head = nn.Linear(6, 3)
    elif how == "parameter":
        model.head.weight = nn.Parameter(rng.standard_normal((3, 6)).astype(np.float32))
    elif how == "buffer":
        model.head.shift = nf.tensor(rng.standard_normal(3).astype(np.float32))
    else:
        model.double()  # a float32 input now computes in float64 (``@`` promotes), as eagerly
    after = np.asarray(f(x))
    expected = model(nf.tensor(x)).numpy()
    assert after.dtype == expected.dtype
    np.testing.assert_allclose(after, expected, rtol=1e-5, atol=1e-6)
    assert not np.allclose(after, before) or how == "cast"
    assert f.trace_count == 2 and old is not None
    np.testing.assert_array_equal(np.asarray(f(x)), after)
    assert f.trace_count == 2


def test_a_captured_tensor_that_is_gone_is_replaced_by_what_the_function_reads_now(
        backend: str, rng: np.random.Generator) -> None:
    """A global tensor bound to a new one (the old one freed): the function traces again and reads the new one,
    where it used to fail saying a captured tensor no longer exists."""
    scope = {"w": nf.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)}
    f = nf.compile(lambda x: x @ scope["w"], backend=backend)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    f(x)
    scope["w"] = nf.tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    np.testing.assert_allclose(np.asarray(f(x)), x @ scope["w"].numpy(), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 2


def test_to_double_and_requires_grad() -> None:
    m = nn.GRU(2, 3).double()
    assert all(p.dtype == nf.float64 for p in m.parameters())
    out, _ = m(nf.tensor(np.ones((2, 1, 2)), dtype=nf.float64))
    assert out.dtype == nf.float64
    m.requires_grad_(False)
    out, _ = m(nf.tensor(np.ones((2, 1, 2))))
    out.sum().backward()
    assert all(p.grad is None for p in m.parameters())
    m.requires_grad_(True)
    m(nf.tensor(np.ones((2, 1, 2))))[0].sum().backward()
    assert all(p.grad is not None for p in m.parameters())


def test_repr() -> None:
    text = repr(nn.Sequential(nn.Linear(2, 3), nn.ReLU()))
    assert "(0): Linear(in_features=2, out_features=3, bias=True)" in text and "(1): ReLU()" in text


INPUTS = {"linear": (5, 3), "conv": (2, 2, 7), "lstm": (4, 2, 3), "gru": (4, 2, 3), "lstmcell": (2, 3),
          "grucell": (2, 3), "layernorm": (3, 4), "batchnorm": (3, 4, 5), "embedding": None, "transformer": (5, 2, 8),
          "sequential": (2, 1, 8)}  # what each of TWINS reads


@pytest.mark.parametrize("case", TWINS, ids=[t[1] for t in TWINS])
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_module_copies_with_its_values_and_gradients(case, how: str, rng: np.random.Generator) -> None:
    """``copy.deepcopy`` and pickle give a module of its own parameters (same class, values, ``requires_grad``,
    ``.grad``; a frozen one stays frozen) and buffers, which compute what the original does and change alone."""
    make, name = case
    module = make(nn)
    names = [n for n, _ in module.named_parameters()]
    for p in module.parameters():
        p.assign(rng.standard_normal(tuple(map(int, p.shape))).astype(np.float32))
        p.grad = nf.tensor(rng.standard_normal(tuple(map(int, p.shape))).astype(np.float32))
    frozen = dict(module.named_parameters())[names[-1]]
    frozen.requires_grad = False
    module.eval()
    twin = copy.deepcopy(module) if how == "deepcopy" else pickle.loads(pickle.dumps(module))
    assert type(twin) is type(module) and not twin.training
    ours, theirs = dict(module.named_parameters()), dict(twin.named_parameters())
    assert list(theirs) == names
    for n in names:
        a, b = ours[n], theirs[n]
        assert type(b) is type(a) and b is not a and b.requires_grad == a.requires_grad and b.dtype == a.dtype
        np.testing.assert_array_equal(b.numpy(), a.numpy())
        np.testing.assert_array_equal(b.grad.numpy(), a.grad.numpy())
    for (n, a), (m, b) in zip(module.state_dict().items(), twin.state_dict().items()):
        assert n == m
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    shape = INPUTS[name]
    x = nf.tensor(rng.integers(0, 5, (2, 3)) if shape is None else rng.standard_normal(shape).astype(np.float32))
    for got, want in zip(_leaves(twin(x)), _leaves(module(x))):
        np.testing.assert_array_equal(got, want)
    before = ours[names[0]].numpy().copy()
    theirs[names[0]].assign(theirs[names[0]] + 1.0)
    np.testing.assert_array_equal(ours[names[0]].numpy(), before)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_tied_parameters_stay_tied_in_a_copy(how: str) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[1].weight = model[0].weight
    twin = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert twin[1].weight is twin[0].weight and twin[0].weight is not model[0].weight


def _leaves(out) -> list[np.ndarray]:
    if isinstance(out, (tuple, list)):
        return [a for o in out for a in _leaves(o)]
    return [np.asarray(out)]


def test_a_shared_module_or_buffer_is_listed_once_as_torch_lists_it(rng: np.random.Generator) -> None:
    """A layer used twice (weight tying by module) and a buffer registered in two modules are one object: torch
    lists each once, by its first name, so ``modules()``, ``buffers()`` and ``train()`` see it once."""
    def build(m):
        root = m.Module()
        root.a = m.Linear(3, 3)
        root.b = root.a
        root.n1, root.n2 = m.BatchNorm1d(3), m.BatchNorm1d(3)
        shared = root.n1.running_mean
        root.n2.register_buffer("running_mean", shared)
        return root

    ours, theirs = build(nn), build(torch.nn)
    names = lambda pairs: [name for name, _ in pairs]  # noqa: E731
    assert names(ours.named_modules()) == names(theirs.named_modules())
    assert names(ours.named_buffers()) == names(theirs.named_buffers())
    assert names(ours.named_parameters()) == names(theirs.named_parameters())
    assert list(ours.state_dict()) == list(theirs.state_dict())  # the state dict keeps every name
