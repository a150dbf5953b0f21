"""1x1 convs as a plain GEMM: a 1x1, stride-1, unpadded conv between NHWC tensors is
y(M, K) = x(M, C) @ w(K, C)^T, with x read as an (N·H·W, C) matrix (no gather at all).

Two launches of one tile body (_gemm_tile):
    conv_gemm_persistent_kernel  what direct calls run: PER_SM programs per SM walk the output
        tiles in grouped order, and tl.range(flatten=True) lets the pipeliner issue the next
        tile's loads while this tile's epilogue runs (the 1x1 layers have 1-32 reduction steps
        per tile, so a one-tile program has little else to overlap). On Hopper x, w and y go
        through TMA descriptors. docs/kernels/conv.md, "Shipped design".
    conv_gemm_kernel  one program per tile, pointer loads, under a hook-free autotuner: what the
        traced launches (launch=wrap_triton, torch.compile) run.

Functions:
    persistent_config            the persistent kernel's config of one GEMM_PERSISTENT_TILES row
    _gemm_tile                   @triton.jit: one output tile, + bias, + a residual, activation
    conv_gemm_persistent_kernel  @triton.jit, autotuned: the persistent tile loop
    conv_gemm_kernel             @triton.jit, hook-free autotuner: one tile per program
    is_gemm                      the conv is this GEMM (1x1, stride 1, unpadded, NHWC in and out)
    gemm_persistent_step         the persistent kernel's launch, a kernels._launch.Step (direct
                                 launches)
    conv_gemm                    launch the one-tile kernel through `launch` (pointer loads)
"""

import triton
import triton.language as tl

from kernels._common import direct, gpu_info, is_interpreter
from kernels._launch import Step
from kernels.conv.common import (
    Conv,
    as_matrix,
    autotune,
    bias_activation,
    config,
    configs_of,
    epilogue,
    output_desc,
    row_tiles,
    tma_ok,
    traceable,
    weight_desc,
)
from kernels.matmul import apply_activation, grouped_tile

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps, programs per SM) of the persistent kernel:
# the one-tile gemm tiles that won on ResNet-50's 1x1 layers, with one or two resident programs
# per SM (two let one program's epilogue overlap the other's loads).
GEMM_PERSISTENT_TILES = [
    (128, 64, 64, 4, 4, 2),
    (128, 128, 64, 4, 8, 1),
    (128, 128, 64, 3, 4, 2),
    (256, 128, 64, 3, 8, 1),
    (128, 256, 64, 3, 8, 1),
    (64, 128, 64, 4, 4, 2),
    # 128-channel steps and a 5-stage 128x128: the long-reduction 1x1s to 14x14 and 7x7 and the
    # 28x28 ones (H200, flushed: 2048x7x7 -> 512 15.6 -> 11.9 us, 1024x14x14 -> 512 18.3 ->
    # 16.6, 512x28x28 -> 128 16.5 -> 15.0; docs/kernels/conv.md, "Long-reduction tiles")
    (64, 128, 128, 4, 4, 1),
    (128, 128, 128, 3, 8, 1),
    (128, 128, 64, 5, 8, 1),
    (128, 64, 128, 3, 4, 1),
    # Few channels (MobileNetV2's 1x1s of 16-32 channels in or out): a channel step no deeper
    # than C and an output tile no wider than K, so no step or column is mostly TMA's zero fill,
    # with tall tiles and deep pipelines to keep enough of these memory-bound layers' bytes in
    # flight. common.prune keeps a step under 64 channels only where C fits in it.
    (256, 16, 32, 4, 4, 2),
    (256, 32, 32, 4, 4, 2),
    (128, 32, 32, 6, 4, 2),
    (128, 128, 32, 4, 8, 1),
    (128, 256, 32, 3, 8, 1),
    # ... and few channels out of many (96 or 144 -> 24): 32-wide outputs, 64-channel steps
    (128, 32, 64, 4, 4, 2),
    (256, 32, 64, 4, 8, 1),
]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) of the one-tile kernel (traced launches)
GEMM_TILES = [
    (128, 64, 64, 4, 4),
    (256, 128, 64, 3, 8),
    (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 4, 8),
    (128, 256, 64, 3, 8),
]


def persistent_config(tile):
    """The persistent kernel's config of one GEMM_PERSISTENT_TILES row (its last entry the
    programs per SM)."""
    *block, per_sm = tile
    cfg = config(*block)
    cfg.kwargs["PER_SM"] = per_sm
    return cfg


def _persistent_configs():
    if is_interpreter():
        return [config(32, 32, 16, 1, 4, group_m=2)]
    return [persistent_config(tile) for tile in GEMM_PERSISTENT_TILES]


@triton.jit
def _gemm_tile(
    x, w, bias_ptr, y, res, pid_m, pid_n,
    M, C, K,
    stride_xm, stride_wk, stride_ym, stride_yk,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    A_TMA: tl.constexpr, B_TMA: tl.constexpr, Y_TMA: tl.constexpr, HAS_RES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_C: tl.constexpr,
):  # fmt: skip
    """One (pid_m, pid_n) output tile of the 1x1 GEMM y(M, K) = x(M, C) @ w(K, C)^T, + bias,
    + the residual res (HAS_RES: an (M, K) matrix with y's strides), activation: the body of
    conv_gemm_kernel and of each conv_gemm_persistent_kernel step."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_K):
        c = c0 + offs_c
        if A_TMA:
            a = x.load([pid_m * BLOCK_M, c0])
        else:
            a_ptrs = x + offs_m.to(tl.int64)[:, None] * stride_xm + c[None, :]
            if EVEN_C:
                a = tl.load(a_ptrs, mask=m_ok[:, None], other=0.0)
            else:
                a = tl.load(a_ptrs, mask=m_ok[:, None] & (c < C)[None, :], other=0.0)
        if B_TMA:
            b = w.load([pid_n * BLOCK_N, c0]).T
        else:
            b_ptrs = w + offs_n[None, :] * stride_wk + c[:, None]
            b = tl.load(b_ptrs, mask=(c < C)[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    y_row = offs_m.to(tl.int64) * stride_ym
    acc = bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, 0)
    if HAS_RES:  # a residual block's sum, before its activation
        r_ptrs = res + y_row[:, None] + offs_n[None, :] * stride_yk
        acc += tl.load(r_ptrs, mask=m_ok[:, None] & n_ok[None, :], other=0.0).to(tl.float32)
    acc = apply_activation(acc, ACTIVATION)
    if Y_TMA:
        y.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y.dtype))
    else:  # bias and activation are in acc already
        epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, False, 0)


@autotune(_persistent_configs(),
          ["M", "C", "K", "stride_xm", "stride_yk", "A_TMA", "B_TMA"])  # fmt: skip
@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def conv_gemm_persistent_kernel(
    x, w, bias_ptr, y, res,
    M, C, K,
    stride_xm, stride_wk, stride_ym, stride_yk,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    A_TMA: tl.constexpr, B_TMA: tl.constexpr, Y_TMA: tl.constexpr, HAS_RES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_C: tl.constexpr, PER_SM: tl.constexpr = 1,
):  # fmt: skip
    """_gemm_tile in a persistent loop: PER_SM programs per SM (the grid is sized on the host;
    PER_SM does nothing in here) walk the output tiles in grouped order; flattening the loops
    lets the pipeliner issue the next tile's loads while this tile's epilogue runs."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        _gemm_tile(x, w, bias_ptr, y, res, pid_m, pid_n, M, C, K, stride_xm, stride_wk,
                   stride_ym, stride_yk, HAS_BIAS, ACTIVATION, DOT_PRECISION, A_TMA, B_TMA,
                   Y_TMA, HAS_RES, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_C)  # fmt: skip


@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def _conv_gemm(
    # x: (M, C) matrix (or TMA descriptor); w: (K, C) matrix (or descriptor); y: (M, K) strides
    x, w, bias_ptr, y, res,
    M, C, K,
    stride_xm, stride_wk, stride_ym, stride_yk,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    A_TMA: tl.constexpr, B_TMA: tl.constexpr, Y_TMA: tl.constexpr, HAS_RES: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_C: tl.constexpr,
):  # fmt: skip
    """A 1x1 stride-1 conv on NHWC: y(M, K) = x(M, C) @ w(K, C)^T, + bias, activation."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)
    _gemm_tile(x, w, bias_ptr, y, res, pid_m, pid_n, M, C, K, stride_xm, stride_wk, stride_ym,
               stride_yk, HAS_BIAS, ACTIVATION, DOT_PRECISION, A_TMA, B_TMA, Y_TMA, HAS_RES,
               BLOCK_M, BLOCK_N, BLOCK_K, EVEN_C)  # fmt: skip


conv_gemm_kernel = traceable(configs_of(GEMM_TILES),
                             ["M", "C", "K", "stride_xm", "stride_yk", "A_TMA", "B_TMA"],
                             _conv_gemm)  # fmt: skip


def is_gemm(conv: Conv) -> bool:
    """A 1x1, stride-1, unpadded conv between NHWC tensors is the GEMM y(M, K) = x(M, C) w^T."""
    unit = (conv.R, conv.S) == (1, 1) and conv.stride == (1, 1) and conv.padding == (0, 0)
    return unit and as_matrix(conv.x) and as_matrix(conv.y)


def _x_matrix(conv: Conv):
    return conv.x.as_strided((conv.M, conv.C), (conv.x.stride(3), 1))


def gemm_persistent_step(conv: Conv, *, tma: bool, residual: bool = False):
    """(Step, scratch) of an is_gemm conv by conv_gemm_persistent_kernel, the operands by TMA
    where `tma` (Hopper) and they allow it; the step's tensors are (x, w2d, bias, y), and the
    residual (y's shape and strides) where `residual` (x and y read as the (M, C) and (M, K)
    matrices they are). Direct launches only (its configs carry the TMA pre-hook)."""
    x2d, w2d, y = _x_matrix(conv), conv.w2d, conv.y
    descs = []
    a_tma = bool(tma and tma_ok(x2d))
    if a_tma:  # the pre-hook sets each config's block shape
        descs.append((0, 0, (conv.M, conv.C), (x2d.stride(0), 1), (64, 64)))
    w_desc, b_tma = weight_desc(conv, tma)
    y_desc, y_tma = output_desc(conv, tma)
    descs += [d for d in (w_desc, y_desc) if d is not None]
    info = gpu_info(y.device)  # the interpreter's 4 programs loop over several tiles
    programs = 4 if info is None else info.sms

    tiles = row_tiles(conv)

    def grid(meta):
        return (min(tiles(meta), programs * meta.get("PER_SM", 1)),)

    step = Step(
        conv_gemm_persistent_kernel, grid,
        (conv.M, conv.C, conv.K, x2d.stride(0), w2d.stride(0), y.stride(3), y.stride(1)),
        dict(A_TMA=a_tma, B_TMA=b_tma, Y_TMA=y_tma, HAS_RES=residual, **conv.constexprs),
        descs=descs, width=5,
    )  # fmt: skip
    return step, None


def conv_gemm(conv: Conv, *, launch=direct):
    """Run an is_gemm conv by conv_gemm_kernel through `launch`, pointer loads and stores."""
    x2d, w2d, y = _x_matrix(conv), conv.w2d, conv.y

    tiles = row_tiles(conv)

    def grid(meta):
        return (tiles(meta),)

    launch(conv_gemm_kernel)[grid](
        x2d, w2d, conv.bias, y, None, conv.M, conv.C, conv.K,
        x2d.stride(0), w2d.stride(0), y.stride(3), y.stride(1),
        A_TMA=False, B_TMA=False, Y_TMA=False, HAS_RES=False, **conv.constexprs,
    )  # fmt: skip
