"""What a backend is: a way to turn a module into a callable, with a say on which cells it applies to.

``applies(ctx)`` returns None or the reason a cell is skipped (CUDA graphs on CPU, a package that is not installed, a
variant without an nnforge implementation...); the reason is stored with the skipped row so a sweep table never has
silent holes. ``prepare(ctx)`` builds the callable; the harness times it as the compile time. Backends that compile on
their first call set ``lazy = True``, and the harness makes that call inside the compile window, so that
"compile time" means the same for every backend and "first call" is the first call a user would make afterwards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from ..spec import Cell
from ..variants.base import Request, Variant


@dataclass
class Context:
    """Everything a backend may look at for one cell. ``module`` and ``inputs`` are already cast to the cell's dtype,
    moved to its device and put in train/eval mode; the module is this backend's own copy."""

    cell: Cell
    variant: Variant
    request: Request
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    device: torch.device
    dtype: torch.dtype
    threads: int


@dataclass
class Prepared:
    """A callable with the module's signature and output structure. ``parameters`` are the tensors whose gradients a
    training step produces (default: the module's); ``artifact`` is IR or generated code when the backend has it."""

    fn: Callable[..., Any]
    parameters: list[torch.Tensor] | None = None
    artifact: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    # For a backend whose outputs carry no autograd graph (nnforge): builds the training step from the output
    # cotangents; the step sets the parameters' ``.grad`` and returns the outputs.
    train: Callable[[list[torch.Tensor]], Callable[..., Any]] | None = None


class Backend:
    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    lazy: ClassVar[bool] = False
    # False for a backend with nothing to compile (eager): its row then has no compile time, rather than the
    # microseconds of a prepare() that only returns the module, and the report's compile chart uses its first call.
    compiles: ClassVar[bool] = True
    training: ClassVar[bool] = True  # whether the backend can run a training step (forward + backward)

    def applies(self, ctx: Context) -> str | None:
        """None if the backend can run this cell, else the reason it is skipped."""
        return None

    def prepare(self, ctx: Context) -> Prepared:
        raise NotImplementedError

    def skip_reason(self, ctx: Context) -> str | None:
        """The harness entry point: the generic training check, then the backend's own."""
        if ctx.cell.mode == "training" and not self.training:
            return f"{self.name} measures inference only"
        return self.applies(ctx)


ARTIFACT_LIMIT = 200_000  # characters; a fully unrolled trace of a long sequence can be megabytes


def clip_artifact(text: str | None) -> str | None:
    if text is None or len(text) <= ARTIFACT_LIMIT:
        return text
    return text[:ARTIFACT_LIMIT] + f"\n... [{len(text) - ARTIFACT_LIMIT} more characters cut]"
