"""PyTorch's own execution paths: eager, TorchScript (script and trace), torch.compile (three modes), CUDA graphs."""

from __future__ import annotations

import shutil
import types
import warnings
from typing import Any

import torch

from ..registry import backend
from .base import Backend, Context, Prepared, clip_artifact


@backend
class Eager(Backend):
    name = "eager"
    description = "the module as written (the reference point of every ratio)"
    compiles = False

    def prepare(self, ctx: Context) -> Prepared:
        return Prepared(fn=ctx.module)


@backend
class JitScript(Backend):
    name = "jit.script"
    description = "torch.jit.script (TorchScript compiler; profiling executor fuses on later calls)"

    def prepare(self, ctx: Context) -> Prepared:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "torch.jit.script is deprecated": we measure it
            scripted = torch.jit.script(ctx.module)
        return Prepared(fn=scripted, artifact=clip_artifact(scripted.code))


@backend
class JitTrace(Backend):
    name = "jit.trace"
    description = "torch.jit.trace (records one execution; Python control flow is unrolled)"

    def prepare(self, ctx: Context) -> Prepared:
        grad = torch.enable_grad() if ctx.cell.mode == "training" else torch.no_grad()
        with grad, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(ctx.module, ctx.inputs, check_trace=False)
        return Prepared(fn=traced, artifact=clip_artifact(traced.code))


def _fresh_entry(module: torch.nn.Module, tag: str) -> Any:
    """A function calling ``module`` with its own code object. Dynamo keys its cache by code object, so each compile
    backend in one worker gets its own compiled graph instead of silently reusing another mode's."""

    def entry(*args: Any) -> Any:
        return module(*args)

    code = entry.__code__.replace(co_name=f"modelview_{tag}")
    return types.FunctionType(code, entry.__globals__, code.co_name, None, entry.__closure__)


class _Compile(Backend):
    mode: str = "default"
    lazy = True

    def applies(self, ctx: Context) -> str | None:
        if ctx.device.type == "cpu" and shutil.which("cc") is None and shutil.which("gcc") is None:
            return "torch.compile on CPU needs a C compiler (cc/gcc) on PATH"
        return None

    def prepare(self, ctx: Context) -> Prepared:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        fn = torch.compile(_fresh_entry(ctx.module, self.name.replace(".", "_").replace("-", "_")), mode=self.mode)
        return Prepared(fn=fn, info={"compile_mode": self.mode})


@backend
class Compile(_Compile):
    name = "compile"
    description = "torch.compile, default mode (TorchInductor)"
    mode = "default"


@backend
class CompileReduceOverhead(_Compile):
    name = "compile.reduce-overhead"
    description = "torch.compile mode='reduce-overhead' (Inductor + CUDA graphs)"
    mode = "reduce-overhead"

    def applies(self, ctx: Context) -> str | None:
        if ctx.device.type != "cuda":
            return "reduce-overhead only differs from the default mode through CUDA graphs (needs a CUDA device)"
        return super().applies(ctx)


@backend
class CompileMaxAutotune(_Compile):
    name = "compile.max-autotune"
    description = "torch.compile mode='max-autotune' (benchmarks kernel choices while compiling)"
    mode = "max-autotune"


@backend
class CudaGraphs(Backend):
    name = "cudagraphs"
    description = "the eager module captured into a CUDA graph and replayed"

    def applies(self, ctx: Context) -> str | None:
        if ctx.device.type != "cuda":
            return "CUDA graphs need a CUDA device"
        if not torch.cuda.is_available():
            return "CUDA is not available"
        return None

    def prepare(self, ctx: Context) -> Prepared:
        if ctx.cell.mode == "training":
            graphed = torch.cuda.make_graphed_callables(ctx.module, tuple(x.clone() for x in ctx.inputs))
            return Prepared(fn=graphed, info={"capture": "make_graphed_callables"})
        static_in = [x.clone() for x in ctx.inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):  # warm-up on a side stream, as capture requires
                ctx.module(*static_in)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            static_out = ctx.module(*static_in)

        def replay(*inputs: torch.Tensor) -> Any:
            for dst, src in zip(static_in, inputs):
                if dst.data_ptr() != src.data_ptr():
                    dst.copy_(src)
            graph.replay()
            return static_out

        return Prepared(fn=replay, info={"capture": "torch.cuda.graph"})
