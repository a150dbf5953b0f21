"""Where a compiled call's latency comes from (docs/kernels/host_path.md, "Softmax's paired gap is
host time on both sides"): for one op and shape, eager, `triton`, `triton-compiled` and compile
`default`, each as the harness builds it (experiments.paired.implementations), read three ways:

    gpu us      kineto's kernel time per call (the GPU alone)
    b2b us      wall time per call over back-to-back calls, one sync (what call latency reads)
    host us     the host's time per call while a sleep kernel holds the GPU, so the host never
                waits: the call's own cost before its kernels run; ROUNDS rounds, alternating

A call whose b2b is near its host time, well above its GPU time, is host-bound.

    python scripts/compiled_host_cost.py [--kernel softmax] [--shape 2048x16384] [--rounds 5]

The shape is a label from the op's default shape set (conf/kernel/<op>.yaml). Bad arguments or
no GPU: one line, exit 2."""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.append(str(Path(__file__).resolve().parent.parent))
from experiments import registry  # noqa: E402
from experiments.host_path import wall_us  # noqa: E402
from experiments.paired import implementations  # noqa: E402
from experiments.workloads import kernel_config, resolve_shapes  # noqa: E402

CALLS = 100
MODES = ("triton", "triton-compiled", "default")


def gpu_us(call) -> float:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            call()
        torch.cuda.synchronize()
    events = prof.key_averages()
    return sum(e.device_time_total for e in events if e.device_type.name == "CUDA") / CALLS


def host_us(call) -> float:
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # ~0.2 s of GPU work ahead of the calls
    start = time.perf_counter()
    for _ in range(CALLS):
        call()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / CALLS * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="softmax", choices=("matmul", "linear", "softmax",
                                                                 "conv"))  # fmt: skip
    parser.add_argument("--shape", default="2048x16384", help="a label of the default set")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    cfg = kernel_config(args.kernel)
    workload = registry.make_workload(cfg)
    _, shapes = resolve_shapes(workload, cfg, "default", on_gpu=True)
    labels = {workload.label(s): s for s in shapes}
    if args.shape not in labels:
        parser.error(f"--shape {args.shape}: not in {args.kernel}'s default set "
                     f"({', '.join(labels)})")  # fmt: skip
    if not torch.cuda.is_available():
        print("compiled_host_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    shape, device = labels[args.shape], torch.device("cuda")
    generator = torch.Generator(device=device).manual_seed(0)
    eager = workload.make_module(shape, registry.namespace("eager"))
    eager = eager.to(device=device, dtype=torch.bfloat16)
    workload.init_parameters(eager, generator)
    inputs = workload.make_inputs(shape, torch.bfloat16, device, generator)
    modules = {"eager": eager, **implementations(eager, MODES)}
    calls = {name: (lambda m=m: m(*inputs)) for name, m in modules.items()}
    for call in calls.values():
        for _ in range(20):
            call()
    host = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, call in calls.items():
            host[name].append(host_us(call))
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__}: {args.kernel} "
          f"{args.shape} bf16, {CALLS} calls a reading")  # fmt: skip
    print(f"{'mode':16} {'gpu us':>8} {'b2b us':>8} {'host us':>8}  host per round")
    for name, call in calls.items():
        rounds = " ".join(f"{v:.1f}" for v in host[name])
        print(f"{name:16} {gpu_us(call):8.1f} {wall_us(call, CALLS):8.1f} "
              f"{statistics.median(host[name]):8.1f}  {rounds}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
