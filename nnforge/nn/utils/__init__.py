"""torch.nn.utils' helpers nnforge has: gradient clipping (``clip_grad``) and batches of sequences of different
lengths for recurrent layers (``rnn``)."""

from . import rnn
from .clip_grad import clip_grad_norm_, clip_grad_value_

__all__ = ["clip_grad_norm_", "clip_grad_value_", "rnn"]
