"""Long-row softmax with each program's chunk held in shared memory (Gluon, NVIDIA sm_80+).

The Triton coop kernels of kernels/softmax.py hold a chunk of the row in registers across the
wait for the row's other chunks; registers then bound the bytes an SM keeps in flight (the 16-bit
forward: 10 programs x 8 KB, about 70% of copy bandwidth on an H100, kernels/notes/softmax.md
round 9). Here a program copies its chunk into shared memory with cp.async (no registers on the
way), so an SM holds as many chunks as its 228 KB of shared memory takes, and the registers only
see one piece of the chunk at a time. Otherwise the protocol is the coop one: a ticket names the
(row, chunk); the chunk's partial is published in a workspace slot (one 64-bit exchange, never
0); the program polls the row's slots, combines them in chunk order (deterministic) and writes
its chunk. The workspace comes from kernels.softmax._coop_workspace, and each program zeroes its
words of the next launch's one.

Gluon is Triton's lower-level language (triton.experimental.gluon): the interpreter does not run
it, so these kernels are GPU-only, as the coop design is; the CPU path keeps split2.
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from kernels._coop import _nanosleep, _pack, _unpack

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _ticket_position(ws_ptr, ticket_index, n_chunks):
    # Tickets are handed out in the order programs start: a row's chunks start together, and
    # every chunk a program waits for has started or can start (the coop deadlock argument).
    ticket = gl.atomic_add(ws_ptr + ticket_index, 1).to(gl.int32)
    return ticket, ticket // n_chunks, ticket % n_chunks


@gluon.jit
def _exp_shifted(x, shift, EXP2: gl.constexpr):
    """exp(x - shift) as exp2: 2 folds the subtraction into one FMA (kernels.softmax.Config)."""
    if EXP2 == 2:
        return gl.exp2(x * LOG2E - shift * LOG2E)
    else:
        return gl.exp2((x - shift) * LOG2E)


@gluon.jit
def _row_slots(slots, n_chunks, MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr,
               WARPS: gl.constexpr):  # fmt: skip
    """The row's packed partials once all are published (0 marks an unpublished slot)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    k = gl.arange(0, MAX_CHUNKS, layout=layout)
    ok = k < n_chunks
    packed = gl.load(slots + k, mask=ok, other=1, volatile=True)
    missing = gl.sum(gl.where(packed == 0, 1, 0), axis=0)
    while missing > 0:
        missing = _nanosleep(missing, SLEEP_NS)
        packed = gl.load(slots + k, mask=ok, other=1, volatile=True)
        missing = gl.sum(gl.where(packed == 0, 1, 0), axis=0)
    # a slot several threads hold may have read 0 in one of them a moment before the sum: every
    # slot is published now, so one more load sees them all
    packed = gl.load(slots + k, mask=ok, other=1, volatile=True)
    return packed, ok


@gluon.jit
def _chunk_position(ws_ptr, next_ptr, ticket_index, rows_inner, n_vecs, n_chunks,
                    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr,
                    WARPS: gl.constexpr, CLEAR: gl.constexpr):  # fmt: skip
    """(outer row, inner row, first column, columns left, piece offsets, the row's slots) of
    this program's chunk; with CLEAR, also zeroes its words of the next launch's workspace (its
    slot, and the ticket for the first program)."""
    ticket, row, chunk = _ticket_position(ws_ptr, ticket_index, n_chunks)
    outer = (row // rows_inner).to(gl.int64)
    inner = (row % rows_inner).to(gl.int64)
    start = chunk.to(gl.int64) * CHUNK
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, PIECE, layout=layout)
    limit = n_vecs.to(gl.int64) * VEC - start  # columns of the row left from this chunk's first
    slots = ws_ptr + row.to(gl.int64) * n_chunks
    if CLEAR:
        gl.store(next_ptr + row.to(gl.int64) * n_chunks + chunk, 0)
        gl.store(next_ptr + ticket_index, 0, mask=ticket == 0)
    return outer, inner, start, limit, offs, slots, chunk


@gluon.jit
def _chunk_start(ptr, outer, inner, vstride_outer, vstride_inner, start, VEC: gl.constexpr):
    """Address of the chunk's first column, row strides in units of VEC elements."""
    return ptr + (outer * vstride_outer + inner * vstride_inner) * VEC + start


@gluon.jit
def _copy_in(smem, row_ptr, offs, limit, p: gl.constexpr, PIECE: gl.constexpr,
             POLICY: gl.constexpr):  # fmt: skip
    """Start copying piece p of the chunk at row_ptr into smem.index(p) (cp.async, 16 bytes a
    thread; columns past the row's end are filled with 0)."""
    cp.async_copy_global_to_shared(
        smem.index(p), row_ptr + p * PIECE + offs, mask=p * PIECE + offs < limit,
        eviction_policy=POLICY,
    )  # fmt: skip


@gluon.jit
def softmax_smem_forward_kernel(
    x_ptr, y_ptr, ws_ptr, next_ptr,
    # n_cols and the row strides come in units of VEC elements (16 bytes), so that the
    # compiler knows every row start and the column limit 16-byte aligned: cp.async copies
    # 16 bytes at a time only then
    rows_inner, n_vecs, n_chunks, ticket_index,
    x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
    MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr, EXP2: gl.constexpr,
    POLICY: gl.constexpr = "", CLEAR: gl.constexpr = True,
):  # fmt: skip
    """One program per (row, chunk of CHUNK columns), rows of unit column stride."""
    PIECES: gl.constexpr = CHUNK // PIECE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    outer, inner, start, limit, offs, slots, chunk = _chunk_position(
        ws_ptr, next_ptr, ticket_index, rows_inner, n_vecs, n_chunks,
        CHUNK, PIECE, VEC, WARPS, CLEAR,
    )  # fmt: skip
    x_row = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, start, VEC)

    # every piece's copy in flight at once, one commit group each
    smem = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [PIECES, PIECE], smem_layout)
    for p in gl.static_range(PIECES):
        _copy_in(smem, x_row, offs, limit, p, PIECE, POLICY)
        cp.commit_group()

    # the chunk's max, elementwise over the pieces as they land, then across threads once;
    # each thread reads only what its own copies wrote (one layout for both): no barrier
    for p in gl.static_range(PIECES):
        cp.wait_group(PIECES - 1 - p)
        v = gl.where(p * PIECE + offs < limit, smem.index(p).load(layout).to(gl.float32),
                     -float("inf"))  # fmt: skip
        if p == 0:
            max_vec = v
        else:
            max_vec = gl.maximum(max_vec, v)
    run_max = gl.max(max_vec, axis=0)
    # an all -inf chunk shifts by 0: its sum is 0, not NaN
    shift = gl.where(run_max == -float("inf"), 0.0, run_max)
    sum_vec = gl.zeros([PIECE], gl.float32, layout)
    for p in range(PIECES):
        v = smem.index(p).load(layout).to(gl.float32)
        sum_vec += gl.where(p * PIECE + offs < limit, _exp_shifted(v, shift, EXP2), 0.0)
    run_sum = gl.sum(sum_vec, axis=0)

    # publish (max, sum): the max is never the bits 0 unless the sum is at least 1
    gl.atomic_xchg(slots + chunk, _pack(run_max, run_sum), sem="relaxed")

    packed, slot_ok = _row_slots(slots, n_chunks, MAX_CHUNKS, SLEEP_NS, WARPS)
    maxes, sums = _unpack(packed)
    maxes = gl.where(slot_ok, maxes, -float("inf"))
    row_max = gl.max(maxes, axis=0)
    # an all -inf row: row_max = -inf, exp(-inf - -inf) = NaN everywhere, as torch gives
    row_sum = gl.sum(gl.where(slot_ok, sums * gl.exp2((maxes - row_max) * LOG2E), 0.0), axis=0)
    inv_sum = 1.0 / row_sum

    y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
    for p in range(PIECES):
        ok = p * PIECE + offs < limit
        e = _exp_shifted(smem.index(p).load(layout).to(gl.float32), row_max, EXP2)
        gl.store(y_row + p * PIECE + offs, (e * inv_sum).to(y_ptr.dtype.element_ty), mask=ok,
                 eviction_policy=POLICY)  # fmt: skip


@gluon.jit
def softmax_smem_backward_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr, next_ptr,
    rows_inner, n_vecs, n_chunks, ticket_index,
    y_vstride_outer, y_vstride_inner, dy_vstride_outer, dy_vstride_inner,
    dx_vstride_outer, dx_vstride_inner,
    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
    MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr, POLICY: gl.constexpr = "",
    CLEAR: gl.constexpr = True,
):  # fmt: skip
    """dx = y·(dy - Σ y·dy) with y and dy's chunks held in shared memory, as the forward."""
    PIECES: gl.constexpr = CHUNK // PIECE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    outer, inner, start, limit, offs, slots, chunk = _chunk_position(
        ws_ptr, next_ptr, ticket_index, rows_inner, n_vecs, n_chunks,
        CHUNK, PIECE, VEC, WARPS, CLEAR,
    )  # fmt: skip
    y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
    dy_row = _chunk_start(dy_ptr, outer, inner, dy_vstride_outer, dy_vstride_inner, start, VEC)
    y_smem = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [PIECES, PIECE], smem_layout)
    dy_smem = gl.allocate_shared_memory(dy_ptr.dtype.element_ty, [PIECES, PIECE], smem_layout)
    for p in gl.static_range(PIECES):
        _copy_in(y_smem, y_row, offs, limit, p, PIECE, POLICY)
        _copy_in(dy_smem, dy_row, offs, limit, p, PIECE, POLICY)
        cp.commit_group()

    # Σ y·dy over the chunk (columns past the row's end were filled with 0), elementwise over
    # the pieces as they land, then across threads once
    dot_vec = gl.zeros([PIECE], gl.float32, layout)
    for p in gl.static_range(PIECES):
        cp.wait_group(PIECES - 1 - p)
        y = y_smem.index(p).load(layout).to(gl.float32)
        dot_vec += y * dy_smem.index(p).load(layout).to(gl.float32)
    # packed with 1.0 beside it, so a published partial is never 0
    dot = gl.sum(dot_vec, axis=0)
    gl.atomic_xchg(slots + chunk, _pack(dot, dot * 0.0 + 1.0), sem="relaxed")

    packed, slot_ok = _row_slots(slots, n_chunks, MAX_CHUNKS, SLEEP_NS, WARPS)
    dots, _ = _unpack(packed)
    row_dot = gl.sum(gl.where(slot_ok, dots, 0.0), axis=0)

    dx_row = _chunk_start(dx_ptr, outer, inner, dx_vstride_outer, dx_vstride_inner, start, VEC)
    for p in range(PIECES):
        y = y_smem.index(p).load(layout).to(gl.float32)
        dx = y * (dy_smem.index(p).load(layout).to(gl.float32) - row_dot)
        gl.store(dx_row + p * PIECE + offs, dx.to(dx_ptr.dtype.element_ty),
                 mask=p * PIECE + offs < limit, eviction_policy=POLICY)  # fmt: skip


def launch(launcher, backward, tensors, ws, next_ws, rows, strides, chunk, warps, piece=0,
           sleep_ns=200, exp2=0, evict=False, maxnreg=0):  # fmt: skip
    """Launch the forward (tensors x, y) or the backward (y, dy, dx) over rows
    (rows_outer, rows_inner) with strides[i] = (outer, inner, 1) for tensors[i], in elements,
    all multiples of 16 bytes (kernels.softmax._smem_fits). ws is zeroed; the kernel zeroes
    next_ws (None: nothing to zero) for the next launch. launcher: kernels._common.direct."""
    rows_outer, rows_inner = rows
    n_cols = tensors[0].shape[-1]
    n_chunks = triton.cdiv(n_cols, chunk)
    n_slots = rows_outer * rows_inner * n_chunks
    vec = 16 // tensors[0].element_size()
    piece = piece or vec * 32 * warps
    if chunk % piece:
        raise ValueError(f"a chunk of {chunk} columns is not a whole number of {piece}-wide pieces")
    vstrides = [s // vec for outer, inner, _ in strides for s in (outer, inner)]
    meta = dict(
        CHUNK=chunk, PIECE=piece, VEC=vec, WARPS=warps, MAX_CHUNKS=triton.next_power_of_2(n_chunks),
        SLEEP_NS=sleep_ns, POLICY="evict_first" if evict else "", CLEAR=next_ws is not None,
        num_warps=warps,
    )  # fmt: skip
    kernel = softmax_smem_backward_kernel if backward else softmax_smem_forward_kernel
    if not backward:
        meta["EXP2"] = exp2
    if maxnreg:  # a ptxas register cap (kernels.softmax.Config.maxnreg)
        meta["maxnreg"] = maxnreg
    launcher(kernel)[(n_slots,)](
        *tensors, ws, next_ws, rows_inner, n_cols // vec, n_chunks, n_slots, *vstrides, **meta
    )
