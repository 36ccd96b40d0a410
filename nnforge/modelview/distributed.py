"""A sweep on a Ray cluster: every setting is one Ray task; the driver is the store's only writer.

Why this shape:

* **One task per setting**, for the reason a local run gives a setting one worker: its backends are timed in
  interleaved rounds inside one process. The task runs exactly what a local run does for that setting
  (``_RunContext.run_repeated``: the isolated worker with its time and memory limits, the crash culprit, the re-runs
  alone) on the node Ray picked, into a store file private to the task.
* **One writer**: a task returns its rows instead of writing them; the driver appends them to the store as tasks
  finish. Nodes need no shared filesystem and no access to the store, a task that dies has written nothing (its
  retry cannot duplicate a row), and SQLite sees one writer per sweep (concurrent sweeps on one store queue on its
  write lock, as local ones do).
* **Retries are the driver's**, not Ray's (``max_retries=0``): a task whose Ray worker or node died is submitted
  again up to ``retries`` times and then recorded as failed with Ray's reason, and the progress display counts them.
  An exception raised by the task's own code is not retried: it would fail again.
* **Resources**: a CPU setting asks for ``threads`` CPUs — by default every CPU of the largest node, so two settings
  never share a node's cores while they are timed; a GPU setting asks for one GPU (and one CPU).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .runner import _RunContext
    from .spec import Cell, SweepSpec

RETRIES = 2


class RayUnavailable(RuntimeError):
    """Ray is not installed, or the cluster cannot run the sweep's settings."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("--ray needs Ray: pip install 'nnforge[modelview]'") from None
    return ray


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """A HOST:PORT that accepts no connection fails here in seconds: Ray itself retries for minutes, printing logs."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in address:
        return  # "auto", "local", ray:// client addresses: left to Ray
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise RayUnavailable(f"cannot reach the Ray cluster at {address}: {e.strerror or e} (is `ray start --head` "
                             "running there, and is the port open?)") from None


def connect(address: str | None, num_cpus: int | None = None) -> bool:
    """Join the cluster at ``address`` (None: start a local Ray instance). True when this call started Ray."""
    ray = _ray()
    if ray.is_initialized():
        return False
    if address is not None:
        _reachable(address)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address is None and num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise RayUnavailable(f"cannot connect to the Ray cluster at {address}: {e}") from None
    return True


def node_cpus() -> int:
    """CPUs of the largest alive node: the default thread count of a CPU setting under Ray."""
    ray = _ray()
    cpus = [int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")]
    return max(cpus, default=1) or 1


@dataclass(frozen=True)
class TaskSpec:
    """What a task needs to measure one setting on whichever node runs it (pickled by Ray)."""

    spec: SweepSpec
    run_id: str
    env: dict[str, Any]
    threads: int
    cells: tuple[Cell, ...]
    extra_variants: tuple[type, ...] = ()
    extra_backends: tuple[type, ...] = ()


def measure_setting(task: TaskSpec) -> dict[str, Any]:
    """Run in a Ray worker: measure the setting as a local run would, into a private store; return its rows and the
    fingerprints of the machine that measured them."""
    from .backends import backend_registry
    from .console import SweepProgress
    from .runner import _RunContext
    from .store import Store
    from .variants import variant_registry

    tmp = Path(tempfile.mkdtemp(prefix="modelview-ray-"))
    store = Store(tmp / "rows.db")
    try:
        vreg = variant_registry(task.spec.plugins, task.extra_variants)
        breg = backend_registry(task.spec.plugins, task.extra_backends)
        with SweepProgress(len(task.cells), enabled=False) as bar:
            ctx = _RunContext(task.spec, task.run_id, str(tmp / "rows.db"), vreg, breg, task.env, task.threads,
                              tmp, bar, store)
            ctx.run_repeated(list(task.cells))
        rows = [{k: v for k, v in r.items() if k != "row_id"} for r in store.rows(task.run_id, latest_only=False)]
        return {"rows": rows, "machines": store.machines(), "node": socket.gethostname()}
    finally:
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _resources(cells: Sequence[Cell], threads: int) -> dict[str, float]:
    if any("cuda" in c.device for c in cells):
        return {"num_cpus": 1, "num_gpus": 1}
    return {"num_cpus": threads}


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".strip()


def run_settings(ctx: _RunContext, groups: Sequence[list[Cell]], extra_variants: Sequence[type] = (),
                 extra_backends: Sequence[type] = (), retries: int = RETRIES) -> dict[str, int]:
    """Submit every setting, append rows as tasks finish, retry dead workers; returns {'retried': n}."""
    ray = _ray()
    from ray.exceptions import RayTaskError

    from .store import cell_identity

    largest = node_cpus()
    if not any("cuda" in c.device for g in groups for c in g) and ctx.threads > largest:
        raise RayUnavailable(f"timing.threads = {ctx.threads} but the largest Ray node has {largest} CPUs: no node "
                             "could run a setting")
    remote = ray.remote(max_retries=0)(measure_setting)
    pending: dict[Any, tuple[list[Cell], int]] = {}

    def submit(group: list[Cell], attempt: int) -> None:
        task = TaskSpec(ctx.spec, ctx.run_id, ctx.env, ctx.threads, tuple(group), tuple(extra_variants),
                        tuple(extra_backends))
        pending[remote.options(**_resources(group, ctx.threads)).remote(task)] = (group, attempt)

    for g in groups:
        submit(g, 0)
    retried = 0

    def show() -> None:
        ctx.bar.setting(f"Ray: {len(pending)} settings queued or running, {retried} retried")

    show()
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
            for ref in ready:
                group, attempt = pending.pop(ref)
                try:
                    out = ray.get(ref)
                except RayTaskError as e:  # the task's own code raised: it would again
                    for c in group:
                        ctx.record(c, "failed", f"the Ray task measuring this setting raised: {_reason(e)}")
                    continue
                except ray.exceptions.RayError as e:  # its worker or node died (killed, OOM, lost)
                    if attempt < retries:
                        retried += 1
                        submit(group, attempt + 1)
                    else:
                        for c in group:
                            ctx.record(c, "failed", f"the Ray worker died {attempt + 1} times while measuring this "
                                                    f"setting; last: {_reason(e)}")
                    continue
                for mid, fp in out["machines"].items():
                    ctx.store.add_machine(mid, fp)
                latest: dict[str, str] = {}
                for row in out["rows"]:
                    ctx.store.append_cell(row)
                    latest[row["cell_key"]] = row["status"]
                for c in group:
                    if c.key in latest:
                        ctx.bar.done(latest[c.key])
                    else:
                        ctx.store.append_cell(cell_identity(ctx.run_id, c) | {
                            "status": "failed", "error": "the Ray task returned no row for this cell",
                            "started": time.time(), "finished": time.time()})
                        ctx.bar.done("failed")
            show()
    except BaseException:
        for ref in pending:  # Ctrl-C: stop what runs; finished rows are stored, --resume continues
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)
        raise
    return {"retried": retried}
