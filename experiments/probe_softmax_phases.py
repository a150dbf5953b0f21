"""Where a long-row smem forward program spends its life (GPU, Gluon; a probe, not a benchmark).

The smem forward (kernels/softmax_smem.py) runs one program per (row, chunk): it copies its chunk
into shared memory, publishes the chunk's partial, waits for the row's other partials and writes
its chunk. Round 17's profile (kernels/notes/softmax.md) put an H200 program's life at about
15 us for 32 KB, but not which phase takes it. This module launches the same kernel with four
timestamps a program (%globaltimer, ns, one clock for the whole GPU; and %clock64, the SM's
cycles) written to a side buffer:

    t0  the ticket taken (the program's start)
    t1  the chunk's partial ready (its copies landed, its max and sum taken)
    t2  the row's partials all published (the end of the wait)
    t3  its chunk written (the stores issued)

and prints, per shape: the launch's time with and without the stamps, each phase's percentiles,
how many programs were alive on average, and for each row how far apart its chunks started and
published.

    python -m experiments.probe_softmax_phases --only 65536,262144
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

import torch

from experiments.probe_softmax import DTYPES, bench_gpu
from kernels._common import gpu_info
from kernels.softmax import Config, _launch_rows, _pick_config, softmax, softmax_reference

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

    from kernels import softmax_smem as sk
except ImportError:  # a Triton without Gluon: main() says so
    gluon = None

# int64 words a program: t0-t3 by globaltimer, t0-t3 by clock64, the SM, then the program's
# entry (before it asks for its ticket) by globaltimer and by clock64
STAMPS = 11
PHASES = ("ticket", "load+partial", "wait", "write", "life")
# the launch's two ends in summarize: EDGE_STEPS moments STEP_US apart from its first start and
# up to its last end
STEP_US, EDGE_STEPS = 2.0, 8

if gluon is not None:
    STAMPS_C = gl.constexpr(STAMPS)
    GLOBALTIMER = gl.constexpr("mov.u64 $0, %globaltimer;")  # ns, one clock for the GPU
    CLOCK64 = gl.constexpr("mov.u64 $0, %clock64;")  # the SM's cycles

    @gluon.jit
    def _stamp(after, ASM: gl.constexpr):
        """A timer (ASM) read once `after` (an int32) is computed, as an int64."""
        return gl.inline_asm_elementwise(ASM, "=l,r", [after], dtype=gl.int64, is_pure=False,
                                         pack=1)  # fmt: skip

    @gluon.jit
    def _smid(ticket):
        return gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [ticket], dtype=gl.int32,
                                         is_pure=False, pack=1)  # fmt: skip

    @gluon.jit
    def stamped_forward_kernel(
        x_ptr, y_ptr, ws_ptr, next_ptr, stamps_ptr,
        rows_inner, n_vecs, n_chunks, ticket_index,
        x_vstride_outer, x_vstride_inner, y_vstride_outer, y_vstride_inner,
        CHUNK: gl.constexpr, PIECE: gl.constexpr, VEC: gl.constexpr, WARPS: gl.constexpr,
        MAX_CHUNKS: gl.constexpr, SLEEP_NS: gl.constexpr, EXP2: gl.constexpr,
        POLICY: gl.constexpr, CLEAR: gl.constexpr, BY_PID: gl.constexpr = False,
        LEAD: gl.constexpr = 0, LEAD_TIERS: gl.constexpr = 1, LEAD_NS: gl.constexpr = 0,
        TAIL_PF: gl.constexpr = 0,
    ):  # fmt: skip
        """kernels.softmax_smem.softmax_smem_forward_kernel (FOLD 0, REGS 0), stamped. BY_PID:
        the ticket is the program id, no atomic (a probe of what the atomic costs: the wait is
        then deadlock-free only if the GPU starts programs in id order, as it does in practice
        but does not promise). LEAD, LEAD_TIERS, LEAD_NS: the lead programs ahead of the
        chunks' (Config.lead; round 27), unstamped; TAIL_PF: the first TAIL_PF of them prefetch
        the last chunks into L2 (Config.tail_pf)."""
        if LEAD > 0:
            if gl.program_id(0) < LEAD:
                sk._lead_program(x_ptr, ws_ptr, ticket_index, rows_inner, n_vecs, n_chunks,
                                 x_vstride_outer, x_vstride_inner, CHUNK, VEC, WARPS, LEAD,
                                 LEAD_TIERS, LEAD_NS, TAIL_PF)  # fmt: skip
                return
        PIECES: gl.constexpr = CHUNK // PIECE
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [WARPS], [0])
        offs = gl.arange(0, PIECE, layout=layout)
        pid = gl.program_id(0)
        g_entry = _stamp(pid, GLOBALTIMER)
        c_entry = _stamp(pid, CLOCK64)
        if BY_PID:
            ticket = sk._pid_ticket(next_ptr, ticket_index, n_chunks, CLEAR, LEAD=LEAD)
        else:
            ticket = sk._take_ticket(ws_ptr, next_ptr, ticket_index, CLEAR)
        # each stamp stored at once: nothing held in registers across the phases
        base = stamps_ptr + ticket.to(gl.int64) * STAMPS_C
        gl.store(base + 9, g_entry)
        gl.store(base + 10, c_entry)
        gl.store(base + 0, _stamp(ticket, GLOBALTIMER))
        gl.store(base + 4, _stamp(ticket, CLOCK64))
        gl.store(base + 8, _smid(ticket).to(gl.int64))
        outer, inner, start, limit, slots, _ = sk._position(
            ws_ptr, ticket, rows_inner, n_vecs, n_chunks, CHUNK, VEC
        )  # fmt: skip
        x_row = sk._chunk_start(x_ptr, outer, inner, x_vstride_outer, x_vstride_inner, start,
                                VEC)  # fmt: skip
        smem = gl.allocate_shared_memory(
            x_ptr.dtype.element_ty, [PIECES, PIECE], gl.SwizzledSharedLayout(1, 1, 1, [0])
        )  # fmt: skip
        for p in gl.static_range(PIECES):
            sk._copy_in(smem, x_row, offs, limit, p, PIECE, POLICY)
            cp.commit_group()
        partial = sk._forward_partial(smem, 0, offs, limit, PIECES, PIECE, VEC, WARPS, EXP2, 0)
        gl.store(base + 1, _stamp(partial.to(gl.int32), GLOBALTIMER))
        gl.store(base + 5, _stamp(partial.to(gl.int32), CLOCK64))
        gl.atomic_xchg(ws_ptr + ticket, partial, sem="relaxed")
        # the wait alone: _forward_finish then finds the slots published and returns at once
        packed, _, _ = sk._row_slots(slots, n_chunks, MAX_CHUNKS, SLEEP_NS, WARPS)
        arrived = gl.sum(packed, axis=0).to(gl.int32)
        gl.store(base + 2, _stamp(arrived, GLOBALTIMER))
        gl.store(base + 6, _stamp(arrived, CLOCK64))
        row_max, _ = sk._forward_finish(
            y_ptr, smem, 0, slots, n_chunks, outer, inner, start, y_vstride_outer,
            y_vstride_inner, offs, limit, PIECES, PIECE, VEC, WARPS, MAX_CHUNKS, SLEEP_NS, EXP2,
            POLICY,
        )  # fmt: skip
        gl.store(base + 3, _stamp(row_max.to(gl.int32), GLOBALTIMER))
        gl.store(base + 7, _stamp(row_max.to(gl.int32), CLOCK64))


# a register cap so that the stamps do not cost the kernel a program an SM (the bf16 pick: 32
# registers, 6 programs of 8 warps; stamped without the cap, 44 and 5)
STAMPED_MAXNREG = 40


class _Stamping:
    """A launcher (kernels._common.Launcher) that runs stamped_forward_kernel in place of the
    one-shot smem forward, so the rows, strides, workspace and meta are the production path's
    (kernels.softmax._launch_rows); it adds the stamps, the ticket choice and the register cap,
    and drops FOLD (the probe refuses configs with fold) and the pick's BY_PID, LEAVE_POLLS,
    EVEN, POLL_WIDTH, TRANSPOSE and STRIDE (the probe's --by-pid chooses the ticket; the stamped
    kernel masks, never leaves and takes whole chunks, not Config.interleave's). Lead programs
    (--lead) take no ticket: the chunks' programs take the program id less the leads (--by-pid)
    or the atomic's."""

    def __init__(self, stamps: torch.Tensor, by_pid: bool):
        self.stamps, self.by_pid = stamps, by_pid

    def __call__(self, kernel):
        if kernel is not sk.softmax_smem_forward_kernel:
            raise ValueError(f"only the one-shot smem forward has a stamped twin, not {kernel}")
        return self

    def __getitem__(self, grid):
        def call(x, y, ws, next_ws, *args, FOLD=0, BY_PID=False, LEAVE_POLLS=0, EVEN=False,
                 POLL_WIDTH=0, TRANSPOSE=False, STRIDE=0, **meta):
            stamped_forward_kernel[grid](
                x, y, ws, next_ws, self.stamps, *args, BY_PID=self.by_pid,
                **{**meta, "maxnreg": STAMPED_MAXNREG},
            )  # fmt: skip

        return call


def launch_stamped(x: torch.Tensor, y: torch.Tensor, config: Config, stamps: torch.Tensor,
                   by_pid: bool = False):  # fmt: skip
    """The smem forward of x -> y with config, stamps[ticket] filled."""
    _launch_rows(_Stamping(stamps, by_pid), [x, y], False, config)


def _percentiles(values: torch.Tensor) -> str:
    q = torch.quantile(values.double(), torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64))
    return " / ".join(f"{v:7.2f}" for v in q.tolist())


def _slot_gaps(sm_ids: torch.Tensor, entry: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """Per SM (clock64, one clock an SM): with S the most programs it held at once, the time
    from the k-th end to the (k + S)-th entry, the time a program slot stood empty between
    programs (programs matched to slots in time order)."""
    gaps = []
    for sm_id in sm_ids.unique():
        on = sm_ids == sm_id
        starts, ends = entry[on].sort().values, end[on].sort().values
        events = torch.cat([starts, ends]).argsort(stable=True)
        steps = torch.cat([torch.ones_like(starts), -torch.ones_like(ends)])[events]
        slots = int(steps.cumsum(0).max())
        if len(starts) > slots:
            gaps.append(starts[slots:] - ends[: len(starts) - slots])
    return torch.cat(gaps) if gaps else torch.zeros(1)


def summarize(stamps: torch.Tensor, n_chunks: int, sms: int) -> list[str]:
    """Lines describing one stamped launch (stamps: (programs, STAMPS) int64 on the CPU)."""
    g = torch.cat([stamps[:, 9:10], stamps[:, 0:4]], 1).double() / 1000.0  # us: entry, t0-t3
    c = torch.cat([stamps[:, 10:11], stamps[:, 4:8]], 1).double()
    start, end = g[:, 0].min().item(), g[:, 4].max().item()
    wall = end - start
    cycles = c[:, 4] - c[:, 0]
    life = g[:, 4] - g[:, 0]
    mhz = (cycles.sum() / life.sum()).item()  # cycles per us: the SMs' clock
    phases = [(c[:, k + 1] - c[:, k]) / mhz for k in range(4)] + [cycles / mhz]
    lines = [
        f"  stamped launch {wall:8.2f} us (first start to last end), {len(g)} programs, "
        f"SM clock {mhz:.0f} MHz, {life.sum().item() / wall / sms:.2f} programs alive an SM "
        f"on average",
        "  phase (us, clock64)      p10 /     p50 /     p90   share of the mean life",
    ]
    mean_life = phases[-1].mean().item()
    for name, v in zip(PHASES, phases, strict=True):
        lines.append(f"  {name:<18} {_percentiles(v)}   {v.mean().item() / mean_life:6.1%}")
    gaps = _slot_gaps(stamps[:, 8], c[:, 0], c[:, 4]) / mhz
    lines.append(f"  a slot empty between programs {_percentiles(gaps)} us (clock64, an SM's "
                 f"programs matched to slots in time order)")  # fmt: skip
    rows = g.shape[0] // n_chunks
    if n_chunks > 1:
        by_row = g.reshape(rows, n_chunks, 5)
        start_spread = by_row[:, :, 0].amax(1) - by_row[:, :, 0].amin(1)
        ready_spread = by_row[:, :, 2].amax(1) - by_row[:, :, 2].amin(1)
        last_ready_to_wait_end = by_row[:, :, 3].amin(1) - by_row[:, :, 2].amax(1)
        lines += [
            f"  a row's chunks: start spread {_percentiles(start_spread)} us (globaltimer), "
            f"partials-ready spread {_percentiles(ready_spread)}",
            f"  a row's last partial ready -> its first wait ends: "
            f"{_percentiles(last_ready_to_wait_end)} us",
        ]
    ramp = g[:, 4].min().item() - start  # until the first program ends
    tail = end - g[:, 0].max().item()  # from the last program's start
    lines.append(
        f"  ramp (to the first end) {ramp:.2f} us, tail (from the last start) {tail:.2f} us"
    )
    # round 26: the launch against its steady rate, and what the programs do at its two ends
    q10, q90 = torch.quantile(g[:, 4], torch.tensor([0.1, 0.9], dtype=torch.float64)).tolist()
    rate = 0.8 * len(g) / (q90 - q10)  # programs written a us between 10% and 90% of the writes
    lines.append(f"  steady: {rate:.2f} programs written a us (10-90% of the writes); all of them "
                 f"at that rate {len(g) / rate:.2f} us, so {wall - len(g) / rate:.2f} us more a "
                 f"launch")  # fmt: skip
    for label, steps in (("first", [start + k * STEP_US for k in range(EDGE_STEPS)]),
                         ("last", [end - k * STEP_US for k in range(EDGE_STEPS, 0, -1)])):
        counts = {"loading": [], "waiting": [], "writing": []}
        for t in steps:  # entry..t1 loading (and the ticket), t1..t2 waiting, t2..t3 writing
            counts["loading"].append(int(((g[:, 0] <= t) & (g[:, 2] > t)).sum()))
            counts["waiting"].append(int(((g[:, 2] <= t) & (g[:, 3] > t)).sum()))
            counts["writing"].append(int(((g[:, 3] <= t) & (g[:, 4] > t)).sum()))
        lines.append(f"  the {label} {EDGE_STEPS * STEP_US:.0f} us, programs every "
                     f"{STEP_US:.0f} us: " + "; ".join(
                         f"{k} {' '.join(str(v) for v in vs)}" for k, vs in counts.items()))
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="65536,262144", help="comma list of N")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--elems", type=int, default=2**27, help="elements a tensor")
    parser.add_argument(
        "--by-pid", action="store_true", help="also with program ids for tickets (no atomic)"
    )
    parser.add_argument("--save", default="", help="a folder for the raw stamps (.pt)")
    parser.add_argument(
        "--lead", default="", help="K:NS[:P], the pick behind K lead programs an SM in tiers of "
        "NS ns, the first P an SM prefetching the last chunks (Config.lead, lead_ns, tail_pf; "
        "round 27)",
    )  # fmt: skip
    parser.add_argument(
        "--one-chunk", action="store_true",
        help="the long rows' smem pick on rows of N columns, one chunk a row (N: its chunk)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if gluon is None or not torch.cuda.is_available():
        print("needs a CUDA GPU and a Triton with Gluon")
        return 1
    device = torch.device("cuda")
    sms = gpu_info(device).sms
    print(f"# {torch.cuda.get_device_name()}; {sms} SMs; rows of {args.elems} elements")
    for dtype_name in args.dtypes.split(","):
        for n in (int(v) for v in args.only.split(",")):
            dtype = DTYPES[dtype_name]
            x = torch.randn(args.elems // n, n, device=device, dtype=dtype)
            config = _pick_config(n, x.shape[0], False, False, device, x.element_size(), 1, True)
            if args.one_chunk:  # the long rows' pick on rows of one chunk: no wait
                long_pick = _pick_config(4 * n, 1, False, False, device, x.element_size(), 1,
                                         True)  # fmt: skip
                config = long_pick._replace(block_cols=n)
            if args.lead:
                lead, lead_ns, *tail_pf = (int(v) for v in args.lead.split(":"))
                config = config._replace(lead=lead, lead_ns=lead_ns, tail_pf=sum(tail_pf))
            if config.design != "smem" or config.per_sm or config.fold or config.regs:
                print(f"{dtype_name} N={n}: the pick is not the one-shot smem forward: {config}")
                continue
            n_chunks = math.ceil(n / config.block_cols)
            plain = bench_gpu(functools.partial(softmax, x, -1))
            print(f"{dtype_name} {x.shape[0]}x{n}: {config.block_cols} columns a chunk, "
                  f"{config.num_warps} warps, {n_chunks} chunks a row; softmax() {plain * 1e3:.1f} "
                  f"us")  # fmt: skip
            for by_pid in (False, True) if args.by_pid else (False,):
                stamps = torch.zeros(x.shape[0] * n_chunks, STAMPS, device=device,
                                     dtype=torch.int64)  # fmt: skip
                y = torch.empty_like(x)
                launch = functools.partial(launch_stamped, x, y, config, stamps, by_pid)
                launch()
                torch.testing.assert_close(y, softmax_reference(x, -1), atol=2e-3, rtol=2e-2)
                stamped = bench_gpu(launch)
                launch()
                torch.cuda.synchronize()
                what = "program ids for tickets" if by_pid else "the atomic ticket"
                print(f" stamped, {what}: {stamped * 1e3:.1f} us")
                print("\n".join(summarize(stamps.cpu(), n_chunks, sms)))
                if args.save:
                    os.makedirs(args.save, exist_ok=True)
                    name = f"{dtype_name}_{n}" + ("_pid" if by_pid else "")
                    torch.save(stamps.cpu(), os.path.join(args.save, f"stamps_{name}.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
