"""The CPU backend's ``Target``: the values it hands to the shared passes, and the measurements behind them
(Zen 3, 2 cores, 1 MiB L2 per core, 2026-11-22)."""

from __future__ import annotations

from ...schedule import Target
from .cexpr import VECTOR_OPS, vector_lanes
from .gemm import GemmConfig


def cpu_target(gemm: GemmConfig | None = None) -> Target:
    """The thresholds for this machine's C code, given the GEMM tile configuration in use.

    * Rows split among threads from two micro-kernel row blocks (``2 * gemm.mr``: 12 rows with the default tiles):
      fewer leave a thread without a full block.
    * Per-step weights of a row-split loop within 512 KB, half of a 1 MiB L2 (bench/row_split_cpu.py: 8-23 %
      faster at H = 96, 1-5 % slower at H = 384 / 512, where re-reading W_hh from L3 every step costs what the
      saved barriers gave).
    * Weight-gradient sums hoisted from 512 KB (training step, loop work-shared: 4 % slower at H = 96 with dW
      147 KB, break-even at H = 384 and 512 with 2.4 / 4 MB); at any size when that lets the loop split by rows
      (one LSTM layer's training step 1.19x / 1.22x / 1.21x faster at H = 96 / 64 / 32, T = 500, N = 16; 1.04x
      and 1.09x at H = 96 / 64, T = 200, N = 64; 2026-11-26).
    * Input projections chunked by 4 MB, at most 64 steps: a chunk stays in L2/L3 between the GEMM writing it and
      the steps reading it.
    * GEMM register tiles: 4 x 24 for K <= 256 over whole 24-column tiles, else 6 x 16 (``GemmConfig`` holds the
      measurements); a row-split body of several kernels runs whole tiles of its GEMMs per pass (one 6-row block
      where it has none).
    * Packed-A GEMMs and their K slices as ``GemmConfig`` says (its comments hold the measurements).
    * Elementwise vectors as wide as the GEMM tiles' (8 float32 on AVX2, 16 with AVX-512) and the elementwise
      ops ``cexpr`` spells in vector form.
    * Random numbers drawn in the program (``prelude.h``'s counter-based generator).
    """
    gemm = gemm or GemmConfig()
    return Target(name="cpu", min_split_rows=2 * gemm.mr, max_split_weight_bytes=512 * 1024,
                  reduction_hoist_bytes=512 * 1024, chunk_bytes=4 * 1024 * 1024, max_chunk_steps=64,
                  row_split=gemm.row_split, row_block=gemm.mr, gemm_tiles=gemm.tiles(),
                  pack_a_min_k=gemm.packed_a_min_k,
                  pack_a_min_m=gemm.packed_a_min_m if gemm.pack_a else None, k_slice=max(8, gemm.kc),
                  vector_lanes=tuple(vector_lanes(gemm.vector_width).items()), vector_ops=VECTOR_OPS,
                  random=True)
