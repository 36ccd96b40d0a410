"""What a pipe shows: Rich assumes 80 columns there, and every table and the progress line must still show every
column whole — the closing table its setting labels, compare and ab their verdict words and right border, the progress
line its cell count and times."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

import pandas as pd
from rich.console import Console

from nnforge.modelview.ab import AbCell, print_ab
from nnforge.modelview.compare import CellChange, print_comparison
from nnforge.modelview.console import SweepProgress, print_closing_table
from nnforge.modelview.revisions import Revision
from nnforge.modelview.stats import Estimate, Verdict

WIDTH = 80
PARAMS = '{"hidden": 128, "input_size": 128}'
LABEL = "lstm_manual N=64 T=100 TNC bfloat16 inference cuda [hidden=128,input_size=128]"
LONG_BACKENDS = ["eager", "nnforge.triton+graphs", "compile.reduce-overhead", "compile.max-autotune"]


def _console() -> Console:
    return Console(width=WIDTH, record=True, file=io.StringIO())


def _table_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln[:1] in "┏┃┡│└"]


def _column(lines: list[str], sep: str, index: int) -> str:
    """The text of one column over the table's lines drawn with ``sep`` (header: ┃, body: │), whitespace removed:
    what folding and wrapping keep of it."""
    return "".join("".join(ln.split(sep)[index + 1].split()) for ln in lines if ln.startswith(sep))


def _flat(s: str) -> str:
    return "".join(s.split())


def _assert_whole(text: str, headers: list[str]) -> list[str]:
    """Every line of the table within the width and closed by its right border; every header whole."""
    lines = _table_lines(text)
    assert lines and all(len(ln) <= WIDTH for ln in lines), text
    assert all(ln[-1] in "┓┃┩│┘" for ln in lines), text  # the right border: no column lost off the edge
    for i, h in enumerate(headers):
        assert _column(lines, "┃", i) == _flat(h), text
    return lines


def _verdicts(rng: random.Random) -> list[Verdict]:
    """An inconclusive, a no-change and a slower verdict with seeded figures."""
    a, b, c = rng.uniform(-0.03, -0.01), rng.uniform(-0.01, 0.01), rng.uniform(0.1, 0.2)
    return [Verdict(a, (a - 0.03, a + 0.03), "inconclusive", 0.02, 0.99, 0.08),
            Verdict(b, (b - 0.005, b + 0.005), "no change", 0.02, 0.99, 0.08),
            Verdict(c, (c - 0.03, c + 0.03), "slower", 0.02, 0.99, 0.08)]


def test_closing_table_at_80_columns_keeps_every_header_and_the_whole_setting_label():
    """Long backend names used to take the room: the setting column was squeezed to three letters a line."""
    rng = random.Random(3)
    rows = []
    for b in LONG_BACKENDS:
        ok = b != "compile.max-autotune"
        med = rng.uniform(1e-3, 2e-3)
        rows.append({"setting_key": "s", "cell_key": f"s|{b}", "backend": b, "status": "ok" if ok else "failed",
                     "error": None if ok else "RuntimeError: no", "variant": "lstm_manual", "batch": 64,
                     "seq_len": 100, "layout": "TNC", "dtype": "bfloat16", "mode": "inference", "device": "cuda",
                     "params_json": PARAMS, "throughput": 6400 / med if ok else None, "throughput_unit": "vectors/s",
                     "median_s": med if ok else None, "ci_low_s": med * 0.97 if ok else None,
                     "ci_high_s": med * 1.04 if ok else None, "metrics_json": "{}"})
    con = _console()
    print_closing_table(pd.DataFrame(rows), con)
    text = con.export_text()
    lines = _assert_whole(text, ["setting", "backend", "throughput vectors/s", "time/call", "vs eager", "±CI"])
    assert _flat(LABEL) in _column(lines, "│", 0)  # one unit: said once, in the header
    backends = _column(lines, "│", 1)
    assert all(b in backends for b in LONG_BACKENDS)
    assert _column(lines, "│", 2).count("vectors/s") == 0 and "failed" in _column(lines, "│", 2)
    rows[0] |= {"throughput_unit": "samples/s"}  # mixed units: each row says its own, folded in the column
    con = _console()
    print_closing_table(pd.DataFrame(rows), con)
    lines = _assert_whole(con.export_text(), ["setting", "backend", "throughput", "time/call", "vs eager", "±CI"])
    assert _column(lines, "│", 2).count("vectors/s") == 2 and _column(lines, "│", 2).count("samples/s") == 1
    setting_width = len(lines[0].split("┳")[0]) - 3  # the setting column's text width
    assert setting_width >= 16, text


def _changes(rng: random.Random) -> list[CellChange]:
    e = Estimate(0.0, 0.01, 10, 30, 1)
    return [CellChange(f"{LABEL}|{b}", LABEL, b, rng.uniform(1e-3, 2e-3), rng.uniform(1e-2, 2e-2), "vs eager", e, e, v)
            for b, v in zip(LONG_BACKENDS, _verdicts(rng))]


def test_compare_at_80_columns_keeps_the_verdict_words_the_border_and_whole_notes():
    rng = random.Random(5)
    note = f"status ok → failed: {LABEL}|compile.max-autotune"
    con = _console()
    print_comparison("20260101-120000-abc123", "20260102-120000-def456", _changes(rng), [note], con)
    text = con.export_text()
    lines = _assert_whole(text, ["cell", "ms/call A → B", "figure", "change [CI]", "verdict"])
    verdicts = _column(lines, "│", 4)
    assert verdicts == _flat("inconclusive no change within ±2 % slower")
    assert note in text.splitlines()  # not hard-wrapped in the middle of the cell key


def test_ab_at_80_columns_keeps_the_verdict_words_and_the_border():
    rng = random.Random(9)
    cells = [AbCell(LABEL, b, rng.uniform(1e-3, 2e-3), rng.uniform(1e-2, 2e-2), v, rng.randrange(10, 200))
             for b, v in zip(LONG_BACKENDS, _verdicts(rng))]
    revs = [Revision("main", "a" * 40, "", Path(".")), Revision("feature/a-long-branch-name", "b" * 40, "", Path("."))]
    con = _console()
    print_ab(cells, *revs, con)
    text = con.export_text()
    lines = _assert_whole(text, ["cell", "backend", "ms/call A → B", "change [CI]", "rounds", "verdict"])
    assert _column(lines, "│", 5) == _flat("inconclusive no change within ±2 % slower")
    assert _column(lines, "│", 0) == _flat(LABEL) * 3
    assert _column(lines, "│", 1) == "".join(LONG_BACKENDS[:3])


def test_progress_line_at_80_columns_keeps_the_cell_count_and_times():
    """The description (status counts first, then the setting) gives way; the count and times do not."""
    con = _console()
    with SweepProgress(12, console=con) as bar:
        bar.setting(LABEL)
        bar.done("ok")
        bar.done("failed")
    (line,) = [ln for ln in con.export_text().splitlines() if ln.strip()]
    assert len(line) <= WIDTH
    assert re.search(r"2/12 cells \d+:\d\d:\d\d ETA [-\d]+:[-\d]+:[-\d]+$", line.rstrip()), line
    assert "failed=1 ok=1 lstm_" in line
