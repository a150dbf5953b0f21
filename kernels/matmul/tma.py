"""C = act(A @ B + bias) on Hopper (sm_90+): TMA loads, wgmma, a persistent grid.

Both kernels run at most one program per SM, each walking output tiles in grouped (L2-friendly)
order; a tile's K loop is fed by TMA from a multi-stage shared-memory pipeline, and the
persistent loop is flattened so the pipeline runs across tile boundaries. Each operand is read
through a descriptor over its stored layout, so a transposed view (weight.t() in linear, dZ.t()
in its backward) costs nothing. Descriptors need 16-byte aligned starts and row strides
(tma_layout says when an operand qualifies).

    matmul_tma_host_desc_kernel    16-bit operands. The tile comes from heuristic_tile, a rule by
                                   M and by how many waves of tiles a shape makes, and the
                                   descriptors are built on the host (TensorDescriptor), so no
                                   program spends time creating them. Its epilogue is subtiled
                                   for the 128x256 tile: the tile's columns in 2 (4 with an
                                   activation) blocks, each adding its slice of the bias,
                                   activating and stored by TMA before the next, so fewer
                                   registers are live at once.
    matmul_tma_device_desc_kernel  fp32 (ieee, or tf32 with K-major operands). Autotuned over
                                   tma_configs; the descriptors are built on the device
                                   (tl.make_tensor_descriptor), since an autotuned block shape
                                   is only known inside the launch.

Batched (torch.matmul's broadcast batch, kernels/matmul/batched.py), the host-descriptor kernel
only: with BATCHED the persistent loop walks batch x tiles (batch-major), C's descriptor is 3-D
[batch, M, N] with block [1, BLOCK_M, STORE_N], and an operand with a batch stride (A_BATCHED,
B_BATCHED) is read through a 3-D descriptor [batch, rows, cols] (its 16-byte aligned batch
stride), loaded at [matrix, row, col] as a [1, rows, cols] block reshaped to 2-D: TMA clips
each matrix at its own edges, which a 2-D descriptor over the stacked rows would not. A
broadcast operand (batch stride 0, which TMA cannot describe) keeps its 2-D descriptor. The
batch arguments come last with defaults, so a 2-D launch passes none of them and compiles to
the same code as without them.

Functions:
    tma_layout(t) -> (column-major?, stride) | None
        Whether TMA can read the 2-D t as stored.
    tma_batch_layout(t) -> (column-major?, stride) | None
        The same for a (batch, rows, cols) t, whose batch stride must be 0 or 16-byte aligned.
    heuristic_tile(M, N, K, num_sms, batch=1) -> Tile
        The host-descriptor kernel's tile for a 16-bit shape (batch of them in one launch).
    split_plan(M, N, K, num_sms) -> (Tile, decomposition)
        Its tile and split-K or stream-K for a direct 2-D launch of more than SKINNY_M rows
        (SPLITS).
    split_k_scratch(M, N, K, tile, split_k, num_sms) -> (workspace numel, counters)
    host_programs(M, N, K, tile, split_k, num_sms, batch=1) -> its launch's program count
    tma_configs() -> [triton.Config]
        The device-descriptor kernel's autotuning tiles (fp32).
    matmul_tma_host_desc_kernel, matmul_tma_device_desc_kernel
        The @triton.jit kernels (args: pointers, descriptors, sizes, strides, constexprs).
    host_desc_step(a, b, c, bias, preact, tile, common, num_sms) -> Step
    device_desc_step(a, b, c, bias, preact, common, num_sms) -> Step
        Their launches as kernels._launch Steps (kept in kernels.matmul.dispatch's plans) over
        the tensors (a, b, c, bias, preact); `common` holds the epilogue and precision
        constexprs. host_desc_step also takes batched (batch, rows, cols) a, b and c.
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import ACTIVATIONS, cdiv, direct, is_interpreter, next_power_of_2
from kernels._launch import Step
from kernels.matmul.epilogue import apply_activation, bias_activation, grouped_tile, store_masked
from kernels.matmul.pointer import SKINNY_M, interpreter_configs, make_config, prune_by_m
from kernels.matmul.splitk import split_k_gather


def tma_layout(t: torch.Tensor) -> tuple[bool, int] | None:
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


def tma_batch_layout(t: torch.Tensor) -> tuple[bool, int] | None:
    """tma_layout of each (rows, cols) matrix of a (batch, rows, cols) t, or None where TMA
    cannot read them: a batch stride that is neither 0 (broadcast: one 2-D descriptor serves
    every matrix) nor 16-byte aligned."""
    if (t.stride(0) * t.element_size()) % 16:
        return None
    return tma_layout(t[0])


# ---------------------------------------------------------------------------------------------
# Tiles
# ---------------------------------------------------------------------------------------------
class Tile(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_stages: int
    num_warps: int
    subtile: bool  # the subtiled epilogue (column blocks stored one by one)


# heuristic_tile's tiles; the evidence for each is in docs/kernels/matmul.md, "Shipped design".
DECODE_TILE = Tile(16, 64, 256, 5, 4, False)  # M <= 32
SKINNY_TILE = Tile(64, 64, 128, 6, 4, False)  # 32 < M <= SKINNY_M
# 32 < M <= SKINNY_M with many columns (64x64 tiles would fill more than SKINNY_WIDE_WAVES
# waves): a tile as tall as M reads each weight tile once and keeps the tile count low. Up to 64
# rows, 64x256; above, 128x128 (the same tile count as two rows of 64x256, each weight tile read
# once instead of twice, and half the accumulator a thread, which the bias+gelu epilogue needs:
# on 64x256 w4 it sits at 255 registers).
SKINNY_WIDE_TILE = Tile(64, 256, 64, 4, 4, False)
SKINNY_TALL_TILE = Tile(128, 128, 64, 5, 8, False)
SKINNY_WIDE_WAVES = 2
# M > SKINNY_M: the tile of WAVE_TILES no wider than N needs (64 columns at least) with the
# least wave time, counted as waves x tile area / WAVE_SPEED, the relative rate at which a full
# wave of that tile does its work (a larger tile reuses each loaded operand for more outputs). A
# 128x256 tile on 64 columns, or 1.5 waves where 3 waves of 128x128 fit, had cost the 1x1 conv's
# dX GEMMs up to 40% on an H100 (docs/kernels/matmul.md, "Wave time").
WAVE_TILES = [
    Tile(128, 256, 64, 3, 8, True),
    Tile(128, 128, 64, 4, 8, False),
    Tile(128, 64, 64, 5, 4, False),
    Tile(64, 64, 64, 5, 4, False),
]
WAVE_SPEED = {(128, 256): 1.0, (128, 128): 0.85, (128, 64): 0.8, (64, 64): 0.6}
LARGE_TILE = WAVE_TILES[0]  # what many waves take
# A batch of products with a head dim of at most HEAD_DIM columns or reduction (attention's
# q @ k^T, K = 128, and p @ v, N = 128) past SKINNY_M rows: 128x128 tiles with a 128-deep K
# step, three stages. On an H100 it ran both products at 1.01-1.08x cuBLAS over 8-32 heads
# and sequences of 1k-8k, where the wave-time pick (128x256 for q @ k^T, 128x128x64 for p @ v)
# lost up to 8% (docs/kernels/matmul.md, "Batched products").
HEAD_DIM = 128
HEAD_TILE = Tile(128, 128, 128, 3, 8, False)
GROUP_M = 8


def heuristic_tile(M: int, N: int, K: int, num_sms: int, batch: int = 1) -> Tile:
    """The host-descriptor kernel's tile for a 16-bit (M, K) @ (K, N) on num_sms SMs, or for
    `batch` of them in one launch (the waves count every matrix's tiles)."""
    if M <= 32:
        return DECODE_TILE
    if M <= SKINNY_M:
        if cdiv(M, 64) * cdiv(N, 64) * batch > SKINNY_WIDE_WAVES * num_sms:
            return SKINNY_WIDE_TILE if M <= 64 else SKINNY_TALL_TILE
        return SKINNY_TILE
    if batch > 1 and min(N, K) <= HEAD_DIM:
        return HEAD_TILE
    widest = max(64, next_power_of_2(N))

    def wave_time(tile: Tile) -> float:
        waves = cdiv(cdiv(M, tile.block_m) * cdiv(N, tile.block_n) * batch, num_sms)
        return waves * tile.block_m * tile.block_n / WAVE_SPEED[tile.block_m, tile.block_n]

    return min((t for t in WAVE_TILES if t.block_n <= widest), key=wave_time)


# Under-filled grids (M > SKINNY_M, one matrix, direct launches): where the tiles of a shape
# leave SMs idle, split_plan may decompose the K steps instead of the tiles alone:
#   split-K (SPLITS): each tile's K steps in `split` slices, each slice a work item of the
#       persistent loop (tiles < num_sms only);
#   stream-K (STREAM_K): all tiles' K steps laid end to end and cut into one equal run per SM
#       (tiles < 2 x num_sms only), so no SM idles in a last, partial wave;
# the last program to finish a shared tile sums the fp32 partials and runs the epilogue
# (splitk.split_k_gather). split_plan prices each (tile, decomposition) in K steps of that tile
# on the busiest SM, times the tile's area / WAVE_SPEED: its steps, plus per work item (or
# stream-K segment) the fixed ITEM_STEPS (pipeline fill, epilogue) and, shared, PARTIAL_STEPS
# per fp32 partial tile it stores or (the last program) loads. A split slice keeps at least
# SPLIT_MIN_STEPS K steps.
SPLITS = (2, 3, 4)
STREAM_K = 0  # Plan.split_k's value for stream-K
SPLIT_MIN_STEPS = 4
ITEM_STEPS = 16.0
PARTIAL_STEPS = 8.0


def split_plan(M: int, N: int, K: int, num_sms: int) -> tuple[Tile, int]:
    """(tile, K decomposition: 1, a split of SPLITS, or STREAM_K) of the host-descriptor kernel
    for a 16-bit (M, K) @ (K, N) of more than SKINNY_M rows on num_sms SMs, direct launches (see
    SPLITS); unsplit, heuristic_tile's tile."""
    widest = max(64, next_power_of_2(N))
    candidates = []
    for tile in WAVE_TILES:
        if tile.block_n > widest:
            continue
        tiles = cdiv(M, tile.block_m) * cdiv(N, tile.block_n)
        steps = cdiv(K, tile.block_k)
        rate = tile.block_m * tile.block_n / WAVE_SPEED[tile.block_m, tile.block_n]
        candidates.append((cdiv(tiles, num_sms) * rate * (steps + ITEM_STEPS), tile, 1))
        if tiles < 2 * num_sms and tiles % num_sms:
            run = cdiv(tiles * steps, num_sms)
            shared = stream_k_slots(tiles, steps, num_sms)
            item = run + (cdiv(run, steps) + 1) * ITEM_STEPS + (1 + shared) * PARTIAL_STEPS
            candidates.append((rate * item, tile, STREAM_K))
        if tiles >= num_sms:
            continue
        for split in SPLITS:
            if steps < split * SPLIT_MIN_STEPS:
                break
            item = cdiv(steps, split) + ITEM_STEPS + (1 + split) * PARTIAL_STEPS
            candidates.append((cdiv(tiles * split, num_sms) * rate * item, tile, split))
    _, tile, split = min(candidates, key=lambda c: c[0])  # the first of equal costs
    return tile, split


def epilogue_splits(tile: Tile, act_id: int) -> int:
    """Column blocks of the host-descriptor kernel's epilogue: 1 unless the tile is subtiled,
    else 2, or 4 with an activation (whose temporaries then cover a quarter of the tile).
    docs/kernels/matmul.md, "Shipped design"."""
    if not tile.subtile:
        return 1
    return 2 if act_id == ACTIVATIONS["none"] else 4


def tma_configs() -> list[triton.Config]:
    """The device-descriptor kernel's tiles (fp32, tf32 or ieee): BLOCK_K 32, the same bytes per
    stage as BLOCK_K 64 in 16-bit; prune_by_m keeps those that suit M."""
    return [
        make_config(128, 128, 32, 4, 8, EPILOGUE_SUBTILE=False),
        make_config(128, 256, 32, 3, 8, EPILOGUE_SUBTILE=False),
        make_config(64, 128, 32, 4, 4, EPILOGUE_SUBTILE=False),
    ]


def _prune(configs, named_args, **kwargs):
    if is_interpreter():
        return configs
    return prune_by_m(configs, named_args["M"])


# ---------------------------------------------------------------------------------------------
# Shared @triton.jit pieces
# ---------------------------------------------------------------------------------------------
@triton.jit
def _halves(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The left and right column halves of an fp32 (BLOCK_M, BLOCK_N) block. In the wgmma
    accumulator layout the top column bits index a thread's registers, so this moves nothing."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))


@triton.jit
def _load_block(desc, matrix, off0, off1, ROWS: tl.constexpr, COLS: tl.constexpr,
                BATCHED: tl.constexpr):  # fmt: skip
    """desc's (ROWS, COLS) block at (off0, off1): of matrix `matrix` when desc is 3-D (BATCHED),
    loaded as [1, ROWS, COLS] and reshaped."""
    if BATCHED:
        block = desc.load([matrix, off0, off1]).reshape(ROWS, COLS)
    else:
        block = desc.load([off0, off1])
    return block


@triton.jit
def _store_block(desc, value, matrix, off0, off1, BATCHED: tl.constexpr):
    """Store the 2-D `value` through desc at (off0, off1): into matrix `matrix` of a 3-D desc
    (BATCHED) as a [1, rows, cols] block."""
    if BATCHED:
        desc.store([matrix, off0, off1], value.reshape(1, value.shape[0], value.shape[1]))
    else:
        desc.store([off0, off1], value)


@triton.jit
def _epilogue_store(x, off_m, col, N, bias_ptr, stride_bias, c_desc, z_desc, c_ptr, preact_ptr,
                    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
                    STORE_N: tl.constexpr, matrix=0, BATCHED: tl.constexpr = False):  # fmt: skip
    """One column block of the subtiled epilogue: z = x + bias[col:col + STORE_N] (its slice
    loaded here, not the whole tile's), then Z (when STORE_PREACT) and act(z) by TMA, into
    matrix `matrix` of 3-D descriptors when BATCHED."""
    if HAS_BIAS:
        offs_n = col + tl.arange(0, STORE_N)
        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)
        x = x + bias.to(tl.float32)[None, :]
    if STORE_PREACT:
        _store_block(z_desc, x.to(preact_ptr.dtype.element_ty), matrix, off_m, col, BATCHED)
    _store_block(c_desc, apply_activation(x, ACTIVATION).to(c_ptr.dtype.element_ty), matrix,
                 off_m, col, BATCHED)  # fmt: skip


@triton.jit
def _tma_mainloop(a_desc, b_desc, off_m, off_n, k_lo, k_hi,
                  A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
                  UPCAST_TO_FP32: tl.constexpr, INPUT_PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  matrix=0, A_BATCHED: tl.constexpr = False,
                  B_BATCHED: tl.constexpr = False):  # fmt: skip
    """The fp32 (BLOCK_M, BLOCK_N) accumulator over K steps k_lo to k_hi (BLOCK_K each), tiles
    loaded by TMA (which zero-fills reads past the edges). A column-major operand is loaded as
    stored and `.T`-ed; a 3-D (A_BATCHED, B_BATCHED) descriptor is read in matrix `matrix`."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_lo, k_hi):
        off_k = ki * BLOCK_K
        if A_COL_MAJOR:
            a = _load_block(a_desc, matrix, off_k, off_m, BLOCK_K, BLOCK_M, A_BATCHED).T
        else:
            a = _load_block(a_desc, matrix, off_m, off_k, BLOCK_M, BLOCK_K, A_BATCHED)
        if B_COL_MAJOR:
            b = _load_block(b_desc, matrix, off_n, off_k, BLOCK_N, BLOCK_K, B_BATCHED).T
        else:
            b = _load_block(b_desc, matrix, off_k, off_n, BLOCK_K, BLOCK_N, B_BATCHED)
        if UPCAST_TO_FP32:
            # The interpreter's dot multiplies bf16 as raw uint16 bits; its cast to fp32 is right.
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    return acc


# ---------------------------------------------------------------------------------------------
# 16-bit: host-side descriptors, the heuristic tile
# ---------------------------------------------------------------------------------------------
@triton.jit
def _write_back(acc, off_m, off_n, matrix, M, N, bias_ptr, stride_bias, stride_c, stride_cb,
                c_desc, z_desc, c_ptr, preact_ptr,
                HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
                TMA_STORE: tl.constexpr, EPILOGUE_SPLITS: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BATCHED: tl.constexpr):  # fmt: skip
    """The host-descriptor kernel's epilogue of one output tile: act(acc + bias), and Z when
    STORE_PREACT, by TMA (subtiled in EPILOGUE_SPLITS column blocks) or by masked pointer
    stores where C's rows are not 16-byte aligned; into matrix `matrix` when BATCHED."""
    STORE_N: tl.constexpr = BLOCK_N // EPILOGUE_SPLITS
    if TMA_STORE and EPILOGUE_SPLITS > 1:
        # Subtiled epilogue: split the accumulator into column blocks first, then per
        # block load its slice of the bias, add, activate, store. The activation's
        # temporaries and the broadcast bias cover 1/EPILOGUE_SPLITS of the tile, and a
        # block's registers die once it is stored (a full-tile epilogue at 128x256 / 8
        # warps spills with exact gelu: docs/kernels/matmul.md, "Shipped design").
        h0, h1 = _halves(acc, BLOCK_M, BLOCK_N)
        if EPILOGUE_SPLITS == 4:
            q0, q1 = _halves(h0, BLOCK_M, BLOCK_N // 2)
            _epilogue_store(q0, off_m, off_n, N, bias_ptr, stride_bias, c_desc, z_desc,
                            c_ptr, preact_ptr, HAS_BIAS, ACTIVATION, STORE_PREACT,
                            STORE_N, matrix, BATCHED)  # fmt: skip
            _epilogue_store(q1, off_m, off_n + STORE_N, N, bias_ptr, stride_bias,
                            c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                            STORE_PREACT, STORE_N, matrix, BATCHED)  # fmt: skip
            q2, q3 = _halves(h1, BLOCK_M, BLOCK_N // 2)
            _epilogue_store(q2, off_m, off_n + 2 * STORE_N, N, bias_ptr, stride_bias,
                            c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                            STORE_PREACT, STORE_N, matrix, BATCHED)  # fmt: skip
            _epilogue_store(q3, off_m, off_n + 3 * STORE_N, N, bias_ptr, stride_bias,
                            c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                            STORE_PREACT, STORE_N, matrix, BATCHED)  # fmt: skip
        else:
            _epilogue_store(h0, off_m, off_n, N, bias_ptr, stride_bias, c_desc, z_desc,
                            c_ptr, preact_ptr, HAS_BIAS, ACTIVATION, STORE_PREACT,
                            STORE_N, matrix, BATCHED)  # fmt: skip
            _epilogue_store(h1, off_m, off_n + STORE_N, N, bias_ptr, stride_bias,
                            c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                            STORE_PREACT, STORE_N, matrix, BATCHED)  # fmt: skip
    else:
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        z, y = bias_activation(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS,
                               ACTIVATION)  # fmt: skip
        if TMA_STORE:  # one store of the whole tile (EPILOGUE_SPLITS == 1)
            _store_block(c_desc, y.to(c_ptr.dtype.element_ty), matrix, off_m, off_n,
                         BATCHED)  # fmt: skip
            if STORE_PREACT:
                _store_block(z_desc, z.to(preact_ptr.dtype.element_ty), matrix, off_m,
                             off_n, BATCHED)  # fmt: skip
        else:
            c_out = c_ptr
            z_out = preact_ptr
            if BATCHED:  # int64: a batch may pass 2**31 elements
                c_out += matrix.to(tl.int64) * stride_cb
                if STORE_PREACT:
                    z_out += matrix.to(tl.int64) * stride_cb
            store_masked(y, z, offs_m, offs_n, M, N, stride_c, c_out, z_out,
                         STORE_PREACT)  # fmt: skip


@triton.jit
def _stream_k(a_desc, b_desc, c_desc, z_desc, ws_ptr, lock_ptr, c_ptr, bias_ptr, preact_ptr,
              M, N, k_tiles, num_pid_m, num_pid_n, num_tiles, stride_bias, stride_c,
              A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr, HAS_BIAS: tl.constexpr,
              ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr, TMA_STORE: tl.constexpr,
              INPUT_PRECISION: tl.constexpr, UPCAST_TO_FP32: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr, EPILOGUE_SPLITS: tl.constexpr):  # fmt: skip
    """Stream-K: the tiles' K steps, laid end to end in grouped tile order, cut into one equal
    run per program, so every program does the same work whatever the tile count. A run covers
    the end of one tile, whole tiles and the start of another; a tile whose steps fall to
    several programs is summed by the last of them to finish (split_k_gather: a slot per
    contributor, stream_k_slots of them per tile)."""
    total = num_tiles * k_tiles
    per_prog = tl.cdiv(total, tl.num_programs(0))
    slots = tl.cdiv(k_tiles, per_prog) + 1
    it = tl.program_id(0) * per_prog
    end = tl.minimum(it + per_prog, total)
    while it < end:
        tile = it // k_tiles
        k_lo = it - tile * k_tiles
        k_hi = tl.minimum(k_tiles, k_lo + (end - it))
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_mainloop(a_desc, b_desc, off_m, off_n, k_lo, k_hi, A_COL_MAJOR, B_COL_MAJOR,
                            UPCAST_TO_FP32, INPUT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip
        first = (tile * k_tiles) // per_prog  # the programs whose runs hold this tile's steps
        last = ((tile + 1) * k_tiles - 1) // per_prog
        write = first == last
        if first != last:
            acc, write = split_k_gather(acc, ws_ptr, lock_ptr, tile, tl.program_id(0) - first,
                                        last - first + 1, slots, BLOCK_M, BLOCK_N)  # fmt: skip
        if write:
            _write_back(acc, off_m, off_n, 0, M, N, bias_ptr, stride_bias, stride_c, None,
                        c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION, STORE_PREACT,
                        TMA_STORE, EPILOGUE_SPLITS, BLOCK_M, BLOCK_N, False)  # fmt: skip
        it += k_hi - k_lo


@triton.jit
def matmul_tma_host_desc_kernel(
    # pointers: operands (a_ptr and b_ptr are read through a_desc and b_desc only), output, the
    # epilogue's bias and pre-activation (None when unused)
    a_ptr, b_ptr, c_ptr, bias_ptr, preact_ptr,
    # split-K (SPLIT_K > 1): the fp32 workspace of every tile's SPLIT_K partial tiles and the
    # tiles' arrival counters (kernels._common.tile_counters); None unsplit
    ws_ptr, lock_ptr,
    # host-side TensorDescriptors of A and B as stored, and of C and Z (None without TMA_STORE,
    # or Z without STORE_PREACT), their blocks (BLOCK_M, BLOCK_N // EPILOGUE_SPLITS)
    a_desc, b_desc, c_desc, z_desc,
    # sizes: A is M×K, B is K×N, C is M×N
    M, N, K,
    # the one non-unit stride of each operand's storage (elements), then C's and the bias's
    stride_a, stride_b, stride_c, stride_bias,
    # storage layouts: A_COL_MAJOR means A is stored (K, M) row-major (a.t() of a contiguous
    # tensor), B_COL_MAJOR that B is stored (N, K) row-major (weight.t() in linear)
    A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
    # epilogue switches; TMA_STORE is False when C's rows are not 16-byte aligned (masked
    # pointer stores instead), EPILOGUE_SPLITS the TMA store's column blocks (1, 2 or 4)
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
    TMA_STORE: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST_TO_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SPLITS: tl.constexpr, SPLIT_K: tl.constexpr, STREAM_K: tl.constexpr,
    # batched launches only: the matrix count and C's batch stride (elements; Z's too), then
    # which of A and B have 3-D descriptors (the other is broadcast) and the switch (C's and Z's
    # descriptors are 3-D). 2-D launches leave them out.
    batch=None, stride_cb=None, A_BATCHED: tl.constexpr = False, B_BATCHED: tl.constexpr = False,
    BATCHED: tl.constexpr = False,
):  # fmt: skip
    tl.static_assert(EPILOGUE_SPLITS == 1 or EPILOGUE_SPLITS == 2 or EPILOGUE_SPLITS == 4,
                     "EPILOGUE_SPLITS: 1, 2 or 4")  # fmt: skip

    # ---- persistent loop over the output tiles in grouped order (batch-major when BATCHED) ----
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    tiles_per_matrix = num_tiles
    if BATCHED:
        num_tiles = num_tiles * batch
    if STREAM_K:
        _stream_k(a_desc, b_desc, c_desc, z_desc, ws_ptr, lock_ptr, c_ptr, bias_ptr, preact_ptr,
                  M, N, k_tiles, num_pid_m, num_pid_n, num_tiles, stride_bias, stride_c,
                  A_COL_MAJOR, B_COL_MAJOR, HAS_BIAS, ACTIVATION, STORE_PREACT, TMA_STORE,
                  INPUT_PRECISION, UPCAST_TO_FP32, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                  EPILOGUE_SPLITS)  # fmt: skip
        return
    # a tile's SPLIT_K slices of the K steps are adjacent work items, so they run side by side
    # and the last to finish sums them (split_k_gather) without waiting on anyone
    for work in tl.range(tl.program_id(0), num_tiles * SPLIT_K, tl.num_programs(0),
                         flatten=True):  # fmt: skip
        tile = work
        k_lo = 0
        k_hi = k_tiles
        if SPLIT_K > 1:
            tile = work // SPLIT_K
            split = work - tile * SPLIT_K
            per_split = tl.cdiv(k_tiles, SPLIT_K)
            k_lo = split * per_split
            k_hi = tl.minimum(k_lo + per_split, k_tiles)
        matrix = 0
        tile_in_matrix = tile
        if BATCHED:
            matrix = tile // tiles_per_matrix
            tile_in_matrix = tile % tiles_per_matrix
        pid_m, pid_n = grouped_tile(tile_in_matrix, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_mainloop(a_desc, b_desc, off_m, off_n, k_lo, k_hi, A_COL_MAJOR, B_COL_MAJOR,
                            UPCAST_TO_FP32, INPUT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K, matrix,
                            A_BATCHED, B_BATCHED)  # fmt: skip
        write = True
        if SPLIT_K > 1:
            acc, write = split_k_gather(acc, ws_ptr, lock_ptr, tile, split, SPLIT_K, SPLIT_K,
                                        BLOCK_M, BLOCK_N)  # fmt: skip

        # ---- write-back (a split tile: by its last slice only) ----
        if write:
            _write_back(acc, off_m, off_n, matrix, M, N, bias_ptr, stride_bias, stride_c,
                        stride_cb, c_desc, z_desc, c_ptr, preact_ptr, HAS_BIAS, ACTIVATION,
                        STORE_PREACT, TMA_STORE, EPILOGUE_SPLITS, BLOCK_M, BLOCK_N,
                        BATCHED)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# fp32: device-side descriptors, autotuned
# ---------------------------------------------------------------------------------------------
@triton.autotune(
    configs=interpreter_configs(EPILOGUE_SUBTILE=False) if is_interpreter() else tma_configs(),
    key=["M", "N", "K", "A_COL_MAJOR", "B_COL_MAJOR"],
    prune_configs_by={"early_config_prune": _prune},
)
@triton.jit
def matmul_tma_device_desc_kernel(
    # pointers: as matmul_tma_host_desc_kernel's
    a_ptr, b_ptr, c_ptr, bias_ptr, preact_ptr,
    # sizes: A is M×K, B is K×N, C is M×N
    M, N, K,
    # the one non-unit stride of each operand's storage (elements), then C's and the bias's
    stride_a, stride_b, stride_c, stride_bias,
    # storage layouts, as matmul_tma_host_desc_kernel's
    A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
    # epilogue switches; TMA_STORE is False when C's rows are not 16-byte aligned
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, STORE_PREACT: tl.constexpr,
    TMA_STORE: tl.constexpr, INPUT_PRECISION: tl.constexpr, UPCAST_TO_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
):  # fmt: skip
    # ---- descriptors over the operands as stored: TMA zero-fills reads past the edges ----
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
    STORE_N: tl.constexpr = BLOCK_N // 2 if EPILOGUE_SUBTILE else BLOCK_N
    if TMA_STORE:
        c_desc = tl.make_tensor_descriptor(
            c_ptr, shape=[M, N], strides=[stride_c, 1], block_shape=[BLOCK_M, STORE_N]
        )
        if STORE_PREACT:
            z_desc = tl.make_tensor_descriptor(
                preact_ptr, shape=[M, N], strides=[stride_c, 1], block_shape=[BLOCK_M, STORE_N]
            )

    # ---- persistent loop over the output tiles in grouped order ----
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = _tma_mainloop(a_desc, b_desc, off_m, off_n, 0, k_tiles, A_COL_MAJOR, B_COL_MAJOR,
                            UPCAST_TO_FP32, INPUT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K)  # fmt: skip

        # ---- write-back ----
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        z, y = bias_activation(acc, offs_m, offs_n, M, N, bias_ptr, stride_bias, HAS_BIAS,
                               ACTIVATION)  # fmt: skip
        if TMA_STORE:
            if EPILOGUE_SUBTILE:
                # Two (BLOCK_M, BLOCK_N/2) stores: half the shared-memory staging.
                y0, y1 = tl.split(tl.permute(tl.reshape(y, (BLOCK_M, 2, STORE_N)), (0, 2, 1)))
                c_desc.store([off_m, off_n], y0.to(c_ptr.dtype.element_ty))
                c_desc.store([off_m, off_n + STORE_N], y1.to(c_ptr.dtype.element_ty))
                if STORE_PREACT:
                    z0, z1 = tl.split(tl.permute(tl.reshape(z, (BLOCK_M, 2, STORE_N)), (0, 2, 1)))
                    z_desc.store([off_m, off_n], z0.to(preact_ptr.dtype.element_ty))
                    z_desc.store([off_m, off_n + STORE_N], z1.to(preact_ptr.dtype.element_ty))
            else:
                c_desc.store([off_m, off_n], y.to(c_ptr.dtype.element_ty))
                if STORE_PREACT:
                    z_desc.store([off_m, off_n], z.to(preact_ptr.dtype.element_ty))
        else:
            store_masked(y, z, offs_m, offs_n, M, N, stride_c, c_ptr, preact_ptr, STORE_PREACT)


# ---------------------------------------------------------------------------------------------
# Launches
# ---------------------------------------------------------------------------------------------
def _alloc_scratch(size: int, alignment: int, stream):
    # Device-side TMA descriptors live in a global scratch buffer that Triton asks for per launch.
    return torch.empty(size, device="cuda", dtype=torch.int8)


def _desc_spec(slot, tensor_slot, t, col_major, block):
    """A DescSpec of t as stored: (rows, cols), or (cols, rows) for a column-major t. A batched
    (batch, rows, cols) t gains a leading batch dim (block 1) where its batch stride is not 0;
    with stride 0 (broadcast) its one matrix is described in 2-D."""
    lead_shape, lead_strides, lead_block = (), (), ()
    if t.dim() == 3:
        if t.stride(0):
            lead_shape, lead_strides, lead_block = (t.shape[0],), (t.stride(0),), (1,)
        t = t[0]
    shape = (t.shape[1], t.shape[0]) if col_major else tuple(t.shape)
    strides = (t.stride(1), t.stride(0)) if col_major else tuple(t.stride())
    return (slot, tensor_slot, (*lead_shape, *shape), (*lead_strides, *strides),
            (*lead_block, *block))  # fmt: skip


def host_desc_step(a, b, c, bias, preact, tile, common, num_sms, split_k=1):
    """matmul_tma_host_desc_kernel on `tile` (heuristic_tile's) as a Step: one program per SM at
    most (four in the interpreter, with its one-stage pipeline). Its tensors are (a, b, c, bias,
    preact) and, where split_k > 1 (each tile's K steps in split_k slices), the workspace and
    counters split_k_scratch sizes (None unsplit); the lead slots 7-10 (a_desc, b_desc, c_desc,
    z_desc) are descriptors of a, b, c and preact (kernels._launch.DescSpec), None where there
    is none (no TMA store, no pre-activation). A 3-D c makes the batched launch
    (never split): a (batch, M, K) and b (batch, K, N), each read by tma_batch_layout, c (and
    preact) contiguous."""
    batched = c.dim() == 3
    M, K = a.shape[-2:]
    N = b.shape[-1]
    layout = tma_batch_layout if batched else tma_layout
    (a_col, stride_a), (b_col, stride_b) = layout(a), layout(b)
    bm, bn, bk = tile.block_m, tile.block_n, tile.block_k
    splits = epilogue_splits(tile, common["ACTIVATION"])
    store_n = bn // splits
    tma_store = (N * c.element_size()) % 16 == 0
    descs = [_desc_spec(7, 0, a, a_col, [bk, bm] if a_col else [bm, bk]),
             _desc_spec(8, 1, b, b_col, [bn, bk] if b_col else [bk, bn])]  # fmt: skip
    if tma_store:
        descs.append(_desc_spec(9, 2, c, False, [bm, store_n]))
        if preact is not None:
            descs.append(_desc_spec(10, 4, preact, False, [bm, store_n]))
    batch = c.shape[0] if batched else 1
    stages, warps = (1, 4) if is_interpreter() else (tile.num_stages, tile.num_warps)
    stream_k = split_k == STREAM_K
    grid = (host_programs(M, N, K, tile, split_k, num_sms, batch),)
    meta = dict(A_COL_MAJOR=a_col, B_COL_MAJOR=b_col, TMA_STORE=tma_store, **common,
                BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=GROUP_M, EPILOGUE_SPLITS=splits,
                SPLIT_K=1 if stream_k else split_k, STREAM_K=stream_k, num_stages=stages,
                num_warps=warps)  # fmt: skip
    if batched:
        meta.update(batch=batch, stride_cb=c.stride(0), A_BATCHED=a.stride(0) != 0,
                    B_BATCHED=b.stride(0) != 0, BATCHED=True)  # fmt: skip
    return Step(
        matmul_tma_host_desc_kernel, grid,
        (M, N, K,
         stride_a, stride_b, c.stride(-2), bias.stride(0) if bias is not None else 0),
        meta, descs=descs, width=11,
    )  # fmt: skip


def split_k_scratch(M: int, N: int, K: int, tile: Tile, split_k: int, num_sms: int):
    """(numel of the fp32 workspace, counters) of a split or stream-K host-descriptor launch on
    num_sms SMs: every tile's slots of partial tiles (split_k, or stream_k_slots), one arrival
    counter per tile."""
    tiles = cdiv(M, tile.block_m) * cdiv(N, tile.block_n)
    slots = split_k
    if split_k == STREAM_K:
        programs = host_programs(M, N, K, tile, split_k, num_sms)
        slots = stream_k_slots(tiles, cdiv(K, tile.block_k), programs)
    return tiles * slots * tile.block_m * tile.block_n, tiles


def host_programs(M, N, K, tile: Tile, split_k: int, num_sms: int, batch: int = 1) -> int:
    """The host-descriptor kernel's program count: one per SM at most (four in the interpreter),
    no more than its work items (tiles x split slices, or stream-K's tiles x K steps)."""
    tiles = cdiv(M, tile.block_m) * cdiv(N, tile.block_n) * batch
    work = tiles * (cdiv(K, tile.block_k) if split_k == STREAM_K else split_k)
    return min(4 if is_interpreter() else num_sms, work)


def stream_k_slots(tiles: int, k_tiles: int, programs: int) -> int:
    """The most programs whose stream-K runs share one tile's K steps (as _stream_k counts)."""
    return cdiv(k_tiles, cdiv(tiles * k_tiles, programs)) + 1


def device_desc_step(a, b, c, bias, preact, common, num_sms, tile=None, launch=direct):
    """matmul_tma_device_desc_kernel as a Step whose lead is (a, b, c, bias, preact): one
    program per SM at most (four in the interpreter). Autotuned (fp32 direct calls); with
    `tile` (heuristic_tile's, 16-bit), the kernel under the autotuner at that tile, launched
    with `launch`: a launch traced by torch.compile, which cannot pass host descriptors."""
    M, K = a.shape
    N = b.shape[1]
    (a_col, stride_a), (b_col, stride_b) = tma_layout(a), tma_layout(b)
    meta = dict(A_COL_MAJOR=a_col, B_COL_MAJOR=b_col, TMA_STORE=(N * c.element_size()) % 16 == 0,
                **common)  # fmt: skip
    sms = 4 if is_interpreter() else num_sms
    if tile is None:
        kernel = matmul_tma_device_desc_kernel

        def grid(META):
            return (min(sms, cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"])),)
    else:
        kernel = matmul_tma_device_desc_kernel.fn
        grid = (min(sms, cdiv(M, tile.block_m) * cdiv(N, tile.block_n)),)
        meta.update(BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
                    GROUP_M=GROUP_M, EPILOGUE_SUBTILE=tile.subtile, num_stages=tile.num_stages,
                    num_warps=tile.num_warps)  # fmt: skip
    return Step(
        launch(kernel), grid,
        (M, N, K,
         stride_a, stride_b, c.stride(0), bias.stride(0) if bias is not None else 0),
        meta,
    )  # fmt: skip


def set_scratch_allocator() -> None:
    """Device-side TMA descriptors live in a global scratch buffer Triton asks for per launch."""
    if not is_interpreter():
        triton.set_allocator(_alloc_scratch)
