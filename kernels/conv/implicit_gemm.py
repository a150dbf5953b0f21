"""Implicit GEMM: the general conv (any filter, stride, padding, dilation; C >= 16), the input
patches gathered on the fly (no im2col buffer).

One flat loop over (r, s, c-block) steps, so Triton's software pipeliner sees a single loop
(nested r / s / c loops would leave it a 1-iteration inner loop when C = BLOCK_K). Each step loads,
per output pixel, one contiguous run of BLOCK_K channels (NHWC; an NCHW input is read in place by
strided loads, which still coalesce along the rows), with the pixel's (n, p, q) decoded once
before the loop and the step's (r, s, c0) decoded as scalars. On Hopper the weight tile comes in
by TMA and an NHWC output goes out by TMA stores.

Split-K (SPLIT_K > 1): grid axis 1 splits the steps; the partial tiles are summed in the same
launch by the last program to arrive (kernels.matmul.splitk.split_k_gather). The dispatch
splits only layers with too few output tiles to fill the GPU (dispatch.split_k_rule).

Functions:
    conv_implicit_kernel  @triton.jit, autotuned (and a hook-free copy for traced launches)
    implicit_step         its launch for a Conv (a kernels._launch.Step), through `launch`, TMA
                          where `tma`, split_k splits
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
    split_scratch,
    traceable,
    weight_columns,
    weight_desc,
    weight_tile,
)
from kernels.matmul import grouped_tile
from kernels.matmul.splitk import split_k_gather

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps). fp16/bf16 on H100: 64 channels per step
# (128-byte rows, the widest TMA/wgmma swizzle). The configs that won or came within ~10 % on
# some ResNet-50 layer on the H100 (docs/kernels/conv.md, "Measurements"); fp32 configs that run
# out of shared memory fail to compile and the autotuner skips them.
IMPLICIT_TILES = [
    (128, 64, 64, 4, 4),  # K = 64 output channels at 56x56
    (256, 128, 64, 3, 8),
    (64, 128, 64, 4, 4),  # most 28x28 / 14x14 / 7x7 layers (few rows: more tiles)
    (128, 256, 64, 3, 8),
    (128, 128, 32, 4, 4),
    (128, 128, 64, 4, 8),
    (64, 64, 64, 4, 4),
    # the stage-3/4 3x3s on an H200 (forced-tile probe, docs/kernels/conv.md "Small-spatial
    # 3x3 tiles"): 128x128 at 3 stages / 4 warps for the 56x56 and 28x28 strided ones, and
    # 128-channel steps for the 14x14 and 7x7 outputs
    (128, 128, 64, 3, 4),
    (128, 128, 128, 3, 8),
    (64, 128, 128, 3, 4),
    # 128-channel steps at 4 stages / 8 warps: the 7x7-output 512-channel 3x3s unsplit (30.0 and
    # 30.4 us on an H200 against 31.9 and 32.0 for the best split launch; docs/kernels/conv.md,
    # "Long-reduction tiles")
    (64, 128, 128, 4, 8),
    # at most 16 output channels (the dgrad of a 3-channel stem: a 64-wide tile computes 61
    # padding channels, a 16-wide one 13); pruned wherever K is wider
    (128, 16, 64, 4, 4),
    (256, 16, 64, 3, 8),
]


@autotune(configs_of(IMPLICIT_TILES), CONV_KEY)
@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=SIZES_ONLY)
def conv_implicit_kernel(
    # x: (N, C, H, W) by strides; w: packed (K, R·S·C) matrix or its TMA descriptor (W_FLIP: the
    # forward's matrix of a dgrad, common.FlippedTaps); y by strides or as an (M, K) TMA
    # descriptor; ws_ptr, lock_ptr: split-K workspace and tile counters; w_col*: the columns of
    # tap (r, s) (common.weight_columns)
    x, w, bias_ptr, y, ws_ptr, lock_ptr,
    M, N, C, H, W, K, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk, w_col0, w_col_r, w_col_s,
    stride_yn, stride_yk, stride_yp, stride_yq,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    B_TMA: tl.constexpr, Y_TMA: tl.constexpr, SPLIT_K: tl.constexpr, W_FLIP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_C: tl.constexpr,
):  # fmt: skip
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)

    # -- per output pixel, once: (n, p, q), the window's corner and the image's base pointer --
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    n = offs_m // (P * Q)
    pq = offs_m - n * (P * Q)
    p = pq // Q
    q = pq - p * Q
    ih0 = p * conv_stride_h - pad_h
    iw0 = q * conv_stride_w - pad_w
    x_img = x + n.to(tl.int64) * stride_xn  # int64: batch × image stride can pass 2^31
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < K
    offs_c = tl.arange(0, BLOCK_K)

    # -- one flat loop over (r, s, channel block): a single loop the pipeliner can overlap --
    c_blocks = tl.cdiv(C, BLOCK_K)
    steps = R * S * c_blocks
    if SPLIT_K > 1:  # this program's share of the (r, s, c-block) steps (axis 1 is the split)
        per_split = tl.cdiv(steps, SPLIT_K)
        step_lo = tl.program_id(1) * per_split
        step_hi = tl.minimum(step_lo + per_split, steps)
    else:
        step_lo = 0
        step_hi = steps
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(step_lo, step_hi):
        rs = step // c_blocks
        c0 = (step - rs * c_blocks) * BLOCK_K
        r = rs // S
        s = rs - r * S
        ih = ih0 + r * dil_h
        iw = iw0 + s * dil_w
        pix_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)  # zero padding reads 0
        c = c0 + offs_c
        pix_off = ih * stride_xh + iw * stride_xw
        a_ptrs = x_img[:, None] + pix_off[:, None] + c[None, :] * stride_xc
        if EVEN_C:
            a = tl.load(a_ptrs, mask=pix_ok[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=pix_ok[:, None] & (c < C)[None, :], other=0.0)
        b = weight_tile(w, r, s, c0, pid_n, offs_c, offs_n, n_ok, C, stride_wk, w_col0, w_col_r,
                        w_col_s, B_TMA, W_FLIP, BLOCK_N)  # fmt: skip
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    write = True
    if SPLIT_K > 1:  # only the last program of this tile to arrive sums the partials and writes
        acc, write = split_k_gather(acc, ws_ptr, lock_ptr, tl.program_id(0), tl.program_id(1),
                                    SPLIT_K, SPLIT_K, BLOCK_M, BLOCK_N)  # fmt: skip
    if write:
        if Y_TMA:  # y is an (M, K) matrix: one TMA store, clipped at its edges
            acc = bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
            y.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y.dtype))
        else:
            y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
            epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS,
                     ACTIVATION)  # fmt: skip


# Traced launches tune without pruning, so each set holds only the tiles its convs can use: the
# 16-wide tiles for at most 16 output channels (compile time is part of what triton-compiled
# reports); the interpreter's one small tile serves both
_WIDE = [c for c in conv_implicit_kernel.configs if c.kwargs["BLOCK_N"] >= 64]
_TRACEABLE = traceable(_WIDE or conv_implicit_kernel.configs, CONV_KEY, conv_implicit_kernel.fn)
_TRACEABLE_FEW_CHANNELS = traceable(conv_implicit_kernel.configs, CONV_KEY,
                                    conv_implicit_kernel.fn)  # fmt: skip


def implicit_step(conv: Conv, *, launch=direct, tma: bool = False, split_k: int = 1):
    """(Step, scratch) of `conv` by conv_implicit_kernel; the step's tensors are (x, w2d, bias,
    y, then scratch(device): the split workspace and counters, or None, None). `tma` (Hopper,
    direct launches): the weight by TMA where the matrix allows it (common.weight_desc), an NHWC
    output by TMA stores. split_k > 1 splits the reduction over grid axis 1 (direct launches
    only: it needs the split workspace)."""
    w2d, y = conv.w2d, conv.y
    w_desc, b_tma = weight_desc(conv, tma, per_tap=True)
    y_desc, y_tma = output_desc(conv, tma)
    if launch is direct:
        kernel = conv_implicit_kernel
    else:
        kernel = _TRACEABLE_FEW_CHANNELS if conv.K <= 16 else _TRACEABLE
    tiles = row_tiles(conv)
    scratch = no_scratch
    if split_k > 1:
        scratch = split_scratch(kernel, split_k, tiles)

    def grid(meta):
        return (tiles(meta), split_k) if split_k > 1 else (tiles(meta),)

    step = Step(
        launch(kernel), grid,
        (conv.M, conv.N, conv.C, conv.H, conv.W, conv.K, conv.P, conv.Q, conv.R, conv.S,
         *conv.stride, *conv.padding, *conv.dilation,
         *conv.x.stride(), w2d.stride(0), *weight_columns(conv), *y.stride()),
        dict(B_TMA=b_tma, Y_TMA=y_tma, SPLIT_K=split_k, W_FLIP=conv.flip is not None,
             **conv.constexprs),
        descs=[d for d in (w_desc, y_desc) if d is not None],
    )  # fmt: skip
    return step, scratch
