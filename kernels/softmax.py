"""Softmax over any dim of a tensor with any strides, forward and backward.

Softmax is memory-bound: the target is the copy bandwidth, reading each input once and writing
the output once. The designs share the work (kernels/notes/softmax.md has the measurements):

- tile: rows that fit on chip. A program holds a (BLOCK_ROWS, BLOCK_COLS) tile in registers,
  several short rows at once so each thread loads 16 bytes at a time; optionally persistent
  (a grid of SM count × programs per SM walking the tiles).
- split: longer rows are cut into chunks, one program per chunk. Each program reduces its chunk
  to a partial (max and sum of exp for the forward, y·dy for the backward) and publishes it in a
  workspace slot. "coop" (GPU): the program then waits, chunk still in registers, until every
  chunk of its row has published, combines the partials and writes its chunk, so the row is read
  once. Programs take their chunk from an atomic ticket, so chunks start in ticket order and a
  row's chunks are never left waiting on a chunk that cannot start (a row has fewer chunks than
  the GPU holds programs). "split2" (the interpreter, which runs programs one after another and
  cannot wait): one launch publishes, a second re-reads the row and writes it.
- smem (GPU, rows of unit column stride and 16-byte aligned starts): the coop protocol with
  each chunk held in shared memory instead of registers (kernels/softmax_smem.py, in Gluon), so
  an SM holds twice as many bytes of the row across the wait. The 16-bit forward and backward
  and the longest fp32 forward rows take it; other long rows keep coop.
- online: a loop over the row, read twice: the max and sum, then the write. With the whole row
  a step and the first read kept in L2 (evict_last), it is the forward of one-a-program rows of
  4-64 KB (Inductor's form: the second read comes from cache, so DRAM still sees one read);
  with shorter steps, the fallback for rows too long to split.
- band (a probe candidate, round 4): split2 launched band by band, each band's rows small
  enough to stay in L2 between its two launches, so x is read from DRAM once.

Rows are addressed through the tensor's own strides, so softmax over a middle dim or over a
sliced view needs no transposing copy.
"""

import functools
import inspect
import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels._common import (
    TUNING_CACHES,
    TUNING_LOG,
    Launcher,
    cdiv,
    check_same,
    check_tensor,
    direct,
    gpu_info,
    gpu_ms_flushed,
    is_interpreter,
    next_power_of_2,
)
from kernels._coop import _nanosleep, _pack, _unpack

try:  # Gluon is experimental in Triton: a release without this API leaves long rows on coop
    from kernels import softmax_smem
except (ImportError, AttributeError):  # pragma: no cover - the pinned Tritons have it
    softmax_smem = None

# A tile program holds at most this many elements (16384 fp32 values over 16 warps is 32
# registers a thread); a longer row takes the split or online path. Tests lower it to reach
# those paths at small sizes.
ONE_PASS_MAX_ELEMS = 16384
# Short rows share a tile program until its tile of each input holds this many bytes (capped
# by ONE_PASS_MAX_ELEMS): 4096 fp32 or 8192 bf16 values, 4 warps in the forward and 8 in the
# backward (round 2 of the probe: kernels/notes/softmax.md).
TILE_BYTES = 16384
# Forward rows of at most SMALL_TILE_MAX_COLS[itemsize] columns fill tiles of
# SMALL_TILE_BYTES[itemsize] on SMALL_TILE_WARPS[itemsize] warps instead, without masks and with
# 32-bit offsets where the rows allow (Config.even, Config.int32). fp32: 4 KB on 4 warps (probe
# 12, rows of 2^27 elements, N = 128 / 512 / 1024, H100 then H200: 99.0 / 99.4 / 99.5 and 98.5 /
# 99.0 / 98.9% of copy against 98.4 / 99.3 / 98.5 and 97.0 / 96.5 / 96.7 for 16 KB). 16-bit: 2
# KB on 2 warps, 32 bytes a thread (probes 15-16, bf16 N = 128 / 512 / 1024, H200: 96.8-97.5 /
# 96.8-97.6 / 97.2-97.4 against the 4 KB / 8 KB / 16 KB tiles' 97.3 / 93.3 / 95.1; H100 level,
# 0.1826-0.1834 ms against 0.1825-0.1832). The H100 ran 0.5% faster with 16 bytes a thread
# (1-2 KB on 2-4 warps) where the H200 fell to 77-92% of copy: kernels/notes/softmax.md round 14.
SMALL_TILE_BYTES = {2: 2048, 4: 4096}
SMALL_TILE_WARPS = {2: 2, 4: 4}
SMALL_TILE_MAX_COLS = {2: 1024, 4: 1024}
# Forward rows of one a program from ROW_LOOP_MIN_COLS[itemsize] columns (up to the tile's
# ONE_PASS_MAX_ELEMS) take Inductor's looped form with the whole row a step (the online kernel,
# block_cols = the padded row): max and sum over one load kept in L2 (evict_last), then the row
# loaded again from cache and written (evict_first). Holding nothing across the reduction, a
# program needs fewer registers than the tile. Probe round 13 (rows of 2^27 elements, % of copy,
# this form / the tile / Inductor's best), H100: fp32 N = 1024 100.2 / 99.5 / 99.5, 4096 100.2 /
# 99.3 / 100.5, 16384 100.0 / 98.1 / 99.3; bf16 4096 98.6 / 97.7 / 68.7, 16384 98.4 / 97.4 /
# 69.5; bf16 1024 (2 KB a row) lost, 92.3 against 97.8. H200: bf16 4096 96.3 / 95.3 / 50.6,
# 16384 94.5 / 85.7 / 50.1.
ROW_LOOP_MIN_COLS = {2: 4096, 4: 1024}
# Chunk of one coop/split program: 4096 values, 4 warps; the backward over rows that are not
# one-a-program (adjacent rows, softmax over an outer dim) takes 16 KB of each input. The
# 16-bit backward holds its chunk as int32 pairs (Config.pairs; round 9: 85.5 / 80.9% of copy
# at N = 65536 / 262144 against 81.3 / 76.8 for the plain kernel's 16 KB chunks).
SPLIT_CHUNK_ELEMS = 4096
BWD_SPLIT_CHUNK_BYTES = 16384
SPLIT_WARPS = 4
# At most this many chunks per row (longer rows take longer chunks, up to ONE_PASS_MAX_ELEMS,
# then the online loop): the cooperative wait needs every chunk of a row resident at once,
# and 132 SMs hold at least one program each.
MAX_SPLIT_CHUNKS = 128
# Register cap of the fp32 coop forward on a GPU for rows of more than COOP_CAP_MIN_CHUNKS
# chunks: ptxas (sm_90) gives it 62 registers at N = 262144 (64 chunks a row; the slot
# gather's vector grows with the chunks), one program an SM fewer than at 56, which it fits
# without spilling (Triton 3.6 and 3.8); probe 9b: 87.1 -> 88.3% of copy. The bf16 forward
# gained more from a cap of 48 (68.0 -> 70.7) but spills 4 bytes under Triton 3.8's ptxas
# (tests/test_resources.py), so it is not capped. At 16 chunks (N = 65536) no cap: level.
COOP_FORWARD_MAXNREG = {4: 56}
COOP_CAP_MIN_CHUNKS = 16
# Tile of the online loop: big enough to keep many loads in flight per program.
LOOP_TILE_ELEMS = 4096
# smem design: the forward's chunk in shared memory, SMEM_PROGRAM_BYTES a program and
# SMEM_WARPS warps per SMEM_CHUNK_ELEMS values (round 10); the backward's persistent kernels,
# two buffers of SMEM_BUFFER_BYTES of y and of dy a program, SMEM_WARPS warps a buffer (round
# 11); and the most shared memory a program may take once long rows grow the chunk
SMEM_PROGRAM_BYTES = 32768
SMEM_BUFFER_BYTES = 16384
SMEM_CHUNK_ELEMS = 8192
SMEM_WARPS = 4
SMEM_MAX_BYTES = 131072
# the persistent smem kernels' programs an SM (Config.per_sm = -1): the shared memory an SM has
# (H100 and H200: 228 KB), and what a program takes beside its buffers (the 1 KB the driver
# reserves a block, the reductions' scratch)
SMEM_PER_SM = 233472
SMEM_PROGRAM_EXTRA = 2048
SMEM_ARCH_MAJOR = 9  # compute capability 9.x (Hopper): where the smem design was measured
# Register cap of the one-shot smem forward with chunks by program id (Config.by_pid) on 8
# warps or more: with leaving (round 20) and no masks, ptxas (sm_90, Triton 3.6, offline) takes
# 46-48 registers uncapped, 5 programs of 8 warps an SM; at 40, 6 as with the atomic ticket,
# spilling nothing. 4 warps take 40-44 uncapped: 6 programs, no cap.
SMEM_PID_MAXNREG = 40
# Lead programs of that forward (Config.lead, round 27): SMEM_LEAD_PER_SM an SM ahead of the
# chunks' programs, the k-th of an SM holding its slot k x SMEM_LEAD_NS ns, on grids of 32 KB
# programs at least SMEM_LEAD_MIN_PROGRAMS_PER_SM an SM (4 waves of 6): the last lead leaves
# after 6 us, which a smaller grid could wait for at its end
SMEM_LEAD_PER_SM = 4
SMEM_LEAD_NS = 1500
SMEM_LEAD_MIN_PROGRAMS_PER_SM = 24
# Softmax over an outer dim leaves neighbouring rows, not columns, adjacent in memory; a program
# then takes at least this many rows so each column load is one coalesced access across rows.
ADJACENT_ROWS = 32
# Persistent tile grids: programs per SM come from this register budget (see _programs_per_sm).
REGISTERS_PER_SM = 65536
MAX_WARPS_PER_SM = 64
# SM count used under the interpreter, small so the persistent loop runs several tiles.
INTERPRETER_SMS = 3
# The first call's choice (a GPU, a direct launch, not inside a CUDA-graph capture or a
# torch.compile trace): forward rows of up to SMALL_TILE_MAX_COLS columns time the pick beside
# tiles of TUNE_TILE_BYTES with one 16-byte access a thread, and keep the fastest for that shape
# (_tuned_config). The H100 and the H200 are both sm_90 with 132 SMs, and want different tiles
# there (probes 15-16, kernels/notes/softmax.md): the H100 0.5-0.8% faster with 16 bytes a
# thread, the H200 10-20 points of its copy slower; since round 24 the row loop on the tiles'
# blocks too (x read twice, the second time from L2), and the forward's row loop (the online
# design) times the pick beside Inductor's arithmetic and half the warps
# (_online_candidates): the H100 0.3% faster with the first at fp32 N = 4096, where that form
# runs 25% behind ours on the H200. KBENCH_SOFTMAX_TUNE=0 keeps the pick.
TUNE = os.environ.get("KBENCH_SOFTMAX_TUNE", "1") != "0"
# Smaller inputs keep the pick: their calls are launch-bound, and a choice (TUNE_ROUNDS rounds of
# TUNE_CALLS flushed calls a candidate) would cost more than it could save. From this size up,
# every pick fills the SMs with whole tiles, so the candidates are the same for every row count
# of one power of 2.
TUNE_MIN_BYTES = 8 * 2**20
TUNE_TILE_BYTES = (1024, 2048, 4096)
TUNE_ROUNDS = 5  # timing rounds over the candidates; each keeps its best round
TUNE_CALLS = 10  # calls a candidate a round, each timed alone after an L2 flush
TUNE_CPU_US_PER_CALL = 150.0  # the CPU path of one call, at most (call latency: 70-130 us)
# (device, dtype, columns, rows rounded up to a power of 2) -> the chosen Config
_TUNED: dict = {}
TUNING_CACHES.append(_TUNED)
# Round 25: softmax()'s host path took 110-130 us a call on the H100 machine at the `small`
# shapes (eager: 11 us), about two thirds of it in this module's dispatch (row dims, the pick,
# its checks, the index hints) and the rest in Triton's launch path (argument binding,
# specialization, the cache key). A direct launch of the tile and online kernels is remembered
# as a _LaunchPlan for its rows' shapes, strides, dtype, device and 16-byte alignment (what the
# dispatch and Triton's specialization read), and the next call with the same key launches
# the compiled kernel at once. Not remembered: a pick the first call would have timed but could
# not (inside a capture or a trace), and any launch through a wrapper (torch.compile's).
_PLANS: dict = {}
PLANS_MAX = 1024  # a cache of more keys is cleared, not grown
TUNING_CACHES.append(_PLANS)


class Config(NamedTuple):
    """How one launch covers the rows; _pick_config chooses it, the probe passes its own."""

    design: str  # "tile", "coop", "smem", "split2", "split2r", "band", "bandr" or "online"
    block_rows: int
    block_cols: int  # tile: the padded row; coop/smem/split2: the chunk; online: the loop tile
    num_warps: int
    # tile: persistent programs per SM, -1 from the register estimate, 0 = off; smem: the
    # persistent kernels (two chunk buffers a program), -1 as many as shared memory holds
    per_sm: int = 0
    num_stages: int = 1  # tile: pipelining of the persistent loop's loads; online: of both loops
    # -- round 3 knobs (kernels/notes/softmax.md); the defaults are the round 2 kernels --
    sleep_ns: int = 200  # coop/smem: nanosleep between polls of the partials, 0 = poll flat out
    counter: bool = False  # coop: poll one arrival counter per row, then read the slots once
    evict: bool = False  # evict_first on single-use loads/stores (online: evict_last, 1st read)
    # forward exp: 0 tl.exp (sub, mul, ex2 with denormal handling); 1 exp2((x - max)·log2e),
    # ftz; 2 exp2(x·log2e - max·log2e): one FMA + ex2, but the rounding of max·log2e is an
    # error relative to |max|, not |x - max| (4e-5 at max ~ 1000; no matter in 16-bit outputs)
    exp2: int = 0
    # coop/split2: > 0 loops over the chunk (block_cols values) in tiles of loop_cols, reading
    # it twice (softmax_split_loop_kernel); 0 holds the chunk in registers, read once
    loop_cols: int = 0
    # -- round 4 (kernels/notes/softmax.md) --
    # band/bandr: the split2 pair (partials, then finish) launched band by band, a band being
    # whole rows holding about band_bytes of input (all inputs: x, or y and dy), so the finish
    # launch re-reads the band from L2; with `evict`, the partials' loads are evict_last and
    # the finish's loads and stores evict_first. bandr runs each finish launch in reverse.
    band_bytes: int = 0
    # -- round 9 --
    # coop/split2 over 16-bit rows: load, hold and store each pair of neighbouring values as
    # one int32 (softmax_split_pairs_kernel), unpacked to fp32 only where the math needs them,
    # so a program holds its chunk in half the registers across the wait. Needs unit column
    # strides, an even row length and even row strides; other rows take the plain kernel.
    pairs: bool = False
    # coop/split2/smem: cap ptxas at this many registers a thread (0: no cap), to fit more
    # programs an SM; a cap below what the kernel needs spills
    maxnreg: int = 0
    # coop/split2 forward: hold exp(x - chunk max) across the wait instead of x, and write
    # it times exp(chunk max - row max) / row sum: one multiply a value after the wait instead
    # of a second exp (split2's finish launch recomputes it from x)
    rescale: bool = False
    # -- round 14 --
    # tile/online forward: no column or row masks where the rows fill the tile exactly
    # (n_cols == block_cols, rows_inner a multiple of block_rows), as Inductor's kernels at
    # N = R0_BLOCK; and 32-bit offsets where every tensor's extent fits in int32. even, round
    # 20: also the one-shot smem forward's (round 21: and backward's), where rows are whole chunks
    even: bool = False
    int32: bool = False
    # smem forward: the sum of exp taken as the pieces land (each piece's max raising the shift
    # and rescaling the running sum), not in a second pass over shared memory once all landed:
    # 1 (round 14) with a program-wide max a piece, 2 (round 17) each thread over its own values
    fold: int = 0
    # -- round 18 --
    # smem forward (one-shot kernel): the chunk's last `regs` pieces (a piece: 16 bytes a
    # thread) held in registers, loaded beside the copies into shared memory, so a program
    # holds more of the row than its shared memory: a power of 2 below the chunk's pieces
    regs: int = 0
    # -- round 19 --
    # smem one-shot kernels (the forward's; the backward's since round 21): the chunk is the
    # program id instead of an atomic ticket
    # taken at the program's start (a 2 us L2 round trip under load, with the program's shared
    # memory idle); a program that has polled its row long enough leaves its chunk to the row's
    # last publisher (round 20; round 19's fallback computed the missing partials instead), so
    # nothing relies on the order the GPU starts programs in
    by_pid: bool = False
    # by_pid: polls of its row after which a program leaves its chunk; 0:
    # softmax_smem.LEAVE_POLLS; -1: never (a probe of the protocol's cost only: the wait then
    # relies on the GPU starting programs in id order, as it does but does not promise)
    leave_polls: int = 0
    # -- round 21 --
    # smem one-shot forward, 16-bit: the exp2 of the write's odd pieces (1), and of the sum
    # pass's (2), on the FMA pipe (a cubic, 1e-4 relative; softmax_smem._exp2_poly), not the
    # MUFU, which two ex2 a value keep about half busy at the H200's copy rate in bf16. A probe
    # knob: it lost on the H200 (poly 1 about -2 points, poly 2 -11; kernels/notes/softmax.md)
    poly: int = 0
    # -- round 22 --
    # smem one-shot forward: the chunk copied in as one cp.async copy and one commit group, not
    # a copy and a group a piece, whose shared-memory hazards took a barrier a piece (20
    # barriers before the publish in the bf16 pick, 6 with it; sm_90, offline)
    one_copy: bool = False
    # online forward with evict: the stores take the default policy, not evict_first (as
    # Inductor's looped kernel, which an interleaved A/B run found 0.2% ahead at fp32 N = 4096)
    store_default: bool = False
    # -- round 23 --
    # one-shot smem forward by program id: the row's last publisher writes the chunks others
    # left (leave_polls) left_group pieces (16 bytes a thread each) a step, all loaded before any
    # is stored, not one at a time
    left_group: int = 1
    # tile/online forward, round 23's leaner index and loop code: where the rows have one outer
    # index (rows_outer == 1) the tile's rows come from its index with no integer division
    # (_tile_rows' ONE_OUTER), where a row is one step of the online loop (n_cols ==
    # block_cols) its two loops are straight code (ONE_STEP), and where rows are block_cols
    # apart the row stride is a constant (DENSE). False: the code before round 23 (a probe of
    # what it cost)
    lean: bool = True
    # online forward: Inductor's form of the first pass, a running max and sum per lane (the
    # tile's element) combined across the row once, and y = exp(x - max) / sum by a division
    # (a probe knob: Inductor's kernel runs 0.2% ahead of ours at fp32 N = 4096 on the H100);
    # round 24, each level with the ones below: 2 the write's exp is libdevice's expf, 3 so
    # are the first pass's, 4 the max is Inductor's (a select where a NaN wins): Inductor's
    # looped kernel's arithmetic throughout
    lanes: int = 0
    # -- round 26 --
    # one-shot smem forward, bf16: the sum pass and the write widen each 32-bit word of two
    # values by integer ops (a shift and a mask, one instruction a value), where ptxas gives
    # the high half's cvt.f32.bf16 two (PRMT, SHF); the sum pass starts from the first piece
    widen: bool = False
    # -- round 27 --
    # one-shot smem forward by program id: `lead` programs an SM ahead of the chunks' that only
    # hold their slots, the k-th of an SM for k x lead_ns ns (softmax_smem._lead_wait), so that
    # the first wave's chunk programs start fewer at a time and in turn (round 26: the whole
    # first wave loads at once, then computes at once, and no row writes before 9.5 us)
    lead: int = 0
    lead_ns: int = 0
    # with lead: the first tail_pf lead programs an SM each prefetch one of the grid's last
    # chunks into L2 with the evict_last priority (softmax_smem._prefetch_tail), so that the
    # launch's last rows load from L2 (round 27: their loads finish 4-6 us apart at the end). A
    # probe knob: level on the H200 (1-2 an SM), 4 an SM lost 1.5 points
    tail_pf: int = 0
    # -- round 28 --
    # one-shot smem forward by program id, where rows are whole chunks: a row's chunks
    # interleaved piece by piece (chunk k's piece p at the row's piece p x chunks + k), so that
    # the row's programs, which start together, read and write one contiguous span a step, not
    # pieces a chunk apart (the ladder's row_cp_il: +2.2 points in bf16 on the H200); elsewhere
    # (masked rows) the chunks stay whole
    interleave: bool = False


def softmax_reference(x: torch.Tensor, dim: int) -> torch.Tensor:
    # reads MN, writes MN: 2·MN·bytes
    x32 = x.float()
    exp = torch.exp(x32 - x32.amax(dim, keepdim=True))
    return (exp / exp.sum(dim, keepdim=True)).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_rows(tile, rows_inner, BLOCK_ROWS: tl.constexpr, INT32: tl.constexpr = False,
               ONE_OUTER: tl.constexpr = False):  # fmt: skip
    """Tile index -> one outer row index, BLOCK_ROWS consecutive inner ones, and their mask.

    Splitting the tile index rather than each row index keeps the inner indices an arange, so
    the compiler sees contiguous addresses when the inner row stride is 1. The indices are
    int64 unless INT32 (the caller knows every offset fits in 32 bits). ONE_OUTER: there is one
    outer index (rows_outer == 1), so no division: it put about 50 dependent instructions
    before a tile program's first load (sm_90 SASS of the fp32 N = 128 tile, against 9 in
    Inductor's kernel; round 23).
    """
    if ONE_OUTER:
        outer = tile * 0
        first = tile * BLOCK_ROWS
    else:
        blocks_per_outer = tl.cdiv(rows_inner, BLOCK_ROWS)
        outer = tile // blocks_per_outer
        first = (tile % blocks_per_outer) * BLOCK_ROWS
    if not INT32:
        outer = outer.to(tl.int64)
        first = first.to(tl.int64)
    inner = first + tl.arange(0, BLOCK_ROWS)
    return outer, inner, inner < rows_inner


@triton.jit
def _columns(BLOCK_COLS: tl.constexpr, INT32: tl.constexpr):
    """tl.arange(0, BLOCK_COLS) as a (1, BLOCK_COLS) row, int64 unless INT32."""
    cols = tl.arange(0, BLOCK_COLS)
    if not INT32:
        cols = cols.to(tl.int64)
    return cols[None, :]


@triton.jit
def _load_in(ptrs, ok, fill, POLICY: tl.constexpr, EVEN: tl.constexpr):
    """tl.load of ptrs where ok (fill elsewhere); EVEN: every lane is in range, no mask."""
    if EVEN:
        x = tl.load(ptrs, eviction_policy=POLICY)
    else:
        x = tl.load(ptrs, mask=ok, other=fill, eviction_policy=POLICY)
    return x


@triton.jit
def _store_out(ptrs, y, ok, POLICY: tl.constexpr, EVEN: tl.constexpr):
    """tl.store of y where ok; EVEN: every lane is in range, no mask."""
    if EVEN:
        tl.store(ptrs, y, eviction_policy=POLICY)
    else:
        tl.store(ptrs, y, mask=ok, eviction_policy=POLICY)


@triton.jit
def _split_position(ws_ptr, ticket_index, n_chunks, WAIT: tl.constexpr, REVERSE: tl.constexpr):
    """(row block, chunk) of this split program."""
    if WAIT:
        # Tickets are handed out in the order programs start: a row's chunks start together.
        ticket = tl.atomic_add(ws_ptr + ticket_index, 1).to(tl.int32)
    else:
        ticket = tl.program_id(0)
        if REVERSE:
            # the finishing launch walks back, so it starts on rows the first left in L2
            ticket = tl.num_programs(0) - 1 - ticket
    return ticket // n_chunks, ticket % n_chunks


@triton.jit
def _publish(slots, chunk, partial, counters, row_ok, COUNTER: tl.constexpr):
    """Publish this chunk's packed partial (never 0); with COUNTER, count its arrival too."""
    tl.atomic_xchg(slots + chunk, partial, mask=row_ok, sem="relaxed")
    if COUNTER:
        # release: the slot is written before the count goes up (the waiters check the
        # slots anyway, so the counter only decides when they start looking)
        tl.atomic_add(counters, 1, mask=row_ok, sem="release")


@triton.jit
def _wait_counters(counters, n_chunks, row_ok, SLEEP_NS: tl.constexpr):
    """Spin until every row's arrival counter reaches n_chunks: one word a row is polled."""
    count = tl.load(counters, mask=row_ok, other=n_chunks, volatile=True)
    missing = tl.sum(tl.where(count < n_chunks, 1, 0))
    while missing > 0:
        missing = _nanosleep(missing, SLEEP_NS)
        count = tl.load(counters, mask=row_ok, other=n_chunks, volatile=True)
        missing = tl.sum(tl.where(count < n_chunks, 1, 0))


@triton.jit
def _clear_for_next(next_ptr, ticket_index, block, chunk, row, n_chunks, row_ok,
                    COUNTER: tl.constexpr):  # fmt: skip
    """Zero, in the workspace the next coop launch on this stream takes (see _coop_workspace),
    the words this program's position owns: its rows' slots of its chunk, with COUNTER its
    rows' arrival counters (chunk 0), and the ticket counter (the first position). Every word
    of the workspace is owned by one position, so the launch leaves the next one all zeros
    without a memset kernel of its own."""
    zero = tl.zeros(row.shape, tl.int64)
    tl.store(next_ptr + row * n_chunks + chunk, zero, mask=row_ok)
    if COUNTER:
        tl.store(next_ptr + ticket_index + 1 + row, zero, mask=row_ok & (chunk == 0))
    first = (block == 0) & (chunk == 0)
    tl.store(next_ptr + ticket_index + tl.arange(0, 1), tl.zeros((1,), tl.int64), mask=first)


@triton.jit
def _split_partials(
    ws_ptr, row, n_chunks, row_ok, WAIT: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    SLEEP_NS: tl.constexpr,
):  # fmt: skip
    """Gather the packed partials of each row (waiting until all are published if WAIT).

    Row r's slots start at ws_ptr + r * n_chunks. Returns a (BLOCK_ROWS, MAX_CHUNKS) int64 tile
    of packed partials, 0 where masked; for one row, a (MAX_CHUNKS,) vector instead: a
    (1, MAX_CHUNKS) tile takes layouts that give every thread all of its slots (232 registers
    a thread for the backward at 32 chunks a row), a vector one slot a thread. A published
    partial is never 0 (see the callers), so 0 marks a slot not yet written; the volatile loads
    go to memory each time round the loop.
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


LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp_shifted(x, shift, EXP2: tl.constexpr):
    """exp(x - shift[:, None]), as Config.exp2 chooses (0, 1 or 2; see there).

    Every way, -inf entries give 0 and a shift of -inf (an all -inf row) gives NaN.
    """
    if EXP2 == 2:
        return tl.exp2(x * LOG2E - (shift * LOG2E)[:, None])
    elif EXP2 == 1:
        return tl.exp2((x - shift[:, None]) * LOG2E)
    else:
        return tl.exp(x - shift[:, None])


@triton.jit
def _row_partials(
    ws_ptr, row, counters, n_chunks, row_ok,
    PHASE: tl.constexpr, COUNTER: tl.constexpr, SLEEP_NS: tl.constexpr, MAX_CHUNKS: tl.constexpr,
):  # fmt: skip
    """The packed partials of each row (_split_partials), once all are published if PHASE 2
    (with COUNTER, first waiting on the rows' arrival counters)."""
    if COUNTER and PHASE == 2:
        _wait_counters(counters, n_chunks, row_ok, SLEEP_NS)
    return _split_partials(ws_ptr, row, n_chunks, row_ok, PHASE == 2, MAX_CHUNKS, SLEEP_NS)


@triton.jit
def _forward_row_stats(
    ws_ptr, row, counters, n_chunks, row_ok,
    PHASE: tl.constexpr, COUNTER: tl.constexpr, SLEEP_NS: tl.constexpr, MAX_CHUNKS: tl.constexpr,
):  # fmt: skip
    """(row max, row sum of exp(x - row max)) from the chunks' partials (waiting if PHASE 2)."""
    packed = _row_partials(
        ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
    )
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
def _backward_row_dot(
    ws_ptr, row, counters, n_chunks, row_ok,
    PHASE: tl.constexpr, COUNTER: tl.constexpr, SLEEP_NS: tl.constexpr, MAX_CHUNKS: tl.constexpr,
):  # fmt: skip
    """Row sum of y·dy from the chunks' partials (waiting if PHASE 2), as _forward_row_stats."""
    packed = _row_partials(
        ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
    )
    dots, _ = _unpack(packed)
    return _chunk_sum(dots, row_ok)


@triton.jit
def _row_workspace(
    ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner, rows_inner, n_chunks, row_ok,
    COUNTER: tl.constexpr, CLEAR: tl.constexpr,
):  # fmt: skip
    """(row index, its slots, its arrival counter) in a split program's workspace: row r's
    slots start at r * n_chunks, the ticket sits after all slots, and with COUNTER row r's
    arrival counter after the ticket (coop only). With CLEAR, also zeroes this program's words
    of the next launch's workspace (_clear_for_next)."""
    row = outer * rows_inner + inner
    slots = ws_ptr + row * n_chunks
    counters = ws_ptr + ticket_index + 1 + row
    if CLEAR:
        _clear_for_next(next_ptr, ticket_index, block, chunk, row, n_chunks, row_ok, COUNTER)
    return row, slots, counters


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------
@triton.jit
def _tile_forward(
    tile, cols, col_ok, x_ptr, y_ptr, rows_inner,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    BLOCK_ROWS: tl.constexpr, POLICY: tl.constexpr, EXP2: tl.constexpr, EVEN: tl.constexpr,
    INT32: tl.constexpr, ONE_OUTER: tl.constexpr,
):  # fmt: skip
    """softmax_tile_kernel's work on one tile (cols: _columns, col_ok: cols < n_cols)."""
    outer, inner, row_ok = _tile_rows(tile, rows_inner, BLOCK_ROWS, INT32, ONE_OUTER)
    row_ok = row_ok[:, None]
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    # Masked columns read -inf, which exp turns into 0. Rows past the end read 0 instead: an
    # all -inf row would compute NaNs (never stored, but the interpreter warns about them).
    fill = tl.where(row_ok, -float("inf"), 0.0)
    ok = row_ok & col_ok
    x = _load_in(x_rows + cols * x_stride_col, ok, fill, POLICY, EVEN).to(tl.float32)
    # A row of only -inf gives -inf - -inf = NaN everywhere, as torch.softmax does.
    exp = _exp_shifted(x, tl.max(x, axis=1), EXP2)
    y = (exp * (1.0 / tl.sum(exp, axis=1))[:, None]).to(y_ptr.dtype.element_ty)
    _store_out(y_rows + cols * y_stride_col, y, ok, POLICY, EVEN)


@triton.jit
def softmax_tile_kernel(
    x_ptr, y_ptr,
    # sizes: rows are indexed (outer, inner), inner < rows_inner; each is n_cols long
    rows_inner, n_cols, n_tiles,
    # strides, in elements: outer row dim, inner row dim, column
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr,
    POLICY: tl.constexpr = "", EXP2: tl.constexpr = False,
    # EVEN: n_cols == BLOCK_COLS and rows_inner % BLOCK_ROWS == 0 (no masks); INT32: every
    # offset fits in 32 bits (otherwise int64, so that column × stride cannot overflow when
    # softmax runs over an outer dim)
    EVEN: tl.constexpr = False, INT32: tl.constexpr = False,
    # ONE_OUTER: rows_outer == 1 (_tile_rows); PERSISTENT: fewer programs than tiles, each
    # walking the tiles (otherwise a program is its tile, no loop: round 23); DENSE: x's and
    # y's rows are BLOCK_COLS apart, so the row stride is a constant (round 23)
    ONE_OUTER: tl.constexpr = False, PERSISTENT: tl.constexpr = True,
    DENSE: tl.constexpr = False,
):  # fmt: skip
    if DENSE:
        x_stride_inner = BLOCK_COLS
        y_stride_inner = BLOCK_COLS
    cols = _columns(BLOCK_COLS, INT32)
    col_ok = cols < n_cols
    if PERSISTENT:  # the grid walks the tiles
        for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0),
                             num_stages=NUM_STAGES):  # fmt: skip
            _tile_forward(tile, cols, col_ok, x_ptr, y_ptr, rows_inner, x_stride_outer,
                          x_stride_inner, x_stride_col, y_stride_outer, y_stride_inner,
                          y_stride_col, BLOCK_ROWS, POLICY, EXP2, EVEN, INT32,
                          ONE_OUTER)  # fmt: skip
    else:
        _tile_forward(tl.program_id(0), cols, col_ok, x_ptr, y_ptr, rows_inner,
                      x_stride_outer, x_stride_inner, x_stride_col, y_stride_outer,
                      y_stride_inner, y_stride_col, BLOCK_ROWS, POLICY, EXP2, EVEN, INT32,
                      ONE_OUTER)  # fmt: skip


@triton.jit
def softmax_split_kernel(
    x_ptr, y_ptr, ws_ptr,
    rows_inner, n_cols, n_chunks, ticket_index,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    # 0: publish partials only, 1: finish only (partials from an earlier launch), 2: both (coop)
    PHASE: tl.constexpr, REVERSE: tl.constexpr,
    SLEEP_NS: tl.constexpr = 200, COUNTER: tl.constexpr = False,
    POLICY: tl.constexpr = "", EXP2: tl.constexpr = False, RESCALE: tl.constexpr = False,
    CLEAR: tl.constexpr = False, next_ptr=None,
):  # fmt: skip
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2, REVERSE)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    fill = tl.where(row_ok, -float("inf"), 0.0)[:, None]
    x = tl.load(
        x_rows + cols[None, :] * x_stride_col, mask=mask, other=fill, eviction_policy=POLICY
    ).to(tl.float32)
    row, slots, counters = _row_workspace(
        ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner, rows_inner, n_chunks, row_ok,
        COUNTER, CLEAR,
    )  # fmt: skip

    if PHASE != 1 or RESCALE:
        chunk_max = tl.max(x, axis=1)
        # An all -inf chunk shifts by 0: its sum is 0, not NaN; its max (-inf) keeps it nonzero
        # when packed. Any other chunk's sum is at least 1, so no packed partial is 0.
        shift = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
        exp = _exp_shifted(x, shift, EXP2)
    if PHASE != 1:
        partial = _pack(chunk_max, tl.sum(exp, axis=1))
        _publish(slots, chunk, partial, counters, row_ok, COUNTER and PHASE == 2)
    if PHASE != 0:
        row_max, row_sum = _forward_row_stats(
            ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
        )
        if RESCALE:
            # exp(x - shift) * exp(shift - row max) / row sum; an all -inf chunk scales its 0s
            # by 0 (exp(0 - row max) may overflow), and an all -inf row keeps row_sum's NaN
            scale = tl.where(chunk_max == -float("inf"), 0.0, tl.exp(shift - row_max)) / row_sum
            y = exp * scale[:, None]
        else:
            y = _exp_shifted(x, row_max, EXP2) * (1.0 / row_sum)[:, None]
        y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
        tl.store(
            y_rows + cols[None, :] * y_stride_col, y.to(y_ptr.dtype.element_ty), mask=mask,
            eviction_policy=POLICY,
        )  # fmt: skip


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
def softmax_split_pairs_kernel(
    x_ptr, y_ptr, ws_ptr,
    # as softmax_split_kernel, counted in int32 pairs: n_cols and the strides are halved
    rows_inner, n_cols, n_chunks, ticket_index,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    PHASE: tl.constexpr, REVERSE: tl.constexpr,
    SLEEP_NS: tl.constexpr = 200, COUNTER: tl.constexpr = False,
    POLICY: tl.constexpr = "", EXP2: tl.constexpr = False, HALF: tl.constexpr = 1,
    CLEAR: tl.constexpr = False, next_ptr=None,
):  # fmt: skip
    """softmax_split_kernel over 16-bit rows held as int32 pairs (Config.pairs): x_ptr and y_ptr
    are the 16-bit tensors viewed as int32, CHUNK pairs a chunk."""
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2, REVERSE)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    # masked columns read two -inf values: 0xFF80FF80 (bf16) or 0xFC00FC00 (fp16) as int32
    if HALF == 1:
        neg_inf_pair = -8323200
    else:
        neg_inf_pair = -67044352
    fill = tl.where(row_ok, neg_inf_pair, 0)[:, None]
    pairs = tl.load(
        x_rows + cols[None, :] * x_stride_col, mask=mask, other=fill, eviction_policy=POLICY
    )
    row, slots, counters = _row_workspace(
        ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner, rows_inner, n_chunks, row_ok,
        COUNTER, CLEAR,
    )  # fmt: skip

    if PHASE != 1:
        first, second = _unpair(pairs, HALF)
        chunk_max = tl.maximum(tl.max(first, axis=1), tl.max(second, axis=1))
        # as in softmax_split_kernel: an all -inf chunk shifts by 0, no packed partial is 0
        shift = tl.where(chunk_max == -float("inf"), 0.0, chunk_max)
        # unpacked afresh, so that the fp32 values need not live from the max to the sum
        first, second = _unpair(_reload(pairs, chunk_max), HALF)
        chunk_sum = tl.sum(_exp_shifted(first, shift, EXP2), axis=1) + tl.sum(
            _exp_shifted(second, shift, EXP2), axis=1
        )
        _publish(
            slots, chunk, _pack(chunk_max, chunk_sum), counters, row_ok, COUNTER and PHASE == 2
        )
    if PHASE != 0:
        row_max, row_sum = _forward_row_stats(
            ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
        )
        first, second = _unpair(_reload(pairs, row_sum), HALF)
        inv_sum = (1.0 / row_sum)[:, None]
        y = _pair(
            _exp_shifted(first, row_max, EXP2) * inv_sum,
            _exp_shifted(second, row_max, EXP2) * inv_sum,
            HALF,
        )
        y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
        tl.store(y_rows + cols[None, :] * y_stride_col, y, mask=mask, eviction_policy=POLICY)


@triton.jit
def softmax_split_loop_kernel(
    x_ptr, y_ptr, ws_ptr,
    rows_inner, n_cols, n_chunks, ticket_index,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    PHASE: tl.constexpr, REVERSE: tl.constexpr,
    SLEEP_NS: tl.constexpr, COUNTER: tl.constexpr,
    POLICY: tl.constexpr, EXP2: tl.constexpr,
    LOOP_COLS: tl.constexpr, FIRST_POLICY: tl.constexpr,
):  # fmt: skip
    """The split design with chunks longer than the registers hold: each program loops over
    its chunk in tiles of LOOP_COLS twice (online max/sum, then the write), so x is read
    twice, but the second read is of a chunk read a moment earlier, meant to hit L2
    (FIRST_POLICY = evict_last asks L2 to keep it). Partials, waiting and combining as in
    softmax_split_kernel."""
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2, REVERSE)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    fill = tl.where(row_ok, -float("inf"), 0.0)[:, None]
    first = chunk.to(tl.int64) * CHUNK
    end = tl.minimum(first + CHUNK, n_cols)
    offs = tl.arange(0, LOOP_COLS).to(tl.int64)
    row, slots, counters = _row_workspace(
        ws_ptr, None, ticket_index, block, chunk, outer, inner, rows_inner, n_chunks, row_ok,
        COUNTER, False,
    )  # fmt: skip
    if PHASE != 1:
        chunk_max = tl.full((BLOCK_ROWS,), -float("inf"), tl.float32)
        chunk_sum = tl.zeros((BLOCK_ROWS,), tl.float32)
        for start in range(0, CHUNK, LOOP_COLS):
            cols = first + start + offs
            mask = row_ok[:, None] & (cols < end)[None, :]
            x = tl.load(
                x_rows + cols[None, :] * x_stride_col, mask=mask, other=fill,
                eviction_policy=FIRST_POLICY,
            ).to(tl.float32)  # fmt: skip
            new_max = tl.maximum(chunk_max, tl.max(x, axis=1))
            # shift by 0 until a finite value is seen (see softmax_online_kernel)
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)
            chunk_sum = chunk_sum * tl.exp(chunk_max - shift) + tl.sum(
                _exp_shifted(x, shift, EXP2), axis=1
            )
            chunk_max = new_max
        # as in softmax_split_kernel: an all -inf chunk has sum 0 and max -inf (nonzero bits)
        _publish(
            slots, chunk, _pack(chunk_max, chunk_sum), counters, row_ok, COUNTER and PHASE == 2
        )
    if PHASE != 0:
        row_max, row_sum = _forward_row_stats(
            ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
        )
        inv_sum = (1.0 / row_sum)[:, None]
        for start in range(0, CHUNK, LOOP_COLS):
            cols = first + start + offs
            mask = row_ok[:, None] & (cols < end)[None, :]
            x = tl.load(
                x_rows + cols[None, :] * x_stride_col, mask=mask, other=fill,
                eviction_policy=POLICY,
            ).to(tl.float32)  # fmt: skip
            y = _exp_shifted(x, row_max, EXP2) * inv_sum
            tl.store(
                y_rows + cols[None, :] * y_stride_col, y.to(y_ptr.dtype.element_ty), mask=mask,
                eviction_policy=POLICY,
            )  # fmt: skip


@triton.jit
def _max_nan(a, b):
    """max(a, b) where a NaN wins, as Inductor's `maximum` (a select, not FMNMX)."""
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _lane_max(a, b, NAN: tl.constexpr):
    if NAN:
        return _max_nan(a, b)
    else:
        return tl.maximum(a, b)


@triton.jit
def _lane_exp(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:  # expf (Inductor's exp where fast math is off)
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def softmax_online_kernel(
    x_ptr, y_ptr,
    rows_inner, n_cols,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr = 1,
    # the first read keeps x in L2 for the second (FIRST_POLICY), which may drop it (POLICY)
    FIRST_POLICY: tl.constexpr = "", POLICY: tl.constexpr = "", EXP2: tl.constexpr = False,
    # as the tile kernel's; EVEN here: n_cols a multiple of BLOCK_COLS
    EVEN: tl.constexpr = False, INT32: tl.constexpr = False,
    # the stores' policy (the host passes POLICY's unless Config.store_default)
    STORE_POLICY: tl.constexpr = "",
    # ONE_OUTER and DENSE: as the tile kernel's; ONE_STEP: n_cols == BLOCK_COLS, so each loop
    # is one step of known bounds, straight code (round 23)
    ONE_OUTER: tl.constexpr = False, ONE_STEP: tl.constexpr = False,
    DENSE: tl.constexpr = False,
    # LANES (Config.lanes): the first pass keeps a running max and sum per lane, not per row
    LANES: tl.constexpr = 0,
    # LANES >= 2 call libdevice's exp where LIBDEVICE; the host passes False under the Triton
    # interpreter, which has no extern calls (tl.exp there, the rest of the kernel the same)
    LIBDEVICE: tl.constexpr = True,
):  # fmt: skip
    # where libdevice's exp is called: the first pass from LANES 3, the write from 2
    FIRST_LIBDEVICE: tl.constexpr = LANES >= 3 and LIBDEVICE
    WRITE_LIBDEVICE: tl.constexpr = LANES >= 2 and LIBDEVICE
    if DENSE:
        x_stride_inner = BLOCK_COLS
        y_stride_inner = BLOCK_COLS
    outer, inner, row_ok = _tile_rows(tl.program_id(0), rows_inner, BLOCK_ROWS, INT32, ONE_OUTER)
    row_ok = row_ok[:, None]
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    cols = _columns(BLOCK_COLS, INT32)
    fill = tl.where(row_ok, -float("inf"), 0.0)
    end = n_cols
    if ONE_STEP:  # bounds the compiler knows: each loop folds to its one step
        end = BLOCK_COLS
    if LANES:  # each lane's own running max and sum, combined across the row once at the end
        lane_max = tl.full((BLOCK_ROWS, BLOCK_COLS), -float("inf"), tl.float32)
        lane_sum = tl.zeros((BLOCK_ROWS, BLOCK_COLS), tl.float32)
        for start in tl.range(0, end, BLOCK_COLS, num_stages=NUM_STAGES):
            ok = row_ok & (start + cols < n_cols)
            x = _load_in(x_rows + (start + cols) * x_stride_col, ok, fill, FIRST_POLICY, EVEN)
            x = x.to(tl.float32)
            new_max = _lane_max(lane_max, x, LANES >= 4)
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # as below
            lane_sum = (lane_sum * _lane_exp(lane_max - shift, FIRST_LIBDEVICE)
                        + _lane_exp(x - shift, FIRST_LIBDEVICE))  # fmt: skip
            lane_max = new_max
        if LANES >= 4:
            row_max = tl.reduce(lane_max, 1, _max_nan)
        else:
            row_max = tl.max(lane_max, axis=1)
        shift = tl.where(row_max == -float("inf"), 0.0, row_max)
        row_sum = tl.sum(lane_sum * _lane_exp(lane_max - shift[:, None], FIRST_LIBDEVICE),
                         axis=1)  # fmt: skip
    else:
        # -- main loop: online softmax, running max and a sum rescaled whenever the max grows --
        row_max = tl.full((BLOCK_ROWS,), -float("inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_ROWS,), tl.float32)
        for start in tl.range(0, end, BLOCK_COLS, num_stages=NUM_STAGES):
            ok = row_ok & (start + cols < n_cols)
            x = _load_in(x_rows + (start + cols) * x_stride_col, ok, fill, FIRST_POLICY, EVEN)
            x = x.to(tl.float32)
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            # Until a row has seen a finite value, shift by 0 rather than -inf: exp(-inf - 0) =
            # 0 keeps the sum at 0, where exp(-inf - -inf) would poison it with NaN.
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)
            row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(_exp_shifted(x, shift, EXP2),
                                                                 axis=1)  # fmt: skip
            row_max = new_max
    # -- write-back: second read of the row --
    # An all -inf row keeps row_max = -inf, so exp(x - row_max) is NaN, matching torch.
    inv_sum = 1.0 / row_sum
    for start in tl.range(0, end, BLOCK_COLS, num_stages=NUM_STAGES):
        ok = row_ok & (start + cols < n_cols)
        x = _load_in(x_rows + (start + cols) * x_stride_col, ok, fill, POLICY, EVEN)
        if LANES:  # a true division, as Inductor's (and from 2, libdevice's expf)
            y = _lane_exp(x.to(tl.float32) - row_max[:, None], WRITE_LIBDEVICE)
            y = y / row_sum[:, None]
        else:
            y = _exp_shifted(x.to(tl.float32), row_max, EXP2) * inv_sum[:, None]
        y = y.to(y_ptr.dtype.element_ty)
        _store_out(y_rows + (start + cols) * y_stride_col, y, ok, STORE_POLICY, EVEN)


# ---------------------------------------------------------------------------------------------
# Backward: dx = y * (dy - sum(y * dy)) along each row
# ---------------------------------------------------------------------------------------------
@triton.jit
def softmax_backward_tile_kernel(
    y_ptr, dy_ptr, dx_ptr,
    rows_inner, n_cols, n_tiles,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr,
    POLICY: tl.constexpr = "", EXP2: tl.constexpr = False,  # EXP2: unused (forward only)
):  # fmt: skip
    cols = tl.arange(0, BLOCK_COLS).to(tl.int64)[None, :]
    col_ok = cols < n_cols
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=NUM_STAGES):
        outer, inner, row_ok = _tile_rows(tile, rows_inner, BLOCK_ROWS)
        mask = row_ok[:, None] & col_ok
        y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
        dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
        dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
        y = tl.load(y_rows + cols * y_stride_col, mask=mask, other=0.0, eviction_policy=POLICY)
        dy = tl.load(dy_rows + cols * dy_stride_col, mask=mask, other=0.0, eviction_policy=POLICY)
        y, dy = y.to(tl.float32), dy.to(tl.float32)
        dx = y * (dy - tl.sum(y * dy, axis=1)[:, None])
        tl.store(
            dx_rows + cols * dx_stride_col, dx.to(dx_ptr.dtype.element_ty), mask=mask,
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
    PHASE: tl.constexpr, REVERSE: tl.constexpr,
    SLEEP_NS: tl.constexpr = 200, COUNTER: tl.constexpr = False,
    POLICY: tl.constexpr = "", EXP2: tl.constexpr = False,  # EXP2: unused (forward only)
    CLEAR: tl.constexpr = False, next_ptr=None,
):  # fmt: skip
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2, REVERSE)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    y = tl.load(
        y_rows + cols[None, :] * y_stride_col, mask=mask, other=0.0, eviction_policy=POLICY
    ).to(tl.float32)
    dy = tl.load(
        dy_rows + cols[None, :] * dy_stride_col, mask=mask, other=0.0, eviction_policy=POLICY
    ).to(tl.float32)
    row, slots, counters = _row_workspace(
        ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner, rows_inner, n_chunks, row_ok,
        COUNTER, CLEAR,
    )  # fmt: skip

    if PHASE != 1:
        # the dot product packed with 1.0 beside it, so a published partial is never 0
        dot = tl.sum(y * dy, axis=1)
        partial = _pack(dot, tl.full(dot.shape, 1.0, tl.float32))
    if PHASE != 1:
        _publish(slots, chunk, partial, counters, row_ok, COUNTER and PHASE == 2)
    if PHASE != 0:
        row_dot = _backward_row_dot(
            ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
        )
        dx = y * (dy - row_dot[:, None])
        dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
        tl.store(
            dx_rows + cols[None, :] * dx_stride_col, dx.to(dx_ptr.dtype.element_ty), mask=mask,
            eviction_policy=POLICY,
        )  # fmt: skip


@triton.jit
def softmax_backward_split_pairs_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr,
    rows_inner, n_cols, n_chunks, ticket_index,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    PHASE: tl.constexpr, REVERSE: tl.constexpr,
    SLEEP_NS: tl.constexpr = 200, COUNTER: tl.constexpr = False,
    POLICY: tl.constexpr = "", EXP2: tl.constexpr = False, HALF: tl.constexpr = 1,
    CLEAR: tl.constexpr = False, next_ptr=None,
):  # fmt: skip
    """softmax_backward_split_kernel over 16-bit rows held as int32 pairs (Config.pairs), as
    softmax_split_pairs_kernel."""
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2, REVERSE)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    cols = chunk.to(tl.int64) * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = row_ok[:, None] & (cols < n_cols)[None, :]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    y_pairs = tl.load(
        y_rows + cols[None, :] * y_stride_col, mask=mask, other=0, eviction_policy=POLICY
    )
    dy_pairs = tl.load(
        dy_rows + cols[None, :] * dy_stride_col, mask=mask, other=0, eviction_policy=POLICY
    )
    row, slots, counters = _row_workspace(
        ws_ptr, next_ptr, ticket_index, block, chunk, outer, inner, rows_inner, n_chunks, row_ok,
        COUNTER, CLEAR,
    )  # fmt: skip

    if PHASE != 1:
        y_first, y_second = _unpair(y_pairs, HALF)
        dy_first, dy_second = _unpair(dy_pairs, HALF)
        dot = tl.sum(y_first * dy_first, axis=1) + tl.sum(y_second * dy_second, axis=1)
        # packed with 1.0 beside it, so a published partial is never 0
        partial = _pack(dot, tl.full(dot.shape, 1.0, tl.float32))
        _publish(slots, chunk, partial, counters, row_ok, COUNTER and PHASE == 2)
    if PHASE != 0:
        row_dot = _backward_row_dot(
            ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
        )
        y_first, y_second = _unpair(_reload(y_pairs, row_dot), HALF)
        dy_first, dy_second = _unpair(_reload(dy_pairs, row_dot), HALF)
        row_dot = row_dot[:, None]
        dx = _pair(y_first * (dy_first - row_dot), y_second * (dy_second - row_dot), HALF)
        dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
        tl.store(dx_rows + cols[None, :] * dx_stride_col, dx, mask=mask, eviction_policy=POLICY)


@triton.jit
def softmax_backward_split_loop_kernel(
    y_ptr, dy_ptr, dx_ptr, ws_ptr,
    rows_inner, n_cols, n_chunks, ticket_index,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    BLOCK_ROWS: tl.constexpr, CHUNK: tl.constexpr, MAX_CHUNKS: tl.constexpr,
    PHASE: tl.constexpr, REVERSE: tl.constexpr,
    SLEEP_NS: tl.constexpr, COUNTER: tl.constexpr,
    POLICY: tl.constexpr, EXP2: tl.constexpr,  # EXP2: unused (forward only)
    LOOP_COLS: tl.constexpr, FIRST_POLICY: tl.constexpr,
):  # fmt: skip
    """softmax_split_loop_kernel's backward: y·dy over the chunk, then dx, reading y, dy twice."""
    block, chunk = _split_position(ws_ptr, ticket_index, n_chunks, PHASE == 2, REVERSE)
    outer, inner, row_ok = _tile_rows(block, rows_inner, BLOCK_ROWS)
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
    first = chunk.to(tl.int64) * CHUNK
    end = tl.minimum(first + CHUNK, n_cols)
    offs = tl.arange(0, LOOP_COLS).to(tl.int64)
    row, slots, counters = _row_workspace(
        ws_ptr, None, ticket_index, block, chunk, outer, inner, rows_inner, n_chunks, row_ok,
        COUNTER, False,
    )  # fmt: skip
    if PHASE != 1:
        dot = tl.zeros((BLOCK_ROWS,), tl.float32)
        for start in range(0, CHUNK, LOOP_COLS):
            cols = first + start + offs
            mask = row_ok[:, None] & (cols < end)[None, :]
            y = tl.load(y_rows + cols[None, :] * y_stride_col, mask=mask, other=0.0,
                        eviction_policy=FIRST_POLICY).to(tl.float32)  # fmt: skip
            dy = tl.load(dy_rows + cols[None, :] * dy_stride_col, mask=mask, other=0.0,
                         eviction_policy=FIRST_POLICY).to(tl.float32)  # fmt: skip
            dot += tl.sum(y * dy, axis=1)
        partial = _pack(dot, tl.full(dot.shape, 1.0, tl.float32))
        _publish(slots, chunk, partial, counters, row_ok, COUNTER and PHASE == 2)
    if PHASE != 0:
        row_dot = _backward_row_dot(
            ws_ptr, row, counters, n_chunks, row_ok, PHASE, COUNTER, SLEEP_NS, MAX_CHUNKS
        )[:, None]
        for start in range(0, CHUNK, LOOP_COLS):
            cols = first + start + offs
            mask = row_ok[:, None] & (cols < end)[None, :]
            y = tl.load(y_rows + cols[None, :] * y_stride_col, mask=mask, other=0.0,
                        eviction_policy=POLICY).to(tl.float32)  # fmt: skip
            dy = tl.load(dy_rows + cols[None, :] * dy_stride_col, mask=mask, other=0.0,
                         eviction_policy=POLICY).to(tl.float32)  # fmt: skip
            dx = y * (dy - row_dot)
            tl.store(
                dx_rows + cols[None, :] * dx_stride_col, dx.to(dx_ptr.dtype.element_ty),
                mask=mask, eviction_policy=POLICY,
            )  # fmt: skip


@triton.jit
def softmax_backward_online_kernel(
    y_ptr, dy_ptr, dx_ptr,
    rows_inner, n_cols,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, NUM_STAGES: tl.constexpr = 1,
    FIRST_POLICY: tl.constexpr = "", POLICY: tl.constexpr = "", EXP2: tl.constexpr = False,
):  # fmt: skip
    outer, inner, row_ok = _tile_rows(tl.program_id(0), rows_inner, BLOCK_ROWS)
    row_ok = row_ok[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
    cols = tl.arange(0, BLOCK_COLS).to(tl.int64)[None, :]
    # -- main loop: the row's dot product y·dy --
    row_dot = tl.zeros((BLOCK_ROWS,), tl.float32)
    for start in tl.range(0, n_cols, BLOCK_COLS, num_stages=NUM_STAGES):
        col_ok = start + cols < n_cols
        ok = row_ok & col_ok
        y = tl.load(
            y_rows + (start + cols) * y_stride_col, mask=ok, other=0.0, eviction_policy=FIRST_POLICY
        )
        dy = tl.load(
            dy_rows + (start + cols) * dy_stride_col,
            mask=ok,
            other=0.0,
            eviction_policy=FIRST_POLICY,
        )
        row_dot += tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=1)
    # -- write-back --
    for start in tl.range(0, n_cols, BLOCK_COLS, num_stages=NUM_STAGES):
        col_ok = start + cols < n_cols
        ok = row_ok & col_ok
        y = tl.load(
            y_rows + (start + cols) * y_stride_col, mask=ok, other=0.0, eviction_policy=POLICY
        )
        dy = tl.load(
            dy_rows + (start + cols) * dy_stride_col, mask=ok, other=0.0, eviction_policy=POLICY
        )
        dx = y.to(tl.float32) * (dy.to(tl.float32) - row_dot[:, None])
        tl.store(
            dx_rows + (start + cols) * dx_stride_col,
            dx.to(dx_ptr.dtype.element_ty),
            mask=ok,
            eviction_policy=POLICY,
        )


_KERNELS = {
    False: {
        "tile": softmax_tile_kernel,
        "split": softmax_split_kernel,
        "split_loop": softmax_split_loop_kernel,
        "split_pairs": softmax_split_pairs_kernel,
        "online": softmax_online_kernel,
    },
    True: {
        "tile": softmax_backward_tile_kernel,
        "split": softmax_backward_split_kernel,
        "split_loop": softmax_backward_split_loop_kernel,
        "split_pairs": softmax_backward_split_pairs_kernel,
        "online": softmax_backward_online_kernel,
    },
}


# ---------------------------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------------------------
def _normalize_dim(dim, ndim: int, shape: tuple) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    rank = max(ndim, 1)  # torch lets a 0-d tensor use dim 0 or -1
    if not -rank <= dim < rank:
        raise ValueError(f"dim {dim} is out of range for a tensor of shape {shape}")
    return dim % rank


def _row_dims(moved: list[torch.Tensor]):
    """Merge the leading (row) dims of same-shaped tensors whose last dim is the softmax dim.

    Adjacent dims merge when every tensor's strides allow it, so one row index can address them
    all. Returns (sizes, strides) with sizes = (rows_outer, rows_inner) and strides[i] =
    (outer, inner, col) for moved[i], or None when more than two row dims are left.
    """
    shape = moved[0].shape
    groups = []  # [size, per-tensor stride] of each merged dim, outermost first
    for d, size in enumerate(shape[:-1]):
        if size == 1:
            continue  # a size-1 dim's stride never matters
        strides = [t.stride(d) for t in moved]
        if groups and all(prev == s * size for prev, s in zip(groups[-1][1], strides, strict=True)):
            groups[-1] = [groups[-1][0] * size, strides]
        else:
            groups.append([size, strides])
    if len(groups) > 2:
        return None
    while len(groups) < 2:
        groups.insert(0, [1, [0] * len(moved)])
    (outer, outer_strides), (inner, inner_strides) = groups
    strides = [
        (so, si, t.stride(-1))
        for so, si, t in zip(outer_strides, inner_strides, moved, strict=True)
    ]
    return (outer, inner), strides


def _sm_count(device: torch.device) -> int:
    info = gpu_info(device)
    return INTERPRETER_SMS if info is None else info.sms


def _programs_per_sm(tile_elems: int, num_warps: int, n_inputs: int) -> int:
    """Tile programs one SM holds at once, from an estimate of registers per thread.

    With e = tile_elems / threads values per thread, ptxas (sm_90, Triton 3.8) gave the tile
    kernels about e·(n_inputs + 0.5) + 24 registers: the loaded values, half as many again
    for the exp/products, and ~24 for addresses and indices (forward e=32: 52-83, e=64:
    111-122; backward e=32: 72-128, e=64: 163-185). Registers go in steps of 8 per thread
    out of 65536 per SM; the warp limit (64 per SM) caps it too. Shared memory is not
    counted: a pipelined loop stages a few tiles through it, well under 228 KB.
    """
    threads = 32 * num_warps
    per_thread = tile_elems // threads
    regs = -(-(per_thread * (2 * n_inputs + 1) // 2 + 24) // 8) * 8
    by_regs = REGISTERS_PER_SM // (threads * min(regs, 255))
    return max(1, min(by_regs, MAX_WARPS_PER_SM // num_warps))


def _warps_for(tile_bytes: int) -> int:
    # 128 bytes a thread: eight 16-byte loads in flight per thread (4 to 16 warps)
    return max(4, min(16, tile_bytes // (128 * 32)))


def _row_loop_warps(row_bytes: int) -> int:
    # probe round 13, % of copy: rows of up to 8 KB on 4 warps (bf16 4096: H200 96.3 against 85.6
    # on 8 warps and the tile's 95.3, H100 98.6 against 98.7); 16 KB rows on 16 (fp32 4096, H100:
    # 100.2 against 99.5 on 8); longer rows on 8 (bf16 16384: H100 98.4, H200 94.5 against 94.9
    # and 74.6 on 16; fp32 16384, H100: 100.0 against 99.6)
    if row_bytes <= 8192:
        return 4
    return 16 if row_bytes <= 16384 else 8


def _tile_block_rows(
    tile_bytes: int, cols: int, itemsize: int, min_rows: int, rows_inner: int, rows_outer: int,
    device: torch.device,
) -> int:
    """Rows of `cols` (padded) columns a tile of tile_bytes of input holds: at least min_rows,
    at most the rows there are (to a power of 2), capped by ONE_PASS_MAX_ELEMS; then, for too
    few rows to give every SM a full tile (launch-bound sizes), halved so that the rows spread
    over more SMs instead of queueing in a few programs."""
    tile_elems = min(tile_bytes // itemsize, ONE_PASS_MAX_ELEMS)
    block_rows = max(min_rows, tile_elems // cols)
    block_rows = max(min(block_rows, next_power_of_2(rows_inner)), min_rows)
    sms = _sm_count(device)
    while block_rows > min_rows and rows_outer * cdiv(rows_inner, block_rows) < sms:
        block_rows //= 2
    return block_rows


def _pick_config(
    n_cols: int,
    rows_inner: int,
    rows_adjacent: bool,
    backward: bool,
    device: torch.device,
    itemsize: int = 4,
    rows_outer: int = 1,
    smem_ok: bool = False,
) -> Config:
    """The design and sizes the probe measured best for these rows (kernels/notes/softmax.md).

    smem_ok: the rows can take the smem design (unit column strides, 16-byte aligned rows, a
    direct launch on a GPU: _smem_fits)."""
    min_rows = min(ADJACENT_ROWS if rows_adjacent else 1, next_power_of_2(rows_inner))
    padded_cols = next_power_of_2(n_cols)
    loop_min_cols = ROW_LOOP_MIN_COLS.get(itemsize, ONE_PASS_MAX_ELEMS + 1)
    if not backward and min_rows == 1 and loop_min_cols <= padded_cols <= ONE_PASS_MAX_ELEMS:
        # no masks and 32-bit offsets where the rows allow (round 23: with Config.lean, 20
        # instructions before the first load, against 63 before; Inductor's kernel 14)
        return Config("online", 1, padded_cols, _row_loop_warps(padded_cols * itemsize),
                      evict=True, exp2=1, even=True, int32=True)  # fmt: skip
    if min_rows * padded_cols <= ONE_PASS_MAX_ELEMS:
        tile_bytes = TILE_BYTES
        small = not backward and padded_cols <= SMALL_TILE_MAX_COLS.get(itemsize, 0)
        if small:
            tile_bytes = SMALL_TILE_BYTES[itemsize]
        block_rows = _tile_block_rows(
            tile_bytes, padded_cols, itemsize, min_rows, rows_inner, rows_outer, device
        )
        elems = block_rows * padded_cols
        if small and elems * itemsize <= tile_bytes:
            return Config("tile", block_rows, padded_cols, SMALL_TILE_WARPS[itemsize],
                          even=True, int32=True)  # fmt: skip
        # the backward loads two inputs: twice the bytes a thread
        warps = _warps_for(elems * itemsize * (2 if backward else 1))
        if elems >= 16384:
            warps = 16  # one long row: 16 warps measured best in bf16, level in fp32
        return Config("tile", block_rows, padded_cols, warps)
    n_inputs = 2 if backward else 1
    # the forward: one 32 KB chunk a program; the backward: two 16 KB buffers of y and of dy
    base_chunk = (SMEM_BUFFER_BYTES if backward else SMEM_PROGRAM_BYTES) // itemsize
    smem_chunk = max(base_chunk, next_power_of_2(cdiv(n_cols, MAX_SPLIT_CHUNKS)))
    buffers = 2 if backward else 1  # the backward: round 11's persistent kernels' bound, kept
    if smem_ok and min_rows == 1 and buffers * n_inputs * smem_chunk * itemsize <= SMEM_MAX_BYTES:
        # Chunks in shared memory (kernels/notes/softmax.md, rows of 2^27 elements, % of copy
        # at N = 65536 / 262144, H100 then H200). Round 10, the forward, 32 KB a program: bf16
        # 16K chunks, 8 warps 94.4 / 93.6 and 83.9 / 80.6 against coop's 79.4 / 74.9 and 67.9 /
        # 63.3; fp32 98.0 / 97.5 and 90.8 / 84.5 against 98.0 / 94.1 and 85.6 / 79.3. Round 11,
        # the backward on the persistent kernels (p8K_w4 in bf16, p4K_w4 in fp32): bf16 98.2 /
        # 97.7 and 86.0 / 86.2 against the one-shot kernels' 93.5 / 95.2 and 83.4 / 84.1; fp32
        # 101.0 / 97.8 and 92.2 / 87.0 against coop's 101.2 / 96.6 and 91.3 / 83.5. The
        # persistent forward was level or behind (bf16 92.9 / 92.0 and 82.4 / 81.7).
        if backward:
            # Round 21 (H200, softmax_probe21_h200.txt): the one-shot kernel with chunks by
            # program id (the forward's round 20 protocol), with masks: bf16 96.4 / 95.0, fp32
            # 100.3 / 95.0 against round 11's persistent ticketed kernel's 86.0 / 85.5 and
            # 92.4 / 86.9. Without masks (even) ptxas (CUDA 12.8) takes 40 registers in bf16
            # and spills 16 bytes whatever the cap: 95.6 / 93.3.
            warps = min(16, SMEM_WARPS * smem_chunk // base_chunk)
            return Config("smem", 1, smem_chunk, warps, by_pid=True)
        # Round 20 (H200, % of copy at N = 65536 / 262144, softmax_probe20c_h200.txt): chunks
        # by program id that a waiting program leaves to its row's last publisher
        # (Config.by_pid), without masks where rows are whole chunks (Config.even): bf16 91.0
        # / 88.4, fp32 95.8 / 95.1, against the atomic ticket's 84.4 / 80.4 and 90.3 / 82.9
        # (kernels/notes/softmax.md).
        # Round 27 (H200, softmax_probe27*_h200.txt): lead programs (Config.lead) on grids of
        # several waves, 4 an SM in 1.5 us tiers: bf16 N = 262144 88.3-88.9 -> 89.7-90.4.
        warps = min(16, SMEM_WARPS * smem_chunk // SMEM_CHUNK_ELEMS)
        programs = rows_inner * rows_outer * cdiv(n_cols, smem_chunk)
        many = programs >= SMEM_LEAD_MIN_PROGRAMS_PER_SM * _sm_count(device)
        lead = SMEM_LEAD_PER_SM if many and smem_chunk == base_chunk else 0
        # Round 28 (H200, softmax_probe28i_h200.txt): a row's chunks interleaved piece by
        # piece (Config.interleave), where rows are whole chunks, % of copy at N = 65536 /
        # 262144: bf16 92.7 / 90.7 against whole chunks' 92.0 / 90.0, fp32 98.2 / 96.2
        # against 96.2 / 95.7; the H100 level (softmax_probe28h_h100.txt)
        return Config("smem", 1, smem_chunk, warps, exp2=2 if itemsize == 2 else 1,
                      by_pid=True, even=True, maxnreg=SMEM_PID_MAXNREG if warps >= 8 else 0,
                      lead=lead, lead_ns=SMEM_LEAD_NS if lead else 0,
                      interleave=True)  # fmt: skip
    # 16-bit backward rows one a program: chunks held as int32 pairs (where the strides let
    # them be read so; other rows take the plain kernel with the same chunk)
    pairs = backward and itemsize == 2 and min_rows == 1
    if backward and not pairs:
        chunk_elems = min(BWD_SPLIT_CHUNK_BYTES // itemsize, ONE_PASS_MAX_ELEMS)
    else:
        chunk_elems = min(SPLIT_CHUNK_ELEMS, ONE_PASS_MAX_ELEMS)
    chunk_cols = max(1, chunk_elems // min_rows)
    # rows of more than MAX_SPLIT_CHUNKS chunks take bigger chunks, up to the on-chip limit
    chunk_cols = max(chunk_cols, next_power_of_2(cdiv(n_cols, MAX_SPLIT_CHUNKS)))
    on_gpu = gpu_info(device) is not None
    if min_rows * chunk_cols <= ONE_PASS_MAX_ELEMS:
        # (16-bit forward rows of 65536 once took the online loop here: probes timed with
        # do_bench put it ahead, which counted the coop launch's CPU path; timed with the
        # benchmark's GpuTimer the coop kernel leads, 71.4-71.9% of copy against 66.2: round 9)
        design = "coop" if on_gpu else "split2"
        # a chunk grown past the usual size gets more warps in proportion, so as not to spill
        warps = min(16, SPLIT_WARPS * max(1, min_rows * chunk_cols // chunk_elems))
        if backward:
            return Config(design, min_rows, chunk_cols, warps, pairs=pairs)
        # the forward: no second exp after the wait, the exp2 forms, evict_first in 16-bit
        # (round 9, against the plain kernel: bf16 75.2 / 70.1% of copy at N = 65536 / 262144
        # against 69.7 / 66.2; fp32 89.9 / 85.9 against 88.9 / 83.9, where evict lost 1-2)
        half = itemsize == 2
        capped = on_gpu and cdiv(n_cols, chunk_cols) > COOP_CAP_MIN_CHUNKS
        return Config(
            design, min_rows, chunk_cols, warps, rescale=True, exp2=2 if half else 1, evict=half,
            maxnreg=COOP_FORWARD_MAXNREG.get(itemsize, 0) if capped else 0,
        )  # fmt: skip
    block_cols = min(LOOP_TILE_ELEMS, ONE_PASS_MAX_ELEMS) // min_rows
    return Config("online", min_rows, block_cols, 4 if block_cols * min_rows <= 2048 else 8)


def _tunable(launch: Launcher, device: torch.device) -> bool:
    """Whether this call may time configs: a direct launch on a GPU, outside a CUDA-graph
    capture (which must not run anything else) and a torch.compile trace."""
    return (
        TUNE and launch is direct and device.type == "cuda" and gpu_info(device) is not None
        and not torch.cuda.is_current_stream_capturing() and not torch.compiler.is_compiling()
    )  # fmt: skip


def _tile_candidates(
    pick: Config, rows_inner: int, rows_outer: int, itemsize: int, device: torch.device
) -> list[Config]:
    """The pick, then tiles of TUNE_TILE_BYTES (at least one row) with one 16-byte access a
    thread, thinned for few rows as _pick_config thins its tiles; then (round 24) the row loop
    on the same blocks, the online pick's form (x read twice, the second time from L2, as
    Inductor's looped kernel), which ran above the tile on the H200 at fp32 N = 1024 (100.7%
    of copy against the tile's 99.2-99.3 at N = 128 and 512); no duplicates."""
    candidates = [pick]
    cols = pick.block_cols
    for design in ("tile", "online"):
        for tile_bytes in TUNE_TILE_BYTES:
            block_rows = _tile_block_rows(tile_bytes, cols, itemsize, 1, rows_inner, rows_outer,
                                          device)  # fmt: skip
            warps = max(1, min(16, block_rows * cols * itemsize // (16 * 32)))
            candidate = Config(design, block_rows, cols, warps, even=True, int32=True)
            if design == "online":
                candidate = candidate._replace(evict=True, exp2=1)
            if candidate not in candidates:
                candidates.append(candidate)
    return candidates


def _label(config: Config) -> str:
    lanes = f" lanes{int(config.lanes)}" if config.lanes else ""
    return f"{config.design} {config.block_rows}x{config.block_cols} w{config.num_warps}{lanes}"


def _first_call_candidates(pick: Config, backward: bool, rows_inner: int, rows_outer: int,
                           itemsize: int, device: torch.device):  # fmt: skip
    """What the first call may time against the pick (a function giving the candidates,
    the pick first), or None: the forward's short-row tile (round 17) and row loop (round 24)."""
    if backward:
        return None
    if pick.design == "tile" and pick.block_cols <= SMALL_TILE_MAX_COLS.get(itemsize, 0):
        return lambda: _tile_candidates(pick, rows_inner, rows_outer, itemsize, device)
    if pick.design == "online":
        return lambda: _online_candidates(pick)
    return None


def _online_candidates(pick: Config) -> list[Config]:
    """The online forward's pick, then the same loop in Inductor's arithmetic (Config.lanes =
    4: libdevice's exp, its max, a true division; the stores' default policy), which round 24
    found 0.3% faster on the H100 at fp32 N = 4096, where that form runs 25% behind ours on
    the H200; and half the warps, where the pick has 8 or more."""
    candidates = [pick, pick._replace(lanes=4, store_default=True)]
    if pick.num_warps >= 8:
        candidates.append(pick._replace(num_warps=pick.num_warps // 2))
    return candidates


def _time_candidate(fn) -> float:
    """GPU ms a call of `fn`: the median of TUNE_CALLS calls, each after an L2 flush, as the
    benchmark times a call (round 24; back-to-back batches of calls before, which ranked
    candidates 1% apart in the benchmark within 0.1% of each other)."""
    return gpu_ms_flushed(fn, TUNE_CALLS, TUNE_CPU_US_PER_CALL)


def _tuned_config(key: tuple, make_candidates, run, what: str) -> Config:
    """The fastest of make_candidates() for `key`, timed once (TUNE_ROUNDS interleaved rounds,
    the best round of each; ties keep the earlier candidate, the pick) and then remembered.
    run(config) launches one call; `what` names the rows in TUNING_LOG's line."""
    config = _TUNED.get(key)
    if config is not None:
        return config
    candidates = make_candidates()
    for candidate in candidates:  # compile each, and warm up
        run(candidate)
    best = dict.fromkeys(candidates, math.inf)
    for _ in range(TUNE_ROUNDS):
        for candidate in candidates:
            ms = _time_candidate(functools.partial(run, candidate))
            best[candidate] = min(best[candidate], ms)
    config = min(candidates, key=best.__getitem__)
    _TUNED[key] = config
    times = ", ".join(f"{_label(c)} {best[c]:.4g}" for c in candidates)
    TUNING_LOG.append(f"softmax {what}: chose {_label(config)} (GPU ms a call: {times})")
    return config


class _LaunchPlan(NamedTuple):
    """A remembered direct launch (_PLANS): the compiled kernel's runner for its grid, and every
    kernel argument after the tensors, constexprs and defaults included, in the kernel's order
    (as Triton's launch passes them; its launcher skips the constexprs)."""

    runner: object
    rest: tuple


def _plan_key(moved: list[torch.Tensor], backward: bool) -> tuple:
    """What a launch's plan depends on: the rows' shapes and strides (the pick, the grid, the
    index hints), dtype and device, and each tensor's 16-byte alignment (Triton's
    specialization of a pointer)."""
    first = moved[0]
    return (backward, first.dtype, first.device, first.shape,
            *[(t.stride(), t.data_ptr() % 16) for t in moved])  # fmt: skip


@functools.cache
def _kernel_signature(kernel) -> inspect.Signature:
    return inspect.signature(kernel.fn)


def _launch_planned(launch: Launcher, kernel, grid: int, moved: list[torch.Tensor], args: tuple,
                    meta: dict, plan_key: tuple | None) -> None:  # fmt: skip
    """launch(kernel)[(grid,)](*moved, *args, **meta), remembered under plan_key (unless None)
    for the next call with the same key (_PLANS)."""
    compiled = launch(kernel)[(grid,)](*moved, *args, **meta)
    if plan_key is None or not isinstance(compiled, triton.compiler.CompiledKernel):
        return  # no key, or no compiled kernel (the interpreter, an offline compile)
    signature = _kernel_signature(kernel)
    bound = signature.bind(*moved, *args, **{k: v for k, v in meta.items()
                                             if k in signature.parameters})  # fmt: skip
    bound.apply_defaults()
    if len(_PLANS) >= PLANS_MAX:
        _PLANS.clear()
    rest = tuple(bound.arguments.values())[len(moved):]
    _PLANS[plan_key] = _LaunchPlan(compiled[(grid, 1, 1)], rest)


def _launch_rows(
    launch: Launcher, moved: list[torch.Tensor], backward: bool, config: Config | None = None
) -> None:
    """Launch the forward or backward over the rows of `moved` (inputs, then the output)."""
    n_cols = moved[0].shape[-1]
    if moved[0].numel() == 0:
        return
    device = moved[0].device
    plan_key = None
    if config is None and launch is direct and gpu_info(device) is not None:
        plan_key = _plan_key(moved, backward)
        plan = _PLANS.get(plan_key)
        if plan is not None:
            plan.runner(*moved, *plan.rest)
            return
    layout = _row_dims(moved)
    if layout is None:
        # More than two non-mergeable row dims (e.g. a permuted 4-D view): the kernel decodes
        # only two row indices, so copy the inputs into plain rows. The output is contiguous.
        moved = [t.contiguous() for t in moved[:-1]] + moved[-1:]
        layout = _row_dims(moved)
        plan_key = None  # a plan launches on the tensors as given
    (rows_outer, rows_inner), strides = layout
    _, first_inner_stride, first_col_stride = strides[0]
    rows_adjacent = first_col_stride != 1 and first_inner_stride == 1
    if config is None:
        itemsize = moved[0].element_size()
        # the smem kernels on Hopper only, where they were measured (H100, H200); wrap_triton
        # (the triton-compiled mode) keeps coop: Inductor with a Gluon kernel was not tried
        smem_ok = (
            n_cols > ONE_PASS_MAX_ELEMS and softmax_smem is not None and launch is direct
            and (info := gpu_info(device)) is not None
            and info.capability[0] == SMEM_ARCH_MAJOR and _smem_fits(moved, strides, n_cols)
        )  # fmt: skip
        config = _pick_config(
            n_cols, rows_inner, rows_adjacent, backward, device, itemsize, rows_outer, smem_ok
        )
        rows = rows_outer * rows_inner
        candidates = _first_call_candidates(config, backward, rows_inner, rows_outer, itemsize,
                                            device)  # fmt: skip
        timed = (
            candidates is not None and not rows_adjacent
            and rows * n_cols * itemsize >= TUNE_MIN_BYTES
        )  # fmt: skip
        if timed and not _tunable(launch, device):
            plan_key = None  # the pick, untimed here (a capture): a later call may time it
        elif timed:
            config = _tuned_config(
                (device, moved[0].dtype, n_cols, next_power_of_2(rows)),
                candidates,
                lambda c: _launch_rows(launch, moved, False, c),
                f"forward {str(moved[0].dtype).removeprefix('torch.')} {rows} x {n_cols}",
            )
    kernels = _KERNELS[backward]
    flat_strides = [s for tensor_strides in strides for s in tensor_strides]
    row_blocks = rows_outer * cdiv(rows_inner, config.block_rows)
    # evict_first on loads and stores used once; EXP2 is read by the forward kernels only
    hints = dict(POLICY="evict_first" if config.evict else "", EXP2=int(config.exp2))
    if config.rescale:
        plain_split = config.design in ("coop", "split2", "split2r") and not config.loop_cols
        if backward or not plain_split or config.pairs:
            raise ValueError(f"rescale is a knob of the plain coop/split2 forward, got {config}")
        hints["RESCALE"] = True

    # the one-shot smem kernels (and the persistent forward by program id) take even
    # themselves: no masks where rows are whole chunks
    smem_even = config.even and config.design == "smem" and not (
        (config.per_sm and not config.by_pid) or config.regs or config.int32
    )  # fmt: skip
    tile_forward = not backward and config.design in ("tile", "online")
    if (config.even or config.int32) and not (smem_even or tile_forward):
        raise ValueError(f"even and int32 are knobs of the tile/online forward (even: and "
                         f"of the one-shot smem kernels), got {config}")  # fmt: skip
    if tile_forward:
        # always passed (False where not asked), not left to the kernels' defaults:
        # torch.compile's wrapper of a user Triton kernel (mode triton-compiled) wants every
        # parameter (it failed N = 4096 otherwise)
        hints.update(_index_hints(config, (rows_outer, rows_inner), strides, n_cols))
    if config.fold and (backward or config.design != "smem"):
        raise ValueError(f"fold is a knob of the smem forward, got {config}")
    if config.fold not in (0, 1, 2):
        raise ValueError(f"fold is 0, 1 (program-wide) or 2 (by thread), got {config.fold}")
    if config.regs and (backward or config.design != "smem" or config.per_sm):
        raise ValueError(f"regs is a knob of the one-shot smem forward, got {config}")
    if config.by_pid and (config.design != "smem" or (config.per_sm and backward)
                          or config.regs):  # fmt: skip
        raise ValueError(f"by_pid is a knob of the one-shot smem kernels and the persistent "
                         f"smem forward (no regs), got {config}")  # fmt: skip
    if config.poly and (backward or config.design != "smem" or config.per_sm):
        raise ValueError(f"poly is a knob of the one-shot smem forward, got {config}")
    if config.store_default and (backward or config.design != "online"):
        raise ValueError(f"store_default is a knob of the online forward, got {config}")
    if config.lanes and (backward or config.design != "online"):
        raise ValueError(f"lanes is a knob of the online forward, got {config}")
    if config.lanes not in (0, 1, 2, 3, 4):
        raise ValueError(f"lanes is 0-4 (2 and up: libdevice's exp), got {config.lanes}")
    if config.one_copy and (backward or config.design != "smem" or config.per_sm or config.fold
                            or config.regs):  # fmt: skip
        raise ValueError(f"one_copy is a knob of the one-shot smem forward (no fold or regs), "
                         f"got {config}")  # fmt: skip
    if config.left_group != 1 and (backward or config.design != "smem" or not config.by_pid
                                   or config.per_sm):  # fmt: skip
        raise ValueError(f"left_group is a knob of the one-shot smem forward by program id, "
                         f"got {config}")  # fmt: skip
    if config.widen and (backward or config.design != "smem" or config.per_sm or config.fold
                         or config.poly or moved[0].dtype != torch.bfloat16):  # fmt: skip
        raise ValueError(f"widen is a knob of the one-shot smem forward in bf16 (no fold or "
                         f"poly), got {config} for {moved[0].dtype}")  # fmt: skip
    if (config.lead or config.lead_ns) and (backward or config.design != "smem" or config.per_sm
                                            or not config.by_pid or config.lead < 1
                                            or config.lead_ns < 1):  # fmt: skip
        raise ValueError(f"lead (programs an SM, at least 1) and lead_ns (positive) are knobs of "
                         f"the one-shot smem forward by program id, got {config}")  # fmt: skip
    if config.tail_pf and not 0 < config.tail_pf <= config.lead:
        raise ValueError(f"tail_pf is a knob of the lead programs (at most lead an SM), got "
                         f"{config}")  # fmt: skip
    if config.interleave and (backward or config.design != "smem" or config.per_sm
                              or not config.by_pid or config.regs or config.fold
                              or config.one_copy or config.tail_pf
                              or config.left_group != 1):  # fmt: skip
        raise ValueError(f"interleave is a knob of the one-shot smem forward by program id "
                         f"(no regs, fold, one_copy, tail_pf or left_group), got "
                         f"{config}")  # fmt: skip

    if config.design == "tile":
        if config.block_cols < n_cols:
            raise ValueError(f"tile of {config.block_cols} columns for rows of {n_cols}")
        grid = row_blocks
        if config.per_sm:
            per_sm = config.per_sm
            if per_sm < 0:
                tile = config.block_rows * config.block_cols
                per_sm = _programs_per_sm(tile, config.num_warps, 2 if backward else 1)
            grid = min(row_blocks, _sm_count(device) * per_sm)
        if not backward:  # a program a tile: no loop (passed always, as the index hints)
            hints["PERSISTENT"] = grid < row_blocks or not config.lean
        _launch_planned(
            launch, kernels["tile"], grid, moved, (rows_inner, n_cols, row_blocks, *flat_strides),
            dict(BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols,
                 NUM_STAGES=config.num_stages, num_warps=config.num_warps, **hints),
            plan_key,
        )  # fmt: skip
    elif config.design in ("coop", "split2", "split2r"):
        n_chunks = cdiv(n_cols, config.block_cols)
        n_slots = rows_outer * rows_inner * n_chunks
        grid = (row_blocks * n_chunks,)
        split_kernel, common = _split_kernel(kernels, config, n_chunks, config.counter, **hints)
        half = _half_code(moved[0].dtype)
        if config.pairs and half and not config.loop_cols and _pairs_fit(
            moved, strides, config.block_cols
        ):
            # the same rows as int32 pairs: half the columns, half the row strides (viewed
            # through the merged row dims: torch refuses an odd stride even on a size-1 dim)
            split_kernel = kernels["split_pairs"]
            shape = (rows_outer, rows_inner, n_cols)
            moved = [
                t.as_strided(shape, s).view(torch.int32)
                for t, s in zip(moved, strides, strict=True)
            ]
            flat_strides = [s for so, si, _ in strides for s in (so // 2, si // 2, 1)]
            n_cols //= 2
            common.update(CHUNK=config.block_cols // 2, HALF=half)
        if config.design == "coop":
            if is_interpreter():
                # the interpreter runs programs one after another: a waiting one never returns
                raise ValueError("the coop design needs a GPU; the interpreter takes split2")
            # zeroed: 0 marks an unpublished slot; then the ticket counter and, with
            # config.counter, one arrival counter per row
            n_counters = rows_outer * rows_inner if config.counter else 0
            n_ws = n_slots + 1 + n_counters
            common.update(SLEEP_NS=config.sleep_ns, COUNTER=config.counter)
            # the loop kernels cannot zero the next launch's workspace: a memset each time
            pair = None if config.loop_cols else _coop_workspace(n_ws, device)
            if pair is None:
                ws = torch.zeros(n_ws, device=device, dtype=torch.int64)
            else:
                ws, next_ws = pair[pair[2]], pair[1 - pair[2]]
                common.update(CLEAR=True, next_ptr=next_ws)
            launch(split_kernel)[grid](
                *moved, ws, rows_inner, n_cols, n_chunks, n_slots, *flat_strides,
                PHASE=2, REVERSE=False, **common,
            )  # fmt: skip
            if pair is not None:
                pair[2] ^= 1  # launched: next_ws is (being) zeroed for the next launch
        else:
            ws = torch.empty(n_slots, device=device, dtype=torch.int64)
            for phase, reverse in ((0, False), (1, config.design == "split2r")):
                launch(split_kernel)[grid](
                    *moved, ws, rows_inner, n_cols, n_chunks, n_slots, *flat_strides,
                    PHASE=phase, REVERSE=reverse, **common,
                )  # fmt: skip
    elif config.design == "smem":
        _launch_smem(launch, moved, backward, (rows_outer, rows_inner), strides, config)
    elif config.design in ("band", "bandr"):
        _launch_bands(launch, kernels, moved, (rows_outer, rows_inner), strides, config, hints)
    elif config.design == "online":
        _launch_planned(
            launch, kernels["online"], row_blocks, moved, (rows_inner, n_cols, *flat_strides),
            dict(
                BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols,
                NUM_STAGES=config.num_stages, num_warps=config.num_warps,
                # the first read asks L2 to keep the row for the second, which then drops it
                FIRST_POLICY="evict_last" if config.evict else "", **hints,
                # the forward's: always passed, as EVEN and INT32 (torch.compile's wrapper
                # wants every parameter); the backward kernel has none (the interpreter let it
                # through)
                **({} if backward else {"STORE_POLICY": "" if config.store_default
                                        else hints["POLICY"], "LANES": int(config.lanes),
                                        "LIBDEVICE": not is_interpreter()}),
            ),
            plan_key,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown softmax design {config.design!r}")


def _index_hints(config: Config, rows: tuple[int, int], strides: list, n_cols: int) -> dict:
    """The tile/online forward's EVEN and INT32 where Config.even / Config.int32 ask for them
    and these rows allow them: EVEN where the rows fill the kernel's blocks exactly (no masks),
    INT32 where the largest offset the kernel forms, padding included, fits in 32 bits; and
    with Config.lean, ONE_OUTER where there is one outer row index, DENSE where every
    tensor's rows are block_cols (= n_cols) apart with unit column strides, and (the online
    kernel's) ONE_STEP where a row is one step of its loops."""
    rows_outer, rows_inner = rows
    padded_rows = cdiv(rows_inner, config.block_rows) * config.block_rows
    padded_cols = cdiv(n_cols, config.block_cols) * config.block_cols
    even = n_cols % config.block_cols == 0 and rows_inner % config.block_rows == 0
    largest = max(
        (rows_outer - 1) * abs(outer) + (padded_rows - 1) * abs(inner)
        + (padded_cols - 1) * abs(col)
        for outer, inner, col in strides
    )  # fmt: skip
    dense = all(inner == n_cols == config.block_cols and col == 1 for _, inner, col in strides)
    hints = dict(EVEN=config.even and even, INT32=config.int32 and largest < 2**31,
                 ONE_OUTER=config.lean and rows_outer == 1, DENSE=config.lean and dense)
    if config.design == "online":
        hints["ONE_STEP"] = config.lean and n_cols == config.block_cols
    return hints


# Coop workspaces, two a (device, stream, size), taken in turn: each launch zeroes the other one
# for the next launch (_clear_for_next), which saves a memset kernel a call (2.5 us measured
# on an H100 beside a 50 us copy: round 9).
_COOP_WORKSPACES: dict[tuple, list] = {}
# Sizes kept at once; the oldest is dropped past it (its memory goes back to torch's caching
# allocator, which reuses it in stream order, so a launch still reading it is safe).
COOP_WORKSPACE_SIZES = 64


def _coop_workspace(n_ws: int, device: torch.device) -> list | None:
    """[buffer 0, buffer 1, index of the zeroed one] for a coop launch of n_ws words; the caller
    flips the index once the launch is made. None where a launch must zero its own: under CUDA
    graph capture (each replay would find the buffer the capture used, not zeroed again).

    Stream order keeps the two apart: launch k zeroes the buffer that launch k - 1 used and
    that launch k + 1 will use. Two host threads launching on one stream at once could take
    the same buffer; the kernels' callers do not do that.
    """
    if device.type == "cuda":
        if torch.cuda.is_current_stream_capturing():
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, torch.cuda.current_stream(index).cuda_stream, n_ws)
    else:  # experiments.resources compiles the GPU's launches from CPU tensors: same kernels
        key = (str(device), 0, n_ws)
    pair = _COOP_WORKSPACES.get(key)
    if pair is None:
        while len(_COOP_WORKSPACES) >= COOP_WORKSPACE_SIZES:
            del _COOP_WORKSPACES[next(iter(_COOP_WORKSPACES))]
        zeros = [torch.zeros(n_ws, device=device, dtype=torch.int64) for _ in range(2)]
        pair = _COOP_WORKSPACES[key] = [*zeros, 0]
    return pair


def _smem_fits(moved: list[torch.Tensor], strides: list, n_cols: int) -> bool:
    """Whether rows can be copied into shared memory 16 bytes at a time (the smem design):
    unit column strides, and every row start (data pointer and row strides) 16-byte aligned."""
    vec = 16 // moved[0].element_size()
    if n_cols % vec:
        return False
    return all(
        col == 1 and outer % vec == 0 and inner % vec == 0 and t.data_ptr() % 16 == 0
        for t, (outer, inner, col) in zip(moved, strides, strict=True)
    )


def _launch_smem(launch, moved, backward, rows, strides, config: Config) -> None:
    """The smem design: softmax_smem's Gluon kernels on the coop workspaces."""
    if is_interpreter() or gpu_info(moved[0].device) is None or softmax_smem is None:
        raise ValueError(
            "the smem design (Gluon) needs a GPU and a Triton with Gluon; the interpreter takes "
            "split2"
        )
    n_cols = moved[0].shape[-1]
    if config.block_rows != 1 or not _smem_fits(moved, strides, n_cols):
        raise ValueError(
            "the smem design takes one row a program, rows of unit column stride and 16-byte "
            f"aligned starts; got {config} for strides {strides}"
        )
    if config.rescale or config.pairs or config.loop_cols or config.counter:
        raise ValueError(f"rescale, pairs, loop_cols and counter are not knobs of smem: {config}")
    rows_outer, rows_inner = rows
    n_chunks = cdiv(n_cols, config.block_cols)
    n_ws = softmax_smem.workspace_words(rows_outer * rows_inner * n_chunks, n_chunks,
                                       config.by_pid)  # fmt: skip
    pair = _coop_workspace(n_ws, moved[0].device)
    if pair is None:  # under graph capture: a zeroed workspace of its own, nothing to clear
        ws, next_ws = torch.zeros(n_ws, device=moved[0].device, dtype=torch.int64), None
    else:
        ws, next_ws = pair[pair[2]], pair[1 - pair[2]]
    programs, sms = 0, _sm_count(moved[0].device)
    if config.per_sm:
        per_sm = config.per_sm
        if per_sm < 0:  # two buffers of each input's chunk, and what the reductions take
            buffer_bytes = 2 * len(moved[:-1]) * config.block_cols * moved[0].element_size()
            per_sm = max(1, min(SMEM_PER_SM // (buffer_bytes + SMEM_PROGRAM_EXTRA),
                                MAX_WARPS_PER_SM // config.num_warps))  # fmt: skip
        programs = sms * per_sm
    even = config.even and n_cols % config.block_cols == 0
    softmax_smem.launch(
        launch, backward, moved, ws, next_ws, rows, strides, config.block_cols,
        config.num_warps, sleep_ns=config.sleep_ns, exp2=config.exp2, evict=config.evict,
        maxnreg=config.maxnreg, programs=programs, fold=config.fold, regs=config.regs,
        by_pid=config.by_pid, leave_polls=config.leave_polls or softmax_smem.LEAVE_POLLS,
        even=even, poly=config.poly,
        one_copy=config.one_copy, left_group=config.left_group, widen=config.widen,
        lead=config.lead * sms, lead_tiers=max(config.lead, 1), lead_ns=config.lead_ns,
        tail_pf=min(config.tail_pf * sms, rows_outer * rows_inner * n_chunks),
        interleave=config.interleave and even,  # masked rows keep whole chunks
    )  # fmt: skip
    if pair is not None:
        pair[2] ^= 1  # launched: next_ws is (being) zeroed for the next launch


def _half_code(dtype: torch.dtype) -> int:
    """The pairs kernels' HALF: 1 for bf16, 2 for fp16, 0 for a dtype they do not take."""
    return {torch.bfloat16: 1, torch.float16: 2}.get(dtype, 0)


def _pairs_fit(moved: list[torch.Tensor], strides: list, chunk: int) -> bool:
    """Whether every tensor's rows can be read as int32 pairs (Config.pairs): unit column
    strides, an even row length, chunk and row strides, and 4-byte aligned data."""
    if moved[0].shape[-1] % 2 or chunk % 2:
        return False
    return all(
        col == 1 and outer % 2 == 0 and inner % 2 == 0 and t.data_ptr() % 4 == 0
        for t, (outer, inner, col) in zip(moved, strides, strict=True)
    )


def _split_kernel(kernels: dict, config: Config, n_chunks: int, counter: bool, **extra):
    """(kernel, meta) for the chunked designs: kernels["split"], or kernels["split_loop"] when
    config.loop_cols is set (it must divide the chunk), whose first pass over the chunk asks L2
    to keep it when config.evict."""
    meta = dict(
        BLOCK_ROWS=config.block_rows, CHUNK=config.block_cols,
        MAX_CHUNKS=next_power_of_2(n_chunks), num_warps=config.num_warps, **extra,
    )  # fmt: skip
    if config.maxnreg:
        meta["maxnreg"] = config.maxnreg
    if not config.loop_cols:
        return kernels["split"], meta
    if config.block_cols % config.loop_cols:
        raise ValueError(f"loop of {config.loop_cols} for chunks of {config.block_cols}")
    meta.update(
        LOOP_COLS=config.loop_cols, FIRST_POLICY="evict_last" if config.evict else "",
        SLEEP_NS=config.sleep_ns, COUNTER=counter,
    )  # fmt: skip
    return kernels["split_loop"], meta


def _band_slices(rows_outer: int, rows_inner: int, band_rows: int):
    """(outer slice, inner slice) of each band: whole outer rows when a band holds at least
    rows_inner rows, else runs of band_rows inner rows of one outer row."""
    if band_rows >= rows_inner:
        step = band_rows // rows_inner
        return [(slice(o, o + step), slice(None)) for o in range(0, rows_outer, step)]
    return [
        (slice(o, o + 1), slice(i, i + band_rows))
        for o in range(rows_outer)
        for i in range(0, rows_inner, band_rows)
    ]


def _launch_bands(launch, kernels, moved, rows, strides, config: Config, hints: dict) -> None:
    """The band design: per band of rows, a partials launch, then a finish launch that re-reads
    the band (from L2 if it fits) and writes it. Launched back to back, no host sync; one
    workspace serves every band (stream order keeps the bands apart)."""
    if config.band_bytes <= 0:
        raise ValueError(f"band design needs band_bytes > 0, got {config.band_bytes}")
    rows_outer, rows_inner = rows
    n_cols = moved[0].shape[-1]
    n_inputs = len(moved) - 1
    row_bytes = n_cols * moved[0].element_size() * n_inputs
    # whole row blocks a band, at least one
    band_rows = cdiv(max(1, config.band_bytes // row_bytes), config.block_rows)
    # at most every row (a band of whole outer rows needs no row-block rounding)
    band_rows = min(band_rows * config.block_rows, rows_outer * rows_inner)
    # each tensor as (rows_outer, rows_inner, n_cols) with its own strides, to slice bands from
    views = [
        t.as_strided((rows_outer, rows_inner, n_cols), s)
        for t, s in zip(moved, strides, strict=True)
    ]
    flat_strides = [s for tensor_strides in strides for s in tensor_strides]
    n_chunks = cdiv(n_cols, config.block_cols)
    bands = _band_slices(rows_outer, rows_inner, band_rows)
    max_rows = band_rows if band_rows < rows_inner else (band_rows // rows_inner) * rows_inner
    n_slots = max_rows * n_chunks
    ws = torch.empty(n_slots, device=moved[0].device, dtype=torch.int64)
    first, then = ("evict_last", "evict_first") if config.evict else ("", "")
    split_kernel, common = _split_kernel(kernels, config, n_chunks, False, EXP2=hints["EXP2"])
    for outer, inner in bands:
        band = [v[outer, inner] for v in views]
        band_outer, band_inner = band[0].shape[:2]
        grid = (band_outer * cdiv(band_inner, config.block_rows) * n_chunks,)
        for phase, policy in ((0, first), (1, then)):
            launch(split_kernel)[grid](
                *band, ws, band_inner, n_cols, n_chunks, n_slots, *flat_strides,
                PHASE=phase, REVERSE=phase == 1 and config.design == "bandr", POLICY=policy,
                **common,
            )  # fmt: skip


def _launch_moved(inputs: list[torch.Tensor], dim: int, backward: bool, launch: Launcher,
                  config: Config | None) -> torch.Tensor:  # fmt: skip
    """The output of the forward or backward over `dim` of `inputs` (checked, dim normalized):
    dim moved last (as they are where it is last: no views to make, host time as _PLANS),
    a row-major output, the launch, and the output with dim moved back."""
    last = dim == inputs[0].dim() - 1
    moved = [t if last else t.movedim(dim, -1) for t in inputs]
    out = torch.empty(moved[0].shape, device=moved[0].device, dtype=moved[0].dtype)
    _launch_rows(launch, [*moved, out], backward, config)
    return out if last else out.movedim(-1, dim)


def _forward(x: torch.Tensor, dim: int, launch: Launcher, config: Config | None) -> torch.Tensor:
    check_tensor("x", x)
    dim = _normalize_dim(dim, x.dim(), tuple(x.shape))
    if x.dim() == 0:
        return _forward(x.unsqueeze(0), 0, launch, config).squeeze(0)
    return _launch_moved([x], dim, False, launch, config)


def _backward(y, dy, dim, launch: Launcher, config: Config | None) -> torch.Tensor:
    check_tensor("y", y)
    check_tensor("dy", dy)
    check_same({"y": y, "dy": dy})
    if y.shape != dy.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but y has {tuple(y.shape)}")
    dim = _normalize_dim(dim, y.dim(), tuple(y.shape))
    if y.dim() == 0:
        return _backward(y.unsqueeze(0), dy.unsqueeze(0), 0, launch, config).squeeze(0)
    return _launch_moved([y, dy], dim, True, launch, config)


def softmax_forward(x: torch.Tensor, dim: int, *, launch: Launcher = direct) -> torch.Tensor:
    """torch.softmax(x, dim) without autograd; the output is a view of a row-major buffer."""
    return _forward(x, dim, launch, None)


def softmax_backward(
    y: torch.Tensor, dy: torch.Tensor, dim: int, *, launch: Launcher = direct
) -> torch.Tensor:
    """Gradient of softmax_forward: dx = y * (dy - sum(y * dy, dim)), y being its output."""
    return _backward(y, dy, dim, launch, None)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = softmax_forward(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(y, dy, ctx.dim), None


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch.softmax(x, dim): same dtype out, fp32 math inside, differentiable once.

    A row that is entirely -inf gives NaN, as torch does; -inf entries in other rows give 0.
    """
    return _Softmax.apply(x, dim)
