"""``nnforge report`` and ``nnforge view`` failures the user can cause — an output path that cannot be a file, an
address that cannot be served on, a run name or path with brackets — are one line as written, exit 2, no
traceback."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest
import report_synth as synth
from typer.testing import CliRunner

from nnforge.cli import app
from nnforge.modelview.web import server

RUNNER = CliRunner()


@pytest.fixture
def store(tmp_path: Path) -> Path:
    db = synth.new_db(tmp_path / "s.db")
    rid = synth.add_run(db, "small")
    synth.bulk_insert(db, synth.small_rows(rid))
    return db


def _one_line(args: list[str], expected: str) -> None:
    r = RUNNER.invoke(app, args)
    assert r.exit_code == 2 and r.output == f"error: {expected}\n", (args, r.output, r.exception)


def test_an_output_path_that_cannot_be_written_is_one_line(store: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    for out, why in ((tmp_path / "adir", "it is a directory"),
                     (tmp_path / "afile" / "r.html", f"{tmp_path / 'afile'} is not a directory"),
                     (tmp_path / "afile" / "sub" / "r.html", f"{tmp_path / 'afile'} is not a directory")):
        _one_line(["report", str(store), "-o", str(out)], f"cannot write report {out}: {why}")

    def refuse(*args: object, dir: str = "", **kw: object) -> tuple[int, str]:  # a place that refuses new files
        raise PermissionError(errno.EACCES, "Permission denied", str(Path(dir) / ".report-x.html"))

    monkeypatch.setattr("nnforge.modelview.report.build.tempfile.mkstemp", refuse)
    out = tmp_path / "r.html"
    _one_line(["report", str(store), "-o", str(out)],
              f"cannot write report {out}: cannot create a file in {tmp_path}: Permission denied")


def test_run_names_and_paths_with_brackets_are_printed_as_written(store: Path, tmp_path: Path) -> None:
    for ref in ("[red]zz", "[/]"):
        _one_line(["report", str(store), "--run", ref, "-o", str(tmp_path / "r.html")], f"no run {ref!r} in {store}")
    odd = tmp_path / "d[x]"
    odd.mkdir()
    db = odd / "s[bold].db"
    db.write_bytes(store.read_bytes())
    r = RUNNER.invoke(app, ["report", str(db), "-o", str(odd / "r[bold].html")])
    assert r.exit_code == 0 and r.output == f"report written to {odd / 'r[bold].html'}\n", r.output
    for command in (["report", str(odd / "no[bold].db")], ["view", str(odd / "no[bold].db")]):
        _one_line(command, f"no ModelView database at {odd / 'no[bold].db'} (run `nnforge sweep` first)")


class _Refusing(socket.socket):
    """A socket whose bind fails as the test says (an address the test machine may not be able to produce)."""

    error: OSError = OSError()

    def bind(self, address: object) -> None:
        raise self.error


@pytest.mark.parametrize(("args", "error", "expected"), [
    (["--port", "99999"], None, "cannot serve on 127.0.0.1:99999: the port must be between 0 and 65535"),
    (["--port", "-1"], None, "cannot serve on 127.0.0.1:-1: the port must be between 0 and 65535"),
    (["--host", "nosuch.invalid"], socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "cannot serve on nosuch.invalid:8050: unknown host nosuch.invalid (Name or service not known); give an address "
     "of this machine with --host"),
    (["--port", "80"], PermissionError(errno.EACCES, "Permission denied"),
     "cannot serve on 127.0.0.1:80: permission denied (ports below 1024 need privileges); choose another port with "
     "--port"),
    (["--host", "10.9.9.9"], OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"),
     "cannot serve on 10.9.9.9:8050: 10.9.9.9 is not an address of this machine; give one with --host"),
], ids=["port-too-big", "port-negative", "unknown-host", "permission", "not-ours"])
def test_an_address_that_cannot_be_served_on_is_one_line(store: Path, monkeypatch, args: list[str],
                                                         error: OSError | None, expected: str) -> None:
    if error is not None:
        monkeypatch.setattr(_Refusing, "error", error)
        monkeypatch.setattr(server.socket, "socket", _Refusing)
    _one_line(["view", str(store), *args], expected)
