"""2-D convolution as an implicit GEMM on channels-last data, bias and activation fused, and its
backward (dgrad through the same implicit GEMM, wgrad as a split reduction).

One module per design (gemm, implicit_gemm, flat_reduction, window; grouped for 1 < groups < C,
depthwise for groups = C), what they share in common; dispatch: the shipped choice between them;
backward.py and wgrad.py: the gradients; autograd.py: the public wrapper and the autograd
Function over the two (one way: dispatch <- backward <- autograd). docs/kernels/conv.md holds the
design notes and measurements.

Functions:
    conv2d            F.conv2d (any groups) then an activation, fused (autograd.conv2d)
    conv2d_forward    conv2d with the launcher explicit, for kernels/ops.py
    conv2d_reference  F.conv2d, the float64 reference of the tests
"""

from kernels.conv.autograd import conv2d
from kernels.conv.common import conv2d_reference
from kernels.conv.dispatch import conv2d_forward

__all__ = ["conv2d", "conv2d_forward", "conv2d_reference"]
