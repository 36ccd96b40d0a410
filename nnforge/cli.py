"""``nnforge`` command line (Typer). One function per command: adding a command is adding one decorated function.

Heavy imports (torch, pandas) happen inside the commands so that ``nnforge --help`` stays instant.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup


class _Commands(TyperGroup):
    """The command group. A usage error (an unknown option, a bad option value, a missing argument) is one line and
    exit status 2 like every other error here, not Typer's boxed panel hard-wrapped at 80 columns in a pipe."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except typer.TyperException as e:  # Typer's own click's errors
            if type(e).__name__ == "NoArgsIsHelpError":
                sys.exit(e.exit_code)  # the help was printed when the error was made
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            _error_line(Console(stderr=True), e.format_message() + hint)
            sys.exit(e.exit_code)
        except typer.Abort:
            Console(stderr=True).print("Aborted.", highlight=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)  # an int is typer.Exit's code; commands return None


app = typer.Typer(
    name="nnforge",
    cls=_Commands,
    help="nnforge: forge fast neural networks (the compiler), and find them (ModelView).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DbOption = Annotated[Path, typer.Option("--db", help="SQLite store file.")]


def _console() -> Console:
    return Console()


def _error_line(console: Console, message: str) -> None:
    """One line naming what was wrong, never hard-wrapped (a pipe makes Rich assume 80 columns) nor read as markup
    or emoji codes (``:-1:`` in ``host:-1: ...``)."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True, emoji=False)


def _fail(console: Console, message: str, code: int = 2) -> None:
    """``_error_line``, then exit with ``code``: every command's expected failures end here."""
    _error_line(console, message)
    raise typer.Exit(code)


# What ModelView's commands import; `pip install nnforge` (the compiler alone) has none of these.
MODELVIEW_MODULES = ("torch", "pandas", "scipy", "psutil", "plotly", "jinja2")
WEB_MODULES = ("fastapi", "uvicorn")


def _require_modelview(command: str, extra_modules: tuple[str, ...] = ()) -> None:
    """A ModelView command on a compiler-only install: one line naming the extra to install, before any import."""
    import importlib.util

    missing = [m for m in (*MODELVIEW_MODULES, *extra_modules) if importlib.util.find_spec(m) is None]
    if missing:
        _fail(_console(), f"nnforge {command} needs ModelView: pip install 'nnforge[modelview]' "
                          f"(missing: {', '.join(missing)})")


def _require_store(console: Console, db: Path) -> None:
    """A store that must already exist (compare, history, report): say so plainly instead of creating an empty one."""
    if not db.exists():
        _fail(console, f"no store at {db}")


def _writable_store(console: Console, db: Path) -> None:
    """A store a sweep will write: its directory must exist and be writable, checked before anything runs."""
    import os

    parent = db.parent if str(db.parent) else Path(".")
    if db.exists() and db.is_dir():
        _fail(console, f"cannot open store {db}: it is a directory")
    if not parent.is_dir():
        _fail(console, f"cannot open store {db}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (db.exists() and not os.access(db, os.W_OK)):
        _fail(console, f"cannot open store {db}: {parent if not db.exists() else db} is not writable")


def _export_path(console: Console, export: Path) -> None:
    """The ``--export`` file's directory must exist and the path must not be a directory: checked before measuring,
    because the export is written after the whole sweep and its failure would otherwise come as a traceback then."""
    parent = export.parent if str(export.parent) else Path(".")
    if export.is_dir():
        _fail(console, f"--export {export}: it is a directory")
    if not parent.is_dir():
        what = f"{parent} is not a directory" if parent.exists() else f"directory {parent} does not exist"
        _fail(console, f"--export {export}: {what}")


def _usable_store(console: Console, db: Path) -> None:
    """An existing store to be written must be an SQLite file: probed read-only first, so the error names the store
    (``cannot use store x.db: file is not a database``) instead of leaving the user to guess which file it meant."""
    import sqlite3

    if not db.is_file():
        return
    try:
        con = sqlite3.connect(f"file:{db.resolve()}?mode=ro", uri=True)
        try:
            con.execute("SELECT name FROM sqlite_master").fetchall()
        finally:
            con.close()
    except sqlite3.Error as e:
        _fail(console, f"cannot use store {db}: {e}")


@app.command()
def sweep(
    spec: Annotated[Path | None, typer.Argument(help="TOML spec file; flags below override its values.")] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", "-v", help="Variant (repeatable).")] = None,
    backend: Annotated[list[str] | None, typer.Option("--backend", "-b", help="Backend (repeatable).")] = None,
    batch: Annotated[list[int] | None, typer.Option("--batch", "-n", help="Batch size (repeatable).")] = None,
    seq_len: Annotated[list[int] | None, typer.Option("--seq-len", "-t", help="Sequence length (repeatable).")] = None,
    layout: Annotated[list[str] | None, typer.Option(help="TNC (time-major) or NTC (batch-major).")] = None,
    dtype: Annotated[list[str] | None, typer.Option(help="float32, float64, float16, bfloat16.")] = None,
    mode: Annotated[list[str] | None, typer.Option(help="inference or training.")] = None,
    device: Annotated[list[str] | None, typer.Option(help="cpu or cuda.")] = None,
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="NAME=VALUE or VARIANT.NAME=VALUE; VALUE may be a comma list."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Run name (used by --resume and compare).")] = None,
    plugin: Annotated[list[str] | None, typer.Option(help="Module or .py file with @variant/@backend classes.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for weights and inputs (default: fresh per run).")] = None,
    db: DbOption = Path("modelview.db"),
    resume: Annotated[bool, typer.Option(help="Continue the latest run with this name and spec.")] = False,
    force: Annotated[bool, typer.Option(help="Re-measure cells that already have a row.")] = False,
    retry_failed: Annotated[bool, typer.Option(help="With --resume: re-measure cells not ok/skipped.")] = False,
    run_id: Annotated[str | None, typer.Option(help="Resume this run id.")] = None,
    target_ci: Annotated[float | None, typer.Option(help="Relative CI half-width target, e.g. 0.01.")] = None,
    budget: Annotated[float | None, typer.Option(help="Timing budget per backend and setting, seconds.")] = None,
    threads: Annotated[int | None, typer.Option(help="Intra-op threads (default: all available CPUs).")] = None,
    timeout: Annotated[float | None, typer.Option(help="Seconds without progress before a cell is killed.")] = None,
    memory_mb: Annotated[int | None, typer.Option(help="Memory limit per worker, MiB.")] = None,
    flush_cache: Annotated[bool | None, typer.Option(help="Flush caches before every sample.")] = None,
    rotate_inputs: Annotated[int | None, typer.Option(help="Distinct input sets cycled through.")] = None,
    check: Annotated[bool, typer.Option(help="Check numerics against the float64 eager reference.")] = True,
    peaks: Annotated[bool, typer.Option(help="Measure machine peak FLOP/s and bandwidth.")] = True,
    export: Annotated[Path | None, typer.Option(help="Also write the run's cells to .csv or .parquet.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or table.")] = False,
    clock: Annotated[str | None, typer.Option(help="CPU runs: wall, or cpu (process CPU time; shared machines).")]
    = None,
    processes: Annotated[int | None, typer.Option(help="Independent worker processes per setting.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Validate, print the cells and an estimated time; run nothing.")]
    = False,
    ray: Annotated[bool, typer.Option("--ray", help="Measure the settings as tasks on Ray (a local instance unless "
                                      "--ray-address or RAY_ADDRESS names a cluster).")] = False,
    ray_address: Annotated[str | None, typer.Option(help="Ray cluster to run on, e.g. 10.0.0.1:6379 (implies --ray).")]
    = None,
) -> None:
    """Run a sweep: variants × backends × batch × length × layout × dtype × mode, each setting in its own process."""
    _require_modelview("sweep")
    import sqlite3

    from nnforge.modelview.distributed import RayUnavailable
    from nnforge.modelview.spec import SpecError, load_spec, parse_param_flags
    from nnforge.modelview.store import EXPORT_SUFFIXES

    console = _console()
    if export is not None:  # said now, not after the whole sweep
        if export.suffix not in EXPORT_SUFFIXES:
            _fail(console, f"--export {export}: unknown format; use a .csv or .parquet file")
        _export_path(console, export)
    timing: dict[str, Any] = {
        k: v
        for k, v in {
            "target_rel_ci": target_ci,
            "budget_s": budget,
            "threads": threads,
            "flush_cache": flush_cache,
            "rotate_inputs": rotate_inputs,
            "clock": clock,
            "processes": processes,
        }.items()
        if v is not None
    }
    isolation = {k: v for k, v in {"timeout_s": timeout, "memory_mb": memory_mb}.items() if v is not None}
    try:
        overrides: dict[str, Any] = {
            "variants": variant or None,
            "backends": backend or None,
            "batch": batch or None,
            "seq_len": seq_len or None,
            "layout": layout or None,
            "dtype": dtype or None,
            "mode": mode or None,
            "device": device or None,
            "params": parse_param_flags(param) if param else None,
            "name": name,
            "plugins": plugin or None,
            "seed": seed,
            "timing": timing or None,
            "isolation": isolation or None,
            "check": None if check else False,
            "measure_peaks": None if peaks else False,
        }
        # the spec's own values first: a bad one is rejected before torch or any backend is imported
        loaded = load_spec(spec, {k: v for k, v in overrides.items() if v is not None})
        from nnforge.modelview import runner

        if dry_run:
            p = runner.plan(loaded)
            console.print(f"{p.cells} cells in {p.settings} settings × {p.processes} process(es); at most about "
                          f"{p.estimated_s / 60:.1f} min (every backend using its whole warm-up and timing budget, "
                          "compiles not counted)", highlight=False, soft_wrap=True)
            return
        _writable_store(console, db)
        result = runner.sweep(
            loaded, db=db, resume=resume, force=force, retry_failed=retry_failed, run_id=run_id,
            progress=not quiet, table=not quiet, console=console, ray=ray, ray_address=ray_address,
        )
    except (SpecError, RayUnavailable) as e:
        _fail(console, str(e))
    except (FileNotFoundError, KeyError) as e:
        _fail(console, str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
    except sqlite3.Error as e:
        _fail(console, f"cannot use store {db}: {e}")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: finished cells are stored; continue with --resume")
        raise typer.Exit(130) from None
    if export is not None:
        from nnforge.modelview.store import open_store

        try:
            with open_store(db) as store:
                store.export(export, result.run_id)
        except OSError as e:  # checked before measuring, but the place may have changed since: the run is kept
            _fail(console, f"--export {export}: {e.strerror or e} (run {result.run_id} is stored in {db})")
        console.print(f"exported run {escape(result.run_id)} to {escape(str(export))}", highlight=False,
                      soft_wrap=True)
    if quiet:
        console.print(result.run_id)


def _percent(console: Console, text: str, option: str) -> float:
    """'5%', '5 %' or the fraction '0.05' as a fraction; a clear error naming the option otherwise. A bare number
    of 1 or more is refused, not guessed: read as a fraction, ``--fail-on 5`` (500 %) would be a CI gate that never
    fires, and read as a percentage ``1`` would mean two different things on either side of it."""
    t = text.strip()
    bare = not t.endswith("%")
    try:
        value = float(t) if bare else float(t[:-1].strip()) / 100
    except ValueError:
        value = float("nan")
    if bare and value >= 1 and math.isfinite(value):
        _fail(console, f"{option} {text!r}: a bare number is a fraction ({t} would be {100 * value:g} %); "
                       f"write {t}% (or the fraction {value / 100:g})")
    if not 0 < value < 10:
        _fail(console, f"{option} {text!r}: expected a percentage above 0, such as 5% (or the fraction 0.05)")
    return value


@app.command()
def compare(
    run_a: Annotated[str, typer.Argument(help="Baseline run: id, id prefix or name.")],
    run_b: Annotated[str, typer.Argument(help="Run compared with the baseline.")],
    db: DbOption = Path("modelview.db"),
    threshold: Annotated[str, typer.Option(help="The question: 'no change' means within ± this (5%).")] = "5%",
    confidence: Annotated[float, typer.Option(help="Confidence of each cell's interval.")] = 0.99,
    baseline: Annotated[str, typer.Option(help="Judge each cell's time relative to this backend of its setting.")]
    = "eager",
    absolute: Annotated[bool, typer.Option(help="Judge absolute times (drift between runs included).")] = False,
    noise_floor: Annotated[
        str | None, typer.Option(help="Between-run noise of relative times (sd) assumed without repeated processes.")
    ] = None,
    time_noise_floor: Annotated[
        str | None, typer.Option(help="The same for absolute times (the machine's drift between runs).")
    ] = None,
    fail_on: Annotated[
        str | None, typer.Option(help="Exit 1 if a cell is significantly slower by at least this, e.g. 5%.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Which cells changed between two runs: slower, faster, no change within ±threshold, or inconclusive."""
    _require_modelview("compare")
    import json
    import sqlite3

    from nnforge.modelview import compare as cmp

    console = _console()
    thr = _percent(console, threshold, "--threshold")
    fail = _percent(console, fail_on, "--fail-on") if fail_on is not None else None
    floors: dict[str, float] = {}
    if noise_floor is not None:
        floors["floor_ratio"] = _percent(console, noise_floor, "--noise-floor")
    if time_noise_floor is not None:
        floors["floor_time"] = _percent(console, time_noise_floor, "--time-noise-floor")
    if not 0.5 <= confidence < 1:
        _fail(console, f"--confidence {confidence}: must be at least 0.5 and below 1")
    _require_store(console, db)
    try:
        a_id, b_id, changes, notes = cmp.compare_runs(
            db, run_a, run_b, baseline=None if absolute else baseline, threshold=thr, confidence=confidence, **floors
        )
    except KeyError as e:
        _fail(console, str(e.args[0]) if e.args else str(e))
    except sqlite3.Error as e:
        _fail(console, f"cannot use store {db}: {e}")
    bad = cmp.regressions(changes, fail) if fail is not None else []
    if as_json:
        print(json.dumps({"run_a": a_id, "run_b": b_id, "cells": [ch.as_dict() for ch in changes], "notes": notes,
                          "fail_on": fail, "regressions": [ch.cell_key for ch in bad]}, indent=1))
    else:
        cmp.print_comparison(a_id, b_id, changes, notes, console)
        if fail is not None:
            console.print(f"{len(bad)} cells significantly slower by {100 * fail:g} % or more.", highlight=False)
    if bad:
        raise typer.Exit(1)


def _revision_setup(console: Console, spec: Path, repo: Path, db: Path) -> tuple[Any, Path]:
    """The spec (its own values checked first, before torch is imported) and the repository root."""
    from nnforge.modelview.revisions import RevisionError, repo_root
    from nnforge.modelview.spec import SpecError, load_spec

    try:
        loaded = load_spec(spec, {})
        root = repo_root(repo)
    except (SpecError, RevisionError, FileNotFoundError) as e:
        _fail(console, str(e))
    _writable_store(console, db)
    return loaded, root


def _checkouts(console: Console, root: Path, revs: list[str], worktrees: Path | None) -> list[Any]:
    from nnforge.modelview.revisions import RevisionError, checkout, dependency_note

    try:
        out = [checkout(root, r, worktrees) for r in revs]
    except RevisionError as e:
        _fail(console, str(e))
    here = Path(__file__).resolve().parent.parent
    for r in out:
        note = dependency_note(r, here)
        if note:
            console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    return out


def _run_revisions(console: Console, spec: Any, revs: list[Any], db: Path, name: str, quiet: bool,
                   threshold: float, confidence: float) -> Any:
    import sqlite3

    from nnforge.modelview.interleave import run_revisions
    from nnforge.modelview.spec import SpecError

    def on_setting(key: str, k: int, n: int) -> None:
        if not quiet:
            console.print(f"[dim]setting {k + 1}/{n}: {escape(key)}[/]", highlight=False, soft_wrap=True)

    # the report marks the steps this command judges: by its threshold and confidence
    env = {"git_commit": revs[-1].commit, "mode": name, "steps": {"threshold": threshold, "confidence": confidence}}
    try:
        return run_revisions(spec, revs, db, name, env, on_setting)
    except (SpecError, FileNotFoundError, KeyError) as e:
        _fail(console, str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
    except sqlite3.Error as e:
        _fail(console, f"cannot use store {db}: {e}")


@app.command()
def ab(
    rev_a: Annotated[str, typer.Argument(help="Baseline revision (commit, branch, tag).")],
    rev_b: Annotated[str, typer.Argument(help="Revision compared with it.")],
    spec: Annotated[Path, typer.Option(help="TOML spec of the cells to time.")],
    repo: Annotated[Path, typer.Option(help="The git repository (default: the current directory's).")] = Path("."),
    db: DbOption = Path("modelview.db"),
    threshold: Annotated[str, typer.Option(help="'no change' means within ± this.")] = "2%",
    confidence: Annotated[float, typer.Option(help="Confidence of each cell's interval.")] = 0.99,
    fail_on: Annotated[str | None, typer.Option(help="Exit 1 if a cell is significantly slower by this, e.g. 5%, "
                                                    "or has lost its time.")]
    = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the verdicts as JSON.")] = False,
    worktrees: Annotated[Path | None, typer.Option(
        help="Where worktrees are kept (default ~/.cache/nnforge/worktrees).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines (the verdicts are printed).")] = False,
) -> None:
    """Time two revisions in one interleaved schedule (git worktrees) and say which cells changed."""
    _require_modelview("ab")
    import json

    console = _console()
    thr = _percent(console, threshold, "--threshold")
    fail = _percent(console, fail_on, "--fail-on") if fail_on is not None else None
    loaded, root = _revision_setup(console, spec, repo, db)
    revs = _checkouts(console, root, [rev_a, rev_b], worktrees)
    if revs[0].commit == revs[1].commit and not quiet:
        console.print(f"note: {escape(rev_a)} and {escape(rev_b)} are the same commit", highlight=False)
    from nnforge.modelview.ab import ab_cells, ab_untimed, broken, print_ab

    run_id, results = _run_revisions(console, loaded, revs, db, f"ab {rev_a} {rev_b}", quiet or as_json, thr,
                                     confidence)
    cells = ab_cells(results, thr, confidence)
    untimed = ab_untimed(results)
    bad = [c for c in cells if fail is not None and c.verdict.regression(fail)]
    lost = broken(untimed) if fail is not None else []  # a cell B cannot time cannot be shown not slower
    if as_json:
        print(json.dumps({"run_id": run_id, "a": revs[0].commit, "b": revs[1].commit,
                          "cells": [c.as_dict() for c in cells], "fail_on": fail,
                          "regressions": [f"{c.label}|{c.backend}" for c in bad],
                          "untimed": [u.as_dict() for u in untimed],
                          "broken": [f"{u.label}|{u.backend}" for u in lost]}, indent=1))
    else:
        print_ab(cells, revs[0], revs[1], console, untimed)
        console.print(f"run {run_id} in {db}", highlight=False)
    if bad or lost:
        raise typer.Exit(1)


@app.command()
def history(
    commits: Annotated[str, typer.Argument(help="A..B: every commit after A up to B, measured against A.")],
    spec: Annotated[Path, typer.Option(help="TOML spec of the cells to time.")],
    repo: Annotated[Path, typer.Option(help="The git repository (default: the current directory's).")] = Path("."),
    db: DbOption = Path("modelview.db"),
    threshold: Annotated[str, typer.Option(help="Smallest change that counts as a step.")] = "5%",
    confidence: Annotated[float, typer.Option(help="Confidence of each interval.")] = 0.99,
    block: Annotated[int, typer.Option(help="Revisions timed together (reference included).")] = 6,
    check: Annotated[bool, typer.Option(help="Exit 1 if a step is a slowdown or a cell lost its time.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the history as JSON.")] = False,
    worktrees: Annotated[Path | None, typer.Option(
        help="Where worktrees are kept (default ~/.cache/nnforge/worktrees).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines (the history is printed).")] = False,
) -> None:
    """Time every commit of a range against its first, flag the commits that stepped (--check: fail on a slowdown)."""
    _require_modelview("history")
    import json

    from nnforge.modelview.revisions import RevisionError, commit_range

    console = _console()
    thr = _percent(console, threshold, "--threshold")
    if block < 2:
        _fail(console, f"--block {block}: must be at least 2 (the reference and one commit)")
    loaded, root = _revision_setup(console, spec, repo, db)
    try:
        listed = commit_range(root, commits)
    except RevisionError as e:
        _fail(console, str(e))
    from nnforge.modelview.ab import blocks_of, broken, history_cells, history_untimed, print_history

    done = []
    for blk in blocks_of(listed, block):
        revs = _checkouts(console, root, blk, worktrees)
        _, results = _run_revisions(console, loaded, revs, db, f"history {commits}", quiet or as_json, thr,
                                    confidence)
        done.append((revs, results))
    cells = history_cells(done, listed, thr, confidence)
    untimed = history_untimed(done, listed)
    lost = broken(untimed)
    slow = [(hc, p) for hc in cells for p in hc.steps() if p.step is not None and p.step.change > 0]
    if as_json:
        print(json.dumps({"commits": listed, "cells": [hc.as_dict() for hc in cells],
                          "slowdowns": [{"cell": f"{hc.label}|{hc.backend}", "commit": p.commit} for hc, p in slow],
                          "untimed": [u.as_dict() for u in untimed],
                          "broken": [{"cell": f"{u.label}|{u.backend}", "commit": u.commit} for u in lost]},
                         indent=1))
    else:
        print_history(cells, console, untimed)
        for hc, p in slow:
            console.print(f"[red]slowdown[/] at {p.commit[:10]} ({escape(p.subject)}): {escape(hc.label)} "
                          f"{escape(hc.backend)} {100 * p.step.change:+.1f}%", highlight=False, soft_wrap=True)
    if check and (slow or lost):
        raise typer.Exit(1)


@app.command()
def variants(plugin: Annotated[list[str] | None, typer.Option(help="Also load these plugins.")] = None) -> None:
    """List the variants and their parameters."""
    _require_modelview("variants")
    from rich.table import Table

    from nnforge.modelview.spec import SpecError
    from nnforge.modelview.variants import variant_registry

    table = Table(title="variants")
    for col in ("name", "unit", "parameters (default)", "description"):
        table.add_column(col, overflow="fold")
    try:
        registry = variant_registry(plugin or ())
    except SpecError as e:  # a plugin that cannot be loaded
        _fail(_console(), str(e))
    for name, cls in registry.items():
        params = ", ".join(f"{k}={p.default}" for k, p in cls.params.items())
        table.add_row(name, cls.throughput_unit, params, escape(cls.description))
    Console().print(table)


@app.command()
def backends(plugin: Annotated[list[str] | None, typer.Option(help="Also load these plugins.")] = None) -> None:
    """List the backends."""
    _require_modelview("backends")
    from rich.table import Table

    from nnforge.modelview.backends import backend_registry
    from nnforge.modelview.spec import SpecError

    table = Table(title="backends")
    table.add_column("name")
    table.add_column("description", overflow="fold")
    try:
        registry = backend_registry(plugin or ())
    except SpecError as e:  # a plugin that cannot be loaded
        _fail(_console(), str(e))
    for name, cls in registry.items():
        table.add_row(name, escape(cls.description))
    Console().print(table)


@app.command()
def report(
    db: Annotated[Path, typer.Argument(help="SQLite store file.")] = Path("modelview.db"),
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    run: Annotated[str | None, typer.Option(help="Run id, id prefix or name (default: the latest run).")] = None,
) -> None:
    """Write one self-contained HTML report of a run (plots first; opens offline)."""
    _require_modelview("report")
    from nnforge.modelview.report.cli import report_command

    report_command(db, out, run, Console())


@app.command()
def merge(
    sources: Annotated[list[Path], typer.Argument(help="Store files to merge (any number).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Store to merge into (created if missing).")],
) -> None:
    """Merge stores from several machines into one; merging again adds nothing. Rows keep their machine."""
    _require_modelview("merge")
    import sqlite3

    from nnforge.modelview.merge import merge as merge_stores

    console = _console()
    _writable_store(console, out)
    _usable_store(console, out)
    try:
        res = merge_stores(sources, out)
    except (FileNotFoundError, ValueError, sqlite3.Error) as e:
        _fail(console, str(e))
    for note in res.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
    console.print(f"merged {len(sources)} store(s) into {out}: {res.runs_added} runs and {res.rows_added} rows added, "
                  f"{res.rows_present} rows already present; machines: {', '.join(res.machines) or 'none'}",
                  highlight=False, soft_wrap=True)


@app.command()
def view(
    db: Annotated[Path, typer.Argument(help="SQLite store file.")] = Path("modelview.db"),
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8050,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the view in a browser.")] = False,
) -> None:
    """Serve the web view: runs, filterable cells, run comparison, one cell's samples and generated code."""
    _require_modelview("view", WEB_MODULES)
    from nnforge.modelview.report.cli import view_command

    view_command(db, host, port, open_browser, Console())


def main() -> None:
    app()


if __name__ == "__main__":
    main()
