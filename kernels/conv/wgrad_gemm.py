"""The 1x1 conv's weight gradient as a plain GEMM with TMA operands: for a 1x1, stride-1,
unpadded conv between NHWC tensors, dW (K, C) = dZ^T X with dZ an (N·H·W, K) and X an
(N·H·W, C) matrix, so the pixels need no decoding and no bounds masks, and both operands
arrive by TMA boxes of (BLOCK_K pixels, channels), dZ's transposed in shared memory for the
wgmma. wgrad.py's per-tap kernel reads them with pointer loads and pixel arithmetic built for
taps that shift; on a 1x1 that ran at about half of cuBLAS's GEMM (docs/kernels/conv.md,
"Backward").

The reduction over pixels is split over grid axis 1 as wgrad.py splits it (config_splits), into
the same workspace slabs and the same sum; unsplit, the program rounds dW once. A split's
pixels are whole BLOCK_K steps, so a box reads past its split only at the last pixel, where TMA
fills zeros.

Direct launches on Hopper only (host descriptors); traced launches and other GPUs keep
wgrad.py's kernel.

Functions:
    wgrad_gemm_kernel  @triton.jit, autotuned
    is_wgrad_gemm      whether a wgrad is this GEMM
    wgrad_gemm_step    its launch as a kernels._launch.Step over (dz, x, dw, ws)
"""

import torch
import triton
import triton.language as tl

from kernels._common import is_interpreter, next_power_of_2
from kernels._launch import BLOCK_HOOKS, Step
from kernels.conv.common import TensorDescriptor, as_matrix, tma_ok, tune_bench

# (BLOCK_M output channels, BLOCK_N input channels, BLOCK_K pixels, num_stages, num_warps)
WGRAD_GEMM_TILES = [
    (128, 128, 64, 4, 8),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 5, 4),
    (128, 256, 64, 3, 8),
]
INTERPRETER_TILE = (16, 32, 16, 1, 4)
WGRAD_GEMM_KEY = ["NPQ", "K", "C"]


def set_gemm_blocks(nargs):
    """Autotune pre-hook: the descriptors' boxes of this config, (pixels, channels) each."""
    for name, width in (("dz", nargs["BLOCK_M"]), ("x", nargs["BLOCK_N"])):
        arg = nargs.get(name)
        if TensorDescriptor is not None and isinstance(arg, TensorDescriptor):
            arg.block_shape = [nargs["BLOCK_K"], width]


BLOCK_HOOKS.add(set_gemm_blocks)  # an armed launch reads the tuned boxes off its descriptors


def _configs():
    tiles = [INTERPRETER_TILE] if is_interpreter() else WGRAD_GEMM_TILES
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_stages=stages,
                          num_warps=warps, pre_hook=set_gemm_blocks)
            for bm, bn, bk, stages, warps in tiles]  # fmt: skip


def _prune(configs, named_args, **kwargs):
    """Drop tiles far wider than the problem's K or C."""
    K, C = named_args["K"], named_args["C"]
    kept = [cfg for cfg in configs
            if cfg.kwargs["BLOCK_M"] <= max(64, next_power_of_2(K))
            and cfg.kwargs["BLOCK_N"] <= max(64, next_power_of_2(C))]  # fmt: skip
    return kept or configs[-1:]


@triton.autotune(configs=_configs(), key=WGRAD_GEMM_KEY, do_bench=tune_bench,
                 prune_configs_by={"early_config_prune": _prune})  # fmt: skip
@triton.jit
def wgrad_gemm_kernel(
    # dz: (NPQ, K) and x: (NPQ, C) TMA descriptors; dw: dW's (K, C) matrix, written unsplit;
    # ws: fp32 (K, C) slabs, one per split (grid axis 1)
    dz, x, dw, ws,
    NPQ, K, C,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # columns fastest: programs that run together share dZ's box
    pid = tl.program_id(0)
    col_blocks = tl.cdiv(C, BLOCK_N)
    off_k = (pid // col_blocks) * BLOCK_M
    off_c = (pid % col_blocks) * BLOCK_N
    splits = tl.num_programs(1)
    per_split = tl.cdiv(tl.cdiv(NPQ, BLOCK_K), splits) * BLOCK_K
    lo = tl.program_id(1) * per_split
    hi = tl.minimum(lo + per_split, NPQ)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for pix in tl.range(lo, hi, BLOCK_K):
        a = dz.load([pix, off_k])  # (BLOCK_K, BLOCK_M)
        b = x.load([pix, off_c])  # (BLOCK_K, BLOCK_N)
        acc = tl.dot(tl.trans(a), b, acc, input_precision=DOT_PRECISION)
    offs_k = off_k + tl.arange(0, BLOCK_M)
    offs_c = off_c + tl.arange(0, BLOCK_N)
    mask = (offs_k[:, None] < K) & (offs_c[None, :] < C)
    tile = offs_k[:, None] * C + offs_c[None, :]
    # an empty split (past the last pixel) writes zeros: the workspace needs no clearing
    if splits == 1:
        tl.store(dw + tile, acc.to(dw.dtype.element_ty), mask=mask)
    else:
        slab = tl.program_id(1).to(tl.int64) * (K * C)
        tl.store(ws + slab + tile, acc, mask=mask)


def _matrix(t: torch.Tensor) -> torch.Tensor:
    N, C, H, W = t.shape
    return t.as_strided((N * H * W, C), (t.stride(3), 1))


def is_wgrad_gemm(dz, x, kernel_rs, stride, padding, tma: bool) -> bool:
    """A wgrad this kernel takes: 1x1, stride 1, unpadded, both tensors NHWC matrices TMA can
    read (16-bit, 16-byte aligned rows), on a GPU with TMA (`tma`)."""
    unit = tuple(kernel_rs) == (1, 1) and tuple(stride) == (1, 1) and tuple(padding) == (0, 0)
    return (tma and unit and dz.dtype in (torch.float16, torch.bfloat16) and as_matrix(dz)
            and as_matrix(x) and tma_ok(_matrix(dz)) and tma_ok(_matrix(x)))  # fmt: skip


def wgrad_gemm_step(dz, x, grid, precision: str) -> Step:
    """The launch over (dz, x, dw, ws): descriptors of dz's and x's matrices in lead slots 0
    and 1 (the pre-hook sets their boxes), `grid` a function of the config."""
    NPQ, K = _matrix(dz).shape
    C = x.shape[1]
    descs = [(0, 0, (NPQ, K), (dz.stride(3), 1), (64, 64)),
             (1, 1, (NPQ, C), (x.stride(3), 1), (64, 64))]  # fmt: skip
    return Step(wgrad_gemm_kernel, grid, (NPQ, K, C), dict(DOT_PRECISION=precision),
                descs=descs)  # fmt: skip
