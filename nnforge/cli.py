"""``nnforge`` command line (Typer). One function per command: adding a command is adding one decorated function.

Heavy imports (torch, pandas) happen inside the commands so that ``nnforge --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(
    name="nnforge",
    help="nnforge: forge fast neural networks (the compiler), and find them (ModelView).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DbOption = Annotated[Path, typer.Option("--db", help="SQLite store file.")]


def _fail(console: Console, message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


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
) -> None:
    """Run a sweep: variants × backends × batch × length × layout × dtype × mode, each setting in its own process."""
    from nnforge.modelview import runner
    from nnforge.modelview.spec import SpecError, parse_param_flags

    console = Console()
    timing: dict[str, Any] = {
        k: v
        for k, v in {
            "target_rel_ci": target_ci,
            "budget_s": budget,
            "threads": threads,
            "flush_cache": flush_cache,
            "rotate_inputs": rotate_inputs,
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
        result = runner.sweep(
            spec, db=db, resume=resume, force=force, retry_failed=retry_failed, run_id=run_id,
            progress=not quiet, table=not quiet, console=console, **overrides,
        )
    except SpecError as e:
        _fail(console, str(e))
    except (FileNotFoundError, KeyError) as e:
        _fail(console, str(e))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: finished cells are stored; continue with --resume")
        raise typer.Exit(130) from None
    if export is not None:
        from nnforge.modelview.store import open_store

        with open_store(db) as store:
            store.export(export, result.run_id)
        console.print(f"exported run {result.run_id} to {export}")
    if quiet:
        console.print(result.run_id)


@app.command()
def compare(
    run_a: Annotated[str, typer.Argument(help="Baseline run: id, id prefix or name.")],
    run_b: Annotated[str, typer.Argument(help="Run compared with the baseline.")],
    db: DbOption = Path("modelview.db"),
    alpha: Annotated[float, typer.Option(help="Significance level after Holm adjustment.")] = 0.01,
    min_effect: Annotated[float, typer.Option(help="Smallest relative change worth reporting.")] = 0.01,
) -> None:
    """Which cells differ between two runs (Mann-Whitney U, Holm-adjusted; bootstrap CI of the ratio)."""
    from nnforge.modelview.compare import compare_runs, print_comparison

    console = Console()
    if not db.exists():
        _fail(console, f"no store at {db}")
    try:
        a_id, b_id, changes, notes = compare_runs(db, run_a, run_b, alpha=alpha, min_effect=min_effect)
    except KeyError as e:
        _fail(console, str(e.args[0]) if e.args else str(e))
    print_comparison(a_id, b_id, changes, notes, console)


@app.command()
def variants(plugin: Annotated[list[str] | None, typer.Option(help="Also load these plugins.")] = None) -> None:
    """List the variants and their parameters."""
    from rich.table import Table

    from nnforge.modelview.variants import variant_registry

    table = Table(title="variants")
    for col in ("name", "unit", "parameters (default)", "description"):
        table.add_column(col, overflow="fold")
    for name, cls in variant_registry(plugin or ()).items():
        params = ", ".join(f"{k}={p.default}" for k, p in cls.params.items())
        table.add_row(name, cls.throughput_unit, params, escape(cls.description))
    Console().print(table)


@app.command()
def backends(plugin: Annotated[list[str] | None, typer.Option(help="Also load these plugins.")] = None) -> None:
    """List the backends."""
    from rich.table import Table

    from nnforge.modelview.backends import backend_registry

    table = Table(title="backends")
    table.add_column("name")
    table.add_column("description", overflow="fold")
    for name, cls in backend_registry(plugin or ()).items():
        table.add_row(name, escape(cls.description))
    Console().print(table)


@app.command()
def report(
    db: Annotated[Path, typer.Argument(help="SQLite store file.")] = Path("modelview.db"),
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    run: Annotated[str | None, typer.Option(help="Run id, id prefix or name (default: the latest run).")] = None,
) -> None:
    """Write one self-contained HTML report of a run (plots first; opens offline)."""
    from nnforge.modelview.report.cli import report_command

    report_command(db, out, run, Console())


@app.command()
def view(
    db: Annotated[Path, typer.Argument(help="SQLite store file.")] = Path("modelview.db"),
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8050,
    open_browser: Annotated[bool, typer.Option("--open", help="Open the view in a browser.")] = False,
) -> None:
    """Serve the web view: runs, filterable cells, run comparison, one cell's samples and generated code."""
    from nnforge.modelview.report.cli import view_command

    view_command(db, host, port, open_browser, Console())


def main() -> None:
    app()


if __name__ == "__main__":
    main()
