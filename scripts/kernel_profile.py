"""Where a step's GPU time goes, kernel by kernel: one op or block at one shape, in each mode as
the harness builds it (experiments.paired.implementations), read by torch.profiler (kineto) over
back-to-back steps. Per mode: the step's total kernel time, then each kernel in launch order with
its median time over the steps; a table side by side shows which of ours costs more than the
compiler's. docs/kernels/matmul.md, "The activation pass", was found this way.

    python scripts/kernel_profile.py --kernel mlp --shape 2048x4096x14336 --pass fwd_bwd
    python scripts/kernel_profile.py --kernel conv --shape 32x64x56x56-k64-3x3-p1 \
        --modes triton,eager

The shape is a label from the op's shape sets (conf/kernel/<op>.yaml, any set). Bad arguments or
no GPU: one line, exit 2."""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parent.parent))
from experiments import registry  # noqa: E402
from experiments.host_path import make_call  # noqa: E402
from experiments.paired import COMPILE_MODES, implementations  # noqa: E402
from experiments.resources import DTYPES, load_kernel_cfg  # noqa: E402
from experiments.workloads import resolve_shapes  # noqa: E402

BUILT = ("triton", "triton-compiled", *COMPILE_MODES)


def per_launch(events, steps: int) -> list[tuple[str, float]]:
    """(name, median us) of each launch position in a step, from `steps` steps' device events as
    (name, start, duration us) tuples, in any order. Events that do not split into equal steps
    (a step launched something the others did not) raise ValueError."""
    events = sorted(events, key=lambda e: e[1])
    if not events or len(events) % steps:
        raise ValueError(f"{len(events)} kernels over {steps} steps: the steps launch differently")
    per = len(events) // steps
    names = [events[i][0] for i in range(per)]
    for s in range(1, steps):
        got = [events[s * per + i][0] for i in range(per)]
        if got != names:
            raise ValueError(f"step {s} launched {got}, step 0 {names}")
    return [(names[i], statistics.median(events[s * per + i][2] for s in range(steps)))
            for i in range(per)]  # fmt: skip


def profile_step(call, steps: int) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            call()
        torch.cuda.synchronize()
    events = [(e.name, e.time_range.start, e.device_time) for e in prof.events()
              if e.device_type.name == "CUDA"]  # fmt: skip
    return per_launch(events, steps)


def side_by_side(tables: dict[str, list[tuple[str, float]]], width: int = 60) -> str:
    """Each mode's launches as columns of 'us name', one row per launch position."""
    names = list(tables)
    rows = max(len(t) for t in tables.values())
    heads = [f"{n}: {sum(us for _, us in tables[n]):.1f} us" for n in names]
    lines = ["  ".join(f"{h:<{width}}" for h in heads).rstrip()]
    for i in range(rows):
        cells = []
        for n in names:
            t = tables[n]
            cells.append(f"{t[i][1]:9.1f}  {t[i][0][: width - 11]:<{width - 11}}" if i < len(t)
                         else " " * width)  # fmt: skip
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="mlp", help="a registered op or block")
    parser.add_argument("--shape", default=None, help="a label from the op's shape sets")
    parser.add_argument("--pass", dest="pass_name", default="fwd_bwd")
    parser.add_argument("--modes", default="triton,default", help="eager and " + ", ".join(BUILT))
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    problem = None
    args.modes = [m for m in args.modes.split(",") if m]
    if args.kernel not in registry.OPS:
        problem = f"unknown kernel {args.kernel!r}; choose from {sorted(registry.OPS)}"
    elif [m for m in args.modes if m not in ("eager", *BUILT)]:
        problem = f"unknown mode(s) in {args.modes}; choose from eager, {', '.join(BUILT)}"
    elif args.dtype not in DTYPES:
        problem = f"unknown dtype {args.dtype!r}; choose one of {sorted(DTYPES)}"
    elif args.pass_name not in registry.OPS[args.kernel].passes:
        problem = (f"--pass {args.pass_name}: {args.kernel} runs "
                   f"{', '.join(registry.OPS[args.kernel].passes)}")  # fmt: skip
    elif args.steps < 2:
        problem = f"--steps {args.steps}: need at least 2"
    if problem is None:
        cfg = load_kernel_cfg(args.kernel, [])
        workload = registry.make_workload(cfg)
        labels = {}
        for set_name in cfg.shape_sets:
            for shape in resolve_shapes(workload, cfg, set_name, on_gpu=True)[1]:
                labels.setdefault(workload.label(shape), shape)
        args.shape = args.shape or next(iter(labels))
        if args.shape not in labels:
            problem = f"--shape {args.shape}: not in {args.kernel}'s shape sets"
        args.workload, args.parsed = workload, labels.get(args.shape)
    if problem is None and not torch.cuda.is_available():
        problem = "needs a CUDA GPU"
    if problem:
        print(f"kernel_profile: {problem}", file=sys.stderr)
        sys.exit(2)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    workload, shape = args.workload, args.parsed
    device, dtype = torch.device("cuda"), DTYPES[args.dtype]
    generator = torch.Generator(device=device).manual_seed(0)
    eager = workload.make_module(shape, registry.namespace("eager")).to(device=device, dtype=dtype)
    workload.init_parameters(eager, generator)
    built = implementations(eager, [m for m in args.modes if m != "eager"])
    modules = {m: eager if m == "eager" else built[m] for m in args.modes}
    inputs = workload.make_inputs(shape, dtype, device, generator)
    if args.pass_name == "fwd_bwd":
        inputs = tuple(t.requires_grad_() for t in inputs)
    tables = {m: profile_step(make_call(module, inputs, args.pass_name), args.steps)
              for m, module in modules.items()}  # fmt: skip
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}: {args.kernel} "
          f"{args.shape} {args.dtype} {args.pass_name}, median of {args.steps} steps, kernel us")
    print(side_by_side(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
