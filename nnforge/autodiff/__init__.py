"""Reverse-mode autodiff over the IR: ``gradients`` of nodes w.r.t. nodes, scans included.

Works on nodes only (vjp rules come from ``nnforge.ir.registry``); the user-facing ``grad``/``vjp`` live in
``nnforge.differentiate``.
"""

from .grad import fresh, gradients, inline, scan_vjp

__all__ = ["fresh", "gradients", "inline", "scan_vjp"]
