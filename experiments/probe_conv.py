"""GPU probe for kernels/conv.py: each design and path against cuDNN, ResNet-50 layers, bf16 NHWC.

    python -m experiments.probe_conv [--shapes resnet50|resnet50_core|resnet50_b128|small]
                                     [--quick] [--budget SECONDS]

Per layer, first correctness (float64 reference, before any timing), then GPU time by
experiments.timing.GpuTimer (L2 flushed, a sleep-kernel lead keeps the CPU launch path off the
clock, as in the benchmark harness) for: cuDNN conv+bias (the baseline, "eager"), cuDNN without
bias, cuDNN conv+bias+relu, our auto path with bias, with bias+relu, and the alternative paths
(gemm / implicit / flat, with and without TMA). Each of our rows names the winning config and the
compiled kernel's registers, spills and shared memory. Then a few NCHW rows (convert vs native)
and the weight-packing cost. Rows print as they are measured; a failing variant prints FAILED and
the probe goes on; once the time budget is spent the remaining optional rows are skipped.
"""

import argparse
import math
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from omegaconf import OmegaConf

import kernels.conv as conv
from experiments.correctness import relative_error, tolerance
from experiments.timing import GpuTimer, call_latency_us

CONF = Path(__file__).resolve().parent.parent / "conf" / "kernel" / "conv.yaml"
START = time.perf_counter()
RESULTS = {}  # (label, variant) -> ms


def elapsed():
    return time.perf_counter() - START


def load_shapes(name):
    raw = OmegaConf.to_container(OmegaConf.load(CONF).shape_sets[name])
    return [{"stride": 1, "padding": 0, "dilation": 1, **s} for s in raw]


def out_hw(s):
    def out(size, k):
        return (size + 2 * s["padding"] - s["dilation"] * (k - 1) - 1) // s["stride"] + 1

    return out(s["h"], s["r"]), out(s["w"], s["s"])


def label_of(s):
    base = f"{s['n']}x{s['c']}x{s['h']}-k{s['k']}-{s['r']}x{s['s']}"
    return base + (f"-s{s['stride']}" if s["stride"] != 1 else "")


def flops(s):
    p, q = out_hw(s)
    return 2.0 * s["n"] * s["k"] * p * q * s["c"] * s["r"] * s["s"]


TIMER = []
CPU_US = {}


def bench(fn):
    """GPU time per call (p50 ms), as the benchmark harness measures it: L2 flushed, and a sleep
    kernel ahead of each sample so the CPU launch path is never on the clock (plain do_bench
    charges it whenever it outlasts the kernel). Also records the CPU enqueue time per call."""
    device = torch.device("cuda")
    if not TIMER:
        TIMER.append(GpuTimer(device, flush_l2=True))
    latency = call_latency_us(fn, device, calls=20, samples=3)
    CPU_US[id(fn)] = latency["enqueue_p80"]
    lead_us = 2 * latency["enqueue_p80"] + 50
    return TIMER[0].measure(fn, warmup_ms=5, rep_ms=30, lead_us=lead_us)["p50"]


def kernel_report():
    info = conv.last_launch[0]
    if info is None:
        return ""
    kernel, compiled = info
    cfg = getattr(kernel, "best_config", None)
    meta = cfg.kwargs if cfg is not None else {}
    block_m = meta.get("BLOCK_M") or f"{meta.get('BLOCK_H')}*{meta.get('BLOCK_W')}"
    tile = f"{block_m}x{meta.get('BLOCK_N')}x{meta.get('BLOCK_K')}"
    if cfg is not None:
        tile += f" s{cfg.num_stages} w{cfg.num_warps}"
    names = {id(conv.conv_gemm_kernel): "gemm", id(conv.conv_implicit_kernel): "implicit",
             id(conv.conv_flat_kernel): "flat", id(conv.conv_window_kernel): "window"}  # fmt: skip
    name = names.get(id(kernel), "?")
    try:
        regs, spills = compiled.n_regs, compiled.n_spills
        shared = compiled.metadata.shared
        res = f"regs={regs} spills={spills} smem={shared // 1024}K"
    except Exception as exc:  # noqa: BLE001 - a report detail, never fatal
        res = f"(no resource info: {type(exc).__name__})"
    timings = getattr(kernel, "configs_timings", None) or {}
    ranked = sorted(timings.items(), key=lambda kv: _first(kv[1]))[:3]
    others = " ".join(f"{_short(c)}={_first(t) * 1e3:.0f}us" for c, t in ranked)
    return f"{name} {tile} {res}" + (f" | tuned: {others}" if others else "")


def _first(t):
    return t[0] if isinstance(t, list | tuple) else t


def _short(config):
    m = config.kwargs
    block_m = m.get("BLOCK_M") or f"{m.get('BLOCK_H')}*{m.get('BLOCK_W')}"
    return f"{block_m}x{m['BLOCK_N']}x{m['BLOCK_K']}s{config.num_stages}w{config.num_warps}"


def row(label, variant, ms, s, base_ms, cpu_us, note=""):
    tf = flops(s) / (ms * 1e-3) / 1e12
    ratio = f"{base_ms / ms:6.2f}x" if base_ms else "   base"
    line = f"{label:<26} {variant:<22} {ms:8.4f} {tf:7.1f} {ratio} {cpu_us:6.0f}  {note}"
    print(line, flush=True)


def run_variant(label, variant, s, fn, ref, base_ms, dtype_name="bf16", report=True):
    """Check fn() against ref, then time it; prints one row (or FAILED) and returns ms."""
    try:
        conv.last_launch[0] = None
        y = fn()
        torch.cuda.synchronize()
        note = kernel_report() if report else ""
        if ref is not None:
            err = relative_error(y, ref)
            budget = tolerance(dtype_name, tf32=torch.backends.cudnn.allow_tf32)
            if not err < budget:
                print(f"{label:<26} {variant:<22} FAILED relative error {err:.2e} > {budget:.1e}")
                return None
        ms = bench(fn)
        RESULTS[(label, variant)] = ms
        row(label, variant, ms, s, base_ms, CPU_US.get(id(fn), float("nan")), note)
        return ms
    except Exception as exc:  # noqa: BLE001 - one failing variant must not stop the probe
        msg = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        print(f"{label:<26} {variant:<22} FAILED {type(exc).__name__}: {msg}", flush=True)
        if "--trace" in sys.argv:
            traceback.print_exc()
        return None


def make(s, dtype, channels_last=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(s["n"], s["c"], s["h"], s["w"], device="cuda", generator=g).to(dtype)
    fan_in = s["c"] * s["r"] * s["s"]
    w = torch.randn(s["k"], s["c"], s["r"], s["s"], device="cuda", generator=g) / math.sqrt(fan_in)
    b = torch.randn(s["k"], device="cuda", generator=g)
    return x.contiguous(memory_format=fmt), w.to(dtype).contiguous(memory_format=fmt), b.to(dtype)


def reference(x, w, b, s, relu=False):
    y = F.conv2d(x.double(), w.double(), None if b is None else b.double(),
                 s["stride"], s["padding"], s["dilation"])  # fmt: skip
    return F.relu(y) if relu else y


def eager_relu(x, w, b, geo):
    return F.relu(F.conv2d(x, w, b, *geo))


def alternates(s):
    """Paths other than the automatic one that apply to this layer: (name, kwargs)."""
    unit = s["r"] == s["s"] == 1 and s["stride"] == 1 and s["padding"] == 0
    alts = []
    if unit:
        alts += [("gemm-noTMA", dict(path="gemm", tma=False)), ("implicit", dict(path="implicit"))]
    elif s["c"] < 16:
        alts += [("flat-noTMA", dict(path="flat", tma=False)),
                 ("implicit(C pad)", dict(path="implicit"))]  # fmt: skip
    else:
        alts += [("implicit-noTMA", dict(path="implicit", tma=False))]
        if s["stride"] == 1:
            alts += [("window(TMA A)", dict(path="window"))]
    return alts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="resnet50")
    ap.add_argument("--quick", action="store_true", help="resnet50_core, no alternates")
    ap.add_argument("--budget", type=float, default=110.0, help="seconds before optional rows stop")
    ap.add_argument("--trace", action="store_true")
    args = ap.parse_args()
    quick_set = args.quick and args.shapes == "resnet50"
    shapes = load_shapes("resnet50_core" if quick_set else args.shapes)
    dtype = torch.bfloat16
    print(f"torch {torch.__version__} triton {triton.__version__} {torch.cuda.get_device_name()}")
    print(f"cudnn.allow_tf32={torch.backends.cudnn.allow_tf32}; bf16, channels_last x and weight")
    print("GPU time p50 (L2 flushed, CPU path off the clock); cpu_us: CPU enqueue time per call")
    print(f"{'layer':<26} {'variant':<22} {'ms':>8} {'TFLOP/s':>7} {'vs base':>7} {'cpu_us':>6}  "
          "config")  # fmt: skip

    # ---- pass 1: baseline and our automatic path, every layer (autotunes) ----
    for s in shapes:
        label = label_of(s)
        x, w, b = make(s, dtype)
        geo = (s["stride"], s["padding"], s["dilation"])
        ref = reference(x, w, b, s)
        eager = partial(F.conv2d, x, w, b, *geo)
        base = run_variant(label, "eager conv+bias", s, eager, ref, None, report=False)
        eager_nobias = partial(F.conv2d, x, w, None, *geo)
        run_variant(label, "eager no-bias", s, eager_nobias, None, base, report=False)
        run_variant(label, "triton auto", s, partial(conv.conv2d, x, w, b, *geo), ref, base)
        del ref
    print(f"-- pass 1 done at {elapsed():.0f}s", flush=True)

    # ---- pass 2: fused relu vs eager conv+bias then relu ----
    for s in shapes:
        if elapsed() > args.budget:
            print("-- budget spent: relu rows skipped")
            break
        label = label_of(s)
        x, w, b = make(s, dtype, seed=1)
        geo = (s["stride"], s["padding"], s["dilation"])
        ref = reference(x, w, b, s, relu=True)
        eager = partial(eager_relu, x, w, b, geo)
        base = run_variant(label, "eager conv+bias+relu", s, eager, ref, None, report=False)
        ours = partial(conv.conv2d, x, w, b, *geo, activation="relu")
        run_variant(label, "triton auto+relu", s, ours, ref, base)
        del ref
    print(f"-- pass 2 done at {elapsed():.0f}s", flush=True)

    # ---- pass 3: alternative paths ----
    if not args.quick:
        for s in shapes:
            if elapsed() > args.budget:
                print("-- budget spent: alternate paths skipped")
                break
            label = label_of(s)
            x, w, b = make(s, dtype)
            geo = (s["stride"], s["padding"], s["dilation"])
            ref = reference(x, w, b, s)
            base = RESULTS.get((label, "eager conv+bias"))
            for name, kw in alternates(s):
                ours = partial(conv.conv2d_forward, x, w, b, *geo, **kw)
                run_variant(label, name, s, ours, ref, base)
            del ref
        print(f"-- pass 3 done at {elapsed():.0f}s", flush=True)

    # ---- pass 4: NCHW inputs, and the weight-packing cost ----
    nchw_layers = [s for s in shapes if s["c"] >= 64 and s["r"] == 3][:2]
    for s in nchw_layers:
        if elapsed() > args.budget + 20:
            break
        label = label_of(s) + " NCHW"
        x, w, b = make(s, dtype, channels_last=False)
        geo = (s["stride"], s["padding"], s["dilation"])
        ref = reference(x, w, b, s)
        eager = partial(F.conv2d, x, w, b, *geo)
        base = run_variant(label, "eager conv+bias", s, eager, ref, None, report=False)
        packed = conv.pack_conv_weight(w)
        for mode in ("convert", "native"):
            ours = partial(conv.conv2d_forward, x, w, b, *geo, nchw=mode, packed_weight=packed)
            run_variant(label, f"triton {mode}", s, ours, ref, base)
        ours = partial(conv.conv2d_forward, x, w, b, *geo)
        run_variant(label, "triton auto (packs w)", s, ours, ref, base)
        del ref
    print("-- weight packing (NCHW weight -> channels_last), per call:")
    for s in shapes[:: max(1, len(shapes) // 6)]:
        _, w, _ = make(s, dtype, channels_last=False)
        ms = bench(partial(conv.pack_conv_weight, w))
        share = 100 * ms / RESULTS.get((label_of(s), "triton auto"), float("nan"))
        print(f"{label_of(s):<26} pack {ms * 1e3:7.1f} us  ({share:5.1f}% of the conv)")

    # ---- summary ----
    def geomean(values):
        values = [v for v in values if v and v == v]
        return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")

    def ratios(ours, theirs, pick=lambda s: True):
        out = []
        for s in shapes:
            lab = label_of(s)
            if pick(s) and (lab, ours) in RESULTS and (lab, theirs) in RESULTS:
                out.append(RESULTS[(lab, theirs)] / RESULTS[(lab, ours)])
        return out

    def unit(s):
        return s["r"] == s["s"] == 1

    print(f"geomean vs eager conv+bias: all {geomean(ratios('triton auto', 'eager conv+bias')):.3f}"
          f"  1x1 {geomean(ratios('triton auto', 'eager conv+bias', unit)):.3f}"
          f"  other {geomean(ratios('triton auto', 'eager conv+bias', lambda s: not unit(s))):.3f}"
          f"  | relu fused vs eager conv+bias+relu "
          f"{geomean(ratios('triton auto+relu', 'eager conv+bias+relu')):.3f}"
          f"  | total {elapsed():.0f}s")  # fmt: skip


if __name__ == "__main__":
    main()
