"""CUDA graphs behind a Triton program (``codegen/triton/graphs.py``). On a CPU machine the cache's logic runs
against a stand-in for torch whose graphs record the program's work while capturing and redo it on replay, on
tensors whose memory is a numpy array: the first call at given sizes runs the program and captures it, later calls
copy inputs into the graph's own tensors, replay and copy the outputs out (each result right for its own inputs),
new sizes capture anew, the least recently used graph is dropped, and a capture that fails leaves the program
running uncaptured. On a GPU the same against real graphs of a host-loop scan, bit for bit against the program
run without them."""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import numpy as np
import pytest

from nnforge.codegen.triton.graphs import CudaGraphs


class _Tensor:
    def __init__(self, a: np.ndarray):
        self.a = a

    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)

    def copy_(self, other: _Tensor) -> _Tensor:
        self.a[...] = other.a
        return self


class _Graph:
    def __init__(self):
        self.work: list = []

    def replay(self) -> None:
        for w in self.work:
            w()


class _Cuda:
    def __init__(self, fail: bool):
        self.capturing: _Graph | None = None
        self.fail = fail
        self.CUDAGraph = _Graph

    @contextlib.contextmanager
    def graph(self, g: _Graph, capture_error_mode: str = "global"):
        assert capture_error_mode == "thread_local"
        self.capturing = g
        try:
            yield
            if self.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
        finally:
            self.capturing = None


class _Torch:
    def __init__(self, fail: bool = False):
        self.cuda = _Cuda(fail)

    @staticmethod
    def empty_like(t: _Tensor) -> _Tensor:
        return _Tensor(np.full_like(t.a, np.nan))


def _program(api: _Torch):
    """out = in * 2 + S[0], its scratch allocated per run as the generated code does; runs counted."""
    runs = {"eager": 0, "captured": 0}

    def run(ins, data, outs, S, dev, seed):
        scratch = _Tensor(np.empty_like(ins[0].a))

        def work() -> None:
            scratch.a[...] = ins[0].a * 2
            outs[0].a[...] = scratch.a + S[0]

        if api.cuda.capturing is not None:
            api.cuda.capturing.work.append(work)
            runs["captured"] += 1
        else:
            work()
            runs["eager"] += 1

    return run, runs


def _call(graphs: CudaGraphs, x: np.ndarray, size: int) -> np.ndarray:
    out = _Tensor(np.empty_like(x))
    graphs([_Tensor(x.copy())], [], [out], [size], "cuda")
    return out.a


def test_calls_replay_one_graph_per_sizes(rng: np.random.Generator):
    api = _Torch()
    run, runs = _program(api)
    graphs = CudaGraphs(run, api=api, keep=2)
    xs = [rng.standard_normal((3, 4)) for _ in range(4)]
    for x in xs[:3]:
        np.testing.assert_array_equal(_call(graphs, x, 5), x * 2 + 5)
    assert runs == {"eager": 1, "captured": 1} and graphs.captures == 1
    y = rng.standard_normal((6, 4))  # another sequence length: a new capture, no recompile
    np.testing.assert_array_equal(_call(graphs, y, 7), y * 2 + 7)
    np.testing.assert_array_equal(_call(graphs, xs[3], 5), xs[3] * 2 + 5)
    assert graphs.captures == 2 and runs == {"eager": 2, "captured": 2}
    z = rng.standard_normal((2, 4))  # a third: the least recently used (length 7) is dropped
    np.testing.assert_array_equal(_call(graphs, z, 1), z * 2 + 1)
    np.testing.assert_array_equal(_call(graphs, xs[0], 5), xs[0] * 2 + 5)  # still kept
    assert graphs.captures == 3
    np.testing.assert_array_equal(_call(graphs, y, 7), y * 2 + 7)  # captured again
    assert graphs.captures == 4 and len(graphs.graphs) == 2


def test_a_failed_capture_leaves_the_program_uncaptured(rng: np.random.Generator, caplog: pytest.LogCaptureFixture):
    api = _Torch(fail=True)
    run, runs = _program(api)
    graphs = CudaGraphs(run, api=api)
    with caplog.at_level(logging.WARNING, logger="nnforge.codegen"):
        for _ in range(3):
            x = rng.standard_normal((3, 4))
            np.testing.assert_array_equal(_call(graphs, x, 2), x * 2 + 2)
    assert graphs.failed and "operation not permitted" in graphs.failed and not graphs.graphs
    assert runs == {"eager": 3, "captured": 1}
    assert sum("CUDA graph capture failed" in r.getMessage() for r in caplog.records) == 1


def test_programs_on_the_interpreter_are_never_captured(rng: np.random.Generator):
    import nnforge as nf
    from nnforge.codegen.triton import TritonBackend, interpreted

    if not (TritonBackend().available and interpreted()):
        pytest.skip("the interpreter's programs run on the CPU")
    x = rng.standard_normal((4, 3)).astype(np.float32)
    program = TritonBackend(cuda_graphs=True)(nf.compile(lambda v: nf.tanh(v) * 2.0).trace(x))
    assert program.graphs is None
    np.testing.assert_allclose(program([x])[0], np.tanh(x) * 2, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.triton
def test_a_host_loop_replayed_as_a_graph_matches_it_run_eagerly(rng: np.random.Generator):
    """A scan whose step reads its carry one column over (a host loop on Triton), at two sequence lengths, new
    inputs each call: bit for bit the program run without graphs; one capture per length."""
    torch = pytest.importorskip("torch")
    import nnforge as nf
    from nnforge.codegen.triton import TritonBackend, interpreted

    if interpreted() or not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (real graphs)")

    def f(h0, x, w):
        def cell(h, x_t):
            h = nf.tanh(h @ w + x_t + nf.concat([h[:, :1], h[:, :-1]], axis=1))
            return h, h
        return nf.scan(cell, h0, x)

    N, H = 64, 32

    def args(T: int):
        return [torch.randn(N, H, device="cuda"), torch.randn(T, N, H, device="cuda"),
                torch.randn(H, H, device="cuda") * 0.2]

    trace_args = [a.cpu().numpy() for a in args(5)]
    graph = nf.compile(f).trace(*trace_args)
    plain, captured = TritonBackend(cuda_graphs=False)(graph), TritonBackend(cuda_graphs=True)(graph)
    assert captured.graphs is not None and plain.graphs is None
    assert TritonBackend(cuda_graphs=None)(graph).graphs is not None  # a host loop: captured by default
    for T in (5, 9, 5, 9, 5):
        a = args(T)
        for got, want in zip(captured.call_tensors(a), plain.call_tensors(a), strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert captured.graphs.captures == 2 and captured.graphs.failed is None


def test_by_default_only_a_program_with_a_host_loop_is_replayed(rng: np.random.Generator,
                                                                 monkeypatch: pytest.MonkeyPatch):
    """Replaying pays where Python launches a step's kernels every step (a host loop: a scan whose rows depend on
    each other) and not where the loop is one persistent kernel: by default only the first is captured;
    ``NNFORGE_CUDA_GRAPHS`` ``1`` / ``0`` decides for every program, and a function's own option over both."""
    import nnforge as nf
    from nnforge.codegen.triton import TritonBackend, cuda_graphs_on
    from nnforge.codegen.triton.graphs import captured_by_default

    if not TritonBackend().available:
        pytest.skip("Triton does not import here")

    def scan(mixing: bool):
        def f(h0, x, w):
            def cell(h, x_t):
                h = nf.tanh(h @ w + x_t + (h.sum(axis=0, keepdims=True) if mixing else 0.0))
                return h, h
            return nf.scan(cell, h0, x)
        return f

    args = [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((4, 8), (5, 4, 8), (8, 8))]
    host, persistent = (TritonBackend()(nf.compile(scan(m)).trace(*args)) for m in (True, False))
    assert captured_by_default(host.module) and not captured_by_default(persistent.module)
    monkeypatch.delenv("NNFORGE_CUDA_GRAPHS", raising=False)
    assert cuda_graphs_on(None) is None and cuda_graphs_on(True) is True
    monkeypatch.setenv("NNFORGE_CUDA_GRAPHS", "0")
    assert cuda_graphs_on(None) is False
    monkeypatch.setenv("NNFORGE_CUDA_GRAPHS", "1")
    assert cuda_graphs_on(None) is True and cuda_graphs_on(False) is False


def test_compile_options_reach_the_triton_backend_and_bad_ones_fail_early(rng: np.random.Generator):
    """``nf.compile(..., options=...)``: the Triton backend's settings per function (here CUDA graphs: on the
    interpreter a program is never captured, so the result is the same); a misspelled option, or an option for a
    backend that takes none, raises at ``nf.compile`` naming what it takes; the pullback torch autograd uses gets
    the same options."""
    import nnforge as nf
    from nnforge.codegen.triton import TritonBackend, interpreted, triton_target

    with pytest.raises(ValueError, match="takes the options cuda_graphs, tiles, target; got cuda_graph"):
        nf.compile(lambda v: v * 2.0, backend="triton", options={"cuda_graph": True})
    with pytest.raises(ValueError, match="backend 'cpu' takes no options"):
        nf.compile(lambda v: v * 2.0, backend="cpu", options={"cuda_graphs": True})
    whole = dataclasses.replace(triton_target(), split_k_outputs=0)  # thresholds: what bench variants compare
    assert nf.compile(lambda v: v * 2.0, backend="triton", options={"target": whole})._builder.target is whole
    if not (TritonBackend().available and interpreted()):
        pytest.skip("the interpreter's programs run on the CPU")
    f = nf.compile(lambda v: nf.tanh(v) * 2.0, backend="triton", options={"cuda_graphs": True})
    x = rng.standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(f(x), np.tanh(x) * 2, rtol=1e-6)
    assert isinstance(f._builder, TritonBackend) and f._builder.cuda_graphs is True
    assert f.vjp_program(None, 1, (0,)).options == {"cuda_graphs": True}
