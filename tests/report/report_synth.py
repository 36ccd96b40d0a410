"""Synthetic store files for the report tests: known values (so figure data can be checked exactly), edge cases
(empty, only failures, GPU telemetry with throttling) and a 10,000-cell run written with one bulk insert.

The schema comes from the store itself (``Store(path)`` creates it), so these rows stay true to the writer's columns.
"""

from __future__ import annotations

import json
import math
import random
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from nnforge.modelview.store import CELL_COLUMN_NAMES, Store


def get(url: str) -> tuple[int, str]:
    """A page's status and body, an HTTP error's as well (the web view's tests read both)."""
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


ENV = {
    "cpu_model": "Synthetic CPU @ 3.0GHz",
    "gpu_model": None,
    "threads": 2,
    "git_commit": "0123456789abcdef",
    "libraries": {"torch": "2.13.0", "numpy": "2.4"},
    "peaks": {"peak_flops": 2.0e11, "peak_flops_by_dtype": {"float32": 2.0e11, "float64": 1.0e11},
              "peak_bytes_per_s": 2.0e10},
}


def new_db(path: Path) -> Path:
    Store(path).close()
    return path


def add_run(path: Path, name: str, env: Mapping[str, Any] = ENV, spec: Mapping[str, Any] | None = None,
            run_id: str | None = None, created: float | None = None) -> str:
    with Store(path) as s:
        rid = s.new_run(name, json.dumps(spec or {"name": name, "variants": ["x"]}), env, run_id=run_id)
    if created is not None:
        con = sqlite3.connect(path)
        con.execute("UPDATE runs SET created = ? WHERE run_id = ?", (created, rid))
        con.commit()
        con.close()
    return rid


def cell_row(run_id: str, variant: str, backend: str, batch: int, seq_len: int, median_s: float | None,
             status: str = "ok", dtype: str = "float32", layout: str = "TNC", mode: str = "inference",
             params: Mapping[str, Any] | None = None, n_samples: int = 30, error: str | None = None,
             metrics: Mapping[str, Any] | None = None, seed: int = 0, compile_s: float | None = None,
             artifact: str | None = None) -> dict[str, Any]:
    """One row as the runner writes it; throughput = batch·seq_len / median_s vectors/s."""
    params = dict(params or {"hidden": 32})
    pj = json.dumps(params, sort_keys=True, separators=(",", ":"))
    setting = f"{variant}|N={batch}|T={seq_len}|{layout}|{dtype}|{mode}|cpu|{pj}"
    row: dict[str, Any] = {
        "run_id": run_id, "cell_key": f"{setting}|{backend}", "setting_key": setting, "variant": variant,
        "backend": backend, "batch": batch, "seq_len": seq_len, "layout": layout, "dtype": dtype, "mode": mode,
        "device": "cpu", "params_json": pj, "status": status, "error": error, "started": time.time(),
        "finished": time.time() + 1, "throughput_unit": "vectors/s",
    }
    if status == "ok" and median_s:
        rng = random.Random(seed)
        samples = sorted(median_s * math.exp(rng.gauss(0, 0.03)) for _ in range(n_samples))
        flops = 8.0 * 32 * 32 * batch * seq_len
        nbytes = 4.0 * (4 * 32 * 32 + batch * seq_len * 64)
        row |= {
            "compile_s": compile_s if compile_s is not None else (None if backend == "eager" else 0.05 + 0.01 * batch),
            "first_call_s": median_s * 3, "median_s": median_s, "ci_low_s": median_s * 0.98,
            "ci_high_s": median_s * 1.02, "throughput": batch * seq_len / median_s, "flops": flops,
            "bytes": nbytes, "achieved_flops": flops / median_s, "achieved_bytes_per_s": nbytes / median_s,
            "peak_mem_bytes": 1 << 20, "max_abs_err": 1e-7,
            "metrics_json": {"latency_s": {"p50": median_s}, **(metrics or {})},
            "samples_json": samples, "artifact": artifact,
        }
    return row


def bulk_insert(path: Path, rows: Iterable[Mapping[str, Any]]) -> int:
    """One transaction for all rows (the store's per-row durable commits would take minutes for 10,000)."""
    rows = list(rows)
    con = sqlite3.connect(path)
    cols = list(CELL_COLUMN_NAMES)
    enc = [tuple(json.dumps(r[c]) if isinstance(r.get(c), dict | list) else r.get(c) for c in cols) for r in rows]
    with con:
        con.executemany(f"INSERT INTO cells({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})", enc)
    con.close()
    return len(rows)


# Known times: eager is the slowest, jit.script 2× faster than eager, "fast" 4× faster at batch 16.
def small_rows(run_id: str, scale: float = 1.0) -> list[dict[str, Any]]:
    rows = []
    speed = {"eager": 1.0, "jit.script": 2.0, "fast": 4.0}
    seed = 0
    for variant, base in (("lstm_manual", 1e-3), ("min_gru", 5e-4)):
        for batch in (1, 4, 16):
            for seq_len in (8, 32):
                for be, sp in speed.items():
                    seed += 1
                    if be == "fast" and batch < 16:
                        continue
                    t = base * scale * (batch**0.5) * (seq_len / 8) / sp
                    rows.append(cell_row(run_id, variant, be, batch, seq_len, t, seed=seed,
                                         artifact="def kernel():\n    pass" if be != "eager" else None))
    rows.append(cell_row(run_id, "min_gru", "broken", 4, 8, None, status="failed",
                         error="RuntimeError: kernel launch failed\nTraceback (most recent call last): ..."))
    rows.append(cell_row(run_id, "lstm_manual", "tensorrt", 4, 8, None, status="skipped",
                         error="tensorrt is not installed"))
    rows.append(cell_row(run_id, "lstm_manual", "jit.trace", 16, 32, None, status="mismatch",
                         error="max abs err 0.3 > atol 1e-3 </script><b>x</b>"))
    return rows


def make_small(path: Path) -> tuple[str, str]:
    """Two runs of the same spec (the second 10 % slower) for report and compare tests."""
    new_db(path)
    a = add_run(path, "small", run_id="run-a", created=1_790_000_000.0)
    bulk_insert(path, small_rows(a))
    b = add_run(path, "small", run_id="run-b", created=1_790_000_100.0)
    bulk_insert(path, small_rows(b, scale=1.1))
    return a, b


def make_gpu(path: Path) -> str:
    new_db(path)
    env = {**ENV, "gpu_model": "Synthetic GPU 80GB"}
    rid = add_run(path, "gpu", env=env)
    rows = []
    for i, be in enumerate(("eager", "jit.script")):
        for batch in (8, 64):
            throttle = ["sw_power_cap"] if (be == "eager" and batch == 64) else []
            gpu = {"sm_clock_mhz_mean": 1980.0 - 300 * bool(throttle), "power_w_mean": 250.0 + batch,
                   "energy_per_call_j": 0.01 * batch, "energy_per_item_j": 0.01 / 64, "throttle_reasons": throttle}
            rows.append(cell_row(rid, "torch_lstm", be, batch, 64, 1e-3 * batch / (i + 1), metrics={"gpu": gpu}))
    bulk_insert(path, rows)
    return rid


def make_only_failed(path: Path) -> str:
    new_db(path)
    rid = add_run(path, "all-failed")
    statuses = ("failed", "timeout", "oom", "crashed", "skipped")
    bulk_insert(path, [cell_row(rid, "lstm_manual", be, 4, 8, None, status=st, error=f"{st}: reason {i}")
                       for i, (be, st) in enumerate(zip(("eager", "jit.script", "a", "b", "c"), statuses))])
    return rid


def make_huge(path: Path, n: int = 10_000, n_samples: int = 50) -> str:
    """A 10,000-cell run: 10 variants × 5 backends × 10 batch sizes × 5 lengths × 2 dtypes × 2 layouts."""
    new_db(path)
    rid = add_run(path, "huge")
    rows = []
    rng = random.Random(1)
    backends = ("eager", "jit.script", "jit.trace", "nnforge.cpu", "onnxruntime")
    for v in range(10):
        for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
            for seq_len in (16, 32, 64, 128, 256):
                for dtype in ("float32", "float64"):
                    for layout in ("TNC", "NTC"):
                        for j, be in enumerate(backends):
                            if len(rows) >= n:
                                break
                            t = 1e-5 * (1 + v) * batch**0.7 * seq_len / (1 + 0.3 * j) * rng.uniform(0.9, 1.1)
                            st = "ok" if rng.random() > 0.02 else "failed"
                            rows.append(cell_row(rid, f"variant_{v}", be, batch, seq_len, t, status=st,
                                                 dtype=dtype, layout=layout, n_samples=n_samples,
                                                 seed=len(rows), error=None if st == "ok" else "synthetic failure"))
    bulk_insert(path, rows)
    return rid


def drifting_rows(run_id: str, seed: int, slower: Mapping[str, float] | None = None, rounds: int = 30,
                  per_round: int = 3) -> list[dict[str, Any]]:
    """Rows as a worker writes them on a machine whose pace wanders: interleaved rounds (``sample_rounds``), every
    backend of a round at the same pace; ``slower`` multiplies a backend's time (a code change)."""
    rng = random.Random(seed)
    rows = []
    for variant in ("lstm_manual", "torch_lstm"):
        for batch in (4, 16, 64):
            base = {"eager": 1e-4 * batch, "jit.script": 0.6e-4 * batch, "onnxruntime": 0.8e-4 * batch}
            times = {b: t * (slower or {}).get(b, 1.0) for b, t in base.items()}
            pace = rng.gauss(0, 0.04)  # this run's pace in this setting
            series: dict[str, tuple[list[float], list[int]]] = {b: ([], []) for b in times}
            for r in range(rounds):
                pace += rng.gauss(0, 0.01)
                for b, t in times.items():
                    for _ in range(per_round):
                        series[b][0].append(t * math.exp(pace + rng.gauss(0, 0.02)))
                        series[b][1].append(r)
            for b, (samples, rnd) in series.items():
                row = cell_row(run_id, variant, b, batch, 8, sorted(samples)[len(samples) // 2],
                               metrics={"sample_rounds": rnd, "round_samples": per_round})
                row["samples_json"] = samples
                rows.append(row)
    return rows


def make_drifting(path: Path) -> tuple[str, str, str]:
    """Three runs on a drifting machine, timed in CPU time: A, B (unchanged code, another time) and C (jit.script
    10 % slower)."""
    new_db(path)
    ids = []
    for i, (name, slower) in enumerate((("a", None), ("b", None), ("c", {"jit.script": 1.1}))):
        rid = add_run(path, "drift", run_id=f"drift-{name}", created=1_790_000_000.0 + i,
                      spec={"name": "drift", "timing": {"clock": "cpu"}})
        bulk_insert(path, drifting_rows(rid, seed=i, slower=slower))
        ids.append(rid)
    return ids[0], ids[1], ids[2]
