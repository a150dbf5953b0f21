"""C = A @ B, with an optional bias + activation epilogue fused into the write-back.

The repo's one GEMM: as `matmul` it keeps up with cuBLAS (torch.matmul) on Hopper, and
kernels.linear (forward and both backward products) launches it through fused_matmul, fusing
the bias add and activation into the store; kernels.conv shares its epilogue helpers.

Modules:
    dispatch.py  which kernel a call takes (plan), fused_matmul, matmul_impl and matmul
    batched.py   torch.matmul's broadcast batch dims as one batch stride per operand (views)
    tma.py       the Hopper kernels: TMA descriptors, persistent grouped tiles, wgmma
    pointer.py   the pointer-load kernel for every other case, and its autotuning configs
    splitk.py    split-K for skinny shapes on the pointer path: slice count, reduce kernel
    epilogue.py  @triton.jit helpers shared by every GEMM: activation, tile order, epilogue;
                 the activation as a pass of its own (training GEMMs that keep z)
Measurements and history: docs/kernels/matmul.md.
"""

from kernels.matmul.dispatch import (
    check_matmul_args,
    copies_operands,
    fused_matmul,
    matmul,
    matmul_impl,
    matmul_reference,
    plan,
    planned,
    run_plan,
)
from kernels.matmul.epilogue import (
    GELU,
    GELU_TANH,
    GELU_TANH_CUBIC,
    NONE,
    RELU,
    SILU,
    SQRT_2_OVER_PI,
    SQRT_HALF,
    apply_activation,
    grouped_tile,
)

__all__ = [
    "GELU",
    "GELU_TANH",
    "GELU_TANH_CUBIC",
    "NONE",
    "RELU",
    "SILU",
    "SQRT_2_OVER_PI",
    "SQRT_HALF",
    "apply_activation",
    "check_matmul_args",
    "copies_operands",
    "fused_matmul",
    "grouped_tile",
    "matmul",
    "matmul_impl",
    "matmul_reference",
    "plan",
    "planned",
    "run_plan",
]
