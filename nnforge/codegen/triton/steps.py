"""A loop the schedule does not split by rows, as a host loop that launches its body's kernels once per step.

The general form: any body the renderer can spell runs this way (several kernels, reductions over the batch,
nested loops, column-sliced GEMMs as one fused GEMM + cell kernel per step). Per step the launcher runs the
body's kernels in order; each takes the step index ``tt`` as a run-time argument (never specialized on: one
compiled kernel serves every step and every sequence length). The carries live in two buffers, ping-ponged by
swapping their names after each step; a scanned input is read at row ``tt`` of its source, a stacked output is
written at row ``tt`` of its result, a loop invariant is read from the enclosing graph where it lives.

The per-step launches cost microseconds each on a GPU: a loop that fits one program per row block is a
persistent kernel (``scan.py``) instead; capturing this host loop in a CUDA graph is the next step for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...ir.node import Node
from ...ir.ops import Op
from ...schedule import Buf, Loop, SlicedGemm, Unsupported, stored_node
from .evaluate import Ctx, Eval
from .scan import render_loop

if TYPE_CHECKING:
    from .render import Renderer


def render_steps(r: Renderer, loop: Loop, ctx: Ctx, results: list[str]) -> None:
    """Append ``loop`` to the launcher as a host loop over its steps (see the module docstring); ``results``:
    the buffers of the loop's results (final carries, then stacked outputs)."""
    n = loop.node
    if n.op != Op.SCAN:
        raise Unsupported(f"nf.loop at {n.loc} is not rendered by the Triton backend")
    if loop.chunked:
        raise Unsupported(f"scan at {n.loc}: a chunked input projection outside a row-split loop")
    nc, nx = n.attrs["n_carry"], n.attrs["n_xs"]
    block = loop.body
    inputs = block.graph.inputs
    r.tags += 1
    tag, tt = f"L{r.tags}", f"t{r.tags}"
    cur = [f"{tag}c{k}" for k in range(nc)]
    nxt = [f"{tag}n{k}" for k in range(nc)]
    for k in range(nc):
        shape, dt = n.types[k]
        r.alloc(Buf(cur[k], dt, shape))
        r.alloc(Buf(nxt[k], dt, shape))
    r.copies([(n.srcs[k], [cur[k]]) for k in range(nc)], ctx)  # the initial carries
    body = Ctx(block.graph, block.grouping)
    for k in range(nc):
        body.buffers[id(inputs[k])] = cur[k]
    for k in range(nx):
        body.leaf[id(inputs[nc + k])] = _reader(r, ctx, n.srcs[nc + k], tt)
    for j in range(nc + nx, len(n.srcs)):
        body.leaf[id(inputs[j])] = _reader(r, ctx, n.srcs[j], None)
    for k in block.kernels:  # scratch of the body: allocated once, before the loop
        if isinstance(k, Loop):
            for b in k.results:
                r.alloc(Buf(f"{tag}_{b.name}", b.dtype, b.shape))
        else:
            for b in (k.outs if isinstance(k, SlicedGemm) else (k.out,)):  # a returned product is an output
                if b.output is None:
                    r.alloc(b)

    def dests(buf: Buf, also: tuple[int, ...]) -> list[str]:
        """Where a body kernel stores: its scratch, the next carry, this step's row of a stacked output."""
        out = [buf.name] if buf.output is None else []
        for pos in ([buf.output] if buf.output is not None else []) + list(also):
            if pos < nc:
                out.append(nxt[pos])
            else:
                out.append(f"{results[pos]} + {tt} * ({r.sz.prod(n.types[pos][0][1:])})")
        return out

    length = r.sz(loop.length)
    steps = f"range({length} - 1, -1, -1)" if loop.reverse else f"range({length})"
    r.run.append(f"{r.ind}for {tt} in {steps}:")
    outer_ind = r.ind
    r.ind += "    "
    r.scalars.append(tt)
    try:
        for k in block.kernels:
            if isinstance(k, Loop):
                inner = [f"{tag}_{b.name}" for b in k.results]
                if k.parallel is not None:
                    render_loop(r, k, body, inner)
                else:
                    render_steps(r, k, body, inner)
                body.bind_results(k.node, inner)
                for m in block.graph.order:  # results that are also the body's outputs
                    if m.op == Op.PROJ and m.srcs[0] is k.node and k.results[m.attrs["index"]].output is not None:
                        r.fill([(m, dests(k.results[m.attrs["index"]], ()))], body)
                continue
            if isinstance(k, SlicedGemm):
                outs = [dests(o, more) for o, more in zip(k.outs, k.also_of)]
                product = dests(k.product, ()) if k.product is not None else []
                r.sliced(k, body, outs, product)
                for m, o in zip(k.group.members, outs):
                    body.buffers[id(m)] = o[0]
                if product:
                    body.buffers[id(k.returned)] = product[0]
                continue
            outs = dests(k.out, k.also)
            r.kernel(k, body, outs)
            body.buffers[id(stored_node(k))] = outs[0]
        r.copies([(c.node, dests(c.out, c.also)) for c in block.copies], body)
        if nc:
            r.run.append(f"{r.ind}{', '.join(cur)}, {', '.join(nxt)} = {', '.join(nxt)}, {', '.join(cur)}")
    finally:
        r.scalars.pop()
        r.ind = outer_ind
    for k in range(nc):
        r.run.append(f"{r.ind}{results[k]}.copy_({cur[k]})")


def _reader(r: Renderer, outer: Ctx, src: Node, tt: str | None) -> Callable[[Eval, tuple[str, ...]], str]:
    """A body input read from the enclosing graph: ``src`` at row ``tt`` (a scanned input) or as it is (a loop
    invariant), evaluated in the body kernel's code under its mask."""
    def read(ev: Eval, idx: tuple[str, ...]) -> str:
        at = (tt, *idx) if tt is not None else idx
        return Eval(ev.em, outer, r.sz, ev.mask, ev.rank, hoist=False).val(src, at)
    return read
