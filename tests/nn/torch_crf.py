"""A plain-torch CTC-CRF with Bonito's semantics (its index table, normalisation and simple target lattice, as
loops over time with autograd): the twin that the nnforge loss is checked against, and the anchor of
bench/ctc_crf_cpu.py."""

from __future__ import annotations

import torch

NEG = -1e30


def predecessors(state_len: int, n_base: int = 4) -> torch.Tensor:
    """[states, n_base + 1]: column 0 the state itself (stay), column 1 + r the state a move dropping r leaves."""
    states = n_base ** state_len
    moves = torch.arange(states).repeat_interleave(n_base).reshape(n_base, -1).T
    return torch.cat([torch.arange(states)[:, None], moves], 1)


def logz(scores: torch.Tensor, state_len: int, n_base: int = 4) -> torch.Tensor:
    steps, n, _ = scores.shape
    idx = predecessors(state_len, n_base)
    ms = scores.reshape(steps, n, -1, n_base + 1)
    alpha = scores.new_zeros(n, idx.shape[0])
    for t in range(steps):
        alpha = torch.logsumexp(alpha[:, idx] + ms[t], -1)
    return torch.logsumexp(alpha, -1)


def ctc_crf_loss(scores: torch.Tensor, targets: torch.Tensor, lengths: torch.Tensor, state_len: int,
                 n_base: int = 4, reduction: str = "mean") -> torch.Tensor:
    steps, n, _ = scores.shape
    scores = scores - logz(scores, state_len, n_base)[:, None] / steps
    bases = torch.clamp(targets - 1, 0)
    pos = targets.shape[1] - (state_len - 1)
    stay_at = sum(bases[:, i:pos + i] * n_base ** (state_len - i - 1) for i in range(state_len)) * (n_base + 1)
    move_at = stay_at[:, 1:] + bases[:, :pos - 1] + 1
    stay = scores.gather(2, stay_at.expand(steps, -1, -1))
    move = scores.gather(2, move_at.expand(steps, -1, -1))
    a = scores.new_full((n, pos), NEG)
    a[:, 0] = 0
    for t in range(steps):
        moved = torch.nn.functional.pad(a[:, :-1] + move[t], (1, 0), value=NEG)
        a = torch.logsumexp(torch.stack([a + stay[t], moved]), 0)
    loss = -a.gather(1, (lengths - state_len)[:, None])[:, 0] / lengths
    return loss.mean() if reduction == "mean" else loss
