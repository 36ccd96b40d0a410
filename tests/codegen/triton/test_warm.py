"""Compiling a program's kernels in parallel before its first launch (``codegen/triton/warm.py``), against
stand-ins for Triton's kernels and its AsyncCompileMode: every kernel the program launches is asked to compile,
with its first launch's own arguments, grid and meta-parameters, once however often a host loop launches it,
inside the mode (which hands compiles to a pool), and nothing is launched; an empty grid is skipped; a pass that
fails is logged and reported, not raised. A generated program takes the launcher (``run(..., launch=...)``); on
the interpreter nothing is precompiled."""

from __future__ import annotations

import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from nnforge.codegen.triton.warm import precompile


class _Kernel:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def warmup(self, *args, grid, **meta):
        self.log.append(("warmup", self.name, args, grid, meta))

    def __getitem__(self, grid):
        raise AssertionError("a kernel was launched by the compile pass")


def _mode(events: list):
    @contextlib.contextmanager
    def mode(pool):
        assert isinstance(pool, ThreadPoolExecutor)
        events.append("enter")
        yield
        events.append("exit")
    return mode


def _program(log: list):
    k0, k1 = _Kernel("k0", log), _Kernel("k1", log)

    def run(ins, data, outs, S, dev, seed=0, launch=None):
        launch(k1, (0,), outs[0], 0, S[0], ROWS=16)  # an empty result first: nothing to compile, k1 still asked later
        launch(k0, (4,), ins[0], outs[0], S[0], BLOCK=128, num_warps=4)
        for t in range(S[0]):
            launch(k1, (2, 1), outs[0], t, S[0], ROWS=16)
    return run


def test_every_launch_compiles_and_nothing_runs():
    log: list = []
    events: list = []
    assert precompile(_program(log), ["x"], [], ["y"], [3], "cuda", mode=_mode(events), workers=2)
    assert events == ["enter", "exit"]
    assert log[0] == ("warmup", "k0", ("x", "y", 3), (4,), {"BLOCK": 128, "num_warps": 4})
    assert [entry[1] for entry in log] == ["k0", "k1"]  # each kernel once, though the loop launches k1 3 times
    assert log[1] == ("warmup", "k1", ("y", 0, 3), (2, 1), {"ROWS": 16})


def test_a_failed_pass_is_reported_not_raised(caplog: pytest.LogCaptureFixture):
    def run(ins, data, outs, S, dev, seed=0, launch=None):
        raise RuntimeError("no such kernel option")

    with caplog.at_level(logging.WARNING, logger="nnforge.codegen"):
        assert not precompile(run, [], [], [], [], "cuda", mode=_mode([]))
    assert "compiling the kernels ahead in parallel failed" in caplog.text and "no such kernel option" in caplog.text


def test_generated_programs_take_the_launcher_and_the_interpreter_skips_the_pass(rng: np.random.Generator):
    import nnforge as nf
    from nnforge.codegen.triton import TritonBackend, interpreted

    if not (TritonBackend().available and interpreted()):
        pytest.skip("the interpreter's programs run on the CPU")
    x = rng.standard_normal((5, 3)).astype(np.float32)
    program = TritonBackend()(nf.compile(lambda v: (v * 2.0).sum(0)).trace(x))
    assert not program._compile_ahead
    seen: list = []
    out = np.empty(3, np.float32)
    program.module.run([program._torch.from_numpy(x)], [], [program._torch.from_numpy(out)], [], "cpu",
                       launch=lambda kernel, grid, *a, **m: seen.append(kernel.fn.__name__))
    assert seen and all(name.startswith("k") for name in seen)
