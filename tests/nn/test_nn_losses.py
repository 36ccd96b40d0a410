"""Losses against torch.nn.functional: values and gradients, CTC included."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from nn_testutil import ATOL, RTOL, randn

import nnforge as nf
import nnforge.nn as nn
import nnforge.nn.functional as F


def _both(fn_nf, fn_t, x: np.ndarray, *args_np, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Compare value and d(sum of value)/dx of a loss of x."""
    xt, xn = torch.tensor(x, requires_grad=True), nf.tensor(x, requires_grad=True)
    lt, ln = fn_t(xt, *args_np), fn_nf(xn, *args_np)
    np.testing.assert_allclose(ln.numpy(), lt.detach().numpy(), rtol=rtol, atol=atol)
    lt.sum().backward()
    ln.sum().backward()
    np.testing.assert_allclose(xn.grad.numpy(), xt.grad.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse(reduction: str) -> None:
    rng = np.random.default_rng(30)
    x, y = randn(rng, 3, 4), randn(rng, 3, 4)
    _both(lambda a: F.mse_loss(a, y, reduction), lambda a: TF.mse_loss(a, torch.tensor(y), reduction=reduction), x)
    _both(lambda a: nn.MSELoss(reduction)(a, y), lambda a: torch.nn.MSELoss(reduction=reduction)(a, torch.tensor(y)), x)


CE_CASES = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(ignore_index=2),
    dict(label_smoothing=0.2),
    dict(label_smoothing=0.1, ignore_index=1, reduction="none"),
    dict(weight=True),
    dict(weight=True, ignore_index=0, label_smoothing=0.3),
    dict(weight=True, reduction="sum", label_smoothing=0.3),
]


@pytest.mark.parametrize("kw", CE_CASES, ids=[str(k) for k in CE_CASES])
@pytest.mark.parametrize("spatial", [False, True])
def test_cross_entropy_class_indices(kw: dict, spatial: bool) -> None:
    rng = np.random.default_rng(31)
    c = 5
    x = randn(rng, 6, c, 3, scale=2.0) if spatial else randn(rng, 6, c, scale=2.0)
    y = rng.integers(0, c, (6, 3) if spatial else (6,))
    kw = dict(kw)
    if kw.pop("weight", False):
        w = rng.random(c).astype(np.float32) + 0.5
        kw["weight"] = w
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    _both(lambda a: F.cross_entropy(a, y, **kw), lambda a: TF.cross_entropy(a, torch.tensor(y), **tkw), x)
    _both(lambda a: nn.CrossEntropyLoss(**kw)(a, y), lambda a: torch.nn.CrossEntropyLoss(**tkw)(a, torch.tensor(y)),
          x)


@pytest.mark.parametrize("kw", [dict(), dict(label_smoothing=0.2), dict(reduction="none", weight=True)])
def test_cross_entropy_probabilities(kw: dict) -> None:
    rng = np.random.default_rng(32)
    x = randn(rng, 4, 6)
    p = rng.random((4, 6)).astype(np.float32)
    p /= p.sum(1, keepdims=True)
    kw = dict(kw)
    if kw.pop("weight", False):
        kw["weight"] = rng.random(6).astype(np.float32) + 0.5
    tkw = {k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kw.items()}
    _both(lambda a: F.cross_entropy(a, p, **kw), lambda a: TF.cross_entropy(a, torch.tensor(p), **tkw), x)


def test_cross_entropy_unbatched() -> None:
    rng = np.random.default_rng(33)
    x = randn(rng, 5)
    _both(lambda a: F.cross_entropy(a, np.array(3)), lambda a: TF.cross_entropy(a, torch.tensor(3)), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss(reduction: str) -> None:
    rng = np.random.default_rng(34)
    x = randn(rng, 5, 4)
    y = rng.integers(0, 4, 5)
    w = rng.random(4).astype(np.float32) + 0.5
    _both(lambda a: F.nll_loss(a.log_softmax(1), y, weight=w, reduction=reduction),
          lambda a: TF.nll_loss(a.log_softmax(1), torch.tensor(y), weight=torch.tensor(w), reduction=reduction), x)


@pytest.mark.parametrize(("op", "shape", "bad", "where"), [
    ("cross_entropy", (5, 4), 9, (2,)), ("nll_loss", (5, 4), -3, (2,)), ("cross_entropy", (5, 4, 3), 4, (2, 1)),
    ("cross_entropy", (4,), 4, ()),
], ids=["past-C", "negative", "spatial", "unbatched"])
def test_class_indices_known_when_called_are_classes_or_ignored(op: str, shape: tuple, bad: int,
                                                                where: tuple) -> None:
    """torch refuses these; unchecked, the sample's one-hot row was all zeros and it silently left the loss."""
    rng = np.random.default_rng(43)
    x = randn(rng, *shape)
    y = rng.integers(0, 4, (shape[0], *shape[2:]) if len(shape) > 1 else ())
    y[where] = bad
    fn = getattr(F, op)

    def message(ignored: int) -> str:
        shown = list(where) if where else [0]  # an unbatched target is the batch of one
        return re.escape(f"{op}: target{shown} is {bad}, not one of the 4 classes of the input (nor ignore_index "
                         f"{ignored})")

    for target in (np.array, torch.tensor, nf.tensor):
        with pytest.raises(nf.ShapeError, match=message(-100) + r" \(at .*test_nn_losses.py:\d+\)"):
            fn(nf.tensor(x), target(y))
    ignored = y.copy()
    ignored[where] = -100  # ignore_index is no class, and is taken
    fn(nf.tensor(x), ignored)
    with pytest.raises(nf.ShapeError, match=message(7)):
        nf.compile(lambda v: fn(v, y, ignore_index=7), backend="reference")(x)


def test_mse_loss_of_shapes_that_broadcast_warns_as_torch_does() -> None:
    rng = np.random.default_rng(45)
    x, y = randn(rng, 3, 1), randn(rng, 3)
    with pytest.warns(UserWarning, match=r"mse_loss: a target of \[3\] against an input of \[3, 1\] broadcasts") as w:
        got = F.mse_loss(nf.tensor(x), y)
    assert w[0].filename == __file__  # the user's line
    with pytest.warns(UserWarning, match="different to the input size"):
        expected = TF.mse_loss(torch.tensor(x), torch.tensor(y))
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=RTOL, atol=ATOL)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        F.mse_loss(nf.tensor(x), y.reshape(3, 1))
        F.mse_loss(nf.tensor(x), 0.5)


def test_loss_argument_errors() -> None:
    with pytest.raises(ValueError, match="reduction"):
        F.mse_loss(nf.zeros(2), nf.ones(2), "avg")
    with pytest.raises(nf.ShapeError, match="target"):
        F.cross_entropy(nf.zeros(3, 4), np.zeros(4, np.int64))


# ---- CTC ------------------------------------------------------------------------------------------------------

def _ctc_case(rng: np.random.Generator, t: int, n: int, c: int, s: int):
    logits = randn(rng, t, n, c, scale=2.0)
    targets = rng.integers(1, c, (n, s))
    if s > 1:
        targets[0, 1] = targets[0, 0]  # a repeated label needs a blank between the two
    input_lengths = rng.integers(max(2 * s, 1), t + 1, n)
    input_lengths[0] = t
    target_lengths = rng.integers(0, s + 1, n)
    target_lengths[0] = s
    return logits, targets, input_lengths, target_lengths


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(10, 4, 5, 3), (16, 3, 7, 6), (3, 2, 4, 1)])
def test_ctc_matches_torch(reduction: str, shape: tuple) -> None:
    """Value and gradient w.r.t. the logits (through log_softmax: see ctc_loss's docstring for why)."""
    rng = np.random.default_rng(35)
    logits, tg, il, tl = _ctc_case(rng, *shape)
    _both(lambda a: F.ctc_loss(a.log_softmax(-1), tg, il, tl, reduction=reduction),
          lambda a: TF.ctc_loss(a.log_softmax(-1), torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                                reduction=reduction), logits)


def test_ctc_lengths_as_lists_tensors_and_concatenated_targets() -> None:
    rng = np.random.default_rng(36)
    logits, tg, il, tl = _ctc_case(rng, 9, 3, 5, 3)
    lp = nf.tensor(logits).log_softmax(-1)
    ref = TF.ctc_loss(torch.tensor(logits).log_softmax(-1), torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                      reduction="none").numpy()
    concat = np.concatenate([tg[i, :tl[i]] for i in range(3)])
    for args in [(tg, list(il), list(tl)), (nf.tensor(tg), nf.tensor(il), nf.tensor(tl)),
                 (torch.tensor(tg), torch.tensor(il), torch.tensor(tl)), (concat, il, tl)]:
        np.testing.assert_allclose(F.ctc_loss(lp, *args, reduction="none").numpy(), ref, rtol=RTOL, atol=ATOL)


def test_ctc_blank_other_than_zero_and_module() -> None:
    rng = np.random.default_rng(37)
    logits, tg, il, tl = _ctc_case(rng, 8, 2, 5, 2)
    tg = tg - 1  # labels 0..3, blank 4
    _both(lambda a: nn.CTCLoss(blank=4)(a.log_softmax(-1), tg, il, tl),
          lambda a: torch.nn.CTCLoss(blank=4)(a.log_softmax(-1), torch.tensor(tg), torch.tensor(il),
                                               torch.tensor(tl)), logits)


def test_ctc_impossible_alignment_is_inf_or_zero() -> None:
    rng = np.random.default_rng(38)
    logits = randn(rng, 3, 2, 4)
    tg = np.array([[1, 1, 2], [1, 2, 3]])   # sample 0 needs 4 steps (1, blank, 1, 2): impossible in 3
    il, tl = np.array([3, 3]), np.array([3, 3])
    lp = nf.tensor(logits).log_softmax(-1)
    ref = TF.ctc_loss(torch.tensor(logits).log_softmax(-1), torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                      reduction="none").numpy()
    out = F.ctc_loss(lp, tg, il, tl, reduction="none").numpy()
    assert np.isinf(out[0]) and np.isinf(ref[0])
    np.testing.assert_allclose(out[1], ref[1], rtol=RTOL)
    _both(lambda a: F.ctc_loss(a.log_softmax(-1), tg, il, tl, zero_infinity=True, reduction="sum"),
          lambda a: TF.ctc_loss(a.log_softmax(-1), torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                                zero_infinity=True, reduction="sum"), logits)


@pytest.mark.parametrize(("il", "tl", "blank", "message"), [
    ([12, 8], [3, 2], 0, r"input_lengths\[0\] is 12, not between 0 and 9 \(T of log_probs \[T, N, C\]\)"),
    ([9, -1], [3, 2], 0, r"input_lengths\[1\] is -1, not between 0 and 9 \(T of log_probs \[T, N, C\]\)"),
    ([9, 8], [3, 4], 0, r"target_lengths\[1\] is 4, not between 0 and 3 \(S of targets \[N, S\]\)"),
    ([9, 8], [3, 2], 5, r"blank 5 is not one of the 5 classes of log_probs"),
], ids=["input-past-T", "input-negative", "target-past-S", "blank"])
def test_ctc_lengths_known_when_called_are_checked_as_torch_does(il: list, tl: list, blank: int,
                                                                 message: str) -> None:
    """torch refuses these; unchecked, an input length past T was read as T and the others gave +inf."""
    logits, tg, _, _ = _ctc_case(np.random.default_rng(39), 9, 2, 5, 3)
    lp = nf.tensor(logits).log_softmax(-1)
    for lengths in (np.array, list, torch.tensor, nf.tensor):
        with pytest.raises(nf.ShapeError, match=message + r" \(at .*test_nn_losses.py:\d+\)"):
            F.ctc_loss(lp, tg, lengths(il), lengths(tl), blank=blank)


def test_ctc_samples_of_no_input_steps_have_only_the_empty_alignment(backend: str) -> None:
    """torch: loss 0 for an empty target, +inf (0 with zero_infinity) for any other; step 0 is not emitted."""
    logits, tg, il, tl = _ctc_case(np.random.default_rng(42), 7, 4, 5, 2)
    il[1:3], tl[1], tl[2] = 0, 0, 1
    _both(lambda a: F.ctc_loss(a.log_softmax(-1), tg, il, tl, reduction="none", zero_infinity=True),
          lambda a: TF.ctc_loss(a.log_softmax(-1), torch.tensor(tg), torch.tensor(il), torch.tensor(tl),
                                reduction="none", zero_infinity=True), logits)
    lp = torch.tensor(logits).log_softmax(-1)
    expected = TF.ctc_loss(lp, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), reduction="none").numpy()
    assert expected[1] == 0 and np.isinf(expected[2])
    got = nf.compile(lambda lp, il, tl: F.ctc_loss(lp, tg, il, tl, reduction="none"), backend=backend)(
        lp.numpy(), il, tl)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("label", "message"), [
    (9, r"targets\[1, 2\] is 9, not one of the 5 classes of log_probs"),
    (-1, r"targets\[1, 2\] is -1, not one of the 5 classes of log_probs"),
    (0, r"targets\[1, 2\] is 0, the blank"),
], ids=["past-C", "negative", "blank"])
def test_ctc_labels_known_when_called_are_classes_other_than_the_blank(label: int, message: str) -> None:
    """torch leaves these unchecked (a label past C reads out of bounds there); past a sample's length anything goes."""
    logits, tg, _, _ = _ctc_case(np.random.default_rng(40), 9, 2, 5, 3)
    lp = nf.tensor(logits).log_softmax(-1)
    tg[1, 2] = label
    for targets in (np.array, torch.tensor, nf.tensor):
        with pytest.raises(nf.ShapeError, match=message + r" \(at .*test_nn_losses.py:\d+\)"):
            F.ctc_loss(lp, targets(tg), [9, 9], [3, 3])
    F.ctc_loss(lp, tg, [9, 9], [3, 2])  # targets[1, 2] is padding
    traced = nf.compile(lambda lp: F.ctc_loss(lp, tg, [9, 9], [3, 3]), backend="reference")
    with pytest.raises(nf.ShapeError, match=message):
        traced(logits)


@pytest.mark.parametrize("what", ["targets", "target_lengths", "input_lengths"])
def test_ctc_labels_and_lengths_in_floats_are_refused_not_truncated(what: str) -> None:
    logits, tg, il, tl = _ctc_case(np.random.default_rng(41), 9, 2, 5, 3)
    args = {"targets": tg, "input_lengths": il, "target_lengths": tl}
    args[what] = args[what] + 0.5
    lp = nf.tensor(logits).log_softmax(-1)
    for kind in (np.array, list, nf.tensor):
        given = {k: (kind(v.tolist()) if k == what else v) for k, v in args.items()}
        with pytest.raises(nf.DTypeError, match=rf"ctc_loss: {what} must hold integers, got .*float"):
            F.ctc_loss(lp, **given)


def test_ctc_compiles_once_for_several_lengths() -> None:
    rng = np.random.default_rng(39)
    f = nf.compile(lambda lp, tg, il, tl: F.ctc_loss(lp, tg, il, tl, reduction="sum"))
    for t in (6, 9):
        logits, tg, il, tl = _ctc_case(rng, t, 2, 4, 2)
        lp = torch.tensor(logits).log_softmax(-1)
        ref = TF.ctc_loss(lp, torch.tensor(tg), torch.tensor(il), torch.tensor(tl), reduction="sum")
        np.testing.assert_allclose(np.asarray(f(lp.numpy(), tg, il, tl)), ref.numpy(), rtol=RTOL, atol=ATOL)
    assert f.trace_count == 1  # T is the scan's trip count: a new length re-specializes, it does not re-trace
