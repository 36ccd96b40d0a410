"""The CTC-CRF (Bonito's): normaliser, loss and Viterbi decode against a brute-force enumeration of every path
of the lattice on tiny cases (state_len <= 2, T <= 6) in float64, forward and gradient, on every backend; and
against plain CTC where the two coincide."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn.functional as F

N_BASE = 4
# float64 sums of <= 6 terms and log-sum-exps over <= 250k paths on both sides: ~1e-13 apart; 1e-9 is far
# below any wrong edge or missing path (O(1e-1)).
TOL = 1e-9


def _paths(state_len: int, steps: int, start: int | None = None) -> tuple[np.ndarray, list[tuple]]:
    """Every path of ``steps`` edges (from every start state, or from ``start``), written from the lattice's
    meaning rather than its index formulas: a state is the last ``state_len`` bases (newest lowest); a stay
    keeps it (edge 0); a move appending base b drops the oldest base r (edge 1 + r). Returns (flat score index
    per step [P, steps], the bases each path appends)."""
    states, k = N_BASE ** state_len, N_BASE + 1
    choices = np.array(list(itertools.product(range(k), repeat=steps)), dtype=np.int64).reshape(-1, steps)
    idx, emitted = [], []
    for s0 in range(states) if start is None else [start]:
        s = np.full(len(choices), s0)
        cols = []
        for t in range(steps):
            c = choices[:, t]
            oldest = s // N_BASE ** (state_len - 1)
            new = np.where(c == 0, s, (s * N_BASE + c - 1) % states)
            cols.append(new * k + np.where(c == 0, 0, 1 + oldest))
            s = new
        idx.append(np.stack(cols, 1))
        emitted.extend(tuple(int(b) - 1 for b in row if b) for row in choices)
    return np.concatenate(idx), emitted


def _path_scores(scores: torch.Tensor, idx: np.ndarray) -> torch.Tensor:
    """[N, P]: each path's summed score."""
    t = torch.arange(idx.shape[1])[None, :]
    return scores[t, :, torch.from_numpy(idx)].sum(1).T


def _brute_logz(scores: torch.Tensor, state_len: int) -> torch.Tensor:
    idx, _ = _paths(state_len, scores.shape[0])
    return torch.logsumexp(_path_scores(scores, idx), 1)


def _brute_loss(scores: torch.Tensor, targets: np.ndarray, lengths: np.ndarray, state_len: int,
                normalise: bool) -> torch.Tensor:
    """-(log-sum-exp of the target's paths - logZ) / length per sample, every path enumerated."""
    losses = []
    for b, (y, m) in enumerate(zip(targets, lengths)):
        y = [int(v) - 1 for v in y[:m]]
        start = sum(v * N_BASE ** (state_len - 1 - i) for i, v in enumerate(y[:state_len]))
        idx, emitted = _paths(state_len, scores.shape[0], start)
        keep = np.array([e == tuple(y[state_len:]) for e in emitted])
        target = torch.logsumexp(_path_scores(scores[:, b:b + 1], idx[keep])[0], 0)
        z = _brute_logz(scores[:, b:b + 1], state_len)[0] if normalise else 0.0
        losses.append(-(target - z) / m)
    return torch.stack(losses)


def _scores(rng, steps, n, state_len):
    return rng.standard_normal((steps, n, N_BASE ** state_len * (N_BASE + 1)))


@pytest.mark.parametrize(("state_len", "steps"), [(1, 1), (1, 6), (2, 3), (2, 5)])
def test_logz_matches_brute_force(backend, rng, state_len, steps):
    x = _scores(rng, steps, 2, state_len)
    w = rng.standard_normal(2)
    value, grad = nf.compile(lambda x: (F.crf_logz(x, state_len), nf.grad(
        lambda x: (F.crf_logz(x, state_len) * w).sum())(x)), backend=backend)(x)
    tx = torch.tensor(x, requires_grad=True)
    want = _brute_logz(tx, state_len)
    (want * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(value, want.detach().numpy(), rtol=TOL, atol=TOL)
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize(("state_len", "steps", "lengths"), [(1, 6, [3, 1, 6]), (2, 5, [4, 2, 3]),
                                                             (2, 6, [6, 5, 2])])
def test_loss_matches_brute_force(backend, rng, state_len, steps, lengths, normalise):
    n, width = len(lengths), max(lengths)
    x = _scores(rng, steps, n, state_len)
    targets = rng.integers(1, N_BASE + 1, (n, width))
    for b, m in enumerate(lengths):
        targets[b, m:] = 0  # padding
    lengths = np.array(lengths)
    w = rng.standard_normal(n)

    def f(x, targets, lengths):
        def loss(x):
            return F.ctc_crf_loss(x, targets, lengths, state_len, normalise_scores=normalise, reduction="none")
        return loss(x), nf.grad(lambda x: (loss(x) * w).sum())(x)

    value, grad = nf.compile(f, backend=backend)(x, targets, lengths)
    tx = torch.tensor(x, requires_grad=True)
    want = _brute_loss(tx, targets, lengths, state_len, normalise)
    (want * torch.tensor(w)).sum().backward()
    np.testing.assert_allclose(value, want.detach().numpy(), rtol=TOL, atol=TOL)
    np.testing.assert_allclose(grad, tx.grad.numpy(), rtol=TOL, atol=TOL)


def test_loss_reductions_and_clip(backend, rng):
    x = _scores(rng, 5, 3, 1)
    targets, lengths = rng.integers(1, 5, (3, 4)), np.array([4, 2, 3])
    f = nf.compile(lambda x, reduction, clip: F.ctc_crf_loss(x, targets, lengths, 1, reduction=reduction,
                                                              loss_clip=clip), backend=backend)
    per = f(x, "none", None)
    np.testing.assert_allclose(f(x, "mean", None), per.mean(), rtol=TOL)
    np.testing.assert_allclose(f(x, "sum", None), per.sum(), rtol=TOL)
    clip = float(np.median(per))
    np.testing.assert_allclose(f(x, "none", clip), np.clip(per, 0, clip), rtol=TOL)


@pytest.mark.parametrize(("state_len", "steps"), [(1, 6), (2, 4)])
def test_viterbi_finds_the_best_enumerated_path(backend, rng, state_len, steps):
    x = _scores(rng, steps, 3, state_len)
    score, path = nf.compile(lambda x: F.crf_viterbi(x, state_len), backend=backend)(x)
    idx, _ = _paths(state_len, steps)
    all_scores = _path_scores(torch.tensor(x), idx).numpy()          # [N, P]
    best = all_scores.argmax(1)
    np.testing.assert_allclose(score, all_scores.max(1), rtol=TOL, atol=TOL)
    assert path.dtype == np.int64 and path.shape == (steps, 3)
    np.testing.assert_array_equal(path.T, idx[best] % (N_BASE + 1))   # the edge taken at each step


def test_loss_equals_ctc_where_they_coincide(backend, rng):
    """state_len 1, scores from CTC log-probs (stay = blank; a move into state s scores label s + 1 whatever it
    leaves), T steps and T labels after the start base: CTC (no repeated labels) and the CTC-CRF both have
    exactly one alignment, every step emitting the next label, so the unnormalised losses agree up to the
    division by the length (T for CTC, T + 1 with the start base for the CTC-CRF)."""
    steps, n = 5, 3
    lp = torch.log_softmax(torch.tensor(rng.standard_normal((steps, n, N_BASE + 1))), -1).numpy()
    labels = np.zeros((n, steps), np.int64)
    labels[:, 0] = rng.integers(1, 5, n)
    for t in range(1, steps):  # each label differs from the one before it: no blank needed between them
        labels[:, t] = (labels[:, t - 1] - 1 + rng.integers(1, 4, n)) % 4 + 1
    scores = np.concatenate([lp[:, :, :1].repeat(N_BASE, 2)[..., None],
                             np.repeat(lp[:, :, 1:, None], N_BASE, 3)], -1).reshape(steps, n, -1)
    targets = np.concatenate([rng.integers(1, 5, (n, 1)), labels], 1)
    crf = nf.compile(lambda s: F.ctc_crf_loss(s, targets, np.full(n, steps + 1), 1, normalise_scores=False,
                                              reduction="none"), backend=backend)(scores)
    ctc = torch.nn.functional.ctc_loss(torch.tensor(lp), torch.tensor(labels), [steps] * n, [steps] * n,
                                       reduction="none").numpy()
    np.testing.assert_allclose(crf * (steps + 1), ctc, rtol=TOL, atol=TOL)


def test_errors_name_the_shapes():
    x = nf.zeros(3, 2, 20) + 0.5
    with pytest.raises(nf.ShapeError, match=r"scores have 20 per step; state_len 2 with 4 bases needs 16 states "
                                            r"\* 5 edges = 80"):
        F.crf_logz(x, 2)
    with pytest.raises(nf.ShapeError, match=r"ctc_crf_loss: targets must be \[N, S\] and target_lengths \[N\] "
                                            r"for N = 2"):
        F.ctc_crf_loss(x, np.ones((3, 4), np.int64), np.array([4, 4, 4]), 1)
    with pytest.raises(nf.ShapeError, match="targets of 1 bases cannot fill a state of 2"):
        F.ctc_crf_loss(nf.zeros(3, 2, 80), np.ones((2, 1), np.int64), np.array([1, 1]), 2)
    with pytest.raises(nf.ShapeError, match=r"target length 5 is outside \[state_len, S\] = \[1, 4\]"):
        F.ctc_crf_loss(x, np.ones((2, 4), np.int64), np.array([4, 5]), 1)
    with pytest.raises(nf.ShapeError, match=r"target base 7 is outside 1\.\.4 \(0 pads\)"):
        F.ctc_crf_loss(x, np.array([[1, 2, 7, 0], [1, 1, 1, 1]]), np.array([3, 4]), 1)
    with pytest.raises(nf.DTypeError, match=r"target_lengths must hold integers, got nf\.float64"):
        F.ctc_crf_loss(x, np.ones((2, 4), np.int64), np.array([4.0, 4.0]), 1)
    with pytest.raises(nf.DTypeError, match=r"crf_viterbi: scores must be float, got nf\.int64"):
        F.crf_viterbi(nf.tensor(np.ones((3, 2, 20), np.int64)), 1)


def test_compiled_loss_takes_a_new_length_without_tracing(backend, rng):
    targets, lengths = rng.integers(1, 5, (2, 3)), np.array([3, 2])
    f = nf.compile(lambda x: F.ctc_crf_loss(x, targets, lengths, 1), backend=backend)
    for steps in (4, 6):
        x = _scores(rng, steps, 2, 1)
        want = _brute_loss(torch.tensor(x), targets, lengths, 1, True).mean().item()
        np.testing.assert_allclose(f(x), want, rtol=TOL)
    assert f.trace_count == 1
