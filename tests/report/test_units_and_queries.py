"""The web view's ±CI is the CLI's (the larger side of the interval over the median); no query value is an HTTP 500
(a bad integer filter matches nothing, a bad page number is the default page); and the report's charts and headline
give each cell its own throughput unit when variants count different items (bonito samples/s, LSTMs vectors/s)."""

from __future__ import annotations

import io
import json
import random
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from report_synth import add_run, bulk_insert, cell_row, get, new_db
from rich.console import Console

from nnforge.modelview.console import closing_table
from nnforge.modelview.report.build import headline
from nnforge.modelview.report.common import MIXED_UNITS
from nnforge.modelview.report.data import Database
from nnforge.modelview.report.figures import common_setting, max_throughput, scaling
from nnforge.modelview.store import Store
from nnforge.modelview.web import running

RUN = "run-ci"


def _asymmetric_rows(seed: int) -> list[dict]:
    """Cells whose CIs are lopsided (seeded), so the mean half-width and the larger side differ."""
    rng = random.Random(seed)
    rows = []
    for i, (backend, batch) in enumerate((b, n) for b in ("eager", "jit.script") for n in (2, 8)):
        med = rng.uniform(1e-4, 1e-3)
        r = cell_row(RUN, "lstm_manual", backend, batch, 16, med, seed=seed + i)
        r["ci_low_s"] = med * (1 - rng.uniform(0.002, 0.01))
        r["ci_high_s"] = med * (1 + rng.uniform(0.03, 0.08))
        rows.append(r)
    return rows


@pytest.fixture(scope="module")
def ci_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = new_db(tmp_path_factory.mktemp("ci") / "ci.db")
    add_run(path, "ci", run_id=RUN, created=1_790_000_000.0)
    bulk_insert(path, _asymmetric_rows(seed=97))
    return path


@pytest.fixture(scope="module")
def view(ci_db: Path) -> Iterator[str]:
    with running(ci_db) as url:
        yield url


def _web_ci(html: str) -> dict[tuple[str, int], str]:
    """(backend, batch) -> the ±CI column of the run page's cell table."""
    out = {}
    for row in re.findall(r'<tr class="cell-row".*?</tr>', html, re.S):
        tds = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        out[(tds[2], int(tds[3]))] = tds[9]
    return out


def test_web_ci_is_the_cli_ci(ci_db: Path, view: str) -> None:
    status, html = get(f"{view}/runs/{RUN}")
    assert status == 200
    web = _web_ci(html)
    with Store(ci_db) as s:
        df = s.cells(RUN)
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(closing_table(df, backend_order=["eager", "jit.script"]))
    cli = buf.getvalue()
    assert len(web) == 4
    for r in df.itertuples():
        larger = max(r.ci_high_s - r.median_s, r.median_s - r.ci_low_s) / r.median_s
        want = f"{100 * larger:.1f}%"
        assert web[(r.backend, r.batch)] == want
        assert want in cli
        assert f"{50 * (r.ci_high_s - r.ci_low_s) / r.median_s:.1f}%" != want  # the mean half-width differs


BAD = ["²", "99999999999999999999999", "-99999999999999999999999", "--5", "٣", "1e3", " 7"]


@pytest.mark.parametrize("value", BAD)
def test_a_bad_integer_filter_matches_nothing(view: str, value: str) -> None:
    q = urllib.parse.urlencode({"batch": value})
    status, html = get(f"{view}/runs/{RUN}?{q}")
    assert status == 200 and 'id="no-cells"' in html
    status, body = get(f"{view}/api/runs/{RUN}/cells?{q}")
    assert status == 200 and json.loads(body)["total"] == 0
    status, body = get(f"{view}/api/runs/{RUN}/figures?{urllib.parse.urlencode({'seq_len': value})}")
    assert status == 200 and json.loads(body)["n_cells"] == 0


@pytest.mark.parametrize("value", ["²", "٣", "-3", "x", "99999999999999999999999"])
@pytest.mark.parametrize("name", ["page", "per_page"])
def test_a_bad_page_argument_is_not_an_error(view: str, name: str, value: str) -> None:
    q = urllib.parse.urlencode({name: value})
    status, body = get(f"{view}/api/runs/{RUN}/cells?{q}")
    assert status == 200
    data = json.loads(body)
    assert data["total"] == 4 and data["page"] == 1 and len(data["cells"]) >= 1
    assert get(f"{view}/runs/{RUN}?{q}")[0] == 200
    assert get(f"{view}/compare?a={RUN}&b={RUN}&{q}")[0] == 200


def test_good_integer_filters_still_match(view: str) -> None:
    data = json.loads(get(f"{view}/api/runs/{RUN}/cells?batch=8&batch=-1")[1])
    assert data["total"] == 2 and {c["batch"] for c in data["cells"]} == {8}


def _mixed_unit_db(path: Path, seed: int) -> str:
    """Three LSTM variants (vectors/s, the commonest unit) and a faster bonito counting samples/s, seeded times."""
    rng = random.Random(seed)
    new_db(path)
    rid = add_run(path, "mixed", run_id="run-mixed", created=1_790_000_000.0)
    rows = []
    for v in ("lstm_manual", "lstm_premult", "torch_lstm", "bonito"):
        for backend in ("eager", "jit.script"):
            for batch in (2, 8):
                med = rng.uniform(1e-3, 4e-3) * (0.01 if v == "bonito" else 1.0)
                r = cell_row(rid, v, backend, batch, 16, med, seed=rng.randrange(10**6))
                if v == "bonito":
                    r["throughput_unit"] = "samples/s"
                rows.append(r)
    bulk_insert(path, rows)
    return rid


def test_each_bar_and_the_headline_carry_their_own_unit(tmp_path: Path) -> None:
    rid = _mixed_unit_db(tmp_path / "mixed.db", seed=23)
    cells = Database(tmp_path / "mixed.db").cells(rid)
    unit = {c.cell_key: c.throughput_unit for c in cells}
    best = max(cells, key=lambda c: c.throughput or 0)
    assert best.variant == "bonito" and headline(cells).endswith(" samples/s")
    for fig in (max_throughput(cells), common_setting(cells)):
        plot = fig.plot
        assert plot["layout"]["xaxis"]["title"]["text"] == f"Throughput ({MIXED_UNITS})"
        seen = set()
        for tr in plot["data"]:
            assert tr["hovertemplate"].endswith("%{customdata[2]}<extra></extra>")
            for text, (key, _, u) in zip(tr["text"], tr["customdata"]):
                assert u == unit[key] and f" {u} · " in text
                seen.add(u)
        assert seen == {"vectors/s", "samples/s"}, fig.id
    panels = scaling(cells, "batch").plot
    titles = {k: v["title"]["text"] for k, v in panels["layout"].items() if k.startswith("yaxis") and "title" in v}
    assert sorted(titles.values()) == ["samples/s", "vectors/s", "vectors/s", "vectors/s"]
    for tr in panels["data"]:
        for key, _, u in tr.get("customdata", []):
            assert u == unit[key]


def test_one_unit_keeps_its_name_on_the_axis(tmp_path: Path) -> None:
    rid = _mixed_unit_db(tmp_path / "mixed.db", seed=29)
    cells = [c for c in Database(tmp_path / "mixed.db").cells(rid) if c.variant != "bonito"]
    assert max_throughput(cells).plot["layout"]["xaxis"]["title"]["text"] == "Throughput (vectors/s)"
    assert headline(cells).endswith(" vectors/s")
