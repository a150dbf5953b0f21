"""GPU probe for kernels.softmax: copy bandwidth, then each design/config against eager torch.

    python -m experiments.probe_softmax [--dtypes bf16,fp32] [--budget 85] [--rounds 3]

Every variant is first checked against torch.softmax in float64 on the same input, then timed
with triton.testing.do_bench (which flushes L2 before each run). The variants of a shape are
timed in turn, `--rounds` times over, and each keeps its fastest round: other work on the GPU
(round 1 shared it) then costs a round, not the answer. GB/s counts the minimum traffic:
forward reads x and writes y (2·M·N elements), backward reads y and dy and writes dx (3·M·N).
One table: shape, pass, variant, ms, GB/s, % of copy bandwidth, speedup over eager; then the
best variant per shape. Config names give the bytes of one input per program ("t32K_w8": a
32 KB tile, 8 warps; "c16K_w4": coop chunks of 16 KB). Variants left when the time budget runs
out print SKIPPED. `--smoke` checks the probe itself on the CPU interpreter.
"""

import argparse
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

from experiments.correctness import TOLERANCES, relative_error
from kernels.softmax import ONE_PASS_MAX_ELEMS, Config, _backward, _forward, _pick_config, direct

# (M, N): every tensor holds 2^25 elements, 64 MB in bf16 (as conf/kernel/softmax.yaml `rows`)
ROWS = [(262144, 128), (65536, 512), (32768, 1024), (8192, 4096), (2048, 16384), (512, 65536),
        (128, 262144)]  # fmt: skip
DEVICE = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def _tile(n: int, itemsize: int, kbytes: int, warps: int, per_sm: int = 0) -> Config:
    elems = min(max(kbytes * 1024 // itemsize, n), ONE_PASS_MAX_ELEMS)
    return Config("tile", max(1, elems // n), n, warps, per_sm)


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


def bench(fn) -> float:
    return do_bench(fn, warmup=5, rep=20)


def copy_bandwidth() -> float:
    """GB/s of dst.copy_(src) on a 1 GB buffer, counting the read and the write (best of 3)."""
    src = torch.empty(2**30 if DEVICE == "cuda" else 2**20, device=DEVICE, dtype=torch.uint8)
    src.random_()
    dst = torch.empty_like(src)
    ms = min(bench(lambda: dst.copy_(src)) for _ in range(3))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def _error_line(exc: Exception) -> str:
    msg = "".join(traceback.format_exception_only(exc)).strip().splitlines()
    return msg[-1][:160] if msg else repr(exc)


def run_shape(dtype_name, m, n, copy_gbs, budget, best, rounds):
    """Check, time and print every variant of one shape, forward then backward."""
    dtype = DTYPES[dtype_name]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    x = torch.randn(m, n, device=DEVICE, dtype=dtype)
    y = torch.softmax(x, -1)
    dy = torch.randn_like(y)
    tol = TOLERANCES[dtype_name]

    fwd = {"eager": lambda: torch.softmax(x, -1)}
    pick = _pick_config(n, m, False, False, x.device, itemsize)
    fwd["default"] = lambda: _forward(x, -1, direct, None)
    for name, cfg in forward_candidates(n, itemsize).items():
        fwd[name] = lambda cfg=cfg: _forward(x, -1, direct, cfg)
    bwd = {"eager": lambda: torch.ops.aten._softmax_backward_data(dy, y, -1, dtype)}
    bwd_pick = _pick_config(n, m, False, True, x.device, itemsize)
    bwd["default"] = lambda: _backward(y, dy, -1, direct, None)
    for name, cfg in backward_candidates(n, itemsize).items():
        bwd[name] = lambda cfg=cfg: _backward(y, dy, -1, direct, cfg)

    def fwd_reference():
        return torch.softmax(x.double(), -1)

    def bwd_reference():
        y64, dy64 = y.double(), dy.double()
        return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))

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
                err = relative_error(fn(), reference)
                if not err < tol:
                    raise AssertionError(f"relative error {err:.2e} >= {tol:.1e}")
                ok.append(name)
                errors[name] = err
            except Exception as exc:  # one failing variant must not stop the probe
                errors[name] = f"FAILED {_error_line(exc)}"
        del reference
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
            row = f"{dtype_name:5} {m:7d} {n:7d} {pass_name:4} {name:16}"
            if name not in times or isinstance(errors[name], str):
                print(f"{row} {errors[name]}")
                continue
            ms = times[name]
            gbs = nbytes / (ms * 1e-3) / 1e9
            ratio = f"{eager_ms / ms:7.2f}" if eager_ms else f"{'-':>7}"
            print(f"{row} {ms:8.4f} {gbs:6.0f} {100 * gbs / copy_gbs:5.1f}% {ratio}  "
                  f"err {errors[name]:.1e}")  # fmt: skip
            key = (dtype_name, n, pass_name)
            if name != "eager" and (key not in best or ms < best[key][1]):
                best[key] = (name, ms, gbs)
        sys.stdout.flush()


def main() -> int:
    global DEVICE, ROWS, bench
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--budget", type=float, default=85.0, help="seconds for the whole probe")
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (best one kept)")
    parser.add_argument("--only", default="", help="comma list of N to run (default: all)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = parser.parse_args()
    if args.smoke:  # checks the probe itself, without a GPU (run with TRITON_INTERPRET=1)
        DEVICE, ROWS = "cpu", [(5, 128), (3, 4096), (2, 20000)]
        bench = lambda fn: 1.0  # noqa: E731
    budget = Budget(args.budget)
    start = time.monotonic()
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"# {name} torch {torch.__version__} triton {triton.__version__}")
    copy_gbs = copy_bandwidth()
    print(f"# copy bandwidth (read+write 1 GB, best of 3): {copy_gbs:.0f} GB/s")
    header = f"{'dtype':5} {'M':>7} {'N':>7} {'pass':4} {'variant':16} {'ms':>8} {'GB/s':>6}"
    print(header + f" {'%copy':>6} {'x eager':>7}  note")

    best: dict[tuple, tuple[str, float, float]] = {}
    only = {int(v) for v in args.only.split(",") if v}
    for dtype_name in args.dtypes.split(","):
        for m, n in ROWS:
            if not only or n in only:
                run_shape(dtype_name, m, n, copy_gbs, budget, best, args.rounds)
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()

    print("# best Triton variant per shape (GB/s, % of copy)")
    for (dtype_name, n, pass_name), (name, _, gbs) in best.items():
        print(f"#  {dtype_name} N={n:<7d} {pass_name}: {name:16} {gbs:6.0f} GB/s "
              f"{100 * gbs / copy_gbs:5.1f}%")  # fmt: skip
    print(f"# copy bandwidth again at the end: {copy_bandwidth():.0f} GB/s")
    print(f"# probe took {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
