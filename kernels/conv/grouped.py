"""Grouped convolution (groups G with 1 < G < C: ResNeXt's 32 groups of 4..32 channels), bias and
activation fused, as an implicit GEMM with the groups on the grid.

The groups=1 designs reduce over all C input channels and depthwise.py's stencil over none;
group g's output channels g·K/G .. read only its C/G input channels. Per group this is an
implicit GEMM of N·P·Q rows, K/G columns and an R·S·C/G reduction: 36..288 for the ResNeXt-50
32x4d 3x3s, which do 9..72 FLOPs an output element against ~2 elements of traffic, so the layer
is memory-bound on tensor cores and cuDNN's grouped kernels are the bar. What must not happen is
wasting the memory side: a group's 4 channels are 8 bytes of a 256-byte pixel.

    tile     BLOCK_M output pixels by BLOCK_N output channels of GROUPS_PER_TILE consecutive
             groups (BLOCK_N // (K/G), at least 1, at most G): 4-channel groups fill a 16-wide
             tile four at a time, so each pixel's loads and stores are whole 16-channel runs.
             Where K/G > BLOCK_N a group spans several column tiles.
    weight   group g is rows g·K/G .. of the (K, R·S·C/G) matrix a channels_last weight
             (K, C/G, R, S) is (dispatch._weight_matrix); its (r, s, c) column is
             (r·S + s)·C/G + c. A tile of several groups reads it block-diagonally: reduction row
             c (of the tile's GROUPS_PER_TILE·C/G channels) meets column n only within one group,
             the rest load as zeros. The MMA does GROUPS_PER_TILE times the useful FLOPs, which
             it has to spare here.
    steps    the reduction is the flat (tap, channel) index in steps of BLOCK_K = TAPS runs of
             CHANNEL_BLOCK channels: the tile's channels a tap rounded up to a power of two (at
             most BLOCK_K; more channels take several steps a tap). With few channels a tap, one
             step covers several taps, as flat_reduction.py does for the C = 3 stem, but in
             power-of-two channel runs so the loads stay vectorised.
    grid     one axis of (pixel tile, group block, column tile), group blocks fastest: programs
             running together read the same pixels' channels (the same lines, once from DRAM) and
             write adjacent channel runs of the same output pixels.

No TMA (the tiles do not always partition K: 3-channel groups fill 15 of 16 columns) and no split
(the reduction is short). docs/kernels/conv.md, "Grouped".

Functions:
    grouped_reference    F.conv2d(groups=G), the float64 reference of the tests
    conv_grouped_kernel  @triton.jit, autotuned (and a hook-free copy for traced launches)
    conv_groups          G of a Conv: C over the weight matrix's channels a tap
    grouped_step         its launch for a Conv (a kernels._launch.Step), through `launch`
"""

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, direct, is_interpreter, next_power_of_2
from kernels._launch import Step
from kernels.conv.common import SIZES_ONLY, Conv, epilogue, traceable, tune_bench


def grouped_reference(x, weight, bias, stride, padding, dilation, groups):
    # 2·N·K·P·Q·(C/G)·R·S FLOPs; reads N·C·H·W + K·(C/G)·R·S, writes N·K·P·Q elements (·bytes)
    return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation, groups)


# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) for the ResNeXt-50 32x4d 3x3s on the H100
# (4, 8, 16, 32 channels a group at 56, 28, 14, 7 pixels), not yet timed: 16- and 32-wide tiles
# hold 1..8 groups (block-diagonal MMA waste 1..8x); 32-channel steps take two 16-channel taps.
GROUPED_TILES = [
    (128, 16, 16, 4, 4),  # 4 / 8 / 16 channels a group: 4 / 2 / 1 groups, one tap a step
    (256, 16, 16, 4, 8),
    (128, 16, 32, 4, 4),  # two taps a step
    (128, 32, 32, 4, 4),  # 8 / 16 / 32 channels a group: 4 / 2 / 1 groups
    (64, 32, 32, 4, 4),  # 14x14 and 7x7: more programs
    (256, 32, 32, 3, 8),
]


def grouped_configs():
    """GROUPED_TILES as configs (no pre-hook: no TMA); one small tile in the interpreter."""
    tiles = [(32, 16, 16, 1, 4)] if is_interpreter() else GROUPED_TILES
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k}, num_stages=stages,
                          num_warps=warps) for m, n, k, stages, warps in tiles]  # fmt: skip


def prune_grouped(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem (more rows than M, more columns than K) and, on
    NCHW input, the 32-column tiles that gather 32 input elements a thread: each one a 2-byte
    load whose 64-bit address the pipeline holds, they spilled (ptxas sm_90, bf16 ResNeXt-50:
    255 registers, ~450 spill stores; the 16-column and 64-row tiles stay at 194-253, none)."""
    M, K = named_args["M"], named_args["K"]
    gathered = named_args["stride_xc"] != 1
    kept = []
    for cfg in configs:
        block_m, block_n, block_k = (cfg.kwargs[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
        if block_m > max(64, next_power_of_2(M)) or block_n > max(16, next_power_of_2(K)):
            continue
        if gathered and block_n > 16 and block_m * block_k > 16 * 32 * cfg.num_warps:
            continue
        kept.append(cfg)
    return kept or configs[-1:]


def groups_per_tile(groups: int, group_k: int, block_n: int) -> int:
    """Whole groups of group_k output channels a block_n-wide tile holds (at least 1, at most
    all of them)."""
    return max(1, min(groups, block_n // group_k))


def _tile_channels(args) -> int:  # the input channels a tap of a program's groups
    return groups_per_tile(args["G"], args["GROUP_K"], args["BLOCK_N"]) * args["GROUP_C"]


def _channel_block(args) -> int:
    return min(next_power_of_2(_tile_channels(args)), args["BLOCK_K"])


def _even_c(args) -> bool:
    """Every channel run is inside the tile's channels and the tile's groups all exist: no
    channel mask (which would stop the loads from vectorising)."""
    per_tile = groups_per_tile(args["G"], args["GROUP_K"], args["BLOCK_N"])
    return _tile_channels(args) % _channel_block(args) == 0 and args["G"] % per_tile == 0


# The sizes and layouts that change the best tile
GROUPED_KEY = ["N", "C", "H", "W", "K", "P", "Q", "R", "S", "G", "conv_stride_h",
               "conv_stride_w", "dil_h", "stride_xc", "stride_yk"]  # fmt: skip


@triton.autotune(
    configs=grouped_configs(),
    key=GROUPED_KEY,
    prune_configs_by={"early_config_prune": prune_grouped},
    do_bench=tune_bench,
)
@triton.heuristics({
    "GROUPS_PER_TILE": lambda args: groups_per_tile(args["G"], args["GROUP_K"], args["BLOCK_N"]),
    "CHANNEL_BLOCK": _channel_block,
    "EVEN_C": _even_c,
})  # fmt: skip
@triton.jit(do_not_specialize=SIZES_ONLY)
def conv_grouped_kernel(
    # x: (N, C, H, W) by strides; w: the packed (K, R·S·C/G) matrix; y: (N, K, P, Q) by strides
    x, w, bias_ptr, y,
    # sizes: G groups of GROUP_C input and GROUP_K output channels
    M, N, C, H, W, K, P, Q, R, S, G,
    conv_stride_h, conv_stride_w, pad_h, pad_w, dil_h, dil_w,
    # strides, in elements
    stride_xn, stride_xc, stride_xh, stride_xw,
    stride_wk,
    stride_yn, stride_yk, stride_yp, stride_yq,
    # group shape, epilogue, tile (the last three from the heuristics above)
    GROUP_C: tl.constexpr, GROUP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUPS_PER_TILE: tl.constexpr, CHANNEL_BLOCK: tl.constexpr, EVEN_C: tl.constexpr,
):  # fmt: skip
    TILE_C: tl.constexpr = GROUPS_PER_TILE * GROUP_C  # input channels a tap of the group block
    TILE_K: tl.constexpr = GROUPS_PER_TILE * GROUP_K  # output channels of the group block
    TAPS: tl.constexpr = BLOCK_K // CHANNEL_BLOCK  # taps a step
    C_BLOCKS: tl.constexpr = (TILE_C + CHANNEL_BLOCK - 1) // CHANNEL_BLOCK  # steps a tap

    # -- program-id mapping: (pixel tile, group block, column tile), group blocks fastest --
    n_tiles: tl.constexpr = (TILE_K + BLOCK_N - 1) // BLOCK_N
    pid = tl.program_id(0)
    group_blocks = tl.cdiv(G, GROUPS_PER_TILE)
    pid_n = pid % n_tiles
    block = (pid // n_tiles) % group_blocks
    pid_m = pid // (n_tiles * group_blocks)

    # -- per output pixel, once: (n, p, q), the window's corner, the group block's channels --
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    n = offs_m // (P * Q)
    pq = offs_m - n * (P * Q)
    p = pq // Q
    q = pq - p * Q
    ih0 = p * conv_stride_h - pad_h
    iw0 = q * conv_stride_w - pad_w
    # int64: batch × image stride can pass 2^31
    x_img = x + n.to(tl.int64) * stride_xn + (block * TILE_C) * stride_xc
    c_left = C - block * TILE_C  # channels of the last group block that exist (G % per tile)

    # -- per output channel: its group within the block and its weight row --
    offs_j = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # column within the group block
    offs_n = block * TILE_K + offs_j
    n_ok = (offs_j < TILE_K) & (offs_n < K)
    col_group = offs_j // GROUP_K
    w_rows = w + offs_n * stride_wk

    # -- main loop: steps of TAPS taps by CHANNEL_BLOCK channels over the flat reduction --
    offs_k = tl.arange(0, BLOCK_K)
    steps = tl.cdiv(R * S, TAPS) * C_BLOCKS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(steps):
        tap_step = step // C_BLOCKS
        if TAPS == 1:  # one tap a step: decoded as scalars, one bounds check per pixel
            c = (step - tap_step * C_BLOCKS) * CHANNEL_BLOCK + offs_k
            r = tap_step // S
            s = tap_step - r * S
            ih = ih0 + r * dil_h
            iw = iw0 + s * dil_w
            pix_ok = m_ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)  # zero padding reads 0
            pix_off = ih * stride_xh + iw * stride_xw
            a_ptrs = x_img[:, None] + pix_off[:, None] + (c * stride_xc)[None, :]
            k_ok = c < TILE_C  # true under EVEN_C, where no load reads it
            if EVEN_C:
                a = tl.load(a_ptrs, mask=pix_ok[:, None], other=0.0)
            else:
                k_ok = k_ok & (c < c_left)
                a = tl.load(a_ptrs, mask=pix_ok[:, None] & k_ok[None, :], other=0.0)
            tap = tap_step
        else:  # TAPS runs of CHANNEL_BLOCK channels (C_BLOCKS == 1): a 2-D bounds mask
            c = offs_k % CHANNEL_BLOCK
            tap = tap_step * TAPS + offs_k // CHANNEL_BLOCK
            k_ok = tap < R * S
            if not EVEN_C:
                k_ok = k_ok & (c < TILE_C) & (c < c_left)
            r = tap // S
            s = tap - r * S
            dh = r * dil_h
            dw = s * dil_w
            ih = ih0[:, None] + dh[None, :]
            iw = iw0[:, None] + dw[None, :]
            ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W) & (m_ok[:, None] & k_ok[None, :])
            x_win = x_img + ih0 * stride_xh + iw0 * stride_xw
            k_off = dh * stride_xh + dw * stride_xw + c * stride_xc
            a = tl.load(x_win[:, None] + k_off[None, :], mask=ok, other=0.0)
        # the weight tile: row (tap, c) of column n reads n's weight at (tap, c mod C/G), a run
        # of C/G columns in bounds whatever the groups; the block diagonal is kept after the load
        # so the loads stay vectorised
        row_group = c // GROUP_C
        b_ptrs = w_rows[None, :] + (tap * GROUP_C + (c - row_group * GROUP_C))[:, None]
        if EVEN_C and TAPS == 1:
            b = tl.load(b_ptrs, mask=n_ok[None, :], other=0.0)
        else:
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
        if GROUPS_PER_TILE > 1:  # row c meets only its own group's columns
            b = tl.where(row_group[:, None] == col_group[None, :], b, 0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)

    # -- write-back: bias + activation in fp32, one rounding, masked store --
    y_row = n.to(tl.int64) * stride_yn + p * stride_yp + q * stride_yq
    epilogue(acc, y, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk, HAS_BIAS, ACTIVATION)


_TRACEABLE = traceable(conv_grouped_kernel.configs, GROUPED_KEY, conv_grouped_kernel.fn)


def conv_groups(conv: Conv) -> int:
    """G of a Conv: its C input channels over the weight matrix's channels a tap."""
    return conv.C // (conv.w2d.shape[1] // (conv.R * conv.S))


def grouped_step(conv: Conv, *, launch=direct):
    """(Step, None) of a grouped `conv` (dispatch.prepare with groups: weight (K, C/G, R, S)) by
    conv_grouped_kernel through `launch`; the step's tensors are (x, w2d, bias, y), and it takes
    no scratch (no split). Direct and traced launches alike: pointer loads only."""
    groups = conv_groups(conv)
    group_k = conv.K // groups
    kernel = conv_grouped_kernel if launch is direct else _TRACEABLE

    M = conv.M  # not conv: the plan keeps this grid (common.row_tiles)

    def grid(meta):
        per_tile = groups_per_tile(groups, group_k, meta["BLOCK_N"])
        n_tiles = cdiv(per_tile * group_k, meta["BLOCK_N"])
        return (cdiv(M, meta["BLOCK_M"]) * cdiv(groups, per_tile) * n_tiles,)

    step = Step(
        launch(kernel), grid,
        (conv.M, conv.N, conv.C, conv.H, conv.W, conv.K, conv.P, conv.Q, conv.R, conv.S, groups,
         *conv.stride, *conv.padding, *conv.dilation,
         *conv.x.stride(), conv.w2d.stride(0), *conv.y.stride()),
        dict(GROUP_C=conv.C // groups, GROUP_K=group_k, **conv.constexprs),
    )  # fmt: skip
    return step, None
