"""2-D convolution as an implicit GEMM, with bias and activation fused into the epilogue.

The output pixels (N·P·Q) are the GEMM rows, the output channels (K) its columns and the filter
taps (C·R·S) its reduction; the input patches are gathered on the fly from the tensor's own
strides instead of materialising im2col, so NCHW and channels_last inputs both run without a
layout copy. It must beat cuDNN's F.conv2d followed by a separate bias + activation pass.
"""

import torch
import triton
import triton.language as tl

from kernels._common import (
    Launcher,
    activation_id,
    check_same,
    check_tensor,
    direct,
    dot_precision,
    is_interpreter,
)
from kernels.matmul import apply_activation, grouped_tile


def conv2d_reference(x, weight, bias, stride, padding, dilation):
    # 2·N·K·P·Q·C·R·S FLOPs; reads N·C·H·W + K·C·R·S, writes N·K·P·Q elements (·bytes each)
    return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation)


def hopper_configs():
    """Tensor-core tiles for H100: 64-128 row/column tiles, 32-64 channels per step."""
    tiles = [
        # BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps
        (128, 128, 64, 3, 8),
        (128, 128, 32, 4, 8),
        (128, 64, 32, 4, 4),
        (64, 128, 32, 4, 4),
        (64, 64, 64, 4, 4),
        (128, 256, 32, 3, 8),
        (64, 32, 32, 4, 4),  # small K (out channels) or tiny images
    ]
    return [
        triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8},
                      num_stages=stages, num_warps=warps)
        for m, n, k, stages, warps in tiles
    ]  # fmt: skip


def interpreter_configs():
    """One small tile: the CPU interpreter has nothing to tune, and tl.dot needs dims >= 16."""
    return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 1})]


@triton.autotune(
    configs=interpreter_configs() if is_interpreter() else hopper_configs(),
    # geometry, plus the channel strides: they decide which operand loads coalesce
    key=["N", "C", "K", "P", "Q", "R", "S", "stride_xc", "stride_wc"],
)
@triton.jit
def conv2d_kernel(
    # pointers (bias_ptr is None without bias)
    x_ptr, w_ptr, bias_ptr, y_ptr,
    # sizes: x is (N, C, H, W), weight (K, C, R, S), y (N, K, P, Q)
    N, C, H, W, K, P, Q, R, S,
    # convolution geometry
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    # strides, in elements, in the index order above
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk, stride_wc, stride_wr, stride_ws,
    stride_yn, stride_yk, stride_yp, stride_yq,
    # meta
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):  # fmt: skip
    # -- program-id mapping: GROUP_M row tiles share each weight column tile while it is in L2 --
    pid_m, pid_n = grouped_tile(
        tl.program_id(0), tl.cdiv(N * P * Q, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)

    # -- pointer setup: row m is output pixel (n, p, q), column k is output channel k --
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_k = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_K)
    m_ok = offs_m < N * P * Q
    k_ok = offs_k < K
    n = (offs_m // (P * Q)).to(tl.int64)  # int64: batch × image stride can pass 2^31
    p = (offs_m // Q) % P
    q = offs_m % Q
    ih0 = p * conv_stride_h - pad_h
    iw0 = q * conv_stride_w - pad_w
    x_img = x_ptr + n * stride_xn
    w_out = w_ptr + offs_k * stride_wk

    # -- main loop: one filter tap (r, s) at a time, BLOCK_K input channels per step --
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r in range(R):
        ih = ih0 + r * dil_h
        h_ok = m_ok & (ih >= 0) & (ih < H)
        for s in range(S):
            iw = iw0 + s * dil_w
            # taps that land in the zero padding load 0 instead
            pix_ok = h_ok & (iw >= 0) & (iw < W)
            x_tap = x_img + ih * stride_xh + iw * stride_xw
            w_tap = w_out + r * stride_wr + s * stride_ws
            for c0 in range(0, C, BLOCK_K):
                c = c0 + offs_c
                c_ok = c < C
                a = tl.load(
                    x_tap[:, None] + c[None, :] * stride_xc,
                    mask=pix_ok[:, None] & c_ok[None, :],
                    other=0.0,
                )
                b = tl.load(
                    w_tap[None, :] + c[:, None] * stride_wc,
                    mask=c_ok[:, None] & k_ok[None, :],
                    other=0.0,
                )
                acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    # -- write-back: bias and activation in fp32, then one rounding to the output dtype --
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)[None, :]
    acc = apply_activation(acc, ACTIVATION)
    y_pix = n * stride_yn + p * stride_yp + q * stride_yq
    y_ptrs = y_ptr + y_pix[:, None] + offs_k[None, :] * stride_yk
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & k_ok[None, :])


def _pair(name: str, value, minimum: int) -> tuple[int, int]:
    if isinstance(value, str):
        raise ValueError(f"{name}={value!r} is not supported; pass an int or a pair of ints")
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def _channels_last_output(x: torch.Tensor) -> bool:
    """Follow the input's layout: channels innermost (channels_last, or a channel slice of it).

    When both layouts describe x (C == 1 or H == W == 1), is_contiguous() wins and the output is
    plain NCHW, which torch also prefers.
    """
    return not x.is_contiguous() and x.stride(1) == 1 and x.shape[1] > 1


def conv2d_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    activation: str | None = None,
    *,
    launch: Launcher = direct,
) -> torch.Tensor:
    """conv2d with the launcher made explicit, for kernels/ops.py; see conv2d."""
    check_tensor("x", x)
    if x.dim() not in (3, 4):
        raise ValueError(f"x must be 3-D (C, H, W) or 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    check_tensor("weight", weight, ndim=4)
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
    check_same({"x": x, "weight": weight, "bias": bias})
    stride_hw = _pair("stride", stride, 1)
    padding_hw = _pair("padding", padding, 0)
    dilation_hw = _pair("dilation", dilation, 1)
    act = activation_id(activation)
    if x.dim() == 3:  # unbatched, as F.conv2d allows
        y = conv2d_forward(x.unsqueeze(0), weight, bias, stride_hw, padding_hw, dilation_hw,
                           activation, launch=launch)  # fmt: skip
        return y.squeeze(0)

    N, C, H, W = x.shape
    K, C_w, R, S = weight.shape
    if C_w != C:
        raise ValueError(
            f"x has {C} channels (shape {tuple(x.shape)}) but weight expects {C_w} "
            f"(shape {tuple(weight.shape)}); only groups=1 is supported"
        )
    if bias is not None and bias.shape[0] != K:
        raise ValueError(f"bias has shape {tuple(bias.shape)} but weight has {K} output channels")
    window_h = dilation_hw[0] * (R - 1) + 1
    window_w = dilation_hw[1] * (S - 1) + 1
    padded_h, padded_w = H + 2 * padding_hw[0], W + 2 * padding_hw[1]
    if window_h > padded_h or window_w > padded_w:
        raise ValueError(
            f"kernel {R}x{S} with dilation {dilation_hw} spans {window_h}x{window_w}, larger than "
            f"the padded input {padded_h}x{padded_w} (x shape {tuple(x.shape)})"
        )
    P = (padded_h - window_h) // stride_hw[0] + 1
    Q = (padded_w - window_w) // stride_hw[1] + 1

    if is_interpreter() and x.dtype == torch.bfloat16:
        # The triton 3.8 interpreter multiplies bf16 tl.dot operands as their raw uint16 bits, so
        # run the fp32 kernel on upcast copies; the products are exact in fp32 either way, and the
        # result is rounded to bf16 once, as on the GPU.
        def up(t):
            return None if t is None else t.float()

        y = conv2d_forward(up(x), up(weight), up(bias), stride_hw, padding_hw, dilation_hw,
                           activation, launch=launch)  # fmt: skip
        return y.to(torch.bfloat16)

    memory_format = torch.channels_last if _channels_last_output(x) else torch.contiguous_format
    y = torch.empty((N, K, P, Q), device=x.device, dtype=x.dtype, memory_format=memory_format)
    if y.numel() == 0:
        return y

    grid = lambda META: (triton.cdiv(N * P * Q, META["BLOCK_M"]) * triton.cdiv(K, META["BLOCK_N"]),)
    launch(conv2d_kernel)[grid](
        x, weight, bias, y,
        N, C, H, W, K, P, Q, R, S,
        *stride_hw, *padding_hw, *dilation_hw,
        *x.stride(), *weight.stride(), *y.stride(),
        HAS_BIAS=bias is not None,
        ACTIVATION=act,
        DOT_PRECISION=dot_precision(x.dtype, torch.backends.cudnn.allow_tf32),
    )  # fmt: skip
    return y


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    activation: str | None = None,
) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride, padding, dilation) with groups=1, then `activation`.

    padding takes ints only (not 'same'/'valid'). The output is channels_last when x is, else
    NCHW. Forward only: the result carries no autograd graph.
    """
    return conv2d_forward(x, weight, bias, stride, padding, dilation, activation)
