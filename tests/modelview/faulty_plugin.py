"""Misbehaving variants and backends for the isolation tests, loaded by the workers as a plugin file."""

from __future__ import annotations

import ctypes
import time
from typing import ClassVar

import torch
from torch import nn

from nnforge.modelview import Backend, Context, Param, Prepared, Request, Variant, backend, variant


class _Tiny(Variant):
    params: ClassVar[dict[str, Param]] = {"width": Param(4)}

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(req.seq_shape(req.params["width"]), generator=gen, dtype=torch.float64),)

    def flops(self, req: Request) -> float:
        return float(req.batch * req.seq_len * req.params["width"])

    def min_bytes(self, req: Request, itemsize: int) -> float:
        return float(2 * req.batch * req.seq_len * req.params["width"] * itemsize)


class Segfault(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)  # reads address 0: SIGSEGV
        return x


class Hang(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(3600)
        return x


class Hog(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ones(2**31, dtype=torch.float64) .sum() * x  # 16 GiB


class Raises(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise ValueError("this variant always fails")


@variant
class SegfaultVariant(_Tiny):
    name = "test_segfault"

    def module(self, req: Request) -> nn.Module:
        return Segfault()


@variant
class HangVariant(_Tiny):
    name = "test_hang"

    def module(self, req: Request) -> nn.Module:
        return Hang()


@variant
class HogVariant(_Tiny):
    name = "test_hog"

    def module(self, req: Request) -> nn.Module:
        return Hog()


@variant
class RaisesVariant(_Tiny):
    name = "test_raises"

    def module(self, req: Request) -> nn.Module:
        return Raises()


@variant
class TanhVariant(_Tiny):
    """A well-behaved variant."""

    name = "test_tanh"

    def module(self, req: Request) -> nn.Module:
        return nn.Tanh()


@backend
class WrongBackend(Backend):
    """Returns slightly wrong numbers: must be recorded as a mismatch, never timed."""

    name = "test_wrong"

    def prepare(self, ctx: Context) -> Prepared:
        return Prepared(fn=lambda x: ctx.module(x) + 0.1)


@backend
class CrashingBackend(Backend):
    """Segfaults while compiling: the setting's other backends must still get their rows."""

    name = "test_crash"

    def prepare(self, ctx: Context) -> Prepared:
        ctypes.string_at(0)
        raise AssertionError("unreachable")


@backend
class SkippingBackend(Backend):
    name = "test_skip"

    def applies(self, ctx: Context) -> str | None:
        return "never applies (test)"


@backend
class FailsSecondTime(Backend):
    """Works in the first process and fails in every later one (marker file named by $MV_FLAKY_MARK)."""

    name = "test_flaky"

    def prepare(self, ctx: Context) -> Prepared:
        import os
        from pathlib import Path

        mark = Path(os.environ["MV_FLAKY_MARK"])
        if mark.exists():
            raise RuntimeError("fails in a later process")
        mark.write_text("seen")
        return Prepared(fn=ctx.module)


@backend
class DeviceOom(Backend):
    """Runs out of device memory while compiling: an "oom" row, and the setting's next backends still run in the
    same worker (on a GPU, after the failed attempt's memory is given back). Off a GPU the error is raised as torch
    raises it; on one the allocation is real."""

    name = "test_device_oom"

    def prepare(self, ctx: Context) -> Prepared:
        if ctx.device.type == "cuda":
            torch.empty(1 << 50, dtype=torch.uint8, device=ctx.device)  # a petabyte
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1024.00 TiB (test)")
