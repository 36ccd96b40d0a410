"""Attention against torch 2.13, element by element: ``F.scaled_dot_product_attention`` with torch's signature
(bool and float masks, ``is_causal`` alone and with a mask, ``scale``, ``enable_gqa``, dropout), rows whose every
score is masked (zeros and finite gradients, as torch's), ``MultiheadAttention`` and the encoder on unbatched input,
the dropped-out weights ``need_weights`` returns in training, and the one-line errors a wrong shape gets.

Values and gradients are compared in float64 (tolerances of a few hundred ulps: the sums run in other orders) on
every backend, the Triton one under its interpreter at tiny sizes."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import nnforge as nf
import nnforge.nn as nn
import nnforge.nn.functional as F

RTOL, ATOL = 1e-10, 1e-12


def _sdpa_against_torch(backend: str, rng: np.random.Generator, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                        **kw) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """nnforge's output and q, k, v gradients (compiled on ``backend``) and torch's, for the same keyword arguments
    (``attn_mask`` as a numpy array), the loss ``sum(out * ct)`` with a random ``ct``."""
    mask = kw.pop("attn_mask", None)
    t_out = TF.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), attn_mask=None if mask is None
                                            else torch.tensor(mask), **kw)
    ct = rng.standard_normal(tuple(t_out.shape))

    @nf.compile(backend=backend)
    def step(q, k, v):
        q, k, v = (nf.tensor(a, requires_grad=True) for a in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else nf.tensor(mask), **kw)
        (out * ct).sum().backward()
        return out, q.grad, k.grad, v.grad

    got = [np.asarray(a) for a in step(q, k, v)]
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    want = TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=None if mask is None else torch.tensor(mask), **kw)
    (want * torch.from_numpy(ct)).sum().backward()
    return got, [want.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()]


def _assert_all_close(got: list[np.ndarray], want: list[np.ndarray], names=("output", "dq", "dk", "dv")) -> None:
    for name, a, b in zip(names, got, want):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=name)


CASES = {
    # a bool mask says which scores take part (True = attend); once it was added as 0/1
    "bool mask": dict(q=(2, 2, 3, 4), k=(2, 2, 5, 4), mask=("bool", (3, 5))),
    "float mask": dict(q=(2, 2, 3, 4), k=(2, 2, 5, 4), mask=("float", (2, 1, 3, 5))),
    "causal, L < S": dict(q=(2, 2, 3, 4), k=(2, 2, 5, 4), is_causal=True),
    "causal, L > S": dict(q=(1, 2, 5, 4), k=(1, 2, 3, 4), is_causal=True),
    # torch 2.13 applies both (its docs' reference code asserts they exclude each other)
    "causal and bool mask": dict(q=(2, 2, 4, 4), k=(2, 2, 4, 4), mask=("bool", (2, 1, 4, 4)), is_causal=True),
    "causal and float mask": dict(q=(1, 2, 4, 4), k=(1, 2, 4, 4), mask=("float", (4, 4)), is_causal=True),
    "scale": dict(q=(2, 2, 3, 4), k=(2, 2, 5, 4), scale=0.3),
    "grouped-query": dict(q=(2, 4, 3, 4), k=(2, 2, 5, 4), enable_gqa=True, mask=("bool", (3, 5))),
    "unbatched, value wider": dict(q=(3, 4), k=(5, 4), v_features=6, mask=("float", (3, 5))),
}


@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_matches_torch(backend: str, rng: np.random.Generator, case: str) -> None:
    """torch's signature and semantics: values and the gradients of q, k and v."""
    c = dict(CASES[case])
    q, k = rng.standard_normal(c.pop("q")), rng.standard_normal(c["k"])
    v = rng.standard_normal((*c.pop("k")[:-1], c.pop("v_features", q.shape[-1])))
    kind, shape = c.pop("mask", (None, None))
    if kind == "bool":
        mask = rng.random(shape) < 0.7
        mask[..., 0] = True  # every row keeps a score: fully masked rows are the next test's
        c["attn_mask"] = mask
    elif kind == "float":
        c["attn_mask"] = rng.standard_normal(shape)
    _assert_all_close(*_sdpa_against_torch(backend, rng, q, k, v, **c))


@pytest.mark.parametrize("kind", ["bool", "float", "causal and padding"])
def test_sdpa_fully_masked_rows_give_zeros_and_finite_gradients(backend: str, rng: np.random.Generator,
                                                                 kind: str) -> None:
    """A row whose every score is masked gives 0 and passes no gradient (torch's safe softmax), not NaN: a
    left-padded batch under a causal and a padding mask has such rows at its padding."""
    q, k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(3))
    kw: dict = {}
    if kind == "causal and padding":  # sequence 0 left-padded by 2: its first two queries see no key
        keep = np.array([[False, False, True, True, True], [True] * 5])
        kw = dict(attn_mask=keep[:, None, None, :], is_causal=True)
    else:
        keep = rng.random((2, 1, 5, 5)) < 0.6
        keep[0, 0, 1] = keep[1, 0, 3] = False
        keep[..., 2, 4] = True  # and some rows live
        kw = dict(attn_mask=keep if kind == "bool" else np.where(keep, rng.standard_normal(keep.shape), -np.inf))
    got, want = _sdpa_against_torch(backend, rng, q, k, v, **kw)
    assert all(np.isfinite(a).all() for a in got)
    dead = (got[0] == 0).all(-1)
    assert dead.any() and not dead.all()
    _assert_all_close(got, want)


def test_sdpa_dropout_drops_the_probabilities(backend: str, rng: np.random.Generator) -> None:
    """``dropout_p`` > 0 drops whatever the mode, as torch's function. The value's first columns are the identity,
    so the output's first columns are the dropped probabilities themselves: each is 0 or torch's probability /
    (1 - p); the rest of the output and every gradient are torch's for that drop mask."""
    p, s = 0.4, 6
    q, k = rng.standard_normal((2, 2, 5, 3)), rng.standard_normal((2, 2, s, 3))
    v = np.concatenate([np.broadcast_to(np.eye(s), (2, 2, s, s)), rng.standard_normal((2, 2, s, 3))], -1)
    ct = rng.standard_normal((2, 2, 5, s + 3))

    @nf.compile(backend=backend)
    def step(q, k, v):
        q, k, v = (nf.tensor(a, requires_grad=True) for a in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        (out * ct).sum().backward()
        return out, q.grad, k.grad, v.grad

    got = [np.asarray(a) for a in step(q, k, v)]
    kept = got[0][..., :s] != 0
    assert 0.3 < 1 - kept.mean() < 0.5  # p = 0.4 of 120 probabilities dropped
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    probs = torch.softmax(tq @ tk.mT / np.sqrt(3), -1)
    want = torch.where(torch.from_numpy(kept), probs / (1 - p), 0.0) @ tv
    (want * torch.from_numpy(ct)).sum().backward()
    _assert_all_close(got, [want.detach().numpy(), tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()])


def _twins(embed: int, heads: int, rng: np.random.Generator, **kw) -> tuple[torch.nn.Module, nn.Module]:
    """A torch MultiheadAttention and nnforge's, float64, every parameter random: torch starts its biases at 0,
    and a fully masked row's output is out_proj's bias."""
    theirs = torch.nn.MultiheadAttention(embed, heads, **kw).double()
    with torch.no_grad():
        for t in theirs.parameters():
            t.copy_(torch.from_numpy(rng.standard_normal(tuple(t.shape)) * 0.5))
    ours = nn.MultiheadAttention(embed, heads, **kw).double()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def _module_against_torch(backend: str, rng: np.random.Generator, theirs: torch.nn.Module, ours: nn.Module,
                          call, inputs: list[np.ndarray]) -> tuple[list, list]:
    """Outputs and every parameter's gradient of ``call(module, *inputs)`` (a tuple of outputs, None dropped), the
    nnforge module compiled on ``backend``; a NaN output gets no cotangent (a fully masked row with weights)."""
    theirs.zero_grad()
    t_out = [o for o in call(theirs, *(torch.tensor(a) for a in inputs)) if o is not None]
    cts = [np.where(np.isnan(o.detach().numpy()), 0.0, rng.standard_normal(tuple(o.shape))) for o in t_out]
    finite = all(np.isfinite(o.detach().numpy()).all() for o in t_out)

    @nf.compile(backend=backend)
    def step(*xs):
        ours.zero_grad()
        outs = [o for o in call(ours, *xs) if o is not None]
        if finite:
            sum((o * ct).sum() for o, ct in zip(outs, cts)).backward()
            return outs, [p.grad for _, p in ours.named_parameters()]
        return outs, []

    n_outs, n_grads = step(*inputs)
    got = [np.asarray(a) for a in [*n_outs, *n_grads]]
    want = [o.detach().numpy() for o in t_out]
    if finite:
        sum((o * torch.from_numpy(ct)).sum() for o, ct in zip(t_out, cts)).backward()
        want += [p.grad.numpy() for _, p in theirs.named_parameters()]
    return got, want


@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("mask", ["none", "2-D", "3-D"])
def test_multihead_attention_unbatched(backend: str, rng: np.random.Generator, need_weights: bool, average: bool,
                                       mask: str) -> None:
    """One sequence [L, E] (key and value [S, E]), its masks' unbatched shapes too: key padding [S], attention
    [L, S] or [heads, L, S]; outputs [L, E] and weights [L, S] or [heads, L, S], as torch's."""
    theirs, ours = _twins(6, 2, rng, batch_first=True)
    q, kv = rng.standard_normal((3, 6)), rng.standard_normal((4, 6))
    pad = np.array([False, True, False, False])
    am = {"none": None, "2-D": rng.standard_normal((3, 4)), "3-D": rng.random((2, 3, 4)) < 0.3}[mask]
    if mask == "3-D":
        am[..., 0] = False  # every row keeps a key
    if mask == "2-D":  # torch wants both masks of one kind
        pad = np.where(pad, -np.inf, 0.0)

    def call(m, q, kv, pad, *am):
        return m(q, kv, kv, key_padding_mask=pad, attn_mask=am[0] if am else None, need_weights=need_weights,
                 average_attn_weights=average)

    got, want = _module_against_torch(backend, rng, theirs, ours, call, [q, kv, pad, *([] if am is None else [am])])
    assert got[0].shape == (3, 6) and (not need_weights or got[1].shape == ((3, 4) if average else (2, 3, 4)))
    _assert_all_close(got, want, names=[f"result {i}" for i in range(len(want))])


@pytest.mark.parametrize("stack", [False, True])
def test_encoder_unbatched(backend: str, rng: np.random.Generator, stack: bool) -> None:
    """TransformerEncoderLayer and TransformerEncoder on one sequence [S, E] with an [S, S] mask and an [S]
    key-padding mask."""
    kw = dict(d_model=6, nhead=2, dim_feedforward=8, dropout=0.0)
    theirs = torch.nn.TransformerEncoderLayer(**kw).double()
    with torch.no_grad():
        for t in theirs.parameters():
            t.copy_(torch.from_numpy(rng.standard_normal(tuple(t.shape)) * 0.5))
    ours = nn.TransformerEncoderLayer(**kw).double()
    if stack:
        theirs = torch.nn.TransformerEncoder(theirs, 2, enable_nested_tensor=False)
        ours = nn.TransformerEncoder(ours, 2)
    ours.load_state_dict(theirs.state_dict())
    x = rng.standard_normal((5, 6))
    causal = np.triu(np.ones((5, 5), bool), 1)
    pad = np.array([False] * 4 + [True])

    def call(m, x, causal, pad):
        if isinstance(m, (nn.TransformerEncoder, torch.nn.TransformerEncoder)):
            return (m(x, mask=causal, src_key_padding_mask=pad),)
        return (m(x, src_mask=causal, src_key_padding_mask=pad),)

    got, want = _module_against_torch(backend, rng, theirs, ours, call, [x, causal, pad])
    assert got[0].shape == (5, 6)
    _assert_all_close(got, want, names=[f"result {i}" for i in range(len(want))])


def test_multihead_attention_fully_masked_rows_as_torch(backend: str, rng: np.random.Generator) -> None:
    """torch's MultiheadAttention (2.13) without weights goes through scaled_dot_product_attention: a query that
    sees no key gets out_proj's bias, and the gradients stay finite; with weights, a plain softmax: NaN there."""
    theirs, ours = _twins(6, 2, rng)
    x = rng.standard_normal((4, 2, 6))
    pad = np.array([[True, True, True, True], [False, True, False, False]])  # sequence 0 sees no key at all
    am = np.zeros((4, 4), bool)
    am[2] = True  # and query 2 of sequence 1 none either
    bias = theirs.out_proj.bias.detach().numpy()
    for need_weights in (False, True):
        def call(m, x, pad, am, need_weights=need_weights):
            return m(x, x, x, key_padding_mask=pad, attn_mask=am, need_weights=need_weights)

        got, want = _module_against_torch(backend, rng, theirs, ours, call, [x, pad, am])
        dead = np.isnan(want[0]).all(-1) if need_weights else np.isclose(want[0], bias, rtol=0, atol=1e-14).all(-1)
        assert dead[:, 0].all() and dead[2, 1] and not dead[:, 1].all()
        _assert_all_close(got, want, names=[f"need_weights={need_weights}: result {i}" for i in range(len(want))])


def test_encoder_layer_left_padded_causal_batch_trains(backend: str, rng: np.random.Generator) -> None:
    """A left-padded batch under a causal and a padding mask: the padding's queries see no key. torch's layer
    (need_weights=False inside) gives finite values and gradients there; so does nnforge's, equal to torch's."""
    kw = dict(d_model=6, nhead=2, dim_feedforward=8, dropout=0.0, batch_first=True)
    theirs = torch.nn.TransformerEncoderLayer(**kw).double()
    with torch.no_grad():
        for t in theirs.parameters():
            t.copy_(torch.from_numpy(rng.standard_normal(tuple(t.shape)) * 0.5))
    ours = nn.TransformerEncoderLayer(**kw).double()
    ours.load_state_dict(theirs.state_dict())
    x = rng.standard_normal((2, 4, 6))
    pad = np.array([[True, True, False, False], [False] * 4])
    causal = np.triu(np.ones((4, 4), bool), 1)
    got, want = _module_against_torch(backend, rng, theirs, ours,
                                      lambda m, x, c, p: (m(x, src_mask=c, src_key_padding_mask=p),), [x, causal, pad])
    assert all(np.isfinite(a).all() for a in got)
    _assert_all_close(got, want, names=[f"result {i}" for i in range(len(want))])


def test_multihead_attention_returns_the_dropped_out_weights(backend: str, rng: np.random.Generator) -> None:
    """In training with dropout, need_weights returns the weights the output used, dropped out, as torch's: each
    is 0 or torch's weight / (1 - p), and the output is out_proj of those weights times the values."""
    p = 0.5
    theirs, ours = _twins(6, 2, rng, dropout=p)
    x = rng.standard_normal((5, 2, 6))

    @nf.compile(backend=backend)
    def step(x):
        return ours.train()(x, x, x, average_attn_weights=False)

    out, weights = (np.asarray(a) for a in step(x))
    tx = torch.from_numpy(x)
    with torch.no_grad():
        _, w0 = theirs.eval()(tx, tx, tx, average_attn_weights=False)  # [N, heads, L, S], not dropped
        kept = weights != 0
        assert 0.35 < 1 - kept.mean() < 0.65  # p = 0.5 of 100 weights dropped
        np.testing.assert_allclose(weights, np.where(kept, w0.numpy() / (1 - p), 0.0), rtol=RTOL, atol=ATOL)
        vh = TF.linear(tx, *(t.chunk(3)[2] for t in (theirs.in_proj_weight, theirs.in_proj_bias)))
        vh = vh.reshape(5, 2, 2, 3).permute(1, 2, 0, 3)  # [N, heads, S, d]
        ctx = (torch.from_numpy(weights) @ vh).permute(2, 0, 1, 3).reshape(5, 2, 6)
        np.testing.assert_allclose(out, theirs.out_proj(ctx).numpy(), rtol=RTOL, atol=ATOL)


def _raises(cls, message: str):
    """One line: the message, then this file's line (the user's), as nnforge's errors give it."""
    return pytest.raises(cls, match=f"^{re.escape(message)} \\(at .*test_attention.py:\\d+\\)$")


def test_sdpa_errors_name_the_shapes() -> None:
    """Each shape torch refuses is refused in one line naming the shapes, where a matmul inside failed before."""
    r = np.random.default_rng(0)
    q, k4, v4 = r.standard_normal((2, 4, 3, 5)), r.standard_normal((2, 4, 6, 5)), r.standard_normal((2, 4, 6, 5))
    k2, v2 = r.standard_normal((2, 2, 6, 5)), r.standard_normal((2, 2, 6, 5))
    k3, v3 = r.standard_normal((2, 3, 6, 5)), r.standard_normal((2, 3, 6, 5))
    bad = [
        ((q, r.standard_normal((2, 4, 6, 4)), v4), {},
         "scaled_dot_product_attention: query and key differ in their last dimension E, 5 vs 4 (query [2, 4, 3, 5], "
         "key [2, 4, 6, 4], value [2, 4, 6, 5])"),
        ((q, k4, r.standard_normal((2, 4, 7, 5))), {},
         "scaled_dot_product_attention: key and value differ in source length S (dimension -2), 6 vs 7 (query "
         "[2, 4, 3, 5], key [2, 4, 6, 5], value [2, 4, 7, 5])"),
        ((q, k2, v2), {},
         "scaled_dot_product_attention: the leading dimensions of query [2, 4], key [2, 2] and value [2, 2] do not "
         "broadcast; key and value with fewer heads than the query need enable_gqa=True"),
        ((q, k3, v3), dict(enable_gqa=True),
         "scaled_dot_product_attention: enable_gqa: the key's 3 and the value's 3 heads (dimension -3) must divide "
         "the query's 4 (query [2, 4, 3, 5], key [2, 3, 6, 5], value [2, 3, 6, 5])"),
        ((q, k4, v4), dict(attn_mask=r.random((4, 6)) < 0.5),
         "scaled_dot_product_attention: attn_mask of shape [4, 6] does not broadcast to the attention scores' "
         "[2, 4, 3, 6] ([..., target length L, source length S])"),
    ]
    for i, (args, kw, message) in enumerate(bad):
        if i != 1:  # torch refuses them too; key and value of different lengths its fused CPU kernel takes unchecked
            with pytest.raises(RuntimeError):  # (and answers garbage), where its reference form fails in a matmul
                TF.scaled_dot_product_attention(*(torch.tensor(a) for a in args), **{
                    n: torch.tensor(a) if isinstance(a, np.ndarray) else a for n, a in kw.items()})
        with _raises(nf.ShapeError, message):
            F.scaled_dot_product_attention(*(nf.tensor(a) for a in args), **kw)
    with _raises(nf.DTypeError, "scaled_dot_product_attention: attn_mask must be bool or the query's dtype nf.float64, "
                                "got nf.int64"):
        F.scaled_dot_product_attention(nf.tensor(q), nf.tensor(k4), nf.tensor(v4), attn_mask=nf.tensor(np.ones(6, int)))


def test_attention_module_errors_name_the_argument_and_shapes() -> None:
    """Wrong masks and mismatched key and value fail up front, in one line naming the module, the argument as the
    caller wrote it and the shape expected, where an internal reshape or add failed before; torch refuses each."""
    r = np.random.default_rng(1)
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    t_layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    x = r.standard_normal((2, 5, 8)).astype(np.float32)
    mha, t_mha = nn.MultiheadAttention(8, 2), torch.nn.MultiheadAttention(8, 2)
    q, k, v = (r.standard_normal((n, 2, 8)).astype(np.float32) for n in (5, 6, 7))
    encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 16), 2)
    t_encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16), 2,
                                            enable_nested_tensor=False)
    cases = [
        (layer, t_layer, (x,), dict(src_key_padding_mask=np.zeros((2, 4), bool)),
         "TransformerEncoderLayer: src_key_padding_mask of shape [2, 4], expected [2, 5] (batch size, source length)"),
        (layer, t_layer, (x,), dict(src_mask=r.standard_normal((4, 4)).astype(np.float32)),
         "TransformerEncoderLayer: src_mask of shape [4, 4], expected [5, 5] (target length, source length)"),
        (mha, t_mha, (q, k, v), {},
         "MultiheadAttention: key of shape [6, 2, 8] and value of shape [7, 2, 8] differ; both are [S, N, E]"),
        (mha, t_mha, (q, k, k), dict(attn_mask=np.zeros((5, 5), bool)),
         "MultiheadAttention: attn_mask of shape [5, 5], expected [5, 6] (target length, source length)"),
        (mha, t_mha, (q, k, k), dict(attn_mask=np.zeros((2, 5, 6), bool)),
         "MultiheadAttention: attn_mask of shape [2, 5, 6], expected [4, 5, 6] (batch size * num_heads, target "
         "length, source length)"),
        (mha, t_mha, (q[:, 0], k[:, 0], k[:, 0]), dict(key_padding_mask=np.zeros((1, 6), bool)),
         "MultiheadAttention: key_padding_mask of shape [1, 6], expected [6] (source length; unbatched input)"),
        (encoder, t_encoder, (q,), dict(mask=np.zeros((5, 6), bool)),
         "TransformerEncoder: mask of shape [5, 6], expected [5, 5] (target length, source length)"),
    ]
    for ours, theirs, args, kw, message in cases:
        with pytest.raises((RuntimeError, AssertionError)):
            theirs(*(torch.from_numpy(a) for a in args), **{n: torch.from_numpy(a) for n, a in kw.items()})
        with _raises(nf.ShapeError, message):
            ours(*(nf.tensor(a) for a in args), **{n: nf.tensor(a) for n, a in kw.items()})
