"""``Target``: what a backend tells the shared passes about the machine it renders for.

The passes that prepare a graph for compiled code (hoisting, weight-gradient sums, the row-split policy) take their
thresholds from this record, never from constants of their own: the same graph scheduled for a CPU and for a GPU
differs only in the record handed over. Each backend defines its own (``codegen.c.target.cpu_target``) with the
measurements behind each value.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..dtypes import DType
from ..errors import NNForgeError
from ..ir.ops import Op
from ..passes.fuse import CHEAP, Recompute


class Unsupported(NNForgeError):
    """A graph a target cannot compile (side effects, an op or dtype without a spelling there):
    the backend then runs it on the reference interpreter and says so."""


@dataclass(frozen=True)
class Target:
    """Thresholds of the shared scheduling decisions, per backend.

    ``min_split_rows``: the smallest batch whose rows are split among workers (threads on a CPU, programs on a
    GPU), each then running the whole time loop on its rows without a barrier per step.
    ``max_split_weight_bytes``: the most per-step weight bytes a row-split loop may read (every worker reads all
    of them every step: they must stay in the worker's cache).
    ``reduction_hoist_bytes``: weight-gradient accumulators of a scan at least this large become one GEMM after
    the loop (smaller ones too when that makes the loop row-separable).
    ``chunk_bytes`` / ``max_chunk_steps``: a row-split loop's hoisted input projection is computed inside the loop,
    a chunk of steps of about this size at a time (at most this many steps); ``chunk_bytes`` 0: never, the
    projection is one GEMM before the loop.
    ``pow2_weights``: a row-split worker holds each weight in a block whose sides are powers of two (Triton's
    tensor shapes), so ``max_split_weight_bytes`` counts the weights padded so.
    ``row_split``: whether loops may be split by rows at all (off: every loop work-shared, for comparisons).
    ``row_block``: rows per pass through a row-split body of several kernels (what one kernel writes, the next
    reads from the nearest cache) where ``gemm_tiles`` does not say (a body without GEMMs); 0 runs a worker's rows
    at once.
    ``pack_a_min_k``: a GEMM outside loops whose A is read down its columns (a weight gradient's xᵀ) is run with
    A packed per worker in K slices from this K (None: never); ``pack_a_min_m``: likewise any GEMM from this many
    rows (None: never); ``k_slice``: K per slice of a packed-A GEMM storing its own sums (0: no K split).
    ``vector_lanes`` / ``vector_ops``: the elements per vector by dtype and the elementwise ops with a vector
    spelling, as (op, result dtype, operand dtypes); an elementwise kernel whose every value has one and whose
    reads are contiguous or constant along its last axis runs that axis a vector at a time (none given: every
    kernel element by element).
    ``steps_in_registers``: a row-split loop keeps each step's values in registers (a GPU's persistent program),
    so only bodies that ``registers.register_body_refusal`` accepts are split.
    ``random``: the backend draws random numbers itself (``Random`` kernels); without it a graph that draws any
    runs on the reference interpreter.
    ``step_recompute``: the fuser's recompute policy (``passes.fuse.Recompute``) for the body of a loop the host
    steps without splitting its rows, where every kernel of the body is a launch per step (a GPU's host loop);
    by default the shared policy, as everywhere else.
    ``split_sum_outputs``: a sum or max over the leading axis and others with fewer results than this runs over
    the leading axis first, in parallel over at least this many partial results, then over the rest
    (``passes.sums``); 0: every reduction runs as written.
    ``split_k_outputs`` / ``split_k_min``: a two-axis GEMM outside loops with fewer results than
    ``split_k_outputs`` sums its K in parallel parts (``Gemm.k_parts``): at most enough parts for that many partial
    results, each at least ``split_k_min`` long (a multiple of it), their sums added in order after. Why: a weight
    gradient's K is steps x batch (millions) over a few tiles of results, which one program per tile runs on a
    few of a GPU's cores one after another. 0: every GEMM sums its K in one program per tile.
    ``hoist_step_work``: a row-split loop's carry-free step values leave it whole — the elementwise work and
    reductions on top of their GEMM (a layer norm of the input projection) computed for all steps at once before
    the loop — as they do from a loop not split by rows, where that is no more data per step than their GEMM
    parts (a backward step's recomputed activations, many arrays, stay). Off, only their GEMM parts leave: in a
    worker that runs its rows through every step the rest fuses into the step's kernels and costs no memory; on,
    a step that waits on its carry (a GPU's persistent program) is spared that work.
    ``resident_steps``: a top-level loop the host would step (not split by rows) runs as one launch of programs
    that stay resident for all its steps and wait for each other (a grid-wide barrier) after each kernel of its
    body, where its body allows it (``resident_body``: no nested loop, no random draws, no GEMM summed in parts);
    off, each kernel of the body is a launch per step. Why: a wide layer's step (H = 384 on a GPU) is one fused
    GEMM + cell kernel whose launch, and whose weights' trip from L2, every step pays.
    ``row_programs``: the widest row (values) a program takes whole: consecutive kernels over the same rows (of
    the program, or of a loop body the host steps) — sums and maxima over the last axis, and elementwise kernels
    of the rows' shape — run as one kernel (``Rows``), each program on whole rows, a later kernel reading an
    earlier one's values where they were computed; 0: each its own kernel. Why: a layer norm or a softmax over
    rows is two reductions and an elementwise kernel, each reading the rows from memory again.
    ``gemm_row_programs``: with ``row_programs``, the widest row (values) of a matrix product (or a batch of them)
    that leads such a kernel, each program computing whole rows of it (all its columns) for the kernels after
    it; 0: none. Why: a projection followed by a layer norm, an attention's scores followed by their softmax,
    wrote the product and read it back.
    ``gemm_tiles``: the register tiles of the backend's GEMM micro-kernels as (max K, rows, bytes of a tile row),
    in order of preference (``gemm_tile``); a row-split body of several kernels then runs whole tiles of its GEMMs
    per pass (``row_block`` for a body without GEMMs). Empty: the backend blocks its GEMMs itself.
    """

    name: str
    min_split_rows: int
    max_split_weight_bytes: int
    reduction_hoist_bytes: int
    chunk_bytes: int
    max_chunk_steps: int
    row_split: bool = True
    row_block: int = 0
    pack_a_min_k: int | None = None
    pack_a_min_m: int | None = None
    k_slice: int = 0
    vector_lanes: tuple[tuple[DType, int], ...] = ()
    vector_ops: frozenset[tuple[Op, DType, tuple[DType, ...]]] = frozenset()
    steps_in_registers: bool = False
    pow2_weights: bool = False
    random: bool = False
    gemm_tiles: tuple[tuple[int, int, int], ...] = ()
    step_recompute: Recompute = CHEAP
    split_sum_outputs: int = 0
    split_k_outputs: int = 0
    split_k_min: int = 1
    hoist_step_work: bool = False
    resident_steps: bool = False
    row_programs: int = 0
    gemm_row_programs: int = 0

    def __post_init__(self) -> None:
        for field in ("min_split_rows", "max_split_weight_bytes", "reduction_hoist_bytes", "chunk_bytes",
                      "max_chunk_steps", "row_block", "k_slice", "split_sum_outputs", "split_k_outputs",
                      "row_programs", "gemm_row_programs"):
            if getattr(self, field) < 0:
                raise ValueError(f"Target {self.name!r}: {field} must be >= 0, got {getattr(self, field)}")
        if self.split_k_min < 1:
            raise ValueError(f"Target {self.name!r}: split_k_min must be >= 1, got {self.split_k_min}")
        if self.gemm_tiles and self.gemm_tiles[-1][0] != 0:
            raise ValueError(f"Target {self.name!r}: the last of gemm_tiles must take any K (max K 0), got "
                             f"{self.gemm_tiles}")


def gemm_tile(target: Target, dtype: DType, k: int | None, width: int | None) -> tuple[int, int]:
    """(rows, columns) of the register tile a GEMM of ``dtype`` runs on, given its K and the columns its tiles cover
    (a sliced GEMM's slice width), None where known only at run time: the first of ``target.gemm_tiles`` whose max
    K is at least K and whose tile rows fit the width whole (a partial tile would run its epilogue element by
    element), else the last."""
    for max_k, rows, row_bytes in target.gemm_tiles:
        cols = row_bytes // dtype.itemsize
        if max_k == 0 or (k is not None and width is not None and k <= max_k and width % cols == 0):
            return rows, cols
    raise ValueError(f"Target {target.name!r} has no GEMM tiles")
