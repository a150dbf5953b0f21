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

The forward's pick (round 20, Config.by_pid) takes the program id as the ticket, no atomic at
the start. Nothing then promises that a row's other programs run while one waits, so a program
that has polled its row LEAVE_POLLS times leaves its chunk: it sets a flag and counts itself in
the row's count word, and the row's last publisher (the program whose count brings the row's
partials to all) writes the left chunks from global memory (_row_slots, _leave). The
backward's pick (round 21) takes the same protocol on its one-shot kernel.

Gluon is Triton's lower-level language (triton.experimental.gluon): the interpreter does not run
it, so these kernels are GPU-only, as the coop design is; the CPU path keeps split2.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

from kernels._coop import _nanosleep, _pack, _unpack

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
# chunks by program id: what a program that leaves its chunk adds to its row's count word (the
# low bits count the published partials, at most MAX_SPLIT_CHUNKS)
LEFT_UNIT: gl.constexpr = gl.constexpr(65536)


@gluon.jit
def _take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR: gl.constexpr):
    """The next (row, chunk) in start order: ticket = row * n_chunks + chunk, and its slot is
    ws_ptr + ticket (ticket_index, the counter's word, is the number of slots). With CLEAR,
    also zeroes the ticket's words of the next launch's workspace (its slot; the counter for
    ticket 0). A persistent program's last ticket is past the slots: it clears nothing."""
    # Tickets are handed out in the order programs ask: a row's chunks are taken together, and
    # every chunk a program waits for has been taken or can be (the coop deadlock argument).
    ticket = gl.atomic_add(ws_ptr + ticket_index, 1).to(gl.int32)
    if CLEAR:
        gl.store(next_ptr + ticket, 0, mask=ticket < ticket_index)
        gl.store(next_ptr + ticket_index, 0, mask=ticket == 0)
    return ticket


@gluon.jit
def _pid_ticket(next_ptr, ticket_index, n_chunks, CLEAR: gl.constexpr,
                TRANSPOSE: gl.constexpr = False, LEAVE: gl.constexpr = False,
                LEAD: gl.constexpr = 0):  # fmt: skip
    """The program id as the ticket (Config.by_pid): no atomic at the program's start. Clears
    what _take_ticket clears, and with LEAVE the leave words (_leave_words; a workspace of
    workspace_words(..., by_pid=True)). A program then waits for
    chunks it did not see taken, so the wait is _row_slots' with LEAVE_POLLS, which never needs
    another program to run. TRANSPOSE (tests only): program ids go down the rows' first chunks
    first, so that the programs the GPU starts first all wait for chunks it starts last. LEAD:
    the grid's first LEAD programs hold no chunk (_lead_wait), so the ticket is the program id
    less LEAD."""
    ticket = gl.program_id(0) - LEAD
    if TRANSPOSE:
        rows = ticket_index // n_chunks
        ticket = (ticket % rows) * n_chunks + ticket // rows
    if CLEAR:
        _clear_pid_words(next_ptr, ticket, ticket_index, n_chunks, LEAVE)
    return ticket


@gluon.jit
def _clear_pid_words(next_ptr, ticket, ticket_index, n_chunks, LEAVE: gl.constexpr):
    """Zero a ticket's words of the next launch's workspace: its slot, the ticket counter for
    ticket 0, and with LEAVE its leave words (_leave_words: the row's count by its first
    chunk, the chunk's flag)."""
    gl.store(next_ptr + ticket, 0)
    gl.store(next_ptr + ticket_index, 0, mask=ticket == 0)
    if LEAVE:
        count, left = _leave_words(next_ptr, ticket, ticket_index, n_chunks)
        gl.store(count, 0, mask=ticket % n_chunks == 0)
        gl.store(left, 0)


@gluon.jit
def _leave_words(ws_ptr, ticket, ticket_index, n_chunks):
    """Chunks by program id: (the row's count word, the chunk's left flag) in the workspace
    past the slots and the ticket counter (kernels.softmax._launch_smem sizes it). The count
    is the row's published partials plus LEFT_UNIT for each program that left its chunk."""
    n_rows = ticket_index // n_chunks
    count = ws_ptr + ticket_index + 1 + ticket // n_chunks
    return count, ws_ptr + ticket_index + 1 + n_rows + ticket


@gluon.jit
def _lead_wait(pid, LEAD: gl.constexpr, TIERS: gl.constexpr, LEAD_NS: gl.constexpr):
    """A lead program's life (Config.lead): hold its slot, and so its SM's shared memory, for
    LEAD_NS ns times its tier (1 to TIERS, the first LEAD // TIERS programs the first), timed
    by %globaltimer, so that the first wave's chunk programs start fewer at a time and in
    turn, not all loading at once and all computing at once."""
    start = _globaltimer(pid)
    until = start + LEAD_NS * (1 + pid * TIERS // LEAD)
    now = start
    while now < until:
        now = _globaltimer(_nanosleep(pid, 200))


@gluon.jit
def _lead_program(x_ptr, ws_ptr, ticket_index, rows_inner, n_vecs, n_chunks, x_vstride_outer,
                  x_vstride_inner, CHUNK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
                  LEAD: gl.constexpr, LEAD_TIERS: gl.constexpr, LEAD_NS: gl.constexpr,
                  TAIL_PF: gl.constexpr):  # fmt: skip
    """What a lead program (a program id below LEAD; Config.lead) does in place of a chunk: the
    first TAIL_PF prefetch the grid's last TAIL_PF chunks into L2 (_prefetch_tail), then each
    holds its slot for its tier (_lead_wait). The forward kernel and its stamped twin
    (experiments.probe_softmax_phases) return after it."""
    if TAIL_PF > 0:
        if gl.program_id(0) < TAIL_PF:
            _prefetch_tail(x_ptr, ws_ptr, ticket_index - TAIL_PF + gl.program_id(0), rows_inner,
                           n_vecs, n_chunks, x_vstride_outer, x_vstride_inner, CHUNK, VEC,
                           WARPS)  # fmt: skip
    _lead_wait(gl.program_id(0), LEAD, LEAD_TIERS, LEAD_NS)


@gluon.jit(noinline=True)
def _prefetch_tail(x_ptr, ws_ptr, ticket, rows_inner, n_vecs, n_chunks, x_vstride_outer,
                   x_vstride_inner, CHUNK: gl.constexpr, VEC: gl.constexpr,
                   WARPS: gl.constexpr):  # fmt: skip
    """Prefetch the ticket's chunk into L2 with the evict_last priority, a 128-byte line a
    thread at a time (Config.tail_pf), so that the launch's last programs find their chunks in
    L2 (a probe knob: level on the H200 in round 27, where such chunks still took 5.5 us to
    land). Not inlined: its registers stay out of the chunk programs' allocation."""
    outer, inner, start, limit, _, _ = _position(ws_ptr, ticket, rows_inner, n_vecs, n_chunks,
                                                 CHUNK, VEC)  # fmt: skip
    row_ptr = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, start, VEC)
    LINE: gl.constexpr = 128 * 8 // x_ptr.dtype.element_ty.primitive_bitwidth  # values a line
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    # lines past the row's end (a ragged last chunk) take its last value's line instead
    offs = gl.minimum(gl.arange(0, CHUNK // LINE, layout=layout) * LINE, limit - 1)
    gl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                              [row_ptr + offs], dtype=gl.int32, is_pure=False, pack=1)


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
    """(outer row, inner row, first column, columns left from it, the row's slots, row) of a
    ticket's chunk."""
    row = ticket // n_chunks
    outer = (row // rows_inner).to(gl.int64)
    inner = (row % rows_inner).to(gl.int64)
    start = (ticket % n_chunks).to(gl.int64) * CHUNK
    limit = n_vecs.to(gl.int64) * VEC - start
    return outer, inner, start, limit, ws_ptr + row.to(gl.int64) * n_chunks, row


@gluon.jit
def _exp_shifted(x, shift, EXP2: gl.constexpr, POLY: gl.constexpr = False):
    """exp(x - shift) as exp2: 2 folds the subtraction into one FMA (kernels.softmax.Config).
    POLY: the exp2 on the FMA pipe (_exp2_poly), not the MUFU's ex2."""
    if EXP2 == 2:
        t = x * LOG2E - shift * LOG2E
    else:
        t = (x - shift) * LOG2E
    if POLY:
        return _exp2_poly(t)
    else:
        return gl.exp2(t)


@gluon.jit
def _widen(v, WIDEN: gl.constexpr):
    """v as fp32. WIDEN (bf16 only, Config.widen): each pair of values in a 32-bit word
    widened by integer ops, the low one shifted up 16 bits and the high one masked, one
    instruction a value; ptxas gives `cvt.f32.bf16` of a high half two (PRMT, SHF). Exact
    either way: the bits are the same."""
    if WIDEN:
        return gl.inline_asm_elementwise(
            "shl.b32 $0, $2, 16;\n\tand.b32 $1, $2, 0xFFFF0000;", "=r,=r,r", [v],
            dtype=gl.float32, is_pure=True, pack=2,
        )  # fmt: skip
    return v.to(gl.float32)


# 2^f on [-0.5, 0.5] as 1 + f·(C1 + f·(C2 + f·C3)): relative minimax (Lawson's iteration on a
# 20001-point grid), 1.0e-4 at most in fp32 Horner; for 16-bit outputs only (their half ulp:
# 2e-3 in bf16, 5e-4 in fp16)
POLY_C1: gl.constexpr = gl.constexpr(0.6932829022407532)
POLY_C2: gl.constexpr = gl.constexpr(0.24221062660217285)
POLY_C3: gl.constexpr = gl.constexpr(0.05500869080424309)
ROUND_MAGIC: gl.constexpr = gl.constexpr(12582912.0)  # 1.5 * 2^23


@gluon.jit
def _exp2_poly(t):
    """2^t for t <= 0 (softmax's exponents) with FMAs and integer ops, none on the MUFU, which
    the 16-bit forward's two ex2 a value keep about half busy (Config.poly): t = j + f with j
    an integer (t + 1.5·2^23 rounds it into the low bits) and |f| <= 1/2, 2^f a cubic, 2^j
    added to its exponent bits. 0 at t <= -126 (as ex2.approx.ftz flushes 2^-126 and below);
    NaN stays NaN (an all -inf row, as torch gives)."""
    t = gl.maximum(t, -126.0, propagate_nan=tl.PropagateNan.ALL)
    r = t + ROUND_MAGIC
    f = t - (r - ROUND_MAGIC)
    p = (f * (f * (f * POLY_C3 + POLY_C2) + POLY_C1) + 1.0).to(gl.int32, bitcast=True)
    # r's bits are 0x4B400000 + j: shifted by 23, only j << 23 is left
    e = (p + (r.to(gl.int32, bitcast=True) << 23)).to(gl.float32, bitcast=True)
    return gl.where(t <= -126.0, 0.0, e)


@gluon.jit
def _row_slots(slots, n_chunks, MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr,
               WARPS: gl.constexpr, LEAVE_POLLS: gl.constexpr = -1, count=None,
               left=None):  # fmt: skip
    """(the row's packed partials, which are the row's, gone) once all are published (0 marks
    an unpublished slot), or once this program has left its chunk (gone = 1).

    LEAVE_POLLS > 0 (chunks by program id, Config.by_pid): after LEAVE_POLLS polls with slots
    still unpublished, the program sets its chunk's `left` flag and adds LEFT_UNIT to the row's
    `count` (one atomic, after the flag). If the row's partials were not all counted before
    that atomic, the program leaves (gone): the row's last publisher, whose count atomic comes
    later and sees the flag, writes the chunk from global memory (softmax_smem_forward_kernel).
    Otherwise it waits on. So a program never waits on one that has not started: the GPU need
    not start programs in id order. -1: never (the ticketed kernels, whose chunks are all taken
    before anyone waits).

    With LEAVE_POLLS > 0, MAX_CHUNKS must be at least the program's threads: the slots are then
    spread over every warp and the count of missing ones is a reduction across warps, which
    every warp reads alike, so all take each poll, and the leave, together (_leave's barrier
    must meet the others' own). Narrower, each warp holds every slot and reduces alone: warps
    then disagree on the poll at which the row completes (they load at different moments),
    which is harmless without barriers in the loop (the ticketed kernels) and was round 19's
    and round 20's first wrong rows with them (a warp's barrier met another's elsewhere)."""
    gl.static_assert(LEAVE_POLLS <= 0 or MAX_CHUNKS >= 32 * WARPS,
                     "leaving needs the poll spread over every warp")  # fmt: skip
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    k = gl.arange(0, MAX_CHUNKS, layout=layout)
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
def _publish_counted(ws_ptr, ticket, partial, ticket_index, n_chunks, WARPS: gl.constexpr):
    """Chunks by program id: publish the chunk's partial in its slot, then count it in the
    row's count word; (the first thread's old count, the first thread's mask, the row's count
    word, the chunk's left flag) for _row_slots and _last_with_leavers. Published, then
    counted: the program whose count brings the row to n_chunks is its last publisher. Relaxed
    (no fence: an acquire would hold the first warp's next loads for the atomic's round trip):
    no program reads a slot through the count, every wait polls the slots themselves. Only the
    first thread keeps the old count (no broadcast)."""
    count, left = _leave_words(ws_ptr, ticket, ticket_index, n_chunks)
    zero, first = _first_thread(WARPS)
    gl.atomic_xchg(ws_ptr + ticket + zero, partial + zero, mask=first, sem="relaxed")
    counted = gl.atomic_add(count + zero, zero.to(gl.int64) + 1, mask=first, sem="relaxed")
    return counted, first, count, left


@gluon.jit
def _last_with_leavers(counted, first, n_chunks):
    """Whether this program is its row's last publisher (its count atomic, _publish_counted,
    brought the row's partials to n_chunks) and some program left its chunk before that
    (_row_slots): then it writes the left chunks (the kernels' leaver loops)."""
    old = gl.max(gl.where(first, counted, 0), axis=0)
    return (old % LEFT_UNIT == n_chunks - 1) & (old >= LEFT_UNIT)


@gluon.jit
def _publish_and_wait(ws_ptr, ticket, partial, slots, ticket_index, n_chunks,
                      MAX_CHUNKS: gl.constexpr, POLL_WIDTH: gl.constexpr,
                      SLEEP_NS: gl.constexpr, WARPS: gl.constexpr, BY_PID: gl.constexpr,
                      LEAVE_POLLS: gl.constexpr):  # fmt: skip
    """Publish the chunk's partial and wait for its row's (_row_slots): (packed partials,
    which are the row's, gone, then for BY_PID the first thread's old count, its mask and the
    chunk's left flag for _last_with_leavers and _row_left_flags; without BY_PID those three
    are unused zeros)."""
    if BY_PID:
        counted, first, count, left = _publish_counted(ws_ptr, ticket, partial, ticket_index,
                                                       n_chunks, WARPS)  # fmt: skip
        packed, slot_ok, gone = _row_slots(slots, n_chunks, POLL_WIDTH, SLEEP_NS, WARPS,
                                           LEAVE_POLLS, count, left)  # fmt: skip
        return packed, slot_ok, gone, counted, first, left
    else:
        gl.atomic_xchg(ws_ptr + ticket, partial, sem="relaxed")
        packed, slot_ok, gone = _row_slots(slots, n_chunks, MAX_CHUNKS, SLEEP_NS, WARPS)
        return packed, slot_ok, gone, gone, gone, gone


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
    inline PTX, as Gluon's barrier is named differently in Triton 3.6 and 3.8. FENCE: each
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
def _write_from_global(x_chunk, y_chunk, limit, row_max, inv_sum, CHUNK: gl.constexpr,
                       VEC: gl.constexpr, WARPS: gl.constexpr, EXP2: gl.constexpr,
                       POLICY: gl.constexpr, GROUP: gl.constexpr = 1,
                       STRIDE: gl.constexpr = 0):  # fmt: skip
    """y of a chunk another program left (_row_slots), read from global memory: a cold path,
    a step at a time (not unrolled: few registers), the same arithmetic as _forward_write so
    that the bits match the owner's. A step is GROUP pieces (a piece: 16 bytes a thread), all
    loaded before any is stored (Config.left_group: more of the chunk's loads in flight).
    STRIDE > 0 (Config.interleave; GROUP 1, a whole chunk): its pieces STRIDE columns apart."""
    THREADS: gl.constexpr = 32 * WARPS
    STEP: gl.constexpr = THREADS * VEC * GROUP
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, STEP, layout=layout)
    for p in tl.range(CHUNK // STEP, loop_unroll_factor=1):
        if STRIDE > 0:
            v = gl.load(x_chunk + p * STRIDE + offs).to(gl.float32)
            y = (_exp_shifted(v, row_max, EXP2) * inv_sum).to(y_chunk.dtype.element_ty)
            gl.store(y_chunk + p * STRIDE + offs, y, eviction_policy=POLICY)
        else:
            ok = p * STEP + offs < limit
            v = gl.load(x_chunk + p * STEP + offs, mask=ok, other=0.0).to(gl.float32)
            y = (_exp_shifted(v, row_max, EXP2) * inv_sum).to(y_chunk.dtype.element_ty)
            gl.store(y_chunk + p * STEP + offs, y, mask=ok, eviction_policy=POLICY)


@gluon.jit
def _forward_write_left(x_ptr, y_ptr, left, ticket, n_chunks, n_vecs, outer, inner,
                        x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
                        row_max, inv_sum, CHUNK: gl.constexpr, VEC: gl.constexpr,
                        WARPS: gl.constexpr, EXP2: gl.constexpr,
                        POLICY: gl.constexpr, GROUP: gl.constexpr = 1,
                        STRIDE: gl.constexpr = 0):  # fmt: skip
    """The row's last publisher (ticket; _last_with_leavers) writes every chunk of its row
    whose flag says its program left it (_row_slots), from global memory, GROUP pieces a step
    (_write_from_global). STRIDE > 0 (Config.interleave): chunk j's pieces start at column j x
    a piece, STRIDE apart."""
    flags = _row_left_flags(left, ticket, n_chunks)
    row_limit = n_vecs.to(gl.int64) * VEC
    x_row0 = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, 0, VEC)
    y_row0 = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, 0, VEC)
    # where chunk j starts: its first piece (STRIDE: the row's pieces interleaved by chunk)
    FIRST: gl.constexpr = 32 * WARPS * VEC if STRIDE > 0 else CHUNK
    for j in range(n_chunks):
        if gl.load(flags + j, volatile=True) == 1:
            _write_from_global(x_row0 + j * FIRST, y_row0 + j * FIRST, row_limit - j * CHUNK,
                               row_max, inv_sum, CHUNK, VEC, WARPS, EXP2, POLICY,
                               GROUP, STRIDE)  # fmt: skip


@gluon.jit
def _chunk_start(ptr, outer, inner, vstride_outer, vstride_inner, start, VEC: gl.constexpr):
    """Address of the chunk's first column, row strides in units of VEC elements."""
    return ptr + (outer * vstride_outer + inner * vstride_inner) * VEC + start


@gluon.constexpr_function
def _piece_step(piece, stride):
    """The columns between a chunk's pieces: `stride` where Config.interleave sets one (> 0),
    else the piece's own width."""
    return stride if stride > 0 else piece


@gluon.jit
def _copy_in(smem, row_ptr, offs, limit, p: gl.constexpr, PIECE: gl.constexpr, POLICY: gl.constexpr,
             base=0, EVEN: gl.constexpr = False, STRIDE: gl.constexpr = 0):  # fmt: skip
    """Start copying piece p of the chunk at row_ptr into smem.index(base + p) (cp.async, 16
    bytes a thread; columns past the row's end are filled with 0). EVEN: the row is whole
    chunks, no mask. STRIDE > 0 (with EVEN; Config.interleave): the chunk's pieces lie STRIDE
    columns apart, not PIECE."""
    if EVEN:
        cp.async_copy_global_to_shared(smem.index(base + p),
                                       row_ptr + p * _piece_step(PIECE, STRIDE) + offs,
                                       eviction_policy=POLICY)  # fmt: skip
    else:
        cp.async_copy_global_to_shared(
            smem.index(base + p), row_ptr + p * PIECE + offs, mask=p * PIECE + offs < limit,
            eviction_policy=POLICY,
        )  # fmt: skip


@gluon.jit
def _copy_in_whole(flat, row_ptr, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                   VEC: gl.constexpr, WARPS: gl.constexpr, POLICY: gl.constexpr,
                   EVEN: gl.constexpr):  # fmt: skip
    """Start copying the whole chunk at row_ptr into `flat` (PIECES * PIECE values) as one
    copy: the piece layout wraps over the chunk, so each thread copies the 16 bytes of every
    piece that _copy_in's piece p would give it (a thread still reads only what it copied),
    without a copy a piece (Config.one_copy)."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, PIECES * PIECE, layout=layout)
    if EVEN:
        cp.async_copy_global_to_shared(flat, row_ptr + offs, eviction_policy=POLICY)
    else:
        cp.async_copy_global_to_shared(flat, row_ptr + offs, mask=offs < limit,
                                       eviction_policy=POLICY)  # fmt: skip


# -- the forward's two halves: a chunk's partial (max, sum of exp), and its output ----------------
@gluon.jit
def _forward_partial(smem, base, offs, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                     VEC: gl.constexpr, WARPS: gl.constexpr, EXP2: gl.constexpr,
                     FOLD: gl.constexpr = 0, EVEN: gl.constexpr = False,
                     POLY: gl.constexpr = 0, ONE_COPY: gl.constexpr = False,
                     WIDEN: gl.constexpr = False):  # fmt: skip
    """(max, sum of exp(x - max)) of the chunk whose PIECES copies into smem.index(base + p)
    are the thread's last commit groups, packed for publishing. EVEN: every column is in the
    row (no masks). POLY = 2: the odd pieces' exp2 on the FMA pipe (Config.poly). WIDEN: the
    sum pass's bf16 widened by integer ops (_widen), and its running sum starting from the
    first piece's exp, not from zeros."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    if FOLD == 1:
        return _forward_partial_folded(smem, base, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2)
    if FOLD == 2:
        return _forward_partial_by_thread(smem, base, limit, PIECES, PIECE, VEC, WARPS, EXP2,
                                          EVEN)  # fmt: skip
    # the max, elementwise over the pieces as they land, then across threads once; each thread
    # reads only what its own copies wrote (one layout for both): no barrier
    if ONE_COPY:  # one commit group (_copy_in_whole)
        cp.wait_group(0)
    for p in gl.static_range(PIECES):
        if not ONE_COPY:
            cp.wait_group(PIECES - 1 - p)
        v = smem.index(base + p).load(layout).to(gl.float32)
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
    if POLY == 2:  # the odd pieces' exp2 on the FMA pipe (_exp2_poly)
        for p in gl.static_range(PIECES):
            sum_vec += _partial_piece_exp(smem, base, p, shift, offs, limit, PIECE, layout, EXP2,
                                          EVEN, p % 2 == 1)  # fmt: skip
    else:
        FIRST: gl.constexpr = 1 if WIDEN else 0  # WIDEN: the sum starts from piece 0's exp
        if WIDEN:
            sum_vec = _partial_piece_exp(smem, base, 0, shift, offs, limit, PIECE, layout, EXP2,
                                         EVEN, False, True)  # fmt: skip
        for p in range(FIRST, PIECES):
            sum_vec += _partial_piece_exp(smem, base, p, shift, offs, limit, PIECE, layout, EXP2,
                                          EVEN, False, WIDEN)  # fmt: skip
    # the max is never the bits 0 unless the sum is at least 1: a published slot is never 0
    return _pack(run_max, gl.sum(sum_vec, axis=0))


@gluon.jit
def _partial_piece_exp(smem, base, p, shift, offs, limit, PIECE: gl.constexpr,
                       layout: gl.constexpr, EXP2: gl.constexpr, EVEN: gl.constexpr,
                       POLY: gl.constexpr = False, WIDEN: gl.constexpr = False):  # fmt: skip
    """exp(x - shift) of piece p of _forward_partial's sum pass (0 past the row's end)."""
    v = _widen(smem.index(base + p).load(layout), WIDEN)
    if EVEN:
        return _exp_shifted(v, shift, EXP2, POLY)
    else:
        return gl.where(p * PIECE + offs < limit, _exp_shifted(v, shift, EXP2, POLY), 0.0)


@gluon.jit
def _forward_partial_folded(smem, base, offs, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                            VEC: gl.constexpr, WARPS: gl.constexpr,
                            EXP2: gl.constexpr):  # fmt: skip
    """_forward_partial in one pass as the pieces land (Config.fold): each piece's max, taken
    across the program, raises the shift, and the running sum of exp is rescaled to it, so the
    partial is ready when the last piece lands instead of after a second pass over the chunk."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    for p in gl.static_range(PIECES):
        cp.wait_group(PIECES - 1 - p)
        # columns past the row's end (copied in as 0) count as -inf: exp gives 0
        v = gl.where(p * PIECE + offs < limit, smem.index(base + p).load(layout).to(gl.float32),
                     -float("inf"))  # fmt: skip
        piece_max = gl.max(v, axis=0)
        if p == 0:
            run_max = piece_max  # nothing before the first piece
        new_max = gl.maximum(run_max, piece_max)
        # until a finite value is seen the shift is 0: exp(-inf - 0) = 0 keeps the sum at 0
        shift = gl.where(new_max == -float("inf"), 0.0, new_max)
        e = _exp_shifted(v, shift, EXP2)
        if p == 0:
            sum_vec = e
        else:
            # the old shift is at most the new one (no overflow); a sum still 0 stays 0
            scale = gl.where(run_max == -float("inf"), 0.0, gl.exp2((run_max - shift) * LOG2E))
            sum_vec = sum_vec * scale + e
        run_max = new_max
    # as _forward_partial: a published slot is never 0 (a max of 0.0 has a sum of at least 1)
    return _pack(run_max, gl.sum(sum_vec, axis=0))


@gluon.jit
def _forward_partial_by_thread(smem, base, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                               VEC: gl.constexpr, WARPS: gl.constexpr, EXP2: gl.constexpr,
                               EVEN: gl.constexpr = False):  # fmt: skip
    """_forward_partial in one pass as the pieces land, each thread folding its own VEC values
    a piece into its own running (max, sum of exp): no cross-thread step until the end, one
    exp a value and one more a thread a piece (Config.fold = 2). A piece is read as (threads,
    VEC), thread t holding row t: the addresses its own copies wrote, as the 1-D layout.
    EVEN: every column is in the row (no masks)."""
    THREADS: gl.constexpr = 32 * WARPS
    gl.static_assert(PIECE == THREADS * VEC, "a piece is one 16-byte copy a thread")
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32, 1], [WARPS, 1], [1, 0])
    # a thread's VEC values are all in the row or all past it (rows end on a 16-byte boundary)
    first = gl.arange(0, THREADS, layout=gl.SliceLayout(1, layout)) * VEC
    run_max = gl.full([THREADS], -float("inf"), gl.float32, gl.SliceLayout(1, layout))
    run_sum = gl.zeros([THREADS], gl.float32, gl.SliceLayout(1, layout))
    for p in gl.static_range(PIECES):
        cp.wait_group(PIECES - 1 - p)
        v = smem.index(base + p).reshape([THREADS, VEC]).load(layout).to(gl.float32)
        if EVEN:
            new_max = gl.maximum(run_max, gl.max(v, axis=1))
        else:
            ok = p * PIECE + first < limit
            new_max = gl.maximum(run_max, gl.where(ok, gl.max(v, axis=1), -float("inf")))
        # until a thread sees a finite value its shift is 0: exp(-inf - 0) = 0 keeps its sum 0
        shift = gl.where(new_max == -float("inf"), 0.0, new_max)
        piece_sum = gl.sum(_exp_shifted(v, shift[:, None], EXP2), axis=1)
        if not EVEN:
            piece_sum = gl.where(ok, piece_sum, 0.0)
        # the old shift is at most the new one (no overflow); a sum still 0 stays 0
        scale = gl.where(run_max == -float("inf"), 0.0, gl.exp2((run_max - shift) * LOG2E))
        run_sum = run_sum * scale + piece_sum
        run_max = new_max
    chunk_max = gl.max(run_max, axis=0)
    chunk_shift = gl.where(chunk_max == -float("inf"), 0.0, chunk_max)
    scaled = gl.where(run_max == -float("inf"), 0.0,
                      run_sum * gl.exp2((run_max - chunk_shift) * LOG2E))  # fmt: skip
    # as _forward_partial: a published slot is never 0 (a max of 0.0 has a sum of at least 1)
    return _pack(chunk_max, gl.sum(scaled, axis=0))


@gluon.jit
def _forward_finish(y_ptr, smem, base, slots, n_chunks, outer, inner, start, y_vstride_outer,
                    y_vstride_inner, offs, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                    VEC: gl.constexpr, WARPS: gl.constexpr, MAX_CHUNKS: gl.constexpr,
                    SLEEP_NS: gl.constexpr, EXP2: gl.constexpr,
                    POLICY: gl.constexpr):  # fmt: skip
    """Wait for the row's slots, then write y from the chunk held in smem.index(base + p)."""
    packed, slot_ok, _ = _row_slots(slots, n_chunks, MAX_CHUNKS, SLEEP_NS, WARPS)
    row_max, inv_sum = _row_stats(packed, slot_ok)
    _forward_write(y_ptr, smem, base, row_max, inv_sum, outer, inner, start, y_vstride_outer,
                   y_vstride_inner, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2, POLICY)
    return row_max, inv_sum


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
def _forward_write(y_ptr, smem, base, row_max, inv_sum, outer, inner, start, y_vstride_outer,
                   y_vstride_inner, offs, limit, PIECES: gl.constexpr, PIECE: gl.constexpr,
                   VEC: gl.constexpr, WARPS: gl.constexpr, EXP2: gl.constexpr,
                   POLICY: gl.constexpr, EVEN: gl.constexpr = False,
                   POLY: gl.constexpr = 0, WIDEN: gl.constexpr = False,
                   STRIDE: gl.constexpr = 0):  # fmt: skip
    """Write y from the chunk held in smem.index(base + p), given the row's (max, 1 / sum)
    (_row_stats). POLY > 0: the odd pieces' exp2 on the FMA pipe (_exp2_poly). WIDEN: bf16
    widened by integer ops (_widen). STRIDE: as _copy_in's."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
    if POLY > 0:
        for p in gl.static_range(PIECES):
            _forward_write_piece(y_row, smem, base, p, row_max, inv_sum, offs, limit, PIECE,
                                 layout, EXP2, POLICY, EVEN, p % 2 == 1)  # fmt: skip
    else:
        for p in range(PIECES):
            _forward_write_piece(y_row, smem, base, p, row_max, inv_sum, offs, limit, PIECE,
                                 layout, EXP2, POLICY, EVEN, False, WIDEN, STRIDE)  # fmt: skip


@gluon.jit
def _forward_write_piece(y_row, smem, base, p, row_max, inv_sum, offs, limit,
                         PIECE: gl.constexpr, layout: gl.constexpr, EXP2: gl.constexpr,
                         POLICY: gl.constexpr, EVEN: gl.constexpr,
                         POLY: gl.constexpr = False, WIDEN: gl.constexpr = False,
                         STRIDE: gl.constexpr = 0):  # fmt: skip
    """Piece p of _forward_write."""
    e = _exp_shifted(_widen(smem.index(base + p).load(layout), WIDEN), row_max, EXP2, POLY)
    _store_piece(y_row, p, (e * inv_sum).to(y_row.dtype.element_ty), offs, limit, PIECE, POLICY,
                 EVEN, STRIDE)  # fmt: skip


@gluon.jit
def _store_piece(row, p, value, offs, limit, PIECE: gl.constexpr, POLICY: gl.constexpr,
                 EVEN: gl.constexpr, STRIDE: gl.constexpr = 0):  # fmt: skip
    """Store piece p of a chunk's output from its first column `row` (no mask where EVEN: the
    row is whole chunks; STRIDE > 0, with EVEN: pieces STRIDE columns apart, as _copy_in)."""
    if EVEN:
        gl.store(row + p * _piece_step(PIECE, STRIDE) + offs, value, eviction_policy=POLICY)
    else:
        gl.store(row + p * PIECE + offs, value, mask=p * PIECE + offs < limit,
                 eviction_policy=POLICY)  # fmt: skip


# -- the forward's register-held pieces (Config.regs): the chunk's last REGS pieces ------------
# Held as 32-bit words (a 16-bit row read as pairs), so a value costs half a register in 16-bit.
# After the wait everything the output needs is recomputed from the words plus `zero`, a 0 the
# compilers cannot know (from a kernel argument), so that neither LLVM nor ptxas keeps the
# partial's fp32 values, masks or addresses live across the wait in place of the words.
@gluon.jit
def _held_words(row_ptr, limit, zero, FIRST: gl.constexpr, REGS: gl.constexpr,
                PIECE: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """(pointers, mask) of the chunk's pieces FIRST ... FIRST + REGS - 1 as one (REGS, words a
    piece) tensor of 32-bit words, each thread holding the 16 bytes of every piece that its
    copies would; `zero` (0) places the address arithmetic where it is called."""
    PAIRS: gl.constexpr = row_ptr.dtype.element_ty.primitive_bitwidth == 16
    WORDS: gl.constexpr = PIECE // 2 if PAIRS else PIECE
    layout: gl.constexpr = gl.BlockedLayout([1, 16 // 4], [1, 32], [1, WARPS], [1, 0])
    r = gl.arange(0, REGS, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, WORDS, layout=gl.SliceLayout(0, layout))
    offs = (FIRST + r[:, None]) * WORDS + c[None, :] + zero
    if PAIRS:  # limit is even: rows are whole 16-byte vectors
        return row_ptr.to(gl.pointer_type(gl.int32), bitcast=True) + offs, offs < limit // 2
    else:
        return row_ptr + offs, offs < limit


@gluon.jit
def _held_values(words, dtype: gl.constexpr):
    """The held words as fp32 values: (low halves, high halves) for a 16-bit dtype, else
    (the values, the values)."""
    if dtype.primitive_bitwidth == 16:
        lo = words.to(gl.int16).to(dtype, bitcast=True).to(gl.float32)
        hi = (words >> 16).to(gl.int16).to(dtype, bitcast=True).to(gl.float32)
        return lo, hi
    else:
        return words, words


@gluon.jit
def _held_partial(partial, words, zero, dtype: gl.constexpr, EXP2: gl.constexpr):
    """The smem pieces' packed partial merged with the held values' (max, sum of exp); words
    past the row's end were loaded as -inf, whose exp is 0."""
    PAIRS: gl.constexpr = dtype.primitive_bitwidth == 16
    lo, hi = _held_values(words, dtype)
    held_max = gl.max(gl.max(gl.maximum(lo, hi), axis=1), axis=0)
    smem_max, smem_sum = _unpack(partial)
    new_max = gl.maximum(smem_max, held_max)
    # all -inf so far: shift by 0, so every exp is 0 and the sum stays 0
    shift = gl.where(new_max == -float("inf"), 0.0, new_max)
    if PAIRS:  # the halves again, not kept from the max: the words are all that stays live
        lo, hi = _held_values(words + zero, dtype)
        e = _exp_shifted(lo, shift, EXP2) + _exp_shifted(hi, shift, EXP2)
    else:
        e = _exp_shifted(lo, shift, EXP2)
    held_sum = gl.sum(gl.sum(e, axis=1), axis=0)
    total = smem_sum * gl.exp2((smem_max - shift) * LOG2E) + held_sum
    # as _forward_partial: never the bits 0 (a max of 0.0 has a sum of at least 1)
    return _pack(new_max, total)


@gluon.jit
def _held_store(y_row, words, limit, zero, row_max, inv_sum, dtype: gl.constexpr,
                FIRST: gl.constexpr, REGS: gl.constexpr, PIECE: gl.constexpr,
                WARPS: gl.constexpr, EXP2: gl.constexpr, POLICY: gl.constexpr):  # fmt: skip
    """Write y for the held words once the row's (max, 1 / sum) are known."""
    words = words + zero
    y_words, ok = _held_words(y_row, limit, zero, FIRST, REGS, PIECE, WARPS)
    lo, hi = _held_values(words, dtype)
    out_ty: gl.constexpr = y_row.dtype.element_ty
    y_lo = (_exp_shifted(lo, row_max, EXP2) * inv_sum).to(out_ty)
    if dtype.primitive_bitwidth == 16:
        y_hi = (_exp_shifted(hi, row_max, EXP2) * inv_sum).to(out_ty)
        lo_bits = y_lo.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
        out = lo_bits | (y_hi.to(gl.int16, bitcast=True).to(gl.int32) << 16)
    else:
        out = y_lo
    gl.store(y_words, out, mask=ok, eviction_policy=POLICY)


# -- the backward's two halves: a chunk's Σ y·dy, and its dx -------------------------------------
@gluon.jit
def _backward_partial(y_smem, dy_smem, base, PIECES: gl.constexpr, PIECE: gl.constexpr,
                      VEC: gl.constexpr, WARPS: gl.constexpr):  # fmt: skip
    """Σ y·dy over the chunk (columns past the row's end were filled with 0), elementwise over
    the pieces as they land, then across threads once; packed with 1.0 beside it, so a
    published partial is never 0."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    dot_vec = gl.zeros([PIECE], gl.float32, layout)
    for p in gl.static_range(PIECES):
        cp.wait_group(PIECES - 1 - p)
        y = y_smem.index(base + p).load(layout).to(gl.float32)
        dot_vec += y * dy_smem.index(base + p).load(layout).to(gl.float32)
    dot = gl.sum(dot_vec, axis=0)
    return _pack(dot, dot * 0.0 + 1.0)


@gluon.jit
def _backward_finish(dx_ptr, y_smem, dy_smem, base, slots, n_chunks, outer, inner, start,
                     dx_vstride_outer, dx_vstride_inner, offs, limit, PIECES: gl.constexpr,
                     PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
                     MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr,
                     POLICY: gl.constexpr):  # fmt: skip
    """Wait for the row's slots, then write dx = y·(dy - Σ y·dy) from the chunk held in
    y_smem and dy_smem.index(base + p)."""
    packed, slot_ok, _ = _row_slots(slots, n_chunks, MAX_CHUNKS, SLEEP_NS, WARPS)
    _backward_write(dx_ptr, y_smem, dy_smem, base, _row_dot(packed, slot_ok), outer, inner,
                    start, dx_vstride_outer, dx_vstride_inner, offs, limit, PIECES, PIECE, VEC,
                    WARPS, POLICY)  # fmt: skip


@gluon.jit
def _row_dot(packed, slot_ok):
    """The row's Σ y·dy from its published partials (_backward_partial)."""
    dots, _ = _unpack(packed)
    return gl.sum(gl.where(slot_ok, dots, 0.0), axis=0)


@gluon.jit
def _backward_write(dx_ptr, y_smem, dy_smem, base, row_dot, outer, inner, start,
                    dx_vstride_outer, dx_vstride_inner, offs, limit, PIECES: gl.constexpr,
                    PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
                    POLICY: gl.constexpr, EVEN: gl.constexpr = False):  # fmt: skip
    """Write dx = y·(dy - row_dot) from the chunk held in y_smem and dy_smem.index(base + p).
    EVEN: every column is in the row (no mask)."""
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    dx_row = _chunk_start(dx_ptr, outer, inner, dx_vstride_outer, dx_vstride_inner, start, VEC)
    for p in range(PIECES):
        y = y_smem.index(base + p).load(layout).to(gl.float32)
        dx = (y * (dy_smem.index(base + p).load(layout).to(gl.float32) - row_dot)).to(
            dx_ptr.dtype.element_ty
        )  # fmt: skip
        _store_piece(dx_row, p, dx, offs, limit, PIECE, POLICY, EVEN)


@gluon.jit
def _backward_write_from_global(y_chunk, dy_chunk, dx_chunk, limit, row_dot,
                                CHUNK: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
                                POLICY: gl.constexpr):  # fmt: skip
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
                 mask=ok, eviction_policy=POLICY)  # fmt: skip


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
    MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr, EXP2: gl.constexpr,
    POLICY: gl.constexpr = "", CLEAR: gl.constexpr = True, FOLD: gl.constexpr = 0,
    REGS: gl.constexpr = 0, HELD_PAD: gl.constexpr = 0, BY_PID: gl.constexpr = False,
    LEAVE_POLLS: gl.constexpr = 0, TRANSPOSE: gl.constexpr = False, EVEN: gl.constexpr = False,
    POLL_WIDTH: gl.constexpr = 0, POLY: gl.constexpr = 0, ONE_COPY: gl.constexpr = False,
    LEFT_GROUP: gl.constexpr = 1, WIDEN: gl.constexpr = False, LEAD: gl.constexpr = 0,
    LEAD_TIERS: gl.constexpr = 1, LEAD_NS: gl.constexpr = 0, TAIL_PF: gl.constexpr = 0,
    STRIDE: gl.constexpr = 0,
):  # fmt: skip
    """One program per (row, chunk of CHUNK columns), rows of unit column stride. The
    chunk's last REGS pieces (Config.regs) are held in registers, the rest in shared memory;
    HELD_PAD is the 32-bit word of -inf values they are padded with past the row's end.
    BY_PID (Config.by_pid): the chunk is the program id, and a program that has polled its row
    LEAVE_POLLS times leaves its chunk to the row's last publisher (_row_slots); TRANSPOSE: a
    test of that (_pid_ticket). EVEN: rows are whole chunks (no masks; not with REGS).
    POLL_WIDTH (BY_PID): the poll's width, at least a value a thread (_row_slots). POLY
    (Config.poly, 16-bit outputs): 1 the write's odd pieces' exp2 on the FMA pipe, 2 the sum
    pass's too (_exp2_poly). LEFT_GROUP: the pieces a step of the left chunks' write loads
    (_write_from_global; Config.left_group). WIDEN (Config.widen, bf16): the sum pass and the
    write widen by integer ops (_widen). LEAD (BY_PID; Config.lead): the grid's first LEAD
    programs only hold their slots a while, in LEAD_TIERS tiers of LEAD_NS ns (_lead_wait);
    the first TAIL_PF of them first prefetch the grid's last TAIL_PF chunks into L2 to be kept
    there (_prefetch_tail; Config.tail_pf). STRIDE > 0 (EVEN, BY_PID; Config.interleave): the
    row's chunks interleaved piece by piece, chunk k's piece p at column (p x the row's chunks
    + k) x PIECE, STRIDE = PIECE x the row's chunks (a constexpr: the pieces' offsets are
    immediates), so that a row's programs, which start together, read and write one
    contiguous span a step."""
    if LEAD > 0:
        if gl.program_id(0) < LEAD:
            _lead_program(x_ptr, ws_ptr, ticket_index, rows_inner, n_vecs, n_chunks,
                          x_vstride_outer, x_vstride_inner, CHUNK, VEC, WARPS, LEAD, LEAD_TIERS,
                          LEAD_NS, TAIL_PF)  # fmt: skip
            return
    PIECES: gl.constexpr = CHUNK // PIECE - REGS
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, PIECE, layout=layout)
    if BY_PID:
        ticket = _pid_ticket(next_ptr, ticket_index, n_chunks, CLEAR, TRANSPOSE, True, LEAD)
    else:
        ticket = _take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR)
    outer, inner, start, limit, slots, _ = _position(
        ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
    )  # fmt: skip
    if STRIDE > 0:  # chunk k's first piece is the row's k-th
        start = start // CHUNK * PIECE
    x_row = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, start, VEC)
    # every piece's copy in flight at once, one commit group each (ONE_COPY: one copy of the
    # whole chunk, one group)
    if ONE_COPY:  # copied into as one flat buffer, read as pieces
        flat = gl.allocate_shared_memory(
            x_ptr.dtype.element_ty, [PIECES * PIECE], gl.SwizzledSharedLayout(1, 1, 1, [0])
        )  # fmt: skip
        smem = flat._reinterpret(x_ptr.dtype.element_ty, [PIECES, PIECE],
                                 gl.SwizzledSharedLayout(1, 1, 1, [0]))  # fmt: skip
        _copy_in_whole(flat, x_row, limit, PIECES, PIECE, VEC, WARPS, POLICY, EVEN)
        cp.commit_group()
    else:
        smem = gl.allocate_shared_memory(
            x_ptr.dtype.element_ty, [PIECES, PIECE], gl.SwizzledSharedLayout(1, 1, 1, [0])
        )  # fmt: skip
        for p in gl.static_range(PIECES):
            _copy_in(smem, x_row, offs, limit, p, PIECE, POLICY, 0, EVEN, STRIDE)
            cp.commit_group()
    if REGS > 0:  # loads in flight beside the copies; first used once the smem pieces are in
        held_ptrs, held_ok = _held_words(x_row, limit, 0, PIECES, REGS, PIECE, WARPS)
        held = gl.load(held_ptrs, mask=held_ok, other=HELD_PAD, eviction_policy=POLICY)
    partial = _forward_partial(smem, 0, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2, FOLD, EVEN,
                               POLY, ONE_COPY, WIDEN)  # fmt: skip
    if REGS > 0:  # n_vecs < 2^31: n_vecs >> 31 is a 0 the compilers cannot know (above)
        partial = _held_partial(partial, held, n_vecs >> 31, x_ptr.dtype.element_ty, EXP2)
    packed, slot_ok, gone, counted, first, left = _publish_and_wait(
        ws_ptr, ticket, partial, slots, ticket_index, n_chunks, MAX_CHUNKS, POLL_WIDTH, SLEEP_NS,
        WARPS, BY_PID, LEAVE_POLLS,
    )  # fmt: skip
    row_max, inv_sum = _row_stats(packed, slot_ok)
    if gone == 0:
        _forward_write(y_ptr, smem, 0, row_max, inv_sum, outer, inner, start, y_vstride_outer,
                       y_vstride_inner, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2, POLICY,
                       EVEN, POLY, WIDEN, STRIDE)  # fmt: skip
    if BY_PID:  # the row's last publisher writes the chunks that programs left (_row_slots)
        if _last_with_leavers(counted, first, n_chunks):
            _forward_write_left(x_ptr, y_ptr, left, ticket, n_chunks, n_vecs, outer, inner,
                                x_vstride_outer, x_vstride_inner, y_vstride_outer,
                                y_vstride_inner, row_max, inv_sum, CHUNK, VEC, WARPS, EXP2,
                                POLICY, LEFT_GROUP, STRIDE)  # fmt: skip
    if REGS > 0:
        y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
        _held_store(y_row, held, limit, n_vecs >> 31, row_max, inv_sum, x_ptr.dtype.element_ty,
                    PIECES, REGS, PIECE, WARPS, EXP2, POLICY)  # fmt: skip


@gluon.jit
def softmax_smem_backward_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr, next_ptr,
    rows_inner, n_vecs, n_chunks, ticket_index,
    y_vstride_outer, y_vstride_inner, dy_vstride_outer, dy_vstride_inner,
    dx_vstride_outer, dx_vstride_inner,
    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
    MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr, POLICY: gl.constexpr = "",
    CLEAR: gl.constexpr = True, BY_PID: gl.constexpr = False, LEAVE_POLLS: gl.constexpr = 0,
    TRANSPOSE: gl.constexpr = False, EVEN: gl.constexpr = False, POLL_WIDTH: gl.constexpr = 0,
):  # fmt: skip
    """dx = y·(dy - Σ y·dy) with y and dy's chunks held in shared memory, as the forward;
    BY_PID, LEAVE_POLLS, TRANSPOSE, EVEN and POLL_WIDTH as there (round 21)."""
    PIECES: gl.constexpr = CHUNK // PIECE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    offs = gl.arange(0, PIECE, layout=layout)
    if BY_PID:
        ticket = _pid_ticket(next_ptr, ticket_index, n_chunks, CLEAR, TRANSPOSE, True)
    else:
        ticket = _take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR)
    outer, inner, start, limit, slots, _ = _position(
        ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
    )  # fmt: skip
    y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
    dy_row = _chunk_start(dy_ptr, outer, inner, dy_vstride_outer, dy_vstride_inner, start, VEC)
    y_smem = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [PIECES, PIECE], smem_layout)
    dy_smem = gl.allocate_shared_memory(dy_ptr.dtype.element_ty, [PIECES, PIECE], smem_layout)
    for p in gl.static_range(PIECES):
        _copy_in(y_smem, y_row, offs, limit, p, PIECE, POLICY, 0, EVEN)
        _copy_in(dy_smem, dy_row, offs, limit, p, PIECE, POLICY, 0, EVEN)
        cp.commit_group()
    partial = _backward_partial(y_smem, dy_smem, 0, PIECES, PIECE, VEC, WARPS)
    packed, slot_ok, gone, counted, first, left = _publish_and_wait(
        ws_ptr, ticket, partial, slots, ticket_index, n_chunks, MAX_CHUNKS, POLL_WIDTH, SLEEP_NS,
        WARPS, BY_PID, LEAVE_POLLS,
    )  # fmt: skip
    row_dot = _row_dot(packed, slot_ok)
    if gone == 0:
        _backward_write(dx_ptr, y_smem, dy_smem, 0, row_dot, outer, inner, start,
                        dx_vstride_outer, dx_vstride_inner, offs, limit, PIECES, PIECE, VEC,
                        WARPS, POLICY, EVEN)  # fmt: skip
    if BY_PID:  # the row's last publisher writes the chunks that programs left, as the forward
        if _last_with_leavers(counted, first, n_chunks):
            flags = _row_left_flags(left, ticket, n_chunks)
            row_limit = n_vecs.to(gl.int64) * VEC
            y_row0 = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, 0, VEC)
            dy_row0 = _chunk_start(dy_ptr, outer, inner, dy_vstride_outer, dy_vstride_inner, 0,
                                   VEC)  # fmt: skip
            dx_row0 = _chunk_start(dx_ptr, outer, inner, dx_vstride_outer, dx_vstride_inner, 0,
                                   VEC)  # fmt: skip
            for j in range(n_chunks):
                if gl.load(flags + j, volatile=True) == 1:
                    _backward_write_from_global(y_row0 + j * CHUNK, dy_row0 + j * CHUNK,
                                                dx_row0 + j * CHUNK, row_limit - j * CHUNK,
                                                row_dot, CHUNK, VEC, WARPS, POLICY)  # fmt: skip


@gluon.jit
def _forward_finish_ticket(y_ptr, smem, base, ws_ptr, ticket, offs, rows_inner, n_vecs, n_chunks,
                           y_vstride_outer, y_vstride_inner, CHUNK: gl.constexpr,
                           PIECES: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr,
                           WARPS: gl.constexpr, MAX_CHUNKS: gl.constexpr,
                           SLEEP_NS: gl.constexpr, EXP2: gl.constexpr,
                           POLICY: gl.constexpr):  # fmt: skip
    """_forward_finish for the chunk of a ticket taken earlier."""
    outer, inner, start, limit, slots, _ = _position(
        ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
    )  # fmt: skip
    _forward_finish(y_ptr, smem, base, slots, n_chunks, outer, inner, start, y_vstride_outer,
                    y_vstride_inner, offs, limit, PIECES, PIECE, VEC, WARPS, MAX_CHUNKS,
                    SLEEP_NS, EXP2, POLICY)  # fmt: skip


@gluon.jit
def _backward_finish_ticket(dx_ptr, y_smem, dy_smem, base, ws_ptr, ticket, offs, rows_inner,
                            n_vecs, n_chunks, dx_vstride_outer, dx_vstride_inner,
                            CHUNK: gl.constexpr, PIECES: gl.constexpr, PIECE: gl.constexpr,
                            VEC: gl.constexpr, WARPS: gl.constexpr, MAX_CHUNKS: gl.constexpr,
                            SLEEP_NS: gl.constexpr, POLICY: gl.constexpr):  # fmt: skip
    """_backward_finish for the chunk of a ticket taken earlier."""
    outer, inner, start, limit, slots, _ = _position(
        ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
    )  # fmt: skip
    _backward_finish(dx_ptr, y_smem, dy_smem, base, slots, n_chunks, outer, inner, start,
                     dx_vstride_outer, dx_vstride_inner, offs, limit, PIECES, PIECE, VEC, WARPS,
                     MAX_CHUNKS, SLEEP_NS, POLICY)  # fmt: skip


# Persistent kernels: a grid of about the programs the SMs hold, each taking tickets until they
# run out, with two chunk buffers: a chunk's copies are in flight while the program waits for
# the previous chunk's row and writes it, so no SM idles through a wait with nothing loading.
#
# Deadlock freedom (rows of at most MAX_SPLIT_CHUNKS < number of SMs chunks): a program waits
# for the row of its previous chunk P while its new chunk N may be unpublished, but only if N
# is in a later row than P; where both are in one row, N is published first. Take the first
# row R any program waits for. Its chunks held unpublished by a waiting program would make that
# program wait for an earlier row: none do. Those not yet taken: every taken ticket past them
# would be R's too (tickets go in order), so every running program would hold two of R's chunks
# while waiting for R, more than R has (two a program, a program an SM at least). So R's
# chunks are all taken and published, R completes, and induction on rows does the rest.
@gluon.jit
def softmax_smem_persistent_forward_kernel(
    x_ptr, y_ptr, ws_ptr, next_ptr,
    rows_inner, n_vecs, n_chunks, ticket_index,
    x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
    MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr, EXP2: gl.constexpr,
    POLICY: gl.constexpr = "", CLEAR: gl.constexpr = True, FOLD: gl.constexpr = 0,
    BY_PID: gl.constexpr = False, LEAVE_POLLS: gl.constexpr = 0, EVEN: gl.constexpr = False,
    POLL_WIDTH: gl.constexpr = 0,
):  # fmt: skip
    """softmax_smem_forward_kernel's work, a program taking (row, chunk) tickets in turn.
    BY_PID (round 22): the program's tickets are its id plus multiples of the grid, a multiple
    of n_chunks (_persistent_pid_forward)."""
    PIECES: gl.constexpr = CHUNK // PIECE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    offs = gl.arange(0, PIECE, layout=layout)
    # buffer b is pieces b * PIECES ... b * PIECES + PIECES - 1
    smem = gl.allocate_shared_memory(
        x_ptr.dtype.element_ty, [2 * PIECES, PIECE], gl.SwizzledSharedLayout(1, 1, 1, [0])
    )  # fmt: skip
    if BY_PID:
        _persistent_pid_forward(
            x_ptr, y_ptr, ws_ptr, next_ptr, smem, offs, rows_inner, n_vecs, n_chunks,
            ticket_index, x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
            CHUNK, PIECES, PIECE, VEC, WARPS, POLL_WIDTH, SLEEP_NS, EXP2, POLICY, CLEAR, FOLD,
            LEAVE_POLLS, EVEN,
        )  # fmt: skip
    else:
        ticket = _take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR)
        prev = ticket * 0 - 1  # the chunk held in the other buffer (-1: none)
        buf = ticket * 0
        while ticket < ticket_index:
            outer, inner, start, limit, _, row = _position(
                ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
            )  # fmt: skip
            x_row = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, start,
                                 VEC)  # fmt: skip
            for p in gl.static_range(PIECES):
                _copy_in(smem, x_row, offs, limit, p, PIECE, POLICY, buf * PIECES)
                cp.commit_group()
            other_row = prev >= 0 and prev // n_chunks != row
            if other_row:  # the previous chunk's row, while the copies are in flight
                _forward_finish_ticket(
                    y_ptr, smem, (1 - buf) * PIECES, ws_ptr, prev, offs, rows_inner, n_vecs,
                    n_chunks, y_vstride_outer, y_vstride_inner, CHUNK, PIECES, PIECE, VEC,
                    WARPS, MAX_CHUNKS, SLEEP_NS, EXP2, POLICY,
                )  # fmt: skip
            partial = _forward_partial(smem, buf * PIECES, offs, limit, PIECES, PIECE, VEC,
                                       WARPS, EXP2, FOLD)  # fmt: skip
            gl.atomic_xchg(ws_ptr + ticket, partial, sem="relaxed")
            if prev >= 0 and not other_row:  # one row: published first
                _forward_finish_ticket(
                    y_ptr, smem, (1 - buf) * PIECES, ws_ptr, prev, offs, rows_inner, n_vecs,
                    n_chunks, y_vstride_outer, y_vstride_inner, CHUNK, PIECES, PIECE, VEC,
                    WARPS, MAX_CHUNKS, SLEEP_NS, EXP2, POLICY,
                )  # fmt: skip
            prev = ticket
            buf = 1 - buf
            ticket = _take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR)
        if prev >= 0:
            _forward_finish_ticket(
                    y_ptr, smem, (1 - buf) * PIECES, ws_ptr, prev, offs, rows_inner, n_vecs,
                    n_chunks, y_vstride_outer, y_vstride_inner, CHUNK, PIECES, PIECE, VEC,
                    WARPS, MAX_CHUNKS, SLEEP_NS, EXP2, POLICY,
                )  # fmt: skip


# The persistent forward with chunks by program id (round 22). Program g takes tickets g, g + G,
# g + 2G, ... (G programs, a multiple of n_chunks, so that a row's chunks are all in one round
# and a program's two chunks are never of one row). In each round it starts copying its chunk
# in, then waits for its previous chunk's row and writes that chunk, then takes the new chunk's
# partial and publishes it: the wait for a row comes a round after the row's publishes, with
# the next chunk's copies in flight. Row R of round k waits only on publishes of round k, each
# made after its program finished its round k - 1 chunk: by induction on rounds nothing waits
# forever while all G programs run; where some have not started, the waiters leave their
# chunks after LEAVE_POLLS polls (_row_slots), as in the one-shot kernel, and the row's last
# publisher writes them when it finishes that chunk.
@gluon.jit
def _persistent_pid_forward(x_ptr, y_ptr, ws_ptr, next_ptr, smem, offs, rows_inner, n_vecs,
                            n_chunks, ticket_index, x_vstride_outer, x_vstride_inner,
                            y_vstride_outer, y_vstride_inner, CHUNK: gl.constexpr,
                            PIECES: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr,
                            WARPS: gl.constexpr, POLL_WIDTH: gl.constexpr,
                            SLEEP_NS: gl.constexpr, EXP2: gl.constexpr, POLICY: gl.constexpr,
                            CLEAR: gl.constexpr, FOLD: gl.constexpr,
                            LEAVE_POLLS: gl.constexpr, EVEN: gl.constexpr):  # fmt: skip
    """softmax_smem_persistent_forward_kernel's loop with chunks by program id."""
    grid = gl.num_programs(0)
    ticket = gl.program_id(0)
    prev = ticket * 0 - 1  # the chunk held in the other buffer (-1: none)
    buf = ticket * 0
    zero, first = _first_thread(WARPS)
    counted = zero.to(gl.int64)  # the previous chunk's publish count (_publish_counted)
    while ticket < ticket_index:
        if CLEAR:
            _clear_pid_words(next_ptr, ticket, ticket_index, n_chunks, True)
        outer, inner, start, limit, _, _ = _position(
            ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
        )  # fmt: skip
        x_row = _chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, start, VEC)
        for p in gl.static_range(PIECES):
            _copy_in(smem, x_row, offs, limit, p, PIECE, POLICY, buf * PIECES, EVEN)
            cp.commit_group()
        if prev >= 0:  # the previous chunk's row, while the copies are in flight
            _forward_finish_pid(
                x_ptr, y_ptr, smem, (1 - buf) * PIECES, ws_ptr, prev, counted, first, offs,
                rows_inner, n_vecs, n_chunks, ticket_index, x_vstride_outer, x_vstride_inner,
                y_vstride_outer, y_vstride_inner, CHUNK, PIECES, PIECE, VEC, WARPS,
                POLL_WIDTH, SLEEP_NS, EXP2, POLICY, LEAVE_POLLS, EVEN,
            )  # fmt: skip
        partial = _forward_partial(smem, buf * PIECES, offs, limit, PIECES, PIECE, VEC, WARPS,
                                   EXP2, FOLD, EVEN)  # fmt: skip
        # the count's old value is read only at the next finish: no wait for the atomic here
        counted, first, _, _ = _publish_counted(ws_ptr, ticket, partial, ticket_index,
                                                n_chunks, WARPS)  # fmt: skip
        prev = ticket
        buf = 1 - buf
        ticket += grid
    if prev >= 0:
        _forward_finish_pid(
            x_ptr, y_ptr, smem, (1 - buf) * PIECES, ws_ptr, prev, counted, first, offs,
            rows_inner, n_vecs, n_chunks, ticket_index, x_vstride_outer, x_vstride_inner,
            y_vstride_outer, y_vstride_inner, CHUNK, PIECES, PIECE, VEC, WARPS, POLL_WIDTH,
            SLEEP_NS, EXP2, POLICY, LEAVE_POLLS, EVEN,
        )  # fmt: skip


@gluon.jit
def _forward_finish_pid(x_ptr, y_ptr, smem, base, ws_ptr, ticket, counted, first, offs,
                        rows_inner, n_vecs, n_chunks, ticket_index, x_vstride_outer,
                        x_vstride_inner, y_vstride_outer, y_vstride_inner, CHUNK: gl.constexpr,
                        PIECES: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr,
                        WARPS: gl.constexpr, POLL_WIDTH: gl.constexpr, SLEEP_NS: gl.constexpr,
                        EXP2: gl.constexpr, POLICY: gl.constexpr, LEAVE_POLLS: gl.constexpr,
                        EVEN: gl.constexpr):  # fmt: skip
    """Wait for the row of a chunk published earlier (its count's old value `counted`,
    _publish_counted), write the chunk from smem.index(base + p) unless this program left it,
    and, as the row's last publisher, the chunks others left."""
    outer, inner, start, limit, slots, _ = _position(
        ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
    )  # fmt: skip
    count, left = _leave_words(ws_ptr, ticket, ticket_index, n_chunks)
    packed, slot_ok, gone = _row_slots(slots, n_chunks, POLL_WIDTH, SLEEP_NS, WARPS, LEAVE_POLLS,
                                       count, left)  # fmt: skip
    row_max, inv_sum = _row_stats(packed, slot_ok)
    if gone == 0:
        _forward_write(y_ptr, smem, base, row_max, inv_sum, outer, inner, start, y_vstride_outer,
                       y_vstride_inner, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2, POLICY,
                       EVEN)  # fmt: skip
    if _last_with_leavers(counted, first, n_chunks):
        _forward_write_left(x_ptr, y_ptr, left, ticket, n_chunks, n_vecs, outer, inner,
                            x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
                            row_max, inv_sum, CHUNK, VEC, WARPS, EXP2, POLICY)  # fmt: skip


@gluon.jit
def softmax_smem_persistent_backward_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr, next_ptr,
    rows_inner, n_vecs, n_chunks, ticket_index,
    y_vstride_outer, y_vstride_inner, dy_vstride_outer, dy_vstride_inner,
    dx_vstride_outer, dx_vstride_inner,
    CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
    MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr, POLICY: gl.constexpr = "",
    CLEAR: gl.constexpr = True,
):  # fmt: skip
    """softmax_smem_backward_kernel's work, persistent as the forward above."""
    PIECES: gl.constexpr = CHUNK // PIECE
    layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
    smem_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
    offs = gl.arange(0, PIECE, layout=layout)
    y_smem = gl.allocate_shared_memory(y_ptr.dtype.element_ty, [2 * PIECES, PIECE], smem_layout)
    dy_smem = gl.allocate_shared_memory(dy_ptr.dtype.element_ty, [2 * PIECES, PIECE], smem_layout)
    ticket = _take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR)
    prev = ticket * 0 - 1
    buf = ticket * 0
    while ticket < ticket_index:
        outer, inner, start, limit, _, row = _position(
            ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
        )  # fmt: skip
        y_row = _chunk_start(y_ptr, outer, inner, y_vstride_outer, y_vstride_inner, start, VEC)
        dy_row = _chunk_start(dy_ptr, outer, inner, dy_vstride_outer, dy_vstride_inner, start,
                              VEC)  # fmt: skip
        for p in gl.static_range(PIECES):
            _copy_in(y_smem, y_row, offs, limit, p, PIECE, POLICY, buf * PIECES)
            _copy_in(dy_smem, dy_row, offs, limit, p, PIECE, POLICY, buf * PIECES)
            cp.commit_group()
        other_row = prev >= 0 and prev // n_chunks != row
        if other_row:
            _backward_finish_ticket(
                dx_ptr, y_smem, dy_smem, (1 - buf) * PIECES, ws_ptr, prev, offs, rows_inner,
                n_vecs, n_chunks, dx_vstride_outer, dx_vstride_inner, CHUNK, PIECES, PIECE, VEC,
                WARPS, MAX_CHUNKS, SLEEP_NS, POLICY,
            )  # fmt: skip
        partial = _backward_partial(y_smem, dy_smem, buf * PIECES, PIECES, PIECE, VEC, WARPS)
        gl.atomic_xchg(ws_ptr + ticket, partial, sem="relaxed")
        if prev >= 0 and not other_row:
            _backward_finish_ticket(
                dx_ptr, y_smem, dy_smem, (1 - buf) * PIECES, ws_ptr, prev, offs, rows_inner,
                n_vecs, n_chunks, dx_vstride_outer, dx_vstride_inner, CHUNK, PIECES, PIECE, VEC,
                WARPS, MAX_CHUNKS, SLEEP_NS, POLICY,
            )  # fmt: skip
        prev = ticket
        buf = 1 - buf
        ticket = _take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR)
    if prev >= 0:
        _backward_finish_ticket(
                dx_ptr, y_smem, dy_smem, (1 - buf) * PIECES, ws_ptr, prev, offs, rows_inner,
                n_vecs, n_chunks, dx_vstride_outer, dx_vstride_inner, CHUNK, PIECES, PIECE, VEC,
                WARPS, MAX_CHUNKS, SLEEP_NS, POLICY,
            )  # fmt: skip


# Polls of its row's slots after which a program with chunks by program id leaves its chunk to
# the row's last publisher: at least 256 x 200 ns, against a few polls for a row whose programs
# all run.
LEAVE_POLLS = 256


def pid_programs(programs: int, n_slots: int, n_chunks: int) -> int:
    """The persistent forward by program id's grid for about `programs` programs: a multiple
    of n_chunks (a row's chunks in one round; at least one row, whatever `programs` says), the
    rows spread over the fewest rounds as evenly as a whole number of rows a round allows."""
    n_rows = n_slots // n_chunks
    rounds = triton.cdiv(n_rows, max(1, programs // n_chunks))
    return triton.cdiv(n_rows, rounds) * n_chunks


def workspace_words(n_slots: int, n_chunks: int, by_pid: bool) -> int:
    """Words of a launch's workspace: a slot a chunk and the ticket counter; chunks by program
    id also a count word a row and a left flag a chunk (_leave_words)."""
    return 2 * n_slots + n_slots // n_chunks + 1 if by_pid else n_slots + 1


def launch(launcher, backward, tensors, ws, next_ws, rows, strides, chunk, warps, piece=0,
           sleep_ns=200, exp2=0, evict=False, maxnreg=0, programs=0, fold=False,
           regs=0, by_pid=False, leave_polls=LEAVE_POLLS, transpose=False, even=False,
           poly=0, one_copy=False, left_group=1, widen=False, lead=0, lead_tiers=1,
           lead_ns=0, tail_pf=0, interleave=False):  # fmt: skip
    """Launch the forward (tensors x, y) or the backward (y, dy, dx) over rows
    (rows_outer, rows_inner) with strides[i] = (outer, inner, 1) for tensors[i], in elements,
    all multiples of 16 bytes (kernels.softmax._smem_fits). ws is zeroed; the kernel zeroes
    next_ws (None: nothing to zero) for the next launch. launcher: kernels._common.direct.
    programs > 0: the persistent kernels on that many programs (at most one a chunk; by_pid:
    pid_programs of them). fold: the forward's partial in one pass, 1 program-wide, 2 thread
    by thread (kernels.softmax.Config.fold). regs: the forward's last `regs` pieces a chunk held in
    registers (one-shot kernel; a power of 2, fewer than the chunk's pieces). by_pid: the
    one-shot kernels' chunks by program id (Config.by_pid; the backward's since round 21; the
    persistent forward's since round 22), a waiting program leaving its chunk after
    leave_polls polls; ws then holds the leave words too (workspace_words). transpose:
    program ids down the rows' first chunks first (a test of leaving). even: the one-shot
    kernels (and the persistent forward by program id) without masks, where rows are whole
    chunks (Config.even). poly: the one-shot forward's exp2 partly on the FMA pipe, 16-bit
    only (Config.poly). one_copy: the one-shot forward's chunk copied in as one copy and one
    commit group (Config.one_copy). left_group: the one-shot forward's left chunks written
    that many pieces a step (Config.left_group). widen: the one-shot bf16 forward's values
    widened by integer ops (Config.widen). lead: the one-shot forward by program id with that
    many lead programs ahead of the chunks' (Config.lead), in lead_tiers tiers of lead_ns ns;
    the first tail_pf of them prefetch the last tail_pf chunks into L2 (Config.tail_pf).
    interleave: the one-shot forward by program id on rows of whole chunks with a row's chunks
    interleaved piece by piece (Config.interleave)."""
    rows_outer, rows_inner = rows
    n_cols = tensors[0].shape[-1]
    n_chunks = triton.cdiv(n_cols, chunk)
    n_slots = rows_outer * rows_inner * n_chunks
    vec = 16 // tensors[0].element_size()
    piece = piece or vec * 32 * warps
    if chunk % piece:
        raise ValueError(f"a chunk of {chunk} columns is not a whole number of {piece}-wide pieces")
    vstrides = [s // vec for outer, inner, _ in strides for s in (outer, inner)]
    for buffer in (ws, next_ws):
        if buffer is not None and buffer.numel() < workspace_words(n_slots, n_chunks, by_pid):
            raise ValueError(f"a workspace of {buffer.numel()} words is short of the "
                             f"{workspace_words(n_slots, n_chunks, by_pid)} this launch takes")
    meta = dict(
        CHUNK=chunk, PIECE=piece, VEC=vec, WARPS=warps, MAX_CHUNKS=triton.next_power_of_2(n_chunks),
        SLEEP_NS=sleep_ns, POLICY="evict_first" if evict else "", CLEAR=next_ws is not None,
        num_warps=warps,
    )  # fmt: skip
    if programs > 0:
        kernel = (softmax_smem_persistent_backward_kernel if backward
                  else softmax_smem_persistent_forward_kernel)  # fmt: skip
    else:
        kernel = softmax_smem_backward_kernel if backward else softmax_smem_forward_kernel
    if regs and (backward or programs > 0 or regs & (regs - 1) or regs >= chunk // piece):
        raise ValueError(
            f"regs = {regs}: pieces held in registers are a knob of the one-shot forward, a "
            f"power of 2 below the chunk's {chunk // piece} pieces"
        )
    if transpose and (not by_pid or programs > 0):
        raise ValueError("transpose orders the program ids of by_pid's one-shot kernels")
    if by_pid and ((programs > 0 and backward) or regs or leave_polls == 0 or leave_polls < -1):
        raise ValueError(
            "by_pid is a knob of the one-shot kernels and the persistent forward, without regs, "
            f"leaving after at least 1 poll (or -1: never); got programs={programs}, "
            f"backward={backward}, regs={regs}, leave_polls={leave_polls}"
        )  # fmt: skip
    if even and ((programs > 0 and not by_pid) or regs or n_cols % chunk):
        raise ValueError(f"even is a knob of the one-shot kernels and of the persistent ones by "
                         f"program id, without regs, on rows of whole chunks; got {n_cols} "
                         f"columns in chunks of {chunk}, programs={programs}, "
                         f"by_pid={by_pid}")  # fmt: skip
    if even:
        meta["EVEN"] = True
    if by_pid:  # POLL_WIDTH: a slot a thread at most, one count across warps (_row_slots)
        meta.update(BY_PID=True, LEAVE_POLLS=leave_polls,
                    POLL_WIDTH=max(meta["MAX_CHUNKS"], 32 * warps))  # fmt: skip
        if programs == 0:
            meta["TRANSPOSE"] = transpose
    if poly and (backward or programs > 0 or fold or regs or poly not in (1, 2)
                 or tensors[0].element_size() != 2):  # fmt: skip
        raise ValueError(f"poly (1 or 2) is a knob of the one-shot 16-bit forward without fold "
                         f"or regs; got poly={poly}")  # fmt: skip
    if one_copy and (backward or programs > 0 or fold or regs):
        raise ValueError(f"one_copy is a knob of the one-shot forward without fold or regs; got "
                         f"backward={backward}, programs={programs}, fold={fold}, "
                         f"regs={regs}")  # fmt: skip
    if one_copy:
        meta["ONE_COPY"] = True
    if widen and (backward or programs > 0 or fold or poly
                  or tensors[0].dtype != torch.bfloat16):  # fmt: skip
        raise ValueError(f"widen is a knob of the one-shot bf16 forward without fold or poly; got "
                         f"{tensors[0].dtype}, backward={backward}, programs={programs}, "
                         f"fold={fold}, poly={poly}")  # fmt: skip
    if widen:
        meta["WIDEN"] = True
    if lead and (backward or programs > 0 or not by_pid or lead < 0 or lead_ns <= 0
                 or not 1 <= lead_tiers <= lead):  # fmt: skip
        raise ValueError(f"lead is a knob of the one-shot forward by program id, with 1 to lead "
                         f"tiers of a positive lead_ns; got lead={lead}, "
                         f"lead_tiers={lead_tiers}, lead_ns={lead_ns}, backward={backward}, "
                         f"programs={programs}, by_pid={by_pid}")  # fmt: skip
    if tail_pf and not 0 < tail_pf <= min(lead, n_slots):
        raise ValueError(f"tail_pf is a knob of the lead programs, at most one chunk each (and "
                         f"at most the grid's {n_slots}); got tail_pf={tail_pf}, lead={lead}")
    if lead:
        meta.update(LEAD=lead, LEAD_TIERS=lead_tiers, LEAD_NS=lead_ns)
    if tail_pf:
        meta["TAIL_PF"] = tail_pf
    if interleave and (backward or programs > 0 or not by_pid or not even or regs or fold
                       or one_copy or tail_pf or left_group != 1
                       or piece != vec * 32 * warps):  # fmt: skip
        raise ValueError(f"interleave is a knob of the one-shot forward by program id on rows "
                         f"of whole chunks (even), without regs, fold, one_copy, tail_pf, "
                         f"left_group or a piece of its own; got backward={backward}, "
                         f"programs={programs}, by_pid={by_pid}, even={even}, regs={regs}, "
                         f"fold={fold}, one_copy={one_copy}, tail_pf={tail_pf}, "
                         f"left_group={left_group}, piece={piece}")  # fmt: skip
    if interleave:
        meta["STRIDE"] = piece * n_chunks
    if left_group != 1:
        power_of_2 = left_group >= 1 and not left_group & (left_group - 1)
        whole = (chunk // piece) % left_group == 0
        if backward or programs > 0 or not by_pid or not power_of_2 or not whole:
            raise ValueError(f"left_group is a knob of the one-shot forward by program id, a "
                             f"power of 2 dividing the chunk's {chunk // piece} pieces; got "
                             f"left_group={left_group}, backward={backward}, "
                             f"programs={programs}, by_pid={by_pid}")  # fmt: skip
        meta["LEFT_GROUP"] = left_group
    if not backward:
        meta["EXP2"] = exp2
        meta["FOLD"] = int(fold)
        if poly:
            meta["POLY"] = poly
        if regs:  # the held words past the row's end: -inf values (kernel _held_words)
            itemsize = tensors[0].element_size()
            neg_inf = torch.full((4 // itemsize,), -math.inf, dtype=tensors[0].dtype)
            pad = neg_inf.view(torch.int32).item() if itemsize == 2 else -math.inf
            meta.update(REGS=regs, HELD_PAD=pad)
    elif fold:
        raise ValueError("fold is a knob of the forward")
    if maxnreg:  # a ptxas register cap (kernels.softmax.Config.maxnreg)
        meta["maxnreg"] = maxnreg
    if programs > 0 and by_pid:
        grid = pid_programs(programs, n_slots, n_chunks)
    else:
        grid = min(programs, n_slots) if programs > 0 else n_slots + lead
    launcher(kernel)[(grid,)](
        *tensors, ws, next_ws, rows_inner, n_cols // vec, n_chunks, n_slots, *vstrides, **meta
    )
