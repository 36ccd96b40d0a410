"""The CTC-CRF of Bonito's CRF basecallers: its loss, its normaliser and its Viterbi decode.

The model emits, per time step and sample, one score per edge of a state lattice: ``n_base ** state_len`` states
(the last ``state_len`` bases read, the newest in the lowest base-``n_base`` digit) and ``n_base + 1`` edges into
each state ``s``: edge 0 *stays* in ``s`` (a blank), edge ``1 + r`` *moves* in from the state whose oldest base
``r`` is dropped as the newest base of ``s`` is appended. Scores are laid out ``[T, N, states * (n_base + 1)]``,
state-major. ``crf_logz`` sums over every path of T edges from any state (log semiring); ``crf_viterbi`` takes
the best one (max semiring). ``ctc_crf_loss`` normalises the scores by ``logZ / T`` per step and sums over the
paths that read the target, as Bonito does: the target's first ``state_len`` bases are the start state and each
later base is one move.

Every recursion is one ``nf.scan`` over time; the normaliser reads each state's predecessors with one ``gather``
per step, so its gradient (a reversed scan) scatter-adds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import dtypes
from ..control import scan
from ..errors import DTypeError, ShapeError, at
from ..indexing import gather
from ..ir.ops import Op
from ..tensor import Tensor, arange, as_tensor, full, stack, where
from .losses import _check_reduction

__all__ = ["crf_logz", "crf_predecessors", "crf_viterbi", "ctc_crf_loss"]

_NEG = -1e30  # log-space "zero": finite, so no inf - inf in the recursions or their gradients


def crf_predecessors(state_len: int, n_base: int = 4) -> np.ndarray:
    """``[states, n_base + 1]``: the state each edge into a state comes from (column 0: itself, a stay; column
    ``1 + r``: the state with oldest base ``r`` followed by all but the newest base of the target state)."""
    states = n_base ** state_len
    s = np.arange(states)
    moves = np.arange(n_base)[None, :] * (states // n_base) + (s // n_base)[:, None]
    return np.concatenate([s[:, None], moves], axis=1).astype(np.int64)


def _lattice(scores: Any, state_len: int, n_base: int, what: str) -> tuple[Tensor, int, int]:
    scores = as_tensor(scores)
    if scores.ndim != 3:
        raise ShapeError(at(f"{what}: scores must be [T, N, C], got {list(map(int, scores.shape))}"))
    if not scores.dtype.is_float:
        raise DTypeError(at(f"{what}: scores must be float, got {scores.dtype}"))
    if state_len < 1 or n_base < 1:
        raise ShapeError(at(f"{what}: state_len and n_base must be positive, got {state_len} and {n_base}"))
    states, k = n_base ** state_len, n_base + 1
    if int(scores.shape[2]) != states * k:
        raise ShapeError(at(f"{what}: scores have {int(scores.shape[2])} per step; state_len {state_len} with "
                         f"{n_base} bases needs {states} states * {k} edges = {states * k}"))
    if scores.dtype not in (dtypes.float32, dtypes.float64):
        scores = scores.cast(dtypes.float32)
    return scores, states, k


def _ints(x: Any, what: str) -> Tensor:
    t = x if isinstance(x, Tensor) else Tensor(np.asarray(x))
    if not t.dtype.is_int:
        raise DTypeError(at(f"ctc_crf_loss: {what} must hold integers, got {t.dtype}"))
    return t.cast(dtypes.int64)


def _check_concrete(targets: Tensor, lengths: Tensor, state_len: int, n_base: int) -> None:
    """Values known now (not traced inputs) are checked now: a bad length or base would otherwise index outside
    the lattice when the program runs."""
    width = int(targets.shape[1])
    if lengths.node.op == Op.DATA or (lengths.node.op == Op.CAST and lengths.node.srcs[0].op == Op.DATA):
        bad = [int(v) for v in lengths.numpy() if not state_len <= v <= width]
        if bad:
            raise ShapeError(at(f"ctc_crf_loss: target length {bad[0]} is outside [state_len, S] = [{state_len}, "
                             f"{width}]"))
    if targets.node.op == Op.DATA or (targets.node.op == Op.CAST and targets.node.srcs[0].op == Op.DATA):
        bad = [int(v) for v in targets.numpy().ravel() if not 0 <= v <= n_base]
        if bad:
            raise ShapeError(at(f"ctc_crf_loss: target base {bad[0]} is outside 1..{n_base} (0 pads)"))


def _edges_in(alpha: Tensor, m_t: Tensor, idx: Tensor, states: int, k: int) -> Tensor:
    """``[N, states, k]``: each edge's score plus the score of the state it leaves (one gather per step)."""
    return gather(alpha, 1, idx).reshape(alpha.shape[0], states, k) + m_t


def _lse(x: Tensor, axis: int = -1) -> Tensor:
    """log-sum-exp with the shift cut from the gradient (the result does not depend on it)."""
    m = x.max(axis, keepdims=True).detach()
    return ((x - m).exp().sum(axis, keepdims=True).log() + m).squeeze(axis)


def crf_logz(scores: Any, state_len: int, n_base: int = 4) -> Tensor:
    """``[N]``: log of the summed exp-scores of every path of T edges through the lattice, from any state to any
    state (Bonito's ``CTC_CRF.logZ``). Differentiable."""
    scores, states, k = _lattice(scores, state_len, n_base, "crf_logz")
    n = scores.shape[1]
    ms = scores.reshape(scores.shape[0], n, states, k)
    idx = Tensor(crf_predecessors(state_len, n_base).reshape(1, states * k)).expand(n, states * k)

    def step(alpha: Tensor, m_t: Tensor) -> tuple[Tensor, tuple]:
        return _lse(_edges_in(alpha, m_t, idx, states, k)), ()

    alpha, _ = scan(step, full((n, states), 0, scores.dtype), ms)
    return _lse(alpha)


def crf_viterbi(scores: Any, state_len: int, n_base: int = 4) -> tuple[Tensor, Tensor]:
    """The best path (max semiring): ``(score [N], path [T, N] int64)``. ``path[t]`` is the edge taken at step t:
    0 for a stay, ``1 + r`` for a move that drops base ``r``, as Bonito's ``viterbi`` returns it (its
    ``path_to_str`` reads the non-zero entries). A forward scan keeps each state's best incoming edge (the first
    on a tie), a reversed scan walks them back from the best final state."""
    scores, states, k = _lattice(scores, state_len, n_base, "crf_viterbi")
    scores = scores.detach()
    n = scores.shape[1]
    ms = scores.reshape(scores.shape[0], n, states, k)
    pred = crf_predecessors(state_len, n_base)
    idx = Tensor(pred.reshape(1, states * k)).expand(n, states * k)
    edge = arange(k, dtype=dtypes.int64)

    def first_best(x: Tensor) -> tuple[Tensor, Tensor]:
        best = x.max(-1, keepdims=True)
        at = where(x == best, edge.reshape(*[1] * (x.ndim - 1), k).expand(*x.shape), k).min(-1)
        return best.squeeze(-1), at

    def forward(alpha: Tensor, m_t: Tensor) -> tuple[Tensor, Tensor]:
        return first_best(_edges_in(alpha, m_t, idx, states, k))

    alpha, back = scan(forward, full((n, states), 0, scores.dtype), ms)   # back: [T, N, states]
    score = alpha.max(-1)
    where_best = where(alpha == score.unsqueeze(-1), arange(states, dtype=dtypes.int64).reshape(1, states).expand(
        n, states), states)
    last = where_best.min(-1)                                             # [N]: first best final state
    flat_pred = Tensor(pred.reshape(1, states * k)).expand(n, states * k)

    def backward(state: Tensor, back_t: Tensor) -> tuple[Tensor, Tensor]:
        e = gather(back_t, 1, state.unsqueeze(1))                       # [N, 1]: the edge into ``state``
        prev = gather(flat_pred, 1, state.unsqueeze(1) * k + e)
        return prev.squeeze(1), e.squeeze(1)

    _, path = scan(backward, last, back, reverse=True)
    return score, path


def ctc_crf_loss(scores: Any, targets: Any, target_lengths: Any, state_len: int, n_base: int = 4,
                 normalise_scores: bool = True, reduction: str = "mean", loss_clip: float | None = None) -> Tensor:
    """Bonito's CTC-CRF loss of ``scores`` ``[T, N, states * (n_base + 1)]`` (see the module docstring).

    ``targets`` is ``[N, S]`` padded, bases ``1..n_base`` (0 = padding, as CTC labels with blank 0);
    ``target_lengths`` ``[N]``, each at least ``state_len``. Per sample the loss is ``-(log-score of the
    target's paths - logZ) / target_length``: with ``normalise_scores`` every step's scores are first shifted by
    ``logZ / T`` (so paths score as log-probabilities), without it the raw path score is used. ``loss_clip``
    clamps each loss to ``[0, loss_clip]``; ``reduction`` is ``"mean"``, ``"sum"`` or ``"none"``.
    A target needing more moves than there are steps has probability 0: its loss is about 1e30 / length.
    """
    _check_reduction(reduction)
    scores, _, k = _lattice(scores, state_len, n_base, "ctc_crf_loss")
    t_len, n = scores.shape[0], scores.shape[1]
    tg, lengths = _ints(targets, "targets"), _ints(target_lengths, "target_lengths")
    if tg.ndim != 2 or int(tg.shape[0]) != int(n) or tuple(map(int, lengths.shape)) != (int(n),):
        raise ShapeError(at(f"ctc_crf_loss: targets must be [N, S] and target_lengths [N] for N = {int(n)} from "
                         f"scores {list(map(int, scores.shape))}; got {list(map(int, tg.shape))} and "
                         f"{list(map(int, lengths.shape))}"))
    if int(tg.shape[1]) < state_len:
        raise ShapeError(at(f"ctc_crf_loss: targets of {int(tg.shape[1])} bases cannot fill a state of {state_len}"))
    _check_concrete(tg, lengths, state_len, n_base)
    if normalise_scores:
        steps = full((), t_len, scores.dtype)  # a symbolic T stays symbolic: a new length re-specializes
        scores = scores - (crf_logz(scores, state_len, n_base) / steps).reshape(1, n, 1)
    bases = (tg - 1).clamp(min=0)
    pos = int(tg.shape[1]) - (state_len - 1)                               # lattice positions per sample
    state = sum(bases[:, i:pos + i] * n_base ** (state_len - 1 - i) for i in range(state_len))
    stay_at = state * k                                                    # [N, pos]: edge 0 of each state
    move_at = stay_at[:, 1:] + bases[:, :pos - 1] + 1                      # edge 1 + dropped base
    stay = gather(scores, 2, stay_at.unsqueeze(0).expand(t_len, n, pos))
    move = gather(scores, 2, move_at.unsqueeze(0).expand(t_len, n, pos - 1))

    def step(a: Tensor, xs: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple]:
        stay_t, move_t = xs
        moved = (a[:, :-1] + move_t).pad(((0, 0), (1, 0)), value=_NEG)
        return _lse(stack([a + stay_t, moved], axis=-1)), ()

    a0 = where(arange(pos, dtype=dtypes.int64) == 0, full((pos,), 0, scores.dtype), _NEG)
    a, _ = scan(step, a0.reshape(1, pos).expand(n, pos), (stay, move))
    logz = gather(a, 1, (lengths - state_len).unsqueeze(1)).squeeze(1)
    loss = -(logz / lengths.cast(logz.dtype))
    if loss_clip:
        loss = loss.clamp(0.0, loss_clip)
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss
