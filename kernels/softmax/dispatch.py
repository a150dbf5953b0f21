"""Softmax over any dim of a tensor with any strides, forward and backward: the pick of a
design for each call's rows, the first call's timing of candidates, and the public wrappers.

Softmax is memory-bound: the target is the copy bandwidth, reading each input once and writing
the output once. Which design a call takes (docs/kernels/softmax.md, "Shipped design"):

- tile (tile.py): rows of up to ONE_PASS_MAX_ELEMS padded columns, several short rows a program.
- online (online.py): the forward of one-a-program rows of 4-64 KB (the whole row a step, read
  twice, the second time from L2); and the fallback for rows too long to split.
- smem (smem.py, Gluon; Hopper, rows of unit column stride and 16-byte aligned starts, a direct
  launch): longer rows in chunks held in shared memory, one program a chunk, waiting for the
  row's partials; the forward and the backward.
- coop (split.py, GPU): the other long rows, chunks held in registers across the wait.
- split2 (split.py, the interpreter): coop's partials and combine in two launches.

Rows are addressed through the tensor's own strides, so softmax over a middle dim or over a
sliced view needs no transposing copy.

Functions:
    softmax_reference                  the fp32 reference
    Config, _pick_config               a launch's design and sizes; the pick for given rows
    _first_call_candidates, _tile_candidates, _online_candidates, _tuned_config
                                       the first call's timed choice (GPU, direct launches)
    _launch_rows                       pick (or a remembered plan), launch
    softmax_forward, softmax_backward, softmax
"""

import functools
import math
import os
from typing import NamedTuple

import torch

from kernels._common import (
    SUPPORTED_DTYPES,
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
from kernels._launch import PlanCache, Step
from kernels.softmax.coop import Alternate, AlternatingPlan, coop_workspace
from kernels.softmax.online import softmax_backward_online_kernel, softmax_online_kernel
from kernels.softmax.split import launch_split
from kernels.softmax.tile import softmax_backward_tile_kernel, softmax_tile_kernel

try:  # Gluon is experimental in Triton: a release without this API leaves long rows on coop
    from kernels.softmax import smem
except (ImportError, AttributeError):  # pragma: no cover - the pinned Tritons have it
    smem = None

# A tile program holds at most this many elements (16384 fp32 values over 16 warps is 32
# registers a thread); a longer row takes the split or online path. Tests lower it to reach
# those paths at small sizes.
ONE_PASS_MAX_ELEMS = 16384
# Short rows share a tile program until its tile of each input holds this many bytes (capped
# by ONE_PASS_MAX_ELEMS).
TILE_BYTES = 16384
# Forward rows of at most SMALL_TILE_MAX_COLS[itemsize] columns fill tiles of
# SMALL_TILE_BYTES[itemsize] on SMALL_TILE_WARPS[itemsize] warps instead, without masks and with
# 32-bit offsets where the rows allow (Config.even); docs/kernels/softmax.md, "Short rows".
SMALL_TILE_BYTES = {2: 2048, 4: 4096}
SMALL_TILE_WARPS = {2: 2, 4: 4}
SMALL_TILE_MAX_COLS = {2: 1024, 4: 1024}
# Forward rows of one a program from ROW_LOOP_MIN_COLS[itemsize] columns (up to the tile's
# ONE_PASS_MAX_ELEMS) take the online kernel with the whole padded row a step: max and sum over
# one load kept in L2 (evict_last), then the row loaded again from cache and written
# (evict_first). Holding nothing across the reduction, a program needs fewer registers than
# the tile; docs/kernels/softmax.md, "Row loop".
ROW_LOOP_MIN_COLS = {2: 4096, 4: 1024}
# Chunk of one coop/split program: 4096 values on 4 warps; the backward over rows that are not
# one-a-program (adjacent rows, softmax over an outer dim) takes 16 KB of each input.
SPLIT_CHUNK_ELEMS = 4096
BWD_SPLIT_CHUNK_BYTES = 16384
SPLIT_WARPS = 4
# At most this many chunks per row (longer rows take longer chunks, up to ONE_PASS_MAX_ELEMS,
# then the online loop): the cooperative wait needs every chunk of a row resident at once,
# and 132 SMs hold at least one program each.
MAX_SPLIT_CHUNKS = 128
# Register cap of the fp32 coop forward for rows of more than COOP_CAP_MIN_CHUNKS chunks (the
# slot gather grows with them): one more program an SM, no spills. Capped, bf16 would spill.
COOP_FORWARD_MAXNREG = {4: 56}
COOP_CAP_MIN_CHUNKS = 16
# Tile of the online loop: big enough to keep many loads in flight per program.
LOOP_TILE_ELEMS = 4096
# smem design: the forward's chunk in shared memory, SMEM_PROGRAM_BYTES a program and
# SMEM_WARPS warps per SMEM_CHUNK_ELEMS values; the backward's chunk SMEM_BUFFER_BYTES of y and
# of dy; and the most shared memory a program may take once long rows grow the chunk
SMEM_PROGRAM_BYTES = 32768
SMEM_BUFFER_BYTES = 16384
SMEM_CHUNK_ELEMS = 8192
SMEM_WARPS = 4
SMEM_MAX_BYTES = 131072
SMEM_ARCH_MAJOR = 9  # compute capability 9.x (Hopper): where the smem design was measured
# Register cap of the smem forward on 8 warps or more: 6 programs an SM instead of 5, no spills
SMEM_PID_MAXNREG = 40
# Lead programs of the smem forward (smem.LEAD_PER_SM an SM) on grids of 32 KB programs of at
# least SMEM_LEAD_MIN_PROGRAMS_PER_SM an SM (4 waves of 6): the last lead program leaves after
# 6 us, which a smaller grid could wait for at its end
SMEM_LEAD_MIN_PROGRAMS_PER_SM = 24
# Softmax over an outer dim leaves neighbouring rows, not columns, adjacent in memory; a program
# then takes at least this many rows so each column load is one coalesced access across rows.
ADJACENT_ROWS = 32
# SM count used under the interpreter
INTERPRETER_SMS = 3
# The first call (a GPU, a direct launch, no CUDA-graph capture or torch.compile trace) of the
# forward's short-row tile and row loop times the pick beside other forms and keeps the fastest
# for that shape: GPUs of one sm_90 want different ones (docs/kernels/softmax.md, "First-call
# tuning"). KBENCH_SOFTMAX_TUNE=0 keeps the pick.
TUNE = os.environ.get("KBENCH_SOFTMAX_TUNE", "1") != "0"
# Smaller inputs keep the pick (launch-bound: timing would cost more than it could save); from
# this size up every pick fills the SMs with whole tiles, the same for rows of one power of 2.
TUNE_MIN_BYTES = 8 * 2**20
TUNE_TILE_BYTES = (1024, 2048, 4096)
TUNE_ROUNDS = 5  # timing rounds over the candidates; each keeps its best round
TUNE_CALLS = 10  # calls a candidate a round, each timed alone after an L2 flush
TUNE_CPU_US_PER_CALL = 150.0  # the CPU path of one call, at most
# (device, dtype, columns, rows rounded up to a power of 2) -> the chosen Config
_TUNED: dict = {}
TUNING_CACHES.append(_TUNED)
# Direct launches of the tile and online kernels, remembered by _plan_key, so that the next
# call with the key launches the compiled kernel at once (the host path is most of a small
# call's time); not a pick the first call would have timed but could not, nor a wrapper's.
_PLANS: dict = {}
PLANS_MAX = 1024  # a cache of more keys is cleared, not grown
TUNING_CACHES.append(_PLANS)


class Config(NamedTuple):
    """How one launch covers the rows; _pick_config chooses it, the first call may time others."""

    design: str  # "tile", "online", "smem", "coop" or "split2"
    block_rows: int
    block_cols: int  # tile: the padded row; coop/smem/split2: the chunk; online: the loop tile
    num_warps: int
    # evict_first on single-use loads and stores (online: evict_last on the first read)
    evict: bool = False
    # the forward's exp: 0 tl.exp, 1 exp2((x - max)·log2e), 2 exp2(x·log2e - max·log2e)
    # (tile._exp_shifted)
    exp2: int = 0
    # the tile/online forward: no masks where the rows fill the blocks exactly, and 32-bit
    # offsets where every tensor's extent fits in int32 (_index_hints); the smem forward: no
    # masks, and a row's chunks interleaved, where rows are whole chunks
    even: bool = False
    # the online forward in Inductor's arithmetic (online.softmax_online_kernel's INDUCTOR),
    # its stores with the default policy
    inductor: bool = False
    # the coop/split2 backward over 16-bit rows: each pair of neighbouring values held as one
    # int32, where the strides allow (split.softmax_backward_split_pairs_kernel)
    pairs: bool = False
    # coop/split2/smem: cap ptxas at this many registers a thread (0: no cap)
    maxnreg: int = 0
    # the smem forward: smem.LEAD_PER_SM lead programs an SM ahead of the chunks' (_lead_wait)
    lead: bool = False


def softmax_reference(x: torch.Tensor, dim: int) -> torch.Tensor:
    # reads MN, writes MN: 2·MN·bytes
    x32 = x.float()
    exp = torch.exp(x32 - x32.amax(dim, keepdim=True))
    return (exp / exp.sum(dim, keepdim=True)).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# The pick
# ---------------------------------------------------------------------------------------------
def _sm_count(device: torch.device) -> int:
    info = gpu_info(device)
    return INTERPRETER_SMS if info is None else info.sms


def _warps_for(tile_bytes: int) -> int:
    # 128 bytes a thread: eight 16-byte loads in flight per thread (4 to 16 warps)
    return max(4, min(16, tile_bytes // (128 * 32)))


def _row_loop_warps(row_bytes: int) -> int:
    # rows of up to 8 KB on 4 warps, 16 KB rows on 16, longer rows on 8 (docs/kernels/softmax.md,
    # "Row loop")
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
    """The design and sizes measured best for these rows (docs/kernels/softmax.md, "Shipped
    design"). rows_adjacent: neighbouring rows, not columns, are adjacent in memory. smem_ok:
    the rows can take the smem design (unit column strides, 16-byte aligned rows, a direct
    launch on a Hopper GPU: _smem_fits)."""
    min_rows = min(ADJACENT_ROWS if rows_adjacent else 1, next_power_of_2(rows_inner))
    padded_cols = next_power_of_2(n_cols)
    loop_min_cols = ROW_LOOP_MIN_COLS.get(itemsize, ONE_PASS_MAX_ELEMS + 1)
    if not backward and min_rows == 1 and loop_min_cols <= padded_cols <= ONE_PASS_MAX_ELEMS:
        return Config("online", 1, padded_cols, _row_loop_warps(padded_cols * itemsize),
                      evict=True, exp2=1, even=True)  # fmt: skip
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
            return Config("tile", block_rows, padded_cols, SMALL_TILE_WARPS[itemsize], even=True)
        # the backward loads two inputs: twice the bytes a thread
        warps = _warps_for(elems * itemsize * (2 if backward else 1))
        if elems >= 16384:
            warps = 16  # one long row: 16 warps measured best in bf16, level in fp32
        return Config("tile", block_rows, padded_cols, warps)
    n_inputs = 2 if backward else 1
    # the forward: one 32 KB chunk a program; the backward: 16 KB of y and of dy
    base_chunk = (SMEM_BUFFER_BYTES if backward else SMEM_PROGRAM_BYTES) // itemsize
    smem_chunk = max(base_chunk, next_power_of_2(cdiv(n_cols, MAX_SPLIT_CHUNKS)))
    buffers = 2 if backward else 1  # the backward: the bound of two buffers of each input
    if smem_ok and min_rows == 1 and buffers * n_inputs * smem_chunk * itemsize <= SMEM_MAX_BYTES:
        # chunks in shared memory: docs/kernels/softmax.md, "Long rows: smem"
        if backward:
            warps = min(16, SMEM_WARPS * smem_chunk // base_chunk)
            return Config("smem", 1, smem_chunk, warps)
        warps = min(16, SMEM_WARPS * smem_chunk // SMEM_CHUNK_ELEMS)
        programs = rows_inner * rows_outer * cdiv(n_cols, smem_chunk)
        many = programs >= SMEM_LEAD_MIN_PROGRAMS_PER_SM * _sm_count(device)
        return Config("smem", 1, smem_chunk, warps, exp2=2 if itemsize == 2 else 1, even=True,
                      maxnreg=SMEM_PID_MAXNREG if warps >= 8 else 0,
                      lead=many and smem_chunk == base_chunk)  # fmt: skip
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
        # chunks in registers: docs/kernels/softmax.md, "Long rows: coop"
        design = "coop" if on_gpu else "split2"
        # a chunk grown past the usual size gets more warps in proportion, so as not to spill
        warps = min(16, SPLIT_WARPS * max(1, min_rows * chunk_cols // chunk_elems))
        if backward:
            return Config(design, min_rows, chunk_cols, warps, pairs=pairs)
        # the forward: the exp2 forms, evict_first in 16-bit
        half = itemsize == 2
        capped = on_gpu and cdiv(n_cols, chunk_cols) > COOP_CAP_MIN_CHUNKS
        return Config(
            design, min_rows, chunk_cols, warps, exp2=2 if half else 1, evict=half,
            maxnreg=COOP_FORWARD_MAXNREG.get(itemsize, 0) if capped else 0,
        )  # fmt: skip
    block_cols = min(LOOP_TILE_ELEMS, ONE_PASS_MAX_ELEMS) // min_rows
    return Config("online", min_rows, block_cols, 4 if block_cols * min_rows <= 2048 else 8)


# ---------------------------------------------------------------------------------------------
# The first call's choice
# ---------------------------------------------------------------------------------------------
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
    thread, thinned for few rows as _pick_config thins its tiles; then the row loop on the same
    blocks, the online pick's form (x read twice, the second time from L2, as Inductor's looped
    kernel); no duplicates."""
    candidates = [pick]
    cols = pick.block_cols
    for design in ("tile", "online"):
        for tile_bytes in TUNE_TILE_BYTES:
            block_rows = _tile_block_rows(tile_bytes, cols, itemsize, 1, rows_inner, rows_outer,
                                          device)  # fmt: skip
            warps = max(1, min(16, block_rows * cols * itemsize // (16 * 32)))
            candidate = Config(design, block_rows, cols, warps, even=True)
            if design == "online":
                candidate = candidate._replace(evict=True, exp2=1)
            if candidate not in candidates:
                candidates.append(candidate)
    return candidates


def _online_candidates(pick: Config) -> list[Config]:
    """The online forward's pick, then the same loop in Inductor's arithmetic (Config.inductor),
    and half the warps, where the pick has 8 or more."""
    candidates = [pick, pick._replace(inductor=True)]
    if pick.num_warps >= 8:
        candidates.append(pick._replace(num_warps=pick.num_warps // 2))
    return candidates


def _first_call_candidates(pick: Config, backward: bool, rows_inner: int, rows_outer: int,
                           itemsize: int, device: torch.device):  # fmt: skip
    """What the first call may time against the pick (a function giving the candidates, the
    pick first), or None: the forward's short-row tile and its row loop."""
    if backward:
        return None
    if pick.design == "tile" and pick.block_cols <= SMALL_TILE_MAX_COLS.get(itemsize, 0):
        return lambda: _tile_candidates(pick, rows_inner, rows_outer, itemsize, device)
    if pick.design == "online":
        return lambda: _online_candidates(pick)
    return None


def _label(config: Config) -> str:
    inductor = " inductor" if config.inductor else ""
    return f"{config.design} {config.block_rows}x{config.block_cols} w{config.num_warps}{inductor}"


def _time_candidate(fn) -> float:
    """GPU ms a call of `fn`: the median of TUNE_CALLS calls, each after an L2 flush, as the
    benchmark times a call."""
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


# ---------------------------------------------------------------------------------------------
# Launching
# ---------------------------------------------------------------------------------------------
def _plan_key(moved: list[torch.Tensor], backward: bool, scale: float = 1.0) -> tuple:
    """What a launch's plan depends on: the rows' shapes and strides (the pick, the grid, the
    index hints), dtype and device, each tensor's 16-byte alignment (Triton's specialization of
    a pointer), and the scale (an argument the plan passes)."""
    first = moved[0]
    return (backward, first.dtype, first.device, first.shape, scale,
            *[(t.stride(), t.data_ptr() % 16) for t in moved])  # fmt: skip


def _launch_planned(launch: Launcher, kernel, grid: int, moved: list[torch.Tensor], args: tuple,
                    meta: dict, plan_key: tuple | None) -> Step | None:  # fmt: skip
    """launch(kernel)[(grid,)](*moved, *args, **meta), remembered under plan_key (unless None)
    as a kernels._launch.Step for the next call with the same key (_PLANS): that call launches
    the compiled kernel through its own launcher. Returns the step remembered, if any."""
    step = Step(launch(kernel), (grid,), args, meta)
    if plan_key is None:  # nothing keeps the step: arming it would cost more than it saves
        step.once(*moved)
        return None
    step(*moved)
    if step.fast is None:
        return None  # no compiled kernel (the interpreter, an offline compile)
    if len(_PLANS) >= PLANS_MAX:
        _PLANS.clear()
    _PLANS[plan_key] = step
    return step


def _keep_alternating(plan_key, made: Alternate | None) -> AlternatingPlan | None:
    """A coop/smem launch's plan under plan_key: the step just launched joins the plan of its
    workspace pair (a new plan where the pair is new); None where there is nothing to keep."""
    if plan_key is None or made is None or made.step.fast is None:
        return None
    plan = _PLANS.get(plan_key)
    if not isinstance(plan, AlternatingPlan) or plan.pair is not made.pair:
        if len(_PLANS) >= PLANS_MAX:
            _PLANS.clear()
        plan = _PLANS[plan_key] = AlternatingPlan(made, torch._C._cuda_getDevice())
    plan.steps[made.parity] = made.step
    return plan


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


def _index_hints(config: Config, rows: tuple[int, int], strides: list, n_cols: int) -> dict:
    """The tile/online forward's index constexprs: EVEN where Config.even asks and the rows fill
    the kernel's blocks exactly (no masks), INT32 where it asks and the largest offset the
    kernel forms, padding included, fits in 32 bits; ONE_OUTER where there is one outer row
    index, DENSE where every tensor's rows are block_cols (= n_cols) apart with unit column
    strides, and (the online kernel's) ONE_STEP where a row is one step of its loops. Always
    all passed: torch.compile's wrapper of a user Triton kernel wants every parameter."""
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
    hints = dict(EVEN=config.even and even, INT32=config.even and largest < 2**31,
                 ONE_OUTER=rows_outer == 1, DENSE=dense)
    if config.design == "online":
        hints["ONE_STEP"] = n_cols == config.block_cols
    return hints


def _launch_smem(launch, moved, backward, rows, strides, config: Config) -> Alternate | None:
    """The smem design: smem's Gluon kernels on the coop workspaces. Returns the launch as an
    Alternate where it took the cached pair."""
    if is_interpreter() or gpu_info(moved[0].device) is None or smem is None:
        raise ValueError("the smem design (Gluon) needs a GPU and a Triton with Gluon; the "
                         "interpreter takes split2")  # fmt: skip
    n_cols = moved[0].shape[-1]
    if config.block_rows != 1 or not _smem_fits(moved, strides, n_cols):
        raise ValueError(
            "the smem design takes one row a program, rows of unit column stride and 16-byte "
            f"aligned starts; got {config} for strides {strides}"
        )
    rows_outer, rows_inner = rows
    n_ws = smem.workspace_words(rows_outer * rows_inner * cdiv(n_cols, config.block_cols),
                                cdiv(n_cols, config.block_cols))  # fmt: skip
    pair = coop_workspace(n_ws, moved[0].device)
    if pair is None:  # under graph capture: a zeroed workspace of its own, nothing to clear
        ws, next_ws = torch.zeros(n_ws, device=moved[0].device, dtype=torch.int64), None
    else:
        ws, next_ws = pair[pair[2]], pair[1 - pair[2]]
    lead = smem.LEAD_PER_SM * _sm_count(moved[0].device) if config.lead else 0
    parity = None if pair is None else pair[2]
    step = smem.launch(launch, backward, moved, ws, next_ws, rows, strides, config.block_cols,
                       config.num_warps, exp2=config.exp2, even=config.even, lead=lead,
                       maxnreg=config.maxnreg)  # fmt: skip
    if pair is None:
        return None
    pair[2] ^= 1  # launched: next_ws is (being) zeroed for the next launch
    return Alternate(pair, parity, step, with_next=True)


def _launch_rows(
    launch: Launcher, moved: list[torch.Tensor], backward: bool, config: Config | None = None,
    scale: float = 1.0,
) -> Step | None:
    """Launch the forward or backward over the rows of `moved` (inputs, then the output),
    with `config`, or the pick (and the first call's choice) where None; softmax(x·scale) and
    its gradient. Returns the launch's plan (a Step over `moved`) where it has one."""
    n_cols = moved[0].shape[-1]
    if moved[0].numel() == 0:
        return None
    device = moved[0].device
    plan_key = None
    if launch is direct and gpu_info(device) is not None:
        # a given config (the first call's timing of candidates) keeps its own plan, so each
        # timed call takes the armed launch, not the JIT's: a host path far under the timer's lead
        plan_key = _plan_key(moved, backward, scale) if config is None else (
            _plan_key(moved, backward, scale), config)
        plan = _PLANS.get(plan_key)
        if plan is not None and plan(*moved) is not False:  # False: a coop/smem plan declined
            return plan
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
            n_cols > ONE_PASS_MAX_ELEMS and smem is not None and launch is direct
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
                lambda c: _launch_rows(launch, moved, False, c, scale),
                f"forward {str(moved[0].dtype).removeprefix('torch.')} {rows} x {n_cols}",
            )
    if scale != 1.0 and config.design in ("coop", "split2", "smem"):
        return _launch_scaled_apart(launch, moved, backward, scale)
    if config.design in ("coop", "split2"):
        made = launch_split(launch, moved, backward, (rows_outer, rows_inner), strides, config)
        return _keep_alternating(plan_key, made)
    if config.design == "smem":
        made = _launch_smem(launch, moved, backward, (rows_outer, rows_inner), strides, config)
        return _keep_alternating(plan_key, made)
    if config.design not in ("tile", "online"):
        raise ValueError(f"unknown softmax design {config.design!r}")
    if config.design == "tile" and config.block_cols < n_cols:
        raise ValueError(f"tile of {config.block_cols} columns for rows of {n_cols}")
    flat_strides = [s for tensor_strides in strides for s in tensor_strides]
    row_blocks = rows_outer * cdiv(rows_inner, config.block_rows)
    meta = dict(BLOCK_ROWS=config.block_rows, BLOCK_COLS=config.block_cols,
                num_warps=config.num_warps)  # fmt: skip
    if not backward:
        meta.update(_index_hints(config, (rows_outer, rows_inner), strides, n_cols))
    meta["SCALED"] = scale != 1.0
    if config.design == "tile":
        kernel = softmax_backward_tile_kernel if backward else softmax_tile_kernel
        args = (rows_inner, n_cols, row_blocks, *flat_strides, scale)
    else:
        kernel = softmax_backward_online_kernel if backward else softmax_online_kernel
        args = (rows_inner, n_cols, *flat_strides, scale)
        if not backward:
            # the first read asks L2 to keep the row for the second, which then drops it
            policy = "evict_first" if config.evict else ""
            meta.update(FIRST_POLICY="evict_last" if config.evict else "", POLICY=policy,
                        EXP2=int(config.exp2), STORE_POLICY="" if config.inductor else policy,
                        INDUCTOR=config.inductor, LIBDEVICE=not is_interpreter())  # fmt: skip
    return _launch_planned(launch, kernel, row_blocks, moved, args, meta, plan_key)


def _launch_scaled_apart(launch, moved, backward: bool, scale: float) -> None:
    """The long-row designs (coop, split2, smem) with a scale: they take none, so the forward
    reads x·scale made first in fp32 and writes an fp32 y that is then cast into the output (as
    exact as the fused product), and the backward scales its dx after; passes more over the
    rows, and no plan (a plan launches on the tensors as given). The tile and online designs
    fuse it (tile._scaled)."""
    if backward:
        _launch_rows(launch, moved, True)
        moved[-1].mul_(scale)
    else:
        x, y = moved
        y32 = torch.empty(y.shape, device=y.device, dtype=torch.float32)
        _launch_rows(launch, [x.to(torch.float32, copy=True).mul_(scale), y32], False)
        y.copy_(y32)


def _launch_moved(inputs: list[torch.Tensor], dim: int, backward: bool, launch: Launcher,
                  config: Config | None, front_key=None, scale: float = 1.0) -> torch.Tensor:
    """The output of the forward or backward over `dim` of `inputs` (checked, dim normalized):
    dim moved last (as they are where it is last: no views to make, host time as _PLANS),
    a row-major output, the launch, and the output with dim moved back. With a front_key, a
    launch over the last dim that has a plan leaves it under that key (_FRONT)."""
    last = dim == inputs[0].dim() - 1
    moved = [t if last else t.movedim(dim, -1) for t in inputs]
    out = torch.empty(moved[0].shape, device=moved[0].device, dtype=moved[0].dtype)
    step = _launch_rows(launch, [*moved, out], backward, config, scale)
    if step is not None and last and front_key is not None:
        _FRONT.put(front_key, (step, tuple(out.shape), out.stride()))
    return out if last else out.movedim(-1, dim)


# The public functions' plans: a direct call whose key (the front_key functions below) was
# planned before launches its Step at once, with no checks (each is a function of the key) and
# none of the layers between; softmax over the last dim only (the others move it first).
_FRONT = PlanCache()


def _forward_key(x, dim, scale) -> tuple | None:
    if torch.compiler.is_compiling():
        return None
    try:
        return (x.shape, x.stride(), x.dtype, x.device, x.data_ptr() % 16, dim, scale)
    except AttributeError:
        return None  # not a tensor: the checks say so


def _backward_key(y, dy, dim, scale) -> tuple | None:
    if torch.compiler.is_compiling():
        return None
    try:
        return (y.shape, y.stride(), dy.shape, dy.stride(), y.dtype, dy.dtype, y.device,
                dy.device, y.data_ptr() % 16, dy.data_ptr() % 16, dim, scale)  # fmt: skip
    except AttributeError:
        return None


def _forward(x: torch.Tensor, dim: int, launch: Launcher, config: Config | None,
             front_key=None, scale: float = 1.0) -> torch.Tensor:  # fmt: skip
    check_tensor("x", x)
    dim = _normalize_dim(dim, x.dim(), tuple(x.shape))
    if x.dim() == 0:
        return _forward(x.unsqueeze(0), 0, launch, config, scale=scale).squeeze(0)
    return _launch_moved([x], dim, False, launch, config, front_key, scale)


def _backward(y, dy, dim, launch: Launcher, config: Config | None,
              front_key=None, scale: float = 1.0) -> torch.Tensor:  # fmt: skip
    check_tensor("y", y)
    check_tensor("dy", dy)
    check_same({"y": y, "dy": dy})
    if y.shape != dy.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but y has {tuple(y.shape)}")
    dim = _normalize_dim(dim, y.dim(), tuple(y.shape))
    if y.dim() == 0:
        y, dy = y.unsqueeze(0), dy.unsqueeze(0)
        return _backward(y, dy, 0, launch, config, scale=scale).squeeze(0)
    return _launch_moved([y, dy], dim, True, launch, config, front_key, scale)


def check_scale(scale) -> float:
    """softmax's scale= as a float: None is 1; a finite real number, not a tensor or a bool."""
    if scale is None:
        return 1.0
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def softmax_forward(x: torch.Tensor, dim: int, *, scale: float = 1.0,
                    launch: Launcher = direct) -> torch.Tensor:  # fmt: skip
    """torch.softmax(x * scale, dim) without autograd, the product taken in fp32 on the way in
    (not written out; rows longer than ONE_PASS_MAX_ELEMS: _launch_scaled_apart); the output is
    a view of a row-major buffer. scale is a float, as check_scale returns it."""
    key = _forward_key(x, dim, scale) if launch is direct else None
    if key is not None:
        plan = _FRONT.get(key)
        if plan is not None:
            step, shape, strides = plan
            out = x.new_empty_strided(shape, strides)
            if step(x, out) is not False:  # False: a coop/smem plan declined
                return out
    return _forward(x, dim, launch, None, key, scale)


def softmax_backward(
    y: torch.Tensor, dy: torch.Tensor, dim: int, *, scale: float = 1.0,
    launch: Launcher = direct,
) -> torch.Tensor:
    """Gradient of softmax_forward: dx = scale * y * (dy - sum(y * dy, dim)), y its output."""
    key = _backward_key(y, dy, dim, scale) if launch is direct else None
    if key is not None:
        plan = _FRONT.get(key)
        if plan is not None:
            step, shape, strides = plan
            out = dy.new_empty_strided(shape, strides)
            if step(y, dy, out) is not False:
                return out
    return _backward(y, dy, dim, launch, None, key, scale)


def cast_input(x, dtype) -> torch.Tensor:
    """x as `dtype` (softmax's dtype=), checked: a tensor of a dtype torch can cast, to one of
    the kernels' dtypes."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"dtype={dtype} is not supported; supported dtypes are {names}")
    return x if x.dtype == dtype else x.to(dtype)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, scale):
        y = softmax_forward(x, dim, scale=scale)
        ctx.save_for_backward(y)
        ctx.dim, ctx.scale = dim, scale
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(y, dy, ctx.dim, scale=ctx.scale), None, None


def softmax(x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None, *,
            scale: float | None = None) -> torch.Tensor:  # fmt: skip
    """torch.softmax(x, dim, dtype=dtype): fp32 math inside, differentiable once. The output has
    x's dtype, or `dtype` where given: as in torch, x is cast to it first (a separate copy;
    fp16, bf16 or fp32).

    scale: softmax(x * scale), the product taken in fp32 as x is read (attention's 1/sqrt(d)),
    and scale·y·(dy - Σ y·dy) in the backward, so neither pass writes x * scale out. torch has
    no such argument; any finite real number, None for 1.

    A row that is entirely -inf gives NaN, as torch does; -inf entries in other rows give 0.
    """
    scale = check_scale(scale)
    if dtype is not None:
        x = cast_input(x, dtype)
    if getattr(x, "requires_grad", False) and torch.is_grad_enabled():
        return _Softmax.apply(x, dim, scale)
    return softmax_forward(x, dim, scale=scale)  # no graph to record: no autograd.Function
