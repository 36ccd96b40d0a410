"""The persistent kernels compiled for a Hopper GPU without one: every kernel a program launches (recorded while
the interpreter runs it once) is compiled for sm_90 by Triton's own ptxas in a fresh process, and must fit an
H100/H200 program's 227 KiB of shared memory. The first GPU run found a kernel asking for 272 KiB; this catches
that class of bug on a CPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_triton_render import layer_norm_lstm, lstm

import nnforge as nf
from nnforge.codegen.triton import TritonBackend, interpreted

HOPPER_SHARED = 227 * 1024  # bytes of shared memory one program may use on an H100 / H200

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not (TritonBackend().available and interpreted()),
                                                    reason="records launches under Triton's interpreter")]

COMPILE = textwrap.dedent("""
    import importlib.util, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    target = GPUTarget("cuda", 90, 32)
    backend = triton.compiler.make_backend(target)
    out = {}
    for rec in json.load(open(sys.argv[1])):
        spec = importlib.util.spec_from_file_location("m", rec["path"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        fn = getattr(module, rec["name"])
        consts = {(fn.arg_names.index(k),): v for k, v in rec["consts"].items()}
        src = triton.compiler.ASTSource(fn=fn, constexprs=consts, signature=rec["signature"])
        k = triton.compile(src, target=target, options=backend.parse_options(rec["meta"]).__dict__)
        out[rec["name"]] = k.metadata.shared
    print(json.dumps(out))
""")

_TYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
          "int32": "i32", "uint8": "u8", "int8": "i8", "bool": "i1"}


def _launches(monkeypatch: pytest.MonkeyPatch, run) -> list[dict]:
    """Each distinct kernel ``run()`` launches: its module file, name, argument types and meta-parameters."""
    import inspect

    import torch
    from triton.runtime.interpreter import InterpretedFunction

    seen: dict[tuple, dict] = {}
    original = InterpretedFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        params = list(inspect.signature(fn).parameters)
        values = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
        signature, consts = {}, {}
        for p in params:
            v = values[p]
            if "constexpr" in str(fn.__annotations__.get(p, "")):
                signature[p], consts[p] = "constexpr", v
            elif isinstance(v, torch.Tensor):
                signature[p] = "*" + _TYPES[str(v.dtype).removeprefix("torch.")]
            else:
                signature[p] = "i32" if -2**31 <= int(v) < 2**31 else "i64"
        meta = {k: v for k, v in kwargs.items() if k not in params}
        seen.setdefault((fn.__code__.co_filename, fn.__name__), {
            "path": fn.__code__.co_filename, "name": fn.__name__, "signature": signature, "consts": consts,
            "meta": meta})
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", record)
    run()
    monkeypatch.undo()
    return list(seen.values())


def _shared(records: list[dict], tmp_path) -> dict[str, int]:
    path = tmp_path / "launches.json"
    path.write_text(json.dumps(records))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", COMPILE, str(path)], env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0 and "ptxas" in done.stderr and "not found" in done.stderr.lower():
        pytest.skip("Triton's CUDA backend has no ptxas here")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cell", [lstm, layer_norm_lstm])
def test_a_basecaller_width_lstm_trains_in_kernels_that_fit_hopper(cell, monkeypatch, tmp_path):
    """H = 96 in float16, a training step of an LSTM and a layer-norm LSTM: the forward and the backward scan are
    persistent kernels (checked), and every kernel of the step compiles for sm_90 within the shared memory a
    program may use."""
    rng = np.random.default_rng(96)
    H, N = 96, 16
    args = [(rng.standard_normal(s) * 0.1).astype(np.float16)
            for s in ((1, N, H), (N, H), (N, H), (4 * H, H), (4 * H, H), (4 * H,))]

    def loss(*a):
        ys = cell(*a)[0]
        return (ys * ys).sum()

    step = nf.compile(nf.grad(loss, argnums=(3, 4, 5)), backend="triton")
    records = _launches(monkeypatch, lambda: step(*args))
    scans = [r["name"] for r in records if "_scan_" in r["name"]]
    assert len(scans) == 2, [r["name"] for r in records]
    shared = _shared(records, tmp_path)
    assert set(shared) == {r["name"] for r in records}
    too_big = {k: v for k, v in shared.items() if v > HOPPER_SHARED}
    assert not too_big, f"kernels over {HOPPER_SHARED} bytes of shared memory: {too_big}"
    assert all(shared[k] > 64 * 1024 for k in scans)  # the recurrent weights are on chip
