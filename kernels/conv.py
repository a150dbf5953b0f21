"""2-D convolution as an implicit GEMM on channels-last data, bias and activation fused.

GEMM view: rows are the output pixels (M = N·P·Q), columns the output channels (K), and the
reduction runs over the filter taps (R·S·C). The input patches are gathered on the fly (no
im2col buffer). The weight is used as a (K, R·S·C) row-major matrix with the reduction ordered
(r, s, c): that is exactly the memory of a channels_last weight (K, C, R, S), so "packing" is
`weight.contiguous(memory_format=torch.channels_last)` and costs nothing when the weight already is
channels_last (see pack_conv_weight). Three paths, picked per call:

    gemm      1x1, stride 1, no padding, on an NHWC input: x is then an (N·H·W, C) matrix and the
              conv is one plain GEMM (conv_gemm_kernel); on Hopper both operands come in by TMA.
    implicit  everything else with C >= 16 (conv_implicit_kernel): one flat loop over
              (r, s, c-block) steps, so Triton's software pipeliner sees a single loop. Each step
              loads, per output pixel, one contiguous run of BLOCK_K channels (NHWC), with the
              pixel's (n, p, q) decoded once before the loop and the step's (r, s, c0) decoded as
              scalars. On Hopper the weight tile comes in by TMA.
    flat      few input channels (the C=3 stem, conv_flat_kernel): the reduction is the flat
              index over (r, s, c), padded only to BLOCK_K, not C padded to 16 per tap.

Round 3 (kernels/notes/conv.md), selectable per call and by module switches, off by default:
    gemm_persistent  the 1x1 GEMM as a persistent loop (conv_gemm_persistent_kernel): one or two
              programs per SM walk the tiles, so one tile's epilogue overlaps the next's loads.
    matmul    the 1x1 GEMM through kernels.matmul.fused_matmul (its persistent TMA kernel).
    split_k   implicit / window convs split their (r, s, c) reduction over grid axis 1, in one
              launch: each program stores an fp32 partial tile, the last to arrive for a tile sums
              them and runs the bias / activation epilogue once (_split_k_gather).
GEMM_1X1_PATH and AUTO_SPLIT_K make auto take them.

The epilogue adds the bias and applies the activation in fp32, then rounds once to the output
dtype. NCHW inputs are read in place by strided loads (consecutive output pixels are consecutive
addresses there, so the loads still coalesce, along the rows instead of the channels): on the H100
that beat converting x to channels_last first (`nchw="convert"`, one extra pass over x inside the
call) by 1.4-2x. The output follows the input's layout.
"""


import torch
import triton
import triton.language as tl

from kernels._common import (
    Launcher,
    activation_id,
    cdiv,
    check_same,
    check_tensor,
    direct,
    dot_precision,
    gpu_info,
    gpu_ms_per_call,
    is_interpreter,
    next_power_of_2,
    tile_counters,
)
from kernels.matmul import apply_activation, fused_matmul, grouped_tile

try:  # host-side TMA descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: pointer loads only
    TensorDescriptor = None


PATHS = ("gemm", "implicit", "flat", "window", "gemm_persistent", "matmul",
         "window_persistent")  # fmt: skip

# Round-3 switches (module globals so a probe or a caller can flip them; see kernels/notes/conv.md
# "Round 3"). GEMM_1X1_PATH: the path auto picks for 1x1 stride-1 NHWC convs: "gemm" (one program
# per tile), "gemm_persistent" (conv_gemm_persistent_kernel: one program per SM looping over the
# tiles) or "matmul" (kernels.matmul.fused_matmul, its persistent TMA kernel).
GEMM_1X1_PATH = "gemm_persistent"  # round 3: 0.922 vs 0.836 of cuDNN over the 12 1x1 layers
# WINDOW_PATH: the path auto picks where the window kernel applies (stride-1 filters on 14x14 and
# larger images): "window" or "window_persistent" (conv_window_persistent_kernel).
WINDOW_PATH = "window"
# AUTO_SPLIT_K: let auto split the reduction of implicit / window convs with too few output tiles
# to fill the GPU (see _auto_split_k); False keeps split_k=1 unless a caller asks for it.
AUTO_SPLIT_K = True  # round 3: split 2 won 1.12-1.15x on the two 100-tile 3x3 layers
# The largest split _auto_split_k picks (it doubles: 1, 2, 4, ...), and the fewest 64-channel
# reduction steps it leaves per split.
AUTO_SPLIT_MAX = 2  # split 4 spilled (255 registers) and lost on every layer in round 3
AUTO_SPLIT_MIN_STEPS = 18
# Software pipelining across tile boundaries in the persistent gemm loop (tl.range flatten).
GEMM_FLATTEN = True
# Extra keyword arguments for kernels.matmul.fused_matmul on the "matmul" path (e.g. a variant
# that module offers); empty: its automatic choice.
MATMUL_KWARGS: dict = {}

# The last directly launched kernel: (autotuned kernel, compiled kernel), for the probe's report of
# the winning config and its registers, spills and shared memory.
last_launch: list = [None]


def conv2d_reference(x, weight, bias, stride, padding, dilation):
    # 2·N·K·P·Q·C·R·S FLOPs; reads N·C·H·W + K·C·R·S, writes N·K·P·Q elements (·bytes each)
    return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation)


# ---------------------------------------------------------------------------------------------
# Shared @triton.jit helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def _bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS: tl.constexpr,
                     ACTIVATION: tl.constexpr):  # fmt: skip
    """bias + activation on the fp32 accumulator."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    return apply_activation(acc, ACTIVATION)


@triton.jit
def _epilogue(acc, y_ptr, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk,
              HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):  # fmt: skip
    """bias + activation in fp32, one rounding, masked store; y_row is each row's offset."""
    acc = _bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
    y_ptrs = y_ptr + y_row[:, None] + offs_n[None, :] * stride_yk
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _split_k_gather(acc, ws_ptr, lock_ptr, tile, split, SPLIT_K: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """Split-K in one launch, last-arriving program reduces: every program stores its fp32 partial
    tile in the workspace (tile-local (SPLIT_K, BLOCK_M, BLOCK_N) slots, no masks), then bumps the
    tile's counter. The program that finds SPLIT_K - 1 there sums all the slots (L2 loads) and
    returns (sum, True); it also resets the counter to 0, so the cached counters stay zero between
    calls. No program ever waits on another, so no scheduling order can deadlock."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    base = ws_ptr + tile.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(base + split * (BLOCK_M * BLOCK_N) + offs, acc, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's partial is written before the counter moves
    count = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = count == SPLIT_K - 1
    if last:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(base + s * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
        tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")
    return acc, last


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------
def _config(block_m, block_n, block_k, num_stages, num_warps, group_m=8):
    meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m}
    return triton.Config(meta, num_stages=num_stages, num_warps=num_warps,
                         pre_hook=_set_tma_blocks)  # fmt: skip


def _window_config(block_h, block_w, block_n, block_k, num_stages, num_warps, group_m=8):
    meta = {"BLOCK_H": block_h, "BLOCK_W": block_w, "BLOCK_N": block_n, "BLOCK_K": block_k,
            "GROUP_M": group_m}  # fmt: skip
    return triton.Config(meta, num_stages=num_stages, num_warps=num_warps,
                         pre_hook=_set_tma_blocks)  # fmt: skip


def _set_tma_blocks(nargs):
    """Autotune pre-hook: give the TMA descriptors (when used) the block shape of this config."""
    block_n, block_k = nargs["BLOCK_N"], nargs["BLOCK_K"]
    if "BLOCK_H" in nargs:  # the window kernel's 4-D boxes: one image, BLOCK_H x BLOCK_W pixels
        x_block = [1, nargs["BLOCK_H"], nargs["BLOCK_W"], block_k]
        y_block = [1, nargs["BLOCK_H"], nargs["BLOCK_W"], block_n]
    else:
        x_block = [nargs["BLOCK_M"], block_k]
        y_block = [nargs["BLOCK_M"], block_n]
    for name, shape in (("x", x_block), ("w", [block_n, block_k]), ("y", y_block)):
        arg = nargs.get(name)
        if TensorDescriptor is not None and isinstance(arg, TensorDescriptor):
            arg.block_shape = shape


# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps). fp16/bf16 on H100: 64 channels per step
# (128-byte rows, the widest TMA/wgmma swizzle). The lists keep the configs that won or came
# within ~10 % on some ResNet-50 layer in the H100 probe (round 2, kernels/notes/conv.md);
# fp32 configs that run out of shared memory fail to compile and the autotuner skips them.
IMPLICIT_TILES = [
    (128, 64, 64, 4, 4),  # K = 64 output channels at 56x56
    (256, 128, 64, 3, 8),
    (64, 128, 64, 4, 4),  # most 28x28 / 14x14 / 7x7 layers (few rows: more tiles)
    (128, 256, 64, 3, 8),
    (128, 128, 32, 4, 4),
    (128, 128, 64, 4, 8),
    (64, 64, 64, 4, 4),
]
GEMM_TILES = [
    (128, 64, 64, 4, 4),
    (256, 128, 64, 3, 8),
    (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 128, 64, 4, 4),
    (128, 128, 64, 4, 8),
    (128, 256, 64, 3, 8),
]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps, programs per SM) of the persistent 1x1 kernel
# (round 3, not yet measured): the gemm tiles that won in round 2, with one or two resident
# programs per SM (two let one program's epilogue overlap the other's loads).
GEMM_PERSISTENT_TILES = [
    (128, 64, 64, 4, 4, 2),
    (128, 128, 64, 4, 8, 1),
    (128, 128, 64, 3, 4, 2),
    (256, 128, 64, 3, 8, 1),
    (128, 256, 64, 3, 8, 1),
    (64, 128, 64, 4, 4, 2),
]
# (BLOCK_H, BLOCK_W, BLOCK_N, BLOCK_K, num_stages, num_warps): output tiles of BLOCK_H x BLOCK_W
# pixels of one image (8 | 56 and 7 | 28 leave no ragged edge at 8x8 / 4x... for the big layers)
WINDOW_TILES = [
    (16, 16, 64, 64, 3, 8),  # K = 64 at 56x56
    (8, 8, 64, 64, 4, 4),
    (16, 8, 128, 64, 4, 8),  # 28x28
    (8, 16, 128, 64, 4, 8),  # 14x14
    (4, 32, 128, 64, 4, 8),
    (8, 8, 128, 64, 4, 4),
]
# (BLOCK_H, BLOCK_W, BLOCK_N, BLOCK_K, num_stages, num_warps, programs per SM) of the persistent
# window kernel (round 3, not yet measured): the round-2 window tiles of the 56x56 / 28x28 layers
# (9-18 reduction steps per tile, so the epilogue is a large share of each tile's time)
WINDOW_PERSISTENT_TILES = [
    (16, 16, 64, 64, 3, 8, 1),
    (8, 8, 64, 64, 4, 4, 2),
    (16, 8, 64, 64, 4, 4, 2),
    (16, 8, 128, 64, 4, 8, 1),
    (8, 16, 128, 64, 4, 8, 1),
]
FLAT_TILES = [
    (128, 64, 32, 4, 4),
    (256, 64, 32, 3, 8),
    (64, 64, 32, 4, 4),
]


def _configs(tiles):
    if is_interpreter():  # nothing to tune; tl.dot needs dims >= 16
        return [_config(32, 32, 16, 1, 4, group_m=2)]
    return [_config(*tile) for tile in tiles]


def _persistent_configs():
    if is_interpreter():
        return [_config(32, 32, 16, 1, 4, group_m=2)]
    configs = []
    for *tile, per_sm in GEMM_PERSISTENT_TILES:
        config = _config(*tile)
        config.kwargs["PER_SM"] = per_sm
        configs.append(config)
    return configs


def _window_configs():
    if is_interpreter():
        return [_window_config(4, 8, 32, 16, 1, 4, group_m=2)]
    return [_window_config(*tile) for tile in WINDOW_TILES]


def _window_persistent_configs():
    if is_interpreter():
        return [_window_config(4, 8, 32, 16, 1, 4, group_m=2)]
    configs = []
    for *tile, per_sm in WINDOW_PERSISTENT_TILES:
        config = _window_config(*tile)
        config.kwargs["PER_SM"] = per_sm
        configs.append(config)
    return configs


def _prune(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem (K output channels, M rows) and, under TMA, tiles
    whose channel step does not divide C (the weight tile would run into the next tap)."""
    K, M = named_args["K"], named_args["M"]
    c_gemm = named_args.get("C")
    # the implicit kernel's weight tile spans C only within one tap; past C it would read the
    # next tap's weights (the gemm kernel's descriptors end at C and zero-fill instead)
    split_taps = kwargs.get("B_TMA", False) and "R" in named_args
    split = kwargs.get("SPLIT_K", 1) > 1
    kept = []
    for config in configs:
        meta = dict(config.kwargs)
        if "BLOCK_H" in meta:
            meta["BLOCK_M"] = meta["BLOCK_H"] * meta["BLOCK_W"]
        # split-K serves layers with few output tiles: the 128-channel-wide tiles of at most 128
        # rows only (also keeps the probe's compile count down: one compile per config and split)
        if split and (meta["BLOCK_N"] != 128 or meta["BLOCK_M"] > 128 or meta["BLOCK_K"] != 64):
            continue
        if meta["BLOCK_N"] > max(64, next_power_of_2(K)):
            continue
        if meta["BLOCK_M"] > max(64, next_power_of_2(M)):
            continue
        if split_taps and c_gemm % meta["BLOCK_K"] != 0:
            continue
        kept.append(config)
    return kept or configs[-1:]


_TUNE_CALLS = [20]


def _tune_bench(kernel_call, quantiles):
    """The autotuner's timer: GPU time per call over back-to-back calls behind a sleep kernel
    (kernels._common.gpu_ms_per_call). triton's default do_bench counts the launch path whenever
    it outlasts the kernel, which for these 10-50 us convolutions ranks configs by Python
    overhead rather than by speed."""
    ms = gpu_ms_per_call(kernel_call, _TUNE_CALLS[0])
    return [ms for _ in quantiles] if quantiles else ms


def _configs_for(tiles):
    if tiles is WINDOW_TILES:
        return _window_configs()
    if tiles is GEMM_PERSISTENT_TILES:
        return _persistent_configs()
    if tiles is WINDOW_PERSISTENT_TILES:
        return _window_persistent_configs()
    return _configs(tiles)


def _autotune(tiles, key):
    return triton.autotune(
        configs=_configs_for(tiles),
        key=key,
        prune_configs_by={"early_config_prune": _prune},
        do_bench=_tune_bench,
    )


# ---------------------------------------------------------------------------------------------
# Kernels
# ---------------------------------------------------------------------------------------------
_CONV_KEY = ["N", "C", "H", "W", "K", "P", "Q", "R", "S", "conv_stride_h", "conv_stride_w",
             "dil_h", "stride_xc", "stride_yk", "B_TMA", "SPLIT_K"]  # fmt: skip
# Sizes that only bound loops and masks: not specialised on (== 1, % 16), so the ResNet layers
# share compiled kernels instead of compiling every config again per spatial size. Channel counts,
# strides and R, S stay specialised: they decide load vectorisation and the 1x1 shortcuts.
_SIZES_ONLY = ["M", "N", "H", "W", "P", "Q", "pad_h", "pad_w", "dil_h", "dil_w"]


@_autotune(IMPLICIT_TILES, _CONV_KEY)
@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=_SIZES_ONLY)
def conv_implicit_kernel(
    # x: (N, C, H, W) by strides; w: packed (K, R·S·C) matrix or its TMA descriptor; y by strides
    x, w, bias_ptr, y, ws_ptr, lock_ptr,
    M, N, C, H, W, K, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk,
    stride_yn, stride_yk, stride_yp, stride_yq,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    B_TMA: tl.constexpr, Y_TMA: tl.constexpr, SPLIT_K: tl.constexpr,
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
        col = rs * C + c0  # the packed weight's column of (r, s, c0)
        if B_TMA:
            b = w.load([pid_n * BLOCK_N, col]).T
        else:
            b_ptrs = w + offs_n[None, :] * stride_wk + (col + offs_c)[:, None]
            b = tl.load(b_ptrs, mask=(c < C)[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    write = True
    if SPLIT_K > 1:  # only the last program of this tile to arrive sums the partials and writes
        acc, write = _split_k_gather(acc, ws_ptr, lock_ptr, tl.program_id(0), tl.program_id(1),
                                     SPLIT_K, BLOCK_M, BLOCK_N)  # fmt: skip
    if write:
        if Y_TMA:  # y is an (M, K) matrix: one TMA store, clipped at its edges
            acc = _bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
            y.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y.dtype))
        else:
            y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
            _epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS,
                      ACTIVATION)  # fmt: skip


@_autotune(FLAT_TILES, _CONV_KEY)
@triton.jit(do_not_specialize=_SIZES_ONLY)
def conv_flat_kernel(
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
    the per-element cost is the 2-D bounds mask. B_TMA is unused: the packed weight's row of
    R·S·C elements is rarely 16-byte aligned here, and it is small enough to stay in L1/L2.
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
        acc = _bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
        y.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y.dtype))
    else:
        y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
        _epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS, ACTIVATION)


@_autotune(WINDOW_TILES, _CONV_KEY)
@triton.jit(do_not_specialize=_SIZES_ONLY)
def conv_window_kernel(
    # x: TMA descriptor of the NHWC input as a 4-D (N, H, W, C) tensor; w, bias, y as above
    x, w, bias_ptr, y, ws_ptr, lock_ptr,
    M, N, C, H, W, K, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk,
    stride_yn, stride_yk, stride_yp, stride_yq,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    B_TMA: tl.constexpr, Y_TMA: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    """Stride-1 convs on Hopper: the A tile is one TMA box of the input.

    A row tile is a BLOCK_H x BLOCK_W patch of output pixels of one image. For tap (r, s) its
    inputs are the same-sized patch shifted by (r·dil - pad, s·dil - pad): one 4-D TMA box
    [1, BLOCK_H, BLOCK_W, BLOCK_K], whose out-of-range rows and columns (the zero padding, even at
    negative coordinates) the TMA unit fills with zeros. No address arithmetic or masks per
    element at all; the price is ragged edge tiles when BLOCK_H, BLOCK_W do not divide P, Q.
    """
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
        col = rs * C + c0
        if B_TMA:
            b = w.load([pid_n * BLOCK_N, col]).T
        else:
            c = c0 + offs_c
            b_ptrs = w + offs_n[None, :] * stride_wk + (col + offs_c)[:, None]
            b = tl.load(b_ptrs, mask=(c < C)[:, None] & n_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    i = tl.arange(0, BLOCK_M)
    p = p0 + i // BLOCK_W
    q = q0 + i % BLOCK_W
    m_ok = (p < P) & (q < Q)
    write = True
    if SPLIT_K > 1:
        acc, write = _split_k_gather(acc, ws_ptr, lock_ptr, tl.program_id(0), tl.program_id(1),
                                     SPLIT_K, BLOCK_M, BLOCK_N)  # fmt: skip
    if write:
        if Y_TMA:  # y as 4-D (N, P, Q, K): the same pixel patch, clipped at the image's edges
            acc = _bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
            box = acc.to(y.dtype).reshape(1, BLOCK_H, BLOCK_W, BLOCK_N)
            y.store([n, p0, q0, pid_n * BLOCK_N], box)
        else:
            y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
            _epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS,
                      ACTIVATION)  # fmt: skip


@triton.jit
def _gemm_tile(
    x, w, bias_ptr, y, pid_m, pid_n,
    M, C, K,
    stride_xm, stride_wk, stride_ym, stride_yk,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    A_TMA: tl.constexpr, B_TMA: tl.constexpr, Y_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_C: tl.constexpr,
):  # fmt: skip
    """One (pid_m, pid_n) output tile of the 1x1 GEMM y(M, K) = x(M, C) @ w(K, C)^T, + bias,
    activation: the body of conv_gemm_kernel and of each conv_gemm_persistent_kernel step."""
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

    if Y_TMA:
        acc = _bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
        y.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(y.dtype))
    else:
        y_row = offs_m.to(tl.int64) * stride_ym
        _epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS, ACTIVATION)


@_autotune(GEMM_TILES, ["M", "C", "K", "stride_xm", "stride_yk", "A_TMA", "B_TMA"])
@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def conv_gemm_kernel(
    # x: (M, C) matrix (or TMA descriptor); w: (K, C) matrix (or descriptor); y: (M, K) strides
    x, w, bias_ptr, y,
    M, C, K,
    stride_xm, stride_wk, stride_ym, stride_yk,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    A_TMA: tl.constexpr, B_TMA: tl.constexpr, Y_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_C: tl.constexpr,
):  # fmt: skip
    """A 1x1 stride-1 conv on NHWC: y(M, K) = x(M, C) @ w(K, C)^T, + bias, activation."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(K, BLOCK_N), GROUP_M)
    _gemm_tile(x, w, bias_ptr, y, pid_m, pid_n, M, C, K, stride_xm, stride_wk, stride_ym,
               stride_yk, HAS_BIAS, ACTIVATION, DOT_PRECISION, A_TMA, B_TMA, Y_TMA, BLOCK_M,
               BLOCK_N, BLOCK_K, EVEN_C)  # fmt: skip


@_autotune(WINDOW_PERSISTENT_TILES, _CONV_KEY + ["FLATTEN"])
@triton.jit(do_not_specialize=_SIZES_ONLY)
def conv_window_persistent_kernel(
    x, w, bias_ptr, y, ws_ptr, lock_ptr,
    M, N, C, H, W, K, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk,
    stride_yn, stride_yk, stride_yp, stride_yq,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    B_TMA: tl.constexpr, Y_TMA: tl.constexpr, SPLIT_K: tl.constexpr, FLATTEN: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PER_SM: tl.constexpr = 1,
):  # fmt: skip
    """conv_window_kernel's tile in a persistent loop (PER_SM programs per SM, sized on the host),
    so that with FLATTEN the next tile's TMA boxes load while this tile's epilogue runs. No
    split-K (SPLIT_K is accepted and must be 1); ws_ptr and lock_ptr are unused."""
    BLOCK_M: tl.constexpr = BLOCK_H * BLOCK_W
    tiles_h = tl.cdiv(P, BLOCK_H)
    tiles_w = tl.cdiv(Q, BLOCK_W)
    num_pid_m = N * tiles_h * tiles_w
    num_pid_n = tl.cdiv(K, BLOCK_N)
    offs_c = tl.arange(0, BLOCK_K)
    c_blocks = tl.cdiv(C, BLOCK_K)
    steps = R * S * c_blocks
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0),
                         flatten=FLATTEN):  # fmt: skip
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        n = pid_m // (tiles_h * tiles_w)
        t = pid_m - n * (tiles_h * tiles_w)
        th = t // tiles_w
        p0 = th * BLOCK_H
        q0 = (t - th * tiles_w) * BLOCK_W
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < K
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for step in range(0, steps):
            rs = step // c_blocks
            c0 = (step - rs * c_blocks) * BLOCK_K
            r = rs // S
            s = rs - r * S
            box = x.load([n, p0 + r * dil_h - pad_h, q0 + s * dil_w - pad_w, c0])
            a = box.reshape(BLOCK_M, BLOCK_K)
            col = rs * C + c0
            if B_TMA:
                b = w.load([pid_n * BLOCK_N, col]).T
            else:
                c = c0 + offs_c
                b_ptrs = w + offs_n[None, :] * stride_wk + (col + offs_c)[:, None]
                b = tl.load(b_ptrs, mask=(c < C)[:, None] & n_ok[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

        if Y_TMA:
            acc = _bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
            box = acc.to(y.dtype).reshape(1, BLOCK_H, BLOCK_W, BLOCK_N)
            y.store([n, p0, q0, pid_n * BLOCK_N], box)
        else:
            i = tl.arange(0, BLOCK_M)
            p = p0 + i // BLOCK_W
            q = q0 + i % BLOCK_W
            m_ok = (p < P) & (q < Q)
            y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
            _epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS,
                      ACTIVATION)  # fmt: skip


@_autotune(GEMM_PERSISTENT_TILES,
           ["M", "C", "K", "stride_xm", "stride_yk", "A_TMA", "B_TMA", "FLATTEN"])  # fmt: skip
@triton.heuristics({"EVEN_C": lambda args: args["C"] % args["BLOCK_K"] == 0})
@triton.jit(do_not_specialize=["M"])
def conv_gemm_persistent_kernel(
    x, w, bias_ptr, y,
    M, C, K,
    stride_xm, stride_wk, stride_ym, stride_yk,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    A_TMA: tl.constexpr, B_TMA: tl.constexpr, Y_TMA: tl.constexpr, FLATTEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_C: tl.constexpr, PER_SM: tl.constexpr = 1,
):  # fmt: skip
    """conv_gemm_kernel's tile as a persistent loop: PER_SM programs per SM walk the output tiles
    in grouped order; with FLATTEN the pipeliner issues the next tile's loads while this tile's
    epilogue runs (the 1x1 layers have 1-32 reduction steps per tile, so a non-persistent kernel
    has little else to overlap). PER_SM only sizes the grid (host side)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        _gemm_tile(x, w, bias_ptr, y, pid_m, pid_n, M, C, K, stride_xm, stride_wk, stride_ym,
                   stride_yk, HAS_BIAS, ACTIVATION, DOT_PRECISION, A_TMA, B_TMA, Y_TMA, BLOCK_M,
                   BLOCK_N, BLOCK_K, EVEN_C)  # fmt: skip


def _traceable(kernel):
    """The same jit function under a second autotuner for torch.compile (launch=wrap_triton):
    plain configs with no pre-hook, the default timer and no pruning, which is what torch can
    trace in a user-defined Triton kernel. Only the pointer-load variants run there."""
    configs = [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages)
               for c in kernel.configs]  # fmt: skip
    return triton.autotune(configs=configs, key=list(kernel.keys))(kernel.fn)


TRACEABLE = {
    kernel: _traceable(kernel)
    for kernel in (conv_implicit_kernel, conv_flat_kernel, conv_gemm_kernel)
}


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------
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


def pack_conv_weight(weight: torch.Tensor) -> torch.Tensor:
    """The weight in the layout the kernels read: channels_last, i.e. a (K, R·S·C) row-major
    matrix with the reduction ordered (r, s, c). Same shape and values as `weight`; a no-op
    (returns `weight` itself) when it already is channels_last. Pack once and pass the result as
    conv2d's weight (or as packed_weight=) to keep the copy out of every call."""
    check_tensor("weight", weight, ndim=4)
    return weight.contiguous(memory_format=torch.channels_last)


def _weight_matrix(weight: torch.Tensor) -> torch.Tensor:
    """(K, R·S·C) row-major view of a channels_last weight (a copy, per call, otherwise)."""
    K, C, R, S = weight.shape
    w2d = weight.permute(0, 2, 3, 1).reshape(K, R * S * C)
    if w2d.stride(1) != 1 or w2d.stride(0) < R * S * C:
        w2d = w2d.contiguous()
    return w2d


def _tma_ok(t: torch.Tensor) -> bool:
    """A 2-D operand TMA can describe: 16-bit dtype, unit inner stride, 16-byte aligned rows."""
    return (
        t.dtype in (torch.float16, torch.bfloat16)
        and t.stride(1) == 1
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def _window_ok(x: torch.Tensor, stride_hw) -> bool:
    """The window kernel's 4-D TMA box can read x: stride 1, NHWC, 16-bit, aligned."""
    if stride_hw != (1, 1) or TensorDescriptor is None or x.stride(1) != 1:
        return False
    if x.dtype not in (torch.float16, torch.bfloat16) or x.data_ptr() % 16:
        return False
    return all((x.stride(d) * x.element_size()) % 16 == 0 for d in (0, 2, 3))


def _auto_split_k(x, M, K, C, R, S) -> int:
    """Reduction splits for implicit / window convs with too few output tiles to fill the GPU
    (the 7x7-output layers: 100 tiles of 64x128 on 132 SMs). Off unless AUTO_SPLIT_K: double the
    split while the 64x128 tiles times the split stay under one per SM, each split keeps at least
    AUTO_SPLIT_MIN_STEPS steps of 64 channels, and the split stays <= AUTO_SPLIT_MAX. ResNet-50 at
    batch 32 (132 SMs): 2 for the 7x7-output 3x3s (512 channels), 1 elsewhere. Round 3 measured
    split 2 at 1.12-1.15x the unsplit kernel there, and 0.74-0.80x on the 196-tile 14x14 layers."""
    info = gpu_info(x.device)
    if not AUTO_SPLIT_K or info is None:
        return 1
    return split_k_rule(M, K, C, R, S, info.sms)


def split_k_rule(M, K, C, R, S, sms) -> int:
    """_auto_split_k's choice for an (M rows, K output channels, C·R·S reduction) conv on `sms`
    SMs, whatever AUTO_SPLIT_K says."""
    tiles = cdiv(M, 64) * cdiv(K, 128)
    steps = R * S * cdiv(C, 64)
    split = 1
    while (split * 2 <= AUTO_SPLIT_MAX and tiles * split < sms
           and steps // (split * 2) >= AUTO_SPLIT_MIN_STEPS):  # fmt: skip
        split *= 2
    return split


def _persistent_programs(device) -> int:
    """Programs per unit of PER_SM for the persistent kernels: the SM count (4 in the
    interpreter, so that its programs loop over several tiles)."""
    info = gpu_info(device)
    return 4 if info is None else info.sms


def _split_buffers(kernel, split_k, tiles_of, device):
    """fp32 workspace for every tile's SPLIT_K partial tiles, and the per-tile arrival counters
    (kernels._common.tile_counters: cached per stream, zero between calls). Sized
    for the largest grid any of the kernel's configs can launch."""
    tiles = ws = 0
    for config in kernel.configs:
        meta = config.kwargs
        block_m = meta.get("BLOCK_M") or meta["BLOCK_H"] * meta["BLOCK_W"]
        count = tiles_of(meta)
        tiles = max(tiles, count)
        ws = max(ws, count * block_m * meta["BLOCK_N"])
    locks = tile_counters(device, tiles, minimum=4096)
    return torch.empty(ws * split_k, device=device, dtype=torch.float32), locks


def _auto_path(x, gemm_ok, use_tma, R, S, P, Q, stride_hw) -> str:
    """gemm for plain 1x1s, flat for few channels, window for stride-1 filters on images of
    14x14 and up (where its TMA input boxes beat pointer gathers on the H100; on 7x7 the ragged
    8x8 boxes lose to the implicit kernel), implicit for the rest."""
    C = x.shape[1]
    if gemm_ok:
        # "matmul" takes 16-bit operands only here (fused_matmul reads TF32 by cuBLAS's switch,
        # not cuDNN's)
        if GEMM_1X1_PATH == "matmul" and x.dtype == torch.float32:
            return "gemm"
        return GEMM_1X1_PATH
    if C < 16:
        return "flat"
    big_enough = P * Q >= 196 and (R, S) != (1, 1) and C % 64 == 0
    if use_tma and big_enough and _window_ok(x, stride_hw):
        return WINDOW_PATH
    return "implicit"


def _hopper(device: torch.device) -> bool:
    info = gpu_info(device)
    return TensorDescriptor is not None and info is not None and info.capability >= (9, 0)


def _as_matrix(t: torch.Tensor) -> bool:
    """t (N, C, H, W) is an (N·H·W, C) matrix: unit channel stride, pixels evenly spaced."""
    N, C, H, W = t.shape
    sn, sc, sh, sw = t.stride()
    return sc == 1 and (H == 1 or sh == W * sw) and (N == 1 or sn == H * W * sw) and sw >= C


def _gemm_ok(x, y, R, S, stride_hw, padding_hw) -> bool:
    """A 1x1, stride-1, unpadded conv between NHWC tensors is the GEMM y(M, K) = x(M, C) w^T."""
    unit = (R, S) == (1, 1) and stride_hw == (1, 1) and padding_hw == (0, 0)
    return unit and _as_matrix(x) and _as_matrix(y)


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
    packed_weight: torch.Tensor | None = None,
    path: str | None = None,
    tma: bool | None = None,
    nchw: str = "native",
    split_k: int | None = None,
) -> torch.Tensor:
    """conv2d with the launcher made explicit, for kernels/ops.py; see conv2d.

    path (one of PATHS), tma, nchw ('native' | 'convert') and split_k (reduction splits of the
    implicit / window paths, summed in the same launch) override the automatic choices, for the
    probe and the tests.
    """
    check_tensor("x", x)
    if x.dim() not in (3, 4):
        raise ValueError(f"x must be 3-D (C, H, W) or 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    check_tensor("weight", weight, ndim=4)
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
    if packed_weight is not None:
        check_tensor("packed_weight", packed_weight, ndim=4)
        if packed_weight.shape != weight.shape:
            raise ValueError(
                f"packed_weight has shape {tuple(packed_weight.shape)} but weight has "
                f"{tuple(weight.shape)}; pass pack_conv_weight(weight)"
            )
    check_same({"x": x, "weight": weight, "bias": bias, "packed_weight": packed_weight})
    stride_hw = _pair("stride", stride, 1)
    padding_hw = _pair("padding", padding, 0)
    dilation_hw = _pair("dilation", dilation, 1)
    act = activation_id(activation)
    if path is not None and path not in PATHS:
        raise ValueError(f"path={path!r}; choose one of {PATHS}")
    if nchw not in ("convert", "native"):
        raise ValueError(f"nchw={nchw!r}; choose 'convert' or 'native'")
    if split_k is not None and (isinstance(split_k, bool) or not isinstance(split_k, int)
                                or split_k < 1):  # fmt: skip
        raise ValueError(f"split_k={split_k!r}; pass a positive int")
    options = dict(launch=launch, packed_weight=packed_weight, path=path, tma=tma, nchw=nchw,
                   split_k=split_k)  # fmt: skip
    if x.dim() == 3:  # unbatched, as F.conv2d allows
        y = conv2d_forward(x.unsqueeze(0), weight, bias, stride_hw, padding_hw, dilation_hw,
                           activation, **options)  # fmt: skip
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

        options["packed_weight"] = up(packed_weight)
        y = conv2d_forward(up(x), up(weight), up(bias), stride_hw, padding_hw, dilation_hw,
                           activation, **options)  # fmt: skip
        return y.to(torch.bfloat16)

    memory_format = torch.channels_last if _channels_last_output(x) else torch.contiguous_format
    y = torch.empty((N, K, P, Q), device=x.device, dtype=x.dtype, memory_format=memory_format)
    if y.numel() == 0:
        return y
    if x.stride(1) != 1 and nchw == "convert" and C > 1:
        # opt-in: one copy to NHWC, so that every A-tile load is a contiguous channel vector
        # (and the gemm / window paths apply); the output keeps the caller's layout
        x = x.contiguous(memory_format=torch.channels_last)
    w2d = _weight_matrix(packed_weight if packed_weight is not None else weight)
    gemm_ok = _gemm_ok(x, y, R, S, stride_hw, padding_hw)
    chosen = path
    if chosen in ("gemm", "gemm_persistent", "matmul") and not gemm_ok:
        raise ValueError(f"path={chosen!r} needs a 1x1, stride-1, unpadded conv from and to NHWC")
    use_tma = _hopper(x.device) and launch is direct if tma is None else tma
    if path is None:
        chosen = _auto_path(x, gemm_ok, use_tma, R, S, P, Q, stride_hw)
        if chosen in ("gemm_persistent", "matmul") and launch is not direct:
            chosen = "gemm"  # traced launches take the hook-free pointer kernels
    precision = dot_precision(x.dtype, torch.backends.cudnn.allow_tf32)
    common = dict(HAS_BIAS=bias is not None, ACTIVATION=act, DOT_PRECISION=precision)
    M = N * P * Q

    def grid(meta):
        return (cdiv(M, meta["BLOCK_M"]) * cdiv(K, meta["BLOCK_N"]),)

    # NHWC output: y is an (M, K) matrix, written by TMA stores on Hopper
    y2d = y.as_strided((M, K), (y.stride(3), 1)) if _as_matrix(y) else None
    y_tma = bool(use_tma and y2d is not None and _tma_ok(y2d))
    out = TensorDescriptor.from_tensor(y2d, [64, 64]) if y_tma else y
    if chosen in ("gemm", "gemm_persistent", "matmul") and (split_k or 1) > 1:
        raise ValueError("split_k applies to the implicit and window paths only")
    if chosen == "matmul":  # kernels.matmul's GEMM: y(M, K) = x(M, C) @ w(K, C)^T
        if launch is not direct:
            raise ValueError("path='matmul' is launched directly only")
        x2d = x.as_strided((M, C), (x.stride(3), 1))
        c, _ = fused_matmul(x2d, w2d.t(), bias, act, **MATMUL_KWARGS)
        last_launch[0] = None
        # c is a dense (N·P·Q, K) matrix: exactly a channels_last (N, K, P, Q) tensor
        return c.view(N, P, Q, K).permute(0, 3, 1, 2)
    if chosen in ("gemm", "gemm_persistent"):
        x2d = x.as_strided((M, C), (x.stride(3), 1))
        a_tma = bool(use_tma and _tma_ok(x2d))
        b_tma = bool(use_tma and _tma_ok(w2d))
        dummy = [64, 64]  # the pre-hook sets each config's block shape
        a = TensorDescriptor.from_tensor(x2d, dummy) if a_tma else x2d
        b = TensorDescriptor.from_tensor(w2d, dummy) if b_tma else w2d
        if chosen == "gemm_persistent":
            if launch is not direct:
                raise ValueError("path='gemm_persistent' is launched directly only")
            sms = _persistent_programs(x.device)

            def grid(meta):
                tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(K, meta["BLOCK_N"])
                return (min(tiles, sms * meta.get("PER_SM", 1)),)

            kernel = conv_gemm_persistent_kernel
            extra = dict(FLATTEN=GEMM_FLATTEN)
        else:
            kernel = conv_gemm_kernel if launch is direct else TRACEABLE[conv_gemm_kernel]
            extra = {}
        compiled = launch(kernel)[grid](
            a, b, bias, out, M, C, K,
            x2d.stride(0), w2d.stride(0), y.stride(3), y.stride(1),
            A_TMA=a_tma, B_TMA=b_tma, Y_TMA=y_tma, **extra, **common,
        )  # fmt: skip
        if launch is direct:
            last_launch[0] = (kernel, compiled)
        return y

    kernel = {"flat": conv_flat_kernel, "implicit": conv_implicit_kernel,
              "window": conv_window_kernel,
              "window_persistent": conv_window_persistent_kernel}[chosen]  # fmt: skip
    windowed = chosen in ("window", "window_persistent")
    b_tma = bool(use_tma and chosen != "flat" and C % 32 == 0 and _tma_ok(w2d))
    b = TensorDescriptor.from_tensor(w2d, [64, 64]) if b_tma else w2d
    a = x
    if windowed:
        if not _window_ok(x, stride_hw):
            raise ValueError(
                f"path={chosen!r} needs a stride-1 conv of an fp16/bf16 NHWC input whose pixel "
                "rows are 16-byte aligned (TMA)"
            )
        strides = [x.stride(0), x.stride(2), x.stride(3), 1]
        a = TensorDescriptor(x, [N, H, W, C], strides, [1, 8, 8, 64])
        if y_tma:
            y_strides = [y.stride(0), y.stride(2), y.stride(3), 1]
            out = TensorDescriptor(y, [N, P, Q, K], y_strides, [1, 8, 8, 64])

        def grid(meta):
            tiles = cdiv(P, meta["BLOCK_H"]) * cdiv(Q, meta["BLOCK_W"])
            tiles = N * tiles * cdiv(K, meta["BLOCK_N"])
            if chosen == "window_persistent":
                tiles = min(tiles, _persistent_programs(x.device) * meta.get("PER_SM", 1))
            return (tiles,)

    extra = {}
    if chosen == "window_persistent":
        if launch is not direct:
            raise ValueError("path='window_persistent' is launched directly only")
        if (split_k or 1) > 1:
            raise ValueError("split_k applies to the implicit and window paths only")
        extra = dict(FLATTEN=GEMM_FLATTEN)
    splits = split_k if split_k is not None else 1
    if split_k is None and chosen in ("implicit", "window") and launch is direct:
        splits = _auto_split_k(x, M, K, C, R, S)
    if splits > 1 and chosen == "flat":
        raise ValueError("split_k applies to the implicit and window paths only")
    ws = locks = None
    launch_grid = grid
    if splits > 1:
        if launch is not direct:
            raise ValueError("split_k > 1 is launched directly only")
        if chosen == "window":

            def tiles_of(meta):
                tiles = cdiv(P, meta["BLOCK_H"]) * cdiv(Q, meta["BLOCK_W"])
                return N * tiles * cdiv(K, meta["BLOCK_N"])
        else:

            def tiles_of(meta):
                return cdiv(M, meta["BLOCK_M"]) * cdiv(K, meta["BLOCK_N"])

        ws, locks = _split_buffers(kernel, splits, tiles_of, x.device)

        def launch_grid(meta):
            return (grid(meta)[0], splits)

    if launch is not direct:
        if chosen == "window":
            raise ValueError("path='window' needs TMA descriptors: launch it directly")
        kernel = TRACEABLE[kernel]
    compiled = launch(kernel)[launch_grid](
        a, b, bias, out, ws, locks,
        M, N, C, H, W, K, P, Q, R, S,
        *stride_hw, *padding_hw, *dilation_hw,
        *x.stride(), w2d.stride(0), *y.stride(),
        B_TMA=b_tma, Y_TMA=y_tma, SPLIT_K=splits, **extra, **common,
    )  # fmt: skip
    if launch is direct:
        last_launch[0] = (kernel, compiled)
    return y


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    activation: str | None = None,
    *,
    packed_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride, padding, dilation) with groups=1, then `activation`.

    padding takes ints only (not 'same'/'valid'). The output is channels_last when x is, else
    NCHW. Forward only: the result carries no autograd graph. The kernels read the weight as
    channels_last; pass packed_weight=pack_conv_weight(weight) (or a channels_last weight) to
    keep that copy out of the call.
    """
    return conv2d_forward(x, weight, bias, stride, padding, dilation, activation,
                          packed_weight=packed_weight)  # fmt: skip
