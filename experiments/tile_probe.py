"""Forced-tile probe: every tuning config of a conv design alone, on each layer of a shape set,
against cuDNN and a copy of the same bytes, to see what the autotuner could pick and what it
leaves on the table.

    python -m experiments.tile_probe depthwise [--shapes mobilenet_v2_dw,convnext_dw]
    python -m experiments.tile_probe implicit [--shapes resnet50] [--splits 1,2,3,4]
        [--tile 128,128,64,3,4 ...] [--dtype bf16]
    python -m experiments.tile_probe gemm [--shapes resnet50] [--tile 128,128,64,3,4,2 ...]

`depthwise`: the sliding-window stencil's SLIDING_TILES (stride-1 layers; the tap tiles serve
the others) plus any --tile rows,cols,warps. `implicit`: the implicit GEMM's IMPLICIT_TILES of
64 or more channels, each at every split of --splits, on the layers with a filter wider than
1x1 and at least 16 channels (the designs the dispatch may give them are its business: this
times the implicit kernel whatever the plan), plus any --tile BM,BN,BK,stages,warps. `gemm`: the
persistent 1x1 GEMM's GEMM_PERSISTENT_TILES on the stride-1 1x1 layers, plus any --tile
BM,BN,BK,stages,warps,programs-per-SM.

Each forced config replaces the autotuner's list, so the launch compiles and runs that config
only; its output is checked against torch's conv of the same dtype before it is timed. Times are
in µs, bias-free, channels_last: by default the GPU time of one call after an L2 flush, the
median of 3 x 30 calls (kernels._timing.gpu_ms_flushed: the harness's timer and the autotuner's);
with --warm-l2, per call over 50 back-to-back calls, median of 5 (inputs left in L2). "autotuned"
is the public kernels.conv2d on the same inputs. A
config that fails to compile or run is listed with its error and the probe goes on. On a machine
without a GPU the kernels run in the Triton interpreter and no time is taken (correctness only,
"-" in the tables). docs/kernels/conv.md quotes its tables.
"""

import argparse
import math
import statistics
import sys
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
import triton

import kernels
from experiments.measure import same_bytes_buffers
from experiments.registry import make_workload
from experiments.resources import load_kernel_cfg
from experiments.workloads import resolve_shapes
from kernels._timing import gpu_ms_flushed, gpu_ms_per_call
from kernels.conv import depthwise, dispatch, gemm, implicit_gemm
from kernels.conv.common import config as conv_config

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 1e-2}


# How gpu_us times: "flushed" (the harness's and the autotuner's timer: each call after an L2
# flush) or "warm" (back-to-back calls, inputs left in L2; --warm-l2)
TIMER = {"l2": "flushed"}


def gpu_us(fn) -> float:
    """GPU µs per call of fn (median; see TIMER); NaN off the GPU (the interpreter: checked, not
    timed)."""
    if not torch.cuda.is_available():
        fn()
        return math.nan
    fn()
    torch.cuda.synchronize()
    if TIMER["l2"] == "warm":
        return 1000 * statistics.median(gpu_ms_per_call(fn, 50) for _ in range(5))
    return 1000 * statistics.median(gpu_ms_flushed(fn, 30) for _ in range(3))


def copy_us(nbytes: int, device) -> float:
    """The harness's same-bytes copy (reads nbytes / 2, writes as many): the layer's own-size
    roofline."""
    src, dst = same_bytes_buffers(nbytes, device)
    return gpu_us(partial(dst.copy_, src))


@contextmanager
def forced(kernel, config):
    """The autotuned `kernel` with `config` as its only candidate (and no tuned choice cached)."""
    saved, saved_cache = kernel.configs, getattr(kernel, "cache", {})
    kernel.configs, kernel.cache = [config], {}
    try:
        yield
    finally:
        kernel.configs, kernel.cache = saved, saved_cache


def timed_config(kernel, config, build, ref, dtype):
    """GPU µs of one launch of `kernel` under `config` alone (NaN off the GPU), after checking
    its output against ref; or the error, as one line, where it fails. build() returns (step,
    tensors, y): a kernels._launch.Step, its tensors and the output it writes."""
    try:
        with forced(kernel, config):
            step, tensors, y = build()
            # the caching allocator may hand y the memory of an earlier config's correct output:
            # a launch that skipped some tiles would then pass the check
            y.fill_(math.nan if y.is_floating_point() else 0)
            step.once(*tensors)
            _check(y, ref, dtype)
            return gpu_us(partial(step, *tensors))
    except Exception as exc:  # noqa: BLE001 - a config that fails is a row, not the end
        return f"{type(exc).__name__}: {exc}"[:160]


# Each design's launch as timed_config's build: (Step, its tensors, the output it writes)
def _depthwise_build(x, weight, pad, y):
    step = depthwise.depthwise_step(x, weight, None, y, (1, 1), (pad, pad), (1, 1), 0)
    return step, (x, weight, None, y), y


def _implicit_build(x, weight, geometry, tma, split):
    conv = dispatch.prepare(x, weight, None, *geometry)
    step, scratch = implicit_gemm.implicit_step(conv, tma=tma, split_k=split)
    return step, (x, conv.w2d, None, conv.y, *scratch(x.device)), conv.y


def _gemm_build(x, weight, tma):
    conv = dispatch.prepare(x, weight)
    step, _ = gemm.gemm_persistent_step(conv, tma=tma)
    return step, (x, conv.w2d, None, conv.y), conv.y


def layers(shape_sets: list[str]) -> list[dict]:
    """The conf shape sets' layers as the harness parses them (defaults filled in, checked),
    each once."""
    cfg = load_kernel_cfg("conv", [])
    workload = make_workload(cfg)
    out = []
    for name in shape_sets:
        for shape in resolve_shapes(workload, cfg, name, on_gpu=True)[1]:
            if shape not in out:
                out.append(shape)
    return out


def inputs(shape, dtype, device, generator):
    n, c, h, w, k, r, s, g = (shape[key] for key in ("n", "c", "h", "w", "k", "r", "s", "groups"))
    cl = torch.channels_last
    x = torch.randn(n, c, h, w, generator=generator, dtype=torch.float32)
    weight = torch.randn(k, c // g, r, s, generator=generator) / (r * s * c / g) ** 0.5
    return (x.to(device, dtype).contiguous(memory_format=cl),
            weight.to(device, dtype).contiguous(memory_format=cl))  # fmt: skip


def label(shape) -> str:
    n, c, h, w, k, r, s = (shape[key] for key in ("n", "c", "h", "w", "k", "r", "s"))
    base = f"{n}x{c}x{h}x{w}-k{k}-{r}x{s}"
    return base + (f"-s{shape['stride']}" if shape["stride"] != 1 else "")


def _check(y, ref, dtype) -> None:
    torch.testing.assert_close(y.float(), ref.float(), rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def _fmt(us: float) -> str:
    return "-" if math.isnan(us) else f"{us:.1f}"


def probe_depthwise(shapes, dtype, device, extra_tiles=(), out=print) -> list[dict]:
    kernel = depthwise.conv_depthwise_sliding_kernel
    tiles = [(c.kwargs["BLOCK_P"], c.kwargs["BLOCK_Q"], c.num_warps) for c in kernel.configs]
    tiles += [t for t in extra_tiles if t not in tiles]
    generator = torch.Generator().manual_seed(0)
    rows = []
    out("layer | same-bytes copy | cuDNN | autotuned | best forced (rows, cols, warps) | all")
    for shape in shapes:
        if shape["groups"] != shape["c"] or shape["stride"] != 1 or shape["dilation"] != 1:
            continue
        x, weight = inputs(shape, dtype, device, generator)
        pad = shape["padding"]
        ref = F.conv2d(x, weight, None, 1, pad, 1, shape["c"])
        call = (x, weight, None, 1, pad, 1, shape["c"])
        nbytes = (x.numel() + ref.numel()) * x.element_size()
        row = {"layer": label(shape), "copy": copy_us(nbytes, device),
               "cudnn": gpu_us(partial(F.conv2d, *call)),
               "autotuned": gpu_us(partial(kernels.conv2d, *call)), "tiles": {}}  # fmt: skip
        for rows_, cols, warps in tiles:
            config = triton.Config({"BLOCK_P": rows_, "BLOCK_Q": cols, "BLOCK_C": 32 * warps},
                                   num_warps=warps, num_stages=1)  # fmt: skip
            build = partial(_depthwise_build, x, weight, pad, torch.empty_like(ref))
            row["tiles"][(rows_, cols, warps)] = timed_config(kernel, config, build, ref, dtype)
        rows.append(row)
        out(_line(row))
    return rows


def probe_implicit(shapes, dtype, device, splits=(1, 2), extra_tiles=(), out=print) -> list[dict]:
    kernel = implicit_gemm.conv_implicit_kernel
    tiles = [t for t in implicit_gemm.IMPLICIT_TILES if t[1] >= 64] + list(extra_tiles)
    if not torch.cuda.is_available():  # the interpreter: one tile of its size, unsplit
        tiles, splits = [(32, 32, 16, 1, 4)], (1,)
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (9, 0)
    generator = torch.Generator().manual_seed(0)
    rows = []
    out("layer | cuDNN | autotuned (plan) | best forced (BM, BN, BK, stages, warps, split) | top 6")
    for shape in shapes:
        if shape["groups"] != 1 or shape["r"] * shape["s"] == 1 or shape["c"] < 16:
            continue
        x, weight = inputs(shape, dtype, device, generator)
        geometry = (shape["stride"], shape["padding"], shape["dilation"])
        ref = F.conv2d(x, weight, None, *geometry)
        plan = dispatch.plan(dispatch.prepare(x, weight, None, *geometry))
        call = (x, weight, None, *geometry)
        row = {"layer": label(shape), "cudnn": gpu_us(partial(F.conv2d, *call)),
               "autotuned": gpu_us(partial(kernels.conv2d, *call)),
               "plan": f"{plan.design} split {plan.split_k}", "tiles": {}}  # fmt: skip
        steps = shape["r"] * shape["s"]
        for tile in tiles:
            for split in splits:
                if split > 1 and steps * math.ceil(shape["c"] / tile[2]) // split < 6:
                    continue  # a split of under 6 steps: nothing left to pipeline
                build = partial(_implicit_build, x, weight, geometry, hopper, split)
                row["tiles"][(*tile, split)] = timed_config(kernel, conv_config(*tile), build,
                                                            ref, dtype)  # fmt: skip
        rows.append(row)
        out(_line(row, top=6))
    return rows


def probe_gemm(shapes, dtype, device, extra_tiles=(), out=print) -> list[dict]:
    kernel = gemm.conv_gemm_persistent_kernel
    tiles = list(gemm.GEMM_PERSISTENT_TILES) + list(extra_tiles)
    if not torch.cuda.is_available():  # the interpreter: one tile of its size
        tiles = [(32, 32, 16, 1, 4, 1)]
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (9, 0)
    generator = torch.Generator().manual_seed(0)
    rows = []
    out("layer | cuDNN | autotuned (plan) | best forced (BM, BN, BK, stages, warps, per SM) | top")
    for shape in shapes:
        if shape["groups"] != 1 or shape["r"] * shape["s"] != 1 or shape["stride"] != 1:
            continue
        x, weight = inputs(shape, dtype, device, generator)
        ref = F.conv2d(x, weight)
        plan = dispatch.plan(dispatch.prepare(x, weight))
        row = {"layer": label(shape), "cudnn": gpu_us(partial(F.conv2d, x, weight)),
               "autotuned": gpu_us(partial(kernels.conv2d, x, weight)),
               "plan": plan.design, "tiles": {}}  # fmt: skip
        for tile in tiles:
            build = partial(_gemm_build, x, weight, hopper)
            row["tiles"][tuple(tile)] = timed_config(kernel, gemm.persistent_config(tile), build,
                                                     ref, dtype)  # fmt: skip
        rows.append(row)
        out(_line(row, top=6))
    return rows


def _line(row: dict, top: int | None = None) -> str:
    timed = sorted((us, key) for key, us in row["tiles"].items() if isinstance(us, float))
    failed = [f"{key}: {err}" for key, err in row["tiles"].items() if isinstance(err, str)]
    best = f"{_fmt(timed[0][0])} {timed[0][1]}" if timed else "-"
    shown = timed[:top] if top else sorted(timed, key=lambda pair: pair[1])
    listing = " ".join(f"{','.join(map(str, key))}:{_fmt(us)}" for us, key in shown)
    head = [row["layer"]] + ([_fmt(row["copy"])] if "copy" in row else [])
    autotuned = _fmt(row["autotuned"]) + (f" ({row['plan']})" if "plan" in row else "")
    line = " | ".join([*head, _fmt(row["cudnn"]), autotuned, best, listing])
    return "\n".join([line, *(f"  failed {item}" for item in failed)])


def _tile(text: str, size: int) -> tuple[int, ...]:
    parts = tuple(int(part) for part in text.split(","))
    if len(parts) != size:
        raise argparse.ArgumentTypeError(f"--tile {text!r}: expected {size} comma-separated ints")
    return parts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("design", choices=["depthwise", "implicit", "gemm"])
    parser.add_argument("--shapes", help="comma-separated conv shape sets (conf/kernel/conv.yaml)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--warm-l2", action="store_true",
                        help="time back-to-back calls (inputs stay in L2), not flushed ones")
    parser.add_argument("--splits", default="1,2,3,4", help="implicit: reduction splits to try")
    parser.add_argument("--tile", action="append", default=[],
                        help="an extra tile: rows,cols,warps (depthwise) or BM,BN,BK,stages,"
                             "warps (implicit)")  # fmt: skip
    args = parser.parse_args(argv)
    default = "mobilenet_v2_dw,convnext_dw" if args.design == "depthwise" else "resnet50"
    try:
        shapes = layers((args.shapes or default).split(","))
        size = {"depthwise": 3, "implicit": 5, "gemm": 6}[args.design]
        extra = [_tile(text, size) for text in args.tile]
        splits = tuple(int(part) for part in args.splits.split(","))
    except (ValueError, argparse.ArgumentTypeError) as exc:
        print(f"tile_probe: {exc}", file=sys.stderr)
        return 2
    TIMER["l2"] = "warm" if args.warm_l2 else "flushed"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (interpreter)"
    print(f"{name}; torch {torch.__version__}; {args.dtype}; µs, {TIMER['l2']} L2")
    if args.design == "depthwise":
        probe_depthwise(shapes, DTYPES[args.dtype], device, extra)
    elif args.design == "implicit":
        probe_implicit(shapes, DTYPES[args.dtype], device, splits, extra)
    else:
        probe_gemm(shapes, DTYPES[args.dtype], device, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
