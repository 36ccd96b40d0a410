"""Saved compiled programs (``f.save`` / ``nf.load``): a fresh process runs them without tracing, passes or a C
compile and gets identical results; damaged files, other builds and other machines give clear errors or a
rebuild, never a crash or a wrong answer."""

from __future__ import annotations

import collections
import copy
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

import nnforge as nf
from nnforge import nn, saving
from nnforge.errors import NNForgeError, TraceError
from nnforge.saving import LoadError

# The child loads the saved step with tracing, the pass pipeline, code generation, the C compiler and Triton's
# compiler replaced by functions that fail: any of them called makes it exit non-zero.
CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import nnforge as nf
    import nnforge.compile, nnforge.codegen.c, nnforge.codegen.c.toolchain, nnforge.passes

    def forbidden(what):
        def fail(*args, **kwargs):
            raise SystemExit(f"the load path called {what}")
        return fail

    nnforge.compile.trace_function = forbidden("trace_function")
    nnforge.compile.run_pipeline = forbidden("run_pipeline")
    nnforge.compile.build_program = forbidden("build_program")
    nnforge.passes.run_pipeline = forbidden("passes.run_pipeline")
    nnforge.codegen.c.lower = forbidden("codegen.c.lower")
    nnforge.codegen.c.toolchain.Toolchain._compile = forbidden("the C compiler")
    try:  # Triton's first compile stage: a loaded GPU program's kernels come from the file
        from triton.backends.nvidia.compiler import CUDABackend
        CUDABackend.make_ttir = staticmethod(forbidden("Triton's compiler"))
    except ImportError:
        pass
    step = nf.load(sys.argv[1])
    data = np.load(sys.argv[2])
    n = len([k for k in data.files if k.startswith("b0_")])
    losses = [step(*[data[f"b{k}_{j}"] for j in range(n)]) for k in range(int(data["steps"]))]
    np.savez(sys.argv[3], losses=np.array(losses), **{f"p{i}": t.numpy() for i, t in enumerate(step.captured)})
""")


def _model_and_step(backend: str, hidden: int = 8):
    """A small basecaller's training step: strided conv, LSTM layers of alternating direction, CTC, Adam."""
    from nnforge.demo import Basecaller, compiled_step

    nf.manual_seed(3)
    model = Basecaller(hidden, 2)
    return model, compiled_step(model, nn.optim.Adam(model.parameters(), lr=3e-3), backend)


def _batches(rng: np.random.Generator, steps: int, batch: int = 4):
    from nnforge.demo import synthetic_reads

    return [synthetic_reads(rng, batch, 60, 5) for _ in range(steps)]


@pytest.mark.whole_model
def test_a_saved_training_step_runs_in_a_fresh_process_without_compiling(backend: str, rng: np.random.Generator,
                                                                        tmp_path: Path) -> None:
    model, step = _model_and_step(backend)
    batches = _batches(rng, 4)
    step(*batches[0])
    step.save(tmp_path / "step.nfp")
    params = list(model.parameters())
    want = [float(step(*b)) for b in batches[1:]]  # the original goes on from the state it had when saved
    np.savez(tmp_path / "batches.npz", steps=len(batches) - 1,
             **{f"b{k}_{j}": a for k, b in enumerate(batches[1:]) for j, a in enumerate(b)})
    env = {**os.environ, "NNFORGE_CACHE_DIR": str(tmp_path / "empty-cache"),  # the binaries come from the file
           "TRITON_CACHE_DIR": str(tmp_path / "empty-triton-cache")}
    res = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "step.nfp"), str(tmp_path / "batches.npz"),
                          str(tmp_path / "out.npz")], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(out["losses"], np.array(want, np.float32))
    # the loaded step updated its own copies of the parameters exactly as the original updated the model's
    got = [out[k] for k in out.files if k.startswith("p")]
    assert len(got) > len(params)  # and the optimizer's state
    for p in params:
        assert any(g.shape == p.shape and np.array_equal(g, p.numpy()) for g in got)


def _rnn(x, h0, w, u):
    def cell(h, x_t):
        h = nf.tanh(x_t @ w + h @ u)
        return h, h * 2

    return nf.scan(cell, h0, x)


def _rnn_args(rng: np.random.Generator, T: int) -> list[np.ndarray]:
    return [rng.standard_normal(s).astype(np.float32) for s in ((T, 3, 4), (3, 5), (4, 5), (5, 5))]


def test_a_loaded_program_takes_new_sequence_lengths_and_shows_its_ir(backend: str, rng: np.random.Generator,
                                                                      tmp_path: Path) -> None:
    f = nf.compile(_rnn, backend=backend)
    f(*_rnn_args(rng, 5))
    f.save(tmp_path / "rnn.nfp")
    g = nf.load(tmp_path / "rnn.nfp")
    for T in (5, 9, 1):
        args = _rnn_args(rng, T)
        for a, b in zip(g(*args), f(*args)):
            np.testing.assert_array_equal(a, b)
    assert g.trace_count == 0 and g.loaded_from == str(tmp_path / "rnn.nfp")
    assert "scan" in repr(g.trace(*_rnn_args(rng, 7)))


@nf.compile(backend="cpu")
def _decorated(x):
    return x * 3.0 + 1.0


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_compiled_function_copies_as_its_function_and_options(backend: str, rng: np.random.Generator,
                                                                 tmp_path: Path, how: str) -> None:
    """Pickled (to another process) or deep-copied, a compiled function is its function, backend and options
    again, without the programs (machine code): the copy traces and builds its own and computes the same. A
    module-level ``@nf.compile`` function is pickled by name. A loaded program, which has no function to
    compile again, says so."""
    def again(obj):
        return pickle.loads(pickle.dumps(obj)) if how == "pickle" else copy.deepcopy(obj)

    f = nf.compile(_rnn, backend=backend, dtype=nf.float64)
    args = _rnn_args(rng, 5)
    want = f(*args)
    g = again(f)
    assert g is not f and g.backend == backend and g.dtype == f.dtype and g.trace_count == 0
    for a, b in zip(g(*args), want):
        np.testing.assert_array_equal(a, b)
    assert g.trace_count == 1 and f.trace_count == 1
    if how == "pickle":
        assert pickle.loads(pickle.dumps(_decorated)) is _decorated
    f.save(tmp_path / "rnn.nfp")
    with pytest.raises(TypeError, match=r"loaded from .*rnn\.nfp: it has no Python function .* nf\.load it there"):
        again(nf.load(tmp_path / "rnn.nfp"))


def test_a_signature_it_was_not_saved_with_is_refused_naming_the_saved_ones(rng: np.random.Generator,
                                                                          tmp_path: Path) -> None:
    f = nf.compile(_rnn)
    f(*_rnn_args(rng, 5))
    f.save(tmp_path / "rnn.nfp")
    g = nf.load(tmp_path / "rnn.nfp")
    args = [a.astype(np.float64) for a in _rnn_args(rng, 5)]
    with pytest.raises(TraceError, match=r"float32\[a0\.0, 3, 4\].*called with \(float64\[5, 3, 4\]"):
        g(*args)
    with pytest.raises(TraceError, match="cannot be traced inside another function"):
        nf.compile(lambda *a: g(*a)[1].sum())(*_rnn_args(rng, 5))


def test_python_values_of_a_signature_are_named_by_value(rng: np.random.Generator, tmp_path: Path) -> None:
    """A Python number or string is part of a signature: a call with another one is refused showing both values."""
    f = nf.compile(lambda x, scale, how: x * scale if how == "mul" else x + scale)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    f(x, 0.5, "mul")
    f.save(tmp_path / "scaled.nfp")
    g = nf.load(tmp_path / "scaled.nfp")
    np.testing.assert_array_equal(g(x, 0.5, "mul"), x * np.float32(0.5))
    with pytest.raises(TraceError, match=r"saved with: \(float32\[2, 3\], 0\.5, 'mul'\).*called with "
                                         r"\(float32\[2, 3\], 2, 'add'\)"):
        g(x, 2, "add")


def test_a_loaded_steps_captured_tensors_are_named(rng: np.random.Generator, tmp_path: Path) -> None:
    """A loaded training step's own tensors say which is which: a module's by its path, as ``named_parameters``
    says it, an optimizer's state as torch's state dict keys it; a tensor named by its maker keeps its name."""
    nf.manual_seed(int(rng.integers(1 << 31)))
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    opt = nn.optim.Adam(model.parameters(), lr=1e-2)
    scale = nf.Tensor(rng.standard_normal(4).astype(np.float32), requires_grad=True, name="scale")

    @nf.compile
    def step(x):
        opt.zero_grad()
        loss = (model(x) * scale).square().mean()
        loss.backward()
        opt.step()
        return loss

    step(rng.standard_normal((2, 3)).astype(np.float32))
    step.save(tmp_path / "step.nfp")
    names = {t.name for t in nf.load(tmp_path / "step.nfp").captured}
    assert {"0.weight", "0.bias", "1.weight", "1.bias", "scale", "state[0].exp_avg", "state[3].exp_avg_sq",
            "state[2].step"} <= names, names
    assert "" not in names


def test_a_loaded_scan_over_two_sequences_keeps_their_lengths_equal(rng: np.random.Generator,
                                                                     tmp_path: Path) -> None:
    """Saved with the rule that a scan's sequences share one free length: a loaded program takes any equal
    lengths and refuses unequal ones by the signature it was saved with (it cannot trace them)."""

    def masked(x, h0, mask):
        return nf.scan(lambda h, xm: (h + xm[0] * xm[1], h), h0, (x, mask))[1]

    def args(t: int, u: int) -> list[np.ndarray]:
        return [rng.standard_normal(s).astype(np.float32) for s in ((t, 2, 3), (2, 3), (u, 2, 3))]

    f = nf.compile(masked)
    f(*args(4, 4))
    f.save(tmp_path / "masked.nfp")
    g = nf.load(tmp_path / "masked.nfp")
    for t in (6, 1):
        a = args(t, t)
        np.testing.assert_array_equal(g(*a), f(*a))
    assert g.trace_count == 0
    with pytest.raises(TraceError, match="called with"):
        g(*args(6, 5))


def _saved(rng: np.random.Generator, tmp_path: Path, backend: str = "reference") -> Path:
    f = nf.compile(_rnn, backend=backend)
    f(*_rnn_args(rng, 4))
    f.save(tmp_path / "rnn.nfp")
    return tmp_path / "rnn.nfp"


def test_damaged_files_give_clear_errors(rng: np.random.Generator, tmp_path: Path) -> None:
    path = _saved(rng, tmp_path)
    data = path.read_bytes()
    with pytest.raises(LoadError, match="no such file"):
        nf.load(tmp_path / "missing.nfp")
    (tmp_path / "cut.nfp").write_bytes(data[: len(data) // 2])
    with pytest.raises(LoadError, match="truncated"):
        nf.load(tmp_path / "cut.nfp")
    (tmp_path / "text.nfp").write_text("not a program")
    with pytest.raises(LoadError, match="not a complete saved nnforge program"):
        nf.load(tmp_path / "text.nfp")
    # a member rewritten with other bytes (valid zip, wrong checksum), and a member added
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    pkl = bytearray(members["program.pkl"])
    pkl[len(pkl) // 2] ^= 0xFF
    cases = [("altered.nfp", {"program.pkl": bytes(pkl)}, "program.pkl does not match its checksum"),
             ("added.nfp", {"evil.so": b"\x7fELF"}, "do not match its manifest")]
    for name, extra, pattern in cases:
        with zipfile.ZipFile(tmp_path / name, "w") as z:
            for n, d in {**members, **extra}.items():
                z.writestr(n, d)
        with pytest.raises(LoadError, match=pattern):
            nf.load(tmp_path / name)


def test_a_program_saved_by_another_build_is_refused(rng: np.random.Generator, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = _saved(rng, tmp_path)
    assert saving.read_manifest(path)["nnforge"] == saving.forge_build()
    monkeypatch.setattr(saving, "forge_build", lambda: "0.1.0+someotherbuild")
    with pytest.raises(LoadError, match=r"saved by nnforge 0\.1\.0\+\w+, this is 0\.1\.0\+someotherbuild.*compile "
                                        "the function again"):
        nf.load(path)


def test_a_source_tree_that_is_not_installed_still_names_its_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """On PYTHONPATH without pip install (as on a lent GPU machine) there is no package metadata: the build is
    'source' plus the same hash of the sources."""
    import importlib.metadata

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    installed = saving.forge_build.__wrapped__()
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert saving.forge_build.__wrapped__() == "source+" + installed.split("+")[1]


cpu_only = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


@cpu_only
def test_a_binary_built_for_another_cpu_is_rebuilt_from_its_source(rng: np.random.Generator, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = _saved(rng, tmp_path, "cpu")
    manifest = saving.read_manifest(path)
    assert manifest["machine"] == saving.machine() and manifest["toolchain"]
    here = saving.machine()
    monkeypatch.setattr(saving, "machine", lambda: {**here, "cpu_flags": here["cpu_flags"][:-1]})
    args = _rnn_args(rng, 6)
    with caplog.at_level(logging.WARNING, logger="nnforge.saving"):
        g = nf.load(path)
    assert any("rebuilding the saved C program" in r.getMessage() and "lacks" in r.getMessage()
               for r in caplog.records)
    for a, b in zip(g(*args), nf.compile(_rnn, backend="cpu")(*args)):
        np.testing.assert_array_equal(a, b)
    monkeypatch.setattr(saving, "machine", lambda: {**here, "arch": "riscv64"})
    monkeypatch.setattr(nf.codegen.BACKENDS["cpu"], "available", False)
    with pytest.raises(LoadError, match=r"built for .* this machine is riscv64.*needs a C compiler"):
        nf.load(path)


@cpu_only
def test_a_binary_that_does_not_load_here_is_rebuilt(rng: np.random.Generator, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    import nnforge.codegen.c.toolchain as toolchain

    path = _saved(rng, tmp_path, "cpu")
    monkeypatch.setattr(toolchain, "install_library", lambda key, data: None)
    args = _rnn_args(rng, 3)
    with caplog.at_level(logging.WARNING, logger="nnforge.saving"):
        g = nf.load(path)
    assert any("does not load here" in r.getMessage() for r in caplog.records)
    for a, b in zip(g(*args), nf.compile(_rnn, backend="cpu")(*args)):
        np.testing.assert_array_equal(a, b)


def test_what_cannot_be_saved_is_refused(backend: str, rng: np.random.Generator, tmp_path: Path) -> None:
    f = nf.compile(_rnn, backend=backend)
    with pytest.raises(NNForgeError, match="has not been called yet"):
        f.save(tmp_path / "x.nfp")

    @nf.compile(backend=backend)
    def with_receiver(x):
        nf.Receiver(lambda v: None, [x * 2])
        return x + 1

    with_receiver(rng.standard_normal(3).astype(np.float32))
    with pytest.raises(NNForgeError, match=r"calls Python functions \(a Receiver created at .*test_save_load"):
        with_receiver.save(tmp_path / "x.nfp")
    assert not (tmp_path / "x.nfp").exists()

    @nf.compile(backend=backend)
    def streamed(x):  # a loop whose step is compiled, called by the host once per iteration
        x = x * 1
        nf.loop(2, lambda: x.assign(x + nf.Feeder(lambda: np.ones(3, np.float32), shape=[3])))
        return x

    np.testing.assert_array_equal(streamed(np.zeros(3, np.float32)), np.full(3, 2, np.float32))
    with pytest.raises(NNForgeError, match=r"calls Python functions \(a Feeder created at .*test_save_load"):
        streamed.save(tmp_path / "x.nfp")
    assert not (tmp_path / "x.nfp").exists()

    w = nf.tensor(np.ones((3, 1), np.float32), requires_grad=True)
    w.grad = nf.tensor(np.ones((3, 1), np.float32))

    @nf.compile(backend=backend)
    def accumulate(x):  # its gradients add to the .grad set before the call, read at call time
        loss = (x @ w).sum()
        loss.backward()
        return loss

    accumulate(np.ones((2, 3), np.float32))
    np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 1), 3, np.float32))
    with pytest.raises(NNForgeError, match=r"accumulate accumulates gradients onto \.grad values it reads"):
        accumulate.save(tmp_path / "x.nfp")
    assert not (tmp_path / "x.nfp").exists()


def test_torch_autograd_through_a_loaded_program(backend: str, rng: np.random.Generator, tmp_path: Path) -> None:
    import torch

    f = nf.compile(_rnn, backend=backend)
    args = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in _rnn_args(rng, 4)]
    h, ys = f(*args)
    (h.sum() + ys.square().sum()).backward()
    want = [a.grad.clone() for a in args]
    f.save(tmp_path / "rnn.nfp")
    g = nf.load(tmp_path / "rnn.nfp")
    for a in args:
        a.grad = None
    h, ys = g(*args)
    (h.sum() + ys.square().sum()).backward()
    for a, w in zip(args, want):
        torch.testing.assert_close(a.grad, w, rtol=0, atol=0)
    fresh = nf.compile(_rnn, backend=backend)
    fresh(*[a.detach() for a in args])  # traced, but no backward pass before saving
    fresh.save(tmp_path / "fwd.nfp")
    with pytest.raises(TraceError, match="without the gradient program torch autograd needs"):
        nf.load(tmp_path / "fwd.nfp")(*args)


def test_the_manifest_says_what_the_file_holds(rng: np.random.Generator, tmp_path: Path) -> None:
    path = _saved(rng, tmp_path)
    manifest = saving.read_manifest(path)
    assert manifest["function"] == "_rnn" and manifest["backend"] == "reference"
    assert manifest["signatures"] == ["(float32[a0.0, 3, 4], float32[3, 5], float32[4, 5], float32[5, 5])"]
    with zipfile.ZipFile(path) as z:
        assert set(json.loads(z.read("manifest.json"))["sha256"]) == {"program.pkl"}


def test_built_triton_kernels_travel_in_the_file_into_tritons_cache(rng: np.random.Generator, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels Triton built before the save are members of the file (checksummed like the others) and loading
    puts them into this machine's Triton cache under their hashes, where a launch finds them. On a CPU machine the
    interpreter builds nothing, so a stand-in gives the save one built kernel's files;
    ``codegen/triton/test_binaries.py`` checks a real sm_90 build is found, the GPU run of the whole-model test
    above that a loaded training step builds nothing."""
    from nnforge.codegen.triton import TritonBackend, binaries

    if not TritonBackend().available:
        pytest.skip("needs Triton")
    import triton
    from triton.runtime.cache import get_cache_manager

    key = "5e" * 32  # a SHA-256, as Triton names a build
    files = {"k0_scan.json": b'{"name": "k0_scan"}', "k0_scan.cubin": bytes(range(256)), "k0_scan.ptx": b"//"}
    monkeypatch.setattr(binaries, "collect", lambda module: {key: files})
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    f = nf.compile(_rnn, backend="triton")
    args = _rnn_args(rng, 5)
    want = f(*args)
    f.save(tmp_path / "rnn.nfp")
    with zipfile.ZipFile(tmp_path / "rnn.nfp") as z:
        assert {n for n in z.namelist() if n.startswith("triton/")} == {f"triton/{key}/{n}" for n in files}
    manifest = saving.read_manifest(tmp_path / "rnn.nfp")
    assert manifest["triton"]["triton"] == triton.__version__ and f"triton/{key}/k0_scan.cubin" in manifest["sha256"]
    assert get_cache_manager(key).get_group("k0_scan.json") is None
    g = nf.load(tmp_path / "rnn.nfp")
    group = get_cache_manager(key).get_group("k0_scan.json")
    assert group is not None and {n: Path(p).read_bytes() for n, p in group.items()} == files
    for a, b in zip(g(*args), want):
        np.testing.assert_array_equal(a, b)


def test_traces_saved_in_train_and_eval_mode_are_chosen_at_load(backend: str, rng: np.random.Generator,
                                                                 tmp_path: Path) -> None:
    """A function whose modules were traced in train and in eval mode is saved with both, told apart in the
    manifest; the loaded function cannot see the modules, so ``nf.load`` is told which mode to run (and refuses
    to guess), rather than running whichever was traced first."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    f = nf.compile(lambda x: model(x), backend=backend)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    model.eval()
    evaluated = f(x)
    model.train()
    f(x)
    assert f.trace_count == 2
    f.save(tmp_path / "m.nfp")
    assert saving.read_manifest(tmp_path / "m.nfp")["signatures"] == ["(float32[3, 4]) in eval mode",
                                                                      "(float32[3, 4]) in train mode"]
    with pytest.raises(LoadError, match=r"\(float32\[3, 4\]\) was saved in eval mode and in train mode.*"
                                        r"nf\.load\(path, training=True\)"):
        nf.load(tmp_path / "m.nfp")
    np.testing.assert_array_equal(nf.load(tmp_path / "m.nfp", training=False)(x), evaluated)
    trained = nf.load(tmp_path / "m.nfp", training=True)
    for _ in range(2):  # each call draws its own dropout mask: kept values doubled, the others zero
        out = trained(x)
        kept = out != 0
        assert 0 < kept.sum() < out.size
        np.testing.assert_allclose(out[kept], 2 * evaluated[kept], rtol=1e-5)

    model.eval()
    g = nf.compile(lambda x: model(x), backend=backend)
    g(x)
    g.save(tmp_path / "eval.nfp")
    with pytest.raises(LoadError, match=r"holds no trace in train mode.*saved with: \(float32\[3, 4\]\) in eval"):
        nf.load(tmp_path / "eval.nfp", training=True)
    np.testing.assert_array_equal(nf.load(tmp_path / "eval.nfp")(x), evaluated)
    h = nf.compile(lambda x: x * 2, backend=backend)  # no module: any mode runs it
    h(x)
    h.save(tmp_path / "plain.nfp")
    np.testing.assert_array_equal(nf.load(tmp_path / "plain.nfp", training=True)(x), 2 * x)


def test_a_manifest_of_another_structure_is_a_load_error_naming_the_field(rng: np.random.Generator,
                                                                          tmp_path: Path) -> None:
    """A manifest that is valid JSON but not laid out as ``save`` writes it (edited, or another tool's) is a
    ``LoadError`` saying which field is wrong, not an ``AttributeError`` or ``KeyError`` from inside ``load``."""
    path = _saved(rng, tmp_path)
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    without = {k: v for k, v in manifest.items() if k != "machine"}
    cases = [([manifest], r"its manifest is damaged \(a JSON list, not an object\)"),
             ({**manifest, "format": str(manifest["format"])}, r"saved in format '1', this nnforge reads format 1"),
             ({**manifest, "sha256": list(manifest["sha256"])}, r"'sha256' should be an object .*got a JSON list"),
             (without, r"its manifest is damaged: 'machine' is missing"),
             ({**manifest, "machine": None}, r"'machine' should be an object .*got a JSON null"),
             ({**manifest, "machine": {**manifest["machine"], "cpu_flags": "avx2"}},
              r"'machine\.cpu_flags' should be a list of strings .*got a JSON string"),
             ({k: v for k, v in manifest.items() if k != "nnforge"}, r"'nnforge' is missing")]
    for k, (changed, pattern) in enumerate(cases):
        altered = tmp_path / f"altered{k}.nfp"
        with zipfile.ZipFile(altered, "w") as z:
            for n, d in {**members, "manifest.json": json.dumps(changed).encode()}.items():
                z.writestr(n, d)
        with pytest.raises(LoadError, match=pattern):
            nf.load(altered)
        with pytest.raises(LoadError, match=pattern):
            saving.read_manifest(altered)


Pair = collections.namedtuple("Pair", "a b")


def test_a_namedtuple_argument_is_saved_by_its_type(rng: np.random.Generator, tmp_path: Path) -> None:
    """A namedtuple argument and result load back as their type, which the file names (a module-level type); a
    type defined in a function cannot be named, and ``save`` says so."""
    f = nf.compile(lambda p: Pair(p.a + p.b, p.a.sum()))
    p = Pair(rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32))
    f(p)
    f.save(tmp_path / "pair.nfp")
    out = nf.load(tmp_path / "pair.nfp")(p)
    assert type(out) is Pair
    np.testing.assert_allclose(out.a, p.a + p.b, rtol=1e-6)
    np.testing.assert_allclose(out.b, p.a.sum(), rtol=1e-5)
    Local = collections.namedtuple("Local", "a b")
    g = nf.compile(lambda p: p.a * p.b)
    g(Local(*p))
    with pytest.raises(NNForgeError, match=r"save: .*<lambda> takes or returns a structure that cannot be saved.*"
                                           "namedtuple type .* must be defined at module level"):
        g.save(tmp_path / "local.nfp")
    assert not (tmp_path / "local.nfp").exists()
