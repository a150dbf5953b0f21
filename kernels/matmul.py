"""C = A @ B, with an optional bias + activation epilogue fused into the write-back.

This is the repo's one GEMM. As `matmul` it has to keep up with cuBLAS (torch.matmul) on Hopper;
`kernels.linear` reuses it for its forward and both backward products, passing weight.T as
swapped strides and fusing the bias add and activation into the store, which eager PyTorch does
as separate passes over the output.

Two kernels, one epilogue:
    matmul_tma_kernel      Hopper (sm_90+): TMA tensor descriptors built on the device, a
                           persistent grid of at most one program per SM walking the output tiles
                           in grouped order, wgmma fed from a multi-stage shared-memory pipeline.
                           Each operand is read through a descriptor over its stored layout, so a
                           transposed view (weight.t() in linear, dZ.t() in its backward) costs
                           nothing. Needs 16-byte aligned storage offsets and row strides.
    matmul_kernel          Pointer loads, one program per tile: every other GPU, the interpreter,
                           inputs whose strides or offsets TMA cannot take, and (TMA_WHEN_TRACED)
                           launches traced by torch.compile.
    matmul_tma_r3_kernel   The Hopper kernel's body with an explicit tile instead of the
                           autotuner, host-side TensorDescriptors (HOST_DESC) or device-side
                           ones, and an optional single-launch split-K whose last K slice per
                           tile reduces the fp32 partials (a per-tile counter) and runs the
                           epilogue. Shipped (round 4, VARIANT = "hd") for 16-bit direct
                           launches on the TMA path: hd_config's tile, host descriptors, no
                           split; matmul_tma_kernel stays for fp32, explicit split-K requests
                           and variant="default" / "autotune".
The first two take split_k: with split_k > 1 the K range is cut into slices that run as separate
work items writing fp32 partial tiles, and splitk_reduce_kernel sums them and applies the epilogue.
That is for skinny (decode) shapes, M of a few dozen rows with large K, where the output tiles
alone are too few to stream the weight through every SM.

Functions:
    matmul(a, b) -> c
        Public: the 2-D torch.matmul. fp16/bf16/fp32 in, same dtype out, fp32 accumulation.
    _matmul(a, b, *, launch=direct) -> c
        Checks the inputs, then launches through `launch` (kernels/ops.py passes
        torch.library.wrap_triton); allocates with torch ops only.
    fused_matmul(a, b, bias=None, act_id=0, save_preact=False, *, launch=direct, path=None,
                 split_k=None, variant=None, config=None) -> (c, z | None)
        The launch behind both, with no input checks: c = act(a @ b + bias); z is the
        pre-activation a @ b + bias, returned only when save_preact (for linear's backward).
        path ("tma" or "pointer") and split_k override the automatic choice (tests, probes).
        variant / config: which Hopper kernel and tile 16-bit TMA calls take (VARIANT, r3_plan;
        "hd" by default, "default" for the autotuned kernel).
    plan(a, b) -> (path, split_k)
        The automatic choice: shapes, strides and the device's capability, never its name.
    check_matmul_args(a, b)
        The TypeError/ValueError checks `_matmul` runs.
    apply_activation(x, ACTIVATION)
        @triton.jit helper: act(x) in fp32 for an id from ACTIVATIONS.
    grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)
        @triton.jit helper: the grouped (L2-friendly) tile order shared with kernels/conv.py.

The ids of ACTIVATIONS are also exported as tl.constexpr globals (NONE, RELU, GELU, GELU_TANH,
SILU) so kernels can name them.
"""


import torch
import triton
import triton.language as tl

from kernels._common import (
    ACTIVATIONS,
    cdiv,
    check_same,
    check_tensor,
    direct,
    dot_precision,
    gpu_info,
    is_interpreter,
    tile_counters,
)

# Kernels may only read globals that are tl.constexpr. Keep a tensor on the left of any arithmetic
# with them: the interpreter cannot evaluate constexpr * tensor.
NONE = tl.constexpr(ACTIVATIONS["none"])
RELU = tl.constexpr(ACTIVATIONS["relu"])
GELU = tl.constexpr(ACTIVATIONS["gelu"])
GELU_TANH = tl.constexpr(ACTIVATIONS["gelu_tanh"])
SILU = tl.constexpr(ACTIVATIONS["silu"])
SQRT_HALF = tl.constexpr(0.7071067811865476)  # 1/sqrt(2), for exact gelu
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)  # sqrt(2/pi), for tanh-approximate gelu
GELU_TANH_CUBIC = tl.constexpr(0.044715)

# Host-side switches of the Hopper kernel (module globals so a probe can flip them; both are part
# of the autotuning key). FLATTEN lets the software pipeline run across tile boundaries of the
# persistent loop; WARP_SPECIALIZE asks for producer/consumer warps where Triton supports them.
FLATTEN = True
WARP_SPECIALIZE = False
# One program per SM looping over the tiles; False launches one program per tile instead.
PERSISTENT = True
# Launches through torch.library.wrap_triton (the triton-compiled mode) take the pointer kernel:
# Inductor's handling of device-side TMA descriptors (scratch allocation, descriptor-store
# mutation analysis) has not been checked on the GPU with torch 2.11. Direct calls use TMA.
TMA_WHEN_TRACED = False
# Which kernel a 16-bit TMA launch (direct, not traced) takes. fused_matmul's `variant` keyword
# picks one per call; VARIANT is the default for calls that give none:
#   "hd"       (shipped, round 4) matmul_tma_r3_kernel with host-side TensorDescriptors and the
#              tile of hd_config: 16x64x256 s5 w4 for M <= 32, 64x64x128 s6 w4 for M <= SKINNY_M,
#              wave_config's tile where 128x256 tiles make at most R3_MAX_WAVES waves, and
#              128x256x64 s3 w8 subtiled beyond; no split-K. Round 3 measured host descriptors
#              ahead of the autotuned kernel on every shape tried (0.70 -> 0.87 at 1024^3,
#              0.90 -> 0.98 at 2048^3, 0.92 -> 1.02 at 128x4096x4096, 0.95 -> 1.09 at
#              16x4096x4096). An explicit split_k > 1 without a config takes "default".
#   "default"  the autotuned matmul_tma_kernel (device-side descriptors); "autotune" is an alias.
#              Set VARIANT = "default" to go back to the round-3 behaviour.
#   "wave"     matmul_tma_r3_kernel with an explicit tile from wave_config (the largest tile
#              whose count fills ~one wave), device-side descriptors, no split
#   "wave-hd"  the same with host-side TensorDescriptors (no per-program descriptor creation)
#   "sk"       single-launch split-K where the tiles fill under half a wave (split_config):
#              each (tile, K slice) stores an fp32 partial, the last slice to finish (a per-tile
#              counter) sums them in order and runs the epilogue; otherwise as "wave"
#   "sk-hd"    the same with host-side descriptors
# For wave/wave-hd/sk/sk-hd, shapes the heuristics leave alone (more than R3_MAX_WAVES waves of
# 128x256 tiles, or skinny M) keep the default kernel. fp32 and traced launches keep the default
# kernel whatever the variant.
VARIANT = "hd"
# Column blocks of matmul_tma_r3_kernel's subtiled (EPILOGUE_SUBTILE) epilogue, by whether it
# runs an activation: each block adds its slice of the bias, activates and is stored by TMA
# before the next, so fewer registers are live at once (offline sm_90 compile, 128x256x64 s3 w8,
# bias + exact gelu: 255 registers and 48 B of spills with the round-4 full-tile epilogue; see
# kernels/notes/matmul.md, round 5). A config's "EPILOGUE_SPLITS" key overrides (1, 2 or 4).
# Round 4's BIAS_IN_ACC (the bias starting the accumulator) is gone: 0.42-0.45x eager on the H100.
EPILOGUE_SPLITS = 2
EPILOGUE_SPLITS_ACT = 4
VARIANTS = ("default", "wave", "wave-hd", "sk", "sk-hd", "hd")
VARIANT_ALIASES = {"autotune": "default"}
R3_MAX_WAVES = 2


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # 2·M·N·K FLOPs; reads (M·K + K·N)·bytes and writes M·N·bytes, so it is compute-bound
    # once M, N and K are all more than a few hundred.
    return a @ b


# ---------------------------------------------------------------------------------------------
# Autotuning configurations
# ---------------------------------------------------------------------------------------------
def _config(block_m, block_n, block_k, num_stages, num_warps, **extra):
    meta = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": 8, **extra}
    return triton.Config(meta, num_stages=num_stages, num_warps=num_warps)


# Rows of A at or below which a GEMM counts as skinny (decode): small-BLOCK_M tiles and split-K.
SKINNY_M = 128


def hopper_configs() -> list[triton.Config]:
    """Pointer-kernel tiles for sm_80/sm_90 (the fallback path on Hopper), fp16/bf16 first.

    Configs whose shared memory does not fit (128x256 in fp32) fail to compile, and the
    autotuner then skips them; _prune_pointer drops the ones that do not suit the shape.
    """
    return [
        _config(128, 256, 64, 3, 8),
        _config(256, 128, 64, 3, 8),
        _config(128, 128, 64, 4, 8),
        _config(128, 128, 64, 3, 4),
        _config(64, 128, 64, 4, 4),
        _config(128, 64, 64, 4, 4),
        _config(64, 64, 32, 5, 4),
        # skinny
        _config(16, 128, 128, 4, 4),
        _config(64, 64, 128, 4, 4),
    ]


def tma_configs() -> list[triton.Config]:
    """Hopper TMA tiles, chosen from the H100 probe sweeps (kernels/notes/matmul.md). 16-bit:
    128x256 with two consumer warpgroups for large problems (EPILOGUE_SUBTILE stores the tile in
    two halves, halving the epilogue's shared-memory staging), 128x128 for mid sizes, BLOCK_M 64
    and 16 for skinny ones. fp32 (tf32) gets BLOCK_K 32 tiles: the same bytes per stage as
    BLOCK_K 64 in 16-bit. _prune_tma picks by dtype and M. The autotuner benchmarks them in this
    order while the GPU warms up, so the measured best comes first."""

    def cfg(bm, bn, bk, stages, warps, subtile=False):
        return _config(bm, bn, bk, stages, warps, EPILOGUE_SUBTILE=subtile)

    return [
        # 16-bit, large: the best three of the round-2 sweep (TFLOP/s at 8192^3 and at
        # 4096x14336x4096: 793/762, 773/770, 718/772; cuBLAS 775/734) and a 128x128 tile for
        # mid sizes
        cfg(128, 256, 64, 3, 8, subtile=True),
        cfg(128, 256, 64, 3, 8),
        cfg(128, 256, 64, 4, 8, subtile=True),
        cfg(128, 128, 64, 4, 8),
        # small problems (1024^3: 128 tiles of 128x64 against 64 of 128x128, which ran at 0.69x
        # cuBLAS; the pointer kernel's 128x64 reached 0.87x there)
        cfg(128, 64, 64, 4, 4),
        # 16-bit, skinny (M <= SKINNY_M)
        cfg(64, 128, 128, 4, 4),
        cfg(64, 64, 128, 6, 4),
        cfg(64, 256, 64, 4, 4),
        cfg(16, 64, 256, 5, 4),
        cfg(16, 32, 256, 6, 4),
        # fp32 / tf32
        cfg(128, 128, 32, 4, 8),
        cfg(128, 256, 32, 3, 8),
        cfg(64, 128, 32, 4, 4),
    ]


def interpreter_configs(**extra) -> list[triton.Config]:
    """One small tile for TRITON_INTERPRET=1: with a single config the autotuner benchmarks
    nothing, and small tiles keep masked edge tiles cheap in numpy."""
    meta = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 4, **extra}
    return [triton.Config(meta, num_stages=1, num_warps=4)]


def _element_size(named_args) -> int:
    return named_args["a_ptr"].element_size()


def _prune_by_m(configs, M):
    """By M: up to 32 rows, the skinny tiles (16-row ones included); up to SKINNY_M rows, the
    64-row tiles (16-row tiles lost 2x at M = 128 on the H100); beyond, 128 rows and more."""
    if M <= 32:
        kept = [c for c in configs if c.kwargs["BLOCK_M"] <= 64]
    elif M <= SKINNY_M:
        kept = [c for c in configs if 32 < c.kwargs["BLOCK_M"] <= 64]
    else:
        kept = [c for c in configs if c.kwargs["BLOCK_M"] >= 128]
    return kept or configs


def _prune_tma(configs, named_args, **kwargs):
    if is_interpreter():
        return configs
    wide = _element_size(named_args) == 4
    by_dtype = [c for c in configs if (c.kwargs["BLOCK_K"] == 32) == wide]
    return _prune_by_m(by_dtype or configs, named_args["M"])


def _prune_pointer(configs, named_args, **kwargs):
    if is_interpreter():
        return configs
    return _prune_by_m(configs, named_args["M"])


# ---------------------------------------------------------------------------------------------
# Shared @triton.jit helpers
# ---------------------------------------------------------------------------------------------
@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """act(x) for fp32 x; ACTIVATION is an id from ACTIVATIONS, so untaken branches compile away."""
    if ACTIVATION == RELU:
        x = tl.maximum(x, 0.0)
    elif ACTIVATION == GELU:
        # Exact gelu x·Phi(x), Phi the normal CDF, without tl.erf: libdevice's erff evaluates
        # both of its branches an element (~63 SASS instructions, sm_90), and in the matmul
        # epilogue that ran with the tensor cores idle (0.80x eager vs 1.02 for gelu_tanh on the
        # H100). Here Q = Phi(-|x|) = erfc(u)/2 with u = |x|/sqrt(2), and erfc(u) =
        # t·exp(-u² + P(t)), t = 1/(1 + u/2), P a degree-9 polynomial (Numerical Recipes'
        # erfcc, fractional error < 1.2e-7 for all u): one division, one exp, ~22 instructions,
        # no branches. Against float64 in fp32 (CPU, exact exp and division): gelu's relative
        # error <= 3.3e-6 wherever |gelu| > 1e-6 (the 1 + erf form loses the negative tail to
        # cancellation: 7e-2 there), and <= 2.3e-7 of |x| everywhere (1 + erf form: 1.6e-7).
        u = tl.abs(x) * SQRT_HALF
        t = 1.0 / (1.0 + 0.5 * u)
        p = t * 0.17087277 - 0.82215223
        p = p * t + 1.48851587
        p = p * t - 1.13520398
        p = p * t + 0.27886807
        p = p * t - 0.18628806
        p = p * t + 0.09678418
        p = p * t + 0.37409196
        p = p * t + 1.00002368
        q = 0.5 * t * tl.exp(p * t - 1.26551223 - u * u)
        x = x * tl.where(x < 0.0, q, 1.0 - q)
    elif ACTIVATION == GELU_TANH:
        # 0.5·x·(1 + tanh(u)) == x·sigmoid(2u); triton.language has no tanh.
        x = x * tl.sigmoid((x + x * x * x * GELU_TANH_CUBIC) * (2.0 * SQRT_2_OVER_PI))
    elif ACTIVATION == SILU:
        x = x * tl.sigmoid(x)
    return x


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(tile row, tile column) of program `pid`, walking GROUP_M tile-rows column by column.

    Programs that run together then share A rows and B columns in L2 instead of streaming all
    of B for every row of tiles. Used by every GEMM-shaped kernel (matmul, conv).
    """
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias,
              HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):  # fmt: skip
    """(z, act(z)) with z = acc + bias, all fp32."""
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    return acc, apply_activation(acc, ACTIVATION)


@triton.jit
def _halves(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The left and right column halves of an fp32 (BLOCK_M, BLOCK_N) block. In the wgmma
    accumulator layout the top column bits index a thread's registers, so this moves nothing."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def _epilogue_store(x, off_m, col, N, bias_ptr, stride_bias, c_desc, z_desc, c_ptr, preact_ptr,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
                    STORE_N: tl.constexpr):  # fmt: skip
    """One column block of the subtiled epilogue: z = x + bias[col:col + STORE_N] (its slice
    loaded here, not the whole tile's), then Z (when STORE_PREACT) and act(z) by TMA."""
    if HAS_BIAS:
        offs_n = col + tl.arange(0, STORE_N)
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        x = x + bias.to(tl.float32)[None, :]
    if STORE_PREACT:
        z_desc.store([off_m, col], x.to(preact_ptr.dtype.element_ty))
    c_desc.store([off_m, col], apply_activation(x, ACTIVATION).to(c_ptr.dtype.element_ty))


@triton.jit
def _operand_descriptors(a_ptr, b_ptr, M, N, K, stride_a, stride_b,
                         A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr):  # fmt: skip
    """Device-side TMA descriptors of A and B as stored (TMA zero-fills reads past the edges)."""
    if A_COL_MAJOR:
        a_desc = tl.make_tensor_descriptor(
            a_ptr, shape=[K, M], strides=[stride_a, 1], block_shape=[BLOCK_K, BLOCK_M]
        )
    else:
        a_desc = tl.make_tensor_descriptor(
            a_ptr, shape=[M, K], strides=[stride_a, 1], block_shape=[BLOCK_M, BLOCK_K]
        )
    if B_COL_MAJOR:
        b_desc = tl.make_tensor_descriptor(
            b_ptr, shape=[N, K], strides=[stride_b, 1], block_shape=[BLOCK_N, BLOCK_K]
        )
    else:
        b_desc = tl.make_tensor_descriptor(
            b_ptr, shape=[K, N], strides=[stride_b, 1], block_shape=[BLOCK_K, BLOCK_N]
        )
    return a_desc, b_desc


@triton.jit
def _work_item(work, split_k, k_per_split, k_tiles, num_pid_m, num_pid_n,
               SPLIT: tl.constexpr, GROUP_M: tl.constexpr):  # fmt: skip
    """(tile, split, first K step, end K step, tile row, tile column) of a persistent program's
    work item. With SPLIT a tile's K slices are adjacent work items, so they run side by side;
    without, the K range is the whole of K, with bounds the compiler can see."""
    if SPLIT:
        tile = work // split_k
        split = work % split_k
        k_lo = split * k_per_split
        k_hi = min(k_lo + k_per_split, k_tiles)
    else:
        tile = work
        split = 0
        k_lo = 0
        k_hi = k_tiles
    pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
    return tile, split, k_lo, k_hi, pid_m, pid_n


@triton.jit
def _tma_mainloop(a_desc, b_desc, off_m, off_n, k_lo, k_hi,
                  A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
                  UPCAST_TO_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):  # fmt: skip
    """The fp32 (BLOCK_M, BLOCK_N) accumulator over K steps [k_lo, k_hi), tiles loaded by TMA."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        off_k = ki * BLOCK_K
        if A_COL_MAJOR:
            a = a_desc.load([off_k, off_m]).T
        else:
            a = a_desc.load([off_m, off_k])
        if B_COL_MAJOR:
            b = b_desc.load([off_n, off_k]).T
        else:
            b = b_desc.load([off_k, off_n])
        if UPCAST_TO_FP32:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc


@triton.jit
def _store_masked(y, z, offs_m, offs_n, M, N, stride_c, c_ptr, preact_ptr,
                  STORE_PREACT: tl.constexpr):  # fmt: skip
    """Pointer stores of C (and Z) for a row-major output, masked at the edges."""
    c_offsets = offs_m[:, None] * stride_c + offs_n[None, :]
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if STORE_PREACT:
        tl.store(preact_ptr + c_offsets, z.to(preact_ptr.dtype.element_ty), mask=c_mask)
    tl.store(c_ptr + c_offsets, y.to(c_ptr.dtype.element_ty), mask=c_mask)


# ---------------------------------------------------------------------------------------------
# Pointer kernel (any GPU, the interpreter, unaligned inputs)
# ---------------------------------------------------------------------------------------------
@triton.autotune(
    configs=interpreter_configs() if is_interpreter() else hopper_configs(),
    key=["M", "N", "K", "split_k"],
    prune_configs_by={"early_config_prune": _prune_pointer},
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
):  # fmt: skip
    # ---- program-id mapping: grouped, for L2 reuse; axis 1 is the K slice ----
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
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
        z, y = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS, ACTIVATION)
        if STORE_PREACT:
            tl.store(preact_ptr + c_offsets, z.to(preact_ptr.dtype.element_ty), mask=c_mask)
        tl.store(c_ptr + c_offsets, y.to(c_ptr.dtype.element_ty), mask=c_mask)


# ---------------------------------------------------------------------------------------------
# Hopper kernel: TMA descriptors, persistent grouped tiles
# ---------------------------------------------------------------------------------------------
@triton.autotune(
    configs=interpreter_configs(EPILOGUE_SUBTILE=False) if is_interpreter() else tma_configs(),
    key=["M", "N", "K", "split_k", "A_COL_MAJOR", "B_COL_MAJOR", "FLATTEN", "WARP_SPECIALIZE"],
    prune_configs_by={"early_config_prune": _prune_tma},
)
@triton.jit
def matmul_tma_kernel(
    # pointers: as matmul_kernel's
    a_ptr, b_ptr, c_ptr, bias_ptr, preact_ptr, partial_ptr,
    # sizes: A is M×K, B is K×N, C is M×N; K is cut into split_k slices (1: no split)
    M, N, K, split_k,
    # the one non-unit stride of each operand's storage (elements), then the bias stride
    stride_a, stride_b, stride_c, stride_bias,
    # storage layouts: A_COL_MAJOR means A is stored (K, M) row-major (a.t() of a contiguous
    # tensor), B_COL_MAJOR that B is stored (N, K) row-major (weight.t() in linear)
    A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
    # epilogue switches; TMA_STORE is False when C's rows are not 16-byte aligned
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
    TMA_STORE: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST_TO_FP32: tl.constexpr,
    SPLIT: tl.constexpr, FLATTEN: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
):  # fmt: skip
    # ---- descriptors over the operands as stored: TMA zero-fills reads past the edges ----
    a_desc, b_desc = _operand_descriptors(a_ptr, b_ptr, M, N, K, stride_a, stride_b, A_COL_MAJOR,
                                          B_COL_MAJOR, BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip
    STORE_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
    if TMA_STORE:
        c_desc = tl.make_tensor_descriptor(
            c_ptr, shape=[M, N], strides=[stride_c, 1], block_shape=[BLOCK_M, STORE_N]
        )
        if STORE_PREACT:
            z_desc = tl.make_tensor_descriptor(
                preact_ptr, shape=[M, N], strides=[stride_c, 1], block_shape=[BLOCK_M, STORE_N]
            )

    # ---- persistent loop over (tile, K slice) work items in grouped order ----
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_tiles, split_k)
    num_work = num_pid_m * num_pid_n * split_k
    for work in tl.range(tl.program_id(0), num_work, tl.num_programs(0), flatten=FLATTEN,
                         warp_specialize=WARP_SPECIALIZE):  # fmt: skip
        tile, split, k_lo, k_hi, pid_m, pid_n = _work_item(
            work, split_k, k_per_split, k_tiles, num_pid_m, num_pid_n, SPLIT, GROUP_M
        )
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_mainloop(a_desc, b_desc, off_m, off_n, k_lo, k_hi, A_COL_MAJOR, B_COL_MAJOR,
                            UPCAST_TO_FP32, INPUT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip

        # ---- write-back ----
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if SPLIT:
            p_offsets = split * M * N + offs_m[:, None] * N + offs_n[None, :]
            p_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            tl.store(partial_ptr + p_offsets, acc, mask=p_mask)
        else:
            z, y = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS,
                             ACTIVATION)  # fmt: skip
            if TMA_STORE:
                if EPILOGUE_SUBTILE:
                    # Two (BLOCK_M, BLOCK_N/2) stores: half the shared-memory staging.
                    y0, y1 = tl.split(tl.permute(tl.reshape(y, (BLOCK_M, 2, STORE_N)), (0, 2, 1)))
                    c_desc.store([off_m, off_n], y0.to(c_ptr.dtype.element_ty))
                    c_desc.store([off_m, off_n + STORE_N], y1.to(c_ptr.dtype.element_ty))
                    if STORE_PREACT:
                        z0, z1 = tl.split(
                            tl.permute(tl.reshape(z, (BLOCK_M, 2, STORE_N)), (0, 2, 1))
                        )
                        z_desc.store([off_m, off_n], z0.to(preact_ptr.dtype.element_ty))
                        z_desc.store([off_m, off_n + STORE_N], z1.to(preact_ptr.dtype.element_ty))
                else:
                    c_desc.store([off_m, off_n], y.to(c_ptr.dtype.element_ty))
                    if STORE_PREACT:
                        z_desc.store([off_m, off_n], z.to(preact_ptr.dtype.element_ty))
            else:
                _store_masked(y, z, offs_m, offs_n, M, N, stride_c, c_ptr, preact_ptr,
                              STORE_PREACT)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Round-3 Hopper kernel: explicit config, host- or device-side descriptors, in-kernel split-K
# ---------------------------------------------------------------------------------------------
@triton.jit
def matmul_tma_r3_kernel(
    # pointers as matmul_tma_kernel's, plus lock_ptr: one int32 counter per output tile, zero
    # between launches (the last K slice of a tile resets its counter)
    a_ptr, b_ptr, c_ptr, bias_ptr, preact_ptr, partial_ptr, lock_ptr,
    # host-side TensorDescriptors of A, B (as stored), C and Z when HOST_DESC, else None
    a_hd, b_hd, c_hd, z_hd,
    M, N, K, split_k,
    stride_a, stride_b, stride_c, stride_bias,
    A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
    TMA_STORE: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST_TO_FP32: tl.constexpr,
    SPLIT: tl.constexpr, HOST_DESC: tl.constexpr, FLATTEN: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, EPILOGUE_SPLITS: tl.constexpr = 0,
):  # fmt: skip
    # The TMA store's column blocks: EPILOGUE_SPLITS (1, 2 or 4) when given, else 2 for
    # EPILOGUE_SUBTILE and 1 without (the host passes epilogue_splits(), and sizes the host-side
    # C and Z descriptors' blocks to match).
    SPLITS: tl.constexpr = EPILOGUE_SPLITS if EPILOGUE_SPLITS else (2 if EPILOGUE_SUBTILE else 1)
    tl.static_assert(SPLITS == 1 or SPLITS == 2 or SPLITS == 4, "EPILOGUE_SPLITS: 1, 2 or 4")
    STORE_N: tl.constexpr = BLOCK_N // SPLITS
    if HOST_DESC:
        a_desc = a_hd
        b_desc = b_hd
        c_desc = c_hd
        z_desc = z_hd
    else:
        a_desc, b_desc = _operand_descriptors(a_ptr, b_ptr, M, N, K, stride_a, stride_b,
                                              A_COL_MAJOR, B_COL_MAJOR, BLOCK_M, BLOCK_N,
                                              BLOCK_K)  # fmt: skip
        c_desc = c_hd
        z_desc = z_hd
        if TMA_STORE:
            c_desc = tl.make_tensor_descriptor(
                c_ptr, shape=[M, N], strides=[stride_c, 1], block_shape=[BLOCK_M, STORE_N]
            )
            if STORE_PREACT:
                z_desc = tl.make_tensor_descriptor(
                    preact_ptr, shape=[M, N], strides=[stride_c, 1],
                    block_shape=[BLOCK_M, STORE_N],
                )  # fmt: skip

    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_tiles, split_k)
    num_work = num_pid_m * num_pid_n * split_k
    for work in tl.range(tl.program_id(0), num_work, tl.num_programs(0), flatten=FLATTEN):
        tile, split, k_lo, k_hi, pid_m, pid_n = _work_item(
            work, split_k, k_per_split, k_tiles, num_pid_m, num_pid_n, SPLIT, GROUP_M
        )
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_mainloop(a_desc, b_desc, off_m, off_n, k_lo, k_hi, A_COL_MAJOR, B_COL_MAJOR,
                            UPCAST_TO_FP32, INPUT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip

        if SPLIT:
            # Partials are tile-major, (tiles, split_k, BLOCK_M, BLOCK_N) fp32: each slice's block
            # is contiguous, written whole (TMA zero-filled the rows and columns past the edge).
            tile_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            tile_base = partial_ptr + tile.to(tl.int64) * (split_k * BLOCK_M * BLOCK_N)
            tl.store(tile_base + split * (BLOCK_M * BLOCK_N) + tile_offs, acc)
            # Every thread's partial is written before the counter moves (release); the slice
            # that moves it last (acquire) sums all partials in slice order, so the result does
            # not depend on which slice finished last. Nobody waits: no deadlock whatever the
            # number of programs.
            tl.debug_barrier()
            arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
            last = arrived == split_k - 1
            if last:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for s in range(0, split_k):
                    acc += tl.load(tile_base + s * (BLOCK_M * BLOCK_N) + tile_offs,
                                   cache_modifier=".cg")  # fmt: skip
                tl.atomic_xchg(lock_ptr + tile, 0, sem="relaxed", scope="gpu")
        else:
            last = True  # a Python bool: the write-back below is unconditional, as in
            # matmul_tma_kernel
        # (the conditions are split so that the TMA_STORE / SPLITS choice stays a
        # compile-time one when `last` is a runtime flag)
        if TMA_STORE and SPLITS > 1:
            if last:
                # Subtiled epilogue: split the accumulator into SPLITS column blocks first, then per
                # block load its slice of the bias, add, activate, store. The activation's
                # temporaries and the broadcast bias cover 1/SPLITS of the tile, and a block's
                # registers die once it is stored (the full-tile epilogue at 128x256 / 8 warps held
                # the bias for all 256 columns: 255 registers and spills with exact gelu).
                h0, h1 = _halves(acc, BLOCK_M, BLOCK_N)
                if SPLITS == 4:
                    q0, q1 = _halves(h0, BLOCK_M, BLOCK_N // 2)
                    _epilogue_store(q0, off_m, off_n, N, bias_ptr, stride_bias, c_desc, z_desc,
                                    c_ptr, preact_ptr, HAS_BIAS, ACTIVATION, STORE_PREACT,
                                    STORE_N)  # fmt: skip
                    _epilogue_store(q1, off_m, off_n + STORE_N, N, bias_ptr, stride_bias,
                                    c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                                    STORE_PREACT, STORE_N)  # fmt: skip
                    q2, q3 = _halves(h1, BLOCK_M, BLOCK_N // 2)
                    _epilogue_store(q2, off_m, off_n + 2 * STORE_N, N, bias_ptr, stride_bias,
                                    c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                                    STORE_PREACT, STORE_N)  # fmt: skip
                    _epilogue_store(q3, off_m, off_n + 3 * STORE_N, N, bias_ptr, stride_bias,
                                    c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                                    STORE_PREACT, STORE_N)  # fmt: skip
                else:
                    _epilogue_store(h0, off_m, off_n, N, bias_ptr, stride_bias, c_desc, z_desc,
                                    c_ptr, preact_ptr, HAS_BIAS, ACTIVATION, STORE_PREACT,
                                    STORE_N)  # fmt: skip
                    _epilogue_store(h1, off_m, off_n + STORE_N, N, bias_ptr, stride_bias,
                                    c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                                    STORE_PREACT, STORE_N)  # fmt: skip
        else:
            if last:
                offs_m = off_m + tl.arange(0, BLOCK_M)
                offs_n = off_n + tl.arange(0, BLOCK_N)
                z, y = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS,
                                 ACTIVATION)  # fmt: skip
                if TMA_STORE:  # one store of the whole tile (SPLITS == 1)
                    c_desc.store([off_m, off_n], y.to(c_ptr.dtype.element_ty))
                    if STORE_PREACT:
                        z_desc.store([off_m, off_n], z.to(preact_ptr.dtype.element_ty))
                else:
                    _store_masked(y, z, offs_m, offs_n, M, N, stride_c, c_ptr, preact_ptr,
                                  STORE_PREACT)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Split-K reduction with the epilogue
# ---------------------------------------------------------------------------------------------
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
    z, y = _epilogue(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS, ACTIVATION)
    if STORE_PREACT:
        tl.store(preact_ptr + offsets, z.to(preact_ptr.dtype.element_ty), mask=mask)
    tl.store(c_ptr + offsets, y.to(c_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------
def check_matmul_args(a, b) -> None:
    check_tensor("a", a, ndim=2)
    check_tensor("b", b, ndim=2)
    check_same({"a": a, "b": b})
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dims differ: a has shape {tuple(a.shape)} and b has shape {tuple(b.shape)}; "
            "need a (M, K) and b (K, N)"
        )


def _device_info(device: torch.device) -> tuple[bool, int]:
    """(has TMA, SM count): capability >= 9.0 (kernels._common.gpu_info), never the GPU's name;
    (False, 1) where no GPU runs the kernels."""
    info = gpu_info(device)
    if info is None:
        return False, 1
    return info.capability >= (9, 0), info.sms


def _tma_layout(t: torch.Tensor) -> tuple[bool, int] | None:
    """(column-major?, the non-unit stride) when TMA can read the 2-D t as stored, else None.

    TMA wants a unit last stride, the other stride and the start 16-byte aligned. The start is
    judged by the storage offset: torch's allocators align storages to far more than 16 bytes,
    and unlike data_ptr() the offset is known while torch.compile traces with fake tensors.
    """
    size = t.element_size()
    if (t.storage_offset() * size) % 16:
        return None
    rows, cols = t.shape
    if t.stride(1) == 1 and (t.stride(0) * size) % 16 == 0 and t.stride(0) >= cols:
        return False, t.stride(0)
    if t.stride(0) == 1 and (t.stride(1) * size) % 16 == 0 and t.stride(1) >= rows:
        return True, t.stride(1)
    return None


def _auto_split_k(M: int, N: int, K: int, num_sms: int) -> int:
    """K slices for skinny GEMMs: enough (tile, slice) work items to give every SM its own stream
    of B, with each slice still at least 512 deep so the pipeline runs at full depth."""
    if M > SKINNY_M:
        return 1
    tiles = cdiv(M, 64) * cdiv(N, 128)
    split = 1
    while tiles * split * 2 <= 2 * num_sms and K // (split * 2) >= 512 and split < 16:
        split *= 2
    return split


def plan(a: torch.Tensor, b: torch.Tensor) -> tuple[str, int]:
    """("tma" or "pointer", split_k) for a @ b: by capability, layout, dtype and shape.

    Measured on an H100 (kernels/notes/matmul.md): split-K never paid on the TMA path, whose
    skinny tiles (BLOCK_M 16-64) already stream the weight at cuBLAS speed, so it is off there.
    TF32 on Hopper needs K-major operands; fused_matmul copies a wrong-way operand for large
    fp32 problems, but for skinny ones the copy would cost more than the GEMM, so those take the
    pointer kernel with split-K (0.89x cuBLAS at 16x4096x4096 against 0.51x on TMA).
    """
    has_tma, num_sms = _device_info(a.device)
    M, K = a.shape
    N = b.shape[1]
    tf32 = dot_precision(a.dtype, torch.backends.cuda.matmul.allow_tf32) == "tf32"
    if has_tma and _tma_layout(a) and _tma_layout(b) and not (tf32 and M <= SKINNY_M):
        return "tma", 1
    return "pointer", _auto_split_k(M, N, K, num_sms if has_tma else 132)


# Round-3 tiles (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps, EPILOGUE_SUBTILE), largest first:
# wave_config takes the first whose tile count fills R3_WAVE_FILL of the SMs. The 128x64 tile
# has 5 stages since round 8 (probe round 8, H100, 1024^3: 0.90 of cuBLAS in bf16 and fp16
# against 0.85-0.86 with 4; 3 stages 0.74).
R3_TILES = [
    (128, 256, 64, 3, 8, True),
    (128, 128, 64, 4, 8, False),
    (128, 64, 64, 5, 4, False),
    (64, 64, 64, 5, 4, False),
]
R3_WAVE_FILL = 0.9
# The tile split_config splits over K, by M: 16-bit only (rows up to 32, up to SKINNY_M, more).
R3_SPLIT_TILES = [
    (32, (16, 64, 256, 5, 4, False)),
    (SKINNY_M, (64, 128, 128, 4, 4, False)),
    (None, (128, 128, 64, 4, 8, False)),
]
# Split-K limits: at most this many slices, each at least R3_MIN_K_TILES BLOCK_K steps deep.
R3_MAX_SPLIT = 8
R3_MIN_K_TILES = 4


def _r3_meta(tile, group_m=8, flatten=True, ctas_per_sm=1) -> dict:
    """Launch meta for matmul_tma_r3_kernel. ctas_per_sm > 1 (probes) launches that many
    persistent programs per SM, so that where two fit (shared memory, registers) one program's
    epilogue can overlap the other's main loop."""
    bm, bn, bk, stages, warps, sub = tile
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group_m, EPILOGUE_SUBTILE=sub,
                FLATTEN=flatten, num_stages=stages, num_warps=warps)  # fmt: skip
    if ctas_per_sm != 1:
        meta["CTAS_PER_SM"] = ctas_per_sm
    return meta


def wave_config(M: int, N: int, K: int, num_sms: int) -> dict | None:
    """The round-3 tile for a 16-bit GEMM with M > SKINNY_M: the largest of R3_TILES whose count
    reaches R3_WAVE_FILL of a wave (else the smallest). None where 128x256 tiles already make more
    than R3_MAX_WAVES waves (the autotuned kernel's ground) or M is skinny."""
    if M <= SKINNY_M or cdiv(M, 128) * cdiv(N, 256) > R3_MAX_WAVES * num_sms:
        return None
    for tile in R3_TILES:
        if cdiv(M, tile[0]) * cdiv(N, tile[1]) >= R3_WAVE_FILL * num_sms:
            return _r3_meta(tile)
    return _r3_meta(R3_TILES[-1])


# hd_config's tiles (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps, EPILOGUE_SUBTILE) outside the
# wave rule: decode (M <= 32), skinny (M <= SKINNY_M) and large (beyond R3_MAX_WAVES waves).
HD_DECODE_TILE = (16, 64, 256, 5, 4, False)  # round 3: 1.088 at 16x4096x4096
HD_SKINNY_TILE = (64, 64, 128, 6, 4, False)  # round 3: 1.020 at 128x4096x4096
# 32 < M <= 128 with many columns (64x64 tiles would fill more than HD_SKINNY_WAVES waves): a wide
# tile reads each weight tile once per M block and keeps the tile count under a wave. Round 2
# measured 64x256x64 s4 w4 at 0.97-0.98 of cuBLAS on 128x14336x4096 (device descriptors), where
# HD_SKINNY_TILE ran at 0.92 in round 4.
HD_SKINNY_WIDE_TILE = (64, 256, 64, 4, 4, False)
HD_SKINNY_WAVES = 2
HD_LARGE_TILE = (128, 256, 64, 3, 8, True)  # round 3: 0.986 at 4096^3, 0.938 at 1024x14336x4096


def hd_config(M: int, N: int, K: int, num_sms: int) -> dict:
    """The shipped ("hd") tile for a 16-bit GEMM: by M (and for 32 < M <= 128 by the 64x64 tile
    count) for skinny shapes, else wave_config's
    tile, else (more than R3_MAX_WAVES waves of 128x256 tiles) HD_LARGE_TILE."""
    if M <= 32:
        return _r3_meta(HD_DECODE_TILE)
    if M <= SKINNY_M:
        if cdiv(M, 64) * cdiv(N, 64) > HD_SKINNY_WAVES * num_sms:
            return _r3_meta(HD_SKINNY_WIDE_TILE)
        return _r3_meta(HD_SKINNY_TILE)
    return wave_config(M, N, K, num_sms) or _r3_meta(HD_LARGE_TILE)


def split_config(M: int, N: int, K: int, num_sms: int) -> tuple[dict, int] | None:
    """(tile, split_k) for the single-launch split-K: the R3_SPLIT_TILES tile for M, split into
    the most K slices (<= R3_MAX_SPLIT, each >= R3_MIN_K_TILES deep) whose work items still fit
    one wave. None when that is no split (tiles fill half a wave or more, or K is short)."""
    tile = next(t for m, t in R3_SPLIT_TILES if m is None or M <= m)
    tiles = cdiv(M, tile[0]) * cdiv(N, tile[1])
    k_tiles = cdiv(K, tile[2])
    split = 1
    while (split < R3_MAX_SPLIT and tiles * (split + 1) <= num_sms
           and k_tiles // (split + 1) >= R3_MIN_K_TILES):  # fmt: skip
        split += 1
    if split == 1:
        return None
    # Equal slices: with k_per_split = cdiv(k_tiles, split) no slice is left empty.
    while split > 1 and (split - 1) * cdiv(k_tiles, split) >= k_tiles:
        split -= 1
    return (_r3_meta(tile, flatten=False), split) if split > 1 else None


def r3_plan(a, b, variant: str, config: dict | None = None, split_k: int | None = None):
    """(meta, split_k, host_desc) for matmul_tma_r3_kernel, or None for the default kernel.
    config (as _r3_meta returns) and split_k override the heuristics (probes, tests)."""
    variant = VARIANT_ALIASES.get(variant, variant)
    if variant not in VARIANTS:
        raise ValueError(
            f"variant {variant!r}: expected one of {VARIANTS + tuple(VARIANT_ALIASES)}"
        )
    if variant == "default":
        return None
    _, num_sms = _device_info(a.device)
    M, K = a.shape
    N = b.shape[1]
    host_desc = variant.endswith("hd")
    if config is not None:
        return dict(config), max(1, split_k or 1), host_desc
    if variant == "hd":
        return hd_config(M, N, K, num_sms), 1, True
    if variant.startswith("sk"):
        planned = split_config(M, N, K, num_sms)
        if planned is not None:
            return planned[0], planned[1], host_desc
    meta = wave_config(M, N, K, num_sms)
    return (meta, 1, host_desc) if meta is not None else None


def epilogue_splits(meta: dict, act_id: int, block_n: int) -> int:
    """Column blocks of matmul_tma_r3_kernel's epilogue (1, 2 or 4): meta's "EPILOGUE_SPLITS"
    when set, else 1 without EPILOGUE_SUBTILE, EPILOGUE_SPLITS_ACT with an activation and
    EPILOGUE_SPLITS without; never blocks under 16 columns (TMA wants 16-byte boxes)."""
    splits = meta.get("EPILOGUE_SPLITS") or 0
    if not splits:
        if not meta.get("EPILOGUE_SUBTILE"):
            return 1
        splits = EPILOGUE_SPLITS if act_id == ACTIVATIONS["none"] else EPILOGUE_SPLITS_ACT
    while splits > 1 and block_n // splits < 16:
        splits //= 2
    return splits


def _r3_launch(a, b, c, bias, preact, a_layout, b_layout, meta, split_k, host_desc, common,
               num_sms):  # fmt: skip
    M, K = a.shape
    N = b.shape[1]
    meta = dict(meta)
    ctas_per_sm = meta.pop("CTAS_PER_SM", 1)
    bm, bn, bk = meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"]
    meta.pop("BIAS_IN_ACC", None)  # round 4's switch, removed: accepted and ignored
    splits = epilogue_splits(meta, common["ACTIVATION"], bn)
    meta["EPILOGUE_SPLITS"] = splits
    store_n = bn // splits
    tma_store = (N * c.element_size()) % 16 == 0
    tiles = cdiv(M, bm) * cdiv(N, bn)
    split_k = max(1, min(split_k, cdiv(K, bk)))
    partial = locks = None
    if split_k > 1:
        partial = torch.empty(tiles * split_k * bm * bn, device=a.device, dtype=torch.float32)
        locks = tile_counters(a.device, tiles)
    hds = [None] * 4
    if host_desc:
        from triton.tools.tensor_descriptor import TensorDescriptor

        a_store = a.t() if a_layout[0] else a
        b_store = b.t() if b_layout[0] else b
        hds[0] = TensorDescriptor.from_tensor(a_store, [bk, bm] if a_layout[0] else [bm, bk])
        hds[1] = TensorDescriptor.from_tensor(b_store, [bn, bk] if b_layout[0] else [bk, bn])
        if tma_store:
            hds[2] = TensorDescriptor.from_tensor(c, [bm, store_n])
            if preact is not None:
                hds[3] = TensorDescriptor.from_tensor(preact, [bm, store_n])
    elif not is_interpreter():
        triton.set_allocator(_alloc_scratch)
    work = tiles * split_k
    grid = (min(4, work),) if is_interpreter() else (min(ctas_per_sm * num_sms, work),)
    if is_interpreter():
        meta["num_stages"], meta["num_warps"] = 1, 4
    common = {k: v for k, v in common.items() if k != "SPLIT"}
    matmul_tma_r3_kernel[grid](
        a, b, c, bias, preact, partial, locks, *hds,
        M, N, K, split_k,
        a_layout[1], b_layout[1], c.stride(0), bias.stride(0) if bias is not None else 0,
        A_COL_MAJOR=a_layout[0], B_COL_MAJOR=b_layout[0], TMA_STORE=tma_store,
        SPLIT=split_k > 1, HOST_DESC=host_desc, **common, **meta,
    )  # fmt: skip
    if ctas_per_sm != 1:
        meta["CTAS_PER_SM"] = ctas_per_sm
    return meta, split_k


# The last round-3 launch: (meta, split_k, host_desc), for probes to print.
LAST_R3: list = [None]


def _alloc_scratch(size: int, alignment: int, stream):
    # Device-side TMA descriptors live in a global scratch buffer that Triton asks for per launch.
    return torch.empty(size, device="cuda", dtype=torch.int8)


def fused_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    act_id: int = ACTIVATIONS["none"],
    save_preact: bool = False,
    *,
    launch=direct,
    path: str | None = None,
    split_k: int | None = None,
    variant: str | None = None,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """c = act(a @ b + bias) as a new contiguous (M, N) tensor of a's dtype, plus the
    pre-activation z when save_preact. Callers check the inputs (check_matmul_args).

    variant (None: the module's VARIANT) picks the round-3 kernel for 16-bit TMA launches (see
    VARIANT); config (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, EPILOGUE_SUBTILE, FLATTEN, num_stages,
    num_warps) forces its tile and split_k its K split. Both only act on that kernel."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype)
    preact = torch.empty_like(c) if save_preact else None
    if c.numel() == 0:  # an empty grid is an error on some launch paths; nothing to write anyway
        return c, preact
    auto_path, auto_split = plan(a, b)
    if auto_path == "tma" and launch is not direct and not TMA_WHEN_TRACED:
        _, num_sms = _device_info(a.device)
        auto_path, auto_split = "pointer", _auto_split_k(M, N, K, num_sms)
    path = path or auto_path
    if K == 0:  # an empty sum, the epilogue of zeros; TMA cannot describe an empty operand
        path, split_k = "pointer", 1
    r3 = None  # the round-3 kernel's (meta, split_k, host_desc), when a variant takes this call
    if path == "tma" and a.dtype in (torch.float16, torch.bfloat16) and launch is direct:
        chosen = variant or VARIANT
        if chosen == "hd" and config is None and split_k is not None and split_k > 1:
            chosen = "default"  # an explicit split asks for the split-K reduce path
        r3 = r3_plan(a, b, chosen, config, split_k if config else None)
    split_k = max(1, min(split_k or auto_split, max(1, K)))
    partial = (
        torch.empty((split_k, M, N), device=a.device, dtype=torch.float32)
        if split_k > 1 and r3 is None
        else None
    )
    common = dict(
        HAS_BIAS=bias is not None,
        ACTIVATION=act_id,
        STORE_PREACT=save_preact,
        INPUT_PRECISION=dot_precision(a.dtype, torch.backends.cuda.matmul.allow_tf32),
        UPCAST_TO_FP32=is_interpreter() and a.dtype == torch.bfloat16,
        SPLIT=split_k > 1,
    )
    stride_bias = bias.stride(0) if bias is not None else 0

    if path == "tma" and common["INPUT_PRECISION"] == "tf32":
        # wgmma takes tf32 operands K-major only: a row-major B or column-major A would run on a
        # slow fallback (69 TFLOP/s against 332 at 4096^3), so copy it the right way round.
        if not (_tma_layout(b) or (False,))[0]:
            b = b.t().contiguous().t()
        if (_tma_layout(a) or (False,))[0]:
            a = a.contiguous()
        if _tma_layout(a) is None or _tma_layout(b) is None:  # K-major rows not 16-byte aligned
            path = "pointer"
    if path == "tma":
        a_layout, b_layout = _tma_layout(a), _tma_layout(b)
        if a_layout is None or b_layout is None:
            raise ValueError("the TMA path needs 16-byte aligned operands with a unit stride")
        _, num_sms = _device_info(a.device)
        if r3 is not None:
            meta, r3_split, host_desc = r3
            LAST_R3[0] = _r3_launch(a, b, c, bias, preact, a_layout, b_layout, meta, r3_split,
                                    host_desc, common, num_sms) + (host_desc,)  # fmt: skip
            return c, preact
        if not is_interpreter():
            triton.set_allocator(_alloc_scratch)

        def grid(META):
            work = cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"]) * split_k
            if is_interpreter():
                return (min(4, work),)
            return (min(num_sms, work) if PERSISTENT else work,)

        launch(matmul_tma_kernel)[grid](
            a, b, c, bias, preact, partial,
            M, N, K, split_k,
            a_layout[1], b_layout[1], c.stride(0), stride_bias,
            A_COL_MAJOR=a_layout[0], B_COL_MAJOR=b_layout[0],
            TMA_STORE=(N * c.element_size()) % 16 == 0,
            FLATTEN=FLATTEN, WARP_SPECIALIZE=WARP_SPECIALIZE,
            **common,
        )  # fmt: skip
    else:
        grid = lambda META: (
            cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"]),
            split_k,
        )
        launch(matmul_kernel)[grid](
            a, b, c, bias, preact, partial,
            M, N, K, split_k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
            stride_bias,
            **common,
        )  # fmt: skip

    if split_k > 1:
        block_m, block_n = 16, 256
        launch(splitk_reduce_kernel)[(cdiv(N, block_n), cdiv(M, block_m))](
            partial, c, bias, preact,
            M, N, stride_bias,
            HAS_BIAS=bias is not None, ACTIVATION=act_id, STORE_PREACT=save_preact,
            SPLIT_K=split_k, BLOCK_M=block_m, BLOCK_N=block_n,
        )  # fmt: skip
    return c, preact


def _matmul(a: torch.Tensor, b: torch.Tensor, *, launch=direct) -> torch.Tensor:
    check_matmul_args(a, b)
    return fused_matmul(a, b, launch=launch)[0]


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for 2-D a (M, K) and b (K, N) of one dtype (fp16, bf16 or fp32), any strides."""
    return _matmul(a, b)
