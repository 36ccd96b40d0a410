"""``nf.einsum``: torch's and numpy's Einstein summation, lowered to permutes, reshapes, sums and batched matmuls.

An equation is contracted two operands at a time, left to right. Before each product, a letter that neither the
other operand, a later operand nor the output reads is summed away; the product then has the layout
``[batch, rows, k] @ [batch, k, columns]`` (batch: letters both operands and something after keep; k: letters
only the two operands share), so every contraction is one GEMM that the passes fuse like any other, and the
gradient comes from the ops it is made of.
"""

from __future__ import annotations

import math
import string
from typing import Any

from .errors import ShapeError, at
from .ir.ops import fmt_shape
from .tensor import Tensor, _operand, arange, composed, where

__all__ = ["einsum"]

_LETTERS = frozenset(string.ascii_letters)
_ELLIPSIS = "."  # "..." stands for one placeholder per broadcast axis, named by characters no equation uses
_SPARE = [chr(c) for c in range(0x100, 0x200)]


def _parse(equation: str, n: int) -> tuple[list[str], str | None]:
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n:
        raise ShapeError(at(f"einsum: the equation {equation!r} names {len(terms)} operand(s), {n} were given"))
    for t in [*terms, rhs if arrow else ""]:
        bad = set(t.replace("...", "")) - _LETTERS
        if bad or t.count("...") > 1:
            what = f"character {sorted(bad)[0]!r}" if bad else "more than one '...'"
            raise ShapeError(at(f"einsum: {what} in {equation!r} (subscripts are letters, and one '...' per term)"))
    return terms, (rhs if arrow else None)


def _expand_ellipsis(term: str, ndim: int, width: int, equation: str, k: int) -> list[str]:
    """The term's subscripts, one per axis, its ellipsis replaced by the last ``ndim - letters`` of ``width``
    broadcast placeholders."""
    letters = term.replace("...", "")
    if "..." not in term:
        if len(letters) != ndim:
            raise ShapeError(at(f"einsum: operand {k} has {ndim} dimension(s), the term {term!r} of {equation!r} "
                                f"names {len(letters)}"))
        return list(letters)
    extra = ndim - len(letters)
    if extra < 0:
        raise ShapeError(at(f"einsum: operand {k} has {ndim} dimension(s), fewer than the term {term!r} of "
                            f"{equation!r} names"))
    head, tail = term.split("...")
    return [*head, *_SPARE[width - extra:width], *tail]


@composed("einsum")
def einsum(equation: str, *operands: Any) -> Tensor:
    """Einstein summation as torch.einsum: ``einsum("bqd,bkd->bqk", q, k)``; ``...`` broadcasts like numpy;
    without ``->`` the output is the letters used once, in alphabetical order; a letter repeated within a term
    reads the diagonal; a letter of size 1 broadcasts against the same letter elsewhere."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise ShapeError(at("einsum: needs at least one operand"))
    xs = [_operand(x, "einsum") for x in operands]
    terms, rhs = _parse(equation, len(xs))
    width = max((x.ndim - len(t.replace("...", "")) for t, x in zip(terms, xs) if "..." in t), default=0)
    subs = [_expand_ellipsis(t, x.ndim, width, equation, k) for k, (t, x) in enumerate(zip(terms, xs))]
    spare = _SPARE[:width]
    if rhs is None:
        once = sorted(c for c in {c for s in subs for c in s} - set(spare) if sum(s.count(c) for s in subs) == 1)
        out = [*[c for c in spare if any(c in s for s in subs)], *once]
    else:
        out = _expand_ellipsis(rhs, len(rhs.replace("...", "")) + width if "..." in rhs else len(rhs), width,
                               equation, len(xs))
        if len(set(out)) != len(out):
            raise ShapeError(at(f"einsum: the output of {equation!r} names a subscript twice"))
        unknown = [c for c in out if not any(c in s for s in subs)]
        if unknown:
            raise ShapeError(at(f"einsum: output subscript {unknown[0]!r} of {equation!r} is not in any operand"))
    for k in range(len(xs)):
        xs[k], subs[k] = _diagonal(xs[k], subs[k], equation, k)
    _check_sizes(subs, xs, equation)

    acc, acc_subs = xs[0], subs[0]
    for k in range(1, len(xs)):
        later = {c for s in subs[k + 1:] for c in s} | set(out)
        acc, acc_subs = _sum_unused(acc, acc_subs, set(subs[k]) | later)
        rhs_x, rhs_subs = _sum_unused(xs[k], subs[k], set(acc_subs) | later)
        acc, acc_subs = _contract(acc, acc_subs, rhs_x, rhs_subs, later)
    acc, acc_subs = _sum_unused(acc, acc_subs, set(out))
    return acc.permute(*[acc_subs.index(c) for c in out]) if acc_subs != out else acc


def _diagonal(x: Tensor, s: list[str], equation: str, k: int) -> tuple[Tensor, list[str]]:
    """A letter repeated within one term reads the diagonal: the elements where its axes' indices agree (a mask
    and a sum, so the gradient lands on the diagonal alone)."""
    while len(set(s)) != len(s):
        c = next(c for c in s if s.count(c) > 1)
        p = s.index(c)
        q = s.index(c, p + 1)
        if int(x.shape[p]) != int(x.shape[q]):
            raise ShapeError(at(f"einsum: subscript {c!r} repeats in operand {k}'s term of {equation!r} over axes "
                                f"of sizes {int(x.shape[p])} and {int(x.shape[q])} (operand {fmt_shape(x.shape)})"))
        n = x.shape[p]
        at_p = arange(n).reshape(*[n if a == p else 1 for a in range(x.ndim)])
        at_q = arange(n).reshape(*[n if a == q else 1 for a in range(x.ndim)])
        x = where(at_p == at_q, x, 0).sum(q)
        s = s[:q] + s[q + 1:]
    return x, s


def _check_sizes(subs: list[list[str]], xs: list[Tensor], equation: str) -> None:
    """A subscript has one size wherever it appears, but a size 1 broadcasts (torch's rule, letters and ``...``
    alike)."""
    sizes: dict[str, Any] = {}
    for k, (s, x) in enumerate(zip(subs, xs)):
        for c, d in zip(s, x.shape):
            if c not in sizes or int(sizes[c]) == 1:
                sizes[c] = d
            elif int(sizes[c]) != int(d) and int(d) != 1:
                what = "a dimension of '...'" if c in _SPARE else f"subscript {c!r}"
                shapes = ", ".join(fmt_shape(y.shape) for y in xs)
                raise ShapeError(at(f"einsum: {what} of {equation!r} is {int(sizes[c])} in an earlier operand and "
                                    f"{int(d)} in operand {k} (operands {shapes})"))


def _sum_unused(x: Tensor, s: list[str], needed: set[str]) -> tuple[Tensor, list[str]]:
    axes = tuple(k for k, c in enumerate(s) if c not in needed)
    return (x.sum(axes), [c for c in s if c in needed]) if axes else (x, s)


def _contract(a: Tensor, sa: list[str], b: Tensor, sb: list[str], later: set[str]) -> tuple[Tensor, list[str]]:
    """``a`` and ``b`` as one batched matmul over the letters they share that nothing after reads. A shared letter
    of size 1 on one side broadcasts: kept, the other side's size; contracted, the other side is summed over it
    first (torch's order: ``x * sum(y)``, not a sum of products with a repeated ``x``)."""
    shared = [c for c in sa if c in sb]
    for c in shared:
        i, j = sa.index(c), sb.index(c)
        if int(a.shape[i]) == int(b.shape[j]):
            continue
        if c in later:
            a = a.expand(*[b.shape[j] if p == i else d for p, d in enumerate(a.shape)]) if int(a.shape[i]) == 1 else a
            b = b.expand(*[a.shape[i] if p == j else d for p, d in enumerate(b.shape)]) if int(b.shape[j]) == 1 else b
        elif int(a.shape[i]) == 1:
            b = b.sum(j, keepdims=True)
        else:
            a = a.sum(i, keepdims=True)
    batch = [c for c in shared if c in later]
    k = [c for c in shared if c not in later]
    rows = [c for c in sa if c not in sb]
    cols = [c for c in sb if c not in sa]
    size = {**dict(zip(sa, a.shape)), **dict(zip(sb, b.shape))}

    def laid_out(x: Tensor, s: list[str], order: list[str], groups: list[list[str]]) -> Tensor:
        if order != s:
            x = x.permute(*[s.index(c) for c in order])
        return x.reshape(*[size[c] for c in batch], *[math.prod(size[c] for c in g) for g in groups])

    y = laid_out(a, sa, [*batch, *rows, *k], [rows, k]) @ laid_out(b, sb, [*batch, *k, *cols], [k, cols])
    return y.reshape(*[size[c] for c in [*batch, *rows, *cols]]), [*batch, *rows, *cols]
