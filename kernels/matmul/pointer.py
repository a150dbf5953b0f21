"""C = act(A @ B + bias) with pointer loads, one program per (tile, K slice): the GEMM for every
GPU without TMA, the interpreter, operands whose strides or offsets TMA cannot take, and launches
traced by torch.compile (kernels/ops.py). Any strides: transposed and sliced views need no copy.

With split_k > 1 each program sums one slice of K into an fp32 partial tile, and
kernels/matmul/splitk.py's reduce kernel adds the slices and runs the epilogue.

Batched (BATCHED, torch.matmul's broadcast batch: kernels/matmul/batched.py): `batch` GEMMs of
one shape in one launch, grid axis 0 holding (matrix, tile) batch-major, each operand moved to
its matrix by its own batch stride (0 where broadcast). The batch arguments come last with
defaults, so a 2-D launch passes none of them and compiles to the same code as without them.
Batched launches do not split K.

Functions:
    pointer_configs() -> [triton.Config]
        The autotuner's tiles on a GPU (pruned by M, see prune_by_m).
    interpreter_configs(**extra) -> [triton.Config]
        The one small tile used under TRITON_INTERPRET=1.
    prune_by_m(configs, M) -> [triton.Config]
        The tiles that suit M rows (skinny, mid, large); also the TMA kernel's pruning.
    matmul_kernel[grid](a_ptr, b_ptr, c_ptr, bias_ptr, preact_ptr, partial_ptr, M, N, K, split_k,
                        strides..., HAS_BIAS, ACTIVATION, STORE_PREACT, INPUT_PRECISION,
                        UPCAST_TO_FP32, SPLIT, tile, [batch, batch strides, BATCHED])
        @triton.autotune'd kernel; grid (tiles, split_k), or (batch * tiles, 1) when BATCHED.
"""

import triton
import triton.language as tl

from kernels._common import is_interpreter
from kernels.matmul.epilogue import bias_activation, grouped_tile

# Rows of A at or below which a GEMM counts as skinny (decode): small-BLOCK_M tiles and split-K.
SKINNY_M = 128


def make_config(block_m, block_n, block_k, num_stages, num_warps, **extra) -> triton.Config:
    meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 8, **extra}
    return triton.Config(meta, num_stages=num_stages, num_warps=num_warps)


def pointer_configs() -> list[triton.Config]:
    """Pointer-kernel tiles for sm_80/sm_90, fp16/bf16 first.

    Configs whose shared memory does not fit (128x256 in fp32) fail to compile, and the
    autotuner then skips them; prune_by_m drops the ones that do not suit the shape.
    """
    return [
        make_config(128, 256, 64, 3, 8),
        make_config(256, 128, 64, 3, 8),
        make_config(128, 128, 64, 4, 8),
        make_config(128, 128, 64, 3, 4),
        make_config(64, 128, 64, 4, 4),
        make_config(128, 64, 64, 4, 4),
        make_config(64, 64, 32, 5, 4),
        # skinny
        make_config(16, 128, 128, 4, 4),
        make_config(64, 64, 128, 4, 4),
    ]


def interpreter_configs(**extra) -> list[triton.Config]:
    """One small tile for TRITON_INTERPRET=1: with a single config the autotuner benchmarks
    nothing, and small tiles keep masked edge tiles cheap in numpy."""
    meta = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, **extra}
    return [triton.Config(meta, num_stages=1, num_warps=4)]


def prune_by_m(configs, M):
    """By M: up to 32 rows, the skinny tiles (16-row ones included); up to SKINNY_M rows, the
    64-row tiles (16-row tiles lost 2x at M = 128 on the H100); beyond, 128 rows and more."""
    if M <= 32:
        kept = [c for c in configs if c.kwargs["BLOCK_M"] <= 64]
    elif M <= SKINNY_M:
        kept = [c for c in configs if 32 < c.kwargs["BLOCK_M"] <= 64]
    else:
        kept = [c for c in configs if c.kwargs["BLOCK_M"] >= 128]
    return kept or configs


def _prune(configs, named_args, **kwargs):
    if is_interpreter():
        return configs
    return prune_by_m(configs, named_args["M"])


@triton.autotune(
    configs=interpreter_configs() if is_interpreter() else pointer_configs(),
    key=["M", "N", "K", "split_k", "batch"],  # batch: absent (so not keyed) in 2-D launches
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def matmul_kernel(
    # pointers: operands, output, the epilogue's bias and pre-activation (None when unused), and
    # the fp32 (split_k, M, N) partial sums when SPLIT
    a_ptr, b_ptr, c_ptr, bias_ptr, preact_ptr, partial_ptr,
    # sizes: A is M×K, B is K×N, C is M×N; K is cut into split_k slices (1: no split)
    M, N, K, split_k,
    # strides in elements, so transposed and sliced views need no copy; preact shares C's
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias,
    # meta-parameters: epilogue switches, dot precision, K split, then the tile shape
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
    INPUT_PRECISION: tl.constexpr, UPCAST_TO_FP32: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # batched launches only: the matrix count (an autotuning key; the grid covers it), each
    # operand's batch stride in elements (0: broadcast; C's is also Z's) and the switch. 2-D
    # launches leave them out.
    batch=None, stride_ab=None, stride_bb=None, stride_cb=None, BATCHED: tl.constexpr = False,
):  # fmt: skip
    # ---- program-id mapping: grouped, for L2 reuse; axis 1 is the K slice ----
    pid = tl.program_id(0)
    if BATCHED:
        # axis 0 is (matrix, tile), batch-major; int64 offsets, as a batch may pass 2**31 elements
        tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        matrix = (pid // tiles).to(tl.int64)
        pid = pid % tiles
        a_ptr += matrix * stride_ab
        b_ptr += matrix * stride_bb
        c_ptr += matrix * stride_cb
        if STORE_PREACT:
            preact_ptr += matrix * stride_cb
    pid_m, pid_n = grouped_tile(pid, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_tiles, split_k)
    k_lo = tl.program_id(1) * k_per_split
    k_hi = min(k_lo + k_per_split, k_tiles)

    # ---- pointer setup ----
    # Rows and columns past the edge wrap back into the matrix, so A and B loads need only a K
    # mask; the wrapped results land in C positions that the store masks out.
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_k0 = k_lo * BLOCK_K + offs_k
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k0[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k0[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn

    # ---- main loop: fp32 accumulation over this program's K slice ----
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST_TO_FP32:
            # The interpreter's dot multiplies bf16 as raw uint16 bits; its cast to fp32 is right.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # ---- write-back: fp32 partial tile, or the epilogue in fp32 then C (and Z) ----
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT:
        p_offsets = tl.program_id(1) * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(partial_ptr + p_offsets, acc, mask=c_mask)
    else:
        c_offsets = offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        z, y = bias_activation(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS,
                               ACTIVATION)  # fmt: skip
        if STORE_PREACT:
            tl.store(preact_ptr + c_offsets, z.to(preact_ptr.dtype.element_ty), mask=c_mask)
        tl.store(c_ptr + c_offsets, y.to(c_ptr.dtype.element_ty), mask=c_mask)
