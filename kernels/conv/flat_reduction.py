"""Flat reduction for few input channels (C < 16: the C = 3 stem): the reduction is the flat
index over (r, s, c), padded only to BLOCK_K (7·7·3 = 147 -> 160), not C padded to the MMA's 16
per tap (7·7·16 = 784) as the implicit GEMM's per-tap steps would. The cost moves to a 2-D bounds
mask per element. docs/kernels/conv.md, "Measurements" (stem: 3.9x the per-tap path).

Functions:
    conv_flat_kernel  @triton.jit, autotuned (and a hook-free copy for traced launches)
    flat_step         its launch for a Conv (a kernels._launch.Step), through `launch`; `tma`:
                      an NHWC output by TMA
"""

import triton
import triton.language as tl

from kernels._common import direct
from kernels._launch import Step
from kernels.conv.common import (
    CONV_KEY,
    SIZES_ONLY,
    Conv,
    autotune,
    bias_activation,
    configs_of,
    epilogue,
    no_scratch,
    output_desc,
    row_tiles,
    traceable,
)
from kernels.matmul import grouped_tile

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps)
FLAT_TILES = [
    (128, 64, 32, 4, 4),
    (256, 64, 32, 3, 8),
    (64, 64, 32, 4, 4),
]


@autotune(configs_of(FLAT_TILES), CONV_KEY)
@triton.jit(do_not_specialize=SIZES_ONLY)
def conv_flat_kernel(
    # as conv_implicit_kernel's but the weight columns and W_FLIP (ws_ptr, lock_ptr, B_TMA and
    # SPLIT_K unused: one shared launch)
    x, w, bias_ptr, y, ws_ptr, lock_ptr,
    M, N, C, H, W, K, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk,
    stride_yn, stride_yk, stride_yp, stride_yq,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    B_TMA: tl.constexpr, Y_TMA: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    """Few input channels: reduce over the flat (r, s, c) index, BLOCK_K taps at a time.

    Each step decodes its BLOCK_K reduction indices into (r, s, c) (a vector, not per element);
    the per-element cost is the 2-D bounds mask. The weight always loads by pointer: the packed
    weight's row of R·S·C elements is rarely 16-byte aligned here, and it is small enough to stay
    in L1/L2.
    """
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    n = offs_m // (P * Q)
    pq = offs_m - n * (P * Q)
    p = pq // Q
    q = pq - p * Q
    ih0 = p * conv_stride_h - pad_h
    iw0 = q * conv_stride_w - pad_w
    x_win = x + n.to(tl.int64) * stride_xn + ih0 * stride_xh + iw0 * stride_xw
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < K

    taps = R * S * C
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, taps, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < taps
        rs = kk // C
        c = kk - rs * C
        r = rs // S
        s = rs - r * S
        dh = r * dil_h
        dw = s * dil_w
        ih = ih0[:, None] + dh[None, :]
        iw = iw0[:, None] + dw[None, :]
        ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) & (m_ok[:, None] & k_ok[None, :])
        k_off = dh * stride_xh + dw * stride_xw + c * stride_xc
        a = tl.load(x_win[:, None] + k_off[None, :], mask=ok, other=0.0)
        b_ptrs = w + offs_n[None, :] * stride_wk + kk[:, None]
        b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    if Y_TMA:  # y is an (M, K) matrix: one TMA store, clipped at its edges
        acc = bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
        y.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y.dtype))
    else:
        y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
        epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS, ACTIVATION)


_TRACEABLE = traceable(conv_flat_kernel.configs, CONV_KEY, conv_flat_kernel.fn)


def flat_step(conv: Conv, *, launch=direct, tma: bool = False):
    """(Step, scratch) of `conv` by conv_flat_kernel through `launch`; tensors as
    implicit_step's. `tma` (Hopper, direct launches): an NHWC output by TMA stores."""
    y_desc, y_tma = output_desc(conv, tma)
    kernel = conv_flat_kernel if launch is direct else _TRACEABLE

    tiles = row_tiles(conv)

    def grid(meta):
        return (tiles(meta),)

    step = Step(
        launch(kernel), grid,
        (conv.M, conv.N, conv.C, conv.H, conv.W, conv.K, conv.P, conv.Q, conv.R, conv.S,
         *conv.stride, *conv.padding, *conv.dilation,
         *conv.x.stride(), conv.w2d.stride(0), *conv.y.stride()),
        dict(B_TMA=False, Y_TMA=y_tma, SPLIT_K=1, **conv.constexprs),
        descs=[y_desc] if y_desc is not None else [],
    )  # fmt: skip
    return step, no_scratch
