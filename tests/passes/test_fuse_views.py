"""Views a GEMM reads without a copy: a reshape of a computed product seen through two permutes, each read by a
GEMM (an attention's query heads, read by the scores' product and, in training, by a gradient's), is one stored
buffer the views index; so is elementwise work one GEMM reads as it is and another transposed, and a row
statistic broadcast along its rows is read where it is stored, not written out whole."""

from __future__ import annotations

import contextlib
import io

import numpy as np

import nnforge as nf
import nnforge.nn.functional as F

L, N, H, D = 5, 3, 2, 4


def _kernels(fn, args: list, backend: str) -> tuple[list[str], str]:
    """``fn`` on ``backend`` checked against the reference, and the kernels of its schedule (their kinds) with its
    text; none on the reference backend."""
    got = nf.compile(fn, backend=backend)(*args)
    for g, w in zip(got, nf.compile(fn)(*args)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    if backend == "reference":
        return [], ""
    with contextlib.redirect_stdout(io.StringIO()):
        text = nf.show(nf.compile(fn, backend=backend), *args, stage="scheduled")
    return [line.strip().split(" -> ")[0] for line in text.splitlines()[1:] if " -> " in line], text


def _heads_twice(a, w, b, c):
    """``(a @ w) * 0.5`` split into heads, read by one batch of GEMMs as ``[N, H, L, D]`` (an attention's scores)
    and by another as ``[N, H, D, L]`` (the keys' gradient)."""
    r = ((a @ w) * 0.5).reshape(L, N, H, D)
    return r.permute(1, 2, 0, 3) @ b, r.permute(1, 2, 3, 0) @ c


def test_two_permuted_views_of_a_reshaped_product_are_read_in_place(backend: str, rng: np.random.Generator):
    """Before, the second view decided (the first in the program) found the reshape already stored as an alias
    of the product and was copied for its GEMM; it is a view of that buffer. Values against the reference on every
    backend; on the compiled ones the product, its epilogue and the two GEMMs are the only kernels."""
    args = [rng.standard_normal(s).astype(np.float32) for s in ((L * N, 6), (6, H * D), (N, H, D, 3), (N, H, L, 2))]
    kernels, text = _kernels(_heads_twice, args, backend)
    assert backend == "reference" or kernels == ["gemm+mul", "gemm", "gemm"], text


def _probabilities_twice(x, v, g):
    """Elementwise work read by one GEMM as it is and by another transposed (an attention's probabilities: by
    ``p @ v``, and by the gradient of v, ``p.T @ g``)."""
    p = (x * 0.5).exp()
    return p @ v, p.transpose(-1, -2) @ g


def test_a_transposed_view_of_work_stored_for_another_gemm_is_read_in_place(backend: str,
                                                                            rng: np.random.Generator):
    """Walking back from the results, the transposed view was decided before the work it reads was found to need
    a buffer (for the other GEMM), and was copied; it is a view of that buffer now (an encoder layer's input
    gradient: 51 -> 50 kernels on the CPU, 30 -> 29 on Triton)."""
    args = [rng.standard_normal(s).astype(np.float32) for s in ((2, 5, 5), (2, 5, 3), (2, 5, 4))]
    kernels, text = _kernels(_probabilities_twice, args, backend)
    assert backend == "reference" or kernels == ["mul+exp", "gemm", "gemm"], text


def _norm_and_gradient(x, g, b):
    """A layer norm and its input's gradient: the 1 / std broadcast along the rows is read by the output's kernel
    and the gradient's."""
    def loss(x, g, b):
        return (F.layer_norm(x, (x.shape[-1],), g, b) ** 2).sum()

    return F.layer_norm(x, (x.shape[-1],), g, b), nf.grad(loss)(x, g, b)


def test_a_broadcast_of_a_row_statistic_stored_later_is_not_stored_whole(backend: str, rng: np.random.Generator):
    """Walking back from the results, the broadcast of a layer norm's 1 / std was decided (readers in two kernels:
    stored) before the 1 / std itself was found to need a buffer, and was written out as a whole [rows, d] array;
    it is a view of the [rows, 1] buffer now, indexed by both kernels (an encoder layer's input gradient:
    50 -> 48 kernels on the CPU, 29 -> 28 on Triton)."""
    args = [rng.standard_normal(s).astype(np.float32) for s in ((6, 16), (16,), (16,))]
    kernels, text = _kernels(_norm_and_gradient, args, backend)
    assert "copy" not in kernels, text
