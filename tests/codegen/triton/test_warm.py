"""Compiling a program's kernels in parallel before its first launch (``codegen/triton/warm.py``), against stand-ins for
Triton's kernels and its AsyncCompileMode: every kernel the program launches is asked to compile, with its first
launch's own arguments, grid and meta-parameters, once however often a host loop launches it, inside the mode (which
hands compiles to a pool), and nothing is launched; an empty grid is skipped; a pass that fails is logged and
reported, not raised; after the compiles, the kernels' launchers are built on the pool, once per signature, one that
fails left to its first launch. A generated program takes the launcher (``run(..., launch=...)``); on the interpreter
nothing is precompiled."""

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


class _Compiled:
    """A compiled kernel as Triton hands it back: its source's signature and constants, its metadata."""

    def __init__(self, name: str, signature: dict, constants: dict):
        self.name = name
        self.src = type("Src", (), {"signature": signature, "constants": constants})()
        self.metadata = type("Meta", (), {"tensordesc_meta": None})()


class _Future:
    def __init__(self, kernel: _Compiled, events: list):
        self.kernel, self.events = kernel, events

    def result(self) -> _Compiled:
        self.events.append(("result", self.kernel.name))
        return self.kernel


def test_launchers_are_built_on_the_pool_once_per_signature():
    import threading

    events: list = []
    ptr2 = {"x": "*fp16", "y": "*fp16", "n": "i32"}
    kernels = {"k0": _Compiled("k0", ptr2, {}),
               "k1": _Compiled("k1", {"x": "*fp32", "y": "*fp16", "n": "i32"}, {}),  # alike: one launcher
               "k2": _Compiled("k2", ptr2 | {"n": "constexpr"}, {("n",): 1}),  # a constant: its own launcher
               "k3": _Compiled("k3", {"x": "*fp32", "n": "i64"}, {})}

    class Kernel:
        def __init__(self, name: str):
            self.name = name

        def warmup(self, *args, grid, **meta):
            events.append(("warmup", self.name))
            return _Future(kernels[self.name], events)

    launched = {name: Kernel(name) for name in kernels}

    def run(ins, data, outs, S, dev, seed=0, launch=None):
        for name in ("k0", "k1", "k2", "k3", "k1"):
            launch(launched[name], (2,), ins[0])

    main = threading.get_ident()
    built: list = []

    def launcher(kernel: _Compiled) -> object:
        built.append((kernel.name, threading.get_ident() != main))
        return object()

    assert precompile(run, ["x"], [], [], [], "cuda", mode=_mode(events), workers=2, launcher=launcher)
    assert events.index("exit") < events.index(("result", "k0"))  # built after every compile has finished
    assert sorted(name for name, _ in built) == ["k0", "k2", "k3"]  # k1 shares k0's, asked once though launched twice
    assert all(on_pool for _, on_pool in built)


def test_a_launcher_that_fails_is_left_to_the_first_launch(caplog: pytest.LogCaptureFixture):
    kernel = _Compiled("k0", {"x": "*fp32"}, {})

    class Kernel:
        def warmup(self, *args, grid, **meta):
            return kernel

    def run(ins, data, outs, S, dev, seed=0, launch=None):
        launch(Kernel(), (1,), ins[0])

    def launcher(k: _Compiled) -> object:
        raise OSError("gcc: not found")

    with caplog.at_level(logging.INFO, logger="nnforge.codegen"):
        assert precompile(run, ["x"], [], [], [], "cuda", mode=_mode([]), launcher=launcher)
    assert "the launcher of k0 was not built ahead (OSError: gcc: not found)" in caplog.text
    assert "1 kernels compiled ahead" in caplog.text and "0 launchers built" in caplog.text
