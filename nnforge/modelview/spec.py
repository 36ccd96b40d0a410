"""Sweep specification: what to measure, read from TOML, CLI flags or Python, validated before anything runs.

A spec is a cross product. Expanding it yields *cells* (one measurement each: variant × backend × batch × sequence
length × layout × dtype × mode × device × variant parameters); cells that differ only by backend form a *setting*,
the unit the runner gives to one worker process so that the backends of a setting can be timed in interleaved rounds.

Validation happens here, up front, and every error names the offending key and value: a typo in a 2-hour sweep must
fail in the first second, not after the first hour.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LAYOUTS = ("TNC", "NTC")
DTYPES = ("float32", "float64", "float16", "bfloat16")
MODES = ("inference", "training")
DEVICES = ("cpu", "cuda")

# Default numerical tolerances (atol, rtol) against the float64 eager reference. Low precisions accumulate rounding
# over a recurrence, so they get loose bounds; float64 only has to absorb reassociation differences.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-3, 1e-3),
    "float16": (3e-2, 3e-2),
    "bfloat16": (1e-1, 1e-1),
}


class SpecError(ValueError):
    """An invalid spec. ``key`` and ``value`` name what is wrong so the message can point at the exact line."""

    def __init__(self, key: str, value: Any, message: str) -> None:
        self.key = key
        self.value = value
        super().__init__(f"invalid spec: {key} = {value!r}: {message}")


@dataclass(frozen=True)
class TimingConfig:
    """How cells are timed; see ``timer.py`` for the method and docs/modelview.md for the reasoning."""

    method: str = "adaptive"  # "adaptive" (the method of timer.py) or "naive" (one loop; for comparison only)
    processes: int = 1  # independent worker processes per setting; their samples are pooled into one row
    clock: str = "wall"  # CPU runs: "wall" time, or the process's "cpu" time (reproducible on shared machines)
    target_rel_ci: float = 0.01  # stop when the CI of the median is within ±1 % of the median
    confidence: float = 0.95
    budget_s: float = 10.0  # adaptive-repeat time budget per backend and setting
    min_samples: int = 10
    max_samples: int = 20000
    round_samples: int = 5  # consecutive samples of one backend per interleaved round
    warmup_min_calls: int = 3
    warmup_max_s: float = 3.0
    warmup_tolerance: float = 0.05  # steady when two successive warm-up windows' medians differ by less than this
    min_sample_s: float = 0.0005  # calls shorter than this are batched into one sample to dwarf the timer's overhead
    flush_cache: bool = False  # overwrite a buffer larger than the last-level cache before every sample
    flush_bytes: int = 64 * 2**20
    rotate_inputs: int = 1  # number of distinct input sets cycled through (1 = same inputs every call)
    threads: int = 0  # intra-op threads; 0 = all CPUs this process may run on
    perf_counters: bool = True  # instructions/cycles via `perf stat` where the kernel exposes them
    profile_kernels: bool = True  # GPU only: kernel count and summed kernel time via torch.profiler
    nvml: bool = True  # GPU only: clocks, power, energy, throttle reasons


@dataclass(frozen=True)
class IsolationConfig:
    """Limits for the worker processes. ``memory_mb`` is an address-space limit (RLIMIT_AS) on CPU runs and a resident
    set limit enforced by the parent everywhere; ``timeout_s`` bounds the time a worker may go without progress."""

    timeout_s: float = 300.0
    memory_mb: int = 8192


@dataclass(frozen=True)
class SweepSpec:
    """A sweep. Every list field is one axis of the cross product; ``params`` holds variant parameters.

    ``params`` maps a parameter name to a value or a list of values (a list is one more axis) for every selected variant
    that declares that parameter; a nested table named after a variant applies to that variant only, e.g.
    ``{"hidden": 128, "bonito": {"width": [96, 384]}}``.
    """

    variants: tuple[str, ...]
    backends: tuple[str, ...] = ("eager",)
    batch: tuple[int, ...] = (16,)
    seq_len: tuple[int, ...] = (64,)
    layout: tuple[str, ...] = ("TNC",)
    dtype: tuple[str, ...] = ("float32",)
    mode: tuple[str, ...] = ("inference",)
    device: tuple[str, ...] = ("cpu",)
    params: Mapping[str, Any] = field(default_factory=dict)
    name: str = "sweep"
    plugins: tuple[str, ...] = ()  # modules or .py files whose @variant / @backend classes join the registries
    seed: int | None = None  # None: a fresh seed per run, recorded in the run's spec_json
    check: bool = True  # compare every backend with the float64 eager reference before timing it
    tolerances: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # dtype -> (atol, rtol) overrides
    measure_peaks: bool = True  # measure the machine's matmul FLOP/s and memory bandwidth once per run
    timing: TimingConfig = field(default_factory=TimingConfig)
    isolation: IsolationConfig = field(default_factory=IsolationConfig)

    def tolerance(self, dtype: str) -> tuple[float, float]:
        return tuple(self.tolerances.get(dtype, DEFAULT_TOLERANCES[dtype]))  # type: ignore[return-value]

    def to_json(self) -> str:
        return json.dumps(spec_to_mapping(self), sort_keys=True)


@dataclass(frozen=True)
class Cell:
    """One measurement. ``key`` is stable across runs and machines, so runs can be resumed and compared by it."""

    variant: str
    backend: str
    batch: int
    seq_len: int
    layout: str
    dtype: str
    mode: str
    device: str
    params: tuple[tuple[str, Any], ...] = ()

    @property
    def params_dict(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def params_json(self) -> str:
        return json.dumps(self.params_dict, sort_keys=True, separators=(",", ":"))

    @property
    def setting_key(self) -> str:
        return (
            f"{self.variant}|N={self.batch}|T={self.seq_len}|{self.layout}|{self.dtype}|{self.mode}|{self.device}"
            f"|{self.params_json}"
        )

    @property
    def key(self) -> str:
        return f"{self.setting_key}|{self.backend}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["params"] = self.params_dict
        return d

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Cell:
        fields = dict(d)
        fields["params"] = tuple(sorted(dict(fields.get("params") or {}).items()))
        return Cell(**fields)

    def with_backend(self, backend: str) -> Cell:
        return dataclasses.replace(self, backend=backend)


_LIST_FIELDS = {
    "variants": str,
    "backends": str,
    "batch": int,
    "seq_len": int,
    "layout": str,
    "dtype": str,
    "mode": str,
    "device": str,
    "plugins": str,
}
_TOP_KEYS = set(_LIST_FIELDS) | {
    "params",
    "name",
    "seed",
    "check",
    "tolerances",
    "measure_peaks",
    "timing",
    "isolation",
}


def _as_tuple(key: str, value: Any, kind: type) -> tuple[Any, ...]:
    values = list(value) if isinstance(value, list | tuple) else [value]
    out = []
    for v in values:
        if kind is int:
            if isinstance(v, bool) or not isinstance(v, int):
                if isinstance(v, str) and v.strip().lstrip("-").isdigit():
                    v = int(v)
                else:
                    raise SpecError(key, v, "expected an integer")
        elif not isinstance(v, str):
            raise SpecError(key, v, "expected a string")
        out.append(v)
    if not out and key not in ("plugins",):
        raise SpecError(key, value, "must not be empty")
    if len(set(out)) != len(out):
        raise SpecError(key, value, "contains duplicates")
    return tuple(out)


def _sub_config(cls: type, key: str, value: Any) -> Any:
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise SpecError(key, value, "expected a table")
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in value.items():
        if k not in known:
            raise SpecError(f"{key}.{k}", v, f"unknown key (known: {', '.join(sorted(known))})")
        default = known[k].default
        if isinstance(default, bool):
            if not isinstance(v, bool):
                raise SpecError(f"{key}.{k}", v, "expected true or false")
        elif isinstance(default, int):
            if isinstance(v, bool) or not isinstance(v, int):
                raise SpecError(f"{key}.{k}", v, "expected an integer")
            if v < 0:
                raise SpecError(f"{key}.{k}", v, "must be >= 0")
        elif isinstance(default, str):
            if not isinstance(v, str):
                raise SpecError(f"{key}.{k}", v, "expected a string")
        elif isinstance(default, float):
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise SpecError(f"{key}.{k}", v, "expected a number")
            if not math.isfinite(v) or v <= 0:  # NaN compares false with everything: `v <= 0` alone lets it in
                raise SpecError(f"{key}.{k}", v, "must be a finite number > 0")
            v = float(v)
        kwargs[k] = v
    cfg = cls(**kwargs)
    if isinstance(cfg, TimingConfig):
        if cfg.method not in ("adaptive", "naive"):
            raise SpecError(f"{key}.method", cfg.method, "must be adaptive or naive")
        if cfg.clock not in ("wall", "cpu"):
            raise SpecError(f"{key}.clock", cfg.clock, "must be wall or cpu")
        if not 0 < cfg.confidence < 1:
            raise SpecError(f"{key}.confidence", cfg.confidence, "must lie strictly between 0 and 1")
        if cfg.processes < 1:
            raise SpecError(f"{key}.processes", cfg.processes, "must be >= 1")
        if cfg.rotate_inputs < 1:
            raise SpecError(f"{key}.rotate_inputs", cfg.rotate_inputs, "must be >= 1")
        if cfg.min_samples < 3:
            raise SpecError(f"{key}.min_samples", cfg.min_samples, "must be >= 3")
        if cfg.round_samples < 1:
            raise SpecError(f"{key}.round_samples", cfg.round_samples, "must be >= 1")
        if cfg.max_samples < cfg.min_samples:
            raise SpecError(f"{key}.max_samples", cfg.max_samples, f"must be >= min_samples ({cfg.min_samples})")
    return cfg


def spec_from_mapping(data: Mapping[str, Any]) -> SweepSpec:
    """Build a spec from a plain mapping (a parsed TOML file, or keyword arguments); checks types and known keys.

    Names of variants and backends and variant parameters are checked later by :func:`validate`, against the
    registries that the sweep will use (plugins may add names)."""
    for k, v in data.items():
        if k not in _TOP_KEYS:
            raise SpecError(k, v, f"unknown key (known: {', '.join(sorted(_TOP_KEYS))})")
    if "variants" not in data:
        raise SpecError("variants", None, "required: at least one variant")
    kwargs: dict[str, Any] = {}
    for k, kind in _LIST_FIELDS.items():
        if k in data:
            kwargs[k] = _as_tuple(k, data[k], kind)
    for k, allowed in (("layout", LAYOUTS), ("dtype", DTYPES), ("mode", MODES), ("device", DEVICES)):
        for v in kwargs.get(k, ()):
            if v not in allowed:
                raise SpecError(k, v, f"must be one of {', '.join(allowed)}")
    for k in ("batch", "seq_len"):
        for v in kwargs.get(k, ()):
            if v < 1:
                raise SpecError(k, v, "must be >= 1")
    if "params" in data:
        if not isinstance(data["params"], Mapping):
            raise SpecError("params", data["params"], "expected a table")
        kwargs["params"] = dict(data["params"])
    if "name" in data:
        if not isinstance(data["name"], str) or not data["name"]:
            raise SpecError("name", data["name"], "expected a non-empty string")
        kwargs["name"] = data["name"]
    if "seed" in data and data["seed"] is not None:
        if isinstance(data["seed"], bool) or not isinstance(data["seed"], int):
            raise SpecError("seed", data["seed"], "expected an integer")
        kwargs["seed"] = data["seed"]
    for k in ("check", "measure_peaks"):
        if k in data:
            if not isinstance(data[k], bool):
                raise SpecError(k, data[k], "expected true or false")
            kwargs[k] = data[k]
    if "tolerances" in data:
        tol = data["tolerances"]
        if not isinstance(tol, Mapping):
            raise SpecError("tolerances", tol, "expected a table of dtype = [atol, rtol]")
        parsed = {}
        for dt, pair in tol.items():
            if dt not in DTYPES:
                raise SpecError(f"tolerances.{dt}", pair, f"unknown dtype (known: {', '.join(DTYPES)})")
            numbers = isinstance(pair, list | tuple) and all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in pair)
            if not numbers or len(pair) != 2:
                raise SpecError(f"tolerances.{dt}", pair, "expected [atol, rtol]")
            parsed[dt] = (float(pair[0]), float(pair[1]))
        kwargs["tolerances"] = parsed
    if "timing" in data:
        kwargs["timing"] = _sub_config(TimingConfig, "timing", data["timing"])
    if "isolation" in data:
        kwargs["isolation"] = _sub_config(IsolationConfig, "isolation", data["isolation"])
    spec = SweepSpec(**kwargs)
    if spec.timing.clock == "cpu" and "cuda" in spec.device:
        raise SpecError("timing.clock", "cpu", "CPU time says nothing about GPU work: use clock = \"wall\" with cuda")
    return spec


def _read_toml(path: str | Path) -> dict[str, Any]:
    """The parsed TOML file, unvalidated: flags may still complete it (a file without ``variants`` plus ``-v``)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise SpecError("file", str(path), f"not valid TOML: {e}") from e
    except OSError as e:  # missing, a directory, unreadable: said as the spec's problem, not as an errno
        raise SpecError("file", str(path), f"cannot read it: {e.strerror or e}") from e


def spec_from_toml(path: str | Path) -> SweepSpec:
    """Read a spec from a TOML file (see docs/modelview.md for the format). Relative ``.py`` plugin paths stay
    relative to the current directory: ``nnforge ab`` and ``history`` run each revision's plugin from its own
    worktree with one spec file."""
    return spec_from_mapping(_read_toml(path))


def spec_to_mapping(spec: SweepSpec) -> dict[str, Any]:
    d = dataclasses.asdict(spec)
    d["params"] = dict(spec.params)
    d["tolerances"] = {k: list(v) for k, v in spec.tolerances.items()}
    for k in _LIST_FIELDS:
        d[k] = list(d[k])
    return d


AXES = ("variants", "backends", "batch", "seq_len", "layout", "dtype", "mode", "device")


def extension_gap(old_json: str, new_json: str) -> str | None:
    """None when the spec ``new_json`` only adds values to the axes of ``old_json`` (so a run of the old spec can be
    resumed with it: the cells it has stay valid), else the first difference in words, for a plain message."""
    old, new = json.loads(old_json), json.loads(new_json)
    for d in (old, new):
        d.pop("seed", None)
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if k in AXES and isinstance(a, list) and isinstance(b, list):
            missing = [x for x in a if x not in b]
            if not missing:
                continue
            return f"{k} no longer has {', '.join(map(str, missing))}"
        if isinstance(a, dict) and isinstance(b, dict):
            sub = next(s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s))
            return f"{k}.{sub} is {b.get(sub)!r}, was {a.get(sub)!r}"
        return f"{k} is {b!r}, was {a!r}"
    return None


def load_spec(spec: SweepSpec | Mapping[str, Any] | str | Path | None, overrides: Mapping[str, Any]) -> SweepSpec:
    """A spec from a SweepSpec, a mapping or a TOML path, with ``overrides`` applied and its values checked (names
    against the registries are checked later, by ``validate``). A file or mapping is validated only after the
    overrides are applied, since they may supply what it lacks (the docs promise that flags override the file)."""
    if spec is None or isinstance(spec, SweepSpec):
        return merge(spec, overrides) if overrides or spec is None else spec
    data = _read_toml(spec) if isinstance(spec, str | Path) else spec
    return spec_from_mapping(_apply_overrides(dict(data), overrides))


def _apply_overrides(base: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` on top (None means not given); nested tables merge key by key."""
    for k, v in overrides.items():
        if v is None:
            continue
        if k in ("timing", "isolation", "params", "tolerances") and isinstance(v, Mapping):
            old = base.get(k)
            if old is not None and not isinstance(old, Mapping):
                continue  # the file's own bad value stays, so the error names it
            merged = dict(old or {})
            merged.update(v)
            base[k] = merged
        else:
            base[k] = v
    return base


def merge(spec: SweepSpec | None, overrides: Mapping[str, Any]) -> SweepSpec:
    """Apply overrides (CLI flags, keyword arguments) on top of a spec; nested tables merge key by key."""
    base = spec_to_mapping(spec) if spec is not None else {}
    if spec is not None:
        # Drop defaults-only entries so that validation messages stay about what the user wrote.
        base.pop("timing")
        base.pop("isolation")
        base["timing"] = {k: v for k, v in dataclasses.asdict(spec.timing).items() if v != getattr(TimingConfig(), k)}
        base["isolation"] = {
            k: v for k, v in dataclasses.asdict(spec.isolation).items() if v != getattr(IsolationConfig(), k)
        }
    return spec_from_mapping(_apply_overrides(base, overrides))


def variant_param_grid(spec: SweepSpec, variant: str, declared: Mapping[str, Any]) -> list[dict[str, Any]]:
    """All parameter combinations for one variant: declared defaults ← global params ← per-variant table.

    ``declared`` maps the variant's parameter names to :class:`~nnforge.modelview.variants.base.Param`."""
    chosen: dict[str, list[Any]] = {name: [p.default] for name, p in declared.items()}
    for k, v in spec.params.items():
        if isinstance(v, Mapping):
            continue
        if k in declared:
            chosen[k] = _param_values(f"params.{k}", v)
    own = spec.params.get(variant)
    if isinstance(own, Mapping):
        for k, v in own.items():
            if k not in declared:
                raise SpecError(
                    f"params.{variant}.{k}", v, f"unknown parameter of {variant} (known: {', '.join(declared) or '-'})"
                )
            chosen[k] = _param_values(f"params.{variant}.{k}", v)
    for k, values in chosen.items():
        for value in values:
            err = declared[k].check(value)
            if err:
                where = f"params.{variant}.{k}" if isinstance(own, Mapping) and k in own else f"params.{k}"
                raise SpecError(where, value, err)
    names = sorted(chosen)
    return [dict(zip(names, combo)) for combo in itertools.product(*(chosen[n] for n in names))]


def _param_values(where: str, value: Any) -> list[Any]:
    """A parameter's values as a list (a list is one more axis). Like the other axes, an empty list (a sweep of
    nothing) and a repeated value (two cells with one key: one row stored, the run then looks unfinished) are errors."""
    values = list(value) if isinstance(value, list | tuple) else [value]
    if not values:
        raise SpecError(where, value, "must not be empty")
    if any(v in values[:i] for i, v in enumerate(values)):
        raise SpecError(where, value, "contains duplicates")
    return values


def validate(spec: SweepSpec, variants: Mapping[str, Any], backends: Mapping[str, Any]) -> None:
    """Check names against the registries and every variant parameter against its declaration."""
    for v in spec.variants:
        if v not in variants:
            raise SpecError("variants", v, f"unknown variant (known: {', '.join(sorted(variants))})")
    for b in spec.backends:
        if b not in backends:
            raise SpecError("backends", b, f"unknown backend (known: {', '.join(sorted(backends))})")
    all_declared: set[str] = set()
    for v in spec.variants:
        all_declared |= set(variants[v].params)
    for k, value in spec.params.items():
        if isinstance(value, Mapping):
            if k not in spec.variants:
                raise SpecError(f"params.{k}", dict(value), "per-variant table for a variant that is not selected")
        elif k not in all_declared:
            raise SpecError(
                f"params.{k}", value, f"no selected variant declares it (declared: {', '.join(sorted(all_declared))})"
            )
    for v in spec.variants:
        for params in variant_param_grid(spec, v, variants[v].params):
            check = getattr(variants[v], "check_params", None)  # Variant's; a registry's stand-in may lack it
            err = check(params) if check else None
            if err:
                raise SpecError(f"params.{v}", params, err)


def expand(spec: SweepSpec, variants: Mapping[str, Any]) -> list[Cell]:
    """The cells of a validated spec in a stable order: settings in axis order, backends in spec order within each."""
    cells = []
    for v in spec.variants:
        for params in variant_param_grid(spec, v, variants[v].params):
            p = tuple(sorted(params.items()))
            for dev, dt, mode, layout, n, t in itertools.product(
                spec.device, spec.dtype, spec.mode, spec.layout, spec.batch, spec.seq_len
            ):
                for b in spec.backends:
                    cells.append(Cell(v, b, n, t, layout, dt, mode, dev, p))
    return cells


def settings(cells: Iterable[Cell]) -> dict[str, list[Cell]]:
    """Group cells by setting (everything but the backend), keeping order."""
    out: dict[str, list[Cell]] = {}
    for c in cells:
        out.setdefault(c.setting_key, []).append(c)
    return out


def parse_param_flags(flags: Sequence[str]) -> dict[str, Any]:
    """``--param hidden=128 --param bonito.width=96,384`` → the ``params`` table. Values are parsed as TOML scalars
    (so ``true``, ``1e-3`` and ``"x"`` work); a comma-separated value is a list. A parameter given again adds its
    values (``-p hidden=8 -p hidden=16`` is ``hidden = [8, 16]``), as a repeated ``-n`` does: the later flag
    replacing the earlier one dropped a value the user asked for without a word."""
    out: dict[str, Any] = {}
    for flag in flags:
        if "=" not in flag:
            raise SpecError("param", flag, "expected NAME=VALUE or VARIANT.NAME=VALUE")
        name, raw = flag.split("=", 1)
        values = [_toml_scalar(name, x) for x in raw.split(",")]
        table, pname = out, name
        if "." in name:
            variant, pname = name.split(".", 1)
            table = out.setdefault(variant, {})
            if not isinstance(table, dict):
                raise SpecError("param", flag, f"{variant} was given as a parameter, not a variant")
        elif isinstance(out.get(name), dict):
            raise SpecError("param", flag, f"{name} was given as a variant, not a parameter")
        if pname in table:
            old = table[pname]
            values = [*(old if isinstance(old, list) else [old]), *values]
        unique = [v for i, v in enumerate(values) if v not in values[:i]]
        table[pname] = unique if len(unique) > 1 else unique[0]
    return out


def _toml_scalar(name: str, raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return raw.strip()
