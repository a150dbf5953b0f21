"""Our kernel against torch.compile's modes, timed in one process, interleaved round by round.

    python -m experiments.paired --kernel softmax --shapes rows --only-n 128,4096 \
        --rounds 7 --dtypes bf16,fp32 [--jsonl FILE]
    python -m experiments.paired --kernel matmul --metric latency --rounds 5 [--jsonl FILE]

`make bench` times each mode in a job of its own, and the target "Triton at least 1.0x the best
compile mode" reads their ratio. Where both sides run at the copy's rate, separate jobs differ by
more than the kernels do (docs/kernels/softmax.md). This run asks whether such a gap is real:
for each shape it times our kernel and each compile mode ROUNDS times, every round on fresh
inputs (a new allocation) and in a rotated order, and prints per round the ratio best compile
mode / ours by GPU time (above 1: ours is faster), with its median and range.

Every implementation is checked against float64 before it is timed; the timer is the
benchmark's (experiments.timing.GpuTimer: median GPU time, L2 flushed, the CPU path off the
clock). --jsonl appends one record a shape, which `python -m analysis.targets RESULTS --paired
FILE` reads as the paired form of the "vs best compile mode" target.

--metric latency pairs call latency instead (experiments.timing.call_latency_us: back-to-back
calls, one sync): `--ours triton-compiled` (our kernels as custom ops, with the mode's Inductor
options; the default) or `triton` (called directly) against `--compile-modes` (default: compile
`default`), the ratio per round being the best compile mode's / ours, for `--pass fwd` or a
training step (`fwd_bwd`). A compiled call's latency moves by up to 2x from one process (or
compiled artifact) to the next while eager's holds (docs/kernels/host_path.md), so the latency
targets against the compiler ("triton-compiled no worse than default", a block's "call latency
at most the best compile mode's") are read here, in one process.
"""

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import torch
import triton
from omegaconf import OmegaConf

from experiments import modes, registry, timing
from experiments.correctness import TOLERANCES, allowed_error, relative_error, tolerance
from experiments.errors import ConfigError
from experiments.measure import grad_output, make_step, outputs_of, reference_outputs, refill
from experiments.workloads import kernel_config, resolve_shapes

MODES = ("default", "max-autotune-no-cudagraphs")
# --metric latency: ours (the first is the default), against any of the compile modes
LATENCY_OURS = ("triton-compiled", "triton")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
LATENCY_SAMPLE_MS = 20.0  # each latency sample's back-to-back calls last about this long
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
CONF = Path(__file__).resolve().parent.parent / "conf" / "kernel"
LEAD_US = 400.0


def implementations(eager_module, names) -> dict:
    """Each named mode (`triton`, `triton-compiled` or a compile mode) built from its conf/mode
    file by modes.build, as a job of that mode builds it, with the benchmark's compile config
    (dynamic=False, the mode's own Inductor options). Dynamo's caches are reset first: its
    recompile limit would otherwise run later shapes eagerly."""
    torch._dynamo.reset()
    compile_cfg = OmegaConf.load(CONF.parent / "compile" / "default.yaml")
    return {name: modes.build(OmegaConf.load(CONF.parent / "mode" / f"{name}.yaml"), compile_cfg,
                              eager_module, ()).module
            for name in names}  # fmt: skip


def ratios(times: dict[str, list[float]]) -> list[float]:
    """Per round: the best compile mode's time over ours, the first entry (above 1: ours is
    faster)."""
    ours, *others = times
    return [min(times[m][r] for m in others) / times[ours][r] for r in range(len(times[ours]))]


def latency_calls(call, device) -> int:
    """Back-to-back calls per latency sample: about LATENCY_SAMPLE_MS of them, 10 to 200."""
    estimate_us = timing.call_latency_us(call, device, 10, samples=1)["p50"]
    return int(min(200, max(10, LATENCY_SAMPLE_MS * 1e3 / max(estimate_us, 1.0))))


def run_shape(workload, shape, dtype_name: str, rounds: int, timer) -> tuple[str, dict | None]:
    """One shape's printed line and its record (None where a check failed): GPU time."""
    dtype, device = DTYPES[dtype_name], torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    eager = workload.make_module(shape, registry.namespace("eager")).to(device=device, dtype=dtype)
    workload.init_parameters(eager, generator)
    impls = implementations(eager, ("triton", *MODES))
    label = workload.label(shape)
    inputs = workload.make_inputs(shape, dtype, device, generator)
    reference = copy.deepcopy(eager).to(torch.float64)(*(t.to(torch.float64) for t in inputs))
    for name, impl in impls.items():  # correct before timed (this also compiles)
        err = relative_error(impl(*inputs), reference)
        if not err < TOLERANCES[dtype_name]:
            return f"{dtype_name:5} {label:>16}  {name} FAILED: relative error {err:.1e}", None
    del reference
    names = list(impls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        inputs = workload.make_inputs(shape, dtype, device, generator)  # a new allocation
        for name in names[r % len(names):] + names[: r % len(names)]:
            call = lambda impl=impls[name], inputs=inputs: impl(*inputs)  # noqa: E731
            times[name].append(timer.measure(call, warmup_ms=10, rep_ms=50, lead_us=LEAD_US)["p50"])
    ratio = ratios(times)
    record = {
        "kernel": workload.name, "pass": "fwd", "dtype": dtype_name, **shape,
        "shape_label": label, "rounds": rounds, "ratios": ratio,
        "median_ratio": statistics.median(ratio), "metric": "gpu_time",
        "time_ms_p50": {name: statistics.median(times[name]) for name in names},
    }  # fmt: skip
    medians = " ".join(f"{statistics.median(times[n]) * 1e3:9.2f}" for n in names)
    spread = f"{statistics.median(ratio):7.4f} {min(ratio):7.4f} {max(ratio):7.4f}"
    per_round = " ".join(f"{v:.4f}" for v in ratio)
    return f"{dtype_name:5} {label:>16} {medians} {spread}  {per_round}", record


def run_latency_shape(workload, shape, dtype_name: str, rounds: int, ours: str = "triton-compiled",
                      compile_modes=("default",), pass_name: str = "fwd",
                      device: torch.device | None = None) -> tuple[str, dict | None]:  # fmt: skip
    """--metric latency for one shape: its printed line and its record (None where a check
    failed). Every implementation is checked first as the benchmark checks a row (the output,
    and for fwd_bwd every gradient, against float64, within the dtype's budget or twice eager's
    own error); then per round the inputs get new values and each implementation's call latency
    (a training step for fwd_bwd) is taken in a rotated order. The GPU by default; on the CPU
    (tests: the interpreter, Inductor's CPU backend) the figures are no speed reading."""
    dtype, device = DTYPES[dtype_name], device or torch.device("cuda")
    fwd_bwd = pass_name == "fwd_bwd"
    generator = torch.Generator(device=device).manual_seed(0)
    eager = workload.make_module(shape, registry.namespace("eager")).to(device=device, dtype=dtype)
    workload.init_parameters(eager, generator)
    params = list(eager.parameters())
    inputs = workload.make_inputs(shape, dtype, device, generator)
    for t in (*params, *inputs):
        t.requires_grad_(fwd_bwd)
    grad_out = grad_output(eager, inputs, generator) if fwd_bwd else None
    label = workload.label(shape)
    impls = implementations(eager, (ours, *compile_modes))
    steps = {name: make_step(module, inputs, grad_out, [*inputs, *params], False)
             for name, module in impls.items()}  # fmt: skip
    want = reference_outputs(eager, inputs, grad_out, fwd_bwd)
    baseline = outputs_of(make_step(eager, inputs, grad_out, [*inputs, *params], False), inputs,
                          params, fwd_bwd)  # fmt: skip
    eager_error = max(relative_error(b, w) for b, w in zip(baseline, want, strict=True))
    limit = allowed_error(tolerance(dtype_name, tf32=False), eager_error)
    for name, step in steps.items():  # correct before timed (this also compiles)
        got = outputs_of(step, inputs, params, fwd_bwd)
        err = max(relative_error(g, w) for g, w in zip(got, want, strict=True))
        if not err <= limit:
            return f"{dtype_name:5} {label:>16}  {name} FAILED: relative error {err:.1e}", None
    del want, baseline
    names = list(steps)
    times: dict[str, list[float]] = {name: [] for name in names}
    calls = {}
    for r in range(rounds):
        refill([*inputs, *params] + ([grad_out] if fwd_bwd else []), generator)
        for name in names[r % len(names):] + names[: r % len(names)]:
            step = steps[name]
            calls.setdefault(name, latency_calls(step, device))
            for _ in range(3):
                step()
            times[name].append(timing.call_latency_us(step, device, calls[name])["p50"])
    ratio = ratios(times)
    record = {
        "kernel": workload.name, "pass": pass_name, "dtype": dtype_name, **shape,
        "shape_label": label, "rounds": rounds, "ratios": ratio,
        "median_ratio": statistics.median(ratio), "metric": "call_latency", "ours": ours,
        "compile_modes": list(compile_modes),
        "latency_us_p50": {name: statistics.median(times[name]) for name in names},
        "calls_per_sample": calls,
    }  # fmt: skip
    medians = " ".join(f"{statistics.median(times[n]):9.2f}" for n in names)
    spread = f"{statistics.median(ratio):7.4f} {min(ratio):7.4f} {max(ratio):7.4f}"
    per_round = " ".join(f"{v:.4f}" for v in ratio)
    return f"{dtype_name:5} {label:>16} {medians} {spread}  {per_round}", record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", required=True, choices=sorted(registry.OPS))
    parser.add_argument("--shapes", default="default", help="a shape set of conf/kernel/<op>.yaml")
    parser.add_argument("--only-n", default="", help="keep the shapes whose n is listed (a,b,c)")
    parser.add_argument("--rounds", type=int, default=7, help="fresh inputs a shape")
    parser.add_argument("--dtypes", default="bf16")
    parser.add_argument("--jsonl", type=Path, default=None, help="append each shape's record here")
    parser.add_argument("--metric", choices=("gpu", "latency"), default="gpu",
                        help="gpu: our kernel's GPU time against both compile modes'; latency: "
                        "call latency of --ours against the --compile-modes'")
    parser.add_argument("--ours", choices=LATENCY_OURS, default=LATENCY_OURS[0],
                        help="--metric latency: our kernels as custom ops compiled "
                        "(triton-compiled) or called directly (triton)")
    parser.add_argument("--compile-modes", default="default",
                        help="--metric latency: the torch.compile modes (a,b), the best per round")
    parser.add_argument("--pass", dest="pass_name", choices=("fwd", "fwd_bwd"), default="fwd",
                        help="--metric latency: the forward, or a training step")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    compile_modes = args.compile_modes.split(",")
    if args.metric == "gpu" and (args.ours != LATENCY_OURS[0] or args.pass_name != "fwd"
                                 or compile_modes != ["default"]):  # fmt: skip
        parser.error("--ours, --pass and --compile-modes go with --metric latency")
    if bad := [m for m in compile_modes if m not in COMPILE_MODES]:
        parser.error(f"--compile-modes: unknown {', '.join(bad)}; choose from "
                     f"{', '.join(COMPILE_MODES)}")  # fmt: skip
    if args.pass_name not in registry.OPS[args.kernel].passes:
        parser.error(f"--pass {args.pass_name}: {args.kernel} has no such pass")
    dtypes = args.dtypes.split(",")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        parser.error(f"--dtypes: unknown {', '.join(unknown)}; choose from {', '.join(DTYPES)}")
    kernel_cfg = kernel_config(args.kernel)
    workload = registry.make_workload(kernel_cfg)
    try:
        _, shapes = resolve_shapes(workload, kernel_cfg, args.shapes, on_gpu=True)
        only = {int(v) for v in args.only_n.split(",") if v}
    except (ConfigError, ValueError) as exc:
        parser.error(str(exc))
    shapes = [s for s in shapes if not only or s.get("n") in only]
    if not shapes:
        parser.error(f"--only-n {args.only_n} leaves no shape of the set {args.shapes!r}")
    if not torch.cuda.is_available():
        print("error: no CUDA device: the paired run times on a GPU", file=sys.stderr)
        return 1
    from experiments.timing import GpuTimer

    # fp32 as the benchmark's fp32 runs it, TF32 off (torch lets cuDNN convs use it by default)
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    timer = GpuTimer(torch.device("cuda"), flush_l2=True)
    gpu_name = torch.cuda.get_device_name()
    latency = args.metric == "latency"
    what = f"call latency, {args.pass_name}" if latency else "GPU time"
    print(f"# {gpu_name} torch {torch.__version__}: {what}, {args.rounds} rounds a shape, fresh "
          "inputs each, order rotated; us: medians over rounds; ratio: compile / ours, per round")
    names = (args.ours, *compile_modes) if latency else ("triton", "default", "mac-nocg")
    print(f"{'dtype':5} {'shape':>16} " + " ".join(f"{n[:9]:>9}" for n in names)
          + f" {'ratio':>7} {'min':>7} {'max':>7}  per round")  # fmt: skip
    failed = False
    for dtype_name in dtypes:
        for shape in shapes:
            if latency:
                line, record = run_latency_shape(workload, shape, dtype_name, args.rounds,
                                                 args.ours, compile_modes, args.pass_name)
            else:
                line, record = run_shape(workload, shape, dtype_name, args.rounds, timer)
            print(line, flush=True)
            failed |= record is None
            if record is not None and args.jsonl is not None:
                record.update(gpu_name=gpu_name, torch=torch.__version__,
                              triton=triton.__version__)  # fmt: skip
                with args.jsonl.open("a") as out:
                    out.write(json.dumps(record) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
