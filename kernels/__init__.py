"""Hand-written Triton kernels, with the signatures of their torch.nn.functional twins, and
`enable()`: the same kernels under any nn.Module's own calls (kernels/routing.py)."""

from kernels._common import ACTIVATIONS, SUPPORTED_DTYPES
from kernels.attention import attention, sdpa
from kernels.conv import conv2d
from kernels.linear import linear
from kernels.matmul import matmul
from kernels.routing import disable, enable, enabled
from kernels.softmax import softmax

__all__ = [
    "ACTIVATIONS",
    "SUPPORTED_DTYPES",
    "attention",
    "conv2d",
    "disable",
    "enable",
    "enabled",
    "linear",
    "matmul",
    "sdpa",
    "softmax",
]
