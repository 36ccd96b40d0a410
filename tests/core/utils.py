"""Shared helpers of the core tests: the tolerance table, seeded random inputs, numpy/torch conversion."""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import torch

import nnforge as nf

FLOATS = ("float64", "float32", "float16", "bfloat16")
INTS = ("int32", "int64")
ALL_DTYPES = ("bool", *INTS, *FLOATS)

# ---- tolerances: the one table every numerical comparison in tests/core reads ---------------------------------
# (rtol, atol) per dtype, for nnforge vs torch computing in the same dtype on CPU. ``atol`` is scaled by the
# largest magnitude of the expected values (see ``assert_close``), so cancellation in sums and matmuls is judged
# relative to the size of what was added up.
#  float64  eps 2.2e-16: two libms and summation orders differ by a few ulps; 1e-10 leaves ~1e5 ulps of room for
#           error that compounds through a composite (softmax, var, a 10-step scan) yet catches any real bug.
#  float32  eps 1.2e-7: ~100 ulps (1e-5) relative, the usual float32 budget for libm plus reassociation.
#  float16  eps 9.8e-4: nnforge rounds to half after every primitive of a composite op while torch's fused CPU
#           kernels often round once, so allow ~5 ulps relative (5e-3) and the same absolute at the output scale.
#  bfloat16 eps 7.8e-3: the same ~5 ulps argument gives 4e-2.
TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-10, 1e-10),
    "float32": (1e-5, 1e-5),
    "float16": (5e-3, 5e-3),
    "bfloat16": (4e-2, 4e-2),
}
# Gradients go through one more chain of ops than the forward value (the vjp rules): a factor of 10 on top.
GRAD_FACTOR = 10.0
# Central differences in float64 with step h=1e-6 on a random projection: truncation error O(h^2 f''') ~1e-12,
# round-off O(eps / h) ~1e-10 relative to the function's size; 1e-6 is far above both and far below any real bug.
FD_STEP = 1e-6
FD_TOL = (1e-6, 1e-6)


def seed_of(*parts: Any) -> int:
    """A stable seed per test, so failures reproduce but different tests see different inputs."""
    return zlib.crc32("/".join(map(str, parts)).encode())


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def to_torch(a: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype == np_dtype("bfloat16"):
        t = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    else:
        t = torch.from_numpy(np.array(a, copy=True))
    return t.requires_grad_(requires_grad)


def to_np(t: Any) -> np.ndarray:
    """torch tensor / nf tensor / array -> numpy (bfloat16 and float16 widened to float64 for comparing)."""
    if isinstance(t, nf.Tensor):
        t = t.numpy()
    if isinstance(t, torch.Tensor):
        t = t.detach()
        if t.dtype == torch.bfloat16:
            t = t.float()
        t = t.numpy()
    a = np.asarray(t)
    if a.dtype == np_dtype("bfloat16") or a.dtype == np.float16:
        a = a.astype(np.float64)
    return a


def tol(dtype: str, grad: bool = False) -> tuple[float, float]:
    rtol, atol = TOLERANCES[dtype]
    return (rtol * GRAD_FACTOR, atol * GRAD_FACTOR) if grad else (rtol, atol)


def assert_close(actual: Any, expected: Any, dtype: str | None = None, *, rtol: float | None = None,
                 atol: float | None = None, grad: bool = False, what: str = "") -> None:
    """Element-wise comparison with the table's tolerance for ``dtype``; shapes must match exactly."""
    a, e = to_np(actual), to_np(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != expected {e.shape}"
    if dtype is not None:
        rtol, atol = tol(dtype, grad)
    assert rtol is not None and atol is not None
    if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
        np.testing.assert_array_equal(a, e, err_msg=what)
        return
    assert np.array_equal(np.isfinite(a), np.isfinite(e)), f"{what}: inf/nan where the expected value has none"
    scale = max(1.0, float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0)))
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol * scale, equal_nan=True, err_msg=what)


def rand_array(rng: np.random.Generator, shape: tuple, domain: str = "real", dtype: str = "float64") -> np.ndarray:
    """Random values (never all zeros) from a named domain, rounded to ``dtype``.

    real: standard normal; positive: [0.5, 2]; away0: |x| in [0.2, 2] with random sign (kinks of abs/relu/sign
    stay far from finite-difference steps); unit: (-0.9, 0.9); smallint: integers in [-2, 2] (ties for
    comparisons and max); large: normal * 1e4 (overflow tests); bool: random booleans.
    """
    shape = tuple(shape)
    if dtype == "bool" or domain == "bool":
        a = rng.random(shape) < 0.5
        if a.size:
            a.flat[0] = True
            if a.size > 1:
                a.flat[-1] = False
        return a.astype(np.bool_) if dtype == "bool" else a.astype(np_dtype(dtype))
    if domain == "real":
        a = rng.standard_normal(shape)
    elif domain == "positive":
        a = rng.uniform(0.5, 2.0, shape)
    elif domain == "away0":
        a = rng.uniform(0.2, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    elif domain == "unit":
        a = rng.uniform(-0.9, 0.9, shape)
    elif domain == "smallint":
        a = rng.integers(-2, 3, shape).astype(np.float64)
        if a.size and not a.any():
            a.flat[0] = 1
    elif domain == "large":
        a = np.clip(rng.standard_normal(shape), -3, 3) * 1e4
    else:
        raise ValueError(domain)
    if dtype in INTS:
        a = np.round(a * (3 if domain == "real" else 1))
        if domain in ("positive", "away0"):
            a[a == 0] = 1
        if a.size and not a.any():
            a.flat[0] = 1
    return np.asarray(a).astype(np_dtype(dtype))


def torch_getitem(t: torch.Tensor, index) -> torch.Tensor:
    """numpy-style basic indexing for torch, negative steps included (torch refuses those)."""
    index = index if isinstance(index, tuple) else (index,)
    n_real = sum(1 for i in index if i is not None and i is not Ellipsis)
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (t.ndim - n_real) + index[k + 1:]
    index = index + (slice(None),) * (t.ndim - sum(1 for i in index if i is not None))
    out_axis, in_axis = 0, 0
    for i in index:
        if i is None:
            t = t.unsqueeze(out_axis)
            out_axis += 1
        elif isinstance(i, int):
            t = t.select(out_axis, i)
            in_axis += 1
        else:
            pos = torch.as_tensor(np.arange(t.shape[out_axis])[i].copy(), dtype=torch.long)
            t = t.index_select(out_axis, pos)
            out_axis += 1
            in_axis += 1
    return t
