"""Variants: model implementations a sweep can compare. See :mod:`.base` for the interface.

:func:`variant_registry` builds the registry a sweep uses: the built-ins, then entry points of the group
``nnforge.modelview.variants``, then plugins named by the spec, then classes passed in. It is a function, not a module
global, so that two sweeps in one process never see each other's plugins.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..registry import Registry, build_registry
from .base import NnforgeImpl, Param, Request, Variant
from .gru import GRUTorch, MinGRUScan
from .lstm import LSTMCombined, LSTMManual, LSTMPremult, LSTMStacked, LSTMTorch
from .models import Bonito, Transformer

BUILTIN_VARIANTS: tuple[type[Variant], ...] = (
    LSTMManual,
    LSTMCombined,
    LSTMPremult,
    LSTMStacked,
    LSTMTorch,
    GRUTorch,
    MinGRUScan,
    Bonito,
    Transformer,
)


def variant_registry(plugins: Iterable[str] = (), extra: Iterable[type[Variant]] = (), entry_points: bool = True
                     ) -> Registry:
    """Built-ins + entry points + ``plugins`` (modules or .py files with ``@variant`` classes) + ``extra`` classes."""
    return build_registry("variant", BUILTIN_VARIANTS, plugins, extra, entry_points)


__all__ = ["BUILTIN_VARIANTS", "NnforgeImpl", "Param", "Request", "Variant", "variant_registry"]
