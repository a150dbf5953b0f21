"""What every conv design shares: the problem record, the fused epilogue, single-launch split-K,
and the autotuner set-up (configs, TMA block pre-hook, pruning, GPU-time benchmarking, the
hook-free copies torch.compile traces).

The kernels (one module per design: gemm.py, implicit_gemm.py, flat_reduction.py, window.py)
compute y = conv(x, weight) + bias, then the activation, as an implicit GEMM: rows are the output
pixels (M = N·P·Q), columns the output channels (K), and the reduction runs over the filter taps
(R·S·C, ordered r, s, c). The weight is read as a (K, R·S·C) row-major matrix, byte for byte a
channels_last weight (K, C, R, S).

Functions:
    conv2d_reference     F.conv2d, the float64 reference of the tests
    Conv                 one validated call: operands, sizes, epilogue constexprs
    FlippedTaps          how a dgrad's sub-conv reads the forward's weight matrix in place
    weight_columns       the (first, per-r, per-s) weight-matrix columns of a Conv's taps
    weight_tile          @triton.jit: the (BLOCK_K, BLOCK_N) weight tile of one tap step
    bias_activation      @triton.jit: bias + activation on the fp32 accumulator
    epilogue             @triton.jit: bias + activation, one rounding, masked store by pointers
    tma_ok               a 2-D operand TMA can describe
    as_matrix            an (N, C, H, W) tensor is an (N·H·W, C) matrix
    output_desc          the (M, K) TMA descriptor of an NHWC output where TMA applies
    weight_desc          the weight matrix's TMA descriptor where TMA applies
    config, window_config, configs_of   the autotuners' triton.Config lists
    set_tma_blocks       autotune pre-hook: the TMA descriptors' block shapes of a config
    prune                autotune pruning: tiles far wider than the problem, taps TMA would cross
    tune_bench           autotune timer: GPU time of calls after an L2 flush
    autotune             triton.autotune with prune and tune_bench
    traceable            the same jit function under a hook-free autotuner (launch=wrap_triton)
    SIZES_ONLY, CONV_KEY the implicit / flat / window kernels' unspecialised sizes and tuning key
    split_scratch        fp32 workspace and arrival counters of a split-K launch
    row_tiles            output tiles of a (BLOCK_M, BLOCK_N) config, a function of its meta
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import (
    cdiv,
    gpu_ms_flushed,
    is_interpreter,
    next_power_of_2,
    tile_counters,
)
from kernels._launch import BLOCK_HOOKS
from kernels.matmul import apply_activation

try:  # host-side TMA descriptors (triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: pointer loads only
    TensorDescriptor = None


def conv2d_reference(x, weight, bias, stride, padding, dilation):
    # 2·N·K·P·Q·C·R·S FLOPs; reads N·C·H·W + K·C·R·S, writes N·K·P·Q elements (·bytes each)
    return torch.nn.functional.conv2d(x, weight, bias, stride, padding, dilation)


class FlippedTaps(NamedTuple):
    """How a dgrad's stride-1 sub-conv (backward.py) reads the forward's weight in place: w2d is
    the forward's (K_fwd, R·S·C_fwd) matrix, its row the sub-conv's reduction channel and its
    column, within tap (r, s) of the sub-conv, col0 + r·col_r + s·col_s + the output channel.
    The sub-conv's taps are the forward's flipped, a stride apart (col_r, col_s <= 0), so no
    transposed copy of the weight is made (docs/kernels/conv.md, "Backward (training)")."""

    col0: int
    col_r: int
    col_s: int


class Conv(NamedTuple):
    """One validated conv2d call, as the designs launch it (built by dispatch.prepare, and by
    backward.py for a dgrad's sub-convs)."""

    x: torch.Tensor  # (N, C, H, W), any strides
    w2d: torch.Tensor  # the weight as a (K, R·S·C) matrix with unit inner stride
    bias: torch.Tensor | None
    y: torch.Tensor  # (N, K, P, Q), allocated: NHWC when x is, else NCHW
    N: int
    C: int
    H: int
    W: int
    K: int
    P: int
    Q: int
    R: int
    S: int
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    constexprs: dict  # HAS_BIAS, ACTIVATION, DOT_PRECISION
    flip: FlippedTaps | None = None  # w2d is the forward's weight, read transposed (a dgrad)

    @property
    def M(self) -> int:
        return self.N * self.P * self.Q


def weight_columns(conv: Conv) -> tuple[int, int, int]:
    """(first column, columns per r, per s) of the weight taps the implicit and window kernels
    read: the packed (K, R·S·C) matrix's (0, S·C, C), or a dgrad's FlippedTaps."""
    return conv.flip if conv.flip is not None else (0, conv.S * conv.C, conv.C)


# ---------------------------------------------------------------------------------------------
# Shared @triton.jit helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS: tl.constexpr,
                    ACTIVATION: tl.constexpr):  # fmt: skip
    """bias + activation on the fp32 accumulator."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    return apply_activation(acc, ACTIVATION)


@triton.jit
def epilogue(acc, y_ptr, bias_ptr, y_row, offs_n, m_ok, n_ok, stride_yk,
             HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):  # fmt: skip
    """bias + activation in fp32, one rounding, masked store; y_row is each row's offset."""
    acc = bias_activation(acc, bias_ptr, offs_n, n_ok, HAS_BIAS, ACTIVATION)
    y_ptrs = y_ptr + y_row[:, None] + offs_n[None, :] * stride_yk
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def weight_tile(w, r, s, c0, pid_n, offs_c, offs_n, n_ok, C, stride_wk, w_col0, w_col_r, w_col_s,
                B_TMA: tl.constexpr, W_FLIP: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """The (BLOCK_K, BLOCK_N) weight tile of tap (r, s), reduction channels c0 + offs_c, output
    channels pid_n·BLOCK_N + offs_n. Packed (K, R·S·C) matrix: a (BLOCK_N, BLOCK_K) box at row
    pid_n·BLOCK_N, transposed. W_FLIP (FlippedTaps): a (BLOCK_K, BLOCK_N) box of the forward's
    matrix at row c0 as it lies. A flipped box may run past the tap's columns into the next tap
    (or, at the matrix's end, TMA's zero fill): those columns only feed output channels >= K,
    which no store writes."""
    col = w_col0 + r * w_col_r + s * w_col_s
    c = c0 + offs_c
    if W_FLIP:
        if B_TMA:
            b = w.load([c0, col + pid_n * BLOCK_N])
        else:
            b_ptrs = w + c[:, None] * stride_wk + (col + offs_n)[None, :]
            b = tl.load(b_ptrs, mask=(c < C)[:, None] & n_ok[None, :], other=0.0)
    else:
        if B_TMA:
            b = w.load([pid_n * BLOCK_N, col + c0]).T
        else:
            b_ptrs = w + offs_n[None, :] * stride_wk + (col + c)[:, None]
            b = tl.load(b_ptrs, mask=(c < C)[:, None] & n_ok[None, :], other=0.0)
    return b


# ---------------------------------------------------------------------------------------------
# Host-side operands
# ---------------------------------------------------------------------------------------------
def tma_ok(t: torch.Tensor) -> bool:
    """A 2-D operand TMA can describe: 16-bit dtype, unit inner stride, 16-byte aligned rows."""
    return (
        t.dtype in (torch.float16, torch.bfloat16)
        and t.stride(1) == 1
        and (t.stride(0) * t.element_size()) % 16 == 0
        and t.data_ptr() % 16 == 0
    )


def as_matrix(t: torch.Tensor) -> bool:
    """t (N, C, H, W) is an (N·H·W, C) matrix: unit channel stride, pixels evenly spaced."""
    N, C, H, W = t.shape
    sn, sc, sh, sw = t.stride()
    return sc == 1 and (H == 1 or sh == W * sw) and (N == 1 or sn == H * W * sw) and sw >= C


def output_desc(conv: Conv, tma: bool):
    """(descriptor spec or None, Y_TMA): an NHWC output is an (M, K) matrix, written by TMA
    stores where TMA applies (lead slot 3, tensor 3: kernels._launch.DescSpec; the pre-hook sets
    the box); y itself, written by strides, otherwise."""
    y = conv.y
    if not as_matrix(y):
        return None, False
    y2d = y.as_strided((conv.M, conv.K), (y.stride(3), 1))
    if not (tma and tma_ok(y2d)):
        return None, False
    return (3, 3, (conv.M, conv.K), (y.stride(3), 1), (64, 64)), True


def weight_desc(conv: Conv, tma: bool, per_tap: bool = False):
    """(descriptor spec or None, B_TMA): the weight matrix by TMA (lead slot 1) where TMA applies
    and, for the packed matrix of the per-tap designs (per_tap), C % 32 == 0 (a flipped read's
    box runs along output channels, whatever C is)."""
    w2d = conv.w2d
    if per_tap and conv.flip is None and conv.C % 32:
        tma = False
    if not (tma and tma_ok(w2d)):
        return None, False
    return (1, 1, tuple(w2d.shape), (w2d.stride(0), 1), (64, 64)), True


# ---------------------------------------------------------------------------------------------
# Autotuning
# ---------------------------------------------------------------------------------------------
def config(block_m, block_n, block_k, num_stages, num_warps, group_m=8):
    meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m}
    return triton.Config(meta, num_stages=num_stages, num_warps=num_warps,
                         pre_hook=set_tma_blocks)  # fmt: skip


def window_config(block_h, block_w, block_n, block_k, num_stages, num_warps, group_m=8):
    meta = {"BLOCK_H": block_h, "BLOCK_W": block_w, "BLOCK_N": block_n, "BLOCK_K": block_k,
            "GROUP_M": group_m}  # fmt: skip
    return triton.Config(meta, num_stages=num_stages, num_warps=num_warps,
                         pre_hook=set_tma_blocks)  # fmt: skip


def set_tma_blocks(nargs):
    """Autotune pre-hook: give the TMA descriptors (when used) the block shape of this config."""
    block_n, block_k = nargs["BLOCK_N"], nargs["BLOCK_K"]
    if "BLOCK_H" in nargs:  # the window kernel's 4-D boxes: one image, BLOCK_H x BLOCK_W pixels
        x_block = [1, nargs["BLOCK_H"], nargs["BLOCK_W"], block_k]
        y_block = [1, nargs["BLOCK_H"], nargs["BLOCK_W"], block_n]
    else:
        x_block = [nargs["BLOCK_M"], block_k]
        y_block = [nargs["BLOCK_M"], block_n]
    w_block = [block_k, block_n] if nargs.get("W_FLIP") else [block_n, block_k]
    for name, shape in (("x", x_block), ("w", w_block), ("y", y_block)):
        arg = nargs.get(name)
        if TensorDescriptor is not None and isinstance(arg, TensorDescriptor):
            arg.block_shape = shape


BLOCK_HOOKS.add(set_tma_blocks)  # an armed launch reads the tuned blocks off its descriptors


def configs_of(tiles):
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps) tiles as configs; one small tile in
    the interpreter (nothing to tune; tl.dot needs dims >= 16)."""
    if is_interpreter():
        return [config(32, 32, 16, 1, 4, group_m=2)]
    return [config(*tile) for tile in tiles]


def prune(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem (K output channels, M rows), tiles narrower than 64
    channels where K is wider than them, the persistent 1x1 GEMM's channel steps under 64 where C
    is deeper than them and, under TMA, tiles whose channel step does not divide C (the weight
    tile would run into the next tap)."""
    K, M = named_args["K"], named_args["M"]
    c_gemm = named_args.get("C")
    # the implicit kernel's weight tile spans C only within one tap; past C it would read the
    # next tap's weights (the gemm kernel's descriptors end at C and zero-fill instead)
    split_taps = kwargs.get("B_TMA", False) and "R" in named_args and not kwargs.get("W_FLIP")
    split = kwargs.get("SPLIT_K", 1) > 1
    kept = []
    for cfg in configs:
        meta = dict(cfg.kwargs)
        if "BLOCK_H" in meta:
            meta["BLOCK_M"] = meta["BLOCK_H"] * meta["BLOCK_W"]
        # split-K serves layers with few output tiles: the 128-channel-wide tiles of at most 128
        # rows only (which also keeps the compiles down: one per config and split)
        if split and (meta["BLOCK_N"] != 128 or meta["BLOCK_M"] > 128 or meta["BLOCK_K"] != 64):
            continue
        if meta["BLOCK_N"] > max(64, next_power_of_2(K)):
            continue
        if meta["BLOCK_N"] < 64 and K > meta["BLOCK_N"]:  # the narrow tiles: few channels only
            continue
        # the persistent 1x1 GEMM's shallow channel steps: few input channels only
        if "PER_SM" in meta and meta["BLOCK_K"] < 64 and c_gemm > meta["BLOCK_K"]:
            continue
        if meta["BLOCK_M"] > max(64, next_power_of_2(M)):
            continue
        if split_taps and c_gemm % meta["BLOCK_K"] != 0:
            continue
        kept.append(cfg)
    return kept or configs[-1:]


def tune_bench(kernel_call, quantiles):
    """The autotuner's timer: the median GPU time of 20 calls, each after an L2 flush, behind a
    sleep kernel (kernels._common.gpu_ms_flushed), as the benchmark times them. Back-to-back
    calls keep a layer's 1-13 MB of input in L2 and rank tiles by a warm-cache speed the timed
    call never sees (docs/kernels/conv.md, "Tuned as timed"); triton's default do_bench counts
    the launch path whenever it outlasts these 10-50 us convolutions."""
    ms = gpu_ms_flushed(kernel_call, 20)
    return [ms for _ in quantiles] if quantiles else ms


def autotune(configs, key):
    return triton.autotune(
        configs=configs,
        key=key,
        prune_configs_by={"early_config_prune": prune},
        do_bench=tune_bench,
    )


def traceable(configs, key, fn):
    """`fn` under a second autotuner for torch.compile (launch=wrap_triton): plain configs with
    no pre-hook, the default timer and no pruning, which is what torch can trace in a
    user-defined Triton kernel. Only the pointer-load variants run there."""
    plain = [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages)
             for c in configs]  # fmt: skip
    return triton.autotune(configs=plain, key=list(key))(fn)


# Sizes that only bound loops and masks: not specialised on (== 1, % 16), so the ResNet layers
# share compiled kernels instead of compiling every config again per spatial size. Channel counts,
# strides and R, S stay specialised: they decide load vectorisation and the 1x1 shortcuts.
SIZES_ONLY = ["M", "N", "H", "W", "P", "Q", "pad_h", "pad_w", "dil_h", "dil_w"]
# The autotuning key of the implicit, flat and window kernels
CONV_KEY = ["N", "C", "H", "W", "K", "P", "Q", "R", "S", "conv_stride_h", "conv_stride_w",
            "dil_h", "stride_xc", "stride_yk", "B_TMA", "SPLIT_K", "W_FLIP"]  # fmt: skip


def no_scratch(device, workspace=None):
    """The (workspace, counters) of an unsplit launch: none."""
    return None, None


def split_scratch(kernel, split_k, tiles_of):
    """A function of the device giving a split-K launch's (fp32 workspace for every tile's
    SPLIT_K partial tiles, per-tile arrival counters: kernels._common.tile_counters, cached per
    stream, zero between calls). Sized for the largest grid any of the kernel's configs can
    launch (tiles_of(meta): that config's tile count); the workspace is new each call, or the
    caller's (`workspace`, `numel` fp32 elements: a kept backward allocates it with its outputs)."""
    tiles = ws = 0
    for cfg in kernel.configs:
        meta = cfg.kwargs
        block_m = meta.get("BLOCK_M") or meta["BLOCK_H"] * meta["BLOCK_W"]
        count = tiles_of(meta)
        tiles = max(tiles, count)
        ws = max(ws, count * block_m * meta["BLOCK_N"])

    def scratch(device, workspace=None):
        locks = tile_counters(device, tiles, minimum=4096)
        if workspace is None:
            workspace = torch.empty(ws * split_k, device=device, dtype=torch.float32)
        return workspace, locks

    scratch.numel = ws * split_k
    return scratch


def row_tiles(conv: Conv):
    """The output tiles of a (BLOCK_M rows) x (BLOCK_N channels) config, as a function of its
    meta. It keeps the sizes, not `conv`: a plan keeps its grid, and a grid holding the Conv
    record held the first call's input and output alive for the plan's life."""
    M, K = conv.M, conv.K

    def tiles(meta) -> int:
        return cdiv(M, meta["BLOCK_M"]) * cdiv(K, meta["BLOCK_N"])

    return tiles
