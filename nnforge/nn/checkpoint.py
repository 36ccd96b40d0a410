"""Renaming checkpoint keys between module layouts, so a checkpoint from another code base loads in one call.

Bonito, for one, builds its LSTM stack from single-layer ``torch.nn.LSTM``s (``encoder.4.rnn.weight_ih_l0``,
``encoder.5.rnn.weight_ih_l0``, ...) where an nnforge model has one stacked ``nn.LSTM(num_layers=5,
reverse=[...])`` (``rnn.weight_ih_l0``, ``rnn.weight_ih_l1``, ...). The values are the same tensors; only the
keys differ, so these are pure functions on dicts, applied before ``load_state_dict``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["rename_prefixes", "stack_rnn_layers"]

_LAYER0 = re.compile(r"^(weight_ih|weight_hh|bias_ih|bias_hh)_l0(_reverse)?$")


def stack_rnn_layers(state_dict: Mapping[str, Any], layers: Sequence[str], into: str) -> dict[str, Any]:
    """``state_dict`` with the single-layer RNNs under the key prefixes ``layers`` (in stack order) renamed to the
    layers of one stacked RNN under ``into``: ``layers[k] + "weight_ih_l0"`` becomes ``into + "weight_ih_l{k}"``
    (``_reverse`` keys too). Other keys pass unchanged. A prefix with no ``*_l0`` keys, or with a key that is not
    one, is an error naming it."""
    out: dict[str, Any] = {}
    found = [0] * len(layers)
    for key, value in state_dict.items():
        k = next((i for i, p in enumerate(layers) if key.startswith(p)), None)
        if k is None:
            out[key] = value
            continue
        m = _LAYER0.match(key[len(layers[k]):])
        if m is None:
            raise KeyError(f"stack_rnn_layers: {key!r} under {layers[k]!r} is not a single-layer RNN key "
                           "(weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0)")
        out[f"{into}{m.group(1)}_l{k}{m.group(2) or ''}"] = value
        found[k] += 1
    empty = [p for p, n in zip(layers, found) if not n]
    if empty:
        raise KeyError(f"stack_rnn_layers: no RNN keys under {', '.join(map(repr, empty))}")
    return out


def rename_prefixes(state_dict: Mapping[str, Any], prefixes: Mapping[str, str]) -> dict[str, Any]:
    """``state_dict`` with each key that starts with a prefix in ``prefixes`` starting with its replacement
    instead (the longest matching prefix wins); other keys pass unchanged."""
    order = sorted(prefixes, key=len, reverse=True)
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        p = next((p for p in order if key.startswith(p)), None)
        out[key if p is None else prefixes[p] + key[len(p):]] = value
    return out
