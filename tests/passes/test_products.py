"""``sums_of_products``: a sum over the batch axes of a batched product is one GEMM with the batch folded into the
contraction — the weight gradient of a projection shared by every step, and the general form.
``transposed_products``: a product read only transposed is computed transposed.
``products_of_stacked_rows``: a product with a concatenation of rows is a sum of products with its parts.
``normalized_products``: a product of rows divided by one number each is the product divided."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn
from nnforge.codegen.c import fused_listing
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.reference import ReferenceProgram
from nnforge.ir.builders import is_transpose
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.products import normalized_products, products_of_stacked_rows, sums_of_products


def _batched_sums(g) -> list:
    return [n for n in g.order if n.op == Op.SUM and n.srcs[0].op == Op.MATMUL and n.srcs[0].ndim > 2]


def _weight_grad(x, w, g):
    """d/dW of sum((x @ W) * g): autodiff gives sum_t x_tᵀ @ g_t, a batched product summed over T."""
    return nf.grad(lambda w: ((x @ w) * g).sum())(w)


def test_the_weight_gradient_of_a_shared_projection_becomes_one_gemm(rng: np.random.Generator) -> None:
    x, w, g = (rng.standard_normal(s) for s in ((7, 5, 6), (6, 4), (7, 5, 4)))
    graph = nf.compile(_weight_grad).trace(x, w, g)
    assert _batched_sums(graph)  # what autodiff gives
    after = run_pipeline(graph, pipeline(cpu_target()))
    assert not _batched_sums(after)
    (mm,) = [n for n in after.order if n.op == Op.MATMUL]
    assert [int(d) for d in mm.srcs[0].shape] == [6, 35] and mm.srcs[0].op == Op.PERMUTE  # xᵀ read as a view
    got = ReferenceProgram(after)([x, w, g])[0]
    np.testing.assert_allclose(got, np.einsum("tnk,tnm->km", x, g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("batch", [(3,), (2, 3)])
def test_general_operands_and_several_batch_axes(rng: np.random.Generator, batch: tuple, keepdims: bool) -> None:
    a, c = rng.standard_normal((*batch, 4, 5)), rng.standard_normal((*batch, 5, 2))
    axes = tuple(range(len(batch)))

    def f(a, c):
        return (a @ c).sum(axes, keepdims=keepdims)

    graph = nf.compile(f).trace(a, c)
    after = sums_of_products(graph)
    assert _batched_sums(graph) and not _batched_sums(after)
    want = torch.from_numpy(a).matmul(torch.from_numpy(c)).sum(axes, keepdim=keepdims).numpy()
    got = ReferenceProgram(after)([a, c])[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_product_read_elsewhere_or_partly_summed_stays(rng: np.random.Generator) -> None:
    a, c = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 2))

    def also_read(a, c):
        p = a @ c
        return p.sum(0), p * 2

    def over_rows(a, c):
        return (a @ c).sum(1)

    for f in (also_read, over_rows):
        graph = nf.compile(f).trace(a, c)
        assert sums_of_products(graph) is graph


def test_compiled_training_gradients_match_torch(backend: str, rng: np.random.Generator) -> None:
    """The rewritten gradient on every backend, against torch (float32: 1e-5 relative over K = T * N = 48 terms)."""
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((8, 6, 7), (7, 9), (8, 6, 9)))
    got = nf.compile(_weight_grad, backend=backend)(x, w, g)
    tw = torch.from_numpy(w).requires_grad_()
    ((torch.from_numpy(x) @ tw) * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(got, tw.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_a_computed_operand_is_stored_once_and_read_through_its_transpose(backend: str,
                                                                          rng: np.random.Generator) -> None:
    """``x_flatᵀ`` of a computed x (a conv's columns, an activation): x is stored in its own layout and the GEMM
    reads the transpose as a view, where the kernel computing x used to write a transposed copy of it."""
    x, w, g = (rng.standard_normal(s) for s in ((7, 5, 6), (6, 4), (7, 5, 4)))

    def f(x, w, g):
        return _weight_grad(nf.tanh(x), w, g)

    listing = fused_listing(nf.compile(f).trace(x, w, g))
    assert "f64[7, 5, 6] fuses [tanh]" in listing and "f64[6, 35]" not in listing, listing
    got = nf.compile(f, backend=backend)(x, w, g)
    np.testing.assert_allclose(got, np.einsum("tnk,tnm->km", np.tanh(x), g), rtol=1e-12, atol=1e-12)


def _adam_step(backend: str, rng: np.random.Generator):
    """A linear layer's compiled training step with Adam, and its input."""
    import nnforge.nn as nn

    nf.manual_seed(int(rng.integers(1 << 31)))
    lin = nn.Linear(8, 4)
    opt = nn.optim.Adam(lin.parameters(), lr=1e-2)

    @nf.compile(backend=backend)
    def step(x):
        opt.zero_grad()
        loss = (lin(x) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    return lin, step, rng.standard_normal((16, 8)).astype(np.float32)


def test_a_weight_gradient_is_stored_in_the_weights_layout(rng: np.random.Generator) -> None:
    """``transposed_products``: the gradient of ``x @ Wᵀ`` is ``gᵀ @ x`` [out, in], so Adam's moments, the update and
    ``.grad`` read it where it is; it was ``(xᵀ @ g)ᵀ``, and each reader ran in the product's layout and was copied."""
    _, step, x = _adam_step("cpu", rng)
    text = nf.show(step, x, stage="scheduled")
    assert "gemm -> out" in text and "copy" not in text, text
    after = run_pipeline(step.trace(x), pipeline(cpu_target()))
    assert not [n for n in after.order if n.op == Op.PERMUTE and n.srcs[0].op == Op.MATMUL]


def test_the_swapped_product_and_a_swapped_sum_of_products(rng: np.random.Generator) -> None:
    from nnforge.passes.products import transposed_products

    x, g, y, h, k = (rng.standard_normal(s) for s in ((6, 3), (6, 5), (4, 3), (4, 5), (6, 5)))

    def f(x, g, y, h, k):
        return (x.T @ g).T * 2.0, ((x.T @ k) + (y.T @ h)).T + 1.0

    graph = nf.compile(f).trace(x, g, y, h, k)
    after = transposed_products(graph)
    assert not [n for n in after.order if n.op == Op.PERMUTE and n.srcs[0].op in (Op.MATMUL, Op.ADD)]
    got = ReferenceProgram(after)([x, g, y, h, k])
    np.testing.assert_allclose(got[0], 2 * (g.T @ x), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got[1], k.T @ x + h.T @ y + 1, rtol=1e-12, atol=1e-12)

    def read_both_ways(x, g):
        p = x.T @ g
        return p.T * 2.0, p + 1.0

    both = nf.compile(read_both_ways).trace(x, g)
    assert transposed_products(both) is both  # computing it once each way would be a second GEMM


def test_compiled_adam_steps_match_the_reference_interpreter(backend: str, rng: np.random.Generator) -> None:
    """Three steps of the rewritten training step on every backend, against the interpreter's (float32 Adam over
    K = 16 rows: 1e-5)."""
    ref_lin, ref_step, x = _adam_step("reference", np.random.default_rng(7))
    lin, step, _ = _adam_step(backend, np.random.default_rng(7))
    for _ in range(3):
        np.testing.assert_allclose(step(x), ref_step(x), rtol=1e-5, atol=1e-6)
    for a, b in zip(lin.parameters(), ref_lin.parameters()):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5, atol=1e-6)


def _stacked_rows(left, a, b, c):
    """``left`` times the rows of ``a``, ``b`` (one step of them, a row added in front) and ``c`` stacked."""
    return left @ nf.concat([a, b[None], c[1:]], axis=0).reshape(-1, a.shape[-1])


def test_a_product_with_stacked_rows_is_a_sum_of_products_with_the_parts(rng: np.random.Generator) -> None:
    """Three parts, each read through views (``b`` without its added axis, ``c`` from its second step): no
    concatenation is left, each product reads its part's rows and the matching columns of ``left``, the longest
    part's product first; the values are numpy's."""
    left, a, b, c = (rng.standard_normal(s) for s in ((4, 24), (2, 3, 5), (3, 5), (6, 3, 5)))
    graph = nf.compile(_stacked_rows).trace(left, a, b, c)
    after = products_of_stacked_rows(graph)
    assert [n for n in graph.order if n.op == Op.CONCAT] and not [n for n in after.order if n.op == Op.CONCAT]
    products = [n for n in after.order if n.op == Op.MATMUL]
    assert sorted(tuple(map(int, p.srcs[1].shape)) for p in products) == [(3, 5), (6, 5), (15, 5)]
    (last,) = [n for n in after.order if n.op == Op.ADD and n is after.outputs[0]]
    assert int(last.srcs[0].srcs[0].srcs[1].shape[0]) == 15  # ((c's + a's) + b's)
    want = left @ np.concatenate([a, b[None], c[1:]]).reshape(-1, 5)
    np.testing.assert_allclose(ReferenceProgram(after)([left, a, b, c])[0], want, rtol=1e-12, atol=1e-12)


def test_stacked_rows_read_otherwise_stay(rng: np.random.Generator) -> None:
    """A concatenation also returned, or multiplied as a left operand, is stored anyway: left alone."""
    left, a, b, c = (rng.standard_normal(s) for s in ((4, 24), (2, 3, 5), (3, 5), (6, 3, 5)))

    def returned(left, a, b, c):
        return _stacked_rows(left, a, b, c), nf.concat([a, b[None], c[1:]], axis=0)

    def as_left_operand(left, a, b, c):
        rows = nf.concat([a, b[None], c[1:]], axis=0).reshape(-1, 5)
        return left @ rows, rows.T @ left.T

    for f in (returned, as_left_operand):
        graph = nf.compile(f).trace(left, a, b, c)
        assert products_of_stacked_rows(graph) is graph, f.__name__


def _scaled_products(g) -> list:
    """Products whose left operand (or its transpose) is rows scaled by one number each."""
    def scaled(x):
        x = x.srcs[0] if is_transpose(x) else x
        e = x.srcs[1] if x.op in (Op.DIV, Op.MUL) else None
        return e is not None and e.op == Op.EXPAND and e.srcs[0].ndim == x.ndim and int(e.srcs[0].shape[-1]) == 1

    return [n for n in g.order if n.op == Op.MATMUL and scaled(n.srcs[0])]


def test_a_softmax_divides_the_product_it_feeds(backend: str, rng: np.random.Generator) -> None:
    """``softmax(q kᵀ) @ v``: the rows' division moves from the [.., T, T] probabilities to the [.., T, d]
    product (no probabilities stored), on every backend against torch."""
    q, k, v = (rng.standard_normal((2, 3, 6, 4)) for _ in range(3))

    def attention(q, k, v):
        return (q @ k.mT).softmax(-1) @ v

    graph = nf.compile(attention).trace(q, k, v)
    after = normalized_products(graph)
    assert _scaled_products(graph) and not _scaled_products(after)
    (division,) = [n for n in after.order if n.op == Op.DIV]
    assert division.srcs[0].op == Op.MATMUL and [int(d) for d in division.shape] == [2, 3, 6, 4]
    want = torch.softmax(torch.tensor(q) @ torch.tensor(k).mT, -1) @ torch.tensor(v)
    np.testing.assert_allclose(np.asarray(nf.compile(attention, backend=backend)(q, k, v)), want.numpy(),
                               rtol=1e-12, atol=1e-12)


def test_attention_gradients_store_no_probabilities(backend: str, rng: np.random.Generator) -> None:
    """In a training step ``pᵀ @ dO`` (V's gradient) becomes ``eᵀ @ (dO / s)`` as well: with both products
    rewritten the probabilities are stored nowhere; the value and gradients against torch on every backend."""
    q, k, v, weights = (rng.standard_normal((2, 3, 6, 4)) for _ in range(4))

    def loss(q, k, v):
        return (((q @ k.mT).softmax(-1) @ v) * weights).sum()

    step = nf.compile(nf.value_and_grad(loss, argnums=(0, 1, 2)), backend=backend)
    after = run_pipeline(nf.compile(nf.value_and_grad(loss, argnums=(0, 1, 2))).trace(q, k, v),
                         pipeline(cpu_target()))
    assert not _scaled_products(after)
    value, grads = step(q, k, v)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    want = ((torch.softmax(tq @ tk.mT, -1) @ tv) * torch.tensor(weights)).sum()
    want.backward()
    np.testing.assert_allclose(float(value), want.item(), rtol=1e-12)
    for g, t in zip(grads, (tq, tk, tv)):
        np.testing.assert_allclose(np.asarray(g), t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_a_scale_that_varies_along_the_contraction_or_a_half_precision_product_stays(
        rng: np.random.Generator) -> None:
    a, c, s = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 2)), rng.standard_normal((3, 1, 5))

    def per_column(a, c, s):  # s varies along k, the contracted axis: not a row's scale
        return (a / s) @ c

    def half(a, c, s):  # a @ c may overflow float16 where (a / s) @ c does not
        a = a.cast(nf.float16)
        return (a / a.sum(-1, keepdims=True)) @ c.cast(nf.float16)

    for f in (per_column, half):
        graph = nf.compile(f).trace(a, c, s)
        assert normalized_products(graph) is graph


def test_a_one_dimensional_concatenation_is_a_row_not_stacked_rows(backend: str, rng: np.random.Generator) -> None:
    """``u[:, None] @ concat([a, b])[None, :]`` joins columns of one row, which the split of a product over
    stacked rows must leave alone (it sliced the left operand's one column); an unbatched GRU cell's weight
    gradient is such a product."""
    u, a, b = (torch.tensor(rng.standard_normal(n), requires_grad=True) for n in (4, 5, 3))
    f = nf.compile(lambda u, a, b: u[:, None] @ nf.concat([a, b])[None, :], backend=backend)
    torch.testing.assert_close(torch.as_tensor(f(u.detach(), a.detach(), b.detach())),
                               torch.outer(u, torch.cat([a, b])).detach(), rtol=1e-12, atol=1e-12)
    cell, twin = nn.GRUCell(4, 5, bias=False).double(), torch.nn.GRUCell(4, 5, bias=False).double()
    twin.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in cell.state_dict().items()})
    x = rng.standard_normal(4)

    @nf.compile(backend=backend)
    def grads(x):
        cell.zero_grad()
        cell(x).square().sum().backward()
        return cell.weight_ih.grad, cell.weight_hh.grad

    twin(torch.tensor(x)).square().sum().backward()
    for got, want in zip(grads(x), (twin.weight_ih.grad, twin.weight_hh.grad)):
        torch.testing.assert_close(torch.as_tensor(np.asarray(got)), want, rtol=1e-10, atol=1e-12)
