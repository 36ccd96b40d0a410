"""Data types: one small enum shared by the IR, the backends and the interop layer.

numpy has no bfloat16, so its numpy storage comes from ``ml_dtypes`` (the same package JAX uses).
Promotion follows PyTorch: Python scalars are "weak" (they never widen a tensor's dtype), floats win over
integers, integers over bool, and float16 with bfloat16 meet at float32.
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np


class DType(enum.Enum):
    bool = "bool"
    int32 = "int32"
    int64 = "int64"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    float64 = "float64"

    def __repr__(self) -> str:
        return f"nf.{self.value}"

    __str__ = __repr__

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_half(self) -> bool:
        """float16 or bfloat16: stored in half precision, computed on in float32 by the compiled backends."""
        return self in (DType.float16, DType.bfloat16)

    @property
    def accumulator(self) -> DType:
        """The dtype a sum or product in this dtype accumulates in: float32 for half precision (rounded once, at
        the end), else itself."""
        return DType.float32 if self.is_half else self

    @property
    def is_int(self) -> bool:
        return self in (DType.int32, DType.int64)

    @property
    def itemsize(self) -> int:
        return self.np.itemsize

    @property
    def np(self) -> np.dtype:
        return _TO_NP[self]

    @property
    def short(self) -> str:
        return _SHORT[self]


bool_, int32, int64 = DType.bool, DType.int32, DType.int64
float16, bfloat16, float32, float64 = DType.float16, DType.bfloat16, DType.float32, DType.float64

_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)
_TO_NP = {
    DType.bool: np.dtype(np.bool_),
    DType.int32: np.dtype(np.int32),
    DType.int64: np.dtype(np.int64),
    DType.float16: np.dtype(np.float16),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float32: np.dtype(np.float32),
    DType.float64: np.dtype(np.float64),
}
_FROM_NP = {v: k for k, v in _TO_NP.items()}
_SHORT = {DType.bool: "b1", DType.int32: "i32", DType.int64: "i64", DType.float16: "f16",
          DType.bfloat16: "bf16", DType.float32: "f32", DType.float64: "f64"}
_RANK = {DType.bool: 0, DType.int32: 1, DType.int64: 2, DType.float16: 3, DType.bfloat16: 3,
         DType.float32: 4, DType.float64: 5}


def from_numpy(dt: np.dtype) -> DType:
    """The DType of a numpy dtype; unsupported ones raise a clear TypeError."""
    dt = np.dtype(dt)
    if dt in _FROM_NP:
        return _FROM_NP[dt]
    raise TypeError(f"nnforge has no dtype for numpy {dt}; supported: {', '.join(d.value for d in DType)}")


def as_dtype(d: object) -> DType:
    """Accept a DType, its name, a numpy dtype or a torch dtype."""
    if isinstance(d, DType):
        return d
    if isinstance(d, str):
        try:
            return DType(d)
        except ValueError:
            raise TypeError(f"unknown dtype {d!r}; supported: {', '.join(x.value for x in DType)}") from None
    if type(d).__module__ == "torch":
        return DType(str(d).removeprefix("torch."))
    return from_numpy(d)


def promote(a: DType, b: DType) -> DType:
    """Result dtype of a binary op between two tensors."""
    if a == b:
        return a
    if {a, b} == {DType.float16, DType.bfloat16}:
        return DType.float32
    return a if _RANK[a] >= _RANK[b] else b


def scalar_dtype(value: object, other: DType) -> DType:
    """Dtype a Python scalar takes next to a tensor of dtype ``other`` (weak typing, as in PyTorch)."""
    if isinstance(value, bool):
        return other
    if isinstance(value, int):
        return other if other != DType.bool else DType.int64
    if isinstance(value, float):
        return other if other.is_float else DType.float32
    raise TypeError(f"expected a Python scalar, got {type(value).__name__}")
