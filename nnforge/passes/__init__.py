"""Optimizing passes: each a named pure function Graph -> Graph, run in the order of ``PIPELINE``."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from ..ir.node import Graph
from ..ir.verify import verify
from ..schedule import Target
from .biases import biases_into_scans
from .cse import cse
from .dce import dce, pure_loops
from .hoist import hoist
from .products import (
    normalized_products,
    products_of_stacked_rows,
    shared_weight_products,
    sums_of_products,
    transposed_products,
)
from .reductions import hoist_reductions
from .reshapes import elementwise_before_views
from .scans import (
    carries_read_from_outputs,
    merge_augmented_scans,
    scans_of_flipped_sequences,
    stacked_parts_read_as_views,
)
from .simplify import sigmoid_forms, simplify
from .sinks import sink_output_products
from .sums import nested_half_sums, split_long_sums
from .views import views_into_scans

log = logging.getLogger("nnforge.passes")

Pass = Callable[[Graph], Graph]

PIPELINE: tuple[tuple[str, Pass], ...] = (
    ("merge_augmented_scans", merge_augmented_scans),
    ("simplify", simplify),
    ("cse", cse),
    ("dce", dce),
)


def pipeline(target: Target) -> tuple[tuple[str, Pass], ...]:
    """The passes that only matter for compiled code (they may reassociate float sums), with ``target``'s
    thresholds: a backend runs these after ``PIPELINE``."""
    return (
        ("pure_loops", pure_loops),  # an nf.loop that calls no Python is compiled, not a side effect
        # before hoist, whose input projections then read the sequence itself, not a reversed copy
        ("scans_of_flipped_sequences", scans_of_flipped_sequences),
        ("sigmoid_forms", sigmoid_forms),
        # first: a scan rid of its weight-gradient sums may split by rows, which decides how much of the carry-free
        # work hoist lifts out
        ("hoist_reductions", functools.partial(hoist_reductions, target=target)),
        # after it, whose stacked d_t the products sunk read; before hoist, which prunes the invariants left unread
        ("sink_output_products", sink_output_products),
        ("hoist", functools.partial(hoist, target=target)),
        ("shared_weight_products", shared_weight_products),  # after hoist, which makes some of them
        ("views_into_scans", views_into_scans),  # after hoist, which would lift the views back out
        ("biases_into_scans", functools.partial(biases_into_scans, target=target)),  # after hoist, likewise
        ("sums_of_products", sums_of_products),  # after hoist, which lifts a step's weight-gradient product out
        ("carries_read_from_outputs", carries_read_from_outputs),  # on the weight-gradient GEMMs folded by now
        # on the stacks of carries that pass and a torch autograd call's backward half (autodiff.partition) read
        # from a scan's stacked outputs
        ("products_of_stacked_rows", products_of_stacked_rows),
        ("stacked_parts_read_as_views", stacked_parts_read_as_views),  # before simplify, which folds the reshapes
        # after the weight-gradient products are formed and split, and on them simplified (an accumulator's zero
        # start gone, a transpose of a transpose folded); before elementwise_before_views, which would move the
        # optimizer's element-wise readers of a transposed product under the transpose
        ("simplify", simplify),
        ("transposed_products", transposed_products),
        ("normalized_products", normalized_products),  # a softmax's division after the product it feeds
        # after biases_into_scans, which reads a sequence's bias add on its [T, N, G] shape
        ("elementwise_before_views", elementwise_before_views),
        ("simplify", simplify),
        # after simplify, which drops the zero a hoisted bias gradient starts from (its two sums then nest)
        ("nested_half_sums", nested_half_sums),
        ("split_long_sums", functools.partial(split_long_sums, target=target)),  # the one sum, split in two
        ("cse", cse),
        ("dce", dce),
    )


def run_pipeline(graph: Graph, passes: Sequence[tuple[str, Pass]] = PIPELINE, check: bool = True) -> Graph:
    """Apply the passes in order; verify after each one so a broken pass is caught where it broke.

    ``NNFORGE_DEBUG=2`` logs which passes changed the graph, ``4`` also the IR after each of them.
    """
    from ..runtime import debug_level, setup_logging

    setup_logging()
    show_ir = debug_level() >= 4
    checked: dict = {}  # nodes verified after an earlier pass (nodes never change)
    for name, p in passes:
        before = graph
        graph = p(graph)
        if graph is not before:
            log.debug("pass %s changed the graph", name)
            if show_ir:
                log.debug("IR after %s:\n%r", name, graph)
        if check:
            verify(graph, checked)
    return graph
