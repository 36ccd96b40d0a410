"""A small real sweep on CPU (2 variants × 3 backends × 2 batch sizes), checked row by row; resume; training mode
with torch.compile; the nnforge backend when the compiler is present."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from nnforge.modelview import open_store, sweep
from nnforge.modelview.variants import Request, variant_registry


def test_small_cpu_sweep_rows(db: str, fast: dict):
    fast["measure_peaks"] = True
    spec = dict(variants=["lstm_manual", "torch_gru"], backends=["eager", "jit.script", "onnxruntime"],
                batch=[2, 3], seq_len=[4], params={"input_size": 5, "hidden": 6}, name="e2e", **fast)
    res = sweep(spec, db=db, progress=False, table=False)
    assert res.total == 12 and res.ran == 12 and res.counts == {"ok": 12}
    with open_store(db) as s:
        df = s.cells(res.run_id)
        run = s.run(res.run_id)
    assert len(df) == 12
    assert set(zip(df.variant, df.backend, df.batch)) == {
        (v, b, n) for v in ("lstm_manual", "torch_gru") for b in ("eager", "jit.script", "onnxruntime") for n in (2, 3)
    }
    env = json.loads(run["env_json"])
    for key in ("git_commit", "cpu_model", "gpu_model", "threads", "libraries", "peak_flops", "peak_bytes_per_s"):
        assert key in env
    assert env["threads"] == 1 and env["peak_flops"] > 0 and env["peak_bytes_per_s"] > 0
    assert json.loads(run["spec_json"])["seed"] is not None
    reg = variant_registry()
    for _, r in df.iterrows():
        assert r.status == "ok" and r.error is None
        assert r.ci_low_s <= r.median_s <= r.ci_high_s
        samples = json.loads(r.samples_json)
        m = json.loads(r.metrics_json)
        assert len(samples) == m["samples"] >= 5
        req = Request(int(r.batch), int(r.seq_len), r.layout, json.loads(r.params_json))
        v = reg[r.variant]()
        assert r.throughput == pytest.approx(v.items(req) / r.median_s)
        assert r.throughput_unit == "vectors/s"
        assert r.flops == pytest.approx(v.flops(req)) and r.bytes == pytest.approx(v.min_bytes(req, 4))
        assert r.achieved_flops == pytest.approx(r.flops / r.median_s)
        assert m["flops_fraction_of_peak"] == pytest.approx(r.achieved_flops / env["peak_flops_by_dtype"]["float32"])
        assert 0 <= r.max_abs_err < 1e-3
        # the backend's own memory, not the worker's ~300 MB of interpreter and torch
        assert m["peak_mem_kind"] == "process_vmhwm_over_before" and 0 <= r.peak_mem_bytes < m["process_peak_rss_bytes"]
        assert m["process_peak_rss_bytes"] - r.peak_mem_bytes >= 100 << 20
        assert m["compile_cache"] == "n/a"  # eager, TorchScript and ONNX Runtime keep no compile cache on disk
        assert r.first_call_s > 0 and r.finished >= r.started
        # eager compiles nothing: no compile time (not its prepare()'s microseconds); the report charts its first call
        assert pd.isna(r.compile_s) if r.backend == "eager" else r.compile_s >= 0
        assert m["interleaved"] is True and m["threads"] == 1
        assert {"p5", "p50", "p95", "p99"} <= set(m["latency_s"])
        assert m["perf"].startswith("unavailable") or m["instructions_per_call"] > 0
    script = df[df.backend == "jit.script"].iloc[0]
    assert "def forward" in script.artifact
    assert "nodes" in df[df.backend == "onnxruntime"].iloc[0].artifact  # the exported graph's op summary
    # resume: everything is finished, nothing runs, no row is added
    again = sweep(spec, db=db, resume=True, progress=False, table=False)
    assert again.run_id == res.run_id and again.ran == 0
    with open_store(db) as s:
        assert len(s.cells(res.run_id, latest_only=False)) == 12


def test_training_mode_with_torch_compile_checks_gradients(db: str, fast: dict):
    res = sweep(variants=["min_gru"], backends=["eager", "compile", "onnxruntime"], batch=[2], seq_len=[3],
                mode=["training"], params={"input_size": 3, "hidden": 4}, db=db, progress=False, table=False, **fast)
    with open_store(db) as s:
        df = s.cells(res.run_id).set_index("backend")
    assert df.loc["eager", "status"] == "ok" and df.loc["compile", "status"] == "ok"
    assert df.loc["compile", "compile_s"] > 0
    assert df.loc["onnxruntime", "status"] == "skipped" and "inference only" in df.loc["onnxruntime", "error"]
    req = Request(2, 3, "TNC", {"input_size": 3, "hidden": 4})
    assert df.loc["eager", "flops"] == pytest.approx(3 * variant_registry()["min_gru"]().flops(req))


def test_nnforge_backend_runs_or_says_why_not(db: str, fast: dict):
    backends = ["eager", "nnforge.reference", "nnforge.triton", "nnforge.triton+graphs"]
    res = sweep(variants=["torch_gru"], backends=backends, batch=[2], seq_len=[3],
                params={"input_size": 3, "hidden": 4}, db=db, progress=False, table=False, **fast)
    with open_store(db) as s:
        df = s.cells(res.run_id).set_index("backend")
    try:
        import nnforge as nf

        available = set(nf.available_backends())
    except (ImportError, AttributeError):
        available = set()
    row = df.loc["nnforge.reference"]
    if "reference" in available:
        assert row["status"] == "ok", row["error"]
        assert row["artifact"]  # the IR listing
    else:
        assert row["status"] == "skipped" and row["error"]
    for name in ("nnforge.triton", "nnforge.triton+graphs"):  # CPU cells: Triton kernels are measured on a GPU only
        row = df.loc[name]
        assert row["status"] == "skipped" and "cuda" in row["error"], row["error"]


def test_cuda_cells_without_a_gpu_are_skipped_with_the_reason(db: str, fast: dict):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = sweep(variants=["lstm_manual"], backends=["eager", "cudagraphs"], batch=[2], seq_len=[3], device=["cuda"],
                params={"input_size": 3, "hidden": 4}, db=db, progress=False, table=False, **fast)
    with open_store(db) as s:
        df = s.cells(res.run_id)
    assert set(df["status"]) == {"skipped"} and set(df["error"]) == {"no CUDA device on this machine"}


@pytest.mark.parametrize("layout", ["TNC", "NTC"])
def test_nnforge_training_step_matches_eager_gradients(db: str, fast: dict, layout: str):
    """Training mode on nnforge: one compiled program (forward + backprop through time) gives the outputs and the
    weights' gradients; they reach the module's parameters (b_ih and b_hh from the one bias nnforge sees), and the
    harness checks them against float64 eager autograd like any backend's. Both layouts: the cotangent is mapped
    back through the variant's output transpose."""
    import nnforge as nf

    backends = ["eager", "nnforge.reference"] + (["nnforge.cpu"] if "cpu" in nf.available_backends() else [])
    res = sweep(variants=["lstm_manual", "lstm_combined", "lstm_stacked", "torch_lstm", "torch_gru", "min_gru"],
                backends=backends, batch=[3], seq_len=[4], mode=["training"], layout=[layout],
                params={"input_size": 3, "hidden": 5}, db=db, progress=False, table=False, **fast)
    with open_store(db) as s:
        df = s.cells(res.run_id)
    for _, r in df.iterrows():
        if r.variant == "min_gru" and r.backend.startswith("nnforge"):
            assert r.status == "skipped" and "no nnforge implementation" in r.error
        else:
            assert r.status == "ok", (r.variant, r.backend, r.error)
            assert r.max_abs_err < 1e-3
    assert {b for b in df.backend if b.startswith("nnforge")} == set(backends) - {"eager"}
