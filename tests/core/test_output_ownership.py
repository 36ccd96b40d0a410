"""A compiled function's outputs are arrays of their own on every backend: writing into one changes neither the
caller's input nor another output (the reference interpreter handed back inputs, views of them and one array for
outputs merged into one node)."""

from __future__ import annotations

import numpy as np
import torch

import nnforge as nf


def test_outputs_share_memory_with_no_input_and_no_other_output(backend: str, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 3)).astype(np.float32)
    kept = x.copy()
    flat, same, twice, head = nf.compile(lambda v: (v.reshape(-1), v, v * 2, v[1:]), backend=backend)(x)
    for out in (flat, same, twice, head):
        out += 1
    np.testing.assert_array_equal(x, kept)
    a, b = nf.compile(lambda v: (v * 2, v * 2), backend=backend)(x)
    a += 1
    np.testing.assert_array_equal(b, kept * 2)
    t = torch.from_numpy(x.copy())
    nf.compile(lambda v: v[1:], backend=backend)(t).add_(1)
    np.testing.assert_array_equal(t.numpy(), kept)


def test_a_captured_constant_comes_back_writable(backend: str, rng: np.random.Generator) -> None:
    c = nf.tensor(rng.standard_normal(3).astype(np.float32))
    out = nf.compile(lambda: c, backend=backend)()
    out += 1  # a read-only array raised ValueError here
    np.testing.assert_array_equal(out, c.numpy() + 1)
