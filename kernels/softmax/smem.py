"""The smem design: long rows with each program's chunk held in shared memory (Gluon, Hopper).

The coop kernels (split.py) hold a chunk of the row in registers across the wait for the row's
other chunks; registers then bound the bytes an SM keeps in flight. Here a program copies its
chunk into shared memory with cp.async (no registers on the way), so an SM holds as many chunks
as its shared memory takes, and the registers only see one piece (16 bytes a thread) of the
chunk at a time. The chunk's partial is published in a workspace slot (one 64-bit exchange,
never 0); the program polls the row's slots, combines them in chunk order (deterministic) and
writes its chunk. The workspace comes from coop.coop_workspace, and each program zeroes its
words of the next launch's one.

The chunk is the program id, no atomic ticket at the start. Nothing then promises that a row's
other programs run while one waits, so a program that has polled its row LEAVE_POLLS times
leaves its chunk: it sets a flag and counts itself in the row's count word, and the row's last
publisher (the program whose count brings the row's partials to all) writes the left chunks
from global memory (_row_slots, _leave). So a program never waits on one that has not started.

The forward, where rows are whole chunks (EVEN), has no masks and interleaves a row's chunks
piece by piece (STRIDE): chunk k's piece p is the row's piece p x chunks + k, so that a row's
programs, which start together, read and write one contiguous span a step. On grids of several
waves, LEAD programs an SM ahead of the chunks' programs only hold their slots a while, so that
the first wave's chunk programs start fewer at a time and in turn (_lead_wait).

Gluon is Triton's lower-level language (triton.experimental.gluon): the interpreter does not run
it, so these kernels are GPU-only, as the coop design is; the CPU path takes split2.

Functions:
    _pid_ticket, _clear_pid_words, _leave_words, _position, _chunk_start   a program's chunk
    _lead_wait, _globaltimer                  the lead programs
    _row_slots, _leave, _publish_and_wait, _last_with_leavers, _row_left_flags, _cta_barrier
                                              publish, wait, leave
    _copy_in, _store_piece                    a chunk's pieces in and out
    _forward_partial, _row_stats, _forward_write, _forward_write_left   the forward's halves
    _backward_partial, _row_dot, _backward_write, _backward_write_from_global   the backward's
    softmax_smem_forward_kernel, softmax_smem_backward_kernel
    workspace_words, launch                   the host side
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from kernels._launch import Step
from kernels.softmax.coop import SLEEP_NS, _nanosleep, _pack, _unpack

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
# what a program that leaves its chunk adds to its row's count word (the low bits count the
# published partials, at most MAX_SPLIT_CHUNKS)
LEFT_UNIT: gl.constexpr = gl.constexpr(65536)
# Polls of its row's slots after which a program leaves its chunk to the row's last publisher:
# at least 256 x SLEEP_NS, against a few polls for a row whose programs all run.
LEAVE_POLLS = 256
# The lead programs: LEAD_PER_SM an SM, the k-th of an SM holding its slot k x LEAD_NS ns
LEAD_PER_SM = 4
LEAD_NS = 1500


@gluon.jit
def _pid_ticket(next_ptr, ticket_index, n_chunks, CLEAR: gl.constexpr, LEAD: gl.constexpr = 0):
    """The program id as the ticket (ticket = row * n_chunks + chunk): no atomic at the
    program's start. With CLEAR, zeroes the ticket's words of the next launch's workspace. The
    grid's first LEAD programs hold no chunk (_lead_wait), so the ticket is the program id less
    LEAD."""
    ticket = gl.program_id(0) - LEAD
    if CLEAR:
        _clear_pid_words(next_ptr, ticket, ticket_index, n_chunks)
    return ticket


@gluon.jit
def _clear_pid_words(next_ptr, ticket, ticket_index, n_chunks):
    """Zero a ticket's words of the next launch's workspace: its slot, the ticket counter for
    ticket 0, and its leave words (_leave_words: the row's count by its first chunk, the
    chunk's flag)."""
    gl.store(next_ptr + ticket, 0)
    gl.store(next_ptr + ticket_index, 0, mask=ticket == 0)
    count, left = _leave_words(next_ptr, ticket, ticket_index, n_chunks)
    gl.store(count, 0, mask=ticket % n_chunks == 0)
    gl.store(left, 0)


@gluon.jit
def _leave_words(ws_ptr, ticket, ticket_index, n_chunks):
    """(the row's count word, the chunk's left flag) in the workspace past the slots and the
    ticket counter (workspace_words sizes it). The count is the row's published partials plus
    LEFT_UNIT for each program that left its chunk."""
    n_rows = ticket_index // n_chunks
    count = ws_ptr + ticket_index + 1 + ticket // n_chunks
    return count, ws_ptr + ticket_index + 1 + n_rows + ticket


@gluon.jit
def _lead_wait(pid, LEAD: gl.constexpr, TIERS: gl.constexpr, LEAD_NS: gl.constexpr):
    """A lead program's life: hold its slot, and so its SM's shared memory, for LEAD_NS ns
    times its tier (1 to TIERS, the first LEAD // TIERS programs the first), timed by
    %globaltimer, so that the first wave's chunk programs start fewer at a time and in turn,
    not all loading at once and all computing at once."""
    start = _globaltimer(pid)
    until = start + LEAD_NS * (1 + pid * TIERS // LEAD)
    now = start
    while now < until:
        now = _globaltimer(_nanosleep(pid, 200))


@gluon.jit
def _globaltimer(after):
    """%globaltimer (ns, one clock for the GPU), read after `after` is computed."""
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [after],
                                     dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _first_thread(WARPS: gl.constexpr):
    """(zeros, the first thread's mask) over the program's threads: an atomic on one word
    whose old value only that thread keeps (a scalar atomic's result would be broadcast at
    once, every warp waiting the L2 round trip at the barrier that takes)."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    lanes = gl.arange(0, 32 * WARPS, layout=layout)
    return lanes * 0, lanes == 0


@gluon.jit
def _position(ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK: gl.constexpr,
              VEC: gl.constexpr):  # fmt: skip
    """(outer row, inner row, first column, columns left from it, the row's slots) of a
    ticket's chunk."""
    row = ticket // n_chunks
    outer = (row // rows_inner).to(gl.int64)
    inner = (row % rows_inner).to(gl.int64)
    start = (ticket % n_chunks).to(gl.int64) * CHUNK
    limit = n_vecs.to(gl.int64) * VEC - start
    return outer, inner, start, limit, ws_ptr + row.to(gl.int64) * n_chunks


@gluon.jit
def _exp_shifted(x, shift, EXP2: gl.constexpr):
    """exp(x - shift) as exp2: 2 folds the subtraction into one FMA (tile._exp_shifted)."""
    if EXP2 == 2:
        t = x * LOG2E - shift * LOG2E
    else:
        t = (x - shift) * LOG2E
    return gl.exp2(t)


@gluon.jit
def _row_slots(slots, n_chunks, POLL_WIDTH: gl.constexpr, SLEEP_NS: gl.constexpr,
               WARPS: gl.constexpr, LEAVE_POLLS: gl.constexpr, count, left):  # fmt: skip
    """(the row's packed partials, which are the row's, gone) once all are published (0 marks
    an unpublished slot), or once this program has left its chunk (gone = 1): after
    LEAVE_POLLS polls (-1: never, for tests) it tries to (_leave), and the row's last
    publisher writes a left chunk from global memory. So a program never waits on one that has
    not started: the GPU need not start programs in id order.

    POLL_WIDTH is at least the program's threads: the missing count is then a reduction across
    warps, which every warp reads alike, so all take each poll, and the leave, together
    (_leave's barrier must meet the others' own)."""
    gl.static_assert(LEAVE_POLLS <= 0 or POLL_WIDTH >= 32 * WARPS,
                     "leaving needs the poll spread over every warp")  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    k = gl.arange(0, POLL_WIDTH, layout=layout)
    ok = k < n_chunks
    packed = gl.load(slots + k, mask=ok, other=1, volatile=True)
    missing = gl.sum(gl.where(packed == 0, 1, 0), axis=0)
    gone = missing * 0
    if LEAVE_POLLS > 0:
        polls = missing * 0
    while missing > 0:
        if LEAVE_POLLS > 0:
            polls += 1
            if polls == LEAVE_POLLS:
                gone = _leave(count, left, n_chunks, WARPS)
        missing = _nanosleep(missing, SLEEP_NS)
        packed = gl.load(slots + k, mask=ok, other=1, volatile=True)
        missing = gl.sum(gl.where(packed == 0, 1, 0), axis=0) * (1 - gone)
    # a slot several threads hold may have read 0 in one of them a moment before the sum: every
    # slot is published now (unless gone), so one more load sees them all
    packed = gl.load(slots + k, mask=ok, other=1, volatile=True)
    return packed, ok, gone


@gluon.jit
def _publish_and_wait(ws_ptr, ticket, partial, slots, ticket_index, n_chunks,
                      POLL_WIDTH: gl.constexpr, SLEEP_NS: gl.constexpr, WARPS: gl.constexpr,
                      LEAVE_POLLS: gl.constexpr):  # fmt: skip
    """Publish the chunk's partial, count it in the row's count word (so the program whose
    count brings the row to n_chunks is its last publisher), and wait for the row's partials
    (_row_slots): (packed, which are the row's, gone, the first thread's old count, its mask,
    the chunk's left flag). Relaxed atomics: every wait polls the slots themselves."""
    count, left = _leave_words(ws_ptr, ticket, ticket_index, n_chunks)
    zero, first = _first_thread(WARPS)
    gl.atomic_xchg(ws_ptr + ticket + zero, partial + zero, mask=first, sem="relaxed")
    counted = gl.atomic_add(count + zero, zero.to(gl.int64) + 1, mask=first, sem="relaxed")
    packed, slot_ok, gone = _row_slots(slots, n_chunks, POLL_WIDTH, SLEEP_NS, WARPS, LEAVE_POLLS,
                                       count, left)  # fmt: skip
    return packed, slot_ok, gone, counted, first, left


@gluon.jit
def _last_with_leavers(counted, first, n_chunks):
    """Whether this program is its row's last publisher (its count atomic brought the row's
    partials to n_chunks) and some program left its chunk before that (_row_slots): then it
    writes the left chunks."""
    old = gl.max(gl.where(first, counted, 0), axis=0)
    return (old % LEFT_UNIT == n_chunks - 1) & (old >= LEFT_UNIT)


@gluon.jit
def _row_left_flags(left, ticket, n_chunks):
    """The row's first left flag (_leave_words), for its last publisher's leaver loop: the
    leavers' flags are ordered before their count atomics (_leave: acq_rel), and the first
    thread's count atomic (read by _last_with_leavers) and a fence make an acquire, passed on
    to every thread by the barrier."""
    left = left + _cta_barrier(n_chunks * 0, True)
    first_chunk = ticket - ticket % n_chunks
    return left - ticket + first_chunk


@gluon.jit
def _cta_barrier(x, FENCE: gl.constexpr = False):
    """bar.sync across the program's threads, returning x (its use orders what follows):
    inline PTX, as Gluon's barrier is named differently across Triton releases. FENCE: each
    thread's fence.acq_rel.gpu first (a thread's relaxed atomic before it becomes an acquire,
    which the barrier passes on to every thread)."""
    if FENCE:
        return gl.inline_asm_elementwise("fence.acq_rel.gpu;\n\tbar.sync 0;\n\tmov.b32 $0, $1;",
                                         "=r,r", [x], dtype=gl.int32, is_pure=False,
                                         pack=1)  # fmt: skip
    return gl.inline_asm_elementwise("bar.sync 0;\n\tmov.b32 $0, $1;", "=r,r", [x],
                                     dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip


@gluon.jit
def _leave(count, left, n_chunks, WARPS: gl.constexpr):
    """Try to leave the chunk whose flag is `left` (_row_slots): 1 if it left, 0 if its row's
    partials were all counted first (it stays). The first thread sets the flag, adds LEFT_UNIT
    to the count (the atomic orders the two), and overwrites the flag with 2 if it stays; the
    others read the flag after a barrier. Every warp must call it at the same poll (the poll's
    count is one across warps, _row_slots), or its barrier meets another warp's elsewhere."""
    zero, first = _first_thread(WARPS)
    gl.store(left + zero, zero.to(gl.int64) + 1, mask=first)
    old = gl.atomic_add(count + zero, zero.to(gl.int64) + LEFT_UNIT, mask=first, sem="acq_rel")
    stays = old % LEFT_UNIT >= n_chunks
    gl.store(left + zero, gl.where(stays, 2, 1).to(gl.int64), mask=first)
    after = _cta_barrier(n_chunks)
    flag = gl.load(left + after * 0, volatile=True)
    return gl.where(flag == 1, 1, 0)


@gluon.jit
def _chunk_start(ptr, outer, inner, vstride_outer, vstride_inner, start, VEC: gl.constexpr):
    """Address of the chunk's first column, row strides in units of VEC elements."""
    return ptr + (outer * vstride_outer + inner * vstride_inner) * VEC + start


@gluon.constexpr_function
def _piece_step(piece, stride):
    """The columns between a chunk's pieces: `stride` where the chunks are interleaved (> 0),
    else the piece's own width."""
    return stride if stride > 0 else piece


@gluon.jit
def _copy_in(smem, row_ptr, offs, limit, p: gl.constexpr, PIECE: gl.constexpr,
             EVEN: gl.constexpr, STRIDE: gl.constexpr = 0):  # fmt: skip
    """Start copying piece p of the chunk at row_ptr into smem.index(p) (cp.async, 16 bytes a
    thread; columns past the row's end are filled with 0). EVEN: the row is whole chunks, no
    mask. STRIDE > 0 (with EVEN): the chunk's pieces lie STRIDE columns apart, not PIECE."""
    if EVEN:
        cp.async_copy_global_to_shared(smem.index(p),
                                       row_ptr + p * _piece_step(PIECE, STRIDE) + offs)
    else:
        cp.async_copy_global_to_shared(smem.index(p), row_ptr + p * PIECE + offs,
                                       mask=p * PIECE + offs < limit)  # fmt: skip


@gluon.jit
def _store_piece(row, p, value, offs, limit, PIECE: gl.constexpr, EVEN: gl.constexpr,
                 STRIDE: gl.constexpr = 0):  # fmt: skip
    """Store piece p of a chunk's output from its first column `row` (no mask where EVEN: the
    row is whole chunks; STRIDE > 0, with EVEN: pieces STRIDE columns apart, as _copy_in)."""
    if EVEN:
        gl.store(row + p * _piece_step(PIECE, STRIDE) + offs, value)
    else:
        gl.store(row + p * PIECE + offs, value, mask=p * PIECE + offs < limit)


# -- the forward's halves: a chunk's partial (max, sum of exp), and its output -------------------
@gluon.jit
def _forward_partial(smem, offs, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                     VEC: gl.constexpr, WARPS: gl.constexpr, EXP2: gl.constexpr,
                     EVEN: gl.constexpr):  # fmt: skip
    """(max, sum of exp(x - max)) of the chunk whose PIECES copies into smem.index(p) are the
    thread's last commit groups, packed for publishing. EVEN: every column is in the row (no
    masks)."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    # the max, elementwise over the pieces as they land, then across threads once; each thread
    # reads only what its own copies wrote (one layout for both): no barrier
    for p in gl.static_range(PIECES):
        cp.wait_group(PIECES - 1 - p)
        v = smem.index(p).load(layout).to(gl.float32)
        if not EVEN:
            v = gl.where(p * PIECE + offs < limit, v, -float("inf"))
        if p == 0:
            max_vec = v
        else:
            max_vec = gl.maximum(max_vec, v)
    run_max = gl.max(max_vec, axis=0)
    # an all -inf chunk shifts by 0: its sum is 0, not NaN
    shift = gl.where(run_max == -float("inf"), 0.0, run_max)
    sum_vec = gl.zeros([PIECE], gl.float32, layout)
    for p in range(0, PIECES):
        v = smem.index(p).load(layout).to(gl.float32)
        if EVEN:
            sum_vec += _exp_shifted(v, shift, EXP2)
        else:
            sum_vec += gl.where(p * PIECE + offs < limit, _exp_shifted(v, shift, EXP2), 0.0)
    # the max is never the bits 0 unless the sum is at least 1: a published slot is never 0
    return _pack(run_max, gl.sum(sum_vec, axis=0))


@gluon.jit
def _row_stats(packed, slot_ok):
    """The row's (max, 1 / sum of exp(x - max)) from its published (max, sum) partials."""
    maxes, sums = _unpack(packed)
    maxes = gl.where(slot_ok, maxes, -float("inf"))
    row_max = gl.max(maxes, axis=0)
    # an all -inf row: row_max = -inf, exp(-inf - -inf) = NaN everywhere, as torch gives
    row_sum = gl.sum(gl.where(slot_ok, sums * gl.exp2((maxes - row_max) * LOG2E), 0.0), axis=0)
    return row_max, 1.0 / row_sum


@gluon.jit
def _forward_write(y_ptr, smem, row_max, inv_sum, outer, inner, start, y_vstride_outer,
                   y_vstride_inner, offs, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                   VEC: gl.constexpr, WARPS: gl.constexpr, EXP2: gl.constexpr,
                   EVEN: gl.constexpr, STRIDE: gl.constexpr):  # fmt: skip
    """Write y from the chunk held in smem.index(p), given the row's (max, 1 / sum)
    (_row_stats). STRIDE: as _copy_in's."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
    for p in range(PIECES):
        e = _exp_shifted(smem.index(p).load(layout).to(gl.float32), row_max, EXP2)
        _store_piece(y_row, p, (e * inv_sum).to(y_row.dtype.element_ty), offs, limit, PIECE,
                     EVEN, STRIDE)  # fmt: skip


@gluon.jit
def _write_from_global(x_chunk, y_chunk, limit, row_max, inv_sum, CHUNK: gl.constexpr,
                       VEC: gl.constexpr, WARPS: gl.constexpr, EXP2: gl.constexpr,
                       STRIDE: gl.constexpr):  # fmt: skip
    """y of a chunk another program left (_row_slots), read from global memory: a cold path,
    a piece at a time (not unrolled: few registers), the same arithmetic as _forward_write so
    that the bits match the owner's. STRIDE > 0 (interleaved; a whole chunk): its pieces
    STRIDE columns apart."""
    PIECE: gl.constexpr = 32 * WARPS * VEC
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, PIECE, layout=layout)
    for p in tl.range(CHUNK // PIECE, loop_unroll_factor=1):
        if STRIDE > 0:
            v = gl.load(x_chunk + p * STRIDE + offs).to(gl.float32)
            y = (_exp_shifted(v, row_max, EXP2) * inv_sum).to(y_chunk.dtype.element_ty)
            gl.store(y_chunk + p * STRIDE + offs, y)
        else:
            ok = p * PIECE + offs < limit
            v = gl.load(x_chunk + p * PIECE + offs, mask=ok, other=0.0).to(gl.float32)
            y = (_exp_shifted(v, row_max, EXP2) * inv_sum).to(y_chunk.dtype.element_ty)
            gl.store(y_chunk + p * PIECE + offs, y, mask=ok)


@gluon.jit
def _forward_write_left(x_ptr, y_ptr, left, ticket, n_chunks, n_vecs, outer, inner,
                        x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
                        row_max, inv_sum, CHUNK: gl.constexpr, VEC: gl.constexpr,
                        WARPS: gl.constexpr, EXP2: gl.constexpr,
                        STRIDE: gl.constexpr):  # fmt: skip
    """The row's last publisher (ticket; _last_with_leavers) writes every chunk of its row
    whose flag says its program left it (_row_slots), from global memory (_write_from_global).
    STRIDE > 0 (interleaved): chunk j's pieces start at column j x a piece, STRIDE apart."""
    flags = _row_left_flags(left, ticket, n_chunks)
    row_limit = n_vecs.to(gl.int64) * VEC
    x_row0 = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, 0, VEC)
    y_row0 = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, 0, VEC)
    # where chunk j starts: its first piece (STRIDE: the row's pieces interleaved by chunk)
    FIRST: gl.constexpr = 32 * WARPS * VEC if STRIDE > 0 else CHUNK
    for j in range(n_chunks):
        if gl.load(flags + j, volatile=True) == 1:
            _write_from_global(x_row0 + j * FIRST, y_row0 + j * FIRST, row_limit - j * CHUNK,
                               row_max, inv_sum, CHUNK, VEC, WARPS, EXP2, STRIDE)  # fmt: skip


# -- the backward's halves: a chunk's Σ y·dy, and its dx -----------------------------------------
@gluon.jit
def _backward_partial(y_smem, dy_smem, PIECES: gl.constexpr, PIECE: gl.constexpr,
                      VEC: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """Σ y·dy over the chunk (columns past the row's end were filled with 0), elementwise over
    the pieces as they land, then across threads once; packed with 1.0 beside it, so a
    published partial is never 0."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    dot_vec = gl.zeros([PIECE], gl.float32, layout)
    for p in gl.static_range(PIECES):
        cp.wait_group(PIECES - 1 - p)
        y = y_smem.index(p).load(layout).to(gl.float32)
        dot_vec += y * dy_smem.index(p).load(layout).to(gl.float32)
    dot = gl.sum(dot_vec, axis=0)
    return _pack(dot, dot * 0.0 + 1.0)


@gluon.jit
def _row_dot(packed, slot_ok):
    """The row's Σ y·dy from its published partials (_backward_partial)."""
    dots, _ = _unpack(packed)
    return gl.sum(gl.where(slot_ok, dots, 0.0), axis=0)


@gluon.jit
def _backward_write(dx_ptr, y_smem, dy_smem, row_dot, outer, inner, start, dx_vstride_outer,
                    dx_vstride_inner, offs, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                    VEC: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """Write dx = y·(dy - row_dot) from the chunk held in y_smem and dy_smem.index(p)."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    dx_row = _chunk_start(dx_ptr, outer, inner, dx_vstride_outer, dx_vstride_inner, start, VEC)
    for p in range(PIECES):
        y = y_smem.index(p).load(layout).to(gl.float32)
        dx = (y * (dy_smem.index(p).load(layout).to(gl.float32) - row_dot)).to(
            dx_ptr.dtype.element_ty
        )  # fmt: skip
        _store_piece(dx_row, p, dx, offs, limit, PIECE, False)


@gluon.jit
def _backward_write_from_global(y_chunk, dy_chunk, dx_chunk, limit, row_dot,
                                CHUNK: gl.constexpr, VEC: gl.constexpr,
                                WARPS: gl.constexpr):  # fmt: skip
    """dx of a chunk another program left (_row_slots), y and dy read from global memory: a
    cold path, a piece at a time, the arithmetic of _backward_write (the owner's bits)."""
    PIECE: gl.constexpr = 32 * WARPS * VEC
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, PIECE, layout=layout)
    for p in tl.range(CHUNK // PIECE, loop_unroll_factor=1):
        ok = p * PIECE + offs < limit
        y = gl.load(y_chunk + p * PIECE + offs, mask=ok, other=0.0).to(gl.float32)
        dy = gl.load(dy_chunk + p * PIECE + offs, mask=ok, other=0.0).to(gl.float32)
        gl.store(dx_chunk + p * PIECE + offs, (y * (dy - row_dot)).to(dx_chunk.dtype.element_ty),
                 mask=ok)  # fmt: skip


# -- the kernels --------------------------------------------------------------------------------
# n_cols (n_vecs) and the row strides come in units of VEC elements (16 bytes), so that the
# compiler knows every row start and the column limit 16-byte aligned: cp.async copies 16 bytes
# at a time only then.
@gluon.jit
def softmax_smem_forward_kernel(
    x_ptr, y_ptr, ws_ptr, next_ptr,
    rows_inner, n_vecs, n_chunks, ticket_index,
    x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
    POLL_WIDTH: gl.constexpr, SLEEP_NS: gl.constexpr, LEAVE_POLLS: gl.constexpr,
    EXP2: gl.constexpr, CLEAR: gl.constexpr, EVEN: gl.constexpr, STRIDE: gl.constexpr,
    LEAD: gl.constexpr, LEAD_TIERS: gl.constexpr, LEAD_NS: gl.constexpr,
):  # fmt: skip
    """One program per (row, chunk of CHUNK columns) after LEAD lead programs, rows of unit
    column stride. EVEN: rows are whole chunks (no masks); STRIDE > 0 (EVEN): the row's chunks
    interleaved piece by piece, chunk k's piece p at column (p x the row's chunks + k) x
    PIECE, STRIDE = PIECE x the row's chunks (a constexpr: the pieces' offsets are
    immediates). LEAD: the grid's first LEAD programs only hold their slots a while, in
    LEAD_TIERS tiers of LEAD_NS ns (_lead_wait). POLL_WIDTH: the poll's width, at least a
    value a thread (_row_slots)."""
    if LEAD > 0:
        if gl.program_id(0) < LEAD:
            _lead_wait(gl.program_id(0), LEAD, LEAD_TIERS, LEAD_NS)
            return
    PIECES: gl.constexpr = CHUNK // PIECE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, PIECE, layout=layout)
    ticket = _pid_ticket(next_ptr, ticket_index, n_chunks, CLEAR, LEAD)
    outer, inner, start, limit, slots = _position(
        ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
    )  # fmt: skip
    if STRIDE > 0:  # chunk k's first piece is the row's k-th
        start = start // CHUNK * PIECE
    x_row = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, start, VEC)
    # every piece's copy in flight at once, one commit group each
    smem = gl.allocate_shared_memory(
        x_ptr.dtype.element_ty, [PIECES, PIECE], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )  # fmt: skip
    for p in gl.static_range(PIECES):
        _copy_in(smem, x_row, offs, limit, p, PIECE, EVEN, STRIDE)
        cp.commit_group()
    partial = _forward_partial(smem, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2, EVEN)
    packed, slot_ok, gone, counted, first, left = _publish_and_wait(
        ws_ptr, ticket, partial, slots, ticket_index, n_chunks, POLL_WIDTH, SLEEP_NS, WARPS,
        LEAVE_POLLS,
    )  # fmt: skip
    row_max, inv_sum = _row_stats(packed, slot_ok)
    if gone == 0:
        _forward_write(y_ptr, smem, row_max, inv_sum, outer, inner, start, y_vstride_outer,
                       y_vstride_inner, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2, EVEN,
                       STRIDE)  # fmt: skip
    # the row's last publisher writes the chunks that programs left (_row_slots)
    if _last_with_leavers(counted, first, n_chunks):
        _forward_write_left(x_ptr, y_ptr, left, ticket, n_chunks, n_vecs, outer, inner,
                            x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
                            row_max, inv_sum, CHUNK, VEC, WARPS, EXP2, STRIDE)  # fmt: skip


@gluon.jit
def softmax_smem_backward_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr, next_ptr,
    rows_inner, n_vecs, n_chunks, ticket_index,
    y_vstride_outer, y_vstride_inner, dy_vstride_outer, dy_vstride_inner,
    dx_vstride_outer, dx_vstride_inner,
    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
    POLL_WIDTH: gl.constexpr, SLEEP_NS: gl.constexpr, LEAVE_POLLS: gl.constexpr,
    CLEAR: gl.constexpr,
):  # fmt: skip
    """dx = y·(dy - Σ y·dy) with y and dy's chunks held in shared memory, as the forward, with
    masks always (unmasked, ptxas spills: docs/kernels/softmax.md, "Long rows: smem")."""
    PIECES: gl.constexpr = CHUNK // PIECE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    offs = gl.arange(0, PIECE, layout=layout)
    ticket = _pid_ticket(next_ptr, ticket_index, n_chunks, CLEAR)
    outer, inner, start, limit, slots = _position(
        ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
    )  # fmt: skip
    y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
    dy_row = _chunk_start(dy_ptr, outer, inner, dy_vstride_outer, dy_vstride_inner, start, VEC)
    y_smem = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [PIECES, PIECE], smem_layout)
    dy_smem = gl.allocate_shared_memory(dy_ptr.dtype.element_ty, [PIECES, PIECE], smem_layout)
    for p in gl.static_range(PIECES):
        _copy_in(y_smem, y_row, offs, limit, p, PIECE, False)
        _copy_in(dy_smem, dy_row, offs, limit, p, PIECE, False)
        cp.commit_group()
    partial = _backward_partial(y_smem, dy_smem, PIECES, PIECE, VEC, WARPS)
    packed, slot_ok, gone, counted, first, left = _publish_and_wait(
        ws_ptr, ticket, partial, slots, ticket_index, n_chunks, POLL_WIDTH, SLEEP_NS, WARPS,
        LEAVE_POLLS,
    )  # fmt: skip
    row_dot = _row_dot(packed, slot_ok)
    if gone == 0:
        _backward_write(dx_ptr, y_smem, dy_smem, row_dot, outer, inner, start,
                        dx_vstride_outer, dx_vstride_inner, offs, limit, PIECES, PIECE, VEC,
                        WARPS)  # fmt: skip
    # the row's last publisher writes the chunks that programs left, as the forward
    if _last_with_leavers(counted, first, n_chunks):
        flags = _row_left_flags(left, ticket, n_chunks)
        row_limit = n_vecs.to(gl.int64) * VEC
        y_row0 = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, 0, VEC)
        dy_row0 = _chunk_start(dy_ptr, outer, inner, dy_vstride_outer, dy_vstride_inner, 0, VEC)
        dx_row0 = _chunk_start(dx_ptr, outer, inner, dx_vstride_outer, dx_vstride_inner, 0, VEC)
        for j in range(n_chunks):
            if gl.load(flags + j, volatile=True) == 1:
                _backward_write_from_global(y_row0 + j * CHUNK, dy_row0 + j * CHUNK,
                                            dx_row0 + j * CHUNK, row_limit - j * CHUNK,
                                            row_dot, CHUNK, VEC, WARPS)  # fmt: skip


def workspace_words(n_slots: int, n_chunks: int) -> int:
    """Words of a launch's workspace: a slot a chunk, the ticket counter's word, a count word a
    row and a left flag a chunk (_leave_words)."""
    return 2 * n_slots + n_slots // n_chunks + 1


def launch(launcher, backward: bool, tensors, ws, next_ws, rows: tuple[int, int], strides,
           chunk: int, warps: int, *, exp2: int = 0, even: bool = False, lead: int = 0,
           maxnreg: int = 0, leave_polls: int = LEAVE_POLLS) -> Step:  # fmt: skip
    """Launch the forward (tensors x, y) or the backward (y, dy, dx) over rows
    (rows_outer, rows_inner) with strides[i] = (outer, inner, 1) for tensors[i], in elements,
    all multiples of 16 bytes (dispatch._smem_fits), in chunks of `chunk` columns on `warps`
    warps. ws is zeroed, of workspace_words; the kernel zeroes next_ws (None: nothing to zero)
    for the next launch. launcher: kernels._common.direct or a wrapper.

    The forward's knobs: exp2 (tile._exp_shifted's forms 1 and 2); even: no masks, and a row's
    chunks interleaved, where rows are whole chunks (otherwise ignored); lead: that many lead
    programs ahead of the chunks' (_lead_wait). maxnreg: a ptxas register cap. leave_polls:
    polls before a waiting program leaves its chunk (-1: never, for tests). Returns the launch
    as a kernels._launch.Step over (*tensors, ws, next_ws), for a plan to launch again."""
    rows_outer, rows_inner = rows
    n_cols = tensors[0].shape[-1]
    n_chunks = triton.cdiv(n_cols, chunk)
    n_slots = rows_outer * rows_inner * n_chunks
    vec = 16 // tensors[0].element_size()
    piece = vec * 32 * warps
    if chunk % piece:
        raise ValueError(f"a chunk of {chunk} columns is not a whole number of {piece}-wide pieces")
    if leave_polls == 0 or leave_polls < -1:
        raise ValueError(f"leave_polls is at least 1 (or -1: never), got {leave_polls}")
    vstrides = [s // vec for outer, inner, _ in strides for s in (outer, inner)]
    for buffer in (ws, next_ws):
        if buffer is not None and buffer.numel() < workspace_words(n_slots, n_chunks):
            raise ValueError(f"a workspace of {buffer.numel()} words is short of the "
                             f"{workspace_words(n_slots, n_chunks)} this launch takes")
    max_chunks = triton.next_power_of_2(n_chunks)
    # POLL_WIDTH: a slot a thread at most, one count across warps (_row_slots)
    meta = dict(CHUNK=chunk, PIECE=piece, VEC=vec, WARPS=warps,
                POLL_WIDTH=max(max_chunks, 32 * warps), SLEEP_NS=SLEEP_NS,
                LEAVE_POLLS=leave_polls, CLEAR=next_ws is not None, num_warps=warps)  # fmt: skip
    if maxnreg:
        meta["maxnreg"] = maxnreg
    if backward:
        if exp2 or even or lead:
            raise ValueError("exp2, even and lead are knobs of the forward")
        kernel = softmax_smem_backward_kernel
    else:
        kernel = softmax_smem_forward_kernel
        even = even and n_cols % chunk == 0
        meta.update(EXP2=exp2, EVEN=even, STRIDE=piece * n_chunks if even else 0, LEAD=lead,
                    LEAD_TIERS=LEAD_PER_SM, LEAD_NS=LEAD_NS)  # fmt: skip
    step = Step(launcher(kernel), (n_slots + lead,),
                (rows_inner, n_cols // vec, n_chunks, n_slots, *vstrides), meta)  # fmt: skip
    step(*tensors, ws, next_ws)
    return step
