"""Backends outside PyTorch: ONNX Runtime (via torch.onnx export), TensorRT (via torch_tensorrt), and nnforge."""

from __future__ import annotations

import collections
import contextlib
import importlib
import io
import warnings
from typing import Any

import torch

from ..registry import backend
from .base import Backend, Context, Prepared, clip_artifact


def _flatten(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flatten(o)]


def _export_onnx(ctx: Context) -> tuple[bytes, str]:
    """TorchScript-based export first (fast, fixed shapes are all a cell needs); torch.export-based as fallback."""
    names = [f"input{i}" for i in range(len(ctx.inputs))]
    errors = []
    for dynamo in (False, True):
        buf = io.BytesIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")
                if dynamo:
                    program = torch.onnx.export(ctx.module, ctx.inputs, dynamo=True, input_names=names)
                    program.save(buf)  # type: ignore[union-attr]
                else:
                    torch.onnx.export(ctx.module, ctx.inputs, buf, dynamo=False, input_names=names, opset_version=17)
            return buf.getvalue(), "torch.onnx.export(dynamo=True)" if dynamo else "torch.onnx.export(dynamo=False)"
        except Exception as e:
            errors.append(f"dynamo={dynamo}: {type(e).__name__}: {e}")
    raise RuntimeError("ONNX export failed: " + " | ".join(errors))


@backend
class OnnxRuntime(Backend):
    name = "onnxruntime"
    description = "exported with torch.onnx, run by ONNX Runtime (CPU or CUDA execution provider)"
    training = False

    def applies(self, ctx: Context) -> str | None:
        try:
            ort = importlib.import_module("onnxruntime")
        except ImportError:
            return "onnxruntime is not installed"
        if ctx.device.type == "cuda" and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
        if ctx.device.type == "cuda" and ctx.dtype not in _NP_DTYPES:
            return f"onnxruntime's I/O binding takes numpy element types, and numpy has no {ctx.dtype}"
        return None

    def prepare(self, ctx: Context) -> Prepared:
        import onnx
        import onnxruntime as ort

        model_bytes, method = _export_onnx(ctx)
        graph = onnx.load_from_string(model_bytes).graph
        ops = collections.Counter(n.op_type for n in graph.node)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = ctx.threads
        opts.inter_op_num_threads = 1
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        cuda = ctx.device.type == "cuda"
        providers = ["CUDAExecutionProvider"] if cuda else ["CPUExecutionProvider"]
        sess = ort.InferenceSession(model_bytes, sess_options=opts, providers=providers)
        in_names = [i.name for i in sess.get_inputs()]
        out_names = [o.name for o in sess.get_outputs()]
        with torch.no_grad():
            example = ctx.module(*ctx.inputs)
        single = isinstance(example, torch.Tensor)
        artifact = f"{method}; {len(graph.node)} nodes: " + ", ".join(f"{k}×{v}" for k, v in ops.most_common())
        info = {"export": method, "providers": sess.get_providers(), "onnx_nodes": len(graph.node)}

        if not cuda:

            def run_cpu(*inputs: torch.Tensor) -> Any:
                outs = sess.run(out_names, {n: x.detach().numpy() for n, x in zip(in_names, inputs)})
                ts = [torch.from_numpy(o) for o in outs]
                return ts[0] if single else tuple(ts)

            return Prepared(fn=run_cpu, artifact=clip_artifact(artifact), info=info)

        outs = [torch.empty_like(t) for t in _flatten(example)]
        binding = sess.io_binding()
        for name, t in zip(out_names, outs):
            binding.bind_output(name, "cuda", t.device.index or 0, _np_dtype(t), tuple(t.shape), t.data_ptr())

        def run_cuda(*inputs: torch.Tensor) -> Any:
            for name, x in zip(in_names, inputs):
                x = x.contiguous()
                binding.bind_input(name, "cuda", x.device.index or 0, _np_dtype(x), tuple(x.shape), x.data_ptr())
            sess.run_with_iobinding(binding)
            return outs[0] if single else tuple(outs)

        return Prepared(fn=run_cuda, artifact=clip_artifact(artifact), info=info)


_NP_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.int64: "int64",
              torch.int32: "int32", torch.bool: "bool"}


def _np_dtype(t: torch.Tensor) -> Any:
    import numpy as np

    return np.dtype(_NP_DTYPES[t.dtype]).type


@backend
class TensorRT(Backend):
    name = "tensorrt"
    description = "torch_tensorrt.compile (TensorRT engines through the dynamo frontend)"
    training = False

    def applies(self, ctx: Context) -> str | None:
        if ctx.device.type != "cuda":
            return "TensorRT needs a CUDA device"
        try:
            importlib.import_module("torch_tensorrt")
        except ImportError:
            return "torch_tensorrt is not installed"
        return None

    def prepare(self, ctx: Context) -> Prepared:
        import torch_tensorrt

        trt = torch_tensorrt.compile(
            ctx.module, ir="dynamo", inputs=list(ctx.inputs), enabled_precisions={ctx.dtype}
        )
        return Prepared(fn=trt, info={"torch_tensorrt": getattr(torch_tensorrt, "__version__", "?")})


class _Nnforge(Backend):
    """nnforge's own compiler. The variant supplies ``nnforge_impl`` (its model written with nnforge ops)."""

    target: str = "reference"
    options: tuple[tuple[str, Any], ...] = ()  # the backend's settings (``nf.compile(..., options=...)``)
    devices: tuple[str, ...] = ("cpu",)  # where the target's code runs
    lazy = True  # nf.compile traces on the first call with a new signature

    def applies(self, ctx: Context) -> str | None:
        try:
            nf = importlib.import_module("nnforge")
        except ImportError as e:
            return f"nnforge cannot be imported: {e}"
        if not hasattr(nf, "compile") or not hasattr(nf, "scan"):
            return "this nnforge has no compile/scan API yet"
        if ctx.device.type not in self.devices:
            # The host targets would take the CUDA tensors through host copies and time the CPU: not a GPU result.
            return (f"nnforge backend {self.target!r} runs on {' and '.join(self.devices)} only, "
                    f"not on {ctx.device.type}")
        available = getattr(nf, "available_backends", None)
        if available is not None:
            try:
                names = list(available())
            except Exception as e:
                return f"nnforge.available_backends() failed: {e}"
            if self.target not in names:
                return f"nnforge backend {self.target!r} is not available here (available: {', '.join(names) or '-'})"
        impl = ctx.variant.nnforge_impl(ctx.request)
        if impl is None:
            return f"variant {ctx.cell.variant} has no nnforge implementation for these parameters"
        if ctx.cell.mode == "training" and impl.weights is None:
            return f"variant {ctx.cell.variant}'s nnforge implementation names no weights to differentiate"
        return None

    def prepare(self, ctx: Context) -> Prepared:
        import nnforge as nf

        impl = ctx.variant.nnforge_impl(ctx.request)
        assert impl is not None
        compiled = nf.compile(impl.fn, backend=self.target, options=dict(self.options))
        args = impl.bind(ctx.module)

        def run(*inputs: torch.Tensor) -> Any:
            return impl.output(compiled(*args(*inputs)))

        artifact = None
        show = getattr(nf, "show", None)
        if show is not None:
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    shown = show(impl.fn, *args(*ctx.inputs))
                artifact = buf.getvalue() or (shown if isinstance(shown, str) else None)
            except Exception as e:
                artifact = f"(nf.show failed: {type(e).__name__}: {e})"
        train = self._training(impl, ctx, args) if ctx.cell.mode == "training" else None
        info = {"nnforge_backend": self.target, **({"nnforge_options": dict(self.options)} if self.options else {})}
        return Prepared(fn=run, artifact=clip_artifact(artifact), info=info, train=train)

    def _training(self, impl: Any, ctx: Context, args: Any) -> Any:
        """The training step factory: one compiled nnforge program computes the outputs and the weights' gradients
        for given output cotangents (forward and backward through time); torch carries those gradients on to the
        module's parameters (``impl.weights`` is differentiable), so ``.grad`` ends up where eager puts it."""
        import nnforge as nf

        nums = tuple(impl.weight_argnums)

        def loss(*a: Any) -> Any:
            out = impl.fn(*a[:-1])
            return (out * a[-1]).sum(), out

        step_fn = nf.compile(nf.value_and_grad(loss, argnums=nums, has_aux=True), backend=self.target,
                             options=dict(self.options))

        def make(cots: list[torch.Tensor]) -> Any:
            shape = nf.compile(impl.fn).trace(*args(*ctx.inputs)).outputs[0].shape
            y = torch.zeros(tuple(int(d) for d in shape), dtype=ctx.dtype, device=ctx.device, requires_grad=True)
            outs = impl.output(y)
            outs = [outs] if isinstance(outs, torch.Tensor) else list(outs)
            (cot,) = torch.autograd.grad(outs, y, cots)  # the cotangent in fn's layout
            params = [p for p in ctx.module.parameters() if p.requires_grad]

            def step(*inputs: torch.Tensor) -> Any:
                for p in params:
                    p.grad = None
                a = list(args(*inputs))
                w = impl.weights(ctx.module)
                for k, t in zip(nums, w):
                    a[k] = t.detach()
                (_, out), grads = step_fn(*a, cot)
                torch.autograd.backward(list(w), [torch.as_tensor(g) for g in grads])
                return impl.output(out)

            return step

        return make


@backend
class NnforgeReference(_Nnforge):
    name = "nnforge.reference"
    description = "nnforge, numpy reference interpreter"
    target = "reference"


@backend
class NnforgeCpu(_Nnforge):
    name = "nnforge.cpu"
    description = "nnforge, generated C (OpenMP)"
    target = "cpu"


@backend
class NnforgeTriton(_Nnforge):
    name = "nnforge.triton"
    description = "nnforge, generated Triton kernels"
    target = "triton"
    devices = ("cuda",)

    def skip_reason(self, ctx: Context) -> str | None:
        reason = super().skip_reason(ctx)
        from ...codegen.triton import interpreted

        if reason is None and interpreted():
            # the kernels would run on the host, one program after another: not a GPU measurement
            return "Triton runs under its interpreter here (TRITON_INTERPRET=1): unset it to measure on the GPU"
        return reason


@backend
class NnforgeTritonGraphs(NnforgeTriton):
    name = "nnforge.triton+graphs"
    description = "nnforge, generated Triton kernels replayed as CUDA graphs"
    options = (("cuda_graphs", True),)
