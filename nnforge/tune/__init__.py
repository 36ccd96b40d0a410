"""Opt-in schedule search: GEMM tile sizes timed on this machine, results cached on disk.

``nnforge.tune.tune_gemm()`` searches the GEMM blocking (NC columns and MC rows per work item, whether the
large-M GEMM packs A and its MCA x KC block) one axis at a time on representative shapes and writes
the winner to ``<cache>/tune/gemm.json``; the CPU backend reads it when present (``load_gemm_config``) and uses
the defaults in ``GemmConfig`` otherwise. ``nnforge.tune.tune_triton()`` does the same for the Triton backend's
block sizes and warps on a GPU, cached per device name (``load_triton_tiles``). Tuning never runs implicitly.
"""

from __future__ import annotations

from .search import load_gemm_config, tune_gemm
from .triton import load_triton_tiles, tune_triton

__all__ = ["load_gemm_config", "load_triton_tiles", "tune_gemm", "tune_triton"]
