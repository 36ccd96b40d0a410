"""Batches of sequences of different lengths through LSTM, GRU and RNN layers, with torch.nn.utils.rnn's functions.

torch packs the valid steps of every sequence into one flat tensor so its kernels skip the padding. nnforge's
shapes are fixed when a function compiles and its scans run every step of the batch, so a ``PackedSequence``
here keeps the padded batch and the lengths: each layer's step leaves a sequence's state unchanged past its end
and outputs zeros there. The values are torch's — outputs, the final states at each sequence's own last step
(its first, for a reversed direction), gradients — and the same program serves any lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import dtypes
from ...errors import ShapeError, at
from ...tensor import Tensor, as_tensor, concat, full, ones_like, where

__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence"]


@dataclass(frozen=True)
class PackedSequence:
    """A batch of sequences for a recurrent layer (LSTM, GRU, RNN): ``data`` [T, N, *] time-major, padded past
    each of ``lengths`` [N] (int64). Not torch's packed layout (see the module docstring)."""

    data: Tensor
    lengths: Tensor

    def valid(self) -> Tensor:
        """[T, N, 1] bool: whether step t of sequence n is within its length. The steps are counted by a running
        sum (a scan), not ``arange(T)``, a constant that would fix T when the function compiles."""
        counted = ones_like(self.data[:, :, :1], dtype=dtypes.int64).cumsum(0)  # 1, 2, ..., T down the time axis
        return counted <= self.lengths.reshape(1, -1, 1)


def pack_padded_sequence(input: Any, lengths: Any, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """torch's ``pack_padded_sequence``: ``input`` [T, N, *] ([N, T, *] with ``batch_first``) whose sequence
    n has ``lengths[n]`` valid steps. Lengths known when called (a list, an array) are checked as torch does:
    each in 1..T, and decreasing unless ``enforce_sorted=False``; lengths in a tensor are read as they are."""
    x = as_tensor(input)
    if x.ndim < 2:
        raise ShapeError(at(f"pack_padded_sequence: input needs a time and a batch axis, got shape "
                            f"{list(map(int, x.shape))}"))
    if batch_first:
        x = x.transpose(0, 1)
    batch = int(x.shape[1])
    if not isinstance(lengths, Tensor):  # known now: checked (the time axis read as a number only here)
        steps = int(x.shape[0])
        known = np.asarray(lengths, dtype=np.int64)
        if known.shape != (batch,):
            raise ShapeError(at(f"pack_padded_sequence: {known.size} lengths for a batch of {batch} sequences "
                                f"(input {list(map(int, as_tensor(input).shape))}, batch_first={batch_first})"))
        if known.size and (known.min() < 1 or known.max() > steps):
            raise ValueError(f"pack_padded_sequence: lengths must be in 1..{steps} (the input's time axis), got "
                             f"{known.tolist()}")
        if enforce_sorted and (np.diff(known) > 0).any():
            raise ValueError(f"pack_padded_sequence: lengths {known.tolist()} are not in decreasing order; sort "
                             "the batch or pass enforce_sorted=False")
        lengths = known
    lengths = as_tensor(lengths)
    if tuple(map(int, lengths.shape)) != (batch,):
        raise ShapeError(at(f"pack_padded_sequence: lengths of shape {list(map(int, lengths.shape))} for a batch "
                            f"of {batch} sequences"))
    return PackedSequence(x, lengths.cast(dtypes.int64))


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, Tensor]:
    """torch's ``pad_packed_sequence``: (the padded batch, the lengths). The time axis keeps the input's length
    T, or ``total_length``; torch's default shortens it to the longest sequence, the same length wherever a
    batch is padded to its longest sequence (as collating a batch does)."""
    if not isinstance(sequence, PackedSequence):
        raise TypeError(f"pad_packed_sequence: needs a PackedSequence, got {type(sequence).__name__}")
    data = sequence.data
    if padding_value != 0.0:
        data = where(sequence.valid(), data, full((), padding_value, data.dtype))
    if total_length is not None and total_length != int(data.shape[0]):  # the output's length fixed
        steps = int(data.shape[0])
        if total_length < steps:
            data = data[:total_length]
        else:
            pad = full((total_length - steps, *map(int, data.shape[1:])), padding_value, data.dtype)
            data = concat([data, pad], axis=0)
    return (data.transpose(0, 1) if batch_first else data), sequence.lengths

