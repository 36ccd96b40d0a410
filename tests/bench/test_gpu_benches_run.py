"""The GPU bench scripts run to the end on a CPU machine, at tiny sizes under Triton's interpreter.

A lent GPU is rare and short (``scripts/gpu-check.sh`` runs these scripts there): a script that broke since its
last GPU run would spend a lease on a traceback. Each is run as ``gpu-check.sh`` runs it, in its CPU form, and
must print the lines that the benchmarks are read from. Nothing here is timed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nnforge.codegen.triton import TritonBackend, interpreted

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.triton, pytest.mark.skipif(not (TritonBackend().available and interpreted()),
                                                    reason="the scripts' CPU forms run under Triton's interpreter")]


def run(*args: str) -> str:
    env = os.environ | {"TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_lstm_gpu_bench_times_every_candidate_and_reports_errors():
    out = run("bench/lstm_gpu.py", "--smoke", "--cuda-graphs", "--profile", "--variant", "scan_pieces=0,scan_stages=1",
              "split_k_outputs=0", "--cell-variant", "hoist_step_work=1")
    for mode in ("inference", "training"):
        assert f"float32 {mode}: first call" in out
    assert out.count("nnforge+graphs / nnforge = ") == 2 and out.count("nnforge-graphs / nnforge = ") == 2
    assert out.count("nnforge[scan_pieces=0,scan_stages=1] / nnforge = ") == 2  # other tiles, interleaved
    assert out.count("nnforge[split_k_outputs=0] / nnforge = ") == 2  # another target threshold
    assert "error vs float64 (N=4): nnforge " in out and "gradient error vs float64 (N=4): w_ih nnforge " in out
    for cell in ("layer-norm LSTM", "GRU (reset before matmul)", "peephole LSTM"):
        assert f"{cell} T=3 N=4 H=16 float32 inference (error vs float64: nnforge " in out
    assert out.count("TorchScript / nnforge = ") == 3
    assert out.count("nnforge[hoist_step_work=1] / nnforge = ") == 3  # each cell in another form, interleaved
    assert out.count("nnforge.triton, one call by operator (") == 2  # --profile: on a GPU, by kernel


def test_rows_gpu_bench_times_each_form_of_its_row_kernels():
    """Layer norms and softmaxes (two shapes each), a projection and its layer norm, attention scores and their
    softmax: each against its anchors, every result within float32's error of float64."""
    out = run("bench/rows_gpu.py", "--smoke", "--rounds", "1")
    for op in ("layer norm", "softmax"):
        assert out.count(f"{op}: ") == 2  # two shapes
    assert out.count("projection: 40 rows of 12 projected to 48") == 1
    assert out.count("attention: 2 heads of 20 queries and keys of 8") == 1
    assert out.count("nnforge[row_programs=0] / nnforge = ") == 4, out
    assert out.count("nnforge[gemm_row_programs=0] / nnforge = ") == 2, out
    for anchor in ("torch", "torch.compile"):
        assert out.count(f"  {anchor} / nnforge = ") == 6, out
    errors = [float(e) for e in re.findall(r"error (\S+)", out)]
    assert len(errors) == 24 and max(errors) < 1e-5, out


def test_transformer_gpu_bench_times_the_layer_against_torch_in_both_modes():
    """nnforge's encoder layer (the twin's weights, through ``TorchModule``) against torch and torch.compile,
    inference and a training step, each within float32's error of the layer in float64; ``--profile`` by kernel."""
    out = run("bench/transformer_gpu.py", "--smoke", "--rounds", "1", "--profile")
    for mode in ("inference:", "training step (forward, backward to the input and weights):"):
        assert f"transformer encoder layer d=16 heads=2 ff=32 T=6 N=2 float32 {mode}" in out, out
    for anchor in ("torch", "torch.compile"):
        assert out.count(f"  {anchor} / nnforge = ") == 2, out
    errors = [float(e) for e in re.findall(r"error vs float64 (\S+)", out)]
    assert len(errors) == 6 and max(errors) < 1e-5, out
    assert out.count("nnforge.triton, one call by operator (") == 2

def test_an_anchor_that_kills_its_process_is_left_out_with_its_reason(monkeypatch: pytest.MonkeyPatch):
    """cuDNN's LSTM at batch 8448 ends its process's CUDA context on an H200: the anchors' first calls run in
    child processes first, and one that fails (reported by the child, or the child dying inside it) is left out
    with its reason while the probing goes on in a fresh child; here against scripted children."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import lstm_gpu
    finally:
        sys.path.remove(str(ROOT / "bench"))
    cases = [("inference", 96, 1024), ("inference", 96, 8448), ("training", 96, 8448), ("training", 384, 128)]
    children = [  # what each child prints for the items it is given, and how it ends
        (["ok\tcudnn"], "an illegal memory access was encountered", -6),  # dies inside the second item
        (["fail\tcudnn\tRuntimeError: CUDNN_STATUS_EXECUTION_FAILED"], "", 3),
        (["ok\tcudnn"], "", 0)]
    given = []

    def fake_run(cmd, **kw):
        given.append([tuple(c) for c, _ in json.loads(cmd[cmd.index("--probe") + 1])])
        lines, err, rc = children[len(given) - 1]
        return subprocess.CompletedProcess(cmd, rc, "\n".join(lines) + "\n", err)

    monkeypatch.setattr(lstm_gpu.subprocess, "run", fake_run)
    failed = lstm_gpu.probe_anchors(cases, 2000, "float16", "none")
    assert given == [cases, cases[2:], cases[3:]]
    assert failed == {("inference", 96, 8448): {"cudnn": "the process died: an illegal memory access was encountered"},
                      ("training", 96, 8448): {"cudnn": "RuntimeError: CUDNN_STATUS_EXECUTION_FAILED"}}


def test_precision_bench_reports_each_model_and_dtype():
    """Every model in both dtypes the interpreter can check, each value's error within its dtype's reach."""
    out = run("bench/precision_gpu.py", "--interpret")
    blocks = re.split(r"\n(?=\S)", out.strip())[1:]
    heads = [b.splitlines()[0].split(" T=")[0] for b in blocks]
    assert heads == [f"{m} {d}" for m in ("LSTM", "layer-norm LSTM", "GRU (reset before matmul)", "peephole LSTM")
                     for d in ("float32", "float16")]
    for block in blocks:
        worst = max(float(v) for v in re.findall(r"^\s+\w+\s+max (\S+)", block, re.M))
        assert worst < (1e-5 if " float32 " in block.splitlines()[0] else 1e-2), block


def test_feeder_bench_streams_on_the_triton_backend_and_reads_its_trace(tmp_path):
    trace = tmp_path / "feeder.json"
    out = run("bench/feeder.py", "--backends", "cpu,triton", "--rounds", "1", "--steps", "3", "--batch", "4",
              "--chunk", "300", "--hidden", "16", "--trace", str(trace))
    assert out.count("losses identical in both modes") == 2
    assert "trace of triton (prefetch=2, pending=2" in out and trace.stat().st_size > 0


def test_compile_bench_measures_a_cold_first_call_and_new_lengths():
    """Fresh processes with empty caches for nnforge and the torch.compile anchor; the interpreter builds
    nothing, so every later length must report 0 files built (on a GPU, the goal's check)."""
    out = run("bench/compile_gpu.py", "--smoke", "--mode", "inference")
    line = next(x for x in out.splitlines() if x.strip().startswith("inference round 1 nnforge"))
    assert "T=4 " in line and "T=6 " in line and "T=4 again " in line and line.count("(built 0)") == 3
    assert "inference round 1 torch.compile T=4 " in out and "torch.compile / nnforge = " in out


def test_scan_sass_counts_each_step_of_the_persistent_kernels_per_pipeline_depth():
    """``bench/scan_sass.py`` builds the LSTM's scan kernels for sm_90 at each pipeline depth and counts its step:
    with 2 stages the forward's step inputs are asynchronous copies, without a pipeline global loads (at H = 64:
    a narrower tile gives each thread less than the 4 bytes an asynchronous copy moves, and is not pipelined)."""
    try:
        out = run("bench/scan_sass.py", "--hidden", "64", "--batch", "8", "--stages", "1", "2", "--pieces", "1")
    except AssertionError as e:
        if "ptxas" in str(e):
            pytest.skip("Triton's CUDA backend has no ptxas here")
        raise
    header = next(line.split() for line in out.splitlines() if line.startswith("model"))
    rows = [dict(zip(header, line.split())) for line in out.splitlines() if line.startswith("LSTM")]
    assert len(rows) == 6, out  # inference: 1 scan; training: forward and backward; at 2 depths each
    count = {int(r["stages"]): {k: int(v) for k, v in r.items() if v.isdigit()} for r in rows
             if r["mode"] == "inference"}
    assert count[2]["async_copies"] > 0 and count[2]["global_loads"] == 0, out
    assert count[1]["async_copies"] == 0 and count[1]["global_loads"] > 0, out
    assert count[2]["barriers"] < count[1]["barriers"], out  # a copy into shared memory needs no layout exchange


def test_scan_stalls_script_runs_each_form_twice_under_its_nvtx_ranges():
    """``bench/scan_stalls_gpu.py`` (``gpu-check.sh``'s ``stalls`` step runs it under ncu): each mode built by a
    first call, then the call ncu reads, with other tiles where asked."""
    out = run("bench/scan_stalls_gpu.py", "--smoke", "--variant", "scan_pieces=0")
    for mode in ("inference", "training"):
        for call in ("build", "profiled"):
            assert f"{mode} T=3 N=4 H=16 float32 scan_pieces=0: {call} call, " in out, out
    assert out.count("finite True") == 4
