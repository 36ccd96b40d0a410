"""``merge_augmented_scans``: a differentiated scan's forward recurrence runs once — the loss reads the copy that
autodiff augments with the stacked carries — also when tracing rebuilt both (a module's parameters captured as
inputs, ``loss.backward()`` inside the compiled function) and when one layer's copy reads another's results; and
the compiled-code passes that rewrite scans keep one scan per recurrence."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

import nnforge as nf
import nnforge.nn as nn
from nnforge.codegen.c.target import cpu_target
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline


def test_a_module_training_step_runs_each_forward_recurrence_once(rng: np.random.Generator, backend: str) -> None:
    torch.manual_seed(int(rng.integers(1 << 31)))
    ref = torch.nn.LSTM(6, 8, num_layers=2)
    rnn = nn.LSTM(6, 8, num_layers=2)
    rnn.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    params = list(rnn.parameters())

    @nf.compile(backend=backend)
    def step(x):
        for p in params:
            p.grad = None
        loss = (rnn(x)[0] ** 2).sum()
        loss.backward()
        return loss, [p.grad for p in params]

    x = rng.standard_normal((16, 12, 6)).astype(np.float32)
    graph = step.trace(x)
    scans = [n for n in graph.order if n.op == Op.SCAN]
    forward = [n for n in scans if not n.attrs["reverse"]]
    assert len(scans) == 4 and len(forward) == 2  # two layers: one forward and one backward scan each
    # h, c, ys, the stacked h and c each step starts from, and each step's h @ W_hh.T (saved for the backward)
    assert all(len(n.types) == 6 for n in forward)
    for target in (cpu_target(), replace(cpu_target(), reduction_hoist_bytes=0)):  # dW_hh in the loop, or after
        compiled = run_pipeline(graph, pipeline(target))
        assert sum(n.op == Op.SCAN for n in compiled.order) == 4, target
        for scan in (n for n in compiled.order if n.op == Op.SCAN):  # dG stacked once (``dce``), not per reader
            ys = scan.attrs["body"].outputs[scan.attrs["n_carry"]:]
            assert len({id(y) for y in ys}) == len(ys), (target, [y.op for y in ys])
    loss, grads = step(x)
    t_loss = (ref(torch.from_numpy(x))[0] ** 2).sum()
    t_loss.backward()
    np.testing.assert_allclose(loss, t_loss.item(), rtol=2e-5)
    for (name, p), g in zip(ref.named_parameters(), grads):
        np.testing.assert_allclose(g, p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
