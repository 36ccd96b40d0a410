"""The GPU backend's ``Target`` and the tile sizes its renderer prints.

Every value here is an **untimed placeholder** (the renderer's tests run compiled on an H200; no timing chose
them). Each is chosen from what the hardware offers (an H100-class part: 132 SMs, 256 KB of
registers and up to 228 KB of shared memory per SM, 50 MB of L2) and from the form of the code the renderer prints,
not from a timing. Replace them with measured values, and write the measurements into docs/benchmarks.md, once a
GPU timing exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...passes.fuse import Recompute
from ...schedule import Target

STEP_RECOMPUTE_OPS = 24  # see triton_target: a host loop's elementwise cones recomputed by each reader kernel
STEP_RECOMPUTE_READS = 8
SPLIT_SUM_OUTPUTS = 4096  # see triton_target: a reduction with fewer results runs over its leading axis first
SPLIT_K_OUTPUTS = 1 << 19  # see triton_target: a GEMM with fewer results sums its K in parts side by side
ROW_PROGRAMS = 4096  # see triton_target: the widest row a program takes whole through a layer norm or softmax
GEMM_ROW_PROGRAMS = 512  # see triton_target: the widest product a program computes whole rows of for them
# Multiply-adds contracted to FMA in every kernel, said at each launch: the C backend's compiler contracts them
# too (gnu11), one rounding is as accurate or more, and Triton 3.9 warns that its unset default turns off in 3.10,
# which would change results and speed with a Triton upgrade alone.
FP_FUSION = True

# K elements a half-precision ``tl.dot`` accumulates on the tensor cores before its sum is added into the float32
# accumulator by an ordinary add: the tensor cores' accumulation does not round to nearest, so over a weight
# gradient's K = steps x batch (millions) its error grows with K (H200, 2026-11-27: 2.4e-3 at K = 2,048,000 where
# cuDNN's is 6.4e-4, docs/benchmarks.md); promoted every 4096 it stays near a rounding of the output.
DOT_PROMOTE_K = 4096

# Bytes of weights a resident loop's step GEMM may hold on chip across steps (``Renderer.held_weights``): a
# program's tile of them beside its A tiles and layout conversions in an H100/H200 program's 227 KiB of shared
# memory, as a row-split loop's weights (``max_split_weight_bytes``, 160 KiB); an H = 384 LSTM's tile of 32 units
# a gate in half precision is 4 x 384 x 32 x 2 = 96 KiB.
HELD_BYTES = 128 * 1024


def triton_target() -> Target:
    """The thresholds the shared passes and the scheduler take for Triton kernels (placeholders, see the module).

    * ``min_split_rows`` 1: a row-split loop is one persistent kernel whose programs each own a block of rows for
      all steps; the alternative, a launch (or a grid-wide barrier) per step, costs microseconds per step whatever
      the batch, so even one row is worth a persistent program.
    * ``max_split_weight_bytes`` 160 KiB, counted in power-of-two blocks (``pow2_weights``): each program keeps
      the recurrent weights on chip across steps, and every ``tl.dot`` reads its B operand from shared memory, so
      the padded weights (an LSTM's 96 x 384 as 128 x 512) must fit one program's shared memory (227 KiB on an
      H100/H200) beside the A tiles and layout conversions. Measured on an H200: an H = 96 float16 LSTM whose
      kernel also held its input projection's weights asked for 272 KiB and did not launch. Loops with larger
      weights are not split: they run as a host loop launching one fused GEMM + cell kernel per step
      (``steps.py``).
    * ``reduction_hoist_bytes`` 0: every weight-gradient sum of a scan leaves the loop as one GEMM after it (a
      persistent program cannot sum across programs without atomics, and one large GEMM suits tensor cores).
    * ``chunk_bytes`` 0: the input projection is one GEMM over all steps before the loop (the tensor cores at
      full height, where a program computing its own rows' chunk would run them 16 rows at a time and hold a
      second weight matrix in shared memory); it costs one write and one read of the projection.
    * ``row_block`` 0: the body runs on all of a program's rows at once (they are one register tile).
    * ``pack_a_min_k`` / ``pack_a_min_m`` None, ``k_slice`` 0: no packed A, no K split (CPU forms); a Triton GEMM
      reads its operands through their strides into tiles.
    * ``steps_in_registers``: a persistent program holds a step's values as register tiles; a body that reads one
      at another element (a shifted slice of a carry, as a CTC lattice does) stays a host loop of per-step
      launches (``steps.py``).
    * ``random``: draws are kernels of their own (``tl.rand`` / ``tl.randn``, Philox), keyed on the host.
    * ``split_sum_outputs`` 4096: a reduction program computes 16 results (``Tiles.reduce_rows``), so one with
      fewer than 4096 fills fewer than two programs per SM of an H100 or H200; where its leading axis leaves at
      least that many partial sums it runs over that axis first (a training step's loss over [T, N, H]: one
      program summing T * N * H products became N * H / 16 programs, then one over N * H partial sums).
    * ``split_k_outputs`` 2^19, ``split_k_min`` ``DOT_PROMOTE_K``: a GEMM program computes 64 x 32 results
      (``Tiles.gemm_m`` x ``gemm_n``), so one with fewer than 2^19 results fills fewer than two programs per SM of
      a 132-SM part; it sums its K in parts, each program one tile of one part, into float32 partial sums added
      after in order. A training step's weight gradient ``dgates.T @ h`` (an LSTM's at H = 96: 384 x 96 results,
      K = T x N = 2,048,000 at T = 2000, N = 1024) ran as 18 programs, each looping over all of K; in parts it
      is 270 programs (15 parts). Parts are whole ``DOT_PROMOTE_K`` blocks, so each block of K is summed as
      without parts. Not yet timed on a GPU.
    * ``hoist_step_work`` False (the shared default): a persistent scan keeps the elementwise work on its
      carry-free GEMMs (a layer norm of the input projection) in its step, where it adds to each step's latency;
      hoisted, it costs a write and a read of a [T, N, 4H] array. Built for sm_90 the layer-norm LSTM's step
      shrinks with it (docs/benchmarks.md); which is faster is not yet timed (`bench/lstm_gpu.py --variant
      hoist_step_work=1 --cells ...`).
    * ``row_programs`` 4096: a layer norm or softmax over rows of up to 4096 values (a transformer's features, an
      LSTM's gate row) is one kernel whose programs take whole rows (``Tiles.row_elements`` values a program,
      float32 in registers: 32 per thread of 4 warps at the widest), not two or three reduction kernels and an
      elementwise one, each reading every row again from memory. Not yet timed on a GPU.
    * ``gemm_row_programs`` 512: a matrix product of rows up to 512 values before such a kernel leads it (a
      projection and its layer norm: the layer-norm LSTM's input projection with ``hoist_step_work``, a
      transformer's output projections and their norms): each program computes 16 or more whole rows of the
      product (``tl.dot`` over K into a ``[BR, 512]`` tile at most: built for sm_90, 108 / 156 registers a thread
      at 384 / 512 half-precision columns, no spill) and the row reductions read them there, so the product is
      not written and read back. Not yet timed on a GPU (``bench/rows_gpu.py`` times it against
      ``gemm_row_programs=0``).
    * ``step_recompute``: in a host loop every kernel of the body is a Python launch per step (a host-loop step
      took 19–40 µs on an H200 whatever its work, docs/benchmarks.md) and its stored values make a round trip
      through memory that the next launch reads back; so an elementwise value read by several of the step's
      kernels is recomputed by each of them when its cone is at most ``STEP_RECOMPUTE_OPS`` ops of any kind over
      at most ``STEP_RECOMPUTE_READS`` buffers (an LSTM's backward step at H = 384: ten launches became three;
      the gate derivatives recomputed from the saved gate sums had a kernel each).
    """
    return Target(name="triton", min_split_rows=1, max_split_weight_bytes=160 * 1024, reduction_hoist_bytes=0,
                  chunk_bytes=0, max_chunk_steps=16, row_split=True, row_block=0, pack_a_min_k=None,
                  pack_a_min_m=None, k_slice=0, steps_in_registers=True, pow2_weights=True, random=True,
                  step_recompute=Recompute(ops=STEP_RECOMPUTE_OPS, op_set=None, reads=STEP_RECOMPUTE_READS),
                  split_sum_outputs=SPLIT_SUM_OUTPUTS, split_k_outputs=SPLIT_K_OUTPUTS, split_k_min=DOT_PROMOTE_K,
                  row_programs=ROW_PROGRAMS, gemm_row_programs=GEMM_ROW_PROGRAMS)


@dataclass(frozen=True)
class Tiles:
    """Block sizes the renderer prints: the defaults are what ``nnforge.tune.tune_triton`` chose on an H200
    (2026-11-27, docs/benchmarks.md), a device's own tuned tiles replace them there; no schedule record holds them.

    ``flat``: elements per program of an elementwise, copy or concat kernel. ``gemm_m``, ``gemm_n``, ``gemm_k``:
    a GEMM program's output tile and K step (``tl.dot`` needs 16 at least in each); ``gemm_m_f32``: its rows
    when the product is float32 or float64 (multiply-adds on the CUDA cores, not the tensor cores: at 64 rows and
    4 warps ptxas spills 180 bytes of registers, at 32 none; not tuned — the tuner times float16). ``gemm_group``:
    the order of a GEMM's programs, its row tiles taken that many at a time with all their column tiles
    (``texpr.tile_ids``: a tall product's A is then read from memory once, not once per column tile; 0, the
    former order, row tiles fastest over all rows; 8, as Triton's matmul tutorial groups them: not yet timed
    here). ``reduce_rows`` /
    ``reduce_cols``: a reduction program's outputs and the reduced elements it reads per iteration.
    ``row_elements``: the values of 4 bytes a program of whole rows (``Rows``) takes, its rows padded to a power
    of two (a row of 384 values: 8 rows of 512 a program; one row where a row is wider; float64 values half as
    many), and never more rows than there are (rounded up to a power of two).
    ``scan_rows``: batch rows per program of a persistent scan kernel, the M side of the step's ``tl.dot`` (at
    least 8: Triton pads a narrower M to the tensor cores' 16 rows, so 8 leaves half of each MMA idle but makes
    twice the programs — at batch 1024, 128 of them on a 132-SM part instead of 64: 1.5x faster there than 16 on
    an H200). ``scan_warps``, ``gemm_warps``, ``warps``: warps per program of a persistent scan, of a
    GEMM, of any other kernel. ``scan_stages``: a persistent scan's time loop is ``tl.range(..., num_stages=
    scan_stages)``, so Triton's software pipeliner copies each step's input tiles into shared memory
    asynchronously ``scan_stages - 1`` steps ahead (at 1 a plain ``range``, left to Triton's own default, which
    pipelined an LSTM's backward loads but left its forward's waiting where used; built for sm_90 at 2, an LSTM
    step's four loads are ``cp.async`` copies and its barriers 4 per step rather than 10: docs/benchmarks.md).
    ``scan_pieces``: a persistent scan holds a row whose width is not a power of two as power-of-two tiles
    (``scan.tile_pieces``: H = 96 as 64 + 32), so its step's ``tl.dot`` multiplies 96 x 96 per gate rather than
    the 128 x 128 of one padded tile (72 MMAs a warp rather than 128); off, each such row is one padded tile.
    ``scan_transposed``: a persistent scan holds each step value as a ``[width, ROWS]`` tile, its rows on the inner
    axis, so its step's ``tl.dot`` is ``W [width, K] @ h [K, ROWS]``: the rows are the MMA's N side, where 8 is a
    whole tile (``mma.m16n8k16``) — on the M side Triton fills the other 8 of 16 rows by copying (built for sm_90,
    223 of an H = 96 LSTM step's 723 instructions were such moves) and half of each MMA is wasted. Off by default
    until timed on a GPU (``bench/lstm_gpu.py --tiles scan_transposed=1``).
    ``gemm_big_m``, ``gemm_big_n``, ``gemm_big_k``, ``gemm_big_warps``: the tile of a large half-precision GEMM
    (``gemm_block``: a wide layer's input projection, its step's product at a large batch, its weight gradients),
    where ``gemm_m`` x ``gemm_n`` (chosen at H = 96, where every product is small) would make thousands of
    programs each too small for a warpgroup's MMA; 128 x 128 x 64 on 8 warps is among the tiles Triton's matmul
    tutorial searches for Hopper (built for sm_90: ``wgmma`` 64 x 128 x 16, 94 registers, no spill, 96 KiB of
    shared memory at Triton's 3 stages). ``gemm_big_slice_n``: the width of each accumulator of a sliced GEMM
    (an LSTM step's four gates) at that size, so its accumulators together are ``gemm_big_m`` x 4 x 64.
    ``gemm_big_programs``: the fewest programs a GEMM must still make at the large tile to take it (about one
    per SM of a 132-SM part; 0: never). Not yet timed on a GPU (``bench/lstm_gpu.py --variant
    gemm_big_programs=0`` times the former tiles beside them).
    ``held_k``: the rows of each chunk of weights a resident loop's step GEMM holds across steps (``Target.
    resident_steps``; its K loop unrolled over them, one held tile a chunk and slice).
    ``nnforge.tune.tune_triton`` searches these on a GPU and caches the winner per device; ``TritonBackend``
    then uses it there."""

    flat: int = 1024
    gemm_m: int = 64
    gemm_m_f32: int = 32
    gemm_n: int = 32
    gemm_k: int = 32
    gemm_group: int = 8
    reduce_rows: int = 16
    reduce_cols: int = 128
    row_elements: int = 4096
    scan_rows: int = 8
    warps: int = 4
    gemm_warps: int = 4
    scan_warps: int = 4
    scan_stages: int = 2
    scan_pieces: bool = True
    scan_transposed: bool = False
    gemm_big_m: int = 128
    gemm_big_n: int = 128
    gemm_big_slice_n: int = 64
    gemm_big_k: int = 64
    gemm_big_warps: int = 8
    gemm_big_programs: int = 128
    held_k: int = 128

    def __post_init__(self) -> None:
        for name in ("flat", "gemm_m", "gemm_m_f32", "gemm_n", "gemm_k", "reduce_rows", "reduce_cols", "row_elements",
                     "scan_rows",
                     "warps", "gemm_warps", "scan_warps", "gemm_big_m", "gemm_big_n", "gemm_big_slice_n", "gemm_big_k",
                     "gemm_big_warps", "held_k"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"Tiles.{name} must be a power of two, got {v}")
        if min(self.gemm_m, self.gemm_m_f32, self.gemm_n, self.gemm_k, self.gemm_big_m, self.gemm_big_n,
               self.gemm_big_slice_n, self.gemm_big_k, self.held_k) < 16:
            raise ValueError("tl.dot needs GEMM tiles of 16 at least")
        if self.gemm_big_programs < 0:
            raise ValueError(f"Tiles.gemm_big_programs must be 0 (never) or more, got {self.gemm_big_programs}")
        if self.gemm_group < 0:
            raise ValueError(f"Tiles.gemm_group must be 0 (no groups) or more, got {self.gemm_group}")
        if self.scan_stages < 1:
            raise ValueError(f"Tiles.scan_stages must be 1 at least, got {self.scan_stages}")
        if self.scan_rows < 8:
            raise ValueError("Tiles.scan_rows must be 8 at least (a persistent scan's rows are its tl.dot's M side)")

    def gemm_rows(self, half: bool) -> int:
        """Rows of a GEMM program's tile: ``gemm_m`` for a half-precision product (tensor cores), else
        ``gemm_m_f32``."""
        return self.gemm_m if half else self.gemm_m_f32

    def row_gemm_k(self, depth: int | None, half: bool) -> int:
        """The K step of a GEMM leading a whole-row kernel (``Rows``) over K = ``depth`` (None: known at run
        time): ``gemm_k``, but 16 (the least ``tl.dot`` takes) where a product off the tensor cores (float32,
        float64) would have K in one step. Built for sm_90, that one step of a ``[16, 512]`` float32 tile is
        unrolled straight through and ptxas keeps 32 registers a thread and spills 5 KB; in steps of 16 it
        keeps 96-106 and spills nothing (docs/benchmarks.md)."""
        if half or depth is None or depth > self.gemm_k:
            return self.gemm_k
        return 16

    def gemm_block(self, rows: int | None, cols: int | None, depth: int | None, half: bool, sliced: bool = False,
                   copies: int | None = 1) -> GemmBlock:
        """The block of a GEMM program whose result is ``rows`` x ``cols`` (``cols``: a sliced GEMM's slice width)
        over K = ``depth``, ``copies`` times (a batch of products), each None where known only at run time (a
        sequence's length: taken as long). The large tile (``gemm_big_*``) where the product is in half precision
        (tensor cores), no side of it is smaller than the tile (no padded MMAs), K takes four of its K steps at
        least, and it still makes ``gemm_big_programs`` programs; else ``gemm_m`` x ``gemm_n``."""
        small = GemmBlock(self.gemm_rows(half), self.gemm_n, self.gemm_k, self.gemm_warps)
        big = GemmBlock(self.gemm_big_m, self.gemm_big_slice_n if sliced else self.gemm_big_n, self.gemm_big_k,
                        self.gemm_big_warps)
        if not half or not self.gemm_big_programs:
            return small
        sides = ((rows, big.m), (cols, big.n), (depth, 4 * big.k))
        if any(size is not None and size < least for size, least in sides):
            return small
        if None not in (rows, cols, copies):
            programs = -(-rows // big.m) * -(-cols // big.n) * copies  # type: ignore[operator]
            if programs < self.gemm_big_programs:
                return small
        return big


@dataclass(frozen=True)
class GemmBlock:
    """One GEMM program's block, as ``Tiles.gemm_block`` chose it: ``m`` x ``n`` results (per accumulator), K in
    steps of ``k``, on ``warps`` warps."""

    m: int
    n: int
    k: int
    warps: int

    def consts(self) -> dict[str, int]:
        """The kernel's block-size constants."""
        return {"BM": self.m, "BN": self.n, "BK": self.k}
