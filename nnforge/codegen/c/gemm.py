"""GEMM code: a register-blocked micro-kernel (MR x NR accumulators in vector registers), cache blocking over
columns (NC) and rows, tiles shared among OpenMP threads, and the fused epilogue applied while the tile is hot.

Operands are strided views (see ``views.strided``): transposes and broadcasts cost nothing; a B operand whose
columns are not contiguous is packed once per GEMM into a scratch buffer. Tile sizes come from ``GemmConfig``
(defaults are good for AVX2; ``nnforge.tune`` searches NC).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...dtypes import DType
from ...ir.node import Node
from .cexpr import Unsupported, ctype, flat

if TYPE_CHECKING:
    from .lower import Lowering


@dataclass(frozen=True)
class GemmConfig:
    """Tile sizes. ``mr`` rows x ``nr`` columns of accumulators; ``nc`` columns per cache block."""

    mr: int = 6
    nr32: int = 16
    nr64: int = 8
    nc: int = 256

    def nr(self, dt: DType) -> int:
        return self.nr32 if dt == DType.float32 else self.nr64


def _tile_fn(dt: DType, mr: int, nr: int) -> str:
    ct = ctype(dt)
    sfx = "f32" if dt == DType.float32 else "f64"
    lanes = 8 if dt == DType.float32 else 4
    vt = f"nf_v{lanes}{sfx}"
    nv = nr // lanes
    lines = [f"typedef {ct} {vt} __attribute__((vector_size(32)));",
             f"static inline void nf_tile_{sfx}(int64_t K, const {ct}* A, int64_t sam, int64_t sak, int mr,",
             f"                               const {ct}* B, int64_t sbk, {ct}* restrict out) {{"]
    for r in range(mr):
        lines.append(f"    const {ct}* a{r} = A + ({r} < mr ? {r} : mr - 1) * sam;")
        lines.append("    " + " ".join(f"{vt} c{r}_{v} = {{0}};" for v in range(nv)))
    lines.append("    for (int64_t k = 0; k < K; k++) {")
    lines.append(f"        const {ct}* b = B + k * sbk;")
    for v in range(nv):
        lines.append(f"        {vt} b{v}; memcpy(&b{v}, b + {v * lanes}, sizeof b{v});")
    for r in range(mr):
        lines.append(f"        {{ const {ct} av = a{r}[k * sak]; "
                     + " ".join(f"c{r}_{v} += av * b{v};" for v in range(nv)) + " }")
    lines.append("    }")
    for r in range(mr):
        for v in range(nv):
            lines.append(f"    memcpy(out + {r * nr + v * lanes}, &c{r}_{v}, sizeof c{r}_{v});")
    lines.append("}")
    lines.append(f"static inline void nf_tile_edge_{sfx}(int64_t K, const {ct}* A, int64_t sam, int64_t sak, "
                 f"int mr, const {ct}* B, int64_t sbk, int64_t sbn, int nr, {ct}* restrict out) {{")
    lines.append(f"    for (int r = 0; r < mr; r++) for (int c = 0; c < nr; c++) {{ {ct} s = 0;")
    lines.append("        for (int64_t k = 0; k < K; k++) s += A[r * sam + k * sak] * B[k * sbk + c * sbn];")
    lines.append(f"        out[r * {nr} + c] = s; }}")
    lines.append("}")
    return "\n".join(lines)


def gemm_prelude(cfg: GemmConfig) -> str:
    return "\n".join([f"#define NF_MR {cfg.mr}", _tile_fn(DType.float32, cfg.mr, cfg.nr32),
                      _tile_fn(DType.float64, cfg.mr, cfg.nr64)])


Epilogue = Callable[[list[str], str], tuple[list[str], str]]


def emit_gemm(low: Lowering, p: Node, views: Sequence[tuple[str, str, list[str]]], out: str, scratch: str | None,
              epilogue: Epilogue | None, ind: str) -> tuple[list[str], str]:
    """C lines computing ``out = epilogue(A @ B)`` for matmul node ``p``; returns (lines, store text)."""
    if p.dtype not in (DType.float32, DType.float64):
        raise Unsupported(f"matmul in {p.dtype} runs on the reference backend")
    sz, cfg = low.sizes, low.gemm
    ct = ctype(p.dtype)
    sfx = "f32" if p.dtype == DType.float32 else "f64"
    mr, nr = cfg.mr, cfg.nr(p.dtype)
    batch = p.shape[:-2]
    M, N, K = sz(p.shape[-2]), sz(p.shape[-1]), sz(p.srcs[0].shape[-1])
    (pa, oa, sa), (pb, ob, sb) = views
    lines: list[str] = []
    cur = ind
    bidx = [low.fresh("bb") for _ in batch]
    for b, d in zip(bidx, batch):
        lines.append(f"{cur}for (int64_t {b} = 0; {b} < {sz(d)}; {b}++) {{")
        cur += "    "
    aoff = " + ".join([oa] + [f"{b} * ({s})" for b, s in zip(bidx, sa[:-2])])
    boff = " + ".join([ob] + [f"{b} * ({s})" for b, s in zip(bidx, sb[:-2])])
    A, B = low.fresh("A"), low.fresh("B")
    sam, sak, sbk, sbn = sa[-2], sa[-1], sb[-2], sb[-1]
    lines.append(f"{cur}{ct}* {A} = {pa} + ({aoff});")
    lines.append(f"{cur}{ct}* {B} = {pb} + ({boff});")
    if scratch is not None:
        k, j = low.fresh("k"), low.fresh("j")
        lines.append(f"{cur}#pragma omp for schedule(static)")
        lines.append(f"{cur}for (int64_t {k} = 0; {k} < {K}; {k}++) for (int64_t {j} = 0; {j} < {N}; {j}++) "
                     f"{scratch}[{k} * ({N}) + {j}] = {B}[{k} * ({sbk}) + {j} * ({sbn})];")
        lines.append(f"{cur}{B} = {scratch};")
        sbk, sbn = N, "1"
    jc, i0, j0 = low.fresh("jc"), low.fresh("i0"), low.fresh("j0")
    lines.append(f"{cur}for (int64_t {jc} = 0; {jc} < {N}; {jc} += {cfg.nc}) {{")
    c2 = cur + "    "
    lines.append(f"{c2}const int64_t {jc}_end = {jc} + {cfg.nc} < {N} ? {jc} + {cfg.nc} : {N};")
    lines.append(f"{c2}#pragma omp for collapse(2) schedule(static)")
    lines.append(f"{c2}for (int64_t {i0} = 0; {i0} < {M}; {i0} += {mr})")
    lines.append(f"{c2}for (int64_t {j0} = {jc}; {j0} < {jc}_end; {j0} += {nr}) {{")
    c3 = c2 + "    "
    acc = low.fresh("tile")
    lines.append(f"{c3}{ct} {acc}[{mr * nr}] __attribute__((aligned(64)));")
    lines.append(f"{c3}const int mr_ = {M} - {i0} < {mr} ? (int)({M} - {i0}) : {mr};")
    lines.append(f"{c3}const int nr_ = {jc}_end - {j0} < {nr} ? (int)({jc}_end - {j0}) : {nr};")
    lines.append(f"{c3}if (nr_ == {nr}) nf_tile_{sfx}({K}, {A} + {i0} * ({sam}), {sam}, {sak}, mr_, "
                 f"{B} + {j0}, {sbk}, {acc});")
    lines.append(f"{c3}else nf_tile_edge_{sfx}({K}, {A} + {i0} * ({sam}), {sam}, {sak}, mr_, "
                 f"{B} + {j0}, {sbk}, 1, nr_, {acc});")
    r, c, i, j = low.fresh("r"), low.fresh("c"), low.fresh("i"), low.fresh("j")
    lines.append(f"{c3}for (int {r} = 0; {r} < mr_; {r}++) {{")
    lines.append(f"{c3}    const int64_t {i} = {i0} + {r};")
    lines.append(f"{c3}    for (int {c} = 0; {c} < nr_; {c}++) {{")
    lines.append(f"{c3}        const int64_t {j} = {j0} + {c};")
    idx = [*bidx, i, j]
    value = f"{acc}[{r} * {nr} + {c}]"
    if epilogue is not None:
        stmts, value = epilogue(idx, value)
        lines.extend(f"{c3}        {s}" for s in stmts)
    store = f"{out}[{flat(idx, [sz(d) for d in p.shape])}]"
    lines.append(f"{c3}        {store} = {value};")
    lines.append(f"{c3}    }}")
    lines.append(f"{c3}}}")
    lines.append(f"{c2}}}")
    lines.append(f"{cur}}}")
    for _ in batch:
        cur = cur[:-4]
        lines.append(f"{cur}}}")
    return lines, f"{store} = {value}"
