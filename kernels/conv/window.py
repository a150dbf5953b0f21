"""TMA window: stride-1 convs of 16-bit NHWC inputs on Hopper, the A tile one TMA box of the
input.

A row tile is a BLOCK_H x BLOCK_W patch of output pixels of one image. For tap (r, s) its inputs
are the same-sized patch shifted by (r·dil - pad, s·dil - pad): one 4-D TMA box
[1, BLOCK_H, BLOCK_W, BLOCK_K], whose out-of-range rows and columns (the zero padding, even at
negative coordinates) the TMA unit fills with zeros. No address arithmetic or masks per element;
the price is ragged edge tiles when BLOCK_H, BLOCK_W do not divide P, Q, which is why the dispatch
takes it on images of 14x14 and up only. docs/kernels/conv.md, "Paths" and "Measurements".
Split-K as in the implicit GEMM (kernels.matmul.splitk.split_k_gather).

Functions:
    conv_window_kernel  @triton.jit, autotuned
    window_ok           the 4-D TMA box can read x
    window_step         its launch for a Conv, a kernels._launch.Step (direct launches: its
                        operands are descriptors)
"""

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, is_interpreter
from kernels._launch import Step
from kernels.conv.common import (
    CONV_KEY,
    SIZES_ONLY,
    Conv,
    TensorDescriptor,
    autotune,
    bias_activation,
    epilogue,
    no_scratch,
    output_desc,
    split_scratch,
    weight_columns,
    weight_desc,
    weight_tile,
    window_config,
)
from kernels.matmul import grouped_tile
from kernels.matmul.splitk import split_k_gather

# (BLOCK_H, BLOCK_W, BLOCK_N, BLOCK_K, num_stages, num_warps): output tiles of BLOCK_H x BLOCK_W
# pixels of one image (8 | 56 and 7 | 28 leave no ragged edge for the big layers)
WINDOW_TILES = [
    (16, 16, 64, 64, 3, 8),  # K = 64 at 56x56
    (8, 8, 64, 64, 4, 4),
    (16, 8, 128, 64, 4, 8),  # 28x28
    (8, 16, 128, 64, 4, 8),  # 14x14
    (4, 32, 128, 64, 4, 8),
    (8, 8, 128, 64, 4, 4),
]


def _window_configs():
    if is_interpreter():
        return [window_config(4, 8, 32, 16, 1, 4, group_m=2)]
    return [window_config(*tile) for tile in WINDOW_TILES]


@autotune(_window_configs(), CONV_KEY)
@triton.jit(do_not_specialize=SIZES_ONLY)
def conv_window_kernel(
    # x: TMA descriptor of the NHWC input as a 4-D (N, H, W, C) tensor; the rest as
    # conv_implicit_kernel's (y by strides or as a 4-D (N, P, Q, K) descriptor)
    x, w, bias_ptr, y, ws_ptr, lock_ptr,
    M, N, C, H, W, K, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk, w_col0, w_col_r, w_col_s,
    stride_yn, stride_yk, stride_yp, stride_yq,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    B_TMA: tl.constexpr, Y_TMA: tl.constexpr, SPLIT_K: tl.constexpr, W_FLIP: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    BLOCK_M: tl.constexpr = BLOCK_H * BLOCK_W
    tiles_h = tl.cdiv(P, BLOCK_H)
    tiles_w = tl.cdiv(Q, BLOCK_W)
    num_pid_m = N * tiles_h * tiles_w
    pid_m, pid_n = grouped_tile(tl.program_id(0), num_pid_m, tl.cdiv(K, BLOCK_N), GROUP_M)
    n = pid_m // (tiles_h * tiles_w)
    t = pid_m - n * (tiles_h * tiles_w)
    th = t // tiles_w
    p0 = th * BLOCK_H
    q0 = (t - th * tiles_w) * BLOCK_W
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < K
    offs_c = tl.arange(0, BLOCK_K)

    c_blocks = tl.cdiv(C, BLOCK_K)
    steps = R * S * c_blocks
    if SPLIT_K > 1:
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
        box = x.load([n, p0 + r * dil_h - pad_h, q0 + s * dil_w - pad_w, c0])
        a = box.reshape(BLOCK_M, BLOCK_K)
        b = weight_tile(w, r, s, c0, pid_n, offs_c, offs_n, n_ok, C, stride_wk, w_col0, w_col_r,
                        w_col_s, B_TMA, W_FLIP, BLOCK_N)  # fmt: skip
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    i = tl.arange(0, BLOCK_M)
    p = p0 + i // BLOCK_W
    q = q0 + i % BLOCK_W
    m_ok = (p < P) & (q < Q)
    write = True
    if SPLIT_K > 1:
        acc, write = split_k_gather(acc, ws_ptr, lock_ptr, tl.program_id(0), tl.program_id(1),
                                    SPLIT_K, SPLIT_K, BLOCK_M, BLOCK_N)  # fmt: skip
    if write:
        if Y_TMA:  # y as 4-D (N, P, Q, K): the same pixel patch, clipped at the image's edges
            acc = bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
            box = acc.to(y.dtype).reshape(1, BLOCK_H, BLOCK_W, BLOCK_N)
            y.store([n, p0, q0, pid_n * BLOCK_N], box)
        else:
            y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
            epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS,
                     ACTIVATION)  # fmt: skip


def window_ok(x: torch.Tensor, stride_hw) -> bool:
    """The window kernel's 4-D TMA box can read x: stride 1, NHWC, 16-bit, aligned."""
    if stride_hw != (1, 1) or TensorDescriptor is None or x.stride(1) != 1:
        return False
    if x.dtype not in (torch.float16, torch.bfloat16) or x.data_ptr() % 16:
        return False
    return all((x.stride(d) * x.element_size()) % 16 == 0 for d in (0, 2, 3))


def window_step(conv: Conv, *, tma: bool = True, split_k: int = 1):
    """(Step, scratch) of `conv` (window_ok) by conv_window_kernel; tensors as implicit_step's.
    x always by 4-D TMA boxes; `tma` (Hopper): the weight by TMA where the matrix allows it
    (common.weight_desc), an NHWC output by 4-D TMA stores. split_k > 1 splits the reduction
    over grid axis 1. Direct launches only (its operands are descriptors)."""
    x, w2d, y = conv.x, conv.w2d, conv.y
    N, C, H, W = x.shape
    w_desc, b_tma = weight_desc(conv, tma, per_tap=True)
    # the pre-hook sets the boxes
    descs = [(0, 0, (N, H, W, C), (x.stride(0), x.stride(2), x.stride(3), 1), (1, 8, 8, 64))]
    if w_desc is not None:
        descs.append(w_desc)
    y_tma = output_desc(conv, tma)[1]
    if y_tma:
        descs.append((3, 3, (N, conv.P, conv.Q, conv.K), (y.stride(0), y.stride(2), y.stride(3), 1),
                      (1, 8, 8, 64)))  # fmt: skip

    P, Q, K = conv.P, conv.Q, conv.K  # not conv: the plan keeps this grid (common.row_tiles)

    def tiles_of(meta):
        tiles = cdiv(P, meta["BLOCK_H"]) * cdiv(Q, meta["BLOCK_W"])
        return N * tiles * cdiv(K, meta["BLOCK_N"])

    scratch = no_scratch
    if split_k > 1:
        scratch = split_scratch(conv_window_kernel, split_k, tiles_of)

    def grid(meta):
        return (tiles_of(meta), split_k) if split_k > 1 else (tiles_of(meta),)

    step = Step(
        conv_window_kernel, grid,
        (conv.M, N, C, H, W, conv.K, conv.P, conv.Q, conv.R, conv.S,
         *conv.stride, *conv.padding, *conv.dilation,
         *x.stride(), w2d.stride(0), *weight_columns(conv), *y.stride()),
        dict(B_TMA=b_tma, Y_TMA=y_tma, SPLIT_K=split_k, W_FLIP=conv.flip is not None,
             **conv.constexprs),
        descs=descs,
    )  # fmt: skip
    return step, scratch
