"""conv2d's weight gradient (wgrad): dW = dZ^T X per filter tap, the reduction split across
programs so that few output tiles still fill the GPU. It has to come close to cuDNN's wgrad on the
ResNet-50 layers (bf16, channels_last, batch 32).

For tap (r, s), dW[:, :, r, s] is a GEMM with M = K output channels, N = C input channels and the
reduction over the N·P·Q output pixels: row k of dZ^T against the input pixels that tap (r, s) of
each output pixel reads. A program owns one (BLOCK_M output channels, BLOCK_N input channels)
tile of TAPS adjacent taps of one filter row, (r, s0) .. (r, s0 + TAPS - 1), and walks its share
of the pixels BLOCK_K at a time: per pixel one run of BLOCK_M channels of dZ, loaded once for all
TAPS taps, and per tap one run of BLOCK_N channels of x (contiguous in channels_last; an NCHW
tensor is read in place by strided loads, as the forward does), so both tiles arrive pixel-major
and dZ's is transposed into the dots. Loading dZ once for three taps is what takes the 64-channel
layers out from under L2's bandwidth: their 64x64 tiles do 32 FLOPs per byte loaded at one tap
each, and 48 at three. Each lane's pixel (n, p, q) is decoded once and then advanced by carries, not
divided out every step; the taps' shifts are scalars. With few input channels (C < 16, the C = 3
stem) the tile's columns are instead the flat (r, s, c) index, as the forward's flat_reduction.py
does: R·S·C = 147 columns in 3 tiles of 64, not 49 taps each padding 3 channels to a 64-wide tile
and reading all of dZ again.

The output tiles are few (K·C·R·S is at most a few million) and the reduction long (100352 pixels
at 56x56, batch 32), so grid axis 1 splits the pixels: on a direct call each config as many ways
as its own tiles leave SMs (config_splits, so that the autotuner weighs a three-tap tile at its
split against a one-tap tile at its own), on a traced one by split_rule's nominal tiles. A
program reads the split count off the grid. Each split writes its fp32
partial dW into its own slab of a workspace and a second kernel sums the slabs in a fixed order:
deterministic, with the sum spread over the whole GPU. The forward's last-arriving-program gather
(kernels.matmul.splitk.split_k_gather) would leave one program per tile to read all of its up
to 66 partial tiles serially, and fp32 atomics would make dW depend on the programs' timing.
Unsplit, the kernel rounds the accumulator once into dW.

dW comes back channels_last: its memory is the (K, R·S·C) row-major matrix the forward kernels
read, and each tap's tile is a (BLOCK_M, BLOCK_N) block of it.

A direct 1x1, stride-1, unpadded wgrad of 16-bit NHWC tensors on Hopper runs wgrad_gemm.py's
kernel instead: the same split and slabs, with dZ and X read as plain matrices by TMA.

Compiled for sm_90 it is wgmma with both operands from shared memory and 16-byte cp.async loads
of channels_last tensors. Measurements: docs/kernels/conv.md, "Backward".

Functions:
    conv2d_wgrad_reference  torch's wgrad on x padded as the forward pads it (the tests' reference)
    conv_wgrad_kernel       @triton.jit, autotuned (and a hook-free copy for traced launches)
    wgrad_split_sum_kernel  @triton.jit: dW = the sum of the splits' fp32 partials, fixed order
    split_sum_step          its launch for a dW size and split count
    tap_group               the taps a grouped config owns, as split_rule counts them
    config_splits           pixel splits of one config's launch
    split_rule              pixel splits of a wgrad with few output tiles, by nominal tiles
    conv2d_wgrad            the public function: dW (K, C, R, S), channels_last
    planned_wgrad           the same, with the plan a direct call's geometry runs
    run                     dW by a plan, with no key (a planned training step keeps the plan)
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import (
    Launcher,
    cdiv,
    direct,
    dot_precision,
    gpu_info,
    is_interpreter,
    next_power_of_2,
)
from kernels._launch import PlanCache, Step
from kernels.conv.common import traceable, tune_bench
from kernels.conv.wgrad_gemm import is_wgrad_gemm, wgrad_gemm_kernel, wgrad_gemm_step

# (BLOCK_M output channels, BLOCK_N input channels, BLOCK_K pixels, num_stages, num_warps, TAPS).
# 64 pixels a step: 128-byte rows of 16-bit channels, the widest wgmma swizzle. TAPS = 3 keeps
# three accumulators: 64x64 of them fit four warps, 64x128 or 128x64 eight (96 fp32 registers a
# thread either way); pruned where the filter rows are shorter.
WGRAD_TILES = [
    (128, 128, 64, 3, 8, 1),
    (128, 128, 64, 4, 4, 1),
    (128, 64, 64, 4, 4, 1),
    (64, 128, 64, 4, 4, 1),
    (64, 64, 64, 4, 4, 1),
    (128, 128, 32, 4, 4, 1),
    (64, 64, 64, 4, 4, 3),
    (64, 128, 64, 3, 8, 3),
    (128, 64, 64, 3, 8, 3),
]
# The interpreter's tiles: tl.dot needs dims >= 16; 16 output channels give the tests' K = 20
# two channel blocks, one of them ragged; two taps a program, so a 3-wide filter row's second
# program has a tap past the row's end (tests/test_conv_wgrad.py also runs TAPS = 1 and 3)
INTERPRETER_TILE = (16, 32, 16, 1, 4, 2)
# Below this many input channels the tile's columns are the flat (r, s, c) index (the forward
# takes its flat design below the same count)
FLAT_BELOW = 16
# split_rule: each split walks at least this many pixels (16 steps of 64: the pipeline's prologue
# and the partial's store stay small beside the loop), and at most this many splits
SPLIT_PIXELS_MIN = 1024
SPLIT_MAX = 128
# wgrad_split_sum_kernel: elements per program, at most and at least; the programs a small dW
# aims for (about two per SM of an H100); slabs a program loads at once
SUM_BLOCK = 1024
SUM_BLOCK_MIN = 128
SUM_PROGRAMS = 264
CHUNK_MAX = 8

# Sizes that only bound loops and masks (not specialised on, so spatial sizes share compiles);
# channel counts, strides and R, S stay specialised: they decide vectorisation
WGRAD_SIZES_ONLY = ["NPQ", "H", "W", "P", "Q", "pad_h", "pad_w", "dil_h", "dil_w"]
# What changes the best tile: the GEMM's sizes and which side is channels-contiguous (each
# config's split follows from the sizes)
WGRAD_KEY = ["NPQ", "K", "C", "R", "S", "conv_stride_h", "conv_stride_w", "stride_dzk",
             "stride_xc"]  # fmt: skip


def conv2d_wgrad_reference(dz, x, kernel_rs, stride, padding, dilation):
    """dW of conv2d(x, ·) for the output gradient dz, padding (top, left) and whatever bottom and
    right padding dz's size implies (rows past the input read zero), by torch.nn.grad."""
    # 2·K·C·R·S·N·P·Q FLOPs; reads N·K·P·Q + N·C·H·W (once per tap from cache), writes K·C·R·S
    (R, S), (sh, sw), (ph, pw), (dh, dw) = kernel_rs, stride, padding, dilation
    P, Q = dz.shape[2:]
    rows, cols = (P - 1) * sh + dh * (R - 1) + 1, (Q - 1) * sw + dw * (S - 1) + 1
    H, W = x.shape[2:]
    padded = F.pad(x, (pw, max(0, cols - W - pw), ph, max(0, rows - H - ph)))[..., :rows, :cols]
    shape = (dz.shape[1], x.shape[1], R, S)
    return torch.nn.grad.conv2d_weight(padded, shape, dz, (sh, sw), 0, (dh, dw))


def _configs(tiles):
    if is_interpreter():
        tiles = [INTERPRETER_TILE]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "TAPS": taps},
                          num_stages=stages, num_warps=warps)
            for bm, bn, bk, stages, warps, taps in tiles]  # fmt: skip


def _prune(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem (K output channels, and C or R·S·C flat columns)
    and tap groups longer than a filter row (flat columns take one program per tile)."""
    K, C, S = named_args["K"], named_args["C"], named_args["S"]
    flat = kwargs.get("FLAT_TAPS")
    cols = named_args["R"] * S * C if flat else C
    # flat columns carry a 2-D address and bounds mask per element: 128 of them spill (sm_90)
    widest_n = 64 if flat else max(64, next_power_of_2(cols))
    taps = 1 if flat else S
    kept = [cfg for cfg in configs
            if cfg.kwargs["BLOCK_M"] <= max(64, next_power_of_2(K))
            and cfg.kwargs["BLOCK_N"] <= widest_n
            and cfg.kwargs["TAPS"] <= taps]  # fmt: skip
    return kept or configs[-1:]


@triton.autotune(configs=_configs(WGRAD_TILES), key=WGRAD_KEY, do_bench=tune_bench,
                 prune_configs_by={"early_config_prune": _prune})  # fmt: skip
@triton.heuristics({
    "EVEN_K": lambda args: args["K"] % args["BLOCK_M"] == 0,
    "EVEN_C": lambda args: args["C"] % args["BLOCK_N"] == 0,
})  # fmt: skip
@triton.jit(do_not_specialize=WGRAD_SIZES_ONLY)
def conv_wgrad_kernel(
    # dz: (N, K, P, Q) and x: (N, C, H, W), both by strides; dw: dW's (K, R·S·C) matrix, written
    # unsplit; ws: the fp32 partial sums, one (K, R·S·C) slab per split (grid axis 1)
    dz, x, dw, ws,
    # sizes: NPQ output pixels (the reduction), K output and C input channels, the conv geometry
    NPQ, K, C, H, W, P, Q, R, S,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    # strides in elements
    stride_dzn, stride_dzk, stride_dzp, stride_dzq,
    stride_xn, stride_xc, stride_xh, stride_xw,
    # meta-parameters: FLAT_TAPS: columns are the flat (r, s, c) index instead of one tap's c;
    # TAPS: adjacent taps of a filter row a program owns (1 with FLAT_TAPS), each its accumulator
    DOT_PRECISION: tl.constexpr, FLAT_TAPS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TAPS: tl.constexpr,
    EVEN_K: tl.constexpr, EVEN_C: tl.constexpr,
):  # fmt: skip
    # -- program-id mapping: columns fastest, then output channels, then the tap group; so
    # programs that run together share dZ's tile, and every tap of one split reads the same pixels
    pid = tl.program_id(0)
    if FLAT_TAPS:
        cols = R * S * C
        s_groups = 1
    else:
        cols = C
        s_groups = tl.cdiv(S, TAPS)
    col_blocks = tl.cdiv(cols, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_M)
    pid_col = pid % col_blocks
    pid_k = (pid // col_blocks) % k_blocks
    group = pid // (col_blocks * k_blocks)  # 0 with FLAT_TAPS: the grid has no tap axis
    r = group // s_groups
    s0 = (group % s_groups) * TAPS  # taps s0 + j with s0 + j >= S lie past the row: masked

    # -- pointer setup: each column's tap shift (rows, cols) and offset within an input pixel --
    offs_k = pid_k * BLOCK_M + tl.arange(0, BLOCK_M)
    k_ok = offs_k < K
    offs_col = pid_col * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_col < cols
    if FLAT_TAPS:
        tap_h = (offs_col // (S * C)) * dil_h
        tap_w = ((offs_col // C) % S) * dil_w
        x_col = tap_h * stride_xh + tap_w * stride_xw + (offs_col % C) * stride_xc
        w_col = offs_col  # the flat index is dW's own column order
    else:
        tap_h = r * dil_h
        tap_w = s0 * dil_w  # tap s0 + j reads dil_w·j columns further right
        x_col = tap_h * stride_xh + tap_w * stride_xw + offs_col * stride_xc
        w_col = (r * S + s0) * C + offs_col
    PQ = P * Q
    # this split's pixels: whole BLOCK_K steps, the last split ragged (or empty)
    splits = tl.num_programs(1)
    per_split = tl.cdiv(tl.cdiv(NPQ, BLOCK_K), splits) * BLOCK_K
    lo = tl.program_id(1) * per_split
    hi = tl.minimum(lo + per_split, NPQ)
    # each lane's pixel as (n, p, q), decoded once; a step advances it by BLOCK_K pixels written
    # in the same mixed radix, with at most one carry per digit: two vector divisions a step
    # (dozens of instructions each) would cost about as much issue time as the step's MMAs
    m = lo + tl.arange(0, BLOCK_K)
    n = m // PQ
    p = (m - n * PQ) // Q
    q = m - n * PQ - p * Q
    step_n = BLOCK_K // PQ
    step_p = (BLOCK_K - step_n * PQ) // Q
    step_q = BLOCK_K - step_n * PQ - step_p * Q

    # -- main loop: BLOCK_K pixels a step, one dZ channel run and TAPS x channel runs each --
    acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(lo, hi, BLOCK_K):
        m_ok = m < hi
        n64 = n.to(tl.int64)  # batch × image stride can pass 2^31
        dz_pix = n64 * stride_dzn + p * stride_dzp + q * stride_dzq
        if EVEN_K:
            a_mask = m_ok[:, None]
        else:
            a_mask = m_ok[:, None] & k_ok[None, :]
        a = tl.trans(tl.load(dz + dz_pix[:, None] + offs_k[None, :] * stride_dzk, mask=a_mask,
                             other=0.0))  # fmt: skip
        ih0 = p * conv_stride_h - pad_h
        iw0 = q * conv_stride_w - pad_w
        x_pix = n64 * stride_xn + ih0 * stride_xh + iw0 * stride_xw
        if FLAT_TAPS:  # each column its own tap: a 2-D bounds mask
            ih = ih0[:, None] + tap_h[None, :]
            iw = iw0[:, None] + tap_w[None, :]
            b_mask = (m_ok[:, None] & col_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0)
                      & (iw < W))  # fmt: skip
            b = tl.load(x + x_pix[:, None] + x_col[None, :], mask=b_mask, other=0.0)
            acc0 = tl.dot(a, b, acc0, input_precision=DOT_PRECISION)
        else:  # one tap a load: the mask is per pixel (zero padding reads 0)
            ih = ih0 + tap_h
            iw = iw0 + tap_w
            row_ok = m_ok & (ih >= 0) & (ih < H)
            x_ptrs = x + x_pix[:, None] + x_col[None, :]
            b = _tap_tile(x_ptrs, row_ok, iw, 0, W, stride_xw, col_ok, EVEN_C)
            acc0 = tl.dot(a, b, acc0, input_precision=DOT_PRECISION)
            if TAPS >= 2:
                b = _tap_tile(x_ptrs, row_ok, iw, dil_w, W, stride_xw, col_ok, EVEN_C)
                acc1 = tl.dot(a, b, acc1, input_precision=DOT_PRECISION)
            if TAPS >= 3:
                b = _tap_tile(x_ptrs, row_ok, iw, 2 * dil_w, W, stride_xw, col_ok, EVEN_C)
                acc2 = tl.dot(a, b, acc2, input_precision=DOT_PRECISION)
        m += BLOCK_K
        q += step_q
        p += step_p + (q >= Q).to(tl.int32)
        q = tl.where(q >= Q, q - Q, q)
        n += step_n + (p >= P).to(tl.int32)
        p = tl.where(p >= P, p - P, p)

    # -- write-back: dW rounded once, or this split's fp32 slab (every program writes its tile,
    # an empty split zeros, so the workspace needs no clearing); a tap past the row's end read
    # in-bounds pixels into a sum that is dropped here --
    tile = offs_k[:, None] * (R * S * C) + w_col[None, :]
    out_mask = k_ok[:, None] & col_ok[None, :]
    if splits == 1:
        _store_taps(dw + tile, acc0, acc1, acc2, out_mask, s0, S, C, FLAT_TAPS, TAPS)
    else:
        slab = tl.program_id(1).to(tl.int64) * (K * R * S * C)
        _store_taps(ws + slab + tile, acc0, acc1, acc2, out_mask, s0, S, C, FLAT_TAPS, TAPS)


@triton.jit
def _tap_tile(x_ptrs, row_ok, iw, shift, W, stride_xw, col_ok, EVEN_C: tl.constexpr):
    """The x tile of the tap `shift` columns right of the group's first (x_ptrs, iw): a pixel
    whose column falls outside x reads zero (zero padding)."""
    pix_ok = row_ok & (iw >= -shift) & (iw < W - shift)
    if EVEN_C:
        mask = pix_ok[:, None]
    else:
        mask = pix_ok[:, None] & col_ok[None, :]
    return tl.load(x_ptrs + shift * stride_xw, mask=mask, other=0.0)


@triton.jit
def _store_taps(ptrs, acc0, acc1, acc2, mask, s0, S, C, FLAT_TAPS: tl.constexpr,
                TAPS: tl.constexpr):  # fmt: skip
    """Store a program's accumulators at ptrs (tap s0's tile), the grouped taps C columns apart,
    each only where it lies within the filter row."""
    tl.store(ptrs, acc0.to(ptrs.dtype.element_ty), mask=mask)
    if not FLAT_TAPS:
        if TAPS >= 2:
            tl.store(ptrs + C, acc1.to(ptrs.dtype.element_ty), mask=mask & (s0 + 1 < S))
        if TAPS >= 3:
            tl.store(ptrs + 2 * C, acc2.to(ptrs.dtype.element_ty), mask=mask & (s0 + 2 < S))


# Traced launches tune without pruning: filters narrower than 3 taps (and the flat columns)
# take the one-tap configs only (compile time is part of what triton-compiled reports); the
# interpreter's one tile serves both
_ONE_TAP = [c for c in conv_wgrad_kernel.configs if c.kwargs["TAPS"] == 1]
_TRACEABLE = traceable(conv_wgrad_kernel.configs, WGRAD_KEY, conv_wgrad_kernel.fn)
_TRACEABLE_ONE_TAP = traceable(_ONE_TAP or conv_wgrad_kernel.configs, WGRAD_KEY,
                               conv_wgrad_kernel.fn)  # fmt: skip


@triton.jit
def wgrad_split_sum_kernel(
    # ws: `splits` fp32 slabs of numel elements, back to back; dw: numel elements, contiguous
    ws, dw,
    numel, splits,
    BLOCK: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """dw = the sum of the slabs: CHUNK slabs' loads at a time in flight (one slab at a time left
    a 64x64 dW's 4 programs latency-bound, 16 us for 66 slabs on an H200), split j into row
    j mod CHUNK, the rows summed last: a fixed order, so the same dW on every run."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < numel
    rows = tl.arange(0, CHUNK)
    acc = tl.zeros((CHUNK, BLOCK), dtype=tl.float32)
    for first in range(0, splits, CHUNK):
        split = first + rows
        ptrs = ws + split[:, None].to(tl.int64) * numel + offs[None, :]
        acc += tl.load(ptrs, mask=(split[:, None] < splits) & ok[None, :], other=0.0)
    tl.store(dw + offs, tl.sum(acc, axis=0).to(dw.dtype.element_ty), mask=ok)


def split_sum_step(numel: int, splits: int, launch: Launcher = direct) -> Step:
    """The launch of wgrad_split_sum_kernel over (ws, dw): blocks small enough that a small dW
    still spreads over SUM_PROGRAMS programs, at most CHUNK_MAX slabs in flight each."""
    block = min(SUM_BLOCK, max(SUM_BLOCK_MIN, next_power_of_2(cdiv(numel, SUM_PROGRAMS))))
    chunk = min(CHUNK_MAX, next_power_of_2(splits))
    return Step(launch(wgrad_split_sum_kernel), (cdiv(numel, block),), (numel, splits),
                dict(BLOCK=block, CHUNK=chunk, num_warps=4))  # fmt: skip


def _nominal_tile(size: int) -> int:
    return 64 if size <= 64 else 128


def tap_group(K: int, C: int, S: int) -> int:
    """Taps a program of the grouped configs owns along a filter row: 3 where the nominal tile is
    at most 64x128 (three accumulators fit), else 1; split_rule counts tiles with it."""
    return 3 if S >= 3 and _nominal_tile(K) * _nominal_tile(C) <= 64 * 128 else 1


def split_rule(K: int, C: int, R: int, S: int, NPQ: int, sms: int) -> int:
    """Pixel splits of a wgrad on `sms` SMs by nominal tiles (128 wide, or 64 for sizes up to
    64; flat (r, s, c) columns below FLAT_BELOW channels; tap_group taps of a filter row each):
    what a traced launch, which cannot learn the tuned config's split, takes for every config.
    ResNet-50 at batch 32 on 132 SMs: 44 for the 64-channel 3x3 at 56x56 (3 tiles of 3 taps),
    14 for the 128-channel 3x3s (9 tiles), 66 for the 1x1s at 56x56 (2 tiles), 3 at 14x14 (36
    tiles), 1 for the 512-channel 7x7 3x3 (144 tiles)."""
    cols = R * S * C if C < FLAT_BELOW else C
    nominal = {"BLOCK_M": _nominal_tile(K), "BLOCK_N": _nominal_tile(cols),
               "TAPS": tap_group(K, C, S)}  # fmt: skip
    return config_splits(nominal, K, C, R, S, NPQ, sms)


def _tiles(meta: dict, K: int, C: int, R: int, S: int) -> int:
    """Grid axis 0 of a config: its (tap group, output-channel block, column block) tiles."""
    flat = C < FLAT_BELOW
    cols = R * S * C if flat else C
    groups = 1 if flat else R * cdiv(S, meta.get("TAPS", 1))  # wgrad_gemm's configs: one tap
    return groups * cdiv(K, meta["BLOCK_M"]) * cdiv(cols, meta["BLOCK_N"])


def config_splits(meta: dict, K: int, C: int, R: int, S: int, NPQ: int, sms: int) -> int:
    """Pixel splits of one config's launch: as many as keep its tiles times the splits within
    one program per SM, each split keeping SPLIT_PIXELS_MIN pixels, at most SPLIT_MAX. Rounding
    down keeps the last wave full: a 133rd program on 132 SMs would double the kernel's time.
    The 128-channel 3x3 at 56x56 on 132 SMs: 14 for 128x128 tiles of one tap (9 tiles), 22 for
    128x64 tiles of three (6)."""
    return max(1, min(sms // _tiles(meta, K, C, R, S), NPQ // SPLIT_PIXELS_MIN, SPLIT_MAX))


class _Plan(NamedTuple):
    """A direct call's launches (_PLANS) and what a call allocates for them."""

    main: Step  # conv_wgrad_kernel over (dz, x, dw, workspace or dw)
    reduce: Step | None  # wgrad_split_sum_kernel over (workspace, dw); None unsplit
    workspace: int  # fp32 elements of the split partials (0 unsplit)
    shape: tuple  # dW's (K, C, R, S)
    strides: tuple  # channels_last


# Direct calls' plans by _plan_key; see kernels/_launch.py
_PLANS = PlanCache()


def _plan_key(dz, x, kernel_rs, stride, padding, dilation, split_k) -> tuple:
    """Everything a direct call's launches depend on but the tensors' pointers; raises
    AttributeError or TypeError for arguments no plan can have."""
    key = (
        dz.shape, dz.stride(), x.shape, x.stride(), dz.dtype, x.dtype, dz.device, x.device,
        dz.data_ptr() % 16, x.data_ptr() % 16, tuple(kernel_rs), tuple(stride), tuple(padding),
        tuple(dilation), split_k, torch._C._get_cudnn_allow_tf32(),
    )  # fmt: skip
    hash(key)
    return key


def run(plan: _Plan, dz, x, dw, ws=None) -> torch.Tensor:
    """dw from a plan's launches: straight into dw, or split partials (into ws, plan.workspace
    fp32 elements, new where None) then their sum."""
    if plan.reduce is None:
        plan.main(dz, x, dw, dw)
    else:
        if ws is None:
            ws = x.new_empty((plan.workspace,), dtype=torch.float32)
        plan.main(dz, x, dw, ws)
        plan.reduce(ws, dw)
    return dw


def _first_run(dz, x, dw, kernel_rs, stride, padding, dilation, split_k, sms, launch,
               tma=False) -> _Plan:  # fmt: skip
    """Launch one call (dz, x as the kernel reads them; dw in the dtype it writes) and return its
    plan. split_k: every config's split (None: each its config_splits on `sms` SMs). tma: the
    GPU has TMA (a direct 1x1 then runs wgrad_gemm.py's kernel)."""
    N, K, P, Q = dz.shape
    _, C, H, W = x.shape
    R, S = kernel_rs
    NPQ, numel = N * P * Q, dw.numel()
    # fewer than FLAT_BELOW channels keep the flat kernel, as the forward does: the GEMM's
    # 64-wide channel boxes are untested on them
    gemm = (launch is direct and C >= FLAT_BELOW
            and is_wgrad_gemm(dz, x, kernel_rs, stride, padding, tma))  # fmt: skip
    if gemm:
        kernel = wgrad_gemm_kernel
    elif launch is direct:
        kernel = conv_wgrad_kernel
    else:
        kernel = _TRACEABLE if S >= 3 and C >= FLAT_BELOW else _TRACEABLE_ONE_TAP

    def splits_of(meta):
        return split_k if split_k is not None else config_splits(meta, K, C, R, S, NPQ, sms)

    def grid(meta):
        return (_tiles(meta, K, C, R, S), splits_of(meta))

    precision = dot_precision(x.dtype, torch.backends.cudnn.allow_tf32)
    if gemm:
        main = wgrad_gemm_step(dz, x, grid, precision)
    else:
        main = Step(
            launch(kernel), grid,
            (NPQ, K, C, H, W, P, Q, R, S, *stride, *padding, *dilation, *dz.stride(),
             *x.stride()),
            dict(DOT_PRECISION=precision, FLAT_TAPS=C < FLAT_BELOW),
        )  # fmt: skip
    # the workspace for the widest split any config may take; the tuned config's split decides
    # what later calls allocate and whether they sum
    widest = max(splits_of(cfg.kwargs) for cfg in kernel.configs)
    if widest > 1:
        ws = x.new_empty((widest * numel,), dtype=torch.float32)
    elif launch is direct:
        ws = dw  # never written unsplit
    else:
        # Not dw again: a traced launch's mutable arguments are functionalized one by one, so dw
        # passed twice became two clones, and the unwritten one's copy back overwrote dW with
        # uninitialised memory (docs/kernels/conv.md, "Backward")
        ws = x.new_empty((1,), dtype=torch.float32)
    main(dz, x, dw, ws)
    splits = split_k
    if splits is None:  # the tuned config's (the widest where nothing launched)
        best = getattr(kernel, "best_config", None)
        splits = widest if best is None else splits_of(best.kwargs)
    reduce = None
    if splits > 1:
        reduce = split_sum_step(numel, splits, launch)
        reduce(ws, dw)
    return _Plan(main, reduce, numel * splits if splits > 1 else 0, tuple(dw.shape),
                 tuple(dw.stride()))  # fmt: skip


def conv2d_wgrad(
    dz: torch.Tensor,
    x: torch.Tensor,
    kernel_rs,
    stride,
    padding,
    dilation,
    *,
    launch: Launcher = direct,
    split_k: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """dW (K, C, R, S) of y = conv2d(x, W) for dz = dL/dy (before any activation), channels_last,
    in x's dtype:

        dW[k, c, r, s] = sum over n, p, q of dz[n, k, p, q] · x[n, c, p·sh + r·dh - ph,
                                                                  q·sw + s·dw - pw]

    with rows and columns outside x reading zero. dz (N, K, P, Q) and x (N, C, H, W) may have any
    strides (channels_last is the fast case). kernel_rs = (R, S); stride, padding (the top/left
    offset; the bottom/right one is implied by P, Q) and dilation are pairs, already validated by
    the forward. Accumulates in fp32 (TF32 for fp32 exactly when torch.backends.cudnn.allow_tf32).
    split_k: the pixel splits of every config (None: on a GPU, each config its config_splits on
    a direct call and split_rule's on a traced one; 1 without a GPU). launch:
    kernels/ops.py passes torch.library.wrap_triton for traced calls. out: dW's memory, (K, C,
    R, S) channels_last in x's dtype (a caller running this on a side stream allocates it on
    its own), or None."""
    return planned_wgrad(dz, x, kernel_rs, stride, padding, dilation, launch=launch,
                         split_k=split_k, out=out)[0]  # fmt: skip


def planned_wgrad(dz, x, kernel_rs, stride, padding, dilation, *, launch=direct, split_k=None,
                  out=None) -> tuple[torch.Tensor, _Plan | None]:  # fmt: skip
    """conv2d_wgrad, and the plan its geometry's direct calls run (None where unplanned), which
    a caller may keep and run by `run` with no key."""
    key = None
    if launch is direct and not torch.compiler.is_compiling():
        try:
            key = _plan_key(dz, x, kernel_rs, stride, padding, dilation, split_k)
        except (AttributeError, TypeError):
            key = None
        plan = None if key is None else _PLANS.get(key)
        if plan is not None:
            dw = x.new_empty_strided(plan.shape, plan.strides) if out is None else out
            return run(plan, dz, x, dw), plan
    assert dz.dim() == 4 and x.dim() == 4, (tuple(dz.shape), tuple(x.shape))
    N, K, P, Q = dz.shape
    _, C, H, W = x.shape
    R, S = kernel_rs
    assert x.shape[0] == N, f"dz has batch {N}, x {x.shape[0]}"
    assert dz.dtype == x.dtype and dz.device == x.device, (dz.dtype, x.dtype, dz.device, x.device)
    dtype = x.dtype
    dw = out
    if dw is None:
        dw = torch.empty((K, C, R, S), device=x.device, dtype=dtype,
                         memory_format=torch.channels_last)  # fmt: skip
    if N * P * Q == 0 or dw.numel() == 0:
        return dw.zero_(), None
    upcast = is_interpreter() and dtype == torch.bfloat16
    if upcast:
        # The triton 3.8 interpreter multiplies bf16 tl.dot operands as their raw uint16 bits, so
        # run the fp32 kernel on upcast copies; the products are exact in fp32 either way, and dW
        # is rounded to bf16 once, as on the GPU.
        dz, x = dz.float(), x.float()
        dw = torch.empty_like(dw, dtype=torch.float32)
    info = gpu_info(x.device)
    if split_k is None and (info is None or launch is not direct):
        # a traced launch cannot learn the tuned config, so every config takes one split
        split_k = 1 if info is None else split_rule(K, C, R, S, N * P * Q, info.sms)
    plan = _first_run(dz, x, dw, (R, S), tuple(stride), tuple(padding), tuple(dilation),
                      split_k, None if info is None else info.sms, launch,
                      tma=info is not None and info.capability >= (9, 0))  # fmt: skip
    if key is not None and not upcast:
        _PLANS.put(key, plan)
    if not upcast:
        return dw, (plan if key is not None else None)
    if out is None:
        return dw.to(dtype), None
    return out.copy_(dw), None
