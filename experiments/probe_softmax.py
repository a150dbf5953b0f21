"""GPU probe for kernels.softmax: copy bandwidth, then each design/config against eager torch.

    python -m experiments.probe_softmax [--dtypes bf16,fp32] [--budget 85] [--rounds 3]
        [--timer gpu|do_bench]

Every variant is first checked against torch.softmax in float64 on the same input, then timed
with the benchmark's GPU timer (experiments.timing.GpuTimer: L2 flushed before each call, a
sleep kernel ahead of it so the call's CPU path is not counted, the median of the samples).
`--timer do_bench` times with triton.testing.do_bench instead, as rounds 1 to 7 did at
first: its mean counts the CPU path when that outlasts the L2 flush, which a Triton launch
through _forward (60-100 us) does on the 64 MB shapes (kernels/notes/softmax.md, round 9).
The variants of a shape are timed in turn, `--rounds` times over, and each keeps its fastest
round: other work on the GPU (round 1 shared it) then costs a round, not the answer. GB/s
counts the minimum traffic: forward reads x and writes y (2·M·N elements), backward reads y
and dy and writes dx (3·M·N).
One table: shape, pass, variant, ms, GB/s, % of copy bandwidth, speedup over eager; then the
best variant per shape. Config names give the bytes of one input per program ("t32K_w8": a
32 KB tile, 8 warps; "c16K_w4": coop chunks of 16 KB). Variants left when the time budget runs
out print SKIPPED. `--smoke` checks the probe itself on the CPU interpreter.

`--round3` swaps in the round 3 candidates (kernels/notes/softmax.md, "Round 3"): each shape
compares `default` (the shipped _pick_config choice) with variants built from the round 3
Config knobs, long rows first, both dtypes per shape; names in ROUND3_NAMES below. Round 3
names count VALUES per program, not bytes ("c4Kv_w4": coop chunks of 4096 values, 4 warps).
    python -m experiments.probe_softmax --round3 --budget 130
Under `--smoke` the waiting (coop) variants cannot run in the interpreter: they run as the
two-launch split2 with the same knobs, which checks everything but the wait.

`--round4` compares the shipped default with the banded two-pass design (Config "band":
kernels/notes/softmax.md, "Round 4") on N = 65536, 262144 and 16384 (a control), both dtypes,
forward and backward; names in ROUND4_NAMES below ("b8M_c4Kv_w4": bands of 8 MiB of input,
chunks of 4096 values, 4 warps). Variants ending in `_g` are captured once in a CUDA graph and
timed as graph replays (do_bench still flushes L2 before each), which takes the host's launch
cost out: a band config launches 2 kernels a band.
    python -m experiments.probe_softmax --round4 --budget 85

`--round5` times the coop chunk/warps grid on the long rows again (the slot gather changed), and
on every N a `same_bytes` row: torch moving the same bytes in one kernel (a copy forward, an add
of y and dy backward), timed the same way, so "% of copy" can be read against the copy of this
size as well as the 1 GB one; names in ROUND5_NAMES below.
    python -m experiments.probe_softmax --round5 --budget 150

`--round6` times forward tiles of other sizes and warps on the short rows (N <= 4096) beside
Inductor's own kernels for the same call (torch.compile in the default and
max-autotune-no-cudagraphs modes) and the same-bytes copy; names in ROUND6_NAMES below.
    python -m experiments.probe_softmax --round6 --budget 150

`--round7` times, on the long rows only, the coop kernel holding 16-bit chunks as int32 pairs
(Config.pairs) and register caps (Config.maxnreg) against the plain coop kernel and the default;
names in ROUND7_NAMES below.
    python -m experiments.probe_softmax --round7 --budget 150

`--round8` times the long rows' coop forward with Config.rescale (no second exp after the
wait) and the exp2, evict, sleep and register-cap knobs; names in ROUND8_NAMES below.
    python -m experiments.probe_softmax --round8 --budget 150

`--round9` times the knobs left around the round 9 picks on the long rows (evict and the poll
sleep on the backward; the sleep and 2K chunks on the forward); names in ROUND9_NAMES below.
    python -m experiments.probe_softmax --round9 --budget 150

`--round10` times, on the long rows, the smem design (chunks held in shared memory, Gluon
kernels in kernels/softmax_smem.py) at several chunks and warps against the coop kernels that
_pick_config chose before it; names in ROUND10_NAMES below.
    python -m experiments.probe_softmax --round10 --budget 150

`--round12` times the forward at N <= 16384 (tiles, and Inductor's looped form at 16384)
beside Inductor's own kernels; names in ROUND12_NAMES below.
    python -m experiments.probe_softmax --round12 --budget 200 --elems 134217728

`--round13` times, at N <= 16384, Inductor's looped form with the whole row a step (the row
loaded twice, the second time from cache), the 16 KB tile and the pick with evict_first, beside
Inductor's kernels compiled afresh for each shape; names in ROUND13_NAMES below.
    python -m experiments.probe_softmax --round13 --budget 200 --elems 134217728

`--round14` times, at N <= 16384, the pick without masks and with 32-bit offsets beside
Inductor's kernels, and past it the smem forward with its partial folded into the pass over the
landing pieces, and 64 KB programs; names in ROUND14_NAMES below.
    python -m experiments.probe_softmax --round14 --budget 240 --elems 134217728

`--round15` times forward tiles of 512 bytes to 2 KB (down to one 16-byte access a thread, as
Inductor's max-autotune configs) at N <= 1024 beside Inductor's kernels; names in ROUND15_NAMES.
    python -m experiments.probe_softmax --round15 --budget 200 --elems 134217728

`--round16` times forward tiles of 2-8 KB with 16 bytes a thread (and 2 KB on 2 warps) at
N <= 1024 beside Inductor's kernels; names in ROUND16_NAMES below.
    python -m experiments.probe_softmax --round16 --budget 200 --elems 134217728

`--round17` times the smem forward's poll interval past the tile; names in ROUND17_NAMES.
    python -m experiments.probe_softmax --round17 --budget 120 --elems 134217728

`--round18` times the smem forward with part of each chunk held in registers (Config.regs) past
the tile; names in ROUND18_NAMES. experiments.probe_softmax_phases stamps the pick's phases.
    python -m experiments.probe_softmax --round18 --budget 120 --elems 134217728

`--round19` times the smem forward's chunks by program id (Config.by_pid) against the atomic
ticket past the tile; names in ROUND19_NAMES. experiments.probe_softmax_ladder builds the
protocol up from a copy through shared memory.
    python -m experiments.probe_softmax --round19 --budget 120 --elems 134217728

`--round20` times the smem forward without masks (Config.even) and chunks by program id that a
waiting program leaves to its row's last publisher; names in ROUND20_NAMES.
    python -m experiments.probe_softmax --round20 --budget 120 --elems 134217728

`--round21` times the smem backward's chunks by program id without masks (the forward's round
20 protocol) against the persistent ticketed pick, and the 16-bit forward's exp2 partly on the
FMA pipe (Config.poly); names in ROUND21_NAMES.
    python -m experiments.probe_softmax --round21 --budget 150 --elems 134217728

`--round22` times the persistent smem forward with chunks by program id (a program's next
chunk loading while it waits for the last one's row, a round of whole rows at a time) against
the one-shot pick past the tile; names in ROUND22_NAMES.
    python -m experiments.probe_softmax --round22 --budget 150 --elems 134217728
`--round23` times the one-shot smem forward's pick leaving its chunk after fewer polls (the waits
of a row's first programs cut short); names in ROUND23_NAMES.
    python -m experiments.probe_softmax --round23 --budget 150 --elems 134217728
`--round26` times the bf16 smem forward widening its values by integer ops (Config.widen);
names in ROUND26_NAMES.
    python -m experiments.probe_softmax --round26 --budget 150 --elems 134217728 --dtypes bf16
`--round27` times the smem forward by program id with lead programs that only hold their slots
a while ahead of the chunks' (Config.lead), so that the first wave starts in turn; names in
ROUND27_NAMES.
    python -m experiments.probe_softmax --round27 --budget 150 --elems 134217728
`--round28` times the smem forward's 32 KB chunks on half (and in fp32 twice) the pick's warps,
with and without leads, and with a row's chunks interleaved; names in ROUND28_NAMES.
    python -m experiments.probe_softmax --round28 --budget 150 --elems 134217728

`--round11` times the persistent smem kernels (a program takes chunks in turn and copies the
next one in while it waits for the previous one's row) against round 10's one-shot kernels, at
N = 16384 and past it; names in ROUND11_NAMES below.
    python -m experiments.probe_softmax --round11 --budget 150 --elems 134217728
"""

import argparse
import functools
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

from experiments.correctness import TOLERANCES, relative_error
from kernels._common import TUNING_LOG
from kernels.softmax import (
    MAX_SPLIT_CHUNKS,
    ONE_PASS_MAX_ELEMS,
    SMEM_PID_MAXNREG,
    Config,
    _backward,
    _forward,
    _pick_config,
    _smem_fits,
    _warps_for,
    direct,
)

# (M, N): every tensor holds 2^25 elements, 64 MB in bf16 (as conf/kernel/softmax.yaml `rows`)
ROWS = [(262144, 128), (65536, 512), (32768, 1024), (8192, 4096), (2048, 16384), (512, 65536),
        (128, 262144)]  # fmt: skip
DEVICE = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def _tile(n: int, itemsize: int, kbytes: float, warps: int, per_sm: int = 0) -> Config:
    cols = triton.next_power_of_2(n)  # the tile's columns: a power of 2 (odd --smoke rows)
    elems = min(max(int(kbytes * 1024) // itemsize, cols), ONE_PASS_MAX_ELEMS)
    return Config("tile", max(1, elems // cols), cols, warps, per_sm)


def _coop(itemsize: int, kbytes: int, warps: int) -> Config:
    return Config("coop", 1, kbytes * 1024 // itemsize, warps)


def forward_candidates(n: int, itemsize: int) -> dict[str, Config]:
    """Named configs to try for rows of n columns (beside the default pick)."""
    if n <= 4096:
        return {
            "t16K_w4": _tile(n, itemsize, 16, 4),
            "t32K_w4": _tile(n, itemsize, 32, 4),
            "t32K_w8": _tile(n, itemsize, 32, 8),
            "t64K_w8": _tile(n, itemsize, 64, 8),
            "t32K_w8_persist": _tile(n, itemsize, 32, 8, -1),
        }
    if n <= 16384:
        return {
            "row_w4": Config("tile", 1, n, 4),
            "row_w8": Config("tile", 1, n, 8),
            "row_w16": Config("tile", 1, n, 16),
            "c16K_w4": _coop(itemsize, 16, 4),
            "c8K_w4": _coop(itemsize, 8, 4),
        }
    return {
        "c8K_w2": _coop(itemsize, 8, 2),
        "c8K_w4": _coop(itemsize, 8, 4),
        "c16K_w4": _coop(itemsize, 16, 4),
        "c16K_w8": _coop(itemsize, 16, 8),
        "c32K_w8": _coop(itemsize, 32, 8),
        "online16K_w8": Config("online", 1, 16384 // itemsize, 8),  # the previous long-row path
    }


# What each round 3 name means (printed at the start of a --round3 run).
ROUND3_NAMES = {
    "default": "the shipped _pick_config choice",
    "exp2": "default + exp2((x - max)*log2e) (Config.exp2=1)",
    "exp2fma": "default + exp2(x*log2e - max*log2e), one FMA (Config.exp2=2)",
    "evict": "default + evict_first on single-use loads/stores (Config.evict)",
    "exp2_ev": "default + evict + exp2 (exp2=2 in bf16, 1 in fp32; '_x' below: the same)",
    "t32K_w8_x": "tile of 32 KB of x, 8 warps, exp2 + evict (more rows a program)",
    "t8K_w4_x": "tile of 8 KB of x, 4 warps, exp2 + evict (fewer rows a program)",
    "row_w8_x": "one row a program, 8 warps, exp2 + evict",
    "c4Kv_w4": "coop, chunks of 4096 values, 4 warps, 200 ns sleep (round 2's shipped coop)",
    "..._s0": "the same without the sleep (poll flat out)",
    "..._s1000": "the same with 1000 ns sleeps",
    "..._ctr": "per-row arrival counter polled (one word), then the slots read once",
    "..._x": "exp2 + evict on top",
    "cNKv_wW": "coop, chunks of N*1024 values, W warps",
    "lNKv_MK_wW": "coop-loop: chunks of N*1024 values read twice in a loop of M*1024 values, "
    "W warps, counter; second read meant to hit L2 (resident chunks: 132 SMs x 64/W programs)",
    "..._ev": "evict_last on the first read, evict_first on the second read and the store",
    "online16K_w8": "the online loop (x read twice, one program a row), 16 KB tiles, 8 warps",
    "online_ev": "online16K_w8 + evict_last first read / evict_first second read + exp2",
}


def _coopv(values: int, warps: int, **knobs) -> Config:
    return Config("coop", 1, values, warps, **knobs)


def _loop(chunk: int, loop: int, warps: int, evict: bool = True, **knobs) -> Config:
    return Config("coop", 1, chunk, warps, counter=True, evict=evict, loop_cols=loop, **knobs)


def round3_candidates(n: int, itemsize: int, backward: bool, pick: Config) -> dict[str, Config]:
    """Round 3: the shipped pick with each new knob, and the new long-row designs."""
    # exp2 is a forward knob (the backward ignores it); 2 = the FMA form in 16-bit, whose
    # outputs hide its rounding, and the accurate form 1 in fp32
    e2 = 0 if backward else (2 if itemsize == 2 else 1)
    x = dict(exp2=e2, evict=True)
    if pick.design == "tile":
        out = {"evict": pick._replace(evict=True)}
        if not backward:
            out["exp2"] = pick._replace(exp2=1)
            out["exp2fma"] = pick._replace(exp2=2)
            out["exp2_ev"] = pick._replace(exp2=e2, evict=True)
            if n <= 4096:
                out["t32K_w8_x"] = _tile(n, itemsize, 32, 8)._replace(**x)
                out["t8K_w4_x"] = _tile(n, itemsize, 8, 4)._replace(**x)
            else:
                out["row_w8_x"] = Config("tile", 1, n, 8, **x)
        return out
    # long rows: the coop variants around the shipped one, then the loop design
    base = 16384 // itemsize if backward else 4096  # shipped: 16 KB (bwd) / 4096 values (fwd)
    name = f"c{base // 1024}Kv_w4"
    out = {
        name: _coopv(base, 4),
        f"{name}_s0": _coopv(base, 4, sleep_ns=0),
        f"{name}_s1000": _coopv(base, 4, sleep_ns=1000),
        f"{name}_ctr": _coopv(base, 4, counter=True),
        f"{name}_ctr_s0": _coopv(base, 4, counter=True, sleep_ns=0),
        f"{name}_ctr_x": _coopv(base, 4, counter=True, **x),
        "c8Kv_w8_ctr": _coopv(8192, 8, counter=True),
        "c16Kv_w16_ctr": _coopv(16384, 16, counter=True),
        "c16Kv_w16_ctr_x": _coopv(16384, 16, counter=True, **x),
        "l16Kv_4K_w8_ev": _loop(16384, 4096, 8, exp2=e2),
        "l32Kv_4K_w8_ev": _loop(32768, 4096, 8, exp2=e2),
        "l32Kv_4K_w8": _loop(32768, 4096, 8, evict=False),
        "l32Kv_2K_w4_ev": _loop(32768, 2048, 4, exp2=e2),
        # fewer programs resident (16 warps: 4 an SM), so the chunks in flight fit in L2
        # (528 × 32 KB = 17 MB): the second read should hit
        "l16Kv_4K_w16_ev": _loop(16384, 4096, 16, exp2=e2),
        "l8Kv_4K_w16_ev": _loop(8192, 4096, 16, exp2=e2),
        "l8Kv_2K_w8_ev": _loop(8192, 2048, 8, exp2=e2),
        "online16K_w8": Config("online", 1, 16384 // itemsize, 8),
        "online_ev": Config("online", 1, 16384 // itemsize, 8, **x),
    }
    if n < 65536:  # the smoke test's rows: keep chunks no longer than the row
        out = {k: v for k, v in out.items() if v.block_cols <= max(n, 4096)}
    return out


# What each round 5 name means (printed at the start of a --round5 run).
ROUND5_NAMES = {
    "default": "the shipped _pick_config choice (the coop kernels now gather one row's slots "
    "as a vector: kernels/notes/softmax.md, round 8)",
    "same_bytes": "not softmax: the same bytes moved by torch in one kernel, timed alike (fwd: "
    "out.copy_(x); bwd: torch.add(y, dy, out=dx)), the roofline at this size",
    "cNKv_wW": "coop, chunks of N*1024 values, W warps",
    "lNKv_MK_wW_ev": "coop-loop (round 3): chunks read twice in a loop of M*1024 values",
    "online16K_w8 / online_ev": "the online loop (x read twice), as round 3",
}


def round5_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 5: the coop chunk/warps grid again, now that the slot gather no longer costs
    registers per chunk; the tile rows get only the default and the same-bytes reference."""
    if n <= ONE_PASS_MAX_ELEMS:
        return {}
    out = {
        "c2Kv_w2": _coopv(2048, 2),
        "c4Kv_w4": _coopv(4096, 4),
        "c8Kv_w4": _coopv(8192, 4),
        "c8Kv_w8": _coopv(8192, 8),
        "c16Kv_w8": _coopv(16384, 8),
        "c16Kv_w16": _coopv(16384, 16),
    }
    if backward:
        out["l16Kv_4K_w8_ev"] = _loop(16384, 4096, 8)
        out["l16Kv_4K_w16_ev"] = _loop(16384, 4096, 16)
    else:
        e2 = 2 if itemsize == 2 else 1
        out["online16K_w8"] = Config("online", 1, 16384 // itemsize, 8)
        out["online_ev"] = Config("online", 1, 16384 // itemsize, 8, exp2=e2, evict=True)
    return out


# What each round 4 name means (printed at the start of a --round4 run).
ROUND4_NAMES = {
    "default": "the shipped _pick_config choice",
    "default_g": "the same, timed as a CUDA graph replay (no host launch cost)",
    "split2_c4Kv_w4": "control: the partials/finish pair over the whole tensor (one band)",
    "bNM_cKKv_wW": "band: bands of N MiB of input (x; y+dy backward), partials launch then "
    "finish launch per band, chunks of K*1024 values, W warps",
    "..._ev": "evict_last on the partials' loads, evict_first on the finish's loads/stores",
    "..._r": "the finish launch walks its band in reverse (bandr)",
    "..._g": "timed as a CUDA graph replay",
}
# bytes of a "MiB" in the band names; --smoke shrinks it to KiB, so its small rows make bands
BAND_UNIT = 2**20


def _band(mb: int, values: int, warps: int, evict: bool = False, design: str = "band") -> Config:
    return Config(design, 1, values, warps, evict=evict, band_bytes=mb * BAND_UNIT)


def round4_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 4: the banded two-pass design (band size x chunk x warps x evict), plus a
    whole-tensor split2 control. Names ending in _g are graph-timed by run_shape."""
    out = {
        "split2_c4Kv_w4": Config("split2", 1, 4096, 4),
        "b4M_c4Kv_w4": _band(4, 4096, 4),
        "b8M_c4Kv_w4": _band(8, 4096, 4),
        "b16M_c4Kv_w4": _band(16, 4096, 4),
        "b24M_c4Kv_w4": _band(24, 4096, 4),
        "b8M_c4Kv_w4_ev": _band(8, 4096, 4, evict=True),
        "b16M_c4Kv_w4_ev": _band(16, 4096, 4, evict=True),
        "b16M_c4Kv_w4_r": _band(16, 4096, 4, design="bandr"),
        "b8M_c8Kv_w8": _band(8, 8192, 8),
        "b16M_c8Kv_w8": _band(16, 8192, 8),
        "b16M_c8Kv_w8_ev": _band(16, 8192, 8, evict=True),
        "b16M_c16Kv_w16": _band(16, 16384, 16),
        "b4M_c4Kv_w4_g": _band(4, 4096, 4),
        "b8M_c4Kv_w4_g": _band(8, 4096, 4),
        "b16M_c4Kv_w4_g": _band(16, 4096, 4),
        "b16M_c8Kv_w8_ev_g": _band(16, 8192, 8, evict=True),
    }
    # the smoke test's short rows: no chunk longer than the row
    return {k: v for k, v in out.items() if v.block_cols <= max(n, 4096)}


# What each round 6 name means (printed at the start of a --round6 run).
ROUND6_NAMES = {
    "default": "the shipped _pick_config choice (16 KB tiles, 4 warps)",
    "tNK_wW": "tile of N KB of x a program, W warps",
    "inductor / inductor_mac": "not Triton variants: torch.compile(torch.softmax) in the default "
    "and max-autotune-no-cudagraphs modes, timed alike (the bench's 'best compile mode')",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round6_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 6: forward tiles of other sizes and warps for the short rows (where the bench put
    the tile 1-3% behind Inductor at N = 128 and 1024); none for the backward or long rows."""
    if backward or n > 4096:
        return {}
    out = {}
    for kbytes, warps in ((4, 2), (4, 4), (8, 2), (8, 4), (16, 2), (16, 8), (32, 4), (32, 8)):
        out[f"t{kbytes}K_w{warps}"] = _tile(n, itemsize, kbytes, warps)
    return out


# What each round 7 name means (printed at the start of a --round7 run).
ROUND7_NAMES = {
    "default": "the shipped _pick_config choice",
    "same_bytes": ROUND5_NAMES["same_bytes"],
    "cNKv_wW": "coop, chunks of N*1024 values, W warps (the plain kernel, as round 5)",
    "pNKv_wW": "coop over 16-bit pairs (Config.pairs): the chunk loaded, held across the wait "
    "and stored as int32 pairs, unpacked to fp32 only for the math",
    "..._rR": "ptxas capped at R registers a thread (Config.maxnreg), for more programs an SM; "
    "it spills where the kernel needs more",
}
# (chunk values, warps, register cap) of the round 7 pairs candidates, forward and backward.
# ptxas 12.x offline (sm_90): forward 4096/4 needs 48 registers (10 programs an SM), 40
# spills 16 B, 32 spills 52 B; backward 4096/4 48 (the plain kernel 80), 8192/8 60.
ROUND7_PAIRS = {
    False: [(4096, 4, 0), (4096, 4, 40), (4096, 4, 32), (8192, 8, 40), (8192, 8, 32),
            (8192, 4, 64), (16384, 16, 32)],
    True: [(4096, 4, 0), (4096, 4, 40), (8192, 8, 0), (8192, 8, 48), (8192, 8, 40),
           (16384, 16, 0)],
}  # fmt: skip


def _capped(name: str, maxnreg: int) -> str:
    return f"{name}_r{maxnreg}" if maxnreg else name


def round7_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 7: the long rows' coop chunk held as 16-bit pairs (half the registers across the
    wait), with and without a register cap; in fp32, a register cap on the plain kernel."""
    if n <= ONE_PASS_MAX_ELEMS:
        return {}
    if itemsize == 4:
        if backward:  # its y and dy fill the registers already: nothing to cap
            return {}
        return {
            "c4Kv_w4": _coopv(4096, 4),
            "c4Kv_w4_r48": _coopv(4096, 4, maxnreg=48),
            "c2Kv_w2": _coopv(2048, 2),
            "c2Kv_w2_r48": _coopv(2048, 2, maxnreg=48),
        }
    out = {"c4Kv_w4": _coopv(4096, 4)}
    if backward:
        out["c8Kv_w4"] = _coopv(8192, 4)
    for values, warps, cap in ROUND7_PAIRS[backward]:
        name = _capped(f"p{values // 1024}Kv_w{warps}", cap)
        out[name] = _coopv(values, warps, pairs=True, maxnreg=cap)
    return out


# What each round 8 name means (printed at the start of a --round8 run).
ROUND8_NAMES = {
    "default": "the shipped _pick_config choice",
    "same_bytes": ROUND5_NAMES["same_bytes"],
    "cNKv_wW": "coop forward, chunks of N*1024 values, W warps",
    "..._rs": "Config.rescale: exp(x - chunk max) held across the wait, scaled after it (one "
    "multiply a value instead of a second exp)",
    "..._e2": "exp2: the one-FMA form in 16-bit (Config.exp2=2), exp2((x - max)·log2e) in fp32",
    "..._ev": "evict_first on the loads and stores (Config.evict)",
    "..._s1000": "1000 ns sleeps between polls (200 shipped)",
    "..._r48": "ptxas capped at 48 registers a thread (Config.maxnreg)",
}


def round8_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 8: the long rows' coop forward without its second exp (Config.rescale), with the
    exp2, evict, sleep and register-cap knobs around it."""
    if backward or n <= ONE_PASS_MAX_ELEMS:
        return {}
    e2 = 2 if itemsize == 2 else 1
    out = {
        "c4Kv_w4": _coopv(4096, 4),
        "c4Kv_w4_rs": _coopv(4096, 4, rescale=True),
        "c4Kv_w4_rs_e2": _coopv(4096, 4, rescale=True, exp2=e2),
        "c4Kv_w4_rs_e2_ev": _coopv(4096, 4, rescale=True, exp2=e2, evict=True),
        "c4Kv_w4_rs_s1000": _coopv(4096, 4, rescale=True, sleep_ns=1000),
        "c4Kv_w4_rs_r48": _coopv(4096, 4, rescale=True, maxnreg=48),
        "c2Kv_w2_rs": _coopv(2048, 2, rescale=True),
        "c8Kv_w8_rs": _coopv(8192, 8, rescale=True),
        "c8Kv_w8": _coopv(8192, 8),
    }
    return out


# What each round 9 name means (printed at the start of a --round9 run).
ROUND9_NAMES = {
    "default": "the shipped _pick_config choice (coop: forward with rescale and exp2, evict in "
    "16-bit; 16-bit backward as int32 pairs; reused workspaces)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
    "cNKv_wW / pNKv_wW": "coop, chunks of N*1024 values, W warps; p: int32 pairs (16-bit)",
    "..._rs_e2": "forward rescale + exp2 (as shipped)",
    "..._ev": "evict_first on the loads and stores",
    "..._s0 / _s1000": "no sleep / 1000 ns sleeps between polls (200 shipped)",
    "..._rR": "ptxas capped at R registers a thread (Config.maxnreg)",
}


def round9_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 9: the knobs left around the round 9 picks, on the long rows (evict and the poll
    sleep on the backward, the sleep and 2K chunks on the forward)."""
    if n <= ONE_PASS_MAX_ELEMS:
        return {}
    if backward:
        pre, pairs = ("p", True) if itemsize == 2 else ("c", False)
        out = {}
        for values, warps in ((4096, 4), (2048, 2)):
            name = f"{pre}{values // 1024}Kv_w{warps}"
            out[name] = _coopv(values, warps, pairs=pairs)
            out[f"{name}_ev"] = _coopv(values, warps, pairs=pairs, evict=True)
        base = dict(pairs=pairs)
        out[f"{pre}4Kv_w4_s0"] = _coopv(4096, 4, sleep_ns=0, **base)
        out[f"{pre}4Kv_w4_s1000"] = _coopv(4096, 4, sleep_ns=1000, **base)
        out[f"{pre}4Kv_w4_ev_s1000"] = _coopv(4096, 4, evict=True, sleep_ns=1000, **base)
        return out
    fwd = dict(rescale=True, exp2=2 if itemsize == 2 else 1, evict=itemsize == 2)
    tag = "_rs_e2_ev" if itemsize == 2 else "_rs_e2"
    # the register count one more program an SM needs at N = 262144 (ptxas 12.8 offline:
    # bf16 56 -> 48, fp32 62 -> 56, neither spilling)
    cap = 48 if itemsize == 2 else 56
    return {
        f"c4Kv_w4{tag}_s0": _coopv(4096, 4, sleep_ns=0, **fwd),
        f"c4Kv_w4{tag}_s1000": _coopv(4096, 4, sleep_ns=1000, **fwd),
        f"c2Kv_w2{tag}": _coopv(2048, 2, **fwd),
        f"c2Kv_w2{tag}_s1000": _coopv(2048, 2, sleep_ns=1000, **fwd),
        f"c4Kv_w4{tag}_r{cap}": _coopv(4096, 4, maxnreg=cap, **fwd),
    }


def _graphed(fn):
    """fn as a CUDA graph: the first call runs it (compiling), captures it and replays; later
    calls replay. Returns the captured output each time."""
    state = {}

    def call():
        if "graph" not in state:
            fn()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                state["out"] = fn()
            state["graph"] = graph
        state["graph"].replay()
        return state["out"]

    return call


def backward_candidates(n: int, itemsize: int) -> dict[str, Config]:
    if n <= 4096:
        return {
            "t8K_w4": _tile(n, itemsize, 8, 4),
            "t16K_w4": _tile(n, itemsize, 16, 4),
            "t16K_w8": _tile(n, itemsize, 16, 8),
            "t32K_w8": _tile(n, itemsize, 32, 8),
        }
    if n <= 16384:
        return {
            "row_w8": Config("tile", 1, n, 8),
            "row_w16": Config("tile", 1, n, 16),
            "c16K_w4": _coop(itemsize, 16, 4),
        }
    return {
        "c8K_w4": _coop(itemsize, 8, 4),
        "c16K_w4": _coop(itemsize, 16, 4),
        "c32K_w8": _coop(itemsize, 32, 8),
    }


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.end


# CPU time one call may take, hidden behind a sleep kernel before each timed sample (the gpu
# timer): a Triton launch through _forward takes 60-100 us of Python, about what the 256 MB L2
# flush takes on an H100, so without the lead it shows up as GPU time on 64 MB shapes.
LEAD_US = 400.0


def bench_do_bench(fn) -> float:
    """triton's do_bench as round 1-7 used it: the mean, the CPU path counted when it outlasts
    the L2 flush."""
    return do_bench(fn, warmup=5, rep=20)


@functools.cache
def _gpu_timer():
    from experiments.timing import GpuTimer

    return GpuTimer(torch.device(DEVICE), flush_l2=True)


def bench_gpu(fn) -> float:
    """The benchmark's GPU timer: median ms, L2 flushed, the CPU path behind a sleep lead."""
    return _gpu_timer().measure(fn, warmup_ms=5, rep_ms=20, lead_us=LEAD_US)["p50"]


bench = bench_gpu


def copy_bandwidth() -> float:
    """GB/s of dst.copy_(src) on a 1 GB buffer, counting the read and the write (best of 3)."""
    src = torch.empty(2**30 if DEVICE == "cuda" else 2**20, device=DEVICE, dtype=torch.uint8)
    src.random_()
    dst = torch.empty_like(src)
    ms = min(bench(lambda: dst.copy_(src)) for _ in range(3))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


# What each round 10 name means (printed at the start of a --round10 run).
ROUND10_NAMES = {
    "default": "the shipped _pick_config choice (smem where the rows fit it, round 10)",
    "coop": "what _pick_config chose without smem (round 9's coop kernels)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
    "sNK_wW": "smem: chunks of N*1024 values copied into shared memory, W warps",
    "..._ev": "evict_first on the copies in and the stores",
    "..._rR": "ptxas capped at R registers a thread (Config.maxnreg)",
}


def round10_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 10: the smem design's chunk and warps on the long rows, and round 9's coop."""
    if n <= ONE_PASS_MAX_ELEMS:
        return {}
    out = {"coop": _pick_config(n, 1, False, backward, torch.device(DEVICE), itemsize)}
    exp2 = 0 if backward else 2 if itemsize == 2 else 1
    shapes = [(8192, 4), (4096, 2), (4096, 4), (16384, 8)]
    if backward and itemsize == 4:
        shapes = [(4096, 4), (2048, 2), (2048, 4)]
    for values, warps in shapes:
        out[f"s{values // 1024}K_w{warps}"] = Config("smem", 1, values, warps, exp2=exp2)
    out["s8K_w4_ev"] = Config("smem", 1, 8192, 4, exp2=exp2, evict=True)
    if itemsize == 2 and not backward:
        # ptxas gives the 16-bit forward 39-40 registers (offline, Triton 3.6): 12 programs an
        # SM, where its 16 KB of shared memory a program would let 13 in at 32
        out["s8K_w4_r32"] = Config("smem", 1, 8192, 4, exp2=exp2, maxnreg=32)
    return out


# What each round 11 name means (printed at the start of a --round11 run).
ROUND11_NAMES = {
    "default": "the shipped _pick_config choice (the tile at N = 16384, smem past it)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
    "sNK_wW": "smem, one program a chunk of N*1024 values (round 10), W warps",
    "pNK_wW": "smem persistent: programs take chunks of N*1024 values in turn, two buffers "
    "(a chunk's copies in flight while the previous one's row is waited for and written), as "
    "many programs an SM as shared memory holds",
}


def round11_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 11: the persistent smem kernels (two chunk buffers a program) against round 10's
    one-shot ones, at N = 16384 (where the tile runs) and past it. A buffer of B bytes an input
    is copied in 8 pieces: B / 4096 warps."""
    if n < ONE_PASS_MAX_ELEMS:
        return {}
    inputs = 2 if backward else 1
    exp2 = 0 if backward else 2 if itemsize == 2 else 1
    out = {}
    for kbytes, warps in ((32, 8), (16, 4)):  # one-shot, one buffer of all inputs
        values = kbytes * 1024 // (inputs * itemsize)
        if values <= n:
            out[f"s{values // 1024}K_w{warps // inputs}"] = Config(
                "smem", 1, values, max(2, warps // inputs), exp2=exp2
            )  # fmt: skip
    for kbytes in (8, 16, 32):  # a buffer of each input; a program holds 2 * inputs of them
        values = kbytes * 1024 // itemsize
        warps = kbytes // 4
        if values > n or -(-n // values) > MAX_SPLIT_CHUNKS:
            continue
        out[f"p{values // 1024}K_w{warps}"] = Config("smem", 1, values, warps, exp2=exp2, per_sm=-1)
    return out


# What each round 12 name means (printed at the start of a --round12 run).
ROUND12_NAMES = {
    "default": "the shipped _pick_config choice",
    "inductor / inductor_mac": ROUND6_NAMES["inductor / inductor_mac"],
    "same_bytes": ROUND5_NAMES["same_bytes"],
    "tNK_wW": "tile of N KB of x a program, W warps",
    "row_wW": "N = 16384: one row a program, W warps",
    "online_NK_wW[_ev]": "N = 16384: Inductor's form, a loop over the row (running max and sum), "
    "then a second loop reading it again from L2 and writing; N*1024 values a step, W warps; "
    "_ev: the first read kept in L2 (evict_last), the second evict_first",
}


def round12_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 12: the forward at N <= 16384 against Inductor's kernels at rows of 2^27 elements,
    where the bench put the tile 1-2% behind the best compile mode (fp32 N = 128, 1024, 16384;
    bf16 N = 128)."""
    if backward or n > ONE_PASS_MAX_ELEMS:
        return {}
    if n == ONE_PASS_MAX_ELEMS:
        out = {f"row_w{w}": Config("tile", 1, n, w) for w in (4, 8, 32)}
        # 16K: the whole row in one step, read again from cache (Inductor's kernel at fp32 N =
        # 16384 in the bench: a looped reduction, evict_last then evict_first)
        for values, warps in ((2048, 8), (4096, 16), (4096, 8), (16384, 8), (16384, 16),
                              (16384, 32)):  # fmt: skip
            name = f"online_{values // 1024}K_w{warps}"
            out[name] = Config("online", 1, values, warps)
            out[name + "_ev"] = Config("online", 1, values, warps, evict=True, exp2=1)
        return out
    out = {}
    # Inductor's persistent reductions at N = 128 took 4-8 KB (8-16 rows) on 2 warps (probe 12
    # on an H200, its best_config files)
    for kbytes, warps in ((2, 2), (4, 2), (4, 4), (8, 2), (8, 4), (16, 4), (16, 8), (32, 8)):
        out[f"t{kbytes}K_w{warps}"] = _tile(n, itemsize, kbytes, warps)
    return out


# What each round 13 name means (printed at the start of a --round13 run).
ROUND13_NAMES = {
    "default": "the shipped _pick_config choice",
    "default_ev": "the shipped pick with evict_first on its loads and store (the tile's twin; "
    "the row loop has the hints already)",
    "tile16K": "the 16 KB tile, the pick before round 13 (16 warps at 16384 values a tile)",
    "inductor / inductor_mac": ROUND6_NAMES["inductor / inductor_mac"] + "; compiled afresh "
    "for each shape (round 12's one compiled lambda hit dynamo's recompile limit and ran eager)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
    "loop_wW[_ev]": "N >= 1024: Inductor's looped form with the whole row a step: max and sum "
    "over one load, then the row loaded again (from L1/L2) and written; W warps; _ev: the "
    "first load evict_last, the second load and the store evict_first",
}


def round13_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 13: the forward at N <= 16384, where the bench put Inductor's kernels 0.5-1.3%
    ahead of the tile by GPU time (fp32 N = 4096 and 16384, bf16 N = 128) with both at the
    copy's rate; Inductor's fp32 kernel there reads the row twice, the second time from cache."""
    if backward or n > ONE_PASS_MAX_ELEMS:
        return {}
    cols = triton.next_power_of_2(n)
    out = {}  # and default_ev, which run_shape makes from the shape's pick
    # the 16 KB tile, warped as _pick_config's tile branch does (the pick before round 13)
    tile = _tile(n, itemsize, 16, 0)
    elems = tile.block_rows * tile.block_cols
    out["tile16K"] = tile._replace(num_warps=16 if elems >= 16384 else _warps_for(elems * itemsize))
    if cols >= 1024:
        for warps in (4, 8, 16):
            out[f"loop_w{warps}"] = Config("online", 1, cols, warps)
            out[f"loop_w{warps}_ev"] = Config("online", 1, cols, warps, evict=True, exp2=1)
    return out


# What each round 14 name means (printed at the start of a --round14 run).
ROUND14_NAMES = {
    "default": "the shipped _pick_config choice",
    "default_u / _i / _ui": "N <= 16384: the pick without masks where the rows fill its blocks "
    "(u: Config.even), with 32-bit offsets (i: Config.int32), or both (ui)",
    "tNK_wW_ui": "tile rows: a tile of N KB of x a program, W warps, both knobs (t2K_w2 is the "
    "shape of Inductor's persistent reduction at bf16 N = 128: 8 rows on 2 warps)",
    "sNK_wW": "N > 16384: smem, one program a chunk of N*1024 values, W warps (s32K_w16 in "
    "16-bit: 64 KB a program, 3 an SM)",
    "..._fold": "the smem forward with its partial (max, sum of exp) taken in one pass as the "
    "pieces land, not in a second pass once all have (Config.fold)",
    "inductor / inductor_mac": ROUND13_NAMES["inductor / inductor_mac"],
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round14_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 14, the forward: at N <= 16384, the pick without masks and with 32-bit offsets
    (Inductor's kernels have both; the bench put them 0.4-0.9% ahead at N <= 512); past it, the
    smem forward with its partial folded into the pass over the landing pieces, and 64 KB
    programs (the H200 is 10-17 points short of its copy there)."""
    if backward:
        return {}
    device = torch.device(DEVICE)
    if n <= ONE_PASS_MAX_ELEMS:
        # the pick for rows enough to fill every SM (the probe's rows of 2^25-2^27 elements)
        pick = _pick_config(n, 2**20, False, False, device, itemsize)
        out = {
            "default_u": pick._replace(even=True),
            "default_i": pick._replace(int32=True),
            "default_ui": pick._replace(even=True, int32=True),
        }
        if pick.design == "tile":
            for kbytes, warps in ((2, 2), (4, 2), (4, 4), (8, 4)):
                tile = _tile(n, itemsize, kbytes, warps)._replace(even=True, int32=True)
                if tile != out["default_ui"]:
                    out[f"t{kbytes}K_w{warps}_ui"] = tile
        return out
    exp2 = 2 if itemsize == 2 else 1
    pick = _ticket_pick(n, itemsize)
    out = {"default_fold": pick._replace(fold=True)} if pick.design == "smem" else {}
    for kbytes, warps in ((64, 16), (16, 4)):
        values = kbytes * 1024 // itemsize
        if values > n or -(-n // values) > MAX_SPLIT_CHUNKS or values == pick.block_cols:
            continue
        smem = Config("smem", 1, values, warps, exp2=exp2)
        out[f"s{values // 1024}K_w{warps}"] = smem
        out[f"s{values // 1024}K_w{warps}_fold"] = smem._replace(fold=True)
    return out


# What each round 15 name means (printed at the start of a --round15 run).
ROUND15_NAMES = {
    "default": "the shipped _pick_config choice",
    "tSIZE_wW[_ui]": "tile rows: a tile of SIZE of x a program (512B, 1K, 2K bytes, at least "
    "one row) on W warps, down to one 16-byte access a thread: Inductor's max-autotune configs "
    "at N <= 512 (probe 14's Inductor cache, H100: 4 rows of 128 or 1 row of 512 a program, 2-4 "
    "warps); _ui: without masks and with 32-bit offsets (Config.even, Config.int32)",
    "inductor / inductor_mac": ROUND13_NAMES["inductor / inductor_mac"],
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round15_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 15: forward tiles of 512 bytes to 2 KB at the rows the pick gives a tile (N <=
    1024 in 16-bit, 512 in fp32), where Inductor's max-autotune kernel leads by 0.4-0.9%."""
    if backward or n > ONE_PASS_MAX_ELEMS:
        return {}
    pick = _pick_config(n, 2**20, False, False, torch.device(DEVICE), itemsize)
    if pick.design != "tile":
        return {}
    out: dict[str, Config] = {}
    for nbytes, warps in ((512, 1), (1024, 1), (1024, 2), (1024, 4), (2048, 2), (2048, 4)):
        tile = _tile(n, itemsize, nbytes / 1024, warps)
        if tile in out.values() or tile == pick:
            continue
        name = f"t{nbytes}B_w{warps}" if nbytes < 1024 else f"t{nbytes // 1024}K_w{warps}"
        out[name] = tile
        out[name + "_ui"] = tile._replace(even=True, int32=True)
    return out


# What each round 16 name means (printed at the start of a --round16 run).
ROUND16_NAMES = {
    "default": "the shipped _pick_config choice",
    "tNK_wW[_ui]": "tile rows: a tile of N KB of x a program on W warps; 16 bytes a thread at "
    "t2K_w4, t4K_w8 and t8K_w16 (probe 15: the H100 led with 16 bytes a thread, 1-2 KB tiles, "
    "where the H200 fell to 77-91% of copy below 4 KB a program); _ui: Config.even and "
    "Config.int32",
    "inductor / inductor_mac": ROUND13_NAMES["inductor / inductor_mac"],
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round16_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 16: forward tiles of 2-8 KB with 16 bytes a thread at the tile-picked rows (N <=
    1024 in 16-bit, 512 in fp32), beside 2 KB on 2 warps (the H200's best in probe 15)."""
    if backward or n > ONE_PASS_MAX_ELEMS:
        return {}
    pick = _pick_config(n, 2**20, False, False, torch.device(DEVICE), itemsize)
    if pick.design != "tile":
        return {}
    out: dict[str, Config] = {}
    for kbytes, warps in ((2, 2), (2, 4), (4, 4), (4, 8), (8, 16)):
        tile = _tile(n, itemsize, kbytes, warps)
        if tile._replace(even=True, int32=True) in out.values():
            continue
        name = f"t{kbytes}K_w{warps}"
        if kbytes == 4 and warps == 8:
            out[name] = tile
        out[name + "_ui"] = tile._replace(even=True, int32=True)
    return out


# What each round 17 name means (printed at the start of a --round17 run).
ROUND17_NAMES = {
    "default": "the shipped _pick_config choice (smem past N = 16384)",
    "sleepN": "the pick with N ns of nanosleep between polls of the row's partials (the pick: "
    "200). An H200 profile of the bf16 N = 262144 forward (ncu) had its schedulers issuing on "
    "68% of cycles at 69% of DRAM peak: every warp of a waiting program polls and reduces the "
    "row's slots across warps each time",
    "wW": "the pick's chunk on W warps",
    "fold2[_sleepN | _p]": "the pick with its partial taken in one pass as the pieces land, each "
    "thread over its own values (Config.fold = 2: the max pass over shared memory and the "
    "per-value masks gone, about 22% fewer PTX instructions a piece); _p: the persistent kernel",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def _ticket_pick(n: int, itemsize: int) -> Config:
    """The forward's pick as rounds 10-19 had it: past the tile the smem design with the atomic
    ticket and masks (round 20's pick takes chunks by program id, Config.by_pid, and even)."""
    pick = _pick_config(n, 1, False, False, torch.device(DEVICE), itemsize, smem_ok=True)
    if pick.design == "smem" and not pick.per_sm:
        pick = pick._replace(by_pid=False, even=False, maxnreg=0)
    return pick


def round17_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 17: the smem forward's poll interval past the tile."""
    if backward or n <= ONE_PASS_MAX_ELEMS:
        return {}
    pick = _ticket_pick(n, itemsize)
    out = {f"sleep{ns}": pick._replace(sleep_ns=ns) for ns in (0, 500, 1000, 2000, 5000)}
    if pick.design == "smem":  # the same chunk on fewer or more warps (fewer polling warps)
        for warps in (2, 4, 8, 16):
            if warps != pick.num_warps:
                out[f"w{warps}"] = pick._replace(num_warps=warps)
        out["fold2"] = pick._replace(fold=2)
        out["fold2_sleep1000"] = pick._replace(fold=2, sleep_ns=1000)
        out["fold2_p"] = pick._replace(fold=2, per_sm=-1)
    return out


# What each round 18 name means (printed at the start of a --round18 run).
ROUND18_NAMES = {
    "default": ROUND17_NAMES["default"],
    "cNK_wW[_hR]": "the smem forward on chunks of N KB and W warps, the chunk's last R pieces (16 "
    "bytes a thread each) held in registers and the rest in shared memory (Config.regs): more "
    "of the row held an SM than its 228 KB of shared memory (the pick: 192 KB, 6 programs of "
    "32 KB); the resident KB an SM from sm_90 ptxas's registers is in the name's comment",
    "loopNK_lLK_wW": "round 3's coop loop: a program a chunk of N KB, read twice in steps of L KB "
    "(the first read evict_last, the second evict_first: from L2), nothing held across the "
    "wait, so programs are bounded by warps, not shared memory",
    "onlineNK_wW": "the online row loop (x read twice) in steps of N KB, round 13's evict hints",
    "smem_1chunk / _2chunks": "at N = 16384: the long rows' smem forward on rows of one chunk "
    "(no program waits for another) or two: is the smem design's rate on the H200 its wait or "
    "its chunks",
    "default_p": "the pick on round 11's persistent kernel (two chunk buffers a program, no "
    "program started or ended between chunks)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}
# (KB a chunk, warps, held pieces) -> KB held an SM (ptxas sm_90 offline, Triton 3.8)
ROUND18_SHAPES = {
    2: {(32, 4, 1): 224, (32, 4, 2): 224, (16, 2, 4): 256, (16, 2, 2): 240, (16, 4, 0): 208},
    4: {(32, 4, 4): 288, (32, 4, 2): 224, (16, 4, 2): 256, (64, 8, 4): 256, (32, 8, 1): 224,
        (16, 2, 4): 272},
}  # fmt: skip


def round18_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 18: the smem forward's chunk partly held in registers; at N = ONE_PASS_MAX_ELEMS
    the smem kernel on one chunk a row (no wait for other programs)."""
    if not backward and n == ONE_PASS_MAX_ELEMS:
        long_pick = _ticket_pick(4 * n, itemsize)
        if long_pick.design != "smem":
            return {}
        # the row one chunk (or two) of the long rows' pick: its phases without the row's wait
        return {"smem_1chunk": long_pick._replace(block_cols=n),
                "smem_2chunks": long_pick._replace(block_cols=n // 2)}  # fmt: skip
    if backward or n <= ONE_PASS_MAX_ELEMS:
        return {}
    pick = _ticket_pick(n, itemsize)
    if pick.design != "smem":
        return {}
    out = {}
    for (kbytes, warps, regs), _resident in ROUND18_SHAPES.get(itemsize, {}).items():
        name = f"c{kbytes}K_w{warps}" + (f"_h{regs}" if regs else "")
        out[name] = pick._replace(block_cols=kbytes * 1024 // itemsize, num_warps=warps, regs=regs)
    out["default_p"] = pick._replace(per_sm=-1)  # round 11's persistent kernel, for the phases
    # the chunk read twice, the second read from L2, nothing held across the wait (round 3's
    # coop loop, untimed on an H200); and the online row loop with round 13's evict hints
    for kbytes, loop_kbytes, warps in ((16, 4, 4), (16, 8, 4), (32, 8, 8), (8, 4, 4)):
        name = f"loop{kbytes}K_l{loop_kbytes}K_w{warps}"
        out[name] = Config("coop", 1, kbytes * 1024 // itemsize, warps, evict=True,
                           exp2=pick.exp2, loop_cols=loop_kbytes * 1024 // itemsize)  # fmt: skip
    for kbytes, warps in ((16, 8), (32, 16)):
        out[f"online{kbytes}K_w{warps}"] = Config("online", 1, kbytes * 1024 // itemsize, warps,
                                                  evict=True, exp2=pick.exp2)  # fmt: skip
    return out


# What each round 19 name means (printed at the start of a --round19 run).
ROUND19_NAMES = {
    "default": "the shipped _pick_config choice (round 19: the atomic ticket at each program's "
    "start; since round 20 chunks by program id)",
    "pid": "the pick with its chunks by program id (Config.by_pid) and round 19's fallback (a "
    "program that polled its row 256 times computed the missing partials; since round 20 it "
    "leaves its chunk instead), its registers capped (kernels.softmax.SMEM_PID_MAXNREG)",
    "pid_cNK_wW": "pid on chunks of N KB and W warps",
    "pid_sleepS": "pid polling its row every S ns",
    "pid_nohelp[_nocap] / pid_nocap": "pid without the fallback's code (Config.leave_polls = -1: "
    "relies on the GPU starting programs in id order) and/or without the register cap",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round19_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 19: the smem forward's chunks by program id (no atomic ticket), with and without
    the fallback and the register cap, on other chunk sizes and poll intervals."""
    if backward or n <= ONE_PASS_MAX_ELEMS:
        return {}
    pick = _ticket_pick(n, itemsize)
    if pick.design != "smem" or pick.per_sm:
        return {}
    pid = pick._replace(by_pid=True, maxnreg=SMEM_PID_MAXNREG)
    out = {"pid": pid}
    for kbytes, warps in ((16, pick.num_warps // 2), (64, 2 * pick.num_warps)):
        # 2 warps fit 6 programs an SM uncapped (round 19 ran them so)
        out[f"pid_c{kbytes}K_w{warps}"] = pid._replace(
            block_cols=kbytes * 1024 // itemsize, num_warps=warps,
            maxnreg=SMEM_PID_MAXNREG if warps >= 4 else 0,
        )  # fmt: skip
    for sleep_ns in (0, 500):
        out[f"pid_sleep{sleep_ns}"] = pid._replace(sleep_ns=sleep_ns)
    out["pid_nohelp"] = pid._replace(leave_polls=-1)
    out["pid_nohelp_nocap"] = pid._replace(leave_polls=-1, maxnreg=0)
    out["pid_nocap"] = pid._replace(maxnreg=0)
    return out


# What each round 20 name means (printed at the start of a --round20 run).
ROUND20_NAMES = {
    "default": "the shipped _pick_config choice (round 20: chunks by program id, Config.by_pid, "
    "a program that polled its row softmax_smem.LEAVE_POLLS times leaving its chunk to the "
    "row's last publisher; no masks where rows are whole chunks, Config.even)",
    "ticket[_even]": "rounds 10-19's pick: the atomic ticket at each program's start, with masks "
    "(_even: without)",
    "masked": "the pick with masks",
    "nocap": "the pick without its register cap (SMEM_PID_MAXNREG)",
    "stay": "the pick never leaving (Config.leave_polls = -1: relies on the GPU starting "
    "programs in id order; what leaving's code costs)",
    "cNK_wW": "the pick on chunks of N KB and W warps",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round20_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 20: chunks by program id with leaving and no masks (the pick) against the atomic
    ticket, with masks, uncapped, never leaving, on 16 KB and 64 KB chunks."""
    if backward or n <= ONE_PASS_MAX_ELEMS:
        return {}
    pick = _pick_config(n, 1, False, False, torch.device(DEVICE), itemsize, smem_ok=True)
    if pick.design != "smem" or pick.per_sm or not pick.by_pid:
        return {}
    ticket = _ticket_pick(n, itemsize)
    out = {"ticket": ticket, "ticket_even": ticket._replace(even=True),
           "masked": pick._replace(even=False), "nocap": pick._replace(maxnreg=0),
           "stay": pick._replace(leave_polls=-1)}  # fmt: skip
    # round 19: 16 KB on half the warps (fp32 91-94); 64 KB on the pick's warps halves a row's
    # chunks (3 programs an SM)
    for kbytes, warps in ((16, pick.num_warps // 2), (64, pick.num_warps)):
        out[f"c{kbytes}K_w{warps}"] = pick._replace(
            block_cols=kbytes * 1024 // itemsize, num_warps=warps,
            maxnreg=SMEM_PID_MAXNREG if warps >= 8 else 0,
        )  # fmt: skip
    return out


# What each round 21 name means (printed at the start of a --round21 run).
ROUND21_NAMES = {
    "default": "the shipped _pick_config choice (forward: round 20's; backward: this round's "
    "one-shot kernel with chunks by program id and leaving, with masks; the first run, "
    "softmax_probe21_h200.txt, had round 11's persistent kernel there)",
    "persist": "backward: round 11's persistent kernel (two buffers of y and dy a program, the "
    "atomic ticket), the pick until this round",
    "polyP": "forward, 16-bit: the pick with the exp2 of the write's odd pieces (1), and of the "
    "sum pass's too (2), on the FMA pipe (a cubic, Config.poly), where two MUFU ex2 a value "
    "keep the MUFU about half busy at the H200's copy rate",
    "c64K_wW": "forward: the pick on 64 KB chunks and W warps (3 programs an SM)",
    "sleepS": "the pick polling its row every S ns (the pick: 200)",
    "evict": "forward: the pick with evict_first on its copies in and its stores",
    "foldF": "forward: the pick with its partial taken as the pieces land (Config.fold: 1 a "
    "program-wide max a piece, 2 each thread over its own values), so only the last piece's "
    "work lies between its copy landing and the publish",
    "oneshot": "backward: round 10's one-shot kernel with the atomic ticket (the pick's chunk)",
    "pid[_masked] / pid_even": "backward: the one-shot kernel with chunks by program id and "
    "leaving (the forward's round 20 protocol) on the pick's chunk and warps; the first run: "
    "pid without masks, pid_masked with; since: the pick with masks, pid_even without",
    "pid_cNK_wW": "backward: the pick on chunks of N KB of each of y and dy, W warps",
    "pid_sleep500": "backward: the pick polling its row every 500 ns",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round21_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 21: the backward on round 20's protocol (chunks by program id, leaving, no masks);
    the forward's exp2 partly on the FMA pipe, bigger chunks, poll interval, evict hints."""
    if n <= ONE_PASS_MAX_ELEMS:
        return {}
    pick = _pick_config(n, 1, False, backward, torch.device(DEVICE), itemsize, smem_ok=True)
    if pick.design != "smem":
        return {}
    out = {}
    if backward:  # the pick: chunks by program id with masks (this round's first run)
        one_shot = pick._replace(by_pid=False)
        out = {"persist": one_shot._replace(per_sm=-1), "oneshot": one_shot,
               "pid_even": pick._replace(even=True)}  # fmt: skip
        for scale in (2, 0.5):
            chunk, warps = int(pick.block_cols * scale), max(1, int(pick.num_warps * scale))
            kbytes = chunk * itemsize // 1024
            out[f"pid_c{kbytes}K_w{warps}"] = pick._replace(block_cols=chunk, num_warps=warps)
        out["pid_sleep500"] = pick._replace(sleep_ns=500)
        return out
    if itemsize == 2:
        out = {f"poly{poly}": pick._replace(poly=poly) for poly in (1, 2)}
    warps = 2 * pick.num_warps
    out[f"c64K_w{warps}"] = pick._replace(block_cols=65536 // itemsize, num_warps=warps,
                                          maxnreg=SMEM_PID_MAXNREG)  # fmt: skip
    for sleep_ns in (100, 500):
        out[f"sleep{sleep_ns}"] = pick._replace(sleep_ns=sleep_ns)
    out["evict"] = pick._replace(evict=True)
    # the partial as the pieces land (round 13/17's folds, level then with the ticket): the
    # sum pass off the path from the last copy to the publish, which poly2 showed is costly
    for fold in (1, 2):
        out[f"fold{fold}"] = pick._replace(fold=fold)
    return out


# What each round 22 name means (printed at the start of a --round22 run).
ROUND22_NAMES = {
    "default": "the shipped _pick_config choice (forward: round 20's one-shot kernel by program "
    "id; backward: round 21's)",
    "ppid": "forward: the persistent smem kernel with chunks by program id (round 22) on the "
    "pick's chunk and warps, uncapped, two chunk buffers a program, as many programs an SM "
    "as shared memory holds (per_sm -1), whole rows a round (softmax_smem.pid_programs)",
    "ppid_sS": "ppid on S programs an SM",
    "ppid_cNK_wW": "ppid on chunks of N KB and W warps",
    "ppid_never": "ppid never leaving (leave_polls -1): the protocol's cost",
    "one_copy[_masked]": "forward: the pick with its chunk copied in as one copy and one commit "
    "group (Config.one_copy; 6 barriers before the publish in bf16 against 20), with masks "
    "too; the first run (softmax_probe22_h200.txt) had no one_copy, and ppid_s2 and ppid_never, "
    "which lost, are not run since",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round22_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 22, the forward past the tile: the persistent kernel by program id; the pick's
    chunk copied in as one copy."""
    if n <= ONE_PASS_MAX_ELEMS or backward:
        return {}
    pick = _pick_config(n, 1, False, backward, torch.device(DEVICE), itemsize, smem_ok=True)
    if pick.design != "smem":
        return {}
    ppid = pick._replace(per_sm=-1, maxnreg=0)
    out = {"ppid": ppid}
    half = ppid._replace(block_cols=pick.block_cols // 2, num_warps=max(1, pick.num_warps // 2))
    out[f"ppid_c{half.block_cols * itemsize // 1024}K_w{half.num_warps}"] = half
    out["one_copy"] = pick._replace(one_copy=True)
    out["one_copy_masked"] = pick._replace(one_copy=True, even=False)
    return out


# What each round 23 name means (printed at the start of a --round23 run).
ROUND23_NAMES = {
    "default": ROUND22_NAMES["default"],
    "lpP": "forward: the pick leaving its chunk after P polls of its row (Config.leave_polls; "
    "the pick's LEAVE_POLLS is 256, which a program in the round 18 phase stamps never reached: "
    "its median wait was 4.7 us): the row's waits cut short, the left chunks written by the "
    "row's last publisher from global memory (L2 where the chunk is still there)",
    "lpP_gG": "lpP with the left chunks written G pieces a step, all loaded before any is "
    "stored (Config.left_group; the pick's left writer loads one piece, 16 bytes a thread, a "
    "step)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def _by_pid_forward_pick(n: int, itemsize: int, backward: bool) -> Config | None:
    """The pick for one row of n past the tile, where it is the one-shot smem forward by
    program id (the kernel rounds 23-28 vary); None elsewhere (the backward, short rows, a GPU
    without the smem design)."""
    if n <= ONE_PASS_MAX_ELEMS or backward:
        return None
    pick = _pick_config(n, 1, False, backward, torch.device(DEVICE), itemsize, smem_ok=True)
    if pick.design != "smem" or not pick.by_pid or pick.per_sm:
        return None
    return pick


def round23_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 23, the forward past the tile: the one-shot pick leaving its chunk early."""
    pick = _by_pid_forward_pick(n, itemsize, backward)
    if pick is None:
        return {}
    out = {f"lp{polls}": pick._replace(leave_polls=polls) for polls in (4, 8, 16, 32)}
    for polls, group in ((8, 4), (16, 4), (8, 8)):  # whole chunks (not with interleave)
        out[f"lp{polls}_g{group}"] = pick._replace(leave_polls=polls, left_group=group,
                                                   interleave=False)  # fmt: skip
    return out


# What each round 26 name means (printed at the start of a --round26 run).
ROUND26_NAMES = {
    "default": ROUND22_NAMES["default"],
    "widen": "forward, bf16: the pick with its sum pass and write widening each word of two "
    "values by a shift and a mask (Config.widen: 4.3 instructions a value in the sum pass "
    "against 4.8, sm_90 offline), the sum pass starting from its first piece",
    "widen_1c": "widen with the chunk copied in as one copy (Config.one_copy)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round26_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 26, the bf16 forward past the tile: the pick widening by integer ops."""
    pick = _by_pid_forward_pick(n, itemsize, backward)
    if pick is None or itemsize != 2:
        return {}
    return {"widen": pick._replace(widen=True),
            "widen_1c": pick._replace(widen=True, one_copy=True)}  # fmt: skip


# What each round 27 name means (printed at the start of a --round27 run).
ROUND27_NAMES = {
    "default": ROUND22_NAMES["default"],
    "lead{k}_{t}us": "forward: the pick behind k lead programs an SM that hold their slots, the "
    "i-th of an SM for i x t us (Config.lead, lead_ns), so that the first wave's chunk programs "
    "start 6 - k an SM and the rest in turn",
    "lead4_1.5us_sS": "lead4_1.5us polling its row every S ns, not 200 (Config.sleep_ns)",
    "lead4_1.5us_pfK": "lead4_1.5us, its first K leads an SM each prefetching one of the grid's "
    "last chunks into L2 with evict_last (Config.tail_pf), so that the launch's last rows load "
    "from L2",
    "nolead": "the pick without lead programs (the default has them on grids of several waves)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round27_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 27, the forward past the tile: the pick behind lead programs (Config.lead)."""
    pick = _by_pid_forward_pick(n, itemsize, backward)
    if pick is None:
        return {}
    out = {f"lead{k}_{ns / 1000:g}us": pick._replace(lead=k, lead_ns=ns)
           for k, ns in ((3, 1500), (4, 1250), (4, 1500), (4, 1750), (5, 1250))}
    for sleep_ns in (100, 400):  # the row's polls closer together or further apart
        out[f"lead4_1.5us_s{sleep_ns}"] = pick._replace(lead=4, lead_ns=1500, sleep_ns=sleep_ns)
    for k in (1, 2, 4):  # the grid's last k chunks an SM prefetched into L2 by the leads
        out[f"lead4_1.5us_pf{k}"] = pick._replace(lead=4, lead_ns=1500, tail_pf=k,
                                                  interleave=False)  # whole chunks  # fmt: skip
    out["nolead"] = pick._replace(lead=0, lead_ns=0)  # one row's pick: no lead (a small grid)
    return out


# What each round 28 name means (printed at the start of a --round28 run).
ROUND28_NAMES = {
    "default": ROUND22_NAMES["default"],
    "lead_wW": "forward: the pick behind its leads (4 x 1.5 us) on W warps, not its own, and no "
    "register cap (W = half the pick's: each thread takes twice the values of the 32 KB chunk; "
    "twice: half of them, capped at 40 registers for 6 programs an SM)",
    "wW_nolead": "lead_wW without lead programs",
    "il": "forward: the pick behind its leads (4 x 1.5 us) with a row's chunks interleaved piece "
    "by piece (Config.interleave: chunk k's piece p at the row's piece p x chunks + k), so that "
    "a row's programs read and write one contiguous span a step (the ladder's row_cp_il)",
    "il_nolead": "il without lead programs",
    "whole": "il with whole chunks (round 27's pick)",
    "same_bytes": ROUND5_NAMES["same_bytes"],
}


def round28_candidates(n: int, itemsize: int, backward: bool) -> dict[str, Config]:
    """Round 28, the forward past the tile: the pick's 32 KB chunks on other warp counts."""
    pick = _by_pid_forward_pick(n, itemsize, backward)
    if pick is None:
        return {}
    half = pick.num_warps // 2
    out = {f"lead_w{half}": pick._replace(lead=4, lead_ns=1500, num_warps=half, maxnreg=0),
           f"w{half}_nolead": pick._replace(num_warps=half, maxnreg=0)}  # fmt: skip
    if pick.num_warps < 8:  # 6 programs of 8 warps an SM at most: 40 registers a thread
        out["lead_w8"] = pick._replace(lead=4, lead_ns=1500, num_warps=8, maxnreg=40)
    out["il"] = pick._replace(lead=4, lead_ns=1500, interleave=True)
    out["il_nolead"] = pick._replace(interleave=True)
    out["whole"] = pick._replace(lead=4, lead_ns=1500, interleave=False)
    return out


def _error_line(exc: Exception) -> str:
    msg = "".join(traceback.format_exception_only(exc)).strip().splitlines()
    return msg[-1][:160] if msg else repr(exc)


ROUND_CANDIDATES = {
    4: round4_candidates, 5: round5_candidates, 6: round6_candidates, 7: round7_candidates,
    8: round8_candidates, 9: round9_candidates, 10: round10_candidates,
    11: round11_candidates, 12: round12_candidates, 13: round13_candidates,
    14: round14_candidates, 15: round15_candidates, 16: round16_candidates,
    17: round17_candidates, 18: round18_candidates, 19: round19_candidates,
    20: round20_candidates, 21: round21_candidates, 22: round22_candidates,
    23: round23_candidates, 26: round26_candidates, 27: round27_candidates,
    28: round28_candidates,
}  # fmt: skip
ROUND_NAMES = {3: ROUND3_NAMES, 4: ROUND4_NAMES, 5: ROUND5_NAMES, 6: ROUND6_NAMES,
               7: ROUND7_NAMES, 8: ROUND8_NAMES, 9: ROUND9_NAMES,
               10: ROUND10_NAMES, 11: ROUND11_NAMES, 12: ROUND12_NAMES,
               13: ROUND13_NAMES, 14: ROUND14_NAMES, 15: ROUND15_NAMES,
               16: ROUND16_NAMES, 17: ROUND17_NAMES, 18: ROUND18_NAMES,
               19: ROUND19_NAMES, 20: ROUND20_NAMES, 21: ROUND21_NAMES,
               22: ROUND22_NAMES, 23: ROUND23_NAMES, 26: ROUND26_NAMES,
               27: ROUND27_NAMES, 28: ROUND28_NAMES}  # fmt: skip
# rows that time something else than our kernels: never the "best Triton variant"
REFERENCES = ("eager", "same_bytes", "inductor", "inductor_mac")


def _for_smoke(cfg: Config) -> Config:
    # the interpreter runs programs one at a time: a waiting (coop) program would never return,
    # and it does not run Gluon (smem)
    if cfg.design == "smem":
        return cfg._replace(design="split2", evict=False, per_sm=0, fold=0, regs=0,
                            by_pid=False, even=False, poly=0, one_copy=False, leave_polls=0,
                            left_group=1, widen=False, lead=0, lead_ns=0, tail_pf=0,
                            interleave=False)  # fmt: skip
    return cfg._replace(design="split2") if cfg.design == "coop" else cfg


def run_shape(dtype_name, m, n, copy_gbs, budget, best, rounds, round_no=0):
    """Check, time and print every variant of one shape, forward then backward."""
    dtype = DTYPES[dtype_name]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    x = torch.randn(m, n, device=DEVICE, dtype=dtype)
    y = torch.softmax(x, -1)
    dy = torch.randn_like(y)
    tol = TOLERANCES[dtype_name]

    fwd = {"eager": lambda: torch.softmax(x, -1)}
    # what _launch_rows passes _pick_config for these contiguous rows
    smem_ok = DEVICE == "cuda" and n > ONE_PASS_MAX_ELEMS and _smem_fits([x], [(0, n, 1)], n)
    pick = _pick_config(n, m, False, False, x.device, itemsize, smem_ok=smem_ok)
    fwd["default"] = lambda: _forward(x, -1, direct, None)
    bwd = {"eager": lambda: torch.ops.aten._softmax_backward_data(dy, y, -1, dtype)}
    bwd_pick = _pick_config(n, m, False, True, x.device, itemsize, smem_ok=smem_ok)
    bwd["default"] = lambda: _backward(y, dy, -1, direct, None)
    if round_no == 3:
        fwd_cands = round3_candidates(n, itemsize, False, pick)
        bwd_cands = round3_candidates(n, itemsize, True, bwd_pick)
    elif round_no in ROUND_CANDIDATES:
        fwd_cands = ROUND_CANDIDATES[round_no](n, itemsize, False)
        bwd_cands = ROUND_CANDIDATES[round_no](n, itemsize, True)
    else:
        fwd_cands = forward_candidates(n, itemsize)
        bwd_cands = backward_candidates(n, itemsize)
    if DEVICE == "cpu":
        fwd_cands = {k: _for_smoke(c) for k, c in fwd_cands.items()}
        bwd_cands = {k: _for_smoke(c) for k, c in bwd_cands.items()}
    for name, cfg in fwd_cands.items():
        fwd[name] = lambda cfg=cfg: _forward(x, -1, direct, cfg)
    for name, cfg in bwd_cands.items():
        bwd[name] = lambda cfg=cfg: _backward(y, dy, -1, direct, cfg)
    if round_no >= 5:  # the roofline at this size, timed alike (not a Triton variant)
        out = torch.empty_like(x)
        fwd["same_bytes"] = lambda: out.copy_(x)
        bwd["same_bytes"] = lambda: torch.add(y, dy, out=out)
    if round_no == 13:
        fwd["default_ev"] = lambda: _forward(x, -1, direct, pick._replace(evict=True))
    inductor = round_no in (6, 12, 13, 15, 16) or (round_no == 14 and n <= ONE_PASS_MAX_ELEMS)
    if inductor:  # Inductor's kernels for the same call, timed alike (not Triton)
        # compiled afresh for each shape: one lambda over every shape and dtype passed dynamo's
        # recompile limit at round 12's ninth and ran eager from there on
        torch._dynamo.reset()
        for name, mode in (("inductor", "default"), ("inductor_mac", "max-autotune-no-cudagraphs")):
            fwd[name] = torch.compile(lambda t: torch.softmax(t, -1), mode=mode, dynamic=False)
            fwd[name] = functools.partial(fwd[name], x)
    if round_no == 4:
        fwd["default_g"] = lambda: _forward(x, -1, direct, None)
        bwd["default_g"] = lambda: _backward(y, dy, -1, direct, None)
        if DEVICE == "cuda":  # the interpreter has no graphs: --smoke calls them directly
            for variants in (fwd, bwd):
                for name in variants:
                    if name.endswith("_g"):
                        variants[name] = _graphed(variants[name])

    def fwd_reference():
        return torch.softmax(x.double(), -1)

    def bwd_reference():
        y64, dy64 = y.double(), dy.double()
        return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))

    tuned_before = len(TUNING_LOG)
    for pass_name, variants, reference_fn, nbytes, chosen in (
        ("fwd", fwd, fwd_reference, 2 * m * n * itemsize, pick),
        ("bwd", bwd, bwd_reference, 3 * m * n * itemsize, bwd_pick),
    ):
        print(f"# {dtype_name} {m}x{n} {pass_name} default = {chosen}")
        # -- correctness first (this also compiles every variant) --
        reference = reference_fn()
        errors, ok = {}, []
        for name, fn in variants.items():
            if not budget.left():
                errors[name] = "SKIPPED (time budget)"
                continue
            try:
                if name == "same_bytes":  # not softmax: nothing to check
                    fn()
                    ok.append(name)
                    errors[name] = 0.0
                    continue
                err = relative_error(fn(), reference)
                if not err < tol:
                    raise AssertionError(f"relative error {err:.2e} >= {tol:.1e}")
                ok.append(name)
                errors[name] = err
            except Exception as exc:  # one failing variant must not stop the probe
                errors[name] = f"FAILED {_error_line(exc)}"
        del reference
        for line in TUNING_LOG[tuned_before:]:  # the first call's choice (kernels.softmax.TUNE)
            print(f"# {line}")
        tuned_before = len(TUNING_LOG)
        # -- timing: rounds over all variants, the best round of each --
        times: dict[str, float] = {}
        for _ in range(rounds):
            for name in ok:
                if budget.left() or name not in times:
                    try:
                        times[name] = min(times.get(name, float("inf")), bench(variants[name]))
                    except Exception as exc:
                        errors[name] = f"FAILED {_error_line(exc)}"
        eager_ms = times.get("eager")
        for name in variants:
            row = f"{dtype_name:5} {m:7d} {n:7d} {pass_name:4} {name:18}"
            if name not in times or isinstance(errors[name], str):
                print(f"{row} {errors[name]}")
                continue
            ms = times[name]
            gbs = nbytes / (ms * 1e-3) / 1e9
            ratio = f"{eager_ms / ms:7.2f}" if eager_ms else f"{'-':>7}"
            print(f"{row} {ms:8.4f} {gbs:6.0f} {100 * gbs / copy_gbs:5.1f}% {ratio}  "
                  f"err {errors[name]:.1e}")  # fmt: skip
            key = (dtype_name, n, pass_name)
            if name not in REFERENCES and (key not in best or ms < best[key][1]):
                best[key] = (name, ms, gbs)
        sys.stdout.flush()


def main() -> int:
    global DEVICE, ROWS, BAND_UNIT, bench
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--budget", type=float, default=85.0, help="seconds for the whole probe")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (best one kept)")
    parser.add_argument("--only", default="", help="comma list of N to run (default: all)")
    parser.add_argument(
        "--elems", type=int, default=0,
        help="elements a tensor (M = elems // N) instead of the rows set's 2^25",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    parser.add_argument("--round3", action="store_true", help="the round 3 candidates")
    parser.add_argument("--round4", action="store_true", help="the round 4 (band) candidates")
    parser.add_argument("--round5", action="store_true", help="the round 5 (coop grid) candidates")
    parser.add_argument("--round6", action="store_true", help="short-row tiles vs Inductor")
    parser.add_argument("--round7", action="store_true", help="16-bit pairs, register caps")
    parser.add_argument("--round8", action="store_true", help="coop forward without a 2nd exp")
    parser.add_argument("--round9", action="store_true", help="knobs around the round 9 picks")
    parser.add_argument("--round10", action="store_true", help="smem design vs coop")
    parser.add_argument("--round11", action="store_true", help="persistent smem kernels")
    parser.add_argument("--round12", action="store_true", help="N <= 16384 vs Inductor")
    parser.add_argument("--round13", action="store_true", help="Inductor's looped form, evict")
    parser.add_argument("--round14", action="store_true", help="no masks, int32, folded smem")
    parser.add_argument("--round15", action="store_true", help="tiles of 512 B - 2 KB")
    parser.add_argument("--round16", action="store_true", help="tiles of 16 B a thread")
    parser.add_argument("--round17", action="store_true", help="the smem forward's poll interval")
    parser.add_argument("--round18", action="store_true", help="smem chunks held in registers too")
    parser.add_argument("--round19", action="store_true", help="smem chunks by program id")
    parser.add_argument("--round20", action="store_true", help="smem: no masks, leaving")
    parser.add_argument("--round21", action="store_true", help="smem backward by pid, poly exp2")
    parser.add_argument("--round22", action="store_true", help="persistent smem forward by pid")
    parser.add_argument("--round23", action="store_true", help="smem forward leaving early")
    parser.add_argument("--round26", action="store_true", help="bf16 smem forward widening")
    parser.add_argument("--round27", action="store_true", help="smem forward behind lead programs")
    parser.add_argument("--round28", action="store_true", help="smem forward on other warp counts")
    parser.add_argument(
        "--timer", choices=("gpu", "do_bench"), default="gpu",
        help="gpu: the benchmark's GpuTimer (median, CPU path hidden); do_bench: rounds 1-7's",
    )  # fmt: skip
    args = parser.parse_args()
    rounds = (*range(3, 24), 26, 27, 28)
    round_no = max([r for r in rounds if getattr(args, f"round{r}")], default=0)
    bench = bench_gpu if args.timer == "gpu" else bench_do_bench
    if args.round6:  # the short rows, where the tile meets Inductor's kernel
        ROWS = [(m, n) for m, n in ROWS if n <= 4096]
    if args.round4:  # the long rows, then N=16384 as a control
        ROWS = [(512, 65536), (128, 262144), (2048, 16384)]
    if args.smoke:  # checks the probe itself, without a GPU (run with TRITON_INTERPRET=1)
        DEVICE, ROWS = "cpu", [(5, 128), (3, 4096), (2, 20000)]
        if args.round3:  # a long row of several 4096-value chunks and of loop chunks
            ROWS = [(2, 70000), (3, 16384), (5, 128)]
        if args.round4:  # KiB bands: several bands of whole rows, chunks of 4096 and more
            BAND_UNIT = 2**10
            ROWS = [(7, 9000), (11, 4500), (3, 20000)]
        bench = lambda fn: 1.0  # noqa: E731
        if round_no in (5, 7, 8, 9, 10, 11, *range(17, 24), 26, 27, 28):  # a long row, chunks
            ROWS = [(2, 70000), (5, 128)]
        if round_no == 11:
            ROWS.append((3, 16384))
        if round_no in (12, 13):
            ROWS = [(5, 128), (3, 1000), (3, 16384)]
        if round_no == 14:
            ROWS = [(16, 128), (3, 1000), (4, 4096), (2, 70000)]
        if round_no in (15, 16):
            ROWS = [(16, 128), (5, 1000)]
        if args.round6:
            ROWS = [(5, 128), (3, 1000)]
    elif round_no == 18:  # the long rows, and N = 16384 (smem on rows of one chunk)
        ROWS = [(m, n) for m, n in ROWS if n >= ONE_PASS_MAX_ELEMS]
    elif round_no in (7, 8, 9, 10, 17, 19, 20, 21, 22, 23, 26, 28):  # the long rows only
        ROWS = [(m, n) for m, n in ROWS if n > ONE_PASS_MAX_ELEMS]
    elif round_no == 11:  # the longest tile rows, and the long rows
        ROWS = [(m, n) for m, n in ROWS if n >= ONE_PASS_MAX_ELEMS]
    elif round_no in (12, 13):  # the tile's rows
        ROWS = [(m, n) for m, n in ROWS if n <= ONE_PASS_MAX_ELEMS]
    elif round_no in (15, 16):  # the rows the pick gives a tile
        ROWS = [(m, n) for m, n in ROWS if n <= 1024]
    elif args.round3 or args.round5:  # long rows first: they are round 3's first question
        ROWS = sorted(ROWS, key=lambda mn: (mn[1] < 65536, mn[1]))
    if args.elems:
        ROWS = [(max(1, args.elems // n), n) for _, n in ROWS]
    budget = Budget(args.budget)
    start = time.monotonic()
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"# {name} torch {torch.__version__} triton {triton.__version__} timer {args.timer}")
    copy_gbs = copy_bandwidth()
    print(f"# copy bandwidth (read+write 1 GB, best of 3): {copy_gbs:.0f} GB/s")
    header = f"{'dtype':5} {'M':>7} {'N':>7} {'pass':4} {'variant':18} {'ms':>8} {'GB/s':>6}"
    print(header + f" {'%copy':>6} {'x eager':>7}  note")

    best: dict[tuple, tuple[str, float, float]] = {}
    only = {int(v) for v in args.only.split(",") if v}
    dtypes = args.dtypes.split(",")
    if round_no:
        for name, meaning in ROUND_NAMES[round_no].items():
            print(f"# {name:16} {meaning}")
        # shape outer, dtype inner: both dtypes of the long rows come first
        jobs = [(d, m, n) for m, n in ROWS for d in dtypes]
    else:
        jobs = [(d, m, n) for d in dtypes for m, n in ROWS]
    for dtype_name, m, n in jobs:
        if not only or n in only:
            run_shape(dtype_name, m, n, copy_gbs, budget, best, args.rounds, round_no)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()

    print("# best Triton variant per shape (GB/s, % of copy)")
    for (dtype_name, n, pass_name), (name, _, gbs) in best.items():
        print(f"#  {dtype_name} N={n:<7d} {pass_name}: {name:18} {gbs:6.0f} GB/s "
              f"{100 * gbs / copy_gbs:5.1f}%")  # fmt: skip
    print(f"# copy bandwidth again at the end: {copy_bandwidth():.0f} GB/s")
    print(f"# probe took {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
