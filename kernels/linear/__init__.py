"""y = act(x @ weight.T + bias), differentiable, with every FLOP in Triton.

Modules:
    dispatch.py  linear_forward / linear_backward (GEMMs through kernels.matmul.fused_matmul),
                 the autograd Function, check_linear_args and the public `linear`
    backward.py  the backward's own kernels: dZ = dY * act'(Z) with db, and column sums
Measurements and history: docs/kernels/matmul.md (linear shares the GEMM).
"""

from kernels.linear.dispatch import (
    check_linear_args,
    linear,
    linear_backward,
    linear_forward,
    linear_reference,
)

__all__ = [
    "check_linear_args",
    "linear",
    "linear_backward",
    "linear_forward",
    "linear_reference",
]
