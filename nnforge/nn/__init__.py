"""nnforge.nn: PyTorch-style modules, losses and optimizers over lazy nnforge tensors.

State dicts use torch's key names, so ``model.load_state_dict(torch_model.state_dict())`` just works; recurrent
layers are ``nf.scan``s, so a compiled model keeps its time loop as a loop.
"""

from . import functional, init, optim, utils
from .activation import GELU, Dropout, ReLU, Sigmoid, SiLU, Swish, Tanh
from .checkpoint import rename_prefixes, stack_rnn_layers
from .conv import Conv1d
from .linear import Embedding, Identity, Linear
from .loss import CrossEntropyLoss, CTCLoss, MSELoss, NLLLoss
from .module import Module, ModuleList, Parameter, Sequential
from .norm import BatchNorm1d, LayerNorm
from .rnn import GRU, LSTM, GRUCell, LSTMCell
from .transformer import MultiheadAttention, TransformerEncoderLayer

__all__ = [
    "GELU",
    "GRU",
    "LSTM",
    "BatchNorm1d",
    "CTCLoss",
    "Conv1d",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "GRUCell",
    "Identity",
    "LSTMCell",
    "LayerNorm",
    "Linear",
    "MSELoss",
    "Module",
    "ModuleList",
    "MultiheadAttention",
    "NLLLoss",
    "Parameter",
    "ReLU",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Swish",
    "Tanh",
    "TransformerEncoderLayer",
    "functional",
    "init",
    "optim",
    "rename_prefixes",
    "stack_rnn_layers",
    "utils",
]
