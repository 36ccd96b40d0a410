"""A concat in the C backend: along an inner axis its parts are written inside one loop nest over the axes before
it (each iteration writes a whole row of the result: an im2col reads its input once, not once per tap), along
the first axis or over a few rows each part has a loop nest of its own; values on every backend against numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c import GemmConfig, lower, prepare


def _parts(a, b, c, axis):
    return nf.concat([nf.tanh(a), b * 2.0, c[:, :, ::2]], axis)


@pytest.mark.parametrize("axis,rows,nests", [(0, 8, 2), (1, 8, 1), (2, 8, 1), (1, 2, 2)])
def test_concat_parts_share_the_outer_loops(backend: str, rng: np.random.Generator, axis: int, rows: int,
                                            nests: int) -> None:
    """``nests`` work-shared loop nests: one along an inner axis with at least ``FEW_ROWS`` rows before it, else
    one per part that is not empty."""
    shapes = [[rows, 4, 5], [rows, 4, 5], [rows, 4, 10]]
    for s, w in zip(shapes, (2, 0, 3)):  # parts of widths 2, 0 (no loop at all) and 3 along the axis
        s[axis] = w * (2 if s is shapes[2] and axis == 2 else 1)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    got = nf.compile(lambda a, b, c: _parts(a, b, c, axis), backend=backend)(a, b, c)
    want = np.concatenate([np.tanh(a), b * 2.0, c[:, :, ::2]], axis)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    cfg = GemmConfig()
    text = lower(prepare(nf.compile(lambda a, b, c: _parts(a, b, c, axis)).trace(a, b, c), cfg), cfg).text
    body = text[text.index("nf_part0("):]
    body = body[:body.index("\n}\n")]
    assert len(re.findall(r"#pragma omp for", body)) == nests, body
