"""Split-K for skinny GEMMs on the pointer path: how many K slices, and the reduce kernel that
sums the slices' fp32 partial tiles and runs the epilogue.

Decode shapes (M of a few dozen rows, large K) have too few output tiles to stream the weight
through every SM; cutting K into slices multiplies the work items. On the Hopper TMA path this
two-launch split never paid (its skinny tiles already stream the weight at cuBLAS speed:
docs/kernels/matmul.md, "Which ideas paid off"), so only the pointer kernel takes it; the TMA
kernel splits or streams K in one launch instead, on wgrad-like GEMMs past SKINNY_M rows
(tma.split_plan), its shared tiles summed by split_k_gather below.

Functions:
    auto_split_k(M, N, K, num_sms) -> int
        K slices for a pointer-kernel launch (1: no split).
    splitk_reduce_kernel[grid](partial_ptr, c_ptr, bias_ptr, preact_ptr, M, N, stride_bias,
                               HAS_BIAS, ACTIVATION, STORE_PREACT, SPLIT_K, BLOCK_M, BLOCK_N)
        C = act(sum of the SPLIT_K partials + bias), and Z when STORE_PREACT; in slice order.
    splitk_reduce_step(split_k, M, N, bias, preact, act_id, launch) -> Step
        Its launch (kernels._launch.Step) for a (split_k, M, N) fp32 partial buffer.
    split_k_gather(acc, ws_ptr, lock_ptr, tile, slot, count, slots, BLOCK_M, BLOCK_N)
        @triton.jit -> (acc, last): a tile's K steps shared by `count` programs of one launch,
        the last to arrive summing the partials (the TMA GEMM's split-K and stream-K,
        kernels/matmul/tma.py, and the conv designs' split-K).
"""

import triton
import triton.language as tl

from kernels._common import cdiv
from kernels._launch import Step
from kernels.matmul.epilogue import bias_activation
from kernels.matmul.pointer import SKINNY_M


def auto_split_k(M: int, N: int, K: int, num_sms: int) -> int:
    """K slices for skinny GEMMs: enough (tile, slice) work items to give every SM its own stream
    of B, with each slice still at least 512 deep so the pipeline runs at full depth."""
    if M > SKINNY_M:
        return 1
    tiles = cdiv(M, 64) * cdiv(N, 128)
    split = 1
    while tiles * split * 2 <= 2 * num_sms and K // (split * 2) >= 512 and split < 16:
        split *= 2
    return split


@triton.jit
def splitk_reduce_kernel(
    # pointers: fp32 partial sums (SPLIT_K, M, N) contiguous, C and Z (contiguous M×N), bias
    partial_ptr, c_ptr, bias_ptr, preact_ptr,
    M, N, stride_bias,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    offsets = offs_m[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(partial_ptr + M * N * s + offsets, mask=mask, other=0.0)
    z, y = bias_activation(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS, ACTIVATION)
    if STORE_PREACT:
        tl.store(preact_ptr + offsets, z.to(preact_ptr.dtype.element_ty), mask=mask)
    tl.store(c_ptr + offsets, y.to(c_ptr.dtype.element_ty), mask=mask)


def splitk_reduce_step(split_k, M, N, bias, preact, act_id, launch):
    """splitk_reduce_kernel's launch as a kernels._launch Step; its lead is (partial, c, bias,
    preact), partial being the (split_k, M, N) fp32 buffer."""
    block_m, block_n = 16, 256
    return Step(
        launch(splitk_reduce_kernel), (cdiv(N, block_n), cdiv(M, block_m)),
        (M, N, bias.stride(0) if bias is not None else 0),
        dict(HAS_BIAS=bias is not None, ACTIVATION=act_id, STORE_PREACT=preact is not None,
             SPLIT_K=split_k, BLOCK_M=block_m, BLOCK_N=block_n),
    )  # fmt: skip


@triton.jit
def split_k_gather(acc, ws_ptr, lock_ptr, tile, slot, count, slots,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):  # fmt: skip
    """One launch, last-arriving program reduces: each of the `count` programs that hold a part
    of `tile`'s K steps stores its fp32 partial tile in its slot of the workspace (tile-local
    (slots, BLOCK_M, BLOCK_N) slots, no masks), then bumps the tile's counter. The program that
    finds count - 1 there sums the count slots (L2 loads) and returns (sum, True); it also resets
    the counter to 0, so the cached counters stay zero between calls. No program ever waits on
    another, so no scheduling order can deadlock. Split-K passes its SPLIT_K as count and
    slots; stream-K the contributors of this tile, which differ from tile to tile."""
    offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    base = ws_ptr + tile.to(tl.int64) * (slots * BLOCK_M * BLOCK_N)
    tl.store(base + slot * (BLOCK_M * BLOCK_N) + offs, acc, cache_modifier=".cg")
    tl.debug_barrier()  # every thread's partial is written before the counter moves
    arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
    last = arrived == count - 1
    if last:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in range(0, count):
            acc += tl.load(base + s * (BLOCK_M * BLOCK_N) + offs, cache_modifier=".cg")
        tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")
    return acc, last
