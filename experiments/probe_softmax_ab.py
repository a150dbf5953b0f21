"""Our softmax against torch.compile's modes, timed in one process, interleaved (GPU; a probe).

The benchmark (`make bench kernel=softmax`) times each mode in a job of its own, and the target
"Triton at least 1.0x the best compile mode" reads their ratio. Where both run at the copy's
rate (N <= 16384) that ratio has missed by 0.2-0.5% at a shape that changed from run to run
(kernels/notes/softmax.md, rounds 20-21), which is within what separate jobs can differ by. This
probe asks whether such a gap is real: for each shape of the `rows` set it times our softmax and
each compile mode ROUNDS times, every round on a fresh input (a new allocation, other pages)
and in a rotated order, and prints per round the ratio best compile mode / ours by GPU time
(above 1: ours is faster), with its median and range over the rounds. Configs of ours beside
the pick are timed too (`variants`: the online loop's other warps and store policy; the tile's
first-call candidates), and, with --inductor, our tile or loop in the block sizes and warps of
Inductor's kernels, whose chosen launch configs are printed (`inductor_configs`), and
Inductor's kernels themselves launched through Triton's launcher as ours are (ind_src_*), and
the max-autotune one edited toward ours (SOURCE_EDITS: ind_src_mac_<edit>).

    python -m experiments.probe_softmax_ab --rounds 7 --only 128,4096 --dtypes bf16,fp32
    python -m experiments.probe_softmax_ab --rounds 7 --only 128,512 --dtypes fp32 --inductor
    python -m experiments.probe_softmax_ab --rounds 7 --jsonl RESULTS/softmax/paired_ab.jsonl
    python -m experiments.probe_softmax_ab --rounds 9 --only 4096 --dtypes fp32 --inductor \
        --keep 'lanes|ind_src'

--jsonl appends each shape's per-round ratios as a record, which `python -m analysis.targets
RESULTS --paired FILE` reads as the paired form of the "vs best compile mode" target.

Each implementation is checked against float64 before it is timed; the timer is the
benchmark's (GpuTimer: median GPU time, L2 flushed, the CPU path off the clock).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import re
import statistics
import sys
from pathlib import Path

import torch
import triton

from experiments.correctness import TOLERANCES, relative_error
from experiments.probe_softmax import DTYPES, copy_bandwidth
from kernels._common import TUNING_LOG, direct
from kernels.softmax import (
    SMALL_TILE_MAX_COLS,
    Config,
    _launch_rows,
    _pick_config,
    _tile_candidates,
    softmax,
)

MODES = ("default", "max-autotune-no-cudagraphs")
SHAPES_FILE = Path(__file__).resolve().parents[1] / "conf" / "kernel" / "softmax.yaml"
LEAD_US = 400.0


def rows_shapes() -> list[tuple[int, int]]:
    """The benchmark's `rows` shapes (conf/kernel/softmax.yaml)."""
    from omegaconf import OmegaConf

    conf = OmegaConf.load(SHAPES_FILE)
    return [(int(s.m), int(s.n)) for s in conf.shape_sets.rows]


def implementations() -> dict:
    """Our softmax and a fresh torch.compile of torch.softmax per mode (dynamic=False, as the
    benchmark's compile config: one compile per shape). Dynamo's caches are reset first: its
    recompile limit (8 a code object) would otherwise run the later shapes eagerly."""
    torch._dynamo.reset()
    impls = {"triton": lambda x: softmax(x, -1)}
    for mode in MODES:
        impls[mode] = torch.compile(lambda x: torch.softmax(x, -1), mode=mode, dynamic=False)
    return impls


def variants(m: int, n: int, itemsize: int) -> dict[str, Config]:
    """Configs of ours to time beside softmax()'s pick: the pick as round 22 shipped it
    (triton_r22: without Config.lean's index and loop code). Where the pick is the online row
    loop (Inductor's looped form): the stores without evict_first (Config.store_default, as
    Inductor's), half or twice the warps, two rows a program, no evict hints, tl.exp, half the
    step, the first pass lane by lane (Config.lanes), and the one-pass tile on the same row and
    warps (with evict_first loads and stores too). Where it is a tile that the first call may
    tune (rows of up to SMALL_TILE_MAX_COLS): the tuner's other candidates (_tile_candidates)."""
    device = torch.device("cuda")
    pick = _pick_config(n, m, False, False, device, itemsize)
    # the pick as round 22 shipped it: no Config.lean (and the online loop with masks, int64)
    out = {"triton_r22": pick._replace(lean=False)}
    if pick.design == "online":
        out["triton_r22"] = out["triton_r22"]._replace(even=False, int32=False)
        out["triton_st"] = pick._replace(store_default=True)
        for warps in (pick.num_warps // 2, pick.num_warps * 2):
            if 1 <= warps <= 32:
                out[f"triton_w{warps}"] = pick._replace(num_warps=warps)
        # two rows a program (Inductor's max-autotune choice at fp32 4096 on the H200), and
        # the one-pass tile on the pick's row and warps (the row held in registers, read once)
        out["triton_2r"] = pick._replace(block_rows=2)
        # no evict hints (the second read then relies on L2 keeping the row by itself), tl.exp
        # in place of the exp2 form, and the row in two steps (the loops kept)
        out["triton_noevict"] = pick._replace(evict=False)
        out["triton_exp"] = pick._replace(exp2=0)
        out["triton_c2"] = pick._replace(block_cols=pick.block_cols // 2)
        # Inductor's form of the first pass (Config.lanes), with the stores' default policy too
        out["triton_lanes"] = pick._replace(lanes=True)
        out["triton_lanes_st"] = pick._replace(lanes=True, store_default=True)
        # and libdevice's exp in the write (2), in the first pass too (3), Inductor's max (4):
        # Inductor's arithmetic throughout (round 24)
        for level in (2, 3, 4):
            out[f"triton_lanes{level}_st"] = pick._replace(lanes=level, store_default=True)
        out["triton_lanes4"] = pick._replace(lanes=4)
        tile = Config("tile", 1, pick.block_cols, pick.num_warps, even=True, int32=True)
        out["triton_tile"] = tile
        out["triton_tile_ef"] = tile._replace(evict=True)
    elif pick.design == "tile" and n <= SMALL_TILE_MAX_COLS.get(itemsize, 0):
        for config in _tile_candidates(pick, m, 1, itemsize, device)[1:]:
            loop = "_online" if config.design == "online" else ""
            out[f"triton{loop}_{config.block_rows}r_w{config.num_warps}"] = config
    return out


def inductor_configs(m: int, n: int, dtype_name: str) -> list[dict]:
    """The launch configs Inductor chose for softmax kernels of rows (m, n) of dtype_name in
    this process: each live CachingAutotuner (one a compiled kernel) whose size hints are these
    rows and whose input is of this dtype, with one launcher left (autotuned, or one config to
    begin with). A probe's look inside Inductor: the attribute names are torch 2.11's."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    want_x = 1 << max(0, (m - 1).bit_length())
    out = []
    for obj in gc.get_objects():
        if not issubclass(type(obj), CachingAutotuner):  # type(): weak proxies raise on access
            continue
        hints = getattr(obj, "size_hints", None) or {}
        rnumel = hints.get("r0_", hints.get("r"))
        launchers = getattr(obj, "launchers", [])
        signature = getattr(obj, "triton_meta", {}).get("signature", {})
        if hints.get("x") != want_x or rnumel is None or rnumel < n or len(launchers) != 1:
            continue
        if signature.get("in_ptr0") != f"*{dtype_name}":
            continue
        config = launchers[0].config
        out.append({
            "kernel": getattr(obj.fn, "__name__", "?"), "fn": obj.fn,
            "max_autotune": bool(obj.inductor_meta.get("max_autotune")),
            "kwargs": dict(config.kwargs), "num_warps": config.num_warps,
            "num_stages": config.num_stages,
        })  # fmt: skip
    return out


def inductor_shaped(found: list[dict], n: int, pick: Config) -> dict[str, Config]:
    """Our kernel in the block sizes and warps of Inductor's (found: inductor_configs): the tile
    with XBLOCK rows where the pick is a tile and Inductor's kernel is persistent (no
    R0_BLOCK), the online loop with a loop tile of R0_BLOCK where both loop."""
    out = {}
    for found_config in found:
        kwargs, warps = found_config["kwargs"], found_config["num_warps"]
        rows = int(kwargs.get("XBLOCK", 1))
        rblock = kwargs.get("R0_BLOCK", kwargs.get("RBLOCK"))
        if pick.design == "tile" and rblock is None:
            config = Config("tile", rows, pick.block_cols, warps, even=True, int32=True)
        elif pick.design == "online" and rblock is not None and rows == 1:
            config = pick._replace(block_cols=min(int(rblock), pick.block_cols), num_warps=warps)
        else:
            continue
        if config != pick:
            out[f"ind_{config.block_rows}r_{config.block_cols}c_w{warps}"] = config
    return out


def ratios(times: dict[str, list[float]], ours: str = "triton") -> list[float]:
    """Per round: the best compile mode's GPU time over ours (above 1: ours is faster)."""
    rounds = len(times[ours])
    return [min(times[m][r] for m in MODES) / times[ours][r] for r in range(rounds)]


def paired_record(dtype_name: str, m: int, n: int, times: dict[str, list[float]]) -> dict:
    """One shape's paired reading for analysis.targets --paired: the per-round ratios (best
    compile mode / ours by GPU time), their median, and the median GPU time of each side."""
    ratio = ratios(times)
    return {
        "probe": "softmax_ab", "kernel": "softmax", "pass": "fwd", "dtype": dtype_name,
        "m": m, "n": n, "rounds": len(ratio), "ratios": ratio,
        "median_ratio": statistics.median(ratio),
        "time_ms_p50": {name: statistics.median(times[name]) for name in ("triton", *MODES)},
    }  # fmt: skip


NO_VARIANTS = "none"  # --keep none: softmax() and the compile modes only (make bench's run)


def kept(name: str, keep: str | None) -> bool:
    """Whether a variant or Inductor-kernel entry is timed: all where keep is None, none where
    it is NO_VARIANTS, else those whose name the regex keep finds in (triton and the compile
    modes always are)."""
    if name in ("triton", *MODES):
        return True
    return keep is None or (keep != NO_VARIANTS and re.search(keep, name) is not None)


def run_shape(m: int, n: int, dtype_name: str, rounds: int, timer, copy_gbs: float,
              inductor: bool = False, records: list | None = None,
              keep: str | None = None) -> str:  # fmt: skip
    """Time one shape (see the module's docstring); its printed lines. records: where its
    paired_record goes (None: nowhere); keep: which variants to time (`kept`)."""
    dtype = DTYPES[dtype_name]
    impls = implementations()
    log_start = len(TUNING_LOG)  # the first call's choice, where softmax() makes one
    x = torch.randn(m, n, device="cuda", dtype=dtype)
    configs = {k: c for k, c in variants(m, n, x.element_size()).items() if kept(k, keep)}
    for name, config in configs.items():
        impls[name] = lambda x, config=config: _run_config(x, config)
    ref = torch.softmax(x.double(), -1)
    found = []
    pending = list(impls)  # each checked once, correct before timed (this also compiles)
    while pending:
        name = pending.pop(0)
        err = relative_error(impls[name](x), ref)
        if not err < TOLERANCES[dtype_name]:
            return f"{dtype_name:5} {m:>8} {n:>7}  {name} FAILED: relative error {err:.1e}"
        if inductor and name == MODES[-1]:  # both modes compiled and run: their choices
            found = inductor_configs(m, n, dtype_name)
            pick = _pick_config(n, m, False, False, torch.device("cuda"), x.element_size())
            added = {}
            for shaped, config in inductor_shaped(found, n, pick).items():
                if config not in configs.values():
                    configs[shaped] = config
                    added[shaped] = lambda x, config=config: _run_config(x, config)
            for found_config in found:  # Inductor's own kernel, launched as ours are
                mode = "mac" if found_config["max_autotune"] else "default"
                added[f"ind_src_{mode}"] = functools.partial(_run_inductor_kernel, found_config)
                if not found_config["max_autotune"]:
                    continue
                for edit in SOURCE_EDITS:  # and edited toward ours, one step at a time
                    if _edited_source(found_config["fn"].src, edit) is not None:
                        added[f"ind_src_{mode}_{edit}"] = functools.partial(
                            _run_inductor_kernel, found_config, edit=edit
                        )
            added = {k: fn for k, fn in added.items() if kept(k, keep)}
            impls.update(added)
            pending += list(added)
    del ref
    names = list(impls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        x = torch.randn(m, n, device="cuda", dtype=dtype)  # a new allocation each round
        for name in names[r % len(names):] + names[: r % len(names)]:
            call = lambda fn=impls[name], x=x: fn(x)  # noqa: E731
            times[name].append(timer.measure(call, warmup_ms=10, rep_ms=50, lead_us=LEAD_US)["p50"])
    ratio = ratios(times)
    if records is not None:
        records.append(paired_record(dtype_name, m, n, times))
    ours = statistics.median(times["triton"])
    pct = 2 * x.numel() * x.element_size() / (ours * 1e-3) / 1e9 / copy_gbs * 100
    modes = " ".join(f"{statistics.median(times[mode]) * 1e3:8.2f}" for mode in MODES)
    spread = f"{statistics.median(ratio):7.4f} {min(ratio):7.4f} {max(ratio):7.4f}"
    per_round = " ".join(f"{v:.4f}" for v in ratio)
    head = f"{dtype_name:5} {m:>8} {n:>7} {ours * 1e3:8.2f} {modes} {pct:6.1f}"
    lines = [f"{head} {spread}  {per_round}"]
    lines += [f"  tuned: {line}" for line in TUNING_LOG[log_start:]]
    for found_config in found:
        mode = "max-autotune" if found_config["max_autotune"] else "default"
        lines.append(f"  inductor {mode:<13} {found_config['kernel']}: {found_config['kwargs']} "
                     f"warps {found_config['num_warps']} stages {found_config['num_stages']}")
    for name in names[len(MODES) + 1:]:  # the variants: their own ratio to the compile modes
        ratio = ratios(times, name)
        spread = f"{statistics.median(ratio):.4f} ({min(ratio):.4f} - {max(ratio):.4f})"
        lines.append(f"  {name:<22} {statistics.median(times[name]) * 1e3:8.2f} us; ratio {spread}")
    return "\n".join(lines)


INDUCTOR_IMPORTS = """import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math

@triton.jit
"""


# Edits of Inductor's looped kernel toward ours (round 24; regex, replacement pairs, applied in
# turn): where Inductor's kernel is ahead, the edit that loses its lead names what does it.
# fexp: the write's exp as tl.exp (ours: ex2.approx) in place of libdevice's expf; mul: y by a
# multiply with 1 / sum, not a division; stef: the stores evict_first, as ours
_FEXP = (r"libdevice\.exp\(", "tl_math.exp(")
_MUL = (r"\((tmp\d+) / (tmp\d+)\)", r"(\1 * (1.0 / \2))")
_STEF = (r"(tl\.store\(.*)\)[ \t]*$", r"\1, eviction_policy='evict_first')")
SOURCE_EDITS = {
    "fexp": [_FEXP], "mul": [_MUL], "stef": [_STEF], "fexp_mul": [_FEXP, _MUL],
    "fexp_mul_stef": [_FEXP, _MUL, _STEF],
}


def _edited_source(source: str, edit: str | None) -> str | None:
    """source with SOURCE_EDITS[edit] applied (None: as it is); None where a pattern of the
    edit does not occur in it."""
    for pattern, replacement in SOURCE_EDITS.get(edit, []):
        source, count = re.subn(pattern, replacement, source, flags=re.MULTILINE)
        if count == 0:
            return None
    return source


def _inductor_kernel_copy(found_config: dict, edit: str | None = None):
    """A fresh triton.jit of an Inductor kernel's source (Inductor's own JITFunction is kept
    in a form that cannot compile again), from a file of its own (triton.jit reads it back);
    edit: a SOURCE_EDITS key applied to the source first."""
    copies = found_config.setdefault("copies", {})
    if edit not in copies:
        import importlib.util
        import tempfile

        source = _edited_source(found_config["fn"].src, edit)
        source = source[source.index("def "):]
        path = Path(tempfile.mkdtemp()) / "inductor_kernel.py"
        path.write_text(INDUCTOR_IMPORTS + source)
        name = f"inductor_kernel_{id(found_config)}_{edit}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        copies[edit] = getattr(module, found_config["kernel"])
    return copies[edit]


def _run_inductor_kernel(found_config: dict, x: torch.Tensor, edit: str | None = None):
    """Inductor's kernel (inductor_configs) in its chosen config, launched through Triton's
    launcher as our kernels are: whether a gap is the kernel's or its launch path's. Its
    signature is (in_ptr0, out_ptr, xnumel, r0_numel, XBLOCK[, R0_BLOCK]), grid 1-D. edit:
    the kernel edited first (SOURCE_EDITS)."""
    y = torch.empty_like(x)
    m, n = x.shape
    kwargs = found_config["kwargs"]
    grid = (triton.cdiv(m, int(kwargs.get("XBLOCK", 1))),)
    _inductor_kernel_copy(found_config, edit)[grid](
        x, y, m, n, **kwargs, num_warps=found_config["num_warps"],
        num_stages=found_config["num_stages"],
    )  # fmt: skip
    return y


def _run_config(x: torch.Tensor, config: Config) -> torch.Tensor:
    y = torch.empty_like(x)
    _launch_rows(direct, [x, y], False, config)
    return y


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="fresh inputs a shape")
    parser.add_argument("--only", default="", help="row lengths N, comma-separated (default: all)")
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--inductor", action="store_true",
                        help="print Inductor's chosen configs; time ours in their shapes too")
    parser.add_argument("--jsonl", type=Path, default=None,
                        help="also append each shape's paired reading (per-round ratios) here, "
                        "for python -m analysis.targets RESULTS --paired FILE")
    parser.add_argument("--keep", default=None,
                        help="time only the variants whose name this regex finds in "
                        f"({NO_VARIANTS!r}: none)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: this probe times on a GPU")
        return 1
    from experiments.timing import GpuTimer

    only = {int(v) for v in args.only.split(",") if v}
    shapes = [(m, n) for m, n in rows_shapes() if not only or n in only]
    timer = GpuTimer(torch.device("cuda"), flush_l2=True)
    copy_gbs = copy_bandwidth()
    gpu_name = torch.cuda.get_device_name()
    print(f"# {gpu_name} torch {torch.__version__}; copy {copy_gbs:.0f} GB/s;"
          f" {args.rounds} rounds a shape, each on a fresh input, order rotated")  # fmt: skip
    print("# us: medians over rounds; ratio: best compile mode / ours by GPU time, per round")
    print(f"{'dtype':5} {'M':>8} {'N':>7} {'triton':>8} {'default':>8} {'mac-nocg':>8} "
          f"{'%copy':>6} {'ratio':>7} {'min':>7} {'max':>7}  per round")  # fmt: skip
    failed = False
    for dtype_name in args.dtypes.split(","):
        for m, n in shapes:
            records = []
            line = run_shape(m, n, dtype_name, args.rounds, timer, copy_gbs, args.inductor,
                             records, args.keep)  # fmt: skip
            failed |= "FAILED" in line
            print(line, flush=True)
            if args.jsonl is not None:
                with args.jsonl.open("a") as out:
                    for record in records:
                        record.update(gpu_name=gpu_name, torch=torch.__version__,
                                      triton=triton.__version__, copy_gbps=copy_gbs)  # fmt: skip
                        out.write(json.dumps(record) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
