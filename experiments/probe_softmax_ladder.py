"""What each step of the long-row smem forward costs (GPU, Gluon; a probe, not a benchmark).

Round 18 (kernels/notes/softmax.md) left the H200's smem forward past the tile at 81-85% of its
copy and ruled out the row's synchronization as such. This probe builds the forward up from a
plain copy through shared memory, one step at a time, on the pick's programs (32 KB chunks, 8
warps in 16-bit and 4 in fp32), and times each rung beside the copy of the same bytes:

    TICKET  0: the chunk is the program id; 1: an atomic ticket (the production protocol)
    WORK    0: copy (y = x through shared memory)
            1: local: the chunk's own softmax (max, sum of exp, output; no other program)
            2: row: the chunk's partial published, the row's awaited (the production kernel)
            3: row, the partial's exp kept in shared memory in place of x (one exp a value)
            4: row in a thread-block cluster: the row's chunks are one cluster's programs
               (launched with clusters of n_chunks), each pushes its partial into every
               program's shared memory (st.shared::cluster) and one cluster barrier stands for
               the publish and the polls (no workspace, no atomics, no reliance on start order)
    LOAD    0: cp.async, 16 bytes a thread; 1: TMA, one bulk copy a split of the chunk
    STORE   0: st.global from registers; 1: y written into shared memory, then TMA stores;
            2 (row rungs): each split's TMA store issued as soon as its y is in shared memory
    PREFETCH  D > 0: at its start a program asks L2 for chunk c + D (prefetch.global.L2, a
            128-byte line a thread), the chunk of a program that starts about D programs later,
            so that its copies hit L2 (round 25)
    ORDER   where a chunk's splits lie and in what order they move (round 28): 0 contiguous;
            1 interleaved with its row-mates' (a row's chunks read one contiguous span a step);
            3 the same by halves of the chunk; 2 rotated by the chunk's index; 4 / 5 (row rungs)
            reads rotated and writes in order / reads in order and writes rotated

Rows are contiguous and N a multiple of the chunk, so a chunk is CHUNK consecutive values and
there are no masks (the shipped kernel masks; its time is printed beside). A chunk is viewed as
(CHUNK / 256, 256) so that a TMA box covers a split of it (box sides are at most 256).

    python -m experiments.probe_softmax_ladder --only 65536,262144
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import NamedTuple

import torch

from experiments.probe_softmax import DTYPES, bench_gpu, copy_bandwidth
from kernels.softmax import _sm_count, softmax

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from kernels import softmax_smem as sk
    from kernels._coop import _nanosleep, _pack
except ImportError:  # a Triton without Gluon's Hopper modules: main() says so
    gluon = None

COLS = 256  # the inner side of a chunk's (rows, 256) view: a TMA box side's limit


class Rung(NamedTuple):
    ticket: int
    work: int
    load: int
    store: int
    prefetch: int = 0
    # round 26: the last tail_pct % of the rows in chunks `tail` times smaller (ladder_tail_kernel)
    tail: int = 0
    tail_pct: int = 0
    # round 26: the first wave's odd rows (its first FIRST_WAVE_PER_SM programs an SM) start
    # `stagger` ns late, so that half its rows land, and write, before the rest
    stagger: int = 0
    # round 28: where a chunk's splits lie (0: contiguous; 1: interleaved with its row-mates',
    # so that a row's chunks read and write one contiguous span a step; 3: the same in two
    # halves of the chunk; 2: the chunk's own splits in an order rotated by its index, so that
    # programs in step touch different offsets of their 32 KB-aligned chunks; in the row
    # rungs, 4: rotated reads, writes in order; 5: reads in order, rotated writes)
    order: int = 0


# TMA loads only under the copy rungs: with the softmax's work after them (rungs local_tma,
# row_tma_t and others, timed in results/h100_probes/softmax_ladder19_h200.txt) some programs
# read a split before its bytes landed on the H200 (NaN in 0.3-27% of the outputs at 2^27
# values, though not on 12 chunks), with a fence and a barrier after the barriers' init or
# without; unresolved. The copies through TMA were exact and no faster than cp.async.
RUNGS = {
    "copy_cp": Rung(0, 0, 0, 0),
    "copy_cp_t": Rung(1, 0, 0, 0),
    "copy_tma": Rung(0, 0, 1, 1),
    "copy_tma_r": Rung(0, 0, 1, 0),
    "local_cp": Rung(0, 1, 0, 0),
    "local_cp_t": Rung(1, 1, 0, 0),
    "row_cp": Rung(0, 2, 0, 0),
    "row_cp_t": Rung(1, 2, 0, 0),
    "row_cp_e": Rung(0, 3, 0, 0),
    "row_cp_t_e": Rung(1, 3, 0, 0),
    "row_cl": Rung(0, 4, 0, 0),
    "copy_cp_pf396": Rung(0, 0, 0, 0, 396),
    "row_cp_pf132": Rung(0, 2, 0, 0, 132),
    "row_cp_pf396": Rung(0, 2, 0, 0, 396),
    "row_cp_pf792": Rung(0, 2, 0, 0, 792),
    # round 26: a grid's last programs in smaller chunks, so that its tail drains sooner
    "copy_cp_s4_10": Rung(0, 0, 0, 0, 0, 4, 10),
    "row_cp_s2_10": Rung(0, 2, 0, 0, 0, 2, 10),
    "row_cp_s4_5": Rung(0, 2, 0, 0, 0, 4, 5),
    "row_cp_s4_10": Rung(0, 2, 0, 0, 0, 4, 10),
    "row_cp_s4_20": Rung(0, 2, 0, 0, 0, 4, 20),
    "row_cp_s8_10": Rung(0, 2, 0, 0, 0, 8, 10),
    # and the first wave's rows in two halves, the second started late
    "row_cp_st1000": Rung(0, 2, 0, 0, stagger=1000),
    "row_cp_st2000": Rung(0, 2, 0, 0, stagger=2000),
    "row_cp_st4000": Rung(0, 2, 0, 0, stagger=4000),
    "row_cp_st8000": Rung(0, 2, 0, 0, stagger=8000),
    # round 28: the DRAM access pattern (Rung.order)
    "copy_cp_il": Rung(0, 0, 0, 0, order=1),
    "copy_cp_rot": Rung(0, 0, 0, 0, order=2),
    "row_cp_il": Rung(0, 2, 0, 0, order=1),
    "row_cp_rot": Rung(0, 2, 0, 0, order=2),
    "copy_cp_il2": Rung(0, 0, 0, 0, order=3),
    "row_cp_il2": Rung(0, 2, 0, 0, order=3),
    "row_cp_rotr": Rung(0, 2, 0, 0, order=4),
    "row_cp_rotw": Rung(0, 2, 0, 0, order=5),
    # and y sent out by TMA stores from shared memory after cp.async loads
    "copy_cp_ts": Rung(0, 0, 0, 1),
    "row_cp_ts": Rung(0, 2, 0, 1),
    "row_cp_ts2": Rung(0, 2, 0, 2),
}
# the programs an SM holds at once (32 KB of shared memory each, 40 registers at 8 warps)
FIRST_WAVE_PER_SM = 6

# Round 25: the cluster rung's partials live past Triton's own shared memory: the launch asks for
# SLOT_BYTES more a program (16 clusters' ranks at most, a (max, sum) pair of fp32 each)
CLUSTER_MAX = 16
SLOT_BYTES = 8 * CLUSTER_MAX

# the pick's programs (kernels.softmax: 32 KB chunks; 8 warps in 16-bit, 4 in fp32)
CHUNK_BYTES = 32 * 1024


# 6 programs of 8 warps an SM, as the bf16 pick (32 registers) has: the local rungs on cp.async
# take 44 registers uncapped (40 with a 4-byte spill); the others fit 40 uncapped, but for the
# rotated orders (44 uncapped; 40 capped, with no spill but in row_cp_rotr's a stray local load
# that ncu saw reach DRAM: 8 MB a launch, 3% more reads). The interleaved orders are not capped:
# capped, they carried that stray load too (round 28)
MAXNREG_8_WARPS = 40


def warps_for(itemsize: int) -> int:
    return 8 if itemsize == 2 else 4


def chunk_for(itemsize: int) -> int:
    return CHUNK_BYTES // itemsize


def splits_for(rung: Rung, itemsize: int) -> int:
    """Copies (and waits) a chunk: 8 rows of its (CHUNK / 256, 256) view a split (2048 values
    in 16-bit, as the pick's pieces; 1024 in fp32, half its 8 KB chunk's pieces)."""
    return chunk_for(itemsize) // COLS // 8


def check_shape(n: int, itemsize: int) -> None:
    if n % chunk_for(itemsize):
        raise ValueError(f"the ladder needs rows of a multiple of {chunk_for(itemsize)} columns, "
                         f"not {n}")  # fmt: skip


if gluon is not None:
    COLS_C = gl.constexpr(COLS)

    @gluon.jit
    def _landed(bars, s: gl.constexpr, LOAD: gl.constexpr, SPLITS: gl.constexpr):
        """Wait until split s of the chunk is in shared memory."""
        if LOAD == 0:
            cp.wait_group(SPLITS - 1 - s)  # each thread reads what its own copies wrote
        else:
            mbarrier.wait(bars.index(s), 0)

    @gluon.jit
    def _chunk_max(smem, bars, layout: gl.constexpr, LOAD: gl.constexpr, SPLITS: gl.constexpr):
        """The chunk's max over its SPLITS splits in smem, each read once it has landed."""
        for s in gl.static_range(SPLITS):
            _landed(bars, s, LOAD, SPLITS)
            v = smem.index(s).load(layout).to(gl.float32)
            if s == 0:
                max_vec = v
            else:
                max_vec = gl.maximum(max_vec, v)
        return gl.max(gl.max(max_vec, axis=1), axis=0)

    # The cluster's partials: PTX on the dynamic shared memory's symbol (global_smem in Triton
    # 3.6's kernels), at %dynamic_smem_size - SLOT_BYTES, a region the compiler does not use
    _SLOT_ADDR = (
        "mov.u32 a, global_smem; mov.u32 d, %dynamic_smem_size; add.u32 a, a, d; "
        f"sub.u32 a, a, {SLOT_BYTES}; mad.lo.u32 a, $2, 8, a; "
    )
    _PUSH = gl.constexpr(
        "{ .reg .u32 a, d, r; " + _SLOT_ADDR + "mapa.shared::cluster.u32 r, a, $1; "
        "st.shared::cluster.v2.f32 [r], {$3, $4}; mov.u32 $0, 0; }"
    )
    _SLOTS = gl.constexpr(
        "{ .reg .u32 a, d; " + _SLOT_ADDR + "add.u32 a, a, $3; ld.shared.v2.f32 {$0, $1}, [a]; }"
    )

    # the cluster barrier's phases: this program has started (its shared memory may be written
    # by the cluster's); every program has; every program's pushes have landed
    _ARRIVE = gl.constexpr("barrier.cluster.arrive.relaxed.aligned;")
    _WAIT = gl.constexpr("barrier.cluster.wait.acquire.aligned;")
    _SYNC = gl.constexpr(
        "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned;"
    )

    @gluon.jit
    def _cluster_barrier(dummy, PTX: gl.constexpr):
        """PTX (_ARRIVE, _WAIT or _SYNC), returning dummy (its use orders what follows)."""
        return gl.inline_asm_elementwise(PTX + " mov.u32 $0, $1;", "=r,r", [dummy],
                                         dtype=gl.int32, is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def _cluster_push(ranks, rank, m, s):
        """(m, s) into slot `rank` of every program in `ranks` (the cluster's)."""
        return gl.inline_asm_elementwise(_PUSH, "=r,r,r,f,f", [ranks, rank, m, s], dtype=gl.int32,
                                         is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def _cluster_slots(ranks, after):
        """This program's slots `ranks` (after: the barrier's 0, so the reads follow it)."""
        return gl.inline_asm_elementwise(_SLOTS, "=f,=f,r,r", [ranks, after],
                                         dtype=(gl.float32, gl.float32), is_pure=False, pack=1)

    @gluon.jit
    def _l2_prefetch(ptrs):
        return gl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l",
                                         [ptrs], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _chunk_first(c, n_chunks, CHUNK: gl.constexpr, SPLIT: gl.constexpr, ORDER: gl.constexpr,
                     SPLITS: gl.constexpr):
        """The first value of chunk c's first split (Rung.order)."""
        if (ORDER == 1) | (ORDER == 3):
            k = c % n_chunks
            return (c - k).to(gl.int64) * CHUNK + k * (SPLIT * _group(ORDER, SPLITS))
        else:
            return c.to(gl.int64) * CHUNK

    @gluon.constexpr_function
    def _group(order, splits):
        """The splits of a chunk that lie together in the interleaved orders 1 and 3."""
        return splits // 2 if order == 3 else 1

    @gluon.jit
    def _split_at(first, c, s, n_chunks, SPLIT: gl.constexpr, SPLITS: gl.constexpr,
                  ORDER: gl.constexpr):
        """The first value of the split that chunk c's shared-memory slot s holds, from
        _chunk_first's `first` (Rung.order)."""
        if (ORDER == 1) | (ORDER == 3):  # the row's chunks' groups of splits in turn
            G: gl.constexpr = _group(ORDER, SPLITS)
            return first + (s // G) * (n_chunks * G * SPLIT) + (s % G) * SPLIT
        elif (ORDER == 2) | (ORDER == 4):  # the slots hold the splits rotated by c
            return first + ((s + c) % SPLITS) * SPLIT
        else:
            return first + s * SPLIT

    @gluon.jit
    def _write_slot(c, u, SPLITS: gl.constexpr, ORDER: gl.constexpr):
        """The slot the row rungs' u-th write takes: in order 4 the one holding split u (the
        writes in order after rotated reads), in order 5 slot (u + c) % SPLITS (rotated writes
        after reads in order), else slot u."""
        if ORDER == 4:
            return (u + SPLITS - c % SPLITS) % SPLITS
        elif ORDER == 5:
            return (u + c) % SPLITS
        else:
            return u

    @gluon.jit
    def ladder_kernel(
        x_ptr, y_ptr, x_desc, y_desc, ws_ptr, next_ptr, n_chunks, ticket_index,
        CHUNK: gl.constexpr, SPLITS: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
        MAX_CHUNKS: gl.constexpr, TICKET: gl.constexpr, WORK: gl.constexpr,
        LOAD: gl.constexpr, STORE: gl.constexpr, SLEEP_NS: gl.constexpr = 200,
        PREFETCH: gl.constexpr = 0, STAGGER: gl.constexpr = 0, FIRST_WAVE: gl.constexpr = 0,
        ORDER: gl.constexpr = 0, ROW_CHUNKS: gl.constexpr = 0,
    ):  # fmt: skip
        R: gl.constexpr = CHUNK // (SPLITS * COLS_C)  # rows of the view a split
        SPLIT: gl.constexpr = R * COLS_C
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [WARPS, 1], [1, 0])
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        if WORK == 4:
            started = _cluster_barrier(gl.program_id(0) * 0, _ARRIVE)
        if TICKET:
            c = sk._take_ticket(ws_ptr, next_ptr, ticket_index, True)
        else:  # the program id (a row's wait then relies on programs starting in id order)
            c = sk._pid_ticket(next_ptr, ticket_index, n_chunks, True)
        if STAGGER > 0:  # the first wave's odd rows start late (Rung.stagger)
            if (c < FIRST_WAVE) & ((c // n_chunks) % 2 == 1):
                # a branch, not a sleep of 0 for the others: round 26's first run slept 0 in
                # every program and lost 5-7 us whatever the stagger (ladder26c)
                c = _nanosleep(c, STAGGER)
        if PREFETCH > 0:  # a 128-byte line a thread; past the last chunk: this one's again
            LINE: gl.constexpr = 128 // (dtype.primitive_bitwidth // 8)
            ahead = gl.where(c + PREFETCH < ticket_index, c + PREFETCH, c).to(gl.int64) * CHUNK
            lines = gl.arange(0, CHUNK // LINE, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
            _l2_prefetch(x_ptr + ahead + lines * LINE)
        rows = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, COLS_C, layout=gl.SliceLayout(0, layout))
        offs = rows[:, None] * COLS_C + cols[None, :]
        view_row = c * (CHUNK // COLS_C)  # the chunk's first row of the (rows, 256) view
        if ROW_CHUNKS > 0:  # a row's chunks known to the compiler: the splits' strides are
            n_chunks = ROW_CHUNKS  # immediates, as the contiguous order's are (fewer registers)
        first = _chunk_first(c, n_chunks, CHUNK, SPLIT, ORDER, SPLITS)
        bars = gl.allocate_shared_memory(gl.int64, [SPLITS, 1], mbarrier.MBarrierLayout())
        if LOAD == 0:
            if STORE == 0:
                smem = gl.allocate_shared_memory(dtype, [SPLITS, R, COLS_C],
                                                 gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
            else:  # TMA stores read the descriptor's layout (unswizzled: the same bytes)
                smem = gl.allocate_shared_memory(dtype, [SPLITS, R, COLS_C], y_desc.layout)
            for s in gl.static_range(SPLITS):
                at = _split_at(first, c, s, n_chunks, SPLIT, SPLITS, ORDER)
                cp.async_copy_global_to_shared(smem.index(s), x_ptr + at + offs)
                cp.commit_group()
        else:
            smem = gl.allocate_shared_memory(dtype, [SPLITS, R, COLS_C], x_desc.layout)
            for s in gl.static_range(SPLITS):
                mbarrier.init(bars.index(s), count=1)
            # the inits seen by the TMA unit and by every thread before any wait: without this
            # a warp could wait on the barrier word the SM's previous program left completed
            # (bf16 rungs read unlanded data at scale on the H200)
            fence_async_shared()
            gl.thread_barrier()
            for s in gl.static_range(SPLITS):
                mbarrier.expect(bars.index(s), R * COLS_C * dtype.primitive_bitwidth // 8)
                tma.async_copy_global_to_shared(x_desc, [view_row + s * R, 0], bars.index(s),
                                                smem.index(s))  # fmt: skip
        if WORK == 0:
            for s in gl.static_range(SPLITS):
                _landed(bars, s, LOAD, SPLITS)
                if STORE == 0:
                    v = smem.index(s).load(layout)
                    at = _split_at(first, c, s, n_chunks, SPLIT, SPLITS, ORDER)
                    gl.store(y_ptr + at + offs, v)
                else:
                    if LOAD == 0:  # written by the threads' copies: visible to the TMA unit
                        fence_async_shared()
                        gl.thread_barrier()
                    tma.async_copy_shared_to_global(y_desc, [view_row + s * R, 0], smem.index(s))
        else:
            chunk_max = _chunk_max(smem, bars, layout, LOAD, SPLITS)
            sum_vec = gl.zeros([R, COLS_C], gl.float32, layout)
            for s in range(SPLITS):  # not unrolled: the loads of one split at a time live
                v = smem.index(s).load(layout).to(gl.float32)
                e = sk._exp_shifted(v, chunk_max, 2)
                sum_vec += e
                if WORK == 3:  # each thread overwrites what it read: no barrier
                    smem.index(s).store(e.to(dtype))
            chunk_sum = gl.sum(gl.sum(sum_vec, axis=1), axis=0)
            if WORK == 1:
                row_max = chunk_max
                inv_sum = 1.0 / chunk_sum
            elif WORK == 4:  # n_chunks == MAX_CHUNKS == the cluster's size
                ranks = gl.arange(0, MAX_CHUNKS, layout=gl.BlockedLayout([1], [32], [WARPS], [0]))
                _cluster_barrier(started, _WAIT)
                _cluster_push(ranks, c % n_chunks, chunk_max, chunk_sum)
                maxes, sums = _cluster_slots(ranks, _cluster_barrier(started, _SYNC))
                row_max = gl.max(maxes, axis=0)
                inv_sum = 1.0 / gl.sum(sums * gl.exp2((maxes - row_max) * sk.LOG2E), axis=0)
            else:
                gl.atomic_xchg(ws_ptr + c, _pack(chunk_max, chunk_sum), sem="relaxed")
                row = c // n_chunks
                packed, ok, _ = sk._row_slots(ws_ptr + row.to(gl.int64) * n_chunks, n_chunks,
                                           MAX_CHUNKS, SLEEP_NS, WARPS)  # fmt: skip
                row_max, inv_sum = sk._row_stats(packed, ok)
            scale = gl.exp2((chunk_max - row_max) * sk.LOG2E) * inv_sum
            for u in range(SPLITS):
                s = _write_slot(c, u, SPLITS, ORDER)
                if WORK == 3:
                    y = smem.index(s).load(layout).to(gl.float32) * scale
                else:
                    v = smem.index(s).load(layout).to(gl.float32)
                    y = sk._exp_shifted(v, row_max, 2) * inv_sum
                if STORE == 0:
                    at = _split_at(first, c, s, n_chunks, SPLIT, SPLITS, ORDER)
                    gl.store(y_ptr + at + offs, y.to(dtype))
                else:
                    smem.index(s).store(y.to(dtype))
                    if STORE == 2:  # this split's TMA store now, the next split's y meanwhile
                        fence_async_shared()
                        gl.thread_barrier()
                        tma.async_copy_shared_to_global(y_desc, [view_row + s * R, 0],
                                                        smem.index(s))  # fmt: skip
            if STORE == 1:
                fence_async_shared()
                gl.thread_barrier()
                for s in range(SPLITS):
                    tma.async_copy_shared_to_global(y_desc, [view_row + s * R, 0], smem.index(s))
        if STORE != 0:
            tma.store_wait(0)


    @gluon.jit
    def _tail_chunk(x_ptr, y_ptr, smem, ws_ptr, c, base, n_chunks, SPLITS: gl.constexpr,
                    R: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
                    MAX_CHUNKS: gl.constexpr, WORK: gl.constexpr, SLEEP_NS: gl.constexpr):
        """Chunk c (SPLITS splits of the (R, 256) view, from value `base`) of a region whose
        slots start at ws_ptr and whose rows are n_chunks chunks: copied (WORK 0) or its row's
        softmax (WORK 2), through the first SPLITS buffers of smem."""
        layout: gl.constexpr = gl.BlockedLayout([1, VEC], [1, 32], [WARPS, 1], [1, 0])
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        rows = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
        cols = gl.arange(0, COLS_C, layout=gl.SliceLayout(0, layout))
        offs = rows[:, None] * COLS_C + cols[None, :]
        for s in gl.static_range(SPLITS):
            cp.async_copy_global_to_shared(smem.index(s), x_ptr + base + s * R * COLS_C + offs)
            cp.commit_group()
        if WORK == 0:
            for s in gl.static_range(SPLITS):
                cp.wait_group(SPLITS - 1 - s)
                gl.store(y_ptr + base + s * R * COLS_C + offs, smem.index(s).load(layout))
        else:
            chunk_max = _chunk_max(smem, smem, layout, 0, SPLITS)  # no barriers with cp.async
            sum_vec = gl.zeros([R, COLS_C], gl.float32, layout)
            for s in range(SPLITS):
                sum_vec += sk._exp_shifted(smem.index(s).load(layout).to(gl.float32), chunk_max, 2)
            chunk_sum = gl.sum(gl.sum(sum_vec, axis=1), axis=0)
            gl.atomic_xchg(ws_ptr + c, _pack(chunk_max, chunk_sum), sem="relaxed")
            row = c // n_chunks
            packed, ok, _ = sk._row_slots(ws_ptr + row.to(gl.int64) * n_chunks, n_chunks,
                                       MAX_CHUNKS, SLEEP_NS, WARPS)  # fmt: skip
            row_max, inv_sum = sk._row_stats(packed, ok)
            for s in range(SPLITS):
                v = smem.index(s).load(layout).to(gl.float32)
                y = sk._exp_shifted(v, row_max, 2) * inv_sum
                gl.store(y_ptr + base + s * R * COLS_C + offs, y.to(dtype))

    @gluon.jit
    def ladder_tail_kernel(
        x_ptr, y_ptr, ws_ptr, next_ptr, n_chunks, ticket_index, tail_pid,
        CHUNK: gl.constexpr, SPLITS: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
        MAX_CHUNKS: gl.constexpr, WORK: gl.constexpr, TAIL: gl.constexpr,
        SLEEP_NS: gl.constexpr = 200,
    ):  # fmt: skip
        """Round 26: row_cp (or copy_cp) whose programs from tail_pid on take the last rows in
        chunks TAIL times smaller (SPLITS / TAIL splits of the same shared memory), so the
        grid's last programs are shorter and its tail drains sooner. The tail's slots follow
        the first rows' (one a chunk)."""
        R: gl.constexpr = CHUNK // (SPLITS * COLS_C)
        dtype: gl.constexpr = x_ptr.dtype.element_ty
        pid = sk._pid_ticket(next_ptr, ticket_index, n_chunks, True)
        smem = gl.allocate_shared_memory(dtype, [SPLITS, R, COLS_C],
                                         gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        if pid < tail_pid:
            _tail_chunk(x_ptr, y_ptr, smem, ws_ptr, pid, pid.to(gl.int64) * CHUNK, n_chunks,
                        SPLITS, R, VEC, WARPS, MAX_CHUNKS, WORK, SLEEP_NS)
        else:
            c = pid - tail_pid
            base = tail_pid.to(gl.int64) * CHUNK + c.to(gl.int64) * (CHUNK // TAIL)
            _tail_chunk(x_ptr, y_ptr, smem, ws_ptr + tail_pid, c, base, n_chunks * TAIL,
                        SPLITS // TAIL, R, VEC, WARPS, MAX_CHUNKS * TAIL, WORK, SLEEP_NS)


class Ladder:
    """One rung on x -> y: the two workspaces taken in turn (each launch zeroes the other)."""

    def __init__(self, rung: Rung, x: torch.Tensor, y: torch.Tensor):
        n = x.shape[-1]
        itemsize = x.element_size()
        check_shape(n, itemsize)
        if rung.load and rung.work:
            raise ValueError("TMA copies under the copy rungs only (see RUNGS)")
        if rung.order and (rung.load or rung.store or rung.work not in (0, 2) or rung.tail
                           or rung.stagger or rung.prefetch
                           or (rung.order > 3 and rung.work != 2)):  # fmt: skip
            raise ValueError(f"an order of splits takes the plain cp.async copy or row rungs; "
                             f"got {rung}")  # fmt: skip
        self.rung, self.x, self.y = rung, x, y
        self.chunk = chunk_for(itemsize)
        self.n_chunks = n // self.chunk
        self.slots = x.numel() // self.chunk
        self.splits = splits_for(rung, itemsize)
        self.tail_pid = self.slots
        if rung.tail:  # the last tail_pct % of the rows (at least one) in smaller chunks
            if rung.load or rung.store or rung.work not in (0, 2) or self.splits % rung.tail:
                raise ValueError(f"a tail takes the cp.async copy or row rungs, in a divisor of "
                                 f"their {self.splits} splits; got {rung}")  # fmt: skip
            rows = x.numel() // n
            tail_rows = max(1, rows * rung.tail_pct // 100)
            self.tail_pid = (rows - tail_rows) * self.n_chunks
            self.slots = self.tail_pid + tail_rows * self.n_chunks * rung.tail
        self.ws = [torch.zeros(self.slots + 1, device=x.device, dtype=torch.int64)
                   for _ in range(2)]  # fmt: skip
        self.turn = 0
        self.registers = self.spills = "?"
        rows = self.chunk // COLS // self.splits
        layout = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * itemsize, rank=2)
        self.x_desc = TensorDescriptor.from_tensor(x.view(-1, COLS), [rows, COLS], layout)
        self.y_desc = TensorDescriptor.from_tensor(y.view(-1, COLS), [rows, COLS], layout)

    def first_wave(self) -> int:
        """The programs the GPU starts at once (Rung.stagger)."""
        return _sm_count(self.x.device) * FIRST_WAVE_PER_SM

    def __call__(self) -> None:
        ws, next_ws = self.ws[self.turn], self.ws[1 - self.turn]
        self.turn = 1 - self.turn
        warps = warps_for(self.x.element_size())
        cluster = self.rung.work == 4
        if cluster and not (2 <= self.n_chunks <= CLUSTER_MAX
                            and self.n_chunks & (self.n_chunks - 1) == 0):  # fmt: skip
            # a power of 2: each program pushes to every rank below MAX_CHUNKS, its row's
            # chunks rounded up to a power of 2, and a rank past the cluster does not exist
            raise ValueError(f"a cluster holds 2-{CLUSTER_MAX} programs, not {self.n_chunks} "
                             f"(a power of 2: a row's chunks)")  # fmt: skip
        max_chunks = max(2, 1 << (self.n_chunks - 1).bit_length())
        if self.rung.tail:
            compiled = ladder_tail_kernel[(self.slots,)](
                self.x, self.y, ws, next_ws, self.n_chunks, self.slots, self.tail_pid,
                CHUNK=self.chunk, SPLITS=self.splits, VEC=16 // self.x.element_size(),
                WARPS=warps, MAX_CHUNKS=max_chunks, WORK=self.rung.work, TAIL=self.rung.tail,
                num_warps=warps, **({"maxnreg": MAXNREG_8_WARPS} if warps == 8 else {}),
            )  # fmt: skip
            if compiled is not None:
                self.registers, self.spills = compiled.n_regs, compiled.n_spills
            return
        args = (self.x, self.y, self.x_desc, self.y_desc, ws, next_ws, self.n_chunks, self.slots)
        meta = dict(
            CHUNK=self.chunk, SPLITS=self.splits, VEC=16 // self.x.element_size(), WARPS=warps,
            MAX_CHUNKS=max_chunks, TICKET=self.rung.ticket,
            WORK=self.rung.work, LOAD=self.rung.load, STORE=self.rung.store, num_warps=warps,
            PREFETCH=self.rung.prefetch, ORDER=self.rung.order,
            ROW_CHUNKS=self.n_chunks if self.rung.order in (1, 3) else 0,
            **({"STAGGER": self.rung.stagger, "FIRST_WAVE": self.first_wave()}
               if self.rung.stagger else {}),
            **({"maxnreg": MAXNREG_8_WARPS}
               if warps == 8 and (self.rung[1:3] == (1, 0) or cluster or self.rung.stagger
                                  or self.rung.order in (2, 4, 5))
               else {}),
        )  # fmt: skip
        grid = (self.slots,)
        if cluster:
            compiled = ladder_kernel.warmup(*args, grid=grid, **meta)
            if compiled is not None and compiled.packed_metadata[1] == 1:
                # Triton launches grid x num_ctas programs in clusters of num_ctas; the
                # partials' slots past the compiler's shared memory (16-byte aligned)
                shared = -(-compiled.metadata.shared // 16) * 16 + SLOT_BYTES
                compiled.packed_metadata = (warps, self.n_chunks, shared)
            grid = (self.slots // self.n_chunks,)
        compiled = ladder_kernel[grid](*args, **meta)
        if compiled is not None:  # None when compiled offline (experiments.resources)
            self.registers, self.spills = compiled.n_regs, compiled.n_spills


def expected(rung: Rung, x: torch.Tensor) -> torch.Tensor:
    """What a rung writes: x (copy), each chunk's softmax (local) or each row's (row)."""
    if rung.work == 0:
        return x
    chunk = chunk_for(x.element_size())
    rows = x.float().view(-1, chunk) if rung.work == 1 else x.float()
    return torch.softmax(rows, dim=-1).view_as(x).to(x.dtype)


def check(rung: Rung, x: torch.Tensor, y: torch.Tensor) -> None:
    if rung.work == 0:
        torch.testing.assert_close(y, x, atol=0, rtol=0)
    else:  # bf16 keeping exp in shared memory rounds twice: one more bf16 step of slack
        torch.testing.assert_close(y, expected(rung, x), atol=1e-5, rtol=2e-2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="65536,262144", help="comma list of N")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--elems", type=int, default=2**27, help="elements a tensor")
    parser.add_argument("--rungs", default=",".join(RUNGS), help="comma list of rung names")
    parser.add_argument("--profile", action="store_true",
                        help="each rung's two checked calls and no timing (run under ncu)")
    args = parser.parse_args(argv)
    if gluon is None or not torch.cuda.is_available():
        print("needs a CUDA GPU and a Triton with Gluon's Hopper modules")
        return 1
    names = args.rungs.split(",")
    unknown = [name for name in names if name not in RUNGS]
    if unknown:
        parser.error(f"unknown rungs {unknown}; known: {', '.join(RUNGS)}")
    if args.profile:  # nothing is timed: no copy to divide by
        copy_gbs = float("nan")
        print(f"# {torch.cuda.get_device_name()}; rows of {args.elems} elements; profile")
    else:
        copy_gbs = copy_bandwidth()
        print(f"# {torch.cuda.get_device_name()}; copy {copy_gbs:.0f} GB/s (1 GB, read + write); "
              f"rows of {args.elems} elements; % of that copy")  # fmt: skip
    for dtype_name in args.dtypes.split(","):
        for n in (int(v) for v in args.only.split(",")):
            x = torch.randn(args.elems // n, n, device="cuda", dtype=DTYPES[dtype_name])
            y = torch.empty_like(x)
            nbytes = 2 * x.numel() * x.element_size()

            def pct(ms: float, nbytes=nbytes) -> str:
                return f"{100 * nbytes / (ms * 1e-3) / 1e9 / copy_gbs:6.1f}"

            if args.profile:
                softmax(x, -1)
                print(f"{dtype_name} {x.shape[0]}x{n}: profile")
            else:
                same = bench_gpu(lambda x=x, y=y: y.copy_(x))
                shipped = bench_gpu(functools.partial(softmax, x, -1))
                print(f"{dtype_name} {x.shape[0]}x{n}: same-bytes copy {pct(same)}, shipped "
                      f"softmax() {pct(shipped)}")  # fmt: skip
            for name in names:
                rung = RUNGS[name]
                try:
                    run = Ladder(rung, x, y)
                    for _ in range(2):  # the second call runs on the workspace the first cleared
                        y.zero_()
                        run()
                        check(rung, x, y)
                    if args.profile:
                        print(f"  {name:<14} checked")
                        continue
                    ms = bench_gpu(run)
                    print(f"  {name:<14} {pct(ms)}  ({ms * 1e3:7.1f} us, {run.splits} splits, "
                          f"{run.registers} registers, {run.spills} spilled)")  # fmt: skip
                except Exception as exc:  # a rung that fails to build or check: say so, go on
                    print(f"  {name:<14} failed: {type(exc).__name__}: {str(exc)[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
