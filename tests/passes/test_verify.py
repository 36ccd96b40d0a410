"""The verifier runs after every pass: a pass that records a wrong type is caught at that pass, inside scan bodies
too, including after earlier passes whose nodes it skips as already checked."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf
from nnforge import dtypes
from nnforge.ir.node import Graph, Node
from nnforge.ir.ops import Op
from nnforge.ir.verify import VerifyError, verify
from nnforge.passes import PIPELINE, run_pipeline
from nnforge.passes.rewrite import map_nodes


def _graph(rng: np.random.Generator) -> Graph:
    def f(x, w):
        return nf.scan(lambda h, x_t: (nf.tanh(x_t @ w + h), h), x[0] * 0, x)[1].exp().sum()

    x, w = rng.standard_normal((4, 2, 3)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
    return nf.compile(f).trace(x, w)


def _mistyped(op: Op):
    """A pass that re-creates each ``op`` node recording float64 where its rule gives float32: a broken pass."""
    def rule(n: Node) -> Node | None:
        if n.op == op and n.dtype == dtypes.float32:
            return Node(n.op, n.srcs, n.attrs, n.shape, dtypes.float64, n.loc)
        return None

    return lambda g: map_nodes(g, rule, max_rounds=1)


@pytest.mark.parametrize("op", [Op.EXP, Op.TANH], ids=["top level", "in a scan body"])
def test_a_pass_that_records_a_wrong_type_is_caught_after_earlier_passes(op: Op, rng: np.random.Generator) -> None:
    graph = _graph(rng)
    verify(graph)
    assert run_pipeline(graph, PIPELINE) is not None  # the passes themselves verify clean
    wrong = rf"{op.name.lower()} records .* nf\.float64 but its rule gives .* nf\.float32"
    with pytest.raises(VerifyError, match=wrong):
        run_pipeline(graph, [*PIPELINE, ("broken", _mistyped(op))])


def test_a_placeholder_outside_its_graph_is_caught(rng: np.random.Generator) -> None:
    graph = _graph(rng)
    with pytest.raises(VerifyError, match="is not an input of its graph"):
        verify(Graph((), graph.outputs, graph.effects))
