"""Depthwise 2-D convolution (groups = C, weight (K, 1, R, S), K = C·multiplier), bias and
activation fused: the MobileNetV2 3x3 and ConvNeXt 7x7 layers, which the implicit GEMM cannot
serve (its reduction runs over all C input channels; here each output channel reads one).

A depthwise conv does 2·R·S FLOPs per output element against one input and one output element of
traffic: there is no reduction over channels to feed tl.dot (a 1-channel "GEMM" per channel would
be all padding), so both kernels here are stencils on CUDA cores, fp32 accumulation, bias and
activation applied once and the result rounded to the output dtype once. Padding is zero by
masked loads, at negative coordinates too. Every tensor is read by its strides, so NCHW works as
well (channels then gather element by element: correct, not the layout these are built for).

The sliding window (`conv_depthwise_sliding_kernel`; unit stride and dilation along W, up to 7x7,
which covers every stride-1 layer of MobileNetV2 and ConvNeXt): a program owns BLOCK_P output rows
by BLOCK_Q output columns of one image, one channel a thread. It walks the input columns one at a
time: a column's input rows are loaded once, as channel vectors, and each is multiplied into
every output row and tap that reads it, accumulating into S pending output columns per row; the
oldest is then complete and written, and the window slides. The weights, pending sums and the
column sit in registers (7x7, 8 rows: about 150), so each input element is loaded about
1 + (R - 1) / BLOCK_P times per program instead of R·S times, and the main loop is mostly FMAs.
One channel a thread is what keeps that state in registers: the channel strides are left
unspecialised so that Triton does not vectorise along them.

The tap tiles (`conv_depthwise_kernel`; stride-2 columns, dilated columns, larger filters): a
program owns BLOCK_P output pixels by BLOCK_C channels, channels innermost, and for every tap
loads the shifted (BLOCK_P, BLOCK_C) tile; neighbouring taps and programs hit L1 / L2. The filter
rows loop and each row's S taps unroll, so a row's S loads are in flight together (unrolling all
R·S taps hoisted every load: 255 registers and spills on sm_90).

The measurements (the tap tiles against the plain tap loop, both against cuDNN) are in
docs/kernels/conv.md.

Functions:
    depthwise_reference      F.conv2d(groups=C), the float64 reference of the tests
    conv_depthwise_kernel    @triton.jit, the tap tiles, autotuned over (BLOCK_P, BLOCK_C,
                             num_warps), with a hook-free copy for traced launches
    conv_depthwise_sliding_kernel
                             @triton.jit, the sliding window, autotuned over (BLOCK_P, BLOCK_Q,
                             num_warps), with a hook-free copy for traced launches
    is_depthwise             a (C, K, groups) conv these kernels compute
    slides                   the sliding window serves this stride, dilation and filter
    depthwise_conv2d         launch it into a preallocated output, through `launch`
    depthwise_step           the launch as a kernels._launch.Step (the dispatch's plans)
    depthwise_wgrad_kernel   @triton.jit: dW's per-channel, per-tap sums over a run of pixels
    depthwise_wgrad          dW of a depthwise conv (dX: backward.py, through depthwise_step)
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, direct, gpu_info, is_interpreter, next_power_of_2
from kernels._launch import PlanCache, Step
from kernels.conv.common import epilogue, traceable, tune_bench
from kernels.matmul import apply_activation


def depthwise_reference(x, weight, bias, stride, padding, dilation):
    # 2·N·K·P·Q·R·S FLOPs; reads N·C·H·W + K·R·S, writes N·K·P·Q elements (·bytes each)
    return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, x.shape[1])


# (BLOCK_P output pixels, BLOCK_C output channels, num_warps) for the H100, bf16 channels_last,
# 16 elements a thread but the last (72 registers on sm_90: 28 resident warps an SM). 64-channel
# tiles read 128-byte lines; 16- and 32-channel tiles divide 144 and 96 (MobileNetV2, ConvNeXt-T)
# with no idle channel tail, at the price of 32- / 64-byte runs per pixel.
DEPTHWISE_TILES = [
    (32, 64, 4),
    (64, 32, 4),
    (128, 16, 4),
    (64, 64, 8),
    (32, 32, 2),
    (64, 64, 4),  # 32 elements a thread: 96 registers, 20 resident warps
]


def depthwise_configs():
    """DEPTHWISE_TILES as configs; one small tile in the interpreter (nothing to tune there).
    num_stages=1: the tap loop's loads feed no tl.dot, so Triton's pipeliner leaves it alone."""
    tiles = [(32, 16, 4)] if is_interpreter() else DEPTHWISE_TILES
    return [triton.Config({"BLOCK_P": block_p, "BLOCK_C": block_c}, num_warps=num_warps,
                          num_stages=1) for block_p, block_c, num_warps in tiles]  # fmt: skip


def prune_depthwise(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem: more channels than K, more pixels than P·Q."""
    K, pixels = named_args["K"], named_args["P"] * named_args["Q"]
    kept = [cfg for cfg in configs
            if cfg.kwargs["BLOCK_C"] <= max(16, next_power_of_2(K))
            and cfg.kwargs["BLOCK_P"] <= max(32, next_power_of_2(pixels))]  # fmt: skip
    return kept or configs[-1:]


# Sizes that only bound loops and masks: not specialised on, so spatial sizes share compiles
SIZES_ONLY = ["N", "H", "W", "P", "Q", "pad_h", "pad_w", "dil_h", "dil_w"]
# The sizes and layouts that change the best tile
DEPTHWISE_KEY = ["N", "C", "H", "W", "K", "P", "Q", "R", "S", "conv_stride_h", "conv_stride_w",
                 "dil_h", "stride_xc", "stride_yk"]  # fmt: skip


@triton.autotune(
    configs=depthwise_configs(),
    key=DEPTHWISE_KEY,
    prune_configs_by={"early_config_prune": prune_depthwise},
    do_bench=tune_bench,
)
@triton.jit(do_not_specialize=SIZES_ONLY)
def conv_depthwise_kernel(
    # x: (N, C, H, W), w: (K, 1, R, S), bias: (K,) or None, y: (N, K, P, Q); all by strides
    x, w, bias_ptr, y,
    # sizes (the filter's R, S are compile-time: its column taps unroll)
    N, C, H, W, K, P, Q,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    # strides, in elements
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk, stride_wr, stride_ws,
    stride_yn, stride_yk, stride_yp, stride_yq,
    # filter, K // C, epilogue, tile
    R: tl.constexpr, S: tl.constexpr, MULTIPLIER: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # -- program-id mapping: axis 0 is (image, pixel block), pixel blocks fastest, so programs
    # that run together are spatial neighbours and share their halo rows in L2; axis 1 channels.
    # (2-D pixel patches, whose halo rows overlap inside a program, measured slower on an H100
    # for the 7x7 and the stride-2 layers: docs/kernels/conv.md.)
    pixel_blocks = tl.cdiv(P * Q, BLOCK_P)
    pid = tl.program_id(0)
    n = pid // pixel_blocks
    offs_p = (pid - n * pixel_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_k = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)

    # -- pointer setup: each pixel's window corner, each output channel's input channel --
    p_ok = offs_p < P * Q
    k_ok = offs_k < K
    p = offs_p // Q
    q = offs_p - p * Q
    ih0 = p * conv_stride_h - pad_h
    iw0 = q * conv_stride_w - pad_w
    x_img = x + n.to(tl.int64) * stride_xn  # int64: batch × image stride can pass 2^31
    x_chan = (offs_k // MULTIPLIER) * stride_xc
    w_chan = w + offs_k * stride_wk

    # -- main loop: one shifted (BLOCK_P, BLOCK_C) input tile per tap; filter rows loop, the S
    # taps of a row unroll, so a row's S loads are in flight together
    acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for r in range(R):
        ih = ih0 + r * dil_h
        row_ok = p_ok & (ih >= 0) & (ih < H)
        x_row = x_img + (ih * stride_xh)[:, None] + x_chan[None, :]
        for s in tl.static_range(S):
            iw = iw0 + s * dil_w
            pix_ok = row_ok & (iw >= 0) & (iw < W)  # zero padding reads 0
            xv = tl.load(x_row + (iw * stride_xw)[:, None], mask=pix_ok[:, None] & k_ok[None, :],
                         other=0.0)  # fmt: skip
            wv = tl.load(w_chan + r * stride_wr + s * stride_ws, mask=k_ok, other=0.0)
            acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]

    # -- write-back: bias + activation in fp32, one rounding, masked store --
    y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
    epilogue(acc, y, bias_ptr, y_row, offs_k, p_ok, k_ok, stride_yk, HAS_BIAS,
             ACTIVATION)  # fmt: skip


_TRACEABLE = traceable(conv_depthwise_kernel.configs, DEPTHWISE_KEY, conv_depthwise_kernel.fn)


# -- the sliding-window stencil (stride 1 and dilation 1 along W) ------------------------------
# (BLOCK_P output rows, BLOCK_Q output columns, num_warps). A program's tile is one pixel by
# BLOCK_C = 32·num_warps channels, a channel a thread: its R·S fp32 weights, BLOCK_P·S pending
# sums and the column's input rows all sit in registers (7x7, 8 rows: about 150). Rows and
# columns are loop counts, not tensor dims, so they need not be powers of 2: the 7- and 14-wide
# tiles divide the 7·2^k images of MobileNetV2 and ConvNeXt with no masked row or column step,
# which on a 7x7 image halves the steps of a 14-wide tile (docs/kernels/conv.md, "Depthwise").
SLIDING_TILES = [
    (8, 28, 1),
    (4, 28, 1),
    (8, 14, 1),
    (4, 14, 1),
    (8, 28, 2),
    (4, 56, 1),
    (2, 28, 1),
    (7, 14, 1),
    (7, 7, 1),
    (4, 7, 1),
]


def sliding_configs():
    tiles = [(2, 5, 1)] if is_interpreter() else SLIDING_TILES
    return [triton.Config({"BLOCK_P": bp, "BLOCK_Q": bq, "BLOCK_C": 32 * nw}, num_warps=nw,
                          num_stages=1) for bp, bq, nw in tiles]  # fmt: skip


def prune_sliding(configs, named_args, **kwargs):
    """Drop tiles with more rows, columns or channels than the output has (beyond the
    smallest)."""
    K, P, Q = named_args["K"], named_args["P"], named_args["Q"]
    kept = [cfg for cfg in configs
            if cfg.kwargs["BLOCK_P"] <= max(2, next_power_of_2(P))
            and cfg.kwargs["BLOCK_Q"] <= max(14, Q)
            and cfg.kwargs["BLOCK_C"] <= max(32, next_power_of_2(K))]  # fmt: skip
    return kept or configs[-1:]


@triton.jit
def _zero_vectors(COUNT: tl.constexpr, BLOCK_C: tl.constexpr):
    """A tuple of COUNT fp32 (BLOCK_C,) zeros: the sliding kernels' per-thread sums."""
    zero = tl.zeros((BLOCK_C,), dtype=tl.float32)
    vectors = ()
    for _ in tl.static_range(COUNT):
        vectors = vectors + (zero,)
    return vectors


@triton.jit
def _input_column(x_col, ih0, H, stride_xh, col_ok, IN_ROWS: tl.constexpr):
    """Input rows ih0 .. ih0 + IN_ROWS - 1 of one column (x_col: its channels' pointers), a
    channel vector each, in fp32; zero above or below the image and where col_ok is false."""
    rows = ()
    for j in tl.static_range(IN_ROWS):
        ih = ih0 + j
        xv = tl.load(x_col + ih * stride_xh, mask=col_ok & (ih >= 0) & (ih < H), other=0.0)
        rows = rows + (xv.to(tl.float32),)
    return rows


# The sizes, filter and layouts that change the best tile
SLIDING_KEY = ["N", "C", "H", "W", "K", "P", "Q", "R", "S", "CONV_STRIDE_H", "DIL_H", "stride_xc",
               "stride_yk"]  # fmt: skip


@triton.autotune(
    configs=sliding_configs(),
    key=SLIDING_KEY,
    prune_configs_by={"early_config_prune": prune_sliding},
    do_bench=tune_bench,
)
# the channel strides are not specialised: left unknown, Triton keeps one channel a thread (no
# vectorised channel runs), which is what keeps the per-channel state in registers
@triton.jit(do_not_specialize=SIZES_ONLY + ["stride_xc", "stride_yk"])
def conv_depthwise_sliding_kernel(
    # x: (N, C, H, W), w: (K, 1, R, S), bias: (K,) or None, y: (N, K, P, Q); all by strides
    x, w, bias_ptr, y,
    # sizes; stride and dilation along W are 1
    N, C, H, W, K, P, Q, pad_h, pad_w,
    # strides, in elements
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk, stride_wr, stride_ws,
    stride_yn, stride_yk, stride_yp, stride_yq,
    # filter and its row stride / dilation, K // C, epilogue, tile
    R: tl.constexpr, S: tl.constexpr, CONV_STRIDE_H: tl.constexpr, DIL_H: tl.constexpr,
    MULTIPLIER: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # -- program-id mapping: axis 0 is (image, row block, column block), columns fastest;
    # axis 1 channels
    row_blocks = tl.cdiv(P, BLOCK_P)
    col_blocks = tl.cdiv(Q, BLOCK_Q)
    pid = tl.program_id(0)
    n = pid // (row_blocks * col_blocks)
    rest = pid - n * (row_blocks * col_blocks)
    row_block = rest // col_blocks
    p0 = row_block * BLOCK_P
    q0 = (rest - row_block * col_blocks) * BLOCK_Q
    offs_k = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K

    # -- the program's constants: R·S weight vectors; how many input rows its BLOCK_P output
    # rows read (IN_ROWS); the column pointers of image n
    taps = ()
    for rs in tl.static_range(R * S):
        wv = tl.load(w + offs_k * stride_wk + (rs // S) * stride_wr + (rs % S) * stride_ws,
                     mask=k_ok, other=0.0)  # fmt: skip
        taps = taps + (wv.to(tl.float32),)
    IN_ROWS: tl.constexpr = (BLOCK_P - 1) * CONV_STRIDE_H + (R - 1) * DIL_H + 1
    ih0 = p0 * CONV_STRIDE_H - pad_h
    x_col0 = x + n.to(tl.int64) * stride_xn + (offs_k // MULTIPLIER) * stride_xc
    y_col0 = y + n.to(tl.int64) * stride_yn + offs_k * stride_yk
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)

    # -- main loop: one input column a step. Its IN_ROWS channel vectors are loaded once; each
    # feeds every output row and tap that reads it. pending[i·S + j] is output row p0 + i at
    # column q0 + t - (S - 1) + j, so tap (r, s) of row i lands in pending[i·S + S - 1 - s];
    # pending[i·S] is then complete: written, and the window slides one column.
    zero = tl.zeros((BLOCK_C,), dtype=tl.float32)
    pending = _zero_vectors(BLOCK_P * S, BLOCK_C)
    for t in range(BLOCK_Q + S - 1):
        iw = q0 - pad_w + t
        col_ok = k_ok & (iw >= 0) & (iw < W)
        rows = _input_column(x_col0 + iw * stride_xw, ih0, H, stride_xh, col_ok, IN_ROWS)
        summed = ()
        for i in tl.static_range(BLOCK_P):
            for j in tl.static_range(S):
                acc = pending[i * S + j]
                for r in tl.static_range(R):
                    acc += rows[i * CONV_STRIDE_H + r * DIL_H] * taps[r * S + S - 1 - j]
                summed = summed + (acc,)
        q = q0 + t - (S - 1)
        q_ok = k_ok & (q >= q0) & (q < Q)
        nxt = ()
        for i in tl.static_range(BLOCK_P):
            out = summed[i * S]
            if HAS_BIAS:
                out += bias
            out = apply_activation(out, ACTIVATION)
            tl.store(y_col0 + (p0 + i) * stride_yp + q * stride_yq, out.to(y.dtype.element_ty),
                     mask=q_ok & (p0 + i < P))  # fmt: skip
            nxt = nxt + summed[i * S + 1:(i + 1) * S] + (zero,)
        pending = nxt


_TRACEABLE_SLIDING = traceable(conv_depthwise_sliding_kernel.configs, SLIDING_KEY,
                               conv_depthwise_sliding_kernel.fn)  # fmt: skip


def is_depthwise(C: int, K: int, groups: int) -> bool:
    """A grouped conv this kernel computes: one group per input channel, K a multiple of C."""
    return groups == C and K % C == 0


def depthwise_conv2d(x, weight, bias, y, stride_hw, padding_lo_hw, dilation_hw, act_id, *,
                     launch=direct):  # fmt: skip
    """y = act(conv2d(x, weight, bias, groups=C)), written into the preallocated y; returns y.

    x (N, C, H, W), weight (K, 1, R, S) with K % C == 0 (output channel k reads input channel
    k // (K / C)), bias (K,) or None, y (N, K, P, Q): any strides, one dtype. P, Q are taken from
    y, so padding_lo_hw is only the top / left padding; the bottom / right padding is whatever P,
    Q imply (asymmetric padding). act_id is a kernels._common.ACTIVATIONS id. `launch` is
    kernels._common.direct, or torch.library.wrap_triton for a traced launch (which runs the
    hook-free copy of the autotuner)."""
    N, C, H, W = x.shape
    K, one, R, S = weight.shape
    if one != 1 or K % C != 0:
        raise ValueError(f"weight {tuple(weight.shape)} is not depthwise for {C} input channels")
    if y.dim() != 4 or tuple(y.shape[:2]) != (N, K):
        raise ValueError(f"y has shape {tuple(y.shape)}, expected ({N}, {K}, P, Q)")
    if bias is not None and tuple(bias.shape) != (K,):
        raise ValueError(f"bias has shape {tuple(bias.shape)}, expected ({K},)")
    if y.numel() == 0:
        return y
    depthwise_step(x, weight, bias, y, stride_hw, padding_lo_hw, dilation_hw, act_id,
                   launch=launch).once(x, weight, bias, y)  # fmt: skip
    return y


# The most taps the sliding window keeps in registers (7x7); larger filters take the tap tiles
SLIDING_MAX_TAPS = 49


def slides(stride_hw, dilation_hw, kernel_rs) -> bool:
    """The sliding-window stencil serves the call: unit stride and dilation along W (the window
    slides one input column a step), and at most SLIDING_MAX_TAPS taps. Otherwise (stride-2
    layers, dilated columns, large filters) the tap-tile stencil does."""
    R, S = kernel_rs
    return tuple(stride_hw)[1] == 1 and tuple(dilation_hw)[1] == 1 and R * S <= SLIDING_MAX_TAPS


def depthwise_step(x, weight, bias, y, stride_hw, padding_lo_hw, dilation_hw, act_id, *,
                   launch=direct) -> Step:  # fmt: skip
    """depthwise_conv2d's launch as a kernels._launch.Step over (x, weight, bias, y), for
    kernels/conv/dispatch.py's plans; no checks (depthwise_conv2d's are the caller's)."""
    N, C, H, W = x.shape
    K, _, R, S = weight.shape
    P, Q = y.shape[2:]
    if slides(stride_hw, dilation_hw, (R, S)):
        kernel = conv_depthwise_sliding_kernel if launch is direct else _TRACEABLE_SLIDING

        def grid(meta):
            rows, cols = cdiv(P, meta["BLOCK_P"]), cdiv(Q, meta["BLOCK_Q"])
            return (N * rows * cols, cdiv(K, meta["BLOCK_C"]))

        return Step(
            launch(kernel), grid,
            (N, C, H, W, K, P, Q, *padding_lo_hw,
             *x.stride(),
             weight.stride(0), weight.stride(2), weight.stride(3),
             *y.stride()),
            dict(R=R, S=S, CONV_STRIDE_H=stride_hw[0], DIL_H=dilation_hw[0], MULTIPLIER=K // C,
                 HAS_BIAS=bias is not None, ACTIVATION=act_id),
        )  # fmt: skip
    kernel = conv_depthwise_kernel if launch is direct else _TRACEABLE

    def grid(meta):
        return (N * cdiv(P * Q, meta["BLOCK_P"]), cdiv(K, meta["BLOCK_C"]))

    return Step(
        launch(kernel), grid,
        (N, C, H, W, K, P, Q,
         *stride_hw, *padding_lo_hw, *dilation_hw,
         *x.stride(),
         weight.stride(0), weight.stride(2), weight.stride(3),
         *y.stride()),
        dict(R=R, S=S, MULTIPLIER=K // C, HAS_BIAS=bias is not None, ACTIVATION=act_id),
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Backward. dX of a depthwise conv is a depthwise conv of dZ with the taps flipped (backward.py
# splits it into stride phases, as for any conv, and runs each through depthwise_step). dW is a
# per-channel reduction over every output pixel for each tap: memory-bound like the forward, so
# a stencil again, not a GEMM.
# ---------------------------------------------------------------------------------------------
WGRAD_BLOCK_P = 64  # output pixels a step: one (BLOCK_P, BLOCK_C) dZ tile, reused by every tap
WGRAD_PROGRAMS = 2  # programs an SM: pixel splits = this x SMs / channel blocks


@triton.jit(do_not_specialize=SIZES_ONLY + ["pixels_per_split"])
def depthwise_wgrad_kernel(
    # dz: (N, K, P, Q), x: (N, C, H, W) by strides; ws: fp32 (splits, K, R·S) partial sums
    dz, x, ws,
    # sizes
    N, C, H, W, K, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    # strides, in elements
    stride_zn, stride_zk, stride_zp, stride_zq,
    stride_xn, stride_xc, stride_xh, stride_xw,
    pixels_per_split,
    # K // C, the taps padded to a power of 2, tile
    MULTIPLIER: tl.constexpr, TAPS: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # -- program-id mapping: axis 0 channel blocks, axis 1 this program's run of output pixels
    offs_k = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    split = tl.program_id(1)
    lo = split * pixels_per_split
    hi = tl.minimum(lo + pixels_per_split, N * P * Q)
    x_chan = (offs_k // MULTIPLIER) * stride_xc
    taps = tl.arange(0, TAPS)
    acc = tl.zeros((TAPS, BLOCK_C), dtype=tl.float32)  # row r·S + s: that tap's channel sums

    # -- main loop: a dZ tile, then per tap the shifted x tile it multiplies, summed over pixels
    for start in range(lo, hi, BLOCK_P):
        offs = start + tl.arange(0, BLOCK_P)
        ok = offs < hi
        n = offs // (P * Q)
        pq = offs - n * (P * Q)
        p = pq // Q
        q = pq - p * Q
        z_ptrs = dz + (n.to(tl.int64) * stride_zn + p * stride_zp + q * stride_zq)[:, None]
        dzv = tl.load(z_ptrs + (offs_k * stride_zk)[None, :], mask=ok[:, None] & k_ok[None, :],
                      other=0.0).to(tl.float32)  # fmt: skip
        ih0 = p * conv_stride_h - pad_h
        iw0 = q * conv_stride_w - pad_w
        x_img = n.to(tl.int64) * stride_xn  # each pixel's image (int64: can pass 2^31)
        for rs in range(R * S):
            r = rs // S
            s = rs - r * S
            ih = ih0 + r * dil_h
            iw = iw0 + s * dil_w
            pix_ok = ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            x_ptrs = x + (x_img + ih * stride_xh + iw * stride_xw)[:, None] + x_chan[None, :]
            xv = tl.load(x_ptrs, mask=pix_ok[:, None] & k_ok[None, :], other=0.0)
            part = tl.sum(xv.to(tl.float32) * dzv, axis=0)
            acc = tl.where((taps == rs)[:, None], acc + part[None, :], acc)

    # -- write-back: this split's (K, R·S) slab of fp32 partial sums --
    slab = ws + split.to(tl.int64) * (K * R * S)
    ptrs = slab + offs_k[None, :] * (R * S) + taps[:, None]
    tl.store(ptrs, acc, mask=(taps < R * S)[:, None] & k_ok[None, :])


# The sliding-window wgrad: output rows a step (the forward's sliding tile), programs an SM
WGRAD_SLIDING_ROWS = 4
WGRAD_SLIDING_PROGRAMS = 8


@triton.jit(do_not_specialize=SIZES_ONLY + ["stride_zk", "stride_xc", "blocks_per_split"])
def depthwise_wgrad_sliding_kernel(
    # dz: (N, K, P, Q), x: (N, C, H, W) by strides; ws: fp32 (splits, K, R·S) partial sums
    dz, x, ws,
    # sizes; stride and dilation along W are 1
    N, C, H, W, K, P, Q, pad_h, pad_w,
    # strides, in elements
    stride_zn, stride_zk, stride_zp, stride_zq,
    stride_xn, stride_xc, stride_xh, stride_xw,
    blocks_per_split,
    # filter and its row stride / dilation, K // C, tile (one channel a thread)
    R: tl.constexpr, S: tl.constexpr, CONV_STRIDE_H: tl.constexpr, DIL_H: tl.constexpr,
    MULTIPLIER: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    # -- program-id mapping: axis 0 channel blocks; axis 1 this program's run of (image, row
    # block) pairs, BLOCK_P output rows each
    offs_k = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    k_ok = offs_k < K
    row_blocks = tl.cdiv(P, BLOCK_P)
    lo = tl.program_id(1) * blocks_per_split
    hi = tl.minimum(lo + blocks_per_split, N * row_blocks)
    IN_ROWS: tl.constexpr = (BLOCK_P - 1) * CONV_STRIDE_H + (R - 1) * DIL_H + 1
    sums = _zero_vectors(R * S, BLOCK_C)  # sums[r·S + s]: tap (r, s)'s channel sums

    # -- main loop: per row block, walk the input columns. recent[i·S + s] is dZ of output row
    # p0 + i at column t - s, the column that input column t - pad_w meets through tap s; each
    # loaded input row feeds every (row, tap) that reads it.
    for blk in range(lo, hi):
        n = blk // row_blocks
        p0 = (blk - n * row_blocks) * BLOCK_P
        ih0 = p0 * CONV_STRIDE_H - pad_h
        x_col0 = x + n.to(tl.int64) * stride_xn + (offs_k // MULTIPLIER) * stride_xc
        z_col0 = dz + n.to(tl.int64) * stride_zn + offs_k * stride_zk
        recent = _zero_vectors(BLOCK_P * S, BLOCK_C)
        for t in range(Q + S - 1):
            shifted = ()
            for i in tl.static_range(BLOCK_P):
                z_ok = k_ok & (t < Q) & (p0 + i < P)
                zv = tl.load(z_col0 + (p0 + i) * stride_zp + t * stride_zq, mask=z_ok, other=0.0)
                shifted = shifted + (zv.to(tl.float32),) + recent[i * S:(i + 1) * S - 1]
            recent = shifted
            iw = t - pad_w
            col_ok = k_ok & (iw >= 0) & (iw < W)
            rows = _input_column(x_col0 + iw * stride_xw, ih0, H, stride_xh, col_ok, IN_ROWS)
            summed = ()
            for r in tl.static_range(R):
                for s in tl.static_range(S):
                    acc = sums[r * S + s]
                    for i in tl.static_range(BLOCK_P):
                        acc += rows[i * CONV_STRIDE_H + r * DIL_H] * recent[i * S + s]
                    summed = summed + (acc,)
            sums = summed

    # -- write-back: this split's (K, R·S) slab of fp32 partial sums --
    slab = ws + tl.program_id(1).to(tl.int64) * (K * R * S) + offs_k * (R * S)
    for rs in tl.static_range(R * S):
        tl.store(slab + rs, sums[rs], mask=k_ok)


# depthwise wgrad launches of direct calls, per geometry (WgradPlan)
_WGRAD_PLANS = PlanCache()


def depthwise_wgrad(dz, x, kernel_rs, stride_hw, padding_lo_hw, dilation_hw, *, launch=direct,
                    splits=None):  # fmt: skip
    """dW (K, 1, R, S) of a depthwise conv, contiguous, in x's dtype: per output channel k and
    tap (r, s), the sum over every output pixel of dZ[k] times the input channel k // (K / C)
    shifted by the tap. Where the forward slides (`slides`), the sliding wgrad, else the tap
    tiles. Splits (grid axis 1: runs of row blocks, or of output pixels) write fp32 partial slabs
    that wgrad.wgrad_split_sum_kernel adds in a fixed order (deterministic). `splits` forces the
    split count (tests); by default enough programs to fill the GPU. Direct calls keep both
    launches per geometry (armed steps)."""
    plan, planned = wgrad_plan(dz, x, kernel_rs, stride_hw, padding_lo_hw, dilation_hw, launch,
                               splits)  # fmt: skip
    K = dz.shape[1]
    R, S = kernel_rs
    dw = torch.empty((K, 1, R, S), device=x.device, dtype=x.dtype)
    run_wgrad(plan, dz, x, dw, wgrad_workspace(plan, dw), armed=planned)
    return dw


class WgradPlan(NamedTuple):
    """A depthwise wgrad's two launches: the partial sums over `splits` runs of pixels into an
    fp32 workspace of (splits, K·R·S), and their sum into dW."""

    splits: int
    main: Step  # over (dz, x, ws)
    reduce: Step  # over (ws, dw)


def wgrad_plan(dz, x, kernel_rs, stride_hw, padding_lo_hw, dilation_hw, launch=direct,
               splits=None) -> tuple[WgradPlan, bool]:  # fmt: skip
    """depthwise_wgrad's launches for this geometry, and whether they are kept (a direct call's,
    in _WGRAD_PLANS, so the backward's plan can hold them)."""
    from kernels.conv.wgrad import split_sum_step

    planned = launch is direct and not torch.compiler.is_compiling()
    key = None
    if planned:
        key = (dz.shape, dz.stride(), x.shape, x.stride(), dz.dtype, dz.device, tuple(kernel_rs),
               tuple(stride_hw), tuple(padding_lo_hw), tuple(dilation_hw), splits)  # fmt: skip
        plan = _WGRAD_PLANS.get(key)
        if plan is not None:
            return plan, True
    info = gpu_info(x.device)
    sms = info.sms if info is not None else 2
    if slides(stride_hw, dilation_hw, kernel_rs):
        main, splits = _sliding_wgrad_step(dz, x, kernel_rs, stride_hw, padding_lo_hw,
                                           dilation_hw, launch, splits, sms)  # fmt: skip
    else:
        main, splits = _tap_wgrad_step(dz, x, kernel_rs, stride_hw, padding_lo_hw, dilation_hw,
                                       launch, splits, sms)  # fmt: skip
    plan = WgradPlan(splits, main, split_sum_step(dz.shape[1] * kernel_rs[0] * kernel_rs[1],
                                                  splits, launch))  # fmt: skip
    if planned:
        _WGRAD_PLANS.put(key, plan)
    return plan, planned


def wgrad_workspace(plan: WgradPlan, dw: torch.Tensor) -> torch.Tensor:
    """The fp32 partial sums' workspace of a wgrad plan writing dw."""
    return torch.empty((plan.splits * dw.numel(),), device=dw.device, dtype=torch.float32)


def run_wgrad(plan: WgradPlan, dz, x, dw, ws, armed: bool = True) -> None:
    """A wgrad plan's launches into dw (contiguous (K, 1, R, S)) through workspace ws; armed:
    through the steps' armed launches (a kept plan), else once through the JIT."""
    if armed:
        plan.main(dz, x, ws)
        plan.reduce(ws, dw)
    else:  # built for this call alone: not worth arming
        plan.main.once(dz, x, ws)
        plan.reduce.once(ws, dw)


def _tap_wgrad_step(dz, x, kernel_rs, stride_hw, padding_lo_hw, dilation_hw, launch, splits,
                    sms):  # fmt: skip
    """depthwise_wgrad_kernel's launch over (dz, x, ws) and its split count: runs of output
    pixels, enough to fill the GPU (or `splits`)."""
    N, K, P, Q = dz.shape
    _, C, H, W = x.shape
    R, S = kernel_rs
    block_c = 32 if K >= 32 else 16
    pixels = N * P * Q
    if splits is None:
        programs = WGRAD_PROGRAMS * sms
        splits = max(1, min(cdiv(pixels, WGRAD_BLOCK_P), programs // cdiv(K, block_c)))
    per_split = cdiv(max(pixels, 1), splits)
    splits = cdiv(max(pixels, 1), per_split)
    return Step(
        launch(depthwise_wgrad_kernel), (cdiv(K, block_c), splits),
        (N, C, H, W, K, P, Q, R, S, *stride_hw, *padding_lo_hw, *dilation_hw,
         *dz.stride(), *x.stride(), per_split),
        dict(MULTIPLIER=K // C, TAPS=next_power_of_2(R * S), BLOCK_P=WGRAD_BLOCK_P,
             BLOCK_C=block_c, num_warps=4),
    ), splits  # fmt: skip


def _sliding_wgrad_step(dz, x, kernel_rs, stride_hw, padding_lo_hw, dilation_hw, launch, splits,
                        sms):  # fmt: skip
    """depthwise_wgrad_sliding_kernel's launch over (dz, x, ws) and its split count: runs of
    (image, row block) pairs, WGRAD_SLIDING_PROGRAMS one-warp programs an SM (or `splits`)."""
    N, K, P, Q = dz.shape
    _, C, H, W = x.shape
    R, S = kernel_rs
    blocks = N * cdiv(P, WGRAD_SLIDING_ROWS)
    if splits is None:
        splits = max(1, min(blocks, WGRAD_SLIDING_PROGRAMS * sms // cdiv(K, 32)))
    per_split = cdiv(max(blocks, 1), splits)
    splits = cdiv(max(blocks, 1), per_split)
    return Step(
        launch(depthwise_wgrad_sliding_kernel), (cdiv(K, 32), splits),
        (N, C, H, W, K, P, Q, *padding_lo_hw, *dz.stride(), *x.stride(), per_split),
        dict(R=R, S=S, CONV_STRIDE_H=stride_hw[0], DIL_H=dilation_hw[0], MULTIPLIER=K // C,
             BLOCK_P=WGRAD_SLIDING_ROWS, BLOCK_C=32, num_warps=1),
    ), splits  # fmt: skip
