"""nnforge.nn: PyTorch-style modules, losses and optimizers over lazy nnforge tensors.

State dicts use torch's key names, so ``model.load_state_dict(torch_model.state_dict())`` just works; recurrent
layers are ``nf.scan``s, so a compiled model keeps its time loop as a loop.
"""

from . import functional, init, optim, utils
from .activation import (
    CELU,
    ELU,
    GELU,
    GLU,
    SELU,
    Dropout,
    Hardshrink,
    Hardsigmoid,
    Hardswish,
    Hardtanh,
    LeakyReLU,
    LogSigmoid,
    Mish,
    PReLU,
    ReLU,
    ReLU6,
    Sigmoid,
    SiLU,
    Softmin,
    Softplus,
    Softshrink,
    Softsign,
    Swish,
    Tanh,
    Tanhshrink,
    Threshold,
)
from .checkpoint import rename_prefixes, stack_rnn_layers
from .conv import Conv1d, ConvTranspose1d
from .linear import Embedding, Identity, Linear
from .loss import CrossEntropyLoss, CTCLoss, MSELoss, NLLLoss
from .module import Module, ModuleList, Parameter, Sequential
from .norm import BatchNorm1d, GroupNorm, LayerNorm, RMSNorm
from .pooling import AdaptiveAvgPool1d, AdaptiveMaxPool1d, AvgPool1d, MaxPool1d
from .rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNCell
from .transformer import MultiheadAttention, TransformerEncoder, TransformerEncoderLayer

__all__ = [
    "CELU",
    "ELU",
    "GELU",
    "GLU",
    "GRU",
    "LSTM",
    "RNN",
    "SELU",
    "AdaptiveAvgPool1d",
    "AdaptiveMaxPool1d",
    "AvgPool1d",
    "BatchNorm1d",
    "CTCLoss",
    "Conv1d",
    "ConvTranspose1d",
    "CrossEntropyLoss",
    "Dropout",
    "Embedding",
    "GRUCell",
    "GroupNorm",
    "Hardshrink",
    "Hardsigmoid",
    "Hardswish",
    "Hardtanh",
    "Identity",
    "LSTMCell",
    "LayerNorm",
    "LeakyReLU",
    "Linear",
    "LogSigmoid",
    "MSELoss",
    "MaxPool1d",
    "Mish",
    "Module",
    "ModuleList",
    "MultiheadAttention",
    "NLLLoss",
    "PReLU",
    "Parameter",
    "RMSNorm",
    "RNNCell",
    "ReLU",
    "ReLU6",
    "Sequential",
    "SiLU",
    "Sigmoid",
    "Softmin",
    "Softplus",
    "Softshrink",
    "Softsign",
    "Swish",
    "Tanh",
    "Tanhshrink",
    "Threshold",
    "TransformerEncoder",
    "TransformerEncoderLayer",
    "functional",
    "init",
    "optim",
    "rename_prefixes",
    "stack_rnn_layers",
    "utils",
]
