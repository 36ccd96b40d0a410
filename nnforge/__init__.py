"""nnforge: forge fast neural networks (a compiler that keeps loops as loops), and find them (ModelView)."""

from . import dtypes
from .codegen import available_backends
from .compile import CompiledFunction, compile, show
from .control import Feeder, Receiver, execute, loop, scan
from .differentiate import grad, value_and_grad, vjp
from .dtypes import DType, bfloat16, bool_, float16, float32, float64, int32, int64
from .einsum import einsum
from .errors import DTypeError, NNForgeError, ShapeError, TraceError
from .indexing import gather, index_select, scatter_add, set_at, take_along_axis
from .saving import LoadError, load
from .tensor import (
    HostValue,
    Tensor,
    abs,
    arange,
    argmax,
    argmin,
    as_tensor,
    cast,
    cat,
    chunk,
    clamp,
    concat,
    cos,
    cumprod,
    cumsum,
    erf,
    exp,
    expand,
    expm1,
    flip,
    full,
    gelu,
    log,
    log1p,
    log_softmax,
    logsumexp,
    masked_fill,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    neg,
    ones,
    ones_like,
    pad,
    permute,
    rand,
    randn,
    reciprocal,
    relu,
    repeat,
    repeat_interleave,
    reshape,
    rsqrt,
    sigmoid,
    sign,
    silu,
    sin,
    softmax,
    split,
    sqrt,
    square,
    squeeze,
    stack,
    std,
    sum,
    tanh,
    tensor,
    tile,
    transpose,
    tril,
    triu,
    unsqueeze,
    var,
    where,
    zeros,
    zeros_like,
)
from .trace import manual_seed

__all__ = [n for n in dir() if not n.startswith("_")]
