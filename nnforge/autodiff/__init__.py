"""Reverse-mode autodiff over the IR."""

from .api import backward, grad, value_and_grad, vjp
from .grad import gradients

__all__ = ["backward", "grad", "gradients", "value_and_grad", "vjp"]
