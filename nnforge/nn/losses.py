"""Loss functions with PyTorch's semantics: MSE, negative log-likelihood, cross-entropy and CTC.

CTC is the interesting one: the forward (alpha) recursion runs in log space as one ``nf.scan`` over time on the
extended label sequence (blanks between labels), and its gradient is whatever reverse-mode autodiff makes of that
scan: a reversed scan, i.e. the beta recursion, derived rather than hand-written.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .. import dtypes
from ..control import scan
from ..errors import DTypeError, ShapeError, at, user_stacklevel
from ..indexing import gather
from ..interop.convert import to_numpy
from ..tensor import Tensor, arange, as_tensor, full, maximum, stack, where
from ..trace import session

_REDUCTIONS = ("mean", "sum", "none")


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"unknown reduction {reduction!r}; choose one of {', '.join(_REDUCTIONS)}")


def _check_reduction(reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {', '.join(_REDUCTIONS)}")


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Mean (or summed, or elementwise) squared error. Shapes that differ broadcast, with torch's warning (not for
    a scalar target): a [N, 1] prediction against an [N] target is an [N, N] loss, rarely what was meant."""
    x, t = as_tensor(input), as_tensor(target)
    if t.ndim and tuple(map(int, x.shape)) != tuple(map(int, t.shape)):  # a scalar target is plainly meant
        warnings.warn(f"mse_loss: a target of {list(map(int, t.shape))} against an input of "
                      f"{list(map(int, x.shape))} broadcasts, which is likely wrong; give both the same shape",
                      UserWarning, stacklevel=user_stacklevel())
    d = x - t
    return _reduce(d * d, reduction)


def _classes_last(x: Tensor) -> Tensor:
    """[N, C, d1, ...] -> [N, d1, ..., C] so the class axis is the last one (as the one-hot gather wants)."""
    return x if x.ndim <= 2 else x.permute(0, *range(2, x.ndim), 1)


def _one_hot(index: Tensor, num_classes: int, dtype: Any) -> Tensor:
    return (index.unsqueeze(-1) == arange(num_classes)).cast(dtype)


def nll_loss(input: Tensor, target: Any, weight: Any = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """Negative log-likelihood of class indices given log-probabilities [N, C, ...] (or [C]).

    With ``reduction="mean"`` the sum is divided by the total weight of the non-ignored targets, as in torch.
    """
    _check_reduction(reduction)
    lp, tg, unbatched = _prepare_classes(input, target, "nll_loss", ignore_index)
    lp = _classes_last(lp)
    c = int(lp.shape[-1])
    valid = tg != ignore_index
    oh = _one_hot(tg, c, lp.dtype) * valid.cast(lp.dtype).unsqueeze(-1)
    if weight is not None:
        oh = oh * as_tensor(weight).cast(lp.dtype)
    loss = -(lp * oh).sum(-1)
    if reduction == "mean":
        return loss.sum() / oh.sum()
    if reduction == "sum":
        return loss.sum()
    return loss.squeeze(0) if unbatched else loss


def _prepare_classes(input: Any, target: Any, op: str, ignore_index: int) -> tuple[Tensor, Tensor, bool]:
    x, t = as_tensor(input), as_tensor(target)
    unbatched = x.ndim == 1
    if unbatched:
        x, t = x.unsqueeze(0), t.unsqueeze(0)
    if not t.dtype.is_float:
        want = (int(x.shape[0]), *map(int, x.shape[2:]))
        if tuple(map(int, t.shape)) != want:
            raise ShapeError(at(f"class-index target of shape {list(map(int, t.shape))} does not fit input "
                             f"{list(map(int, x.shape))} (expected {list(want)})"))
        _check_classes(target, int(x.shape[1]), ignore_index, op)
    return x, t, unbatched


def _check_classes(target: Any, classes: int, ignore_index: int, op: str) -> None:
    """Class indices known now must be classes of the input or ``ignore_index``, as torch checks: past them a
    sample's one-hot row is all zeros and it would silently leave the loss."""
    values = _known_now(target)
    if values is None:
        return
    values = np.asarray(values).reshape(np.shape(values) or (1,))
    bad = np.argwhere(((values < 0) | (values >= classes)) & (values != ignore_index))
    if bad.size:
        i = tuple(map(int, bad[0]))
        raise ShapeError(at(f"{op}: target{list(i)} is {values[i]}, not one of the {classes} classes of the input "
                            f"(nor ignore_index {ignore_index})"))


def cross_entropy(input: Tensor, target: Any, weight: Any = None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """Cross-entropy of logits [N, C, ...] (or [C]) against class indices or class probabilities.

    Follows torch exactly, including how label smoothing mixes in the uniform distribution and how class
    weights and ``ignore_index`` enter the mean.
    """
    _check_reduction(reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    x, t, unbatched = _prepare_classes(input, target, "cross_entropy", ignore_index)
    logp = x.log_softmax(axis=1)
    c = int(x.shape[1])
    w = None if weight is None else as_tensor(weight).cast(logp.dtype).reshape(c, *([1] * (x.ndim - 2)))
    if t.dtype.is_float:  # probabilities
        if tuple(map(int, t.shape)) != tuple(map(int, x.shape)):
            raise ShapeError(at(f"cross_entropy: probability target {list(map(int, t.shape))} must have the input's "
                             f"shape {list(map(int, x.shape))}"))
        if label_smoothing:
            t = t * (1.0 - label_smoothing) + label_smoothing / c
        wl = logp * w if w is not None else logp
        loss = -(wl * t.cast(logp.dtype)).sum(1)
        loss = _reduce(loss, reduction)
        return loss.squeeze(0) if unbatched and reduction == "none" else loss
    nll = nll_loss(logp, t, weight, ignore_index, reduction)
    if unbatched and reduction == "none":
        nll = nll.unsqueeze(0)
    if not label_smoothing:
        return nll.squeeze(0) if unbatched and reduction == "none" else nll
    valid = t != ignore_index
    smooth = -((logp * w) if w is not None else logp).sum(1)
    smooth = where(valid, smooth, 0.0)
    if reduction == "mean":
        if weight is not None:
            lpl = _classes_last(logp)
            oh = _one_hot(t, c, lpl.dtype) * valid.cast(lpl.dtype).unsqueeze(-1)
            smooth = smooth.sum() / (oh * as_tensor(weight).cast(lpl.dtype)).sum()
        else:
            smooth = smooth.sum() / valid.sum().cast(logp.dtype)
    elif reduction == "sum":
        smooth = smooth.sum()
    out = nll * (1.0 - label_smoothing) + smooth * (label_smoothing / c)
    return out.squeeze(0) if unbatched and reduction == "none" else out


# ---- CTC ------------------------------------------------------------------------------------------------------

# Log-space "minus infinity" for CTC. A finite value keeps the backward pass NaN-free: with a true -inf, a state
# unreachable from every predecessor computes log(0) and its gradient 0/0. Unreachable alphas sit near -1e30,
# and a loss that large means "impossible alignment" and is reported as +inf.
_NEG = -1e30


def _host_array(x: Any) -> np.ndarray:
    """A list, tuple, array or torch tensor (or an eager nnforge tensor) as a numpy array on the host."""
    return np.asarray(x.numpy() if isinstance(x, Tensor) else x if isinstance(x, (list, tuple)) else to_numpy(x))


def _known_now(given: Any) -> np.ndarray | None:
    """``given``'s values where they are known when the loss is called (host data or an eager tensor); None for a
    traced tensor, known only at run time."""
    if isinstance(given, Tensor) and session().tracing:
        return None
    return _host_array(given)


def _host_ints(x: Any, what: str) -> np.ndarray:
    """``x`` on the host as int64; floats are refused rather than truncated (a label 1.5 is no class)."""
    a = _host_array(x)
    if a.size and a.dtype.kind not in "iu":
        raise DTypeError(at(f"ctc_loss: {what} must hold integers, got {a.dtype}"))
    return a.astype(np.int64)


def _int_tensor(x: Any, what: str) -> Tensor:
    t = x if isinstance(x, Tensor) else Tensor(_host_ints(x, what))
    if t.dtype.is_float:
        raise DTypeError(at(f"ctc_loss: {what} must hold integers, got {t.dtype}"))
    return t.cast(dtypes.int64)


def _check_lengths(given: Any, what: str, most: int, why: str) -> None:
    """Lengths known now (a list, array or torch tensor, or an eager tensor) must lie in [0, ``most``], as torch
    checks: past it the loss would quietly use ``most`` steps, or be +inf. Traced ones are known only at run time."""
    values = _known_now(given)
    if values is None:
        return
    values = values.reshape(-1)
    bad = np.flatnonzero((values < 0) | (values > most))
    if bad.size:
        i = int(bad[0])
        raise ShapeError(at(f"ctc_loss: {what}[{i}] is {values[i]}, not between 0 and {most} ({why})"))


def _check_labels(targets: Any, tg: Tensor, target_lengths: Any, classes: int, blank: int) -> None:
    """Labels known now, within each sample's length, must be classes other than the blank (torch's rule, which it
    does not check: a label past the class axis reads out of bounds there). Traced ones are known only at run time."""
    if session().tracing:
        if isinstance(targets, Tensor) or isinstance(target_lengths, Tensor):
            return
        labels = _host_ints(targets, "targets")  # 2-d: concatenated targets are refused when tracing
    else:
        labels = tg.numpy()
    lengths = _host_array(target_lengths).reshape(-1)
    used = np.arange(labels.shape[1]) < lengths[:, None]
    bad = np.argwhere(used & ((labels < 0) | (labels >= classes) | (labels == blank)))
    if bad.size:
        i, j = map(int, bad[0])
        why = "the blank" if labels[i, j] == blank else f"not one of the {classes} classes of log_probs"
        raise ShapeError(at(f"ctc_loss: targets[{i}, {j}] is {labels[i, j]}, {why}"))


def _padded_targets(targets: Any, target_lengths: Any) -> Tensor:
    """[N, S] targets; 1-d concatenated targets (torch's other format) are split on the host."""
    tg = _int_tensor(targets, "targets")
    if tg.ndim == 2:
        return tg
    if tg.ndim != 1:
        raise ShapeError(at(f"ctc_loss: targets must be [N, S] (padded) or 1-d (concatenated), got "
                         f"{list(map(int, tg.shape))}"))
    if session().tracing:
        raise ShapeError(at("ctc_loss: concatenated 1-d targets need concrete lengths; pass padded [N, S] targets "
                         "inside traced code"))
    flat = tg.numpy()
    lengths = _host_ints(target_lengths, "target_lengths")
    if int(lengths.sum()) != flat.size:
        raise ShapeError(at(f"ctc_loss: target_lengths sum to {int(lengths.sum())} but there are {flat.size} targets"))
    out = np.zeros((lengths.size, max(int(lengths.max(initial=0)), 1)), np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    for i, (s, n) in enumerate(zip(starts, lengths)):
        out[i, :n] = flat[s:s + n]
    return Tensor(out)


def ctc_loss(log_probs: Tensor, targets: Any, input_lengths: Any, target_lengths: Any, blank: int = 0,
             reduction: str = "mean", zero_infinity: bool = False) -> Tensor:
    """Connectionist temporal classification loss of ``log_probs`` [T, N, C] (log-softmax outputs).

    ``targets`` is [N, S] padded (entries past a sample's length are ignored) or 1-d concatenated;
    lengths are lists, arrays or int tensors. ``reduction="mean"`` divides each loss by its target length
    (at least 1) and averages over the batch, as torch does. Impossible alignments give +inf (0 with
    ``zero_infinity``, which also zeroes their gradient).

    Gradient note: torch's CTC backward returns the gradient w.r.t. the *logits* of a log-softmax (it adds
    ``exp(log_probs)``), while this one is the true gradient w.r.t. ``log_probs``; both agree once composed with
    ``log_softmax``, which is how CTC is always used.
    """
    _check_reduction(reduction)
    lp = as_tensor(log_probs)
    if lp.ndim != 3:
        raise ShapeError(at(f"ctc_loss: log_probs must be [T, N, C], got {list(map(int, lp.shape))}"))
    out_dtype = lp.dtype
    if lp.dtype not in (dtypes.float32, dtypes.float64):
        lp = lp.cast(dtypes.float32)  # -1e30 and the long log-space sums need at least float32
    _, n, _ = lp.shape
    tg = _padded_targets(targets, target_lengths)
    in_len = _int_tensor(input_lengths, "input_lengths")
    tg_len = _int_tensor(target_lengths, "target_lengths")
    if int(tg.shape[0]) != int(n) or tuple(map(int, in_len.shape)) != (int(n),) or \
            tuple(map(int, tg_len.shape)) != (int(n),):
        raise ShapeError(at(f"ctc_loss: batch size {int(n)} of log_probs disagrees with targets "
                         f"{list(map(int, tg.shape))}, input_lengths {list(map(int, in_len.shape))} or "
                         f"target_lengths {list(map(int, tg_len.shape))}"))
    s = int(tg.shape[1])
    _check_lengths(input_lengths, "input_lengths", int(lp.shape[0]), "T of log_probs [T, N, C]")
    _check_lengths(target_lengths, "target_lengths", s, "S of targets [N, S]")
    if not 0 <= blank < int(lp.shape[2]):
        raise ShapeError(at(f"ctc_loss: blank {blank} is not one of the {int(lp.shape[2])} classes of log_probs"))
    _check_labels(targets, tg, target_lengths, int(lp.shape[2]), blank)
    ext_len = 2 * s + 1

    # Extended labels [N, 2S+1]: blank, l1, blank, l2, ..., blank.
    blanks = full((n, s), blank, dtypes.int64)
    ext = stack([blanks, tg], axis=2).reshape(n, 2 * s).pad(((0, 0), (0, 1)), value=blank)
    # Emission log-probabilities of every extended label at every step: one gather (a load per element).
    emit = gather(lp, 2, ext.unsqueeze(0).expand(lp.shape[0], n, ext_len))  # [T, N, L]
    # A label may be reached from two back (skipping a blank) unless it is a blank or repeats that label.
    ext_back2 = ext.pad(((0, 0), (2, 0)), value=blank)[:, :ext_len]
    skip_ok = (ext != blank) & (ext != ext_back2)
    pos = arange(ext_len)
    # A sample of no input steps emits nothing: its only alignment is the empty one, of probability 1 (log 0).
    no_input = (in_len == 0).unsqueeze(-1)
    alpha0 = where(no_input, where(pos == 0, 0.0, _NEG), where(pos < 2, emit[0], _NEG))

    def step(carry, e_t):
        alpha, left = carry  # left: steps of each sample's input still to come
        back1 = alpha.pad(((0, 0), (1, 0)), value=_NEG)[:, :ext_len]
        back2 = where(skip_ok, alpha.pad(((0, 0), (2, 0)), value=_NEG)[:, :ext_len], _NEG)
        m = maximum(maximum(alpha, back1), back2).detach()  # logsumexp is invariant to m: no gradient needed
        new = m + ((alpha - m).exp() + (back1 - m).exp() + (back2 - m).exp()).log() + e_t
        alpha = where((left > 0).unsqueeze(-1), new, alpha)  # past a sample's length its alpha stays put
        return (alpha, left - 1), ()

    # A per-sample count of the steps left rather than one step counter for the batch: every carry has the batch
    # axis, so the recursion's rows stay independent and are split among threads with no barrier per step.
    (alpha, _), _ = scan(step, (alpha0, in_len.cast(dtypes.int64) - 1), emit[1:])
    last = (2 * tg_len).unsqueeze(-1)
    ends = (pos == last) | (pos == last - 1)
    nll = -where(ends, alpha, _NEG).logsumexp(-1)                           # [N]
    impossible = nll > -_NEG / 10
    if zero_infinity:
        nll = where(impossible, 0.0, nll)
    else:
        # +inf, and a NaN gradient for every log-probability of the sample, as torch (a zero would let training
        # go on silently): inf * (1 + 0 * sum(lp)) is inf with derivative inf * 0 = NaN in each element.
        finite = where(lp.abs() < float("inf"), lp, 0.0).sum((0, 2))
        scale = where(impossible, float("inf"), 0.0)
        nll = where(impossible, scale * (1.0 + 0.0 * finite), nll)
    if reduction == "mean":
        nll = (nll / tg_len.clamp(min=1).cast(nll.dtype)).mean()
    elif reduction == "sum":
        nll = nll.sum()
    return nll.cast(out_dtype)
