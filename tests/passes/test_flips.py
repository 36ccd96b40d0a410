"""``scans_of_flipped_sequences``: a layer that runs backwards by flipping its sequence (``lstm(x.flip(0)).flip(0)``,
Bonito's RNN wrapper) becomes a reversed scan over the sequence itself, with no flip left to copy."""

from __future__ import annotations

import numpy as np
import pytest
from test_row_split import lstm

import nnforge as nf
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.reference import ReferenceProgram
from nnforge.codegen.triton.target import triton_target
from nnforge.ir.builders import flipped_axes
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.scans import scans_of_flipped_sequences


def _args(rng: np.random.Generator, T: int = 6, N: int = 4, H: int = 5) -> list[np.ndarray]:
    return [rng.standard_normal(s) * 0.5 for s in ((T, N, H), (N, H), (N, H), (4 * H, H), (4 * H, H), (4 * H,))]


def _stack(x, h0, c0, w_ih, w_hh, b):
    """Three layers alternating direction, each reversed one by flipping around a forward scan."""
    for reverse in (True, False, True):
        x = lstm(x.flip(0), h0, c0, w_ih, w_hh, b)[1].flip(0) if reverse else lstm(x, h0, c0, w_ih, w_hh, b)[1]
    return x


def _training(x, h0, c0, w_ih, w_hh, b):
    return nf.grad(lambda x, w: (_stack(x, h0, c0, w, w_hh, b) ** 2).sum(), argnums=(0, 1))(x, w_ih)


def _flips(graph) -> list:
    return [n for n in graph.order if flipped_axes(n) is not None]


@pytest.mark.parametrize("target", [cpu_target, triton_target])
@pytest.mark.parametrize("fn", [_stack, _training])
def test_flipped_layers_run_as_reversed_scans(rng: np.random.Generator, fn, target) -> None:
    """After the passes no flip is left and the layers' scans alternate direction as written; the forward and the
    gradients are the unoptimized graph's in float64."""
    args = _args(rng)
    graph = nf.compile(fn).trace(*args)
    before = run_pipeline(graph, [p for p in pipeline(target()) if p[0] != "scans_of_flipped_sequences"])
    after = run_pipeline(graph, pipeline(target()))
    assert _flips(before) and not _flips(after)
    directions = [n.attrs["reverse"] for n in after.order if n.op == Op.SCAN]
    assert directions[:3] == [True, False, True]
    for got, want in zip(ReferenceProgram(after)(args), ReferenceProgram(graph)(args)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_compiled_on_every_backend(backend: str, rng: np.random.Generator) -> None:
    args = _args(rng)
    want = ReferenceProgram(nf.compile(_training).trace(*args))(args)
    for got, w in zip(nf.compile(_training, backend=backend)(*args), want):
        np.testing.assert_allclose(np.asarray(got), w, rtol=1e-11, atol=1e-12)


def test_a_scan_with_one_sequence_not_flipped_is_left_alone(rng: np.random.Generator) -> None:
    """Both sequences must be flipped: a scan reading one in order and one reversed pairs each step with the
    other's mirror, which no direction of the scan gives."""
    def pairs(x, y):
        return nf.scan(lambda c, xy: (c + xy[0] * xy[1], c), x[0] * 0, (x.flip(0), y))[1]

    args = [rng.standard_normal((5, 3)), rng.standard_normal((5, 3))]
    graph = nf.compile(pairs).trace(*args)
    assert scans_of_flipped_sequences(graph) is graph


def test_simplify_folds_a_flip_of_a_flip(rng: np.random.Generator) -> None:
    from nnforge.passes import simplify

    x = rng.standard_normal((4, 3, 2))
    graph = nf.compile(lambda v: v.flip((0, 2)).flip((2, 0)) * 2 + v.flip(1).flip(0)).trace(x)
    folded = simplify(graph)
    assert len(_flips(folded)) == 2  # the first pair cancels; flips of other axes stay
    np.testing.assert_allclose(ReferenceProgram(folded)([x])[0], x * 2 + x[::-1, ::-1], rtol=1e-15)
