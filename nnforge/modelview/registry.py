"""Registries of variants and backends, as explicit objects.

Why not a module-level dict filled by a decorator: cells run in worker processes, and a worker must find the very class
the parent chose, including classes defined in a user's script. So a decorator only *marks* a class (no global state),
a :class:`Registry` is built explicitly (built-ins + entry points + plugins + classes passed in), and every entry
remembers an import reference (``"package.module:Class"`` or ``"/path/file.py:Class"``) that a worker can load.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from .spec import SpecError

T = TypeVar("T", bound=type)

VARIANT_MARK = "__modelview_variant__"
BACKEND_MARK = "__modelview_backend__"


def variant(cls: T) -> T:
    """Mark a :class:`~nnforge.modelview.variants.base.Variant` subclass so that plugin loading picks it up."""
    setattr(cls, VARIANT_MARK, True)
    return cls


def backend(cls: T) -> T:
    """Mark a :class:`~nnforge.modelview.backends.base.Backend` subclass so that plugin loading picks it up."""
    setattr(cls, BACKEND_MARK, True)
    return cls


def class_ref(cls: type) -> str:
    """An import reference a fresh process can resolve with :func:`load_ref`."""
    module = cls.__module__
    if module == "__main__" or module.startswith("_modelview_plugin_"):
        path = getattr(sys.modules.get(module), "__file__", None)
        if path is None:
            raise ValueError(f"{cls.__qualname__} is defined in an interactive session; define it in a file or module")
        return f"{Path(path).resolve()}:{cls.__qualname__}"
    return f"{module}:{cls.__qualname__}"


class PluginError(SpecError):
    """A plugin that cannot be loaded: missing, failing at import, or with a marked class that cannot register. A
    :class:`SpecError` (the plugin is part of the spec), so the CLI reports it as one line, exit 2, like any bad
    value; the message names the plugin as the user wrote it and the cause, never a traceback of our loader."""

    def __init__(self, plugin: str, message: str) -> None:
        self.key = "plugins"
        self.value = plugin
        ValueError.__init__(self, f"plugin {plugin}: {message}")


def _cause(e: BaseException) -> str:
    if isinstance(e, SyntaxError):
        return f"{type(e).__name__}: {e.msg} (line {e.lineno})"
    return f"{type(e).__name__}: {e}"


def load_module(name_or_path: str) -> Any:
    """Import a module by dotted name, or execute a ``.py`` file as a module (once per process). Any failure is a
    :class:`PluginError` naming the module or file and the cause."""
    if name_or_path.endswith(".py"):
        path = Path(name_or_path).resolve()
        if not path.is_file():
            raise PluginError(name_or_path, f"file not found: {path}")
        mod_name = "_modelview_plugin_" + str(abs(hash(str(path))))
        if mod_name in sys.modules:
            return sys.modules[mod_name]
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            del sys.modules[mod_name]
            raise PluginError(name_or_path, _cause(e)) from e
        except BaseException:
            del sys.modules[mod_name]
            raise
        return module
    try:
        return importlib.import_module(name_or_path)
    except Exception as e:
        raise PluginError(name_or_path, _cause(e)) from e


def load_ref(ref: str) -> Any:
    """Resolve ``"module:Qualname"`` or ``"/path/file.py:Qualname"``."""
    mod, _, qual = ref.rpartition(":")
    obj = load_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


class Registry(Mapping[str, type]):
    """Name → class, with the import reference of each class. ``kind`` is "variant" or "backend"."""

    def __init__(self, kind: str, classes: Iterable[type] = ()) -> None:
        if kind not in ("variant", "backend"):
            raise ValueError(kind)
        self.kind = kind
        self._classes: dict[str, type] = {}
        for c in classes:
            self.add(c)

    @property
    def _mark(self) -> str:
        return VARIANT_MARK if self.kind == "variant" else BACKEND_MARK

    @property
    def group(self) -> str:
        return f"nnforge.modelview.{self.kind}s"

    def add(self, cls: type, *, replace: bool = False) -> type:
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{cls.__qualname__} has no `name` class attribute")
        if name in self._classes and self._classes[name] is not cls and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered by {class_ref(self._classes[name])}")
        self._classes[name] = cls
        return cls

    def add_module(self, name_or_path: str) -> list[str]:
        """Add every marked class defined in (or imported into) a module or ``.py`` file; returns the names added."""
        module = load_module(name_or_path)
        added = []
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__dict__.get(self._mark):
                try:
                    self.add(obj, replace=True)
                except ValueError as e:
                    raise PluginError(name_or_path, str(e)) from e
                added.append(obj.name)
        return added

    def add_entry_points(self) -> list[str]:
        """Load the ``nnforge.modelview.variants`` / ``...backends`` entry points. An entry point may name a class
        or a module (all of its marked classes join). A broken plugin is reported, never silently ignored."""
        added = []
        for ep in importlib.metadata.entry_points(group=self.group):
            try:
                obj = ep.load()
            except Exception as e:
                msg = f"entry point {ep.name} = {ep.value} in group {self.group} failed to load: {e}"
                raise RuntimeError(msg) from e
            if inspect.isclass(obj):
                self.add(obj, replace=True)
                added.append(obj.name)
            else:
                added += self.add_module(obj.__name__)
        return added

    def ref(self, name: str) -> str:
        return class_ref(self._classes[name])

    def __getitem__(self, name: str) -> type:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._classes)

    def __len__(self) -> int:
        return len(self._classes)


def build_registry(kind: str, builtins: Iterable[type], plugins: Iterable[str] = (), extra: Iterable[type] = (),
                   entry_points: bool = True) -> Registry:
    """Built-ins, then entry points of the ``nnforge.modelview.<kind>s`` group, then ``plugins`` (modules or .py
    files), then ``extra`` classes (which may replace a name). A fresh registry per call: no sweep sees another's
    plugins."""
    reg = Registry(kind, builtins)
    if entry_points:
        reg.add_entry_points()
    for p in plugins:
        reg.add_module(p)
    for cls in extra:
        reg.add(cls, replace=True)
    return reg
