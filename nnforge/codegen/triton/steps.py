"""A loop the schedule does not split by rows, as a host loop that launches its body's kernels once per step.

The general form: any body the renderer can spell runs this way (several kernels, reductions over the batch,
nested loops, column-sliced GEMMs as one fused GEMM + cell kernel per step). Per step the launcher runs the
body's kernels in order; each takes the step index ``tt`` as a run-time argument (never specialized on: one
compiled kernel serves every step and every sequence length). The carries live in two buffers, ping-ponged by
swapping their names after each step; a scanned input is read at row ``tt`` of its source, a stacked output is
written at row ``tt`` of its result, a loop invariant is read from the enclosing graph where it lives.

The per-step launches cost microseconds each on a GPU: a loop that fits one program per row block is a
persistent kernel (``scan.py``) instead, and a program with a host loop is replayed as a CUDA graph (``graphs.py``).
A loop the schedule marks ``resident`` (``Target.resident_steps``) is one launch instead (``resident_kernel``): its
programs, as many as the GPU has SMs (fewer where no kernel of a step has that many tiles: each program arrives at
every barrier) and all resident at once (a cooperative launch, which the driver refuses rather than run a grid that
does not fit), step through the loop together, each running its share of the programs of each body kernel in turn
and waiting for the others (``nf_grid_sync``, a counter in device memory) before the next kernel or step reads what
they stored; a step whose weights fit holds them from the first step on (``Renderer.sliced``). Under Triton's
interpreter, which runs programs one after another, one program runs them all: the same kernel, its barriers passed
at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ...ir.node import Node
from ...ir.ops import Op
from ...schedule import Buf, Kernel, Loop, Rows, SlicedGemm, Unsupported, stored_node
from .evaluate import Ctx, Eval
from .rows import render_rows
from .scan import render_loop
from .target import FP_FUSION

if TYPE_CHECKING:
    from .render import Renderer, Stage


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
            for b in _stored(k):
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
    if loop.resident:
        r.stages = []
    else:
        r.host_loops += 1
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
            if isinstance(k, Rows):
                render_rows(r, k, body, dests)
                continue
            outs = dests(k.out, k.also)
            r.kernel(k, body, outs)
            body.buffers[id(stored_node(k))] = outs[0]
        r.copies([(c.node, dests(c.out, c.also)) for c in block.copies], body)
        if nc and not loop.resident:
            r.run.append(f"{r.ind}{', '.join(cur)}, {', '.join(nxt)} = {', '.join(nxt)}, {', '.join(cur)}")
    finally:
        r.scalars.pop()
        r.ind = outer_ind
        stages, r.stages = r.stages, None
    if stages is not None:
        resident_kernel(r, loop, tag, stages, list(zip(cur, nxt)))
        for k in range(nc):  # the last step stored its carries into the first buffers where the steps were odd
            r.run.append(f"{r.ind}{results[k]}.copy_({cur[k]} if {length} % 2 == 0 else {nxt[k]})")
        return
    for k in range(nc):
        r.run.append(f"{r.ind}{results[k]}.copy_({cur[k]})")


def _stored(k: Kernel) -> tuple[Buf, ...]:
    """The buffers a body kernel stores into (a returned product's is an output)."""
    if isinstance(k, SlicedGemm):
        return k.outs
    if isinstance(k, Rows):
        return tuple(m.out for m, kept in zip(k.members, k.stores) if kept)
    return (k.out,)


def resident_kernel(r: Renderer, loop: Loop, tag: str, stages: list[Stage], carries: list[tuple[str, str]]) -> None:
    """Add the kernel and the launch of resident loop ``loop`` (see the module docstring; ``tag`` names its host
    variables): each of its steps runs each of ``stages`` (its body's kernels, in order) over the programs of its
    grid, a program taking every ``nprog``-th, then waits for all programs; each step reads the carries from the
    first of each pair in ``carries`` and stores them into the second, the pairs swapped at odd steps (as the host
    loop swaps its names). A stage whose weights can be held (``Stage.held``) holds them where its grid has no more
    programs than the launch (decided at launch, ``H<j>``): program ``pid`` loads its tile of them before the first
    step and runs tile ``pid`` every step; else it reads them every step like the others. Loops alike but for their
    buffers (the layers of a stack) share one kernel."""
    length = r.sz(loop.length)
    every = [x for s in stages for x in (s, *(s.held or ()))]
    buffers = list(dict.fromkeys(b for s in every for b in s.buffers))
    sizes = sorted({z for s in every for z in s.sizes}, key=lambda z: int(z[1:]))
    formal = {b: f"ptr{i}" for i, b in enumerate(buffers)}
    local = {a: f"cur{i}" for i, (a, _) in enumerate(carries)} | {b: f"nxt{i}" for i, (_, b) in enumerate(carries)}
    grids = [f"g{j}" for j in range(len(stages))]
    extents = [[f"e{j}_{i}" for i in range(len(s.extents))] for j, s in enumerate(stages)]
    held = [j for j, s in enumerate(stages) if s.held]
    syms = [*sizes, "n_steps", *grids, *(e for es in extents for e in es)]

    def call(s: Stage, pid: str, es: list[str], takes: str = "") -> str:
        args = [local.get(b) or formal[b] for b in s.buffers] + ["t" for _ in s.counters] + s.sizes + es
        return f"{s.name}({pid}, {takes}{', '.join(args)}{''.join(f', {c}={v}' for c, v in s.consts.items())})"

    code = ["pid = tl.program_id(0)", "nprog = tl.num_programs(0)"]
    for j in held:
        loader = stages[j].held[0]  # type: ignore[index]
        code += [f"if H{j}:", f"    wts{j} = {call(loader, 'pid', [])}"]
    code.append("for i in range(0, n_steps):")
    step = ["t = n_steps - 1 - i" if loop.reverse else "t = i"]
    if carries:
        step += ["if i % 2 == 0:",
                 *(f"    {local[a]}, {local[b]} = {formal[a]}, {formal[b]}" for a, b in carries),
                 "else:",
                 *(f"    {local[a]}, {local[b]} = {formal[b]}, {formal[a]}" for a, b in carries)]
    # the arrivals every program has counted after stage j of step i, in int64: steps x stages x programs passes
    # 2^31 within a few million steps
    step.append(f"passed = tl.cast(i, tl.int64) * {len(stages)} * nprog")
    for j, (s, g, es) in enumerate(zip(stages, grids, extents)):
        every_program = [f"for v in range(pid, {g}, nprog):", f"    {call(s, 'v', es)}"]
        if s.held:
            step += [f"if H{j}:", f"    if pid < {g}:", f"        {call(s.held[1], 'pid', es, f'wts{j}, ')}",
                     "else:", *("    " + line for line in every_program)]
        else:
            step += every_program
        step.append(f"nf_grid_sync(sync, passed + {j + 1} * nprog)")
    code += ["    " + line for line in step]
    params = [*(formal[b] for b in buffers), "sync", *syms, *(f"H{j}: tl.constexpr" for j in held)]
    text = "\n".join([f"@triton.jit(do_not_specialize={syms!r})", f"def {{name}}({', '.join(params)}):",
                      *("    " + line for line in code)])
    name = r.alike.get(text) or f"k{len(r.kernels)}_resident_{loop.kind}"
    if text not in r.alike:
        r.alike[text] = name
        r.kernels.append(text.replace("{name}", name, 1))
    r.names.append(name)
    warps = max(s.warps for s in every) if stages else r.tiles.warps
    programs = f"np{tag}"
    r.run.append(f"{r.ind}sync{tag} = torch.zeros((1,), dtype=torch.int64, device=dev)")
    # no more programs than the widest kernel of a step has tiles: every program arrives at every barrier
    widest = f"max({', '.join(s.grid for s in stages)}, 1)" if stages else "1"
    r.run.append(f"{r.ind}{programs} = min(nf_resident_programs(dev), {widest})")
    args = [*buffers, f"sync{tag}", *sizes, length, *(s.grid for s in stages), *(e for s in stages for e in s.extents)]
    holds = "".join(f", H{j}=({stages[j].grid}) <= {programs}" for j in held)
    r.run.append(f"{r.ind}launch({name}, ({programs},), {', '.join(args)}{holds}, num_warps={warps}, "
                 f"enable_fp_fusion={FP_FUSION}, launch_cooperative_grid=nf_cooperative())")


def _reader(r: Renderer, outer: Ctx, src: Node, tt: str | None) -> Callable[[Eval, tuple[str, ...]], str]:
    """A body input read from the enclosing graph: ``src`` at row ``tt`` (a scanned input) or as it is (a loop
    invariant), evaluated in the body kernel's code under its mask."""
    def read(ev: Eval, idx: tuple[str, ...]) -> str:
        at = (tt, *idx) if tt is not None else idx
        return Eval(ev.em, outer, r.sz, ev.mask, ev.rank, hoist=False).val(src, at)
    return read
