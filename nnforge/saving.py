"""Saving a compiled function and loading it in another process without tracing, optimizing or compiling again.

A saved program is a zip file: ``manifest.json`` (format, the nnforge build that wrote it, the machine and
toolchain a binary was built for, a SHA-256 per member), ``program.pkl`` (every traced signature: its optimized
graph and, per program, the scheduled graph, the size slots and the constants), ``src/<key>.c`` (the generated
C) and ``lib/<key>.so`` (the built binary), or ``src/<key>.py`` (a generated Triton module) and ``triton/<hash>/``
(each of its kernels Triton built before the save, as Triton's cache holds them: ``codegen/triton/binaries.py``).
Tensors the function captured (parameters, optimizer state) are
saved with their values at save time; the loaded function owns copies of them (``captured``) and updates them
in place as the original would.

Loading trusts nothing it can check: a member whose bytes do not match the manifest is an error (truncated or
altered file); a file written by another nnforge build is refused (graphs are pickled objects of that build);
a binary built for another machine (architecture, or CPU features this one lacks) or that does not load here is
rebuilt from its saved source with this machine's compiler, or refused when there is none; a built Triton kernel
is found by a launch only where the GPU, Triton and its toolchain are those it was built with, and is otherwise
built again at its first launch. A saved program
contains machine code: load only files you trust, as you would a shared library.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import pickle
import platform
import sys
import weakref
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .compile import CompiledFunction, Tie
from .errors import NNForgeError, TraceError
from .ir.node import Graph, Node
from .ir.ops import Op

log = logging.getLogger("nnforge.saving")

FORMAT = 1


class LoadError(NNForgeError):
    """A saved program that cannot be loaded here, with the reason and what to do."""


# ---------------------------------------------------------------------------------------------------------------
# What identifies a build and a machine


@functools.cache
def forge_build() -> str:
    """nnforge's version and a hash of the compiler's own sources (ModelView's excluded): graphs are pickled
    objects of this build, so only the same build reads them back."""
    root = Path(__file__).parent
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.suffix in (".py", ".h") and not rel.startswith("modelview/") and "__pycache__" not in rel:
            h.update(rel.encode() + b"\0" + p.read_bytes() + b"\0")
    try:
        version = importlib.metadata.version("nnforge")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree on PYTHONPATH, not installed
        version = "source"
    return f"{version}+{h.hexdigest()[:16]}"


def machine() -> dict[str, Any]:
    """What a ``-march=native`` binary depends on: architecture, OS and the CPU's feature flags."""
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    flags = sorted(set(line.split(":", 1)[1].split()))
                    break
    except OSError:
        pass
    return {"arch": platform.machine(), "os": sys.platform, "cpu_flags": flags}


def incompatibility(saved: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why a binary built on ``saved`` may not run ``here`` (None when it can)."""
    if (saved["arch"], saved["os"]) != (here["arch"], here["os"]):
        return f"it was built for {saved['arch']}/{saved['os']}, this machine is {here['arch']}/{here['os']}"
    missing = sorted(set(saved["cpu_flags"]) - set(here["cpu_flags"]))
    if missing:
        return f"it was built on a CPU with features this one lacks ({', '.join(missing[:8])})"
    return None


# ---------------------------------------------------------------------------------------------------------------
# Graphs as flat node lists (pickling the node objects themselves recurses once per edge of the longest chain)


@dataclass(frozen=True)
class FlatGraph:
    """A graph as a node list in topological order; sources, inputs and outputs are indices into it."""

    nodes: tuple[tuple, ...]      # (op name, source indices, attrs, shape, dtype, loc, types)
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    effects: tuple[int, ...]


def flatten_graph(g: Graph) -> FlatGraph:
    index: dict[int, int] = {}
    nodes = []
    for n in g.order:
        if n.op in (Op.FEEDER, Op.RECEIVER):
            raise NNForgeError(f"save: the program calls Python functions (a {n.op.name.title()} created at "
                               f"{n.loc or 'an unknown line'}); a program with Feeders or Receivers cannot be saved")
        index[id(n)] = len(nodes)
        attrs = {k: _flat_value(v) for k, v in n.attrs.items()}
        nodes.append((n.op.name, tuple(index[id(s)] for s in n.srcs), attrs, n.shape, n.dtype, n.loc, n.types))
    return FlatGraph(tuple(nodes), tuple(index[id(n)] for n in g.inputs), tuple(index[id(n)] for n in g.outputs),
                     tuple(index[id(n)] for n in g.effects))


def _flat_value(v: Any) -> Any:
    if isinstance(v, Graph):
        return flatten_graph(v)
    if isinstance(v, Node):
        raise NNForgeError("save: a node attribute refers to another node (not a saveable graph)")
    if type(v) in (tuple, list):
        return type(v)(_flat_value(x) for x in v)
    return v


def unflatten_graph(f: FlatGraph) -> Graph:
    built: list[Node] = []
    for op, srcs, attrs, shape, dtype, loc, types in f.nodes:
        built.append(Node(Op[op], tuple(built[i] for i in srcs), {k: _graph_value(v) for k, v in attrs.items()},
                          shape, dtype, loc, types))
    return Graph([built[i] for i in f.inputs], [built[i] for i in f.outputs], [built[i] for i in f.effects])


def _graph_value(v: Any) -> Any:
    if isinstance(v, FlatGraph):
        return unflatten_graph(v)
    if type(v) in (tuple, list):
        return type(v)(_graph_value(x) for x in v)
    return v


# ---------------------------------------------------------------------------------------------------------------
# The saved records


@dataclass(frozen=True)
class SavedC:
    """A C program: its scheduled graph, size slots, constants and kernel listing; source and binary by key."""

    graph: FlatGraph
    key: str
    sizes: Any
    data: tuple[np.ndarray, ...]
    listing: Any


@dataclass(frozen=True)
class SavedTriton:
    """A Triton program: its scheduled graph, kernel names, run-time size symbols and constants; the generated
    module by key (``src/<key>.py``) and the Triton cache hashes of its kernels built before the save
    (``triton/<hash>/``), which loading puts back into this machine's Triton cache."""

    graph: FlatGraph
    key: str
    kernels: tuple[str, ...]
    dynamic: tuple[str, ...]
    data: tuple[np.ndarray, ...]
    built: tuple[str, ...] = ()


@dataclass(frozen=True)
class SavedReference:
    """A program the reference interpreter runs (the reference backend, or a graph the C backend does not cover)."""

    graph: FlatGraph


@dataclass(frozen=True)
class SavedEntry:
    treedef: Any
    dtypes: tuple
    shapes: tuple
    generic: frozenset
    statics: tuple
    graph: FlatGraph
    out_def: Any
    implicit: tuple[int, ...]              # indices into SavedFunction.captured
    state: tuple[tuple[int, int], ...]     # (captured index, output index)
    n_out: int
    programs: tuple[tuple[tuple, Any], ...]
    ties: tuple[Tie, ...] = ()
    # whether each module the trace called was training, in call order: the modules are not in the file, so a
    # loaded function cannot follow their train()/eval(); ``load(path, training=...)`` picks by this instead
    modes: tuple[bool, ...] = ()


@dataclass(frozen=True)
class SavedFunction:
    name: str
    backend: str
    entries: tuple[SavedEntry, ...]
    vjps: tuple[tuple[Any, SavedFunction], ...]
    dtype: str | None = None  # ``nf.compile(dtype=...)``: the arguments are converted to it at each call


@dataclass(frozen=True)
class SavedTensor:
    value: np.ndarray
    requires_grad: bool
    name: str


# ---------------------------------------------------------------------------------------------------------------
# save


def save(cf: CompiledFunction, path: str | os.PathLike) -> None:
    """Write ``cf``'s traced signatures and built programs to ``path`` (see the module docstring)."""
    captured: dict[int, int] = {}
    tensors: list[SavedTensor] = []
    paths = _module_paths(cf)
    binaries: dict[str, tuple[str, bytes]] = {}
    modules: dict[str, str] = {}  # generated Triton modules by key
    kernels: dict[str, dict[str, bytes]] = {}  # built Triton kernels: cache hash -> file name -> bytes

    def capture(ref: weakref.ref) -> int:
        t = ref()
        if t is None:
            raise NNForgeError(f"save: a tensor captured by {cf.__qualname__} no longer exists")
        if id(t) not in captured:
            captured[id(t)] = len(tensors)
            tensors.append(SavedTensor(np.array(t.numpy(), copy=True), t.requires_grad, t.name or paths.get(id(t), "")))
        return captured[id(t)]

    def program(p: Any) -> Any:
        from .codegen.c.program import CProgram
        from .codegen.reference import ReferenceProgram
        from .codegen.streamed import StreamedProgram
        from .codegen.triton.binaries import collect
        from .codegen.triton.program import TritonProgram, source_key

        if isinstance(p, CProgram):
            binaries[p.key] = (p.source, p.library_bytes())
            return SavedC(flatten_graph(p.graph), p.key, p.sizes, tuple(p.data), p.listing)
        if isinstance(p, TritonProgram):
            key = source_key(p.source)
            modules[key] = p.source
            built = collect(p.module)
            kernels.update(built)
            return SavedTriton(flatten_graph(p.graph), key, tuple(p.kernels), tuple(p.dynamic), tuple(p.data),
                               tuple(built))
        if isinstance(p, ReferenceProgram):
            return SavedReference(flatten_graph(p.graph))
        if isinstance(p, StreamedProgram):
            flatten_graph(p.graph)  # raises: its loops call Python (Feeders, Receivers)
        raise NNForgeError(f"save: programs of type {type(p).__name__} cannot be saved")

    def function(f: CompiledFunction) -> SavedFunction:
        entries = []
        for e in f._entries:
            if e.grad_reads:
                raise NNForgeError(f"save: {f.__qualname__} accumulates gradients onto .grad values it reads at call "
                                   "time; clear them in the function (opt.zero_grad()) to save it")
            progs = []
            seen: dict[int, Any] = {}
            for key, p in e.programs.items():  # one runtime-size program may serve several keys: saved once
                seen.setdefault(id(p), program(p))
                progs.append((key, seen[id(p)]))
            entries.append(SavedEntry(e.treedef, e.dtypes, e.shapes, e.generic, e.statics, flatten_graph(e.graph),
                                      e.out_def, tuple(capture(r) for r in e.implicit),
                                      tuple((capture(r), i) for r, i in e.state), e.n_out, tuple(progs),
                                      e.ties, tuple(was for _, was in e.modes)))
        return SavedFunction(f.__qualname__, f.backend, tuple(entries),
                             tuple((k, function(v)) for k, v in f._vjps.items()),
                             None if f.dtype is None else f.dtype.value)

    if not cf._entries:
        raise NNForgeError(f"save: {cf.__qualname__} has not been called yet: call it once with example inputs so "
                           "that it is traced and built, then save it")
    record = function(cf)
    try:
        payload = pickle.dumps((record, tensors), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError) as e:  # a type the argument or result trees name
        raise NNForgeError(f"save: {cf.__qualname__} takes or returns a structure that cannot be saved ({e}); a "
                           "namedtuple type among its arguments or results must be defined at module level, where "
                           "the loading process imports it") from None
    members = {"program.pkl": payload}
    for key, (source, lib) in binaries.items():
        members[f"src/{key}.c"] = source.encode()
        members[f"lib/{key}.so"] = lib
    for key, source in modules.items():
        members[f"src/{key}.py"] = source.encode()
    for key, files in kernels.items():
        members.update({f"triton/{key}/{name}": data for name, data in files.items()})
    manifest = {
        "format": FORMAT,
        "nnforge": forge_build(),
        "function": cf.__qualname__,
        "backend": cf.backend,
        "machine": machine(),
        "toolchain": _toolchain_identity() if binaries else None,
        "triton": _triton_identity() if kernels else None,
        "signatures": [describe(e.dtypes, e.shapes, e.generic, e.statics)
                       + mode_words(tuple(was for _, was in e.modes)) for e in cf._entries],
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in members.items()},
    }
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", json.dumps(manifest, indent=1))
        for name, data in members.items():
            z.writestr(name, data)
    os.replace(tmp, path)


def _module_paths(cf: CompiledFunction) -> dict[int, str]:
    """The path of each parameter and buffer of the modules ``cf``'s traces called (``0.weight``, as
    ``named_parameters`` says it, in the first module called that holds it): the names a loaded function's captured
    tensors take where they have none of their own."""
    paths: dict[int, str] = {}
    functions = [cf]
    while functions:
        f = functions.pop()
        functions += f._vjps.values()
        for e in f._entries:
            for ref, _ in e.modes:
                if (m := ref()) is not None:
                    for name, t in (*m.named_parameters(), *m.named_buffers()):
                        paths.setdefault(id(t), name)
    return paths


def _toolchain_identity() -> str:
    from .codegen import BACKENDS

    return BACKENDS["cpu"].toolchain.identity


def _triton_identity() -> dict[str, str]:
    """What built Triton kernels were built with, for the reader (Triton's own cache hashes decide reuse)."""
    import torch
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return {"triton": triton.__version__, "device": device, "cuda": str(torch.version.cuda)}


def describe(dtypes: tuple, shapes: tuple, generic: frozenset, statics: tuple) -> str:
    """A signature as the user wrote it: ``(float32[a0.0, 16, 96], int64[16], 0.5)``, free sizes by name and Python
    values as they were passed (they are part of the signature: another value is another trace)."""
    parts, values = [], iter(statics)
    for i, (dt, shape) in enumerate(zip(dtypes, shapes)):
        if dt is None:
            parts.append(repr(next(values)))
            continue
        dims = [f"a{i}.{ax}" if (i, ax) in generic else str(d) for ax, d in enumerate(shape)]
        parts.append(f"{np.dtype(dt).name}[{', '.join(dims)}]")
    return f"({', '.join(parts)})"


def mode_words(modes: tuple[bool, ...]) -> str:
    """What a trace's modules were doing, after its signature: `` in train mode``, `` in eval mode``, `` with its
    modules in train, eval (in call order)`` or nothing when it called none; saved traces of one signature that
    differ only by mode must read apart (the manifest, a refused call)."""
    if not modes:
        return ""
    if len(set(modes)) == 1:
        return f" in {'train' if modes[0] else 'eval'} mode"
    return f" with its modules in {', '.join('train' if m else 'eval' for m in modes)} (in call order)"


def _entries_in_mode(path: Path, entries: tuple[SavedEntry, ...], training: bool | None) -> list[SavedEntry]:
    """The saved traces a loaded function runs: those whose modules were all in mode ``training`` (and those that
    called none); with ``training=None`` all of them, refused (``LoadError``) where one signature was saved in
    several modes, as the loaded function cannot see which mode its caller means."""
    if training is not None:
        return [e for e in entries if all(m == training for m in e.modes)]
    seen: dict[tuple, SavedEntry] = {}
    for e in entries:
        key = (e.treedef, e.dtypes, e.shapes, e.generic, e.statics)
        other = seen.setdefault(key, e)
        if other.modes != e.modes:
            raise LoadError(f"{path}: the signature {describe(e.dtypes, e.shapes, e.generic, e.statics)} was saved"
                            f"{mode_words(other.modes)} and{mode_words(e.modes)}; the loaded function cannot see "
                            "its modules' train()/eval(): choose one with nf.load(path, training=True) or "
                            "training=False")
    return list(entries)


# ---------------------------------------------------------------------------------------------------------------
# load


def load(path: str | os.PathLike, training: bool | None = None) -> CompiledFunction:
    """A compiled function saved by ``CompiledFunction.save``: no tracing, passes or C compile when the binary
    runs here (see the module docstring for what is checked). ``training``: run the traces saved with the modules
    in train mode (True) or eval mode (False); needed where a signature was saved in both, since the modules the
    function called are not in the file."""
    if training is not None and not isinstance(training, bool):
        raise TypeError(f"load: training must be True, False or None, got {training!r}")
    path = Path(path)
    members = _read_members(path)
    manifest = json.loads(members.pop("manifest.json"))
    if manifest.get("nnforge") != forge_build():
        raise LoadError(f"{path}: saved by nnforge {manifest.get('nnforge')}, this is {forge_build()}; a program "
                        "is only loaded by the build that saved it: compile the function again (nf.compile) and "
                        "save it")
    try:
        record, tensors = pickle.loads(members["program.pkl"])
    except Exception as e:
        raise LoadError(f"{path}: the program record does not load ({type(e).__name__}: {e})") from None
    reason = incompatibility(manifest["machine"], machine())
    captured = [_tensor(t) for t in tensors]
    libraries: dict[str, Any] = {}

    def program(p: Any) -> Any:
        from .codegen.c.program import CProgram
        from .codegen.reference import ReferenceProgram

        graph = unflatten_graph(p.graph)
        if isinstance(p, SavedReference):
            return ReferenceProgram(graph)
        if isinstance(p, SavedTriton):
            return _triton_program(path, p, graph, members)
        if p.key not in libraries:
            libraries[p.key] = _library(path, p.key, members, reason, manifest)
        lib, key, source = libraries[p.key]
        return CProgram(graph, lib, key, p.sizes, p.data, p.listing, source=source)

    def function(s: SavedFunction) -> CompiledFunction:
        from .compile import _Entry

        entries = []
        for e in _entries_in_mode(path, s.entries, training):
            built: dict[int, Any] = {}
            programs = {}
            for key, p in e.programs:
                built.setdefault(id(p), program(p))
                programs[key] = built[id(p)]
            entries.append(_Entry(e.treedef, e.dtypes, e.shapes, e.generic, e.statics, unflatten_graph(e.graph),
                                  e.out_def, [weakref.ref(captured[i]) for i in e.implicit],
                                  [(weakref.ref(captured[i]), k) for i, k in e.state], e.n_out, programs,
                                  ties=e.ties))
        vjps = {k: function(v) for k, v in s.vjps}
        return LoadedFunction(s.name, s.backend, entries, vjps, captured, str(path), s.dtype)

    if training is not None and not _entries_in_mode(path, record.entries, training):
        saved = "; ".join(describe(e.dtypes, e.shapes, e.generic, e.statics) + mode_words(e.modes)
                          for e in record.entries)
        raise LoadError(f"{path}: holds no trace in {'train' if training else 'eval'} mode (training={training}); "
                        f"it was saved with: {saved}")
    return function(record)


class LoadedFunction(CompiledFunction):
    """A compiled function rebuilt by ``load``: its saved signatures, programs and gradient programs, and its own
    copies of the tensors it captured (``captured``). There is no Python function: it never traces."""

    def __init__(self, name: str, backend: str, entries: list, vjps: dict, captured: list, path: str,
                 dtype: str | None = None):
        def untraceable(*args: Any, **kwargs: Any) -> Any:
            raise TraceError(f"{name} was loaded from {path}: it runs the signatures it was saved with and cannot be "
                             "traced inside another function")

        untraceable.__qualname__ = untraceable.__name__ = name
        super().__init__(untraceable, backend, dtype=dtype)
        self._entries, self._vjps, self.captured, self.loaded_from = entries, vjps, captured, path

    def __reduce__(self) -> tuple:
        raise TypeError(f"{self.__qualname__} was loaded from {self.loaded_from}: it has no Python function to "
                        "compile again elsewhere; pass the file's path and nf.load it there")

    def _drop_stale_entries(self) -> None:
        pass  # the captured tensors are the program's own: freezing the caller's tensors changes nothing here

    def _on_miss(self, leaves: list, treedef: Any, arrays: list, dts: tuple, shapes: tuple, statics: tuple) -> Any:
        saved = "; ".join(describe(e.dtypes, e.shapes, e.generic, e.statics) for e in self._entries)
        raise TraceError(f"{self.__qualname__} was loaded from {self.loaded_from} and runs only the signatures it "
                         f"was saved with: {saved} (a{{i}}.{{axis}}: a size that may change); it was called with "
                         f"{describe(dts, shapes, frozenset(), statics)}. Call the saved function on these inputs "
                         "before saving it, or compile it again")

    def vjp_program(self, treedef: Any, n_leaves: int, diff: tuple[int, ...]) -> CompiledFunction:
        key = (treedef, n_leaves, diff)
        if key not in self._vjps:
            raise TraceError(f"{self.__qualname__} was loaded from {self.loaded_from} without the gradient program "
                             "torch autograd needs for these inputs: before saving, run one backward pass through "
                             "it with the same tensors requiring grad")
        return self._vjps[key]


def _tensor(t: SavedTensor) -> Any:
    from .tensor import Tensor

    return Tensor(t.value, requires_grad=t.requires_grad, name=t.name)


def _read_members(path: Path) -> dict[str, bytes]:
    try:
        with zipfile.ZipFile(path) as z:
            members = {name: z.read(name) for name in z.namelist()}
    except FileNotFoundError:
        raise LoadError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as e:
        raise LoadError(f"{path}: not a complete saved nnforge program (truncated or not one): {e}") from None
    except Exception as e:
        raise LoadError(f"{path}: damaged ({type(e).__name__}: {e})") from None
    if "manifest.json" not in members:
        raise LoadError(f"{path}: not a saved nnforge program (no manifest.json)")
    try:
        manifest = json.loads(members["manifest.json"])
    except ValueError as e:
        raise LoadError(f"{path}: its manifest is damaged (not JSON: {e})") from None
    if not isinstance(manifest, dict):
        raise LoadError(f"{path}: its manifest is damaged (a JSON {_json_kind(manifest)}, not an object)")
    version = manifest.get("format")
    if version != FORMAT or isinstance(version, bool):
        raise LoadError(f"{path}: saved in format {version!r}, this nnforge reads format {FORMAT}")
    _check_manifest(path, manifest)
    sums = manifest["sha256"]
    if set(sums) != set(members) - {"manifest.json"}:
        raise LoadError(f"{path}: its members do not match its manifest (altered file)")
    for name, want in sums.items():
        if hashlib.sha256(members[name]).hexdigest() != want:
            raise LoadError(f"{path}: {name} does not match its checksum (the file was altered or damaged)")
    return members


def _str(v: Any) -> bool:
    return isinstance(v, str)


def _strs(v: Any) -> bool:
    return isinstance(v, list) and all(map(_str, v))


# each manifest field ``save`` writes: what it must be, and how to say so; ``machine``'s own fields below
_FIELDS: dict[str, tuple[Any, str]] = {
    "nnforge": (_str, "a string (the nnforge build)"),
    "function": (_str, "a string (the function's name)"),
    "backend": (_str, "a string (the backend's name)"),
    "machine": (lambda v: isinstance(v, dict), "an object (the machine the binaries were built for)"),
    "toolchain": (lambda v: v is None or _str(v), "a string or null (the C compiler)"),
    "triton": (lambda v: v is None or isinstance(v, dict), "an object or null (Triton's version and GPU)"),
    "signatures": (_strs, "a list of strings (the signatures in words)"),
    "sha256": (lambda v: isinstance(v, dict) and all(map(_str, v.values())),
               "an object of member names to SHA-256 digests"),
}
_MACHINE: dict[str, tuple[Any, str]] = {
    "arch": (_str, "a string (the architecture)"),
    "os": (_str, "a string (the operating system)"),
    "cpu_flags": (_strs, "a list of strings (the CPU's feature flags)"),
}


def _json_kind(v: Any) -> str:
    """A JSON value's kind as JSON names it, for messages about a manifest."""
    kinds = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if v is None else kinds.get(type(v), type(v).__name__)


def _check_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Every field ``save`` writes is there and of its kind: valid JSON of another structure (edited, or written
    by something else) is a ``LoadError`` naming the field, before anything reads it."""
    for where, fields, record in (("", _FIELDS, manifest), ("machine.", _MACHINE, manifest.get("machine"))):
        for name, (ok, kind) in fields.items():
            if name not in record:
                raise LoadError(f"{path}: its manifest is damaged: '{where}{name}' is missing")
            if not ok(record[name]):
                raise LoadError(f"{path}: its manifest is damaged: '{where}{name}' should be {kind}, got a JSON "
                                f"{_json_kind(record[name])}")


def _triton_program(path: Path, p: SavedTriton, graph: Graph, members: dict[str, bytes]) -> Any:
    """The saved Triton module imported from the cache (written there from the file) behind a program for this
    machine's device, its built kernels put into Triton's cache: no trace, pass or render, and no kernel build
    where the GPU, Triton and its toolchain are those that built them (elsewhere each builds at its first
    launch). CUDA graphs as ``NNFORGE_CUDA_GRAPHS`` says (an ``options`` choice is not saved: it changes no code)."""
    from .codegen import BACKENDS
    from .codegen.triton import cuda_graphs_on
    from .codegen.triton.binaries import restore
    from .codegen.triton.program import TritonProgram, load_module

    backend = BACKENDS["triton"]
    if not backend.available:  # type: ignore[attr-defined]
        raise LoadError(f"{path}: a Triton program, and Triton cannot run here (it needs a CUDA device or "
                        "TRITON_INTERPRET=1)")
    source = members[f"src/{p.key}.py"].decode()
    groups: dict[str, dict[str, bytes]] = {key: {} for key in p.built}
    for name, data in members.items():
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "triton" and parts[1] in groups:
            groups[parts[1]][parts[2]] = data
    try:
        restore(groups)
    except OSError as e:  # an unwritable cache: each kernel is built at its first launch instead
        log.warning("%s: the built Triton kernels could not be put in Triton's cache (%s); they are built again "
                    "at their first launch", path, e)
    return TritonProgram(graph, load_module(source), source, p.kernels, p.dynamic, p.data,
                         backend.device, cuda_graphs=cuda_graphs_on(None))  # type: ignore[attr-defined]


def _library(path: Path, key: str, members: dict[str, bytes], reason: str | None, manifest: dict) -> tuple:
    """The saved binary installed in the cache and loaded, or, where it cannot run here, the saved source built
    again with this machine's compiler: (library, key, source)."""
    from .codegen import BACKENDS
    from .codegen.c.toolchain import install_library

    source = members[f"src/{key}.c"].decode()
    if reason is None:
        lib = install_library(key, members[f"lib/{key}.so"])
        if lib is not None:
            return lib, key, source
        reason = "it does not load here (a missing runtime library such as libgomp, or another C library)"
    backend = BACKENDS["cpu"]
    if not backend.available:
        raise LoadError(f"{path}: the saved binary cannot run on this machine: {reason}; rebuilding it from the "
                        f"saved source needs a C compiler with OpenMP, and none works here")
    log.warning("%s: rebuilding the saved C program from its source: %s", path, reason)
    lib, new_key = backend.toolchain.load(source)
    return lib, new_key, source


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of a saved program (what it was built for, its signatures), checked like ``load`` does."""
    return json.loads(_read_members(Path(path))["manifest.json"])

