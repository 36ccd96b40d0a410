"""The generated C grows linearly with the program, and gcc's memory with it.

Regression: the workspace size nested a two-argument maximum macro once per buffer sharing a slot, so the
preprocessed text doubled at every member; a 24-layer MLP made cc1 run out of memory. Each program here is
compiled by the C compiler with the backend's own flags under an address-space cap, and its peak memory and the
source's size per IR op are bounded (not its time)."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import numpy as np
import pytest

import nnforge as nf
import nnforge.nn as nn
from nnforge.codegen.c import lower, prepare
from nnforge.codegen.c.cexpr import PRELUDE
from nnforge.codegen.c.toolchain import FLAGS, find_compiler
from nnforge.nn import optim

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")

CAP_BYTES = 2 << 30  # cc1 needed more than 14 GB for a 20-layer MLP before the fix; ~150 MB after
PEAK_MB = 600


def _mlp(rng: np.random.Generator):
    ws = [(rng.standard_normal((16, 16)) * 0.3).astype(np.float32) for _ in range(64)]

    def f(x, *ws):
        for w in ws:
            x = nf.tanh(x @ w)
        return x

    return f, (rng.standard_normal((4, 16)).astype(np.float32), *ws)


def _transformer(rng: np.random.Generator):
    layers = [nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0).eval() for _ in range(12)]

    def f(x):
        for layer in layers:
            x = layer(x)
        return x

    return f, (rng.standard_normal((10, 2, 32)).astype(np.float32),)


def _lstm_training_step(rng: np.random.Generator):
    model = nn.LSTM(16, 32, num_layers=12)
    opt = optim.SGD(model.parameters(), lr=0.01)

    def step(x):
        opt.zero_grad()
        out, _ = model(x)
        loss = (out * out).mean()
        loss.backward()
        opt.step()
        return loss

    return step, (rng.standard_normal((20, 4, 16)).astype(np.float32),)


def _compile_peak_mb(source: str, tmp: Path) -> float:
    """Compile ``source`` to an object with the backend's flags under ``CAP_BYTES`` of address space; the
    compiler's peak resident memory (cc1 included: the rusage of a waited-for child covers its children)."""
    src = tmp / "prog.c"
    src.write_text(source)
    flags = [f for f in FLAGS if f != "-shared"]

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))

    proc = subprocess.Popen([find_compiler(), *flags, "-c", str(src), "-o", str(tmp / "prog.o")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=cap)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode()[-2000:]
    proc.stdout.close()
    proc.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 0, f"the C compiler failed under a {CAP_BYTES >> 20} MB cap:\n{err}"
    return usage.ru_maxrss / 1024


@pytest.mark.parametrize(("make", "bytes_per_op"), [(_mlp, 600), (_transformer, 300), (_lstm_training_step, 800)],
                         ids=["mlp64", "transformer12", "lstm12_training_step"])
def test_generated_source_is_linear_in_the_program(make, bytes_per_op: int, tmp_path: Path,
                                                   rng: np.random.Generator) -> None:
    fn, args = make(rng)
    graph = nf.compile(fn).trace(*args)
    source = lower(prepare(graph)).source()
    per_op = len(source) / len(graph.order)
    # measured 2026-11-23: 276, 95 and 414 bytes per op (the prelude of helpers included)
    assert per_op < bytes_per_op, f"{per_op:.0f} bytes of C per IR op"
    assert "NF_MAX" not in source
    peak = _compile_peak_mb(source, tmp_path)
    assert peak < PEAK_MB, f"the C compiler peaked at {peak:.0f} MB"


def test_a_deep_mlp_compiles_and_runs(rng: np.random.Generator) -> None:
    """The 64-layer MLP through the whole backend (disk cache, load, call) agrees with the reference."""
    fn, args = _mlp(rng)
    got = nf.compile(fn, backend="cpu")(*args)
    want = nf.compile(fn, backend="reference")(*args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sizes_derived_from_run_time_sizes_are_computed_once_per_call(rng: np.random.Generator) -> None:
    """A strided conv front end's lengths ((T + 2p - k) // s + 1, nested per layer) feeding a scan, so T is a
    run-time size: they are slots of the size array filled once per call by nf_sizes, not expressions
    re-printed in every index; results stay right at lengths other than the traced one."""
    convs = [nn.Conv1d(1, 4, 5, padding=2), nn.Conv1d(4, 8, 5, stride=2, padding=2),
             nn.Conv1d(8, 8, 19, stride=5, padding=9)]
    rnn = nn.LSTM(8, 8)

    def f(x):
        for conv in convs:
            x = nf.silu(conv(x))
        return rnn(x.permute(2, 0, 1))[0]

    x = rng.standard_normal((2, 1, 120)).astype(np.float32)
    source = lower(prepare(nf.compile(f).trace(x))).source()
    sizes_fn = source[source.index("static void nf_sizes"):]
    sizes_fn = sizes_fn[:sizes_fn.index("\n}")]
    assert sizes_fn.count("nf_floordiv(") >= 2  # the two strides
    assert source.count("nf_floordiv(") == sizes_fn.count("nf_floordiv(") + PRELUDE.count("nf_floordiv(")
    compiled = nf.compile(f, backend="cpu")
    for t in (120, 97, 301):
        xt = rng.standard_normal((2, 1, t)).astype(np.float32)
        np.testing.assert_allclose(compiled(xt), nf.compile(f)(xt), rtol=1e-5, atol=1e-5)
    assert compiled.trace_count == 1
