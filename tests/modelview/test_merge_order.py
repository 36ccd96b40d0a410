"""``nnforge merge`` keeps what a store means: a ``processes`` > 1 run's pooled row stays each cell's latest row, and a
run that a resume extended in one copy keeps its extended spec whichever source comes first."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from nnforge.modelview.merge import merge
from nnforge.modelview.runner import merge_process_rows
from nnforge.modelview.store import Store

ENV = {"hostname": "alpha", "cpu_model": "Synthetic CPU", "cpu_count": 4}
SPEC = {"name": "p2", "variants": ["lstm_manual"], "backends": ["eager", "jit.script"], "batch": [2], "seq_len": [3],
        "seed": 7}


def _process_row(run_id: str, backend: str, process: int, rng: random.Random, t0: float) -> dict[str, Any]:
    """One process's ok row of a ``processes = 2`` measurement, with seeded samples and times."""
    samples = sorted(rng.uniform(1e-4, 3e-4) for _ in range(9))
    med = samples[4]
    setting = "lstm_manual|N=2|T=3|TNC|float32|inference|cpu|{\"hidden\":8}"
    return {
        "run_id": run_id, "cell_key": f"{setting}|{backend}", "setting_key": setting, "variant": "lstm_manual",
        "backend": backend, "batch": 2, "seq_len": 3, "layout": "TNC", "dtype": "float32", "mode": "inference",
        "device": "cpu", "params_json": '{"hidden":8}', "status": "ok", "error": None,
        "compile_s": rng.uniform(0.01, 0.1), "first_call_s": rng.uniform(1e-3, 1e-2), "median_s": med,
        "ci_low_s": samples[2], "ci_high_s": samples[6], "throughput": 6 / med, "throughput_unit": "vectors/s",
        "flops": 1e4, "bytes": 1e3, "achieved_flops": 1e4 / med, "achieved_bytes_per_s": 1e3 / med,
        "peak_mem_bytes": 1000 + process, "max_abs_err": rng.uniform(1e-8, 1e-7),
        "metrics_json": json.dumps({"process_repeat": process}), "samples_json": json.dumps(samples),
        "started": t0 + 10 * process + rng.uniform(0, 1), "finished": t0 + 10 * process + 5 + rng.uniform(0, 1),
    }


def _pooled_store(path: Path, seed: int) -> str:
    """A store as ``run_repeated`` writes a two-process setting: both processes' rows, then one pooled row per cell
    (its ``started`` the first process's, its ``finished`` the last's)."""
    rng = random.Random(seed)
    t0 = 1.8e9 + rng.uniform(0, 1e6)
    with Store(path) as s:
        rid = s.new_run("p2", json.dumps(SPEC), ENV)
        per_process = {b: [_process_row(rid, b, p, rng, t0) for p in (0, 1)] for b in ("eager", "jit.script")}
        for p in (0, 1):
            for b in per_process:
                s.append_cell(per_process[b][p])
        rows = s.rows(rid, latest_only=False)
        for b in per_process:
            s.append_cell(merge_process_rows([r for r in rows if r["backend"] == b]))
    return rid


def _latest(path: Path, run_id: str) -> dict[str, tuple[float, int | None]]:
    """backend -> (median, processes) of each cell's latest row."""
    with Store(path) as s:
        return {r["backend"]: (r["median_s"], json.loads(r["metrics_json"]).get("processes"))
                for r in s.rows(run_id)}


def test_pooled_rows_stay_the_latest_rows_after_a_merge(tmp_path: Path) -> None:
    src, out = tmp_path / "p2.db", tmp_path / "m.db"
    rid = _pooled_store(src, seed=11)
    before = _latest(src, rid)
    assert {p for _, p in before.values()} == {2}
    res = merge([src], out)
    assert res.rows_added == 6
    assert _latest(out, rid) == before
    merge([src], out)  # idempotent: still the pooled rows
    assert _latest(out, rid) == before


def _extended_pair(tmp_path: Path) -> tuple[Path, Path, str, str]:
    """One run in two stores: ``a`` as first measured, ``b`` a copy whose resume added batch 8 to the grid."""
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    small = json.dumps(SPEC)
    big = json.dumps({**SPEC, "batch": [2, 8]})
    with Store(a) as s:
        rid = s.new_run("p2", small, ENV)
    with Store(b) as s:
        s.import_run({"run_id": rid, "name": "p2", "created": 1.8e9, "spec_json": small, "env_json": "{}"})
        s.update_run_spec(rid, big)
    return a, b, rid, big


def test_the_extended_spec_wins_in_either_order(tmp_path: Path) -> None:
    a, b, rid, big = _extended_pair(tmp_path)
    for name, sources in (("ab.db", [a, b]), ("ba.db", [b, a])):
        res = merge(sources, tmp_path / name)
        assert res.notes == [], name
        with Store(tmp_path / name) as s:
            assert json.loads(s.run(rid)["spec_json"]) == json.loads(big), name


def test_other_spec_differences_keep_the_first_with_a_note(tmp_path: Path) -> None:
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with Store(a) as s:
        rid = s.new_run("p2", json.dumps(SPEC), ENV)
    other = json.dumps({**SPEC, "batch": [8]})  # drops batch 2: not an extension
    with Store(b) as s:
        s.import_run({"run_id": rid, "name": "p2", "created": 1.8e9, "spec_json": other, "env_json": "{}"})
    res = merge([a, b], tmp_path / "m.db")
    assert len(res.notes) == 1 and "kept the first" in res.notes[0]
    with Store(tmp_path / "m.db") as s:
        assert json.loads(s.run(rid)["spec_json"]) == SPEC
