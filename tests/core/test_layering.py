"""Layering: the IR stands below passes and backends, autodiff below the frontend, and constant folding computes
with the reference interpreter's own numpy table without importing the interpreter."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nnforge
from nnforge.codegen import reference
from nnforge.ir import registry
from nnforge.ir.build import make
from nnforge.ir.node import Graph
from nnforge.ir.ops import Op

PACKAGE = Path(nnforge.__file__).parent
simplify = importlib.import_module("nnforge.passes.simplify")  # the package exports a function of that name

# Modules importing them alone, with a stand-in for the top-level package (whose __init__ imports everything).
_PROBE = """
import importlib, json, sys, types
root = types.ModuleType("nnforge")
root.__path__ = [{path!r}]
sys.modules["nnforge"] = root
for name in {modules!r}:
    importlib.import_module(name)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("nnforge."))))
"""


def _imported_by(*modules: str) -> set[str]:
    """The nnforge modules that importing ``modules`` (in a fresh interpreter) brings in."""
    out = subprocess.run([sys.executable, "-c", _PROBE.format(path=str(PACKAGE), modules=list(modules))],
                         capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def _modules_of(package: str) -> list[str]:
    folder = PACKAGE / package.removeprefix("nnforge.").replace(".", "/")
    return sorted(f"{package}.{p.relative_to(folder).with_suffix('').as_posix().replace('/', '.')}"
                  .removesuffix(".__init__") for p in folder.rglob("*.py"))


def test_autodiff_does_not_import_the_frontend():
    seen = _imported_by(*_modules_of("nnforge.autodiff"))
    assert "nnforge.autodiff.grad" in seen and "nnforge.ir.registry" in seen
    assert not seen & {"nnforge.tensor", "nnforge.control", "nnforge.trace", "nnforge.differentiate"}, seen


def test_ir_does_not_import_passes_backends_or_the_frontend():
    seen = _imported_by(*_modules_of("nnforge.ir"))
    assert "nnforge.ir.printer" in seen and "nnforge.ir.opdefs.elementwise" in seen
    above = [m for m in seen if m.startswith(("nnforge.passes", "nnforge.codegen", "nnforge.autodiff",
                                              "nnforge.schedule", "nnforge.tensor", "nnforge.control"))]
    assert not above, above


def test_constant_folding_does_not_import_the_reference_interpreter():
    seen = _imported_by("nnforge.passes.simplify", "nnforge.passes.specialize")
    assert "nnforge.passes.simplify" in seen
    assert not [m for m in seen if m.startswith("nnforge.codegen")], seen


_NO_LOCAL_IMPORTS = ["nnforge/ir", "nnforge/autodiff", "nnforge/passes/simplify.py", "nnforge/passes/specialize.py",
                     "nnforge/codegen/reference.py"]


@pytest.mark.parametrize("where", _NO_LOCAL_IMPORTS)
def test_no_function_local_imports(where: str):
    """Imports inside functions hide cycles; these modules have none (none needs an optional dependency)."""
    path = PACKAGE.parent / where
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    assert files
    local = []
    for f in files:
        for fn in ast.walk(ast.parse(f.read_text())):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                local += [f"{f.name}:{n.lineno}" for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not local, local


def test_folding_and_the_interpreter_share_one_numpy_table():
    assert simplify.NUMPY is registry.NUMPY and reference.NUMPY is registry.NUMPY


def test_folded_constant_is_what_the_interpreter_computes():
    """erf has no numpy ufunc: folding must give libm's value, as the interpreter does, bit for bit."""
    c = make(Op.CONST, (), {"value": 0.3, "shape": (), "dtype": nnforge.float32})
    e = make(Op.ERF, (c,))
    folded = simplify.simplify(Graph((), (e,)))
    assert folded.outputs[0].op == Op.CONST
    want = reference.Interpreter(np.random.default_rng(0)).run(Graph((), (e,)), ())[0]
    assert np.float32(folded.outputs[0].attrs["value"]) == want
