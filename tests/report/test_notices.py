"""The report says what a reader must know before trusting its charts: an unfinished run, a busy machine, cells that
missed their confidence target, and that scaling curves join settings measured at different times."""

from __future__ import annotations

from pathlib import Path

import report_synth as synth

from nnforge.modelview.report.build import build_report, render_html

SPEC = {"name": "partial", "variants": ["lstm_manual"], "backends": ["eager", "jit.script"], "batch": [1, 4, 16],
        "seq_len": [8, 32], "params": {"hidden": 32}, "timing": {"target_rel_ci": 0.01}}


def _rows(run_id: str, busy: bool) -> list[dict]:
    rows = []
    for batch in (1, 4, 16):
        for be in ("eager", "jit.script"):
            metrics = {"loadavg_1m": [4.6, 5.1] if busy else [0.3, 0.4], "ci_converged": not (busy and batch == 16),
                       "on_cpu_fraction": 0.41 if busy else 0.99}
            rows.append(synth.cell_row(run_id, "lstm_manual", be, batch, 8, 1e-4 * batch, metrics=metrics, seed=batch))
    return rows


def test_partial_busy_run_says_so(tmp_path: Path) -> None:
    db = synth.new_db(tmp_path / "p.db")
    rid = synth.add_run(db, "partial", spec=SPEC, env={**synth.ENV, "cpu_count": 2})
    synth.bulk_insert(db, _rows(rid, busy=True))
    r = build_report(db, rid)
    text = " ".join(r.notices)
    assert "6 of 12 planned cells not measured" in text
    assert "load average up to 5.1 on 2 CPUs" in text and "on-CPU fraction down to 0.41" in text
    assert "2 of 6 timed cells missed their confidence target (±1 %)" in text
    assert "not interleaved" in r.figure("scaling_batch").note and "busy" in r.figure("scaling_batch").note
    assert 'id="notices"' in render_html(r)


def test_a_complete_quiet_run_has_no_notices(tmp_path: Path) -> None:
    db = synth.new_db(tmp_path / "q.db")
    spec = {**SPEC, "seq_len": [8]}
    rid = synth.add_run(db, "complete", spec=spec)
    synth.bulk_insert(db, _rows(rid, busy=False))
    r = build_report(db, rid)
    assert r.notices == []
    assert "busy" not in r.figure("scaling_batch").note and "not interleaved" in r.figure("scaling_batch").note


def test_a_loaded_machine_whose_cells_did_not_wait_says_only_the_load(tmp_path: Path) -> None:
    db = synth.new_db(tmp_path / "l.db")
    rid = synth.add_run(db, "loaded", spec=SPEC, env={**synth.ENV, "cpu_count": 2})
    rows = _rows(rid, busy=True)
    for row in rows:  # the load was high, yet every cell ran all the time it was timed
        row["metrics_json"]["on_cpu_fraction"] = 1.0
    synth.bulk_insert(db, rows)
    text = " ".join(build_report(db, rid).notices)
    assert "load average up to 5.1 on 2 CPUs" in text and "on-CPU fraction" not in text
