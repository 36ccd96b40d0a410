"""Every op's rules, one module per op family; importing this package registers them in ``..registry``."""

from . import elementwise, indexing, movement, reduce, structure

__all__ = ["elementwise", "indexing", "movement", "reduce", "structure"]
