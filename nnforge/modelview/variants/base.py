"""What a variant is: a model implementation that can be built at any setting, with declared cost.

A variant builds a float64 CPU module and its inputs; the harness derives everything else from that one module: the
float64 eager reference, and per backend a copy cast to the cell's dtype and moved to the cell's device. Building once
in float64 and casting guarantees that every backend of a setting sees the same weights and inputs as the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch


@dataclass(frozen=True)
class Param:
    """A variant parameter's declaration: its default, its type, and optionally its allowed values or minimum."""

    default: Any
    kind: type = int
    choices: tuple[Any, ...] | None = None
    minimum: float | None = 1
    help: str = ""

    def check(self, value: Any) -> str | None:
        """None when ``value`` is acceptable, else why not."""
        if self.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            return "expected an integer"
        if self.kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
            return "expected a number"
        if self.kind is str and not isinstance(value, str):
            return "expected a string"
        if self.kind is bool and not isinstance(value, bool):
            return "expected true or false"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}"
        if self.minimum is not None and self.kind in (int, float) and value < self.minimum:
            return f"must be >= {self.minimum}"
        return None


@dataclass(frozen=True)
class Request:
    """The setting a variant is built for (everything in a cell except the backend, dtype and device)."""

    batch: int
    seq_len: int
    layout: str
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def batch_first(self) -> bool:
        return self.layout == "NTC"

    def seq_shape(self, channels: int) -> tuple[int, int, int]:
        """Shape of a sequence input in this layout."""
        if self.batch_first:
            return (self.batch, self.seq_len, channels)
        return (self.seq_len, self.batch, channels)


@dataclass(frozen=True)
class NnforgeImpl:
    """How to run a variant on nnforge. ``fn`` uses nnforge ops (compiled by ``nf.compile``). ``bind(module)`` is called
    once (outside the timed region) with the cast module and returns ``args(*inputs) -> fn's arguments``, which runs
    inside every timed call (so a layout change it makes is paid for). ``output`` maps ``fn``'s result to the module's
    output structure (with torch ops, so cotangents map back through it). For a training step, ``weights(module)``
    gives the arguments at ``weight_argnums`` as differentiable functions of the module's parameters (``b_ih + b_hh``):
    nnforge differentiates ``fn`` w.r.t. them and torch carries the result on to the parameters."""

    fn: Callable[..., Any]
    bind: Callable[[torch.nn.Module], Callable[..., tuple[Any, ...]]]
    output: Callable[[Any], Any]
    weights: Callable[[torch.nn.Module], tuple[torch.Tensor, ...]] | None = None
    weight_argnums: tuple[int, ...] = ()


class Variant:
    """Base class. Subclasses set ``name``, ``description``, ``params`` and implement ``module``, ``inputs``,
    ``flops`` and ``min_bytes`` (for one inference call). Training cost follows fixed conventions (documented in
    docs/modelview.md): 3× the forward FLOPs, 2× the forward minimum bytes."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    params: ClassVar[dict[str, Param]] = {}
    throughput_unit: ClassVar[str] = "vectors/s"

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> str | None:
        """What is wrong with a combination of parameters each valid alone (``nhead`` must divide ``d_model``), or
        None. Checked with the spec, before anything runs: a cell that could never be built is no failed row."""
        return None

    def module(self, req: Request) -> torch.nn.Module:
        """A float64 CPU module; weights drawn from the torch default generator, which the harness seeds."""
        raise NotImplementedError

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """float64 CPU inputs drawn from ``gen``."""
        raise NotImplementedError

    def items(self, req: Request) -> float:
        """Units of work per call for throughput: T×N vectors (or raw samples for a basecaller)."""
        return float(req.seq_len * req.batch)

    def flops(self, req: Request) -> float:
        """Floating-point operations of one forward call (a multiply-add counts 2)."""
        raise NotImplementedError

    def min_bytes(self, req: Request, itemsize: int) -> float:
        """Bytes one forward call must move at least: weights and inputs read once, outputs written once."""
        raise NotImplementedError

    def nnforge_impl(self, req: Request) -> NnforgeImpl | None:
        """An implementation in nnforge ops, or None when the variant has none."""
        return None


def param_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def seq_randn(req: Request, channels: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(req.seq_shape(channels), generator=gen, dtype=torch.float64)
