"""The split design: rows too long for one program, cut into chunks, one program a chunk.

Each program reduces its chunk to a partial (the forward: max and sum of exp; the backward:
y·dy), packed into one 64-bit word (never 0) and published in the row's workspace slot.

- coop (GPU, PHASE 2): the program then waits, its chunk still in registers, until every chunk
  of its row has published, combines the partials in chunk order (deterministic) and writes its
  chunk, so the row is read once. Programs take their chunk from an atomic ticket, so chunks
  start in ticket order and a row's chunks never wait on a chunk that cannot start (a row has
  at most MAX_SPLIT_CHUNKS chunks, fewer than the GPU holds programs). Each launch zeroes the
  words the next launch on its stream takes (coop.coop_workspace), so no memset a call.
- split2 (the interpreter, which runs programs one after another and cannot wait): PHASE 0
  publishes, a second launch (PHASE 1) re-reads the chunk and writes it.

The forward holds exp(x - chunk max) across the wait and writes it times exp(chunk max - row
max) / row sum: one multiply a value after the wait instead of a second exp. The 16-bit
backward holds its chunk as int32 pairs of neighbouring values, unpacked to fp32 only where the
math needs them: half the registers across the wait.

Functions:
    _split_position, _row_workspace, _clear_for_next    a program's chunk and workspace words
    _publish, _split_partials                           publish; gather (and wait for) a row's
    _chunk_sum, _chunk_max, _per_chunk                  combine partials, in chunk order
    _forward_row_stats, _backward_row_dot               a row's statistics from its partials
    _unpair, _pair, _reload                             16-bit pairs <-> fp32
    softmax_split_kernel                    forward
    softmax_backward_split_kernel           backward
    softmax_backward_split_pairs_kernel     backward over 16-bit rows held as int32 pairs
    launch_split                            the host side: workspace, grid, one or two launches
"""

import torch
import triton
import triton.language as tl

from kernels._common import direct, is_interpreter, next_power_of_2
from kernels._launch import Step
from kernels.softmax.coop import (
    SLEEP_NS,
    Alternate,
    _nanosleep,
    _pack,
    _unpack,
    coop_workspace,
)
from kernels.softmax.tile import _exp_shifted, _tile_rows


@triton.jit
def _split_position(ws_ptr, ticket_index, n_chunks, WAIT: tl.constexpr):
    """(row block, chunk) of this split program."""
    if WAIT:
        # Tickets are handed out in the order programs start: a row's chunks start together.
        ticket = tl.atomic_add(ws_ptr + ticket_index, 1).to(tl.int32)
    else:
        ticket = tl.program_id(0)
    return ticket // n_chunks, ticket % n_chunks


@triton.jit
def _publish(slots, chunk, partial, row_ok):
    """Publish this chunk's packed partial (never 0)."""
    tl.atomic_xchg(slots + chunk, partial, mask=row_ok, sem="relaxed")


@triton.jit
def _clear_for_next(next_ptr, ticket_index, block, chunk, row, n_chunks, row_ok):
    """Zero, in the workspace the next coop launch on this stream takes (coop_workspace), the
    words this program's position owns: its rows' slots of its chunk, and the ticket counter
    (the first position). Every word of the workspace is owned by one position, so the launch
    leaves the next one all zeros without a memset kernel of its own."""
    zero = tl.zeros(row.shape, tl.int64)
    tl.store(next_ptr + row * n_chunks + chunk, zero, mask=row_ok)
    first = (block == 0) & (chunk == 0)
    tl.store(next_ptr + ticket_index + tl.arange(0, 1), tl.zeros((1,), tl.int64), mask=first)


@triton.jit
def _split_partials(ws_ptr, row, n_chunks, row_ok, WAIT: tl.constexpr,
                    MAX_CHUNKS: tl.constexpr, SLEEP_NS: tl.constexpr):  # fmt: skip
    """Gather the packed partials of each row (waiting until all are published if WAIT).

    Row r's slots start at ws_ptr + r * n_chunks. Returns a (BLOCK_ROWS, MAX_CHUNKS) int64 tile
    of packed partials, 0 where masked; for one row, a (MAX_CHUNKS,) vector instead: a
    (1, MAX_CHUNKS) tile takes layouts that give every thread all of its slots, a vector one
    slot a thread. A published partial is never 0 (see the callers), so 0 marks a slot not yet
    written; the volatile loads go to memory each time round the loop.
    """
    k = tl.arange(0, MAX_CHUNKS)
    if row.shape[0] == 1:
        slot_ok = (k < n_chunks) & (tl.sum(row_ok.to(tl.int32), axis=0) > 0)
        ptrs = ws_ptr + tl.sum(row, axis=0) * n_chunks + k
    else:
        slot_ok = row_ok[:, None] & (k < n_chunks)[None, :]
        ptrs = (ws_ptr + row * n_chunks)[:, None] + k[None, :]
    packed = tl.load(ptrs, mask=slot_ok, other=1, volatile=True)
    if WAIT:
        missing = tl.sum(tl.where(packed == 0, 1, 0))
        while missing > 0:
            # Back off between polls: every program of a row polls the same few slots, and
            # polling flat out loads one L2 slice and takes issue slots from working programs.
            missing = _nanosleep(missing, SLEEP_NS)
            packed = tl.load(ptrs, mask=slot_ok, other=1, volatile=True)
            missing = tl.sum(tl.where(packed == 0, 1, 0))
        # A slot is held by several threads, and the sum above counted one copy of each: a
        # copy that another thread loaded a moment earlier can still be 0. Every slot is now
        # published (seen in L2 before the sum's barrier), so one more load sees them all.
        packed = tl.load(ptrs, mask=slot_ok, other=1, volatile=True)
    return tl.where(slot_ok, packed, 0)


@triton.jit
def _chunk_sum(values, row_ok):
    """Per-row sum over the chunks of _split_partials' tile (or one row's vector), in chunk
    order whatever order the chunks finished in: deterministic. Shape (BLOCK_ROWS,)."""
    if len(values.shape) == 1:
        out = tl.where(row_ok, tl.sum(values, axis=0), 0.0)
    else:
        out = tl.sum(values, axis=1)
    return out


@triton.jit
def _chunk_max(values, row_ok):
    """Per-row max over the chunks, as _chunk_sum."""
    if len(values.shape) == 1:
        out = tl.where(row_ok, tl.max(values, axis=0), 0.0)
    else:
        out = tl.max(values, axis=1)
    return out


@triton.jit
def _per_chunk(row_values, like):
    """Broadcast a per-row value against _split_partials' tile (or one row's vector)."""
    if len(like.shape) == 1:
        out = tl.sum(row_values, axis=0)
    else:
        out = row_values[:, None]
    return out


@triton.jit
def _forward_row_stats(ws_ptr, row, n_chunks, row_ok, PHASE: tl.constexpr,
                       SLEEP_NS: tl.constexpr, MAX_CHUNKS: tl.constexpr):  # fmt: skip
    """(row max, row sum of exp(x - row max)) from the chunks' partials (waiting if PHASE 2)."""
    packed = _split_partials(ws_ptr, row, n_chunks, row_ok, PHASE == 2, MAX_CHUNKS, SLEEP_NS)
    maxes, sums = _unpack(packed)
    published = packed != 0  # masked slots read 0, and a published partial never is
    maxes = tl.where(published, maxes, -float("inf"))
    # rows past the end combine with max 0, so no NaN is computed for them
    row_max = tl.where(row_ok, _chunk_max(maxes, row_ok), 0.0)
    # an all -inf row: row_max = -inf and exp(-inf - -inf) = NaN, as torch gives
    scaled = sums * tl.exp(maxes - _per_chunk(row_max, maxes))
    row_sum = _chunk_sum(tl.where(published, scaled, 0.0), row_ok)
    return row_max, row_sum


@triton.jit
def _backward_row_dot(ws_ptr, row, n_chunks, row_ok, PHASE: tl.constexpr,
                      SLEEP_NS: tl.constexpr, MAX_CHUNKS: tl.constexpr):  # fmt: skip
    """Row sum of y·dy from the chunks' partials (waiting if PHASE 2), as _forward_row_stats."""
    packed = _split_partials(ws_ptr, row, n_chunks, row_ok, PHASE == 2, MAX_CHUNKS, SLEEP_NS)
    dots, _ = _unpack(packed)
    return _chunk_sum(dots, row_ok)


@triton.jit
def _row_workspace(ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner, rows_inner,
                   n_chunks, row_ok, CLEAR: tl.constexpr):  # fmt: skip
    """(row index, its slots) in a split program's workspace: row r's slots start at
    r * n_chunks, the ticket sits after all slots. With CLEAR, also zeroes this program's
    words of the next launch's workspace (_clear_for_next)."""
    row = outer * rows_inner + inner
    slots = ws_ptr + row * n_chunks
    if CLEAR:
        _clear_for_next(next_ptr, ticket_index, block, chunk, row, n_chunks, row_ok)
    return row, slots


@triton.jit
def softmax_split_kernel(
    x_ptr, y_ptr, ws_ptr,
    rows_inner, n_cols, n_chunks, ticket_index,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    # 0: publish partials only, 1: finish only (partials from an earlier launch), 2: both (coop)
    PHASE: tl.constexpr, SLEEP_NS: tl.constexpr, POLICY: tl.constexpr, EXP2: tl.constexpr,
    CLEAR: tl.constexpr = False, next_ptr=None,
):  # fmt: skip
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    fill = tl.where(row_ok, -float("inf"), 0.0)[:, None]
    x = tl.load(
        x_rows + cols[None, :] * x_stride_col, mask=mask, other=fill, eviction_policy=POLICY
    ).to(tl.float32)
    row, slots = _row_workspace(ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner,
                                rows_inner, n_chunks, row_ok, CLEAR)  # fmt: skip

    chunk_max = tl.max(x, axis=1)
    # An all -inf chunk shifts by 0: its sum is 0, not NaN; its max (-inf) keeps it nonzero
    # when packed. Any other chunk's sum is at least 1, so no packed partial is 0.
    shift = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    exp = _exp_shifted(x, shift, EXP2)
    if PHASE != 1:
        _publish(slots, chunk, _pack(chunk_max, tl.sum(exp, axis=1)), row_ok)
    if PHASE != 0:
        row_max, row_sum = _forward_row_stats(ws_ptr, row, n_chunks, row_ok, PHASE, SLEEP_NS,
                                              MAX_CHUNKS)  # fmt: skip
        # exp(x - shift) * exp(shift - row max) / row sum; an all -inf chunk scales its 0s
        # by 0 (exp(0 - row max) may overflow), and an all -inf row keeps row_sum's NaN
        scale = tl.where(chunk_max == -float("inf"), 0.0, tl.exp(shift - row_max)) / row_sum
        y = exp * scale[:, None]
        y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
        tl.store(
            y_rows + cols[None, :] * y_stride_col, y.to(y_ptr.dtype.element_ty), mask=mask,
            eviction_policy=POLICY,
        )  # fmt: skip


@triton.jit
def softmax_backward_split_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr,
    rows_inner, n_cols, n_chunks, ticket_index,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    PHASE: tl.constexpr, SLEEP_NS: tl.constexpr,
    CLEAR: tl.constexpr = False, next_ptr=None,
):  # fmt: skip
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    y = tl.load(y_rows + cols[None, :] * y_stride_col, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_rows + cols[None, :] * dy_stride_col, mask=mask, other=0.0).to(tl.float32)
    row, slots = _row_workspace(ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner,
                                rows_inner, n_chunks, row_ok, CLEAR)  # fmt: skip

    if PHASE != 1:
        # the dot product packed with 1.0 beside it, so a published partial is never 0
        dot = tl.sum(y * dy, axis=1)
        _publish(slots, chunk, _pack(dot, tl.full(dot.shape, 1.0, tl.float32)), row_ok)
    if PHASE != 0:
        row_dot = _backward_row_dot(ws_ptr, row, n_chunks, row_ok, PHASE, SLEEP_NS, MAX_CHUNKS)
        dx = y * (dy - row_dot[:, None])
        dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
        tl.store(dx_rows + cols[None, :] * dx_stride_col, dx.to(dx_ptr.dtype.element_ty),
                 mask=mask)  # fmt: skip


@triton.jit
def _unpair(pairs, HALF: tl.constexpr):
    """int32 pairs of 16-bit values (HALF 1: bf16, 2: fp16), the first in the low half as
    memory holds them -> (first, second) in fp32."""
    if HALF == 1:
        # bf16 is the top half of an fp32: a shift or a mask is the whole conversion
        first = (pairs << 16).to(tl.float32, bitcast=True)
        second = (pairs & -65536).to(tl.float32, bitcast=True)
    else:
        first = pairs.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        second = (pairs >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return first, second


@triton.jit
def _pair(first, second, HALF: tl.constexpr):
    """_unpair's inverse: two fp32 tensors rounded to 16 bits and packed into int32 pairs."""
    if HALF == 1:
        first = first.to(tl.bfloat16).to(tl.int16, bitcast=True)
        second = second.to(tl.bfloat16).to(tl.int16, bitcast=True)
    else:
        first = first.to(tl.float16).to(tl.int16, bitcast=True)
        second = second.to(tl.float16).to(tl.int16, bitcast=True)
    return (second.to(tl.int32) << 16) | (first.to(tl.int32) & 0xFFFF)


@triton.jit
def _reload(pairs, row_stat):
    """The held pairs, made opaque to the compiler: it would otherwise reuse the fp32 values
    unpacked before the wait, holding them (twice the registers) instead of the pairs. The
    XOR is 0 unless the row's statistic is NaN, and then every output of the row is NaN
    whatever the pairs hold; it flips every bit, so that no half of a pair is provably
    unchanged (a 0-or-1 XOR would leave the high halves to be reused)."""
    return pairs ^ tl.where(row_stat != row_stat, -1, 0)[:, None]


@triton.jit
def softmax_backward_split_pairs_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr,
    # as softmax_backward_split_kernel, counted in int32 pairs: n_cols and the strides halved
    rows_inner, n_cols, n_chunks, ticket_index,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    PHASE: tl.constexpr, SLEEP_NS: tl.constexpr, HALF: tl.constexpr,
    CLEAR: tl.constexpr = False, next_ptr=None,
):  # fmt: skip
    """softmax_backward_split_kernel over 16-bit rows held as int32 pairs: the pointers are the
    16-bit tensors viewed as int32, CHUNK pairs a chunk."""
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    y_pairs = tl.load(y_rows + cols[None, :] * y_stride_col, mask=mask, other=0)
    dy_pairs = tl.load(dy_rows + cols[None, :] * dy_stride_col, mask=mask, other=0)
    row, slots = _row_workspace(ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner,
                                rows_inner, n_chunks, row_ok, CLEAR)  # fmt: skip

    if PHASE != 1:
        y_first, y_second = _unpair(y_pairs, HALF)
        dy_first, dy_second = _unpair(dy_pairs, HALF)
        dot = tl.sum(y_first * dy_first, axis=1) + tl.sum(y_second * dy_second, axis=1)
        # packed with 1.0 beside it, so a published partial is never 0
        _publish(slots, chunk, _pack(dot, tl.full(dot.shape, 1.0, tl.float32)), row_ok)
    if PHASE != 0:
        row_dot = _backward_row_dot(ws_ptr, row, n_chunks, row_ok, PHASE, SLEEP_NS, MAX_CHUNKS)
        y_first, y_second = _unpair(_reload(y_pairs, row_dot), HALF)
        dy_first, dy_second = _unpair(_reload(dy_pairs, row_dot), HALF)
        row_dot = row_dot[:, None]
        dx = _pair(y_first * (dy_first - row_dot), y_second * (dy_second - row_dot), HALF)
        dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
        tl.store(dx_rows + cols[None, :] * dx_stride_col, dx, mask=mask)


_KERNELS = {False: softmax_split_kernel, True: softmax_backward_split_kernel}
# the pairs kernels' HALF: 1 for bf16, 2 for fp16
_HALF = {torch.bfloat16: 1, torch.float16: 2}


def _pairs_fit(moved: list[torch.Tensor], strides: list, chunk: int) -> bool:
    """Whether every tensor's rows can be read as int32 pairs (Config.pairs): a 16-bit dtype,
    unit column strides, an even row length, chunk and row strides, and 4-byte aligned data."""
    if moved[0].dtype not in _HALF or moved[0].shape[-1] % 2 or chunk % 2:
        return False
    return all(
        col == 1 and outer % 2 == 0 and inner % 2 == 0 and t.data_ptr() % 4 == 0
        for t, (outer, inner, col) in zip(moved, strides, strict=True)
    )


def launch_split(launch, moved: list[torch.Tensor], backward: bool, rows: tuple[int, int],
                 strides: list, config) -> None:  # fmt: skip
    """The coop design (one launch that waits) on a GPU, split2 (two launches) where config's
    design says so. moved: the inputs, then the output; rows: (rows_outer, rows_inner);
    strides[i]: moved[i]'s (outer, inner, column) strides; config: dispatch.Config."""
    rows_outer, rows_inner = rows
    n_cols = moved[0].shape[-1]
    device = moved[0].device
    n_chunks = triton.cdiv(n_cols, config.block_cols)
    n_slots = rows_outer * rows_inner * n_chunks
    grid = (rows_outer * triton.cdiv(rows_inner, config.block_rows) * n_chunks,)
    flat_strides = [s for tensor_strides in strides for s in tensor_strides]
    kernel = _KERNELS[backward]
    meta = dict(BLOCK_ROWS=config.block_rows, CHUNK=config.block_cols,
                MAX_CHUNKS=next_power_of_2(n_chunks), num_warps=config.num_warps,
                SLEEP_NS=SLEEP_NS)  # fmt: skip
    if config.maxnreg:
        meta["maxnreg"] = config.maxnreg
    if not backward:
        meta.update(POLICY="evict_first" if config.evict else "", EXP2=int(config.exp2))
    if backward and config.pairs and _pairs_fit(moved, strides, config.block_cols):
        # the same rows as int32 pairs: half the columns, half the row strides (viewed
        # through the merged row dims: torch refuses an odd stride even on a size-1 dim)
        kernel = softmax_backward_split_pairs_kernel
        meta.update(CHUNK=config.block_cols // 2, HALF=_HALF[moved[0].dtype])
        shape = (rows_outer, rows_inner, n_cols)
        moved = [t.as_strided(shape, s).view(torch.int32)
                 for t, s in zip(moved, strides, strict=True)]  # fmt: skip
        flat_strides = [s for so, si, _ in strides for s in (so // 2, si // 2, 1)]
        n_cols //= 2
    if config.design == "coop":
        if is_interpreter():
            # the interpreter runs programs one after another: a waiting one never returns
            raise ValueError("the coop design needs a GPU; the interpreter takes split2")
        # zeroed: 0 marks an unpublished slot; then the ticket counter
        n_ws = n_slots + 1
        # A traced launch (launch=wrap_triton, kernels/ops.py) zeroes a workspace of its own:
        # the cached pair flips on the host once per *trace*, so every replay of a compiled
        # graph would reuse one buffer that nothing zeroes again, and a tensor cached across
        # traces would leak one trace's fake tensor into the next.
        pair = coop_workspace(n_ws, device) if launch is direct else None
        if pair is None:
            ws = torch.zeros(n_ws, device=device, dtype=torch.int64)
            # torch.compile's launcher takes every parameter of the kernel, defaults included:
            # without next_ptr the grid lands in its place (Inductor: "launcher() missing
            # '_grid_1' and '_grid_2'"). Nothing reads it with CLEAR off.
            meta.update(CLEAR=False, next_ptr=ws)
        else:
            parity = pair[2]
            ws, next_ws = pair[parity], pair[1 - parity]
            meta.update(CLEAR=True, next_ptr=next_ws)
        step = Step(launch(kernel), grid,
                    (rows_inner, n_cols, n_chunks, n_slots, *flat_strides), dict(PHASE=2, **meta))
        step(*moved, ws)
        if pair is not None:
            pair[2] ^= 1  # launched: next_ws is (being) zeroed for the next launch
            # a plan may launch it again on the same workspaces (next_ptr is fixed in it)
            return Alternate(pair, parity, step, with_next=False)
    else:
        ws = torch.empty(n_slots, device=device, dtype=torch.int64)
        for phase in (0, 1):
            launch(kernel)[grid](*moved, ws, rows_inner, n_cols, n_chunks, n_slots,
                                 *flat_strides, PHASE=phase, **meta)  # fmt: skip
    return None
