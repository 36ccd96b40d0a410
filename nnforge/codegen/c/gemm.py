"""GEMM code, BLIS-style: B packed into NR-wide zero-padded panels, an MR x NR register-blocked micro-kernel,
work split among OpenMP threads in (row block x column group) items, and the fused epilogue applied while the
tile is hot.

Why this shape of code:

* B is packed (``[panel][k][NR]``, 64-byte aligned) so the micro-kernel does aligned vector loads with no edge
  cases: a partial last panel is zero-padded and its extra columns are simply not stored. A B operand that does
  not change inside a loop (a scan's weights) is packed once before the loop (``Lowering.pre``).
* A is read in place through its strides (one broadcast per row and k): for the K <= ~1000 of recurrent cells,
  the six row streams prefetch well, and packing A every step would cost a pass over it plus a barrier.
* The micro-kernel and packing are out-of-line functions: one copy each, not one per call site, which keeps the
  C compiler's time down (it scales with the size of the one outlined OpenMP function).
* One work-sharing loop over (MC-row block, NC-column group) items: a small-M GEMM (a recurrent step, M = batch)
  splits columns among threads, a large-M one (all time steps at once) splits rows; each item keeps its B panels
  in L1 across its row blocks. One barrier per GEMM.
* A large-M GEMM (or one whose A is read down its columns) may pack A too, BLIS-style (``Gemm.pack_a``): per
  (MCA-row block, NC-column group) item and KC slice, A is packed into the thread's buffer and each of the group's
  B panel slices (KC x NR) is applied to all of the block's micro-panels (A is packed once per column group: M * K
  copies against M * K * NC multiply-adds). Partial sums over KC slices go through the result (the epilogue runs
  on the last), so the K split (``Gemm.k_split``) needs the result stored in the GEMM's own dtype.
* The three forms (plain, packed A, sliced) are one loop nest (``Nest``, ``_nest``) with parameters naming how
  they differ.
* ``emit_sliced`` computes a GEMM only on the columns that a group of elementwise kernels reads through column
  slices (an LSTM's four gates), column tile by column tile, each slice into its own register tile, and runs
  those kernels on the tiles right away: a recurrent step becomes one kernel with one barrier, and its gate
  matrix is never stored (see ``passes.fuse.sliced_groups``).
* The elementwise work on a tile (epilogue, fused kernels) runs a vector of float32 columns at a time (8 on AVX2,
  16 with AVX-512: the tiles' own width) in explicit vector code where the schedule says it has a vector form
  (``Gemm.lanes``; ``lower.Scalar`` with lanes, ``prelude.h``'s ``nf_v*``): gcc's own vectorization of the scalar
  transcendentals was measured 25 % slower. A partial tile keeps the scalar loop.

Tile sizes come from ``GemmConfig`` (defaults measured on AVX2; ``nnforge.tune`` searches MC and NC).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...dtypes import DType
from ...errors import NNForgeError
from ...ir.expr import ZERO, Expr, as_expr, row_major, var
from ...ir.node import Node
from .cexpr import Sizes, Unsupported, byte_size, ctype, store
from .emit import Emitter

if TYPE_CHECKING:
    from .lower import Lowering

log = logging.getLogger("nnforge.codegen.c")

# Independent FMA chains a micro-kernel needs to keep both FMA pipes busy: 2 pipes x 4 cycles latency (AVX2 cores).
_CHAINS = 8


@dataclass(frozen=True)
class Tile:
    """The register tile of one GEMM's micro-kernel: ``mr`` x ``nr`` accumulators of ``dtype`` in vectors of
    ``vector_bytes``; ``tag`` tells its C functions (micro-kernels, packing) from those of the other tile shape."""

    dtype: DType
    mr: int
    nr: int
    tag: str = ""
    vector_bytes: int = 32

    def fn(self, name: str) -> str:
        """The C name of this tile's function ``name`` (``ukr``, ``ukr2``, ``pack``...)."""
        return f"nf_{name}{self.tag}_{_sfx(self.dtype)}"


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes: ``mr`` x ``nr`` accumulators (``nr32`` float32 columns, half as many float64 ones); ``mc`` rows
    and ``nc`` columns per thread work item."""

    mr: int = 6
    nr32: int = 16
    # A GEMM whose K is at most ``narrow_k`` and whose columns (per slice) are whole 24-column tiles (a recurrent
    # step's h @ W_hh at H = 96) uses 4 x 24 tiles: as many accumulators (12) with one load fewer per k (3 B
    # vectors + 4 broadcasts against 2 + 6), and the rows a thread has in a step (8 or 32 of a batch of 16 or 64)
    # are whole blocks of 4 where 6-row blocks leave 2 to a slower remainder kernel. Its 24-column B panel slice
    # (K x 96 bytes) fits L1 beside A up to K ~ 256; above, the 6 x 16 tile wins (standalone step products at
    # K = 512: 87 against 91 GFLOP/s). A partial tile would run its epilogue in scalar code (and make gcc compile
    # both forms): H = 64 stays on 6 x 16. 0 turns it off. The schedule chooses (``Target.gemm_tiles``).
    narrow_k: int = 256
    narrow_mr: int = 4
    narrow_nr32: int = 24
    # The micro-kernels' vector width in bytes: 32 (AVX2: 16 registers) or 64 (AVX-512: 32 registers, twice the
    # FMA width); 0 takes the C compiler's widest under -march=native (``CpuBackend``). With 64 the tiles are
    # ``zmm_narrow_*`` (8 x 48) for the narrow-K GEMMs and ``zmm_*`` (12 x 32) for the rest: on a 2-vCPU Intel
    # Xeon (2026-11-26, one thread, K = 96, N = 384) 8 x 48 ran a step product of 8 / 32 rows at 178 / 174
    # GFLOP/s against 107 / 111 for the AVX2 4 x 24 (4 x 48: 152 / 146, 6 x 64: 170); at K = 384, 48 rows,
    # 12 x 32 147 against 92 for 6 x 16.
    vector_bytes: int = 0
    zmm_narrow_mr: int = 8
    zmm_narrow_nr32: int = 48
    zmm_mr: int = 12
    zmm_nr32: int = 32
    nc: int = 64
    mc: int = 96
    # The large-M GEMM (a scan's hoisted input projection, T * N rows) with A packed per thread in MCA x KC
    # blocks (L2) and B panel slices KC x NR reused from L1 across a block's MCA / MR micro-kernel calls. Off by
    # default: on Zen 3 (1 thread, CPU time, 2026-11-22) the unpacked loops already reach 87-89 GFLOP/s per core
    # at K = 384 / 512 (93 % of the core's FMA peak) and packing measured 84-85; ``nnforge.tune`` may turn it on.
    pack_a: bool = False
    # Rows and columns per packed-A work item. Each item packs its rows' A again, so a weight gradient (M = 96
    # features, N = 384, K = T * N) in 64-column items packed all of A six times (8 % of a basecaller training
    # step on the AVX-512 tiles); 192-column items pack it twice, and 96-row blocks give a [4H = 384, 96] one four
    # items for two threads instead of three (144 + 144 + 96). Together: the training step 0.954-0.959 of the time
    # (2026-11-26, 2-vCPU Intel Xeon; either alone 0.985 / 0.993).
    mca: int = 96
    nca: int = 192
    kc: int = 256
    packed_a_min_m: int = 1024  # rows (a run-time size counts as large) from which pack_a applies
    # K from which an A read down its columns (k-stride != 1: the xᵀ of a weight gradient, K = T * N) is packed
    # and K-sliced. An A with unit k-stride never is: its row streams prefetch well at any K, and on Zen 3
    # (2 threads, 2026-11-22) the unpacked loops measured 172-189 GFLOP/s at K = 512-4096 and 136 at K = 16384,
    # the packed ones 123-145 and 106; for xᵀ packing wins from K ~ 1000 (120 against 64-88 GFLOP/s).
    packed_a_min_k: int = 512
    # Row-separable scans run with the batch rows split among threads, no barrier per step, where
    # ``passes.rows.worth_splitting`` says it pays.
    row_split: bool = True
    share_buffers: bool = True  # workspace buffers with disjoint lifetimes share memory (``memplan``)

    @property
    def vector_width(self) -> int:
        """The vector bytes the tiles are written for: ``vector_bytes``, AVX2's 32 where it is not decided (0: a
        configuration no ``CpuBackend`` has resolved, such as ``lower(prepare(graph))``'s default)."""
        return self.vector_bytes or 32

    def tiles(self) -> tuple[tuple[int, int, int], ...]:
        """``Target.gemm_tiles``: (max K, rows, bytes of a tile row) of the narrow-K tile (4 x 24; 8 x 48 on
        AVX-512), then of the general one (6 x 16; 12 x 32)."""
        zmm = self.vector_width == 64
        nm, nn = (self.zmm_narrow_mr, self.zmm_narrow_nr32) if zmm else (self.narrow_mr, self.narrow_nr32)
        m, n = (self.zmm_mr, self.zmm_nr32) if zmm else (self.mr, self.nr32)
        narrow = ((self.narrow_k, nm, 4 * nn),) if self.narrow_k else ()
        return (*narrow, (0, m, 4 * n))


def _sfx(dt: DType) -> str:
    return "f32" if dt == DType.float32 else "f64"


def _ukr_body(ct: str, vt: str, mr: int, nr: int, nv: int, lanes: int, a_elem, ldo: str) -> list[str]:
    """The register-tile loop shared by both micro-kernels: MR x NR accumulators, one packed B row per k, stores.

    ``a_elem(r, k)`` is the C expression of A's element (row r, step k): the kernels differ only in how A is read;
    ``ldo`` is the C expression of the output's row stride.
    A tile with fewer than ``_CHAINS`` accumulators (the 2-row remainder kernel: 4) would wait on its FMAs'
    latency (each accumulator is one dependent chain); it keeps a second set for odd k, added at the end: the
    2-row kernel ran at ~55 % of the FMA peak, and a layer-norm LSTM step (200,64,96,96) took 0.5 % less with it.
    """
    sets = 2 if mr * nv < _CHAINS else 1
    acc = ["c", "d"][:sets]
    L = ["    " + " ".join(f"{vt} {a}{r}_{v} = {{0}};" for a in acc for v in range(nv)) for r in range(mr)]

    def step(k: str, a: str, off: int) -> list[str]:
        return [f"        {{ const {ct} av = {a_elem(r, k)}; "
                + " ".join(f"{a}{r}_{v} += av * b[{off + v}];" for v in range(nv)) + " }" for r in range(mr)]

    L.append("    int64_t k = 0;")
    L.append("    for (; k < K; k++) {" if sets == 1 else f"    for (; k + 1 < K; k += {sets}) {{")
    L.append(f"        const {vt}* b = (const {vt}*)(P + k * {nr});")
    for s, a in enumerate(acc):
        L += step(f"(k + {s})" if s else "k", a, s * nv)
    L.append("    }")
    if sets == 2:
        L.append("    if (k < K) {")
        L.append(f"        const {vt}* b = (const {vt}*)(P + k * {nr});")
        L += step("k", "c", 0)
        L.append("    }")
    # Row r of the tile goes to out + r * ldo: a register tile of NR (ldo = NR), or the GEMM's result in place.
    L += [f"    {{ const {vt} s_ = " + " + ".join(f"{a}{r}_{v}" for a in acc)
          + f"; memcpy(out + {r} * {ldo} + {v * lanes}, &s_, sizeof s_); }}"
          for r in range(mr) for v in range(nv)]
    L.append("}")
    return L


def _row_kernels(mr: int) -> list[int]:
    """Row counts of the strided micro-kernels: the remainder kernels (``nf_ukr2``, ``nf_ukr4``, ``nf_ukr8``) and
    MR; each computes (and stores) exactly that many rows."""
    return [m for m in (2, 4, 8) if m < mr] + [mr]


def _kernel_fns(tile: Tile) -> str:
    """Micro-kernels and packing for one tile, written with GCC vector extensions (AVX2/FMA under -march=native;
    still correct, just slower, elsewhere)."""
    dt, mr, nr = tile.dtype, tile.mr, tile.nr
    ct, sfx = ctype(dt), _sfx(dt)
    lanes = tile.vector_bytes // dt.itemsize
    vt = f"nf_v{lanes}{sfx}"
    nv = nr // lanes
    L: list[str] = []  # the vector type is the prelude's
    # Row-remainder kernels: a row block of the batch split among threads is often short (32 rows per thread
    # = 5 x 6 + 2): computing its 2 rows with the 6-row kernel would cost a third of a block for nothing.
    small = _row_kernels(mr)[:-1]

    def strided(name: str, rows: int, dispatch: list[str]) -> list[str]:
        """A kernel reading ``rows`` rows of A in place (a row past ``mr`` repeats row mr - 1)."""
        head = [f"static __attribute__((noinline)) void {name}(int64_t K, const {ct}* A, int64_t sam, int64_t sak,",
                f"                             int mr, const {ct}* restrict P, {ct}* restrict out, int64_t ldo) {{"]
        ptrs = [f"    const {ct}* a{r} = A + ({r} < mr ? {r} : mr - 1) * sam;" for r in range(rows)]
        return head + dispatch + ptrs + _ukr_body(ct, vt, rows, nr, nv, lanes, lambda r, k: f"a{r}[{k} * sak]",
                                                  "ldo")

    for m in small:
        L += strided(tile.fn(f"ukr{m}"), m, [])
    L.append("/* out[r * ldo + c] = (A[mr rows, K] @ P)[r, c] (P one packed panel [K][NR]), r < the row count of the")
    L.append("   kernel that runs (2, 4, 8 or MR: the rows past mr repeat row mr - 1). */")
    L += strided(tile.fn("ukr"), mr, [f"    if (mr <= {m}) {{ {tile.fn(f'ukr{m}')}(K, A, sam, sak, mr, P, out, ldo); "
                                      "return; }" for m in small])
    L.append(f"/* out[MR][NR] = Ap @ P: Ap one packed A micro-panel [K][{mr}], P one B panel slice [K][NR]. */")
    L.append(f"static __attribute__((noinline)) void {tile.fn('ukrp')}(int64_t K, const {ct}* restrict Ap, "
             f"const {ct}* restrict P, {ct}* restrict out) {{")
    L += _ukr_body(ct, vt, mr, nr, nv, lanes, lambda r, k: f"Ap[{k} * {mr} + {r}]", str(nr))
    L.append(f"/* Ap[p][k][r] = A[p*{mr} + r, k] for the rows < m (0 beyond): {mr}-row micro-panels of an A block. */")
    L.append(f"static __attribute__((noinline)) void {tile.fn('packa')}(int64_t m, int64_t K, const {ct}* A, "
             f"int64_t sam, int64_t sak, {ct}* restrict Ap) {{")
    L.append(f"    for (int64_t p = 0; p * {mr} < m; p++) {{")
    L.append(f"        if (sam == 1 && m - p * {mr} >= {mr}) {{  /* A transposed (x_tᵀ of a weight gradient) */")
    L.append(f"            const {ct}* a = A + p * {mr};")
    L.append(f"            for (int64_t k = 0; k < K; k++) for (int r = 0; r < {mr}; r++) "
             f"Ap[p * K * {mr} + k * {mr} + r] = a[k * sak + r];")
    L.append("            continue;")
    L.append("        }")
    L.append(f"        const int64_t rows = m - p * {mr} < {mr} ? m - p * {mr} : {mr};")
    L.append(f"        {ct}* d = Ap + p * K * {mr};")
    L.append(f"        for (int r = 0; r < {mr}; r++) {{")
    L.append(f"            if (r >= rows) {{ for (int64_t k = 0; k < K; k++) d[k * {mr} + r] = 0; continue; }}")
    L.append(f"            const {ct}* a = A + (p * {mr} + r) * sam;")
    L.append(f"            if (sak == 1) for (int64_t k = 0; k < K; k++) d[k * {mr} + r] = a[k];")
    L.append(f"            else for (int64_t k = 0; k < K; k++) d[k * {mr} + r] = a[k * sak];")
    L.append("        }")
    L.append("    }")
    L.append("}")
    L.append(f"/* P[k][c] = B[k, c] for c < ncols, 0 beyond: one zero-padded panel of {nr} columns. */")
    L.append(f"static __attribute__((noinline)) void {tile.fn('pack')}(int64_t K, const {ct}* B, int64_t sbk, "
             f"int64_t sbn, int64_t ncols, {ct}* restrict P) {{")
    L.append(f"    if (ncols < {nr} || sbn != 1) for (int64_t k = 0; k < K; k++) for (int c = 0; c < {nr}; c++) "
             f"P[k * {nr} + c] = 0;")
    L.append("    if (sbn == 1) {")
    L.append(f"        if (ncols == {nr}) for (int64_t k = 0; k < K; k++) memcpy(P + k * {nr}, B + k * sbk, "
             f"{nr} * sizeof({ct}));")
    L.append(f"        else for (int64_t k = 0; k < K; k++) for (int64_t c = 0; c < ncols; c++) "
             f"P[k * {nr} + c] = B[k * sbk + c];")
    L.append(f"    }} else for (int64_t c = 0; c < ncols; c++) for (int64_t k = 0; k < K; k++) "
             f"P[k * {nr} + c] = B[k * sbk + c * sbn];")
    L.append("}")
    return "\n".join(L)


def gemm_prelude(tiles: Sequence[Tile]) -> str:
    """The micro-kernels and packing of each tile the program's GEMMs use."""
    return "\n".join(_kernel_fns(t) for t in tiles)


Epilogue = Callable[[list[Expr], str, int, str], tuple[list[str], list[str], str]]
"""``epilogue(idx, acc, lanes, lane)``: the fused elementwise root at ``idx`` given the accumulator value ``acc``,
as (statements hoisted out of the lane loop, statements, value); with ``lanes`` > 1, of ``lanes`` consecutive
values of the index variable ``lane``."""
TileBody = Callable[[str, str, list[str], int], tuple[list[str], list[str]]]
"""``body(i, j, values, lanes)``: (statements before the column loop, statements) for tile element (i, j) given
each tile's value there; with ``lanes`` > 1 for ``lanes`` consecutive columns from j (may raise ``Unsupported``)."""


View = tuple[str, Expr, list[Expr]]
"""A GEMM operand as a strided view of a buffer: (pointer, offset, stride per axis), index expressions that the
GEMM code prints where it uses them."""


def check_dtype(p: Node) -> None:
    if p.dtype not in (DType.float32, DType.float64):
        raise Unsupported(f"matmul in {p.dtype} runs on the reference backend")


def pack_panels(low: Lowering, em: Emitter, tile: Tile, K: str, src: View, columns: Sequence[tuple[str, str]],
                dst: str, shared: bool = False) -> None:
    """Loop packing panels of the B view ``src`` ([K, N] in its last two axes): panel q holds ``columns[q % len]``
    shifted by ``(q // len) * NR``; ``columns`` are (first column, width) pairs of C expressions, all of one width.
    Work-shared among the threads unless the code around it runs on one thread's rows (``low.serial``); ``shared``
    forces sharing (packing before a loop)."""
    nr = tile.nr
    sz = low.sizes
    b, off, (sbk, sbn) = src[0], src[1], src[2][-2:]
    q = em.fresh("q")
    per = len(columns)
    nq = em.fresh("nq")
    em(f"const int64_t {nq} = {per} * (({columns[0][1]} + {nr - 1}) / {nr});")
    if shared:
        em("#pragma omp for schedule(static)")
    else:
        low.omp_for(em)
    starts = ", ".join(c for c, _ in columns)
    widths = ", ".join(w for _, w in columns)
    first = off + (var("c0s[g]") + var("blk") * nr) * sbn  # the panel's first column (C temporaries)
    with em.block(f"for (int64_t {q} = 0; {q} < {nq}; {q}++) {{"):
        em(f"const int64_t blk = {q} / {per}, g = {q} % {per};",
           f"const int64_t c0s[{per}] = {{{starts}}}, wid[{per}] = {{{widths}}};",
           f"const int64_t left = wid[g] - blk * {nr};",
           f"{tile.fn('pack')}({K}, {b} + {sz.index(first)}, {sz.index(sbk)}, {sz.index(sbn)}, "
           f"left < {nr} ? left : {nr}, {dst} + {q} * ({K}) * {nr});")


def emit_gemm(low: Lowering, em: Emitter, p: Node, tile: Tile, views: Sequence[View], out: str,
              packed: str | None, scratch: str, epilogue: Epilogue | None,
              pack_a: bool = False, k_split: bool = False, also: Sequence[str] = (),
              lanes: int = 1, m: str | None = None) -> str:
    """C computing ``out = epilogue(A @ B)`` for matmul node ``p`` on register tile ``tile``, also stored to each
    buffer in ``also`` (same layout); returns the store's text (for listings).

    ``packed`` names B already packed (panels of all N columns, before the loop); otherwise B is packed into
    ``scratch`` here (per batch index). ``pack_a`` / ``k_split``: the schedule's choice of the packed-A loops
    (``schedule.Gemm``), the partial sums over K slices then kept in ``out``; ``lanes``: its choice of the
    epilogue's vector form (``Gemm.lanes``); ``m``: the C count of rows to compute instead of all of them (the
    views and ``out`` then start at the first of them)."""
    check_dtype(p)
    sz, cfg = low.sizes, low.gemm
    mr, nr = tile.mr, tile.nr
    batch = p.shape[:-2]
    M, N, K = m or sz(p.shape[-2]), sz(p.shape[-1]), sz(p.srcs[0].shape[-1])
    (pa, oa, sa), (pb, ob, sb) = views
    bidx = [em.fresh("bb") for _ in batch]
    for b, d in zip(bidx, batch):
        em.open(f"for (int64_t {b} = 0; {b} < {sz(d)}; {b}++) {{")
    for b, s, t in zip(bidx, sa[:-2], sb[:-2]):  # this batch index's matrices
        oa, ob = oa + var(b) * s, ob + var(b) * t
    A = em.fresh("A")
    em(f"const {ctype(p.dtype)}* {A} = {pa} + ({sz.index(oa)});")
    npan = em.fresh("np")
    em(f"const int64_t {npan} = ({N} + {nr - 1}) / {nr};")
    if packed is None:
        pack_panels(low, em, tile, K, (pb, ob, sb), [("0", N)], scratch)
        packed = scratch
    pack_a = pack_a and not batch
    rows = max(mr, cfg.mca // mr * mr) if pack_a else cfg.mc
    nest = Nest(tile, M, K, A, sa[-2], sa[-1], packed, N, npan, rows, max(1, (cfg.nca if pack_a else cfg.nc) // nr),
                pack_a=pack_a, k_split=pack_a and k_split, full=_full_tiles(sz.expr(p.shape[-1]), nr))
    dims = [sz.expr(d) for d in p.shape]
    stored: list[str] = []

    def element(i: str, j: str, values: list[str], width: int) -> tuple[list[str], list[str]]:
        pre, stmts, store = _epilogue_store(sz, epilogue, out, [*map(var, bidx), var(i), var(j)], dims, values[0],
                                            width, also)
        stored.append(store)
        return pre, stmts

    def partial_sums(pc: str, nk: str) -> TileBody:
        """Partial sums over K slices ``pc`` of ``nk`` accumulate in ``out``; the epilogue runs on the last."""

        def element(i: str, j: str, values: list[str], _lanes: int) -> tuple[list[str], list[str]]:
            value = values[0]
            idx = [var(i), var(j)]
            store = f"{out}[{sz.index(row_major(idx, dims))}]"
            lines = [f"if ({pc} + 1 < {nk}) {{ {store} = ({pc} ? {store} : 0) + {value}; continue; }}"]
            _, last, assign = _epilogue_store(sz, epilogue, out, idx, dims, f"(({pc} ? {store} : 0) + {value})",
                                              also=also)
            stored.append(assign)
            return [], [*lines, *last]

        return element

    def direct(i0: str, jp: str) -> str:
        return f"&{out}[{sz.index(row_major([*map(var, bidx), var(i0), var(jp) * nr], dims))}]"

    # A plain product (``out`` then holds the sums): a full tile goes straight to ``out``, not through the register
    # tile and a copy loop (12 loads and 12 stores per 6 x 16 tile; a layer-norm LSTM step took 1.1 % less).
    plain = epilogue is None and not also and not pack_a
    _nest(low, em, nest, partial_sums if pack_a else (lambda _pc, _nk: element), lanes, direct if plain else None)
    for _ in batch:
        em.close()
    return stored[0]


@dataclass(frozen=True)
class Nest:
    """The one GEMM loop nest, and what its uses change in it.

    The product on ``tile``: ``M`` rows, ``K``, A read in place at ``A`` (strides ``sam``, ``sak``: index
    expressions), B packed at ``packed`` in ``npan`` panels of NR of its ``width`` columns (a sliced GEMM: per
    slice, the slices' panels interleaved).
    How threads share it: work items of ``rows`` rows by ``group`` panels (``rows`` None: an item is one column
    tile of every slice, over all rows: a sliced GEMM's rows are few); ``slices`` register tiles per item. Whether
    A is packed per work item (``pack_a``: the large-M / xᵀ form), and then in K slices (``k_split``)."""

    tile: Tile
    M: str
    K: str
    A: str
    sam: Expr
    sak: Expr
    packed: str
    width: str
    npan: str
    rows: int | None
    group: int = 1
    slices: int = 1
    pack_a: bool = False
    k_split: bool = False
    full: bool = False  # every column tile is NR wide: ``width`` is a multiple of NR known when printing


def _nest(low: Lowering, em: Emitter, n: Nest, body: Callable[[str, str], TileBody], lanes: int,
          direct: Callable[[str, str], str] | None = None) -> None:
    """The loops of GEMM ``n``: work items shared among the threads; in each, per column panel and MR-row block,
    the micro-kernel into the register tiles (one per slice), then the tile body (``_for_tile``, ``lanes``
    columns at a time on a full tile). ``body(pc, nk)`` gives it, given the C names of the K slice and the slice
    count (packed A only). ``direct(i0, jp)``: where the micro-kernel stores a full tile itself (a plain product)."""
    tile = n.tile
    ct, mr, nr = ctype(tile.dtype), tile.mr, tile.nr
    M, K, A = n.M, n.K, n.A
    sam, sak = low.sizes.index(n.sam), low.sizes.index(n.sak)

    def a_at(*terms: Expr) -> str:
        """A at an index expression (rows and k)."""
        return f"{A} + {low.sizes.index(sum(terms, ZERO))}"

    depth = em.depth
    pc = nk = mine = ""
    if n.pack_a:
        assert n.rows is not None and n.slices == 1
        kc = low.program.target.k_slice
        nk, ap, mine = em.fresh("nk"), em.fresh("ap"), em.fresh("apt")
        low.add_alloc(ap, ct, byte_size(n.rows, kc if n.k_split else K, "nf_nthreads()", tile.dtype.itemsize))
        # K in nk equal slices of at most KC (384 -> 2 x 192, not 256 + 128)
        em(f"const int64_t {nk} = " + (f"(({K}) + {kc - 1}) / {kc};" if n.k_split else "1;"),
           f"{ct}* {mine} = {ap} + (int64_t)nf_thread() * {n.rows} * ((({K}) + {nk} - 1) / {nk});")
        pc = em.fresh("pc")
    if n.rows is None:  # an item: one column tile of every slice, all rows
        jp, i0 = em.fresh("ub"), em.fresh("i0")
        low.omp_for(em)
        em.open(f"for (int64_t {jp} = 0; {jp} < {n.npan}; {jp}++) {{")
        em(f"const int64_t u0_ = {jp} * {nr};",
           f"const int nu_ = {n.width} - u0_ < {nr} ? (int)({n.width} - u0_) : {nr};")
        first, end, cols, col0 = "0", M, "nu_", "u0_"
    else:  # an item: ``rows`` rows by ``group`` panels
        ic, jg, i0, jp = em.fresh("ic"), em.fresh("jg"), em.fresh("i0"), em.fresh("jp")
        low.omp_for(em, collapse=2)
        em(f"for (int64_t {ic} = 0; {ic} < {M}; {ic} += {n.rows})")
        em.open(f"for (int64_t {jg} = 0; {jg} < {n.npan}; {jg} += {n.group}) {{")
        if n.pack_a:  # the item's rows ic .. ic + mb_, numbered from 0 in the packed A
            em(f"const int64_t mb_ = {M} - {ic} < {n.rows} ? {M} - {ic} : {n.rows};")
            first, end = "0", "mb_"
        else:
            em(f"const int64_t ie_ = {ic} + {n.rows} < {M} ? {ic} + {n.rows} : {M};")
            first, end = ic, "ie_"
        em(f"const int64_t je_ = {jg} + {n.group} < {n.npan} ? {jg} + {n.group} : {n.npan};")
        if n.pack_a:
            em.open(f"for (int64_t {pc} = 0; {pc} < {nk}; {pc}++) {{")
            step = f"((({K}) + {nk} - 1) / {nk})"
            em(f"const int64_t k0_ = {pc} * {step};",
               f"const int64_t k1_ = k0_ + {step} < ({K}) ? k0_ + {step} : ({K});",
               f"{tile.fn('packa')}(mb_, k1_ - k0_, {a_at(var(ic) * n.sam, var('k0_') * n.sak)}, {sam}, {sak}, "
               f"{mine});")
        em(f"for (int64_t {jp} = {jg}; {jp} < je_; {jp}++)")
        cols, col0 = "nr_", f"{jp} * {nr}"
    em.open(f"for (int64_t {i0} = {first}; {i0} < {end}; {i0} += {mr}) {{")
    accs = [em.fresh("tile") for _ in range(n.slices)]
    em.each(f"{ct} {acc}[{mr * nr}] __attribute__((aligned(64)));" for acc in accs)
    em(f"const int mr_ = {end} - {i0} < {mr} ? (int)({end} - {i0}) : {mr};")
    if n.rows is not None:
        em(f"const int nr_ = {n.width} - {jp} * {nr} < {nr} ? (int)({n.width} - {jp} * {nr}) : {nr};")
    if n.pack_a:
        em(f"{tile.fn('ukrp')}(k1_ - k0_, {mine} + {i0} * (k1_ - k0_), "
           f"{n.packed} + ({jp}) * ({K}) * {nr} + k0_ * {nr}, {accs[0]});")
    else:
        call = f"{tile.fn('ukr')}({K}, {a_at(var(i0) * n.sam)}, {sam}, {sak}, mr_, "
        panels = [f"({jp})"] if n.rows is not None else [f"({jp} * {n.slices} + {g})" for g in range(n.slices)]
        if direct is not None:
            exact = " || ".join(f"mr_ == {m}" for m in _row_kernels(mr))
            em(f"if (nr_ == {nr} && ({exact})) {{ {call}{n.packed} + {panels[0]} * ({K}) * {nr}, "
               f"{direct(i0, jp)}, {n.width}); continue; }}")
        em.each(f"{call}{n.packed} + {q} * ({K}) * {nr}, {acc}, {nr});" for q, acc in zip(panels, accs))
    row0 = f"{ic} + {i0}" if n.pack_a else i0
    _for_tile(em, nr, accs, "mr_", cols, lambda r: f"{row0} + {r}", lambda c: f"{col0} + {c}", body(pc, nk),
              lanes, n.full)
    while em.depth > depth:
        em.close()


def _epilogue_store(sz: Sizes, epilogue: Epilogue | None, out: str, idx: list[Expr], dims: Sequence[Expr],
                    value: str, lanes: int = 1, also: Sequence[str] = ()) -> tuple[list[str], list[str], str]:
    """(statements before the column loop, statements storing ``epilogue(value)`` at ``out[idx]`` and at the same
    index of each buffer in ``also``, the assignment itself for listings); with ``lanes`` > 1, of that many
    consecutive columns from ``idx[-1]`` (``Unsupported`` unless they are contiguous). ``also`` gets the value's
    temporary, or what ``out`` holds once written when the value is an expression (it may read ``out``)."""
    lane = idx[-1].args[0]
    pre, stmts, value = epilogue(idx, value, lanes, lane) if epilogue is not None else ([], [], value)
    flat = row_major(idx, dims)
    index = sz.index(flat)
    stmts = [*stmts, store(out, flat, value, sz, lanes, lane)]
    stored = value if value.isidentifier() else f"{out}[{index}]" if lanes == 1 else f"nf_vld_f32(&{out}[{index}])"
    stmts += [store(o, flat, stored, sz, lanes, lane) for o in also]
    return pre, stmts, f"{', '.join([out, *also])}[{index}] = {value}"


def _for_tile(em: Emitter, nr: int, accs: Sequence[str], rows: str, cols: str, row_of: Callable[[str], str],
              col_of: Callable[[str], str], body: TileBody, lanes: int = 1, full: bool = False) -> None:
    """Loops over the ``rows`` x ``cols`` elements of micro-kernel tiles ``accs`` (NR wide, one per GEMM column
    slice): ``body(i, j, values, lanes)`` gives the statements for the element at matrix row ``i = row_of(r)``,
    column ``j = col_of(c)``. With ``lanes`` > 1 (the schedule's ``Gemm.lanes``) a full tile (``cols`` == NR)
    runs ``lanes`` columns at a time and the scalar loop is kept for a partial one, unless every tile is full
    (``full``): the scalar form is still made (what listings show) but not printed, which took a fifth off the C
    compiler's time for an LSTM scan. A body that cannot be spelled so is a bug of that choice, raised as such."""

    def loops(out: Emitter, width: int) -> None:
        r, c, i, j = out.fresh("r"), out.fresh("c"), out.fresh("i"), out.fresh("j")
        at = f"{r} * {nr} + {c}"
        values = [f"{a}[{at}]" if width == 1 else f"nf_vld_f32(&{a}[{at}])" for a in accs]
        pre, stmts = body(i, j, values, width)
        with out.block(f"for (int {r} = 0; {r} < {rows}; {r}++) {{"):
            out(f"const int64_t {i} = {row_of(r)};")
            out.each(pre)
            # Both vectors of a tile row in one loop body: their independent chains (exp, division, tanh) then
            # overlap; left rolled, gcc ran a H = 384 LSTM layer 5 % slower (868 vs 824 ms). At most three: the
            # C compiler's time grows with the copies of a cell update.
            if width > 1:
                out(f"#pragma GCC unroll {min(nr // width, 3)}")
            with out.block(f"for (int {c} = 0; {c} < {cols if width == 1 else nr}; {c} += {width}) {{"):
                out(f"const int64_t {j} = {col_of(c)};")
                out.each(stmts)

    if lanes == 1:
        loops(em, 1)
        return
    inner = em.depth + (0 if full else 1)
    scalar = em.sub(inner)
    loops(scalar, 1)
    if nr % lanes:
        raise NNForgeError(f"the schedule chose {lanes}-column GEMM tiles, which do not divide NR = {nr}")
    vector = em.sub(inner)
    try:
        loops(vector, lanes)
    except Unsupported as e:
        raise NNForgeError(f"the schedule chose {lanes} columns at a time for a GEMM tile, which has no vector "
                           f"form: {e}") from e
    if full:
        em.append(vector)
        return
    em(f"if ({cols} == {nr}) {{")
    em.append(vector)
    em("} else {")
    em.append(scalar)
    em("}")


def emit_sliced(low: Lowering, em: Emitter, p: Node, tile: Tile, a_view: View, packed: str, offsets: Sequence[str],
                width: int, body: TileBody, lanes: int = 1) -> None:
    """One work-shared kernel: for each column tile u0..u0+NR of the slices and each MR row block, the GEMM
    columns ``offset + u`` for every offset (B packed slice-major per tile, see ``pack_panels``), each into its
    own register tile, then ``body(i, u, values, lanes)`` (the epilogue and the consumer kernels) on the same rows
    and columns, ``values`` the slices' tile values there, ``lanes`` columns at a time where the schedule says so
    (``SlicedGemm.lanes``). The GEMM result itself is never stored: its tiles are consumed while they are in L1."""
    check_dtype(p)
    sz, nr = low.sizes, tile.nr
    pa, oa, sa = a_view
    A = em.fresh("A")
    nest = Nest(tile, sz(p.shape[-2]), sz(p.srcs[0].shape[-1]), A, sa[-2], sa[-1], packed, str(width),
                f"({width} + {nr - 1}) / {nr}", None, slices=len(offsets), full=_full_tiles(as_expr(width), nr))
    em(f"const {ctype(p.dtype)}* {A} = {pa} + ({sz.index(oa)});")
    _nest(low, em, nest, lambda _pc, _nk: body, lanes)


def _full_tiles(width: Expr, nr: int) -> bool:
    """Whether every NR-column tile of ``width`` columns is full (a static multiple of NR)."""
    w = width.value
    return w is not None and w % nr == 0
