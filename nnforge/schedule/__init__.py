"""The schedule: decisions shared by every backend, taken once, from what a backend says of its machine (``Target``),
and recorded in a ``Program`` that renderers walk."""

# ``Target`` first: the passes the scheduler builds on import it from here.
from .target import Target, Unsupported, gemm_tile

# isort: split
from .program import (
    Block,
    Buf,
    ChunkedInput,
    Concat,
    Copy,
    Elementwise,
    Gemm,
    Kernel,
    Loop,
    Program,
    Random,
    Reduce,
    Rows,
    ScatterAdd,
    SlicedGemm,
    format_program,
    stored_node,
)
from .scheduler import schedule

__all__ = ["Block", "Buf", "ChunkedInput", "Concat", "Copy", "Elementwise", "Gemm", "Kernel", "Loop", "Program",
           "Random", "Reduce", "Rows", "ScatterAdd", "SlicedGemm", "Target", "Unsupported", "format_program",
           "gemm_tile", "schedule", "stored_node"]
