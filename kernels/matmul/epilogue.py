"""The GEMM epilogue's @triton.jit helpers, shared by every matmul kernel (and kernels/conv).

The epilogue turns the fp32 accumulator into the outputs: z = acc + bias (the pre-activation,
stored only when linear's backward needs it) and act(z), both rounded to the output dtype at the
store. The activation ids are those of kernels._common.ACTIVATIONS, re-exported here as
tl.constexpr globals (NONE, RELU, GELU, GELU_TANH, SILU) so kernels can name them.

Functions:
    apply_activation(x, ACTIVATION)
        act(x) in fp32 for an id from ACTIVATIONS (exact gelu without tl.erf).
    grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M) -> (pid_m, pid_n)
        The grouped (L2-friendly) tile order of every GEMM-shaped kernel (matmul, conv).
    bias_activation(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS, ACTIVATION)
        -> (z, act(z)) for a whole tile.
    store_masked(y, z, offs_m, offs_n, M, N, stride_c, c_ptr, preact_ptr, STORE_PREACT)
        Pointer stores of C (and Z) for a row-major output, masked at the edges.
    activation_pass_kernel[grid](z_ptr, y_ptr, n, ACTIVATION, BLOCK)
        y = act(z) over n contiguous elements: the activation as a pass of its own, after a
        GEMM that stored only z (dispatch.activation_pass says when).
"""

import triton
import triton.language as tl

from kernels._common import ACTIVATIONS

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


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """act(x) for fp32 x; ACTIVATION is an id from ACTIVATIONS, so untaken branches compile away."""
    if ACTIVATION == RELU:
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == GELU:
        # Exact gelu x·Phi(x), Phi the normal CDF, without tl.erf: libdevice's erff evaluates
        # both of its branches an element, and in the matmul epilogue that ran with the tensor
        # cores idle (docs/kernels/matmul.md, "Shipped design"). Here Q = Phi(-|x|) = erfc(u)/2 with
        # u = |x|/sqrt(2), and erfc(u) = t·exp(-u² + P(t)), t = 1/(1 + u/2), P a degree-9
        # polynomial (Numerical Recipes' erfcc, fractional error < 1.2e-7 for all u): one
        # division, one exp, no branches. Unlike the 1 + erf form it keeps its relative accuracy
        # in the negative tail, where 1 + erf cancels.
        u = tl.abs(x) * SQRT_HALF
        t = 1.0 / (1.0 + 0.5 * u)
        p = t * 0.17087277 - 0.82215223
        p = p * t + 1.48851587
        p = p * t - 1.13520398
        p = p * t + 0.27886807
        p = p * t - 0.18628806
        p = p * t + 0.09678418
        p = p * t + 0.37409196
        p = p * t + 1.00002368
        q = 0.5 * t * tl.exp(p * t - 1.26551223 - u * u)
        x = x * tl.where(x < 0.0, q, 1.0 - q)
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


@triton.jit
def bias_activation(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):  # fmt: skip
    """(z, act(z)) with z = acc + bias, all fp32."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    return acc, apply_activation(acc, ACTIVATION)


@triton.jit
def store_masked(y, z, offs_m, offs_n, M, N, stride_c, c_ptr, preact_ptr,
                 STORE_PREACT: tl.constexpr):  # fmt: skip
    """Pointer stores of C (and Z) for a row-major output, masked at the edges."""
    c_offsets = offs_m[:, None] * stride_c + offs_n[None, :]
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if STORE_PREACT:
        tl.store(preact_ptr + c_offsets, z.to(preact_ptr.dtype.element_ty), mask=c_mask)
    tl.store(c_ptr + c_offsets, y.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def activation_pass_kernel(z_ptr, y_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    """y = act(z) for n contiguous elements, in fp32, rounded once at the store."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    z = tl.load(z_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, apply_activation(z, ACTIVATION).to(y_ptr.dtype.element_ty), mask=mask)
