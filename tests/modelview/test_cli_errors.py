"""What a user sees when something is wrong: one line naming it, exit 2; labels and reasons printed as written."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview import open_store
from nnforge.modelview.console import SweepProgress, print_closing_table
from nnforge.modelview.reasons import failure_reason

RUNNER = CliRunner()
TB = 'Traceback (most recent call last):\n  File "x.py", line 3, in f\n    g()\n'


def _spec(tmp_path: Path, faulty: str, batch: str = "[2]", budget: float = 0.1) -> Path:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        f'name = "ext"\nvariants = ["test_tanh"]\nbackends = ["eager"]\nbatch = {batch}\nseq_len = [3]\n'
        f'plugins = ["{faulty}"]\nmeasure_peaks = false\n\n[timing]\nbudget_s = {budget}\nwarmup_max_s = 0.05\n'
        "min_samples = 5\nthreads = 1\ntarget_rel_ci = 0.05\n"
    )
    return spec


def test_a_store_that_cannot_be_opened_is_one_line_exit_2(tmp_path: Path, faulty: str):
    spec = _spec(tmp_path, faulty)
    for db, words in ((tmp_path / "no_such_dir" / "x.db", "does not exist"), (tmp_path, "is a directory")):
        r = RUNNER.invoke(app, ["sweep", str(spec), "--db", str(db)])
        assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
        assert f"cannot open store {db}" in r.output and words in r.output
    r = RUNNER.invoke(app, ["compare", "a", "b", "--db", str(tmp_path / "none.db")])
    assert r.exit_code == 2 and r.output.strip() == f"error: no store at {tmp_path / 'none.db'}"


def test_a_bad_spec_is_rejected_before_torch_is_imported(tmp_path: Path):
    code = ("import sys\nfrom typer.testing import CliRunner\nfrom nnforge.cli import app\n"
            "r = CliRunner().invoke(app, ['sweep', '-v', 'lstm_manual', '--layout', 'CNT', '--db', sys.argv[1]])\n"
            "print(r.exit_code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.db")], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.split() == ["2", "False"], out.stderr


def test_error_lines_are_not_wrapped_in_a_pipe(tmp_path: Path):
    long = tmp_path / ("a_rather_long_directory_name_" * 4) / "spec.toml"
    r = RUNNER.invoke(app, ["sweep", str(long), "--db", str(tmp_path / "x.db")])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and str(long) in r.output


def test_failure_reason_is_the_reason():
    assert failure_reason(TB + "RuntimeError: boom\n") == "RuntimeError: boom"
    setup = "setting setup failed: " + TB + "MemoryError: no\n"
    assert failure_reason(setup) == "setting setup failed: MemoryError: no"
    crash = "worker killed by SIGSEGV (during timing of eager)\n--- worker output (tail) ---\n" \
            'Fatal Python error: Segmentation fault\n  File "w.py", line 9 in run'
    assert failure_reason(crash) == "worker killed by SIGSEGV (during timing of eager)"
    chained = TB + "KeyError: 'a'\n\nDuring handling of the above exception, another exception occurred:\n\n" + TB + \
        "ValueError: bad\n    ^^^^\n"
    assert failure_reason(chained) == "ValueError: bad"
    assert failure_reason(None) == "no reason recorded"


def _row(backend: str, status: str, error: str | None = None) -> dict:
    ok = status == "ok"
    return {"setting_key": "s", "cell_key": f"s|{backend}", "backend": backend, "status": status, "error": error,
            "variant": "lstm_manual", "batch": 4, "seq_len": 8, "layout": "TNC", "dtype": "float32",
            "mode": "inference", "device": "cpu", "params_json": '{"hidden": 16}', "throughput": 1e5 if ok else None,
            "throughput_unit": "vectors/s", "median_s": 1e-3 if ok else None, "ci_low_s": 9e-4 if ok else None,
            "ci_high_s": 1.1e-3 if ok else None, "metrics_json": "{}"}


def test_labels_with_brackets_and_failure_reasons_are_printed_as_written():
    df = pd.DataFrame([_row("eager", "ok"), _row("[bold]x", "failed", TB + "RuntimeError: boom"),
                       _row("jit.script", "crashed", "worker killed by SIGSEGV (during timing)\n  File a.py")])
    con = Console(record=True, width=200)
    print_closing_table(df, con)
    text = con.export_text()
    assert text.count("[hidden=16]") == 3 and "[bold]x" in text  # the table's setting label and two reason lines
    assert "RuntimeError: boom" in text and "worker killed by SIGSEGV (during timing)" in text
    assert "Traceback" not in text and "File a.py" not in text
    assert "1 ms" in text and re.search(r"│ +100k │", text) and "vectors/s" in text  # the shared unit in the header
    con = Console(record=True, width=200)
    with SweepProgress(3, console=con) as bar:
        bar.setting("lstm_manual N=4 [hidden=16]")
        bar.done("ok")
    assert "[hidden=16]" in con.export_text()


def test_resume_with_an_extended_grid_measures_only_the_new_cells(tmp_path: Path, faulty: str):
    db = tmp_path / "r.db"
    base = ["--db", str(db), "--quiet"]
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty)), *base])
    assert r.exit_code == 0, r.output
    run = re.findall(r"^\d{8}-\d{6}-\w+$", r.output, re.M)[-1]
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty, batch="[2, 3]")), *base, "--resume"])
    assert r.exit_code == 0 and "extended grid" in r.output and run in r.output, r.output
    with open_store(db) as s:
        rows = s.cells(run, latest_only=False)
    assert sorted(rows["batch"]) == [2, 3]  # the batch-2 cell was not measured again
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty, batch="[2, 3]", budget=0.2)), *base, "--resume"])
    assert r.exit_code == 0 and "not resuming run" in r.output and "timing.budget_s is 0.2, was 0.1" in r.output


def test_dry_run_clock_and_processes_flags(tmp_path: Path, faulty: str):
    db = tmp_path / "d.db"
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty, batch="[2, 3, 4]")), "--db", str(db), "--dry-run",
                            "--clock", "cpu", "--processes", "2"])
    assert r.exit_code == 0 and "3 cells in 3 settings × 2 process(es)" in r.output and not db.exists()
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty)), "--db", str(db), "--clock", "sundial"])
    assert r.exit_code == 2 and "timing.clock" in r.output and "sundial" in r.output


def test_cpu_peak_memory_is_the_backends_own():
    from nnforge.modelview.worker import cpu_peak_bytes

    assert cpu_peak_bytes(350 << 20, 300 << 20) == 50 << 20
    assert cpu_peak_bytes(300 << 20, 310 << 20) == 0 and cpu_peak_bytes(None, 1) is None
    assert cpu_peak_bytes(300 << 20, None) == 300 << 20  # no reset possible: the process figure


def test_compile_cache_hit_or_miss(tmp_path: Path, monkeypatch):
    from nnforge.modelview import compilecache as cc

    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path / "cache"))
    dirs = cc.cache_dirs("nnforge.cpu")
    assert dirs == [tmp_path / "cache"] and cc.cache_dirs("eager") == [] and cc.cache_dirs("nnforge.reference") == []
    before = cc.snapshot(dirs)  # missing directory: empty
    (tmp_path / "cache" / "c").mkdir(parents=True)
    (tmp_path / "cache" / "c" / "k.so").write_bytes(b"\x7fELF")
    after = cc.snapshot(dirs)
    assert cc.verdict(dirs, before, after)["compile_cache"] == "miss"
    assert cc.verdict(dirs, after, cc.snapshot(dirs)) == {"compile_cache": "hit", "compile_cache_new_files": 0,
                                                          "compile_cache_dir": str(tmp_path / "cache")}
    assert cc.verdict([], set(), set()) == {"compile_cache": "n/a"}
    # nnforge.triton: the generated module in nnforge's cache, the built kernels in Triton's
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    dirs = cc.cache_dirs("nnforge.triton+graphs")
    assert dirs == [tmp_path / "cache", tmp_path / "triton"]
    before = cc.snapshot(dirs)
    (tmp_path / "triton" / "HASH").mkdir(parents=True)
    (tmp_path / "triton" / "HASH" / "k0_scan.cubin").write_bytes(b"\x7fELF")
    assert cc.verdict(dirs, before, cc.snapshot(dirs))["compile_cache"] == "miss"
    monkeypatch.delenv("TRITON_CACHE_DIR")
    assert cc.triton_cache_dir().name == "cache"  # Triton's default, ~/.triton/cache


def test_an_unreachable_ray_cluster_is_one_line_in_seconds(tmp_path: Path, faulty: str):
    import socket
    import time

    with socket.socket() as s:  # a port nobody listens on: bound, then released
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty)), "--db", str(tmp_path / "x.db"),
                            "--ray-address", f"127.0.0.1:{port}"])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"error: cannot reach the Ray cluster at 127.0.0.1:{port}: Connection refused")
    assert time.monotonic() - t0 < 30  # Ray alone retries for minutes


@pytest.mark.parametrize(("source", "cause"), [
    ("def f(:\n    pass\n", "SyntaxError: invalid syntax (line 1)"),
    ("import nosuchpkg_xyz\n", "ModuleNotFoundError: No module named 'nosuchpkg_xyz'"),
    ("raise RuntimeError('plugin exploded')\n", "RuntimeError: plugin exploded"),
    ("from nnforge.modelview import Variant, variant\n@variant\nclass NoName(Variant):\n    pass\n",
     "NoName has no `name` class attribute"),
], ids=["syntax", "import", "raises", "no-name"])
def test_a_broken_plugin_is_one_line_exit_2(tmp_path: Path, source: str, cause: str):
    plug = tmp_path / "plug.py"
    plug.write_text(source)
    commands = [["sweep", "-v", "lstm_manual", "--plugin", str(plug), "--dry-run"], ["variants", "--plugin", str(plug)]]
    if "@variant" not in source:  # a plugin failing as it is imported fails the listing of backends too
        commands.append(["backends", "--plugin", str(plug)])
    for args in commands:
        r = RUNNER.invoke(app, args)
        assert r.exit_code == 2 and r.output == f"error: plugin {plug}: {cause}\n", (args, r.output)


def test_a_missing_plugin_module_is_one_line_exit_2():
    r = RUNNER.invoke(app, ["sweep", "-v", "lstm_manual", "--plugin", "nosuch.module", "--dry-run"])
    assert r.exit_code == 2 and r.output == "error: plugin nosuch.module: ModuleNotFoundError: No module named " \
                                            "'nosuch'\n", r.output


def test_a_file_that_is_not_a_store_is_one_line_exit_2(tmp_path: Path):
    garbage = tmp_path / "garbage.db"
    garbage.write_text("garbage\n" * 200)
    line = f"error: cannot use store {garbage}: file is not a database\n"
    for args in (["report", str(garbage), "-o", str(tmp_path / "r.html")], ["compare", "a", "b", "--db", str(garbage)],
                 ["view", str(garbage), "--port", "0"]):
        r = RUNNER.invoke(app, args)
        assert r.exit_code == 2 and r.output == line, (args, r.output)
    assert garbage.read_text() == "garbage\n" * 200


def _two_runs(tmp_path: Path, faulty: str) -> tuple[Path, str]:
    db = tmp_path / "c.db"
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty)), "--db", str(db), "--quiet", "-b", "eager",
                            "-b", "test_wrong", "--no-check", "--seed", "1"])
    assert r.exit_code == 0, r.output
    return db, re.findall(r"^\d{8}-\d{6}-\w+$", r.output, re.M)[-1]


def test_run_id_with_another_spec_starts_a_new_run_and_an_unknown_baseline_is_refused(tmp_path: Path, faulty: str):
    """--run-id must not append cells of a different spec into that run (the --resume rule applies); compare
    --baseline names a backend of the runs, a typo is an error rather than absolute times for every cell."""
    db, run = _two_runs(tmp_path, faulty)
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty, budget=0.2)), "--db", str(db), "--quiet",
                            "-b", "eager", "-b", "test_wrong", "--no-check", "--run-id", run])
    assert r.exit_code == 0 and f"not resuming run {run}" in r.output and "timing.budget_s is 0.2, was 0.1" in r.output
    with open_store(db) as s:
        assert len(s.cells(run, latest_only=False)) == 2 and len(s.run_ids()) == 2
    r = RUNNER.invoke(app, ["compare", run, run, "--db", str(db), "--baseline", "nosuch"])
    assert r.exit_code == 2 and r.output == "error: baseline backend 'nosuch' is in neither run (their backends: " \
                                            "eager, test_wrong)\n", r.output
    assert RUNNER.invoke(app, ["compare", run, run, "--db", str(db), "--baseline", "test_wrong"]).exit_code == 0


def test_resume_completes_a_setting_interrupted_between_its_processes(tmp_path: Path, faulty: str):
    """processes = 2, interrupted after the first process: its rows are not the cells' result. Resuming measures
    the setting again in both processes and writes the pooled row an uninterrupted run has."""
    db = tmp_path / "p.db"
    args = ["sweep", str(_spec(tmp_path, faulty)), "--db", str(db), "--quiet", "--processes", "2", "--seed", "1"]
    assert RUNNER.invoke(app, args).exit_code == 0
    with sqlite3.connect(db) as con:  # as if interrupted after process 1: drop process 2's row and the pooled row
        ids = [r[0] for r in con.execute("SELECT row_id FROM cells ORDER BY row_id")]
        assert len(ids) == 3
        con.execute(f"DELETE FROM cells WHERE row_id IN ({ids[1]}, {ids[2]})")
    r = RUNNER.invoke(app, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    with open_store(db) as s:
        (run,) = s.run_ids()
        latest = s.cells(run).iloc[0]
    metrics = json.loads(latest["metrics_json"])
    assert latest["status"] == "ok" and len(metrics["process_medians"]) == 2 and metrics["process_repeat"] is None


def test_an_export_file_of_an_unknown_format_is_refused_before_measuring(tmp_path: Path, faulty: str):
    db = tmp_path / "x.db"
    for extra in ([], ["--dry-run"]):
        r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty)), "--db", str(db), "--quiet",
                                "--export", str(tmp_path / "out.xlsx"), *extra])
        assert r.exit_code == 2, r.output
        assert r.output == f"error: --export {tmp_path / 'out.xlsx'}: unknown format; use a .csv or .parquet file\n"
    assert not db.exists()  # nothing was measured


@pytest.mark.parametrize("argv, words, command", [
    (["sweep", "-n", "abc"], "Invalid value for '--batch' / '-n'", "nnforge sweep"),
    (["sweep", "--bogus"], "No such option: --bogus", "nnforge sweep"),
    (["compare", "run_a_only"], "Missing argument 'run_b'", "nnforge compare"),
    (["frobnicate"], "No such command 'frobnicate'", "nnforge"),
])
def test_a_usage_error_is_one_line_exit_2(argv: list[str], words: str, command: str):
    r = RUNNER.invoke(app, argv)
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert r.output.startswith(f"error: {words}") and r.output.endswith(f" (see '{command} --help')\n"), r.output


def test_the_installed_command_prints_usage_errors_as_one_line_and_help_as_before():
    script = Path(sys.executable).with_name("nnforge")
    bad = subprocess.run([script, "sweep", "-n", "abc"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("error: Invalid value for '--batch'")
    helped = subprocess.run([script, "sweep", "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and "Usage: nnforge sweep" in helped.stdout
    bare = subprocess.run([script], capture_output=True, text=True, timeout=60)
    assert bare.returncode == 2 and "Usage: nnforge" in bare.stdout + bare.stderr


def test_an_export_file_in_a_missing_directory_is_refused_before_measuring(tmp_path: Path, faulty: str):
    db = tmp_path / "x.db"
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir.csv").mkdir()
    for export, why in ((tmp_path / "nodir" / "out.csv", f"directory {tmp_path / 'nodir'} does not exist"),
                        (tmp_path / "afile" / "out.csv", f"{tmp_path / 'afile'} is not a directory"),
                        (tmp_path / "adir.csv", "it is a directory")):
        r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty)), "--db", str(db), "--quiet",
                                "--export", str(export)])
        assert r.exit_code == 2 and r.output == f"error: --export {export}: {why}\n", r.output
    assert not db.exists()  # nothing was measured


@pytest.mark.parametrize("option", ["--threshold", "--fail-on", "--noise-floor", "--time-noise-floor"])
def test_a_bare_number_of_one_or_more_is_refused_as_a_percentage(tmp_path: Path, option: str):
    """`--fail-on 5` once meant 500 %: a CI gate that never fired. A bare number is a fraction; from 1 up it is
    refused with the spelling that was meant, before the store is even looked at."""
    db = tmp_path / "none.db"
    r = RUNNER.invoke(app, ["compare", "a", "b", "--db", str(db), option, "5"])
    assert r.exit_code == 2 and r.output == f"error: {option} '5': a bare number is a fraction (5 would be 500 %); " \
                                            "write 5% (or the fraction 0.05)\n", r.output
    for ok in ("5%", "0.05", "150%"):  # accepted: the error is then the missing store
        r = RUNNER.invoke(app, ["compare", "a", "b", "--db", str(db), option, ok])
        assert r.exit_code == 2 and r.output == f"error: no store at {db}\n", (ok, r.output)


def test_percent_options_read_as_fractions():
    import io

    from nnforge.cli import _percent

    con = Console(file=io.StringIO())
    assert _percent(con, "5%", "--x") == pytest.approx(0.05) and _percent(con, " 2.5 % ", "--x") == pytest.approx(0.025)
    assert _percent(con, "0.05", "--x") == pytest.approx(0.05) and _percent(con, "150%", "--x") == pytest.approx(1.5)


def test_merging_into_a_file_that_is_not_a_store_names_it(tmp_path: Path):
    garbage = tmp_path / "notadb.db"
    garbage.write_text("garbage\n" * 200)
    src = tmp_path / "src.db"
    open_store(src).close()
    r = RUNNER.invoke(app, ["merge", str(src), "-o", str(garbage)])
    assert r.exit_code == 2 and r.output == f"error: cannot use store {garbage}: file is not a database\n", r.output
    assert garbage.read_text() == "garbage\n" * 200


def test_parameters_a_variant_cannot_combine_are_refused_with_the_spec(tmp_path: Path):
    """nhead must divide d_model: before, the sweep ran and wrote failed rows ('setting setup failed')."""
    db = tmp_path / "x.db"
    r = RUNNER.invoke(app, ["sweep", "-v", "transformer", "-b", "eager", "-n", "2", "-t", "3", "-p", "nhead=3,4",
                            "--dry-run", "--db", str(db)])
    assert r.exit_code == 2 and r.output == ("error: invalid spec: params.transformer = {'d_model': 64, 'ff': 256, "
                                             "'nhead': 3}: d_model=64 is not divisible by nhead=3\n"), r.output
    assert not db.exists()


def test_the_sweep_header_is_one_line_in_a_pipe(tmp_path: Path, faulty: str):
    """A pipe makes Rich assume 80 columns: the header broke the store's path in two."""
    db = tmp_path / ("a_rather_long_directory_name_" * 3) / "store[1].db"
    db.parent.mkdir()
    r = RUNNER.invoke(app, ["sweep", str(_spec(tmp_path, faulty)), "--db", str(db)])
    assert r.exit_code == 0, r.output
    header = next(ln for ln in r.output.splitlines() if ln.startswith("ModelView run"))
    assert header.endswith(f"db {db}"), r.output
