"""C = A @ B, with an optional bias + activation epilogue fused into the write-back.

This is the repo's one GEMM kernel. As `matmul` it has to keep up with cuBLAS (torch.matmul) on
Hopper; `kernels.linear` reuses it for its forward and both backward products, passing weight.T
as swapped strides and fusing the bias add and activation into the store, which eager PyTorch
does as separate passes over the output.

Functions:
    matmul(a, b) -> c
        Public: the 2-D torch.matmul. fp16/bf16/fp32 in, same dtype out, fp32 accumulation.
    _matmul(a, b, *, launch=direct) -> c
        Checks the inputs, then launches through `launch` (kernels/ops.py passes
        torch.library.wrap_triton); allocates with torch ops only.
    fused_matmul(a, b, bias=None, act_id=0, save_preact=False, *, launch=direct) -> (c, z | None)
        The launch behind both, with no input checks: c = act(a @ b + bias); z is the
        pre-activation a @ b + bias, returned only when save_preact (for linear's backward).
    check_matmul_args(a, b)
        The TypeError/ValueError checks `_matmul` runs.
    apply_activation(x, ACTIVATION)
        @triton.jit helper: act(x) in fp32 for an id from ACTIVATIONS.
    grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)
        @triton.jit helper: the grouped (L2-friendly) tile order shared with kernels/conv.py.

The ids of ACTIVATIONS are also exported as tl.constexpr globals (NONE, RELU, GELU, GELU_TANH,
SILU) so kernels can name them.
"""

import torch
import triton
import triton.language as tl

from kernels._common import (
    ACTIVATIONS,
    check_same,
    check_tensor,
    direct,
    dot_precision,
    is_interpreter,
)

# Kernels may only read globals that are tl.constexpr. Keep a tensor on the left of any arithmetic
# with them: the interpreter cannot evaluate constexpr * tensor.
NONE = tl.constexpr(ACTIVATIONS["none"])
RELU = tl.constexpr(ACTIVATIONS["relu"])
GELU = tl.constexpr(ACTIVATIONS["gelu"])
GELU_TANH = tl.constexpr(ACTIVATIONS["gelu_tanh"])
SILU = tl.constexpr(ACTIVATIONS["silu"])
SQRT_HALF = tl.constexpr(0.7071067811865476)  # 1/sqrt(2), for exact gelu
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # sqrt(2/pi), for tanh-approximate gelu
GELU_TANH_CUBIC = tl.constexpr(0.044715)


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # 2·M·N·K FLOPs; reads (M·K + K·N)·bytes and writes M·N·bytes, so it is compute-bound
    # once M, N and K are all more than a few hundred.
    return a @ b


def hopper_configs() -> list[triton.Config]:
    """Tiles for H100/H200 (sm_90), fp16/bf16 first.

    The 128-wide tiles keep the wgmma units fed on large problems; the 64-wide ones cover small or
    skinny ones. Configs whose shared memory does not fit (128x256 in fp32) fail to compile, and
    the autotuner then skips them.
    """

    def config(block_m, block_n, block_k, num_stages, num_warps):
        meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 8}
        return triton.Config(meta, num_stages=num_stages, num_warps=num_warps)

    return [
        config(128, 256, 64, 3, 8),
        config(256, 128, 64, 3, 8),
        config(128, 128, 64, 4, 8),
        config(128, 128, 64, 3, 4),
        config(64, 128, 64, 4, 4),
        config(128, 64, 64, 4, 4),
        config(64, 64, 32, 5, 4),
    ]


def interpreter_configs() -> list[triton.Config]:
    """One small tile for TRITON_INTERPRET=1: with a single config the autotuner benchmarks
    nothing, and small tiles keep masked edge tiles cheap in numpy."""
    meta = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4}
    return [triton.Config(meta, num_stages=1, num_warps=4)]


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """act(x) for fp32 x; ACTIVATION is an id from ACTIVATIONS, so untaken branches compile away."""
    if ACTIVATION == RELU:
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == GELU:
        x = 0.5 * x * (1.0 + tl.erf(x * SQRT_HALF))
    elif ACTIVATION == GELU_TANH:
        # 0.5·x·(1 + tanh(u)) == x·sigmoid(2u); triton.language has no tanh.
        x = x * tl.sigmoid((x + x * x * x * GELU_TANH_CUBIC) * (2.0 * SQRT_2_OVER_PI))
    elif ACTIVATION == SILU:
        x = x * tl.sigmoid(x)
    return x


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(tile row, tile column) of program `pid`, walking GROUP_M tile-rows column by column.

    Programs that run together then share A rows and B columns in L2 instead of streaming all
    of B for every row of tiles. Used by every GEMM-shaped kernel (matmul, conv).
    """
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.autotune(
    configs=interpreter_configs() if is_interpreter() else hopper_configs(),
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel(
    # pointers: operands, output, then the epilogue's bias and pre-activation (None when unused)
    a_ptr, b_ptr, c_ptr, bias_ptr, preact_ptr,
    # sizes: A is M×K, B is K×N, C is M×N
    M, N, K,
    # strides in elements, so transposed and sliced views need no copy; preact shares C's
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias,
    # meta-parameters: epilogue switches, dot precision, then the tile shape
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST_TO_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    # ---- program-id mapping: grouped, for L2 reuse ----
    pid_m, pid_n = grouped_tile(
        tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)

    # ---- pointer setup ----
    # Rows and columns past the edge wrap back into the matrix, so A and B loads need only a K
    # mask; the wrapped results land in C positions that the store masks out.
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn

    # ---- main loop: fp32 accumulation over K ----
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST_TO_FP32:
            # The interpreter's dot multiplies bf16 as raw uint16 bits; its cast to fp32 is right.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # ---- epilogue in fp32, then write-back ----
    c_offsets = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    if STORE_PREACT:
        tl.store(preact_ptr + c_offsets, acc.to(preact_ptr.dtype.element_ty), mask=c_mask)
    acc = apply_activation(acc, ACTIVATION)
    tl.store(c_ptr + c_offsets, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def check_matmul_args(a, b) -> None:
    check_tensor("a", a, ndim=2)
    check_tensor("b", b, ndim=2)
    check_same({"a": a, "b": b})
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dims differ: a has shape {tuple(a.shape)} and b has shape {tuple(b.shape)}; "
            "need a (M, K) and b (K, N)"
        )


def fused_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    act_id: int = ACTIVATIONS["none"],
    save_preact: bool = False,
    *,
    launch=direct,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """c = act(a @ b + bias) as a new contiguous (M, N) tensor of a's dtype, plus the
    pre-activation z when save_preact. Callers check the inputs (check_matmul_args)."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    preact = torch.empty_like(c) if save_preact else None
    if c.numel() == 0:  # an empty grid is an error on some launch paths; nothing to write anyway
        return c, preact

    grid = lambda META: (triton.cdiv(M, META["BLOCK_M"]) * triton.cdiv(N, META["BLOCK_N"]),)
    launch(matmul_kernel)[grid](
        a, b, c, bias, preact,
        M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        bias.stride(0) if bias is not None else 0,
        HAS_BIAS=bias is not None,
        ACTIVATION=act_id,
        STORE_PREACT=save_preact,
        INPUT_PRECISION=dot_precision(a.dtype, torch.backends.cuda.matmul.allow_tf32),
        UPCAST_TO_FP32=is_interpreter() and a.dtype == torch.bfloat16,
    )  # fmt: skip
    return c, preact


def _matmul(a: torch.Tensor, b: torch.Tensor, *, launch=direct) -> torch.Tensor:
    check_matmul_args(a, b)
    return fused_matmul(a, b, launch=launch)[0]


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D a (M, K) and b (K, N) of one dtype (fp16, bf16 or fp32), any strides."""
    return _matmul(a, b)
