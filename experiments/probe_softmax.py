"""GPU probe for kernels.softmax: copy bandwidth, then each design/config against eager torch.

    python -m experiments.probe_softmax [--dtypes bf16,fp32] [--budget 85] [--compile]

Every variant is first checked against torch.softmax in float64 on the same input, then timed
with triton.testing.do_bench (which flushes L2 before each run). GB/s counts the minimum
traffic: forward reads x and writes y (2·M·N elements), backward reads y and dy and writes dx
(3·M·N). One table: shape, pass, variant, ms, GB/s, % of copy bandwidth, speedup over eager;
then the best variant per shape. Variants left when the time budget runs out print SKIPPED.
"""

import argparse
import sys
import time
import traceback

import torch
import triton
from triton.testing import do_bench

from experiments.correctness import TOLERANCES, relative_error
from kernels.softmax import Config, _backward, _forward, _pick_config, direct

# (M, N): every tensor holds 2^25 elements, 64 MB in bf16 (as conf/kernel/softmax.yaml `rows`)
ROWS = [(262144, 128), (65536, 512), (32768, 1024), (8192, 4096), (2048, 16384), (512, 65536),
        (128, 262144)]  # fmt: skip
DEVICE = "cuda"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


def forward_candidates(n: int) -> dict[str, Config]:
    """Named configs to try for rows of n columns (beside the default pick)."""
    if n <= 4096:

        def tile(elems, warps, per_sm=0, stages=1):
            return Config("tile", max(1, elems // n), n, warps, per_sm, stages)

        return {
            "tile8k_w8": tile(8192, 8),
            "tile16k_w8": tile(16384, 8),
            "tile16k_w16": tile(16384, 16),
            "tile8k_w8_persist": tile(8192, 8, -1, 1),
            "tile8k_w8_persist_s2": tile(8192, 8, -1, 2),
        }
    if n <= 16384:
        return {
            "tile_w8": Config("tile", 1, n, 8),
            "tile_w16": Config("tile", 1, n, 16),
            "tile_w16_persist": Config("tile", 1, n, 16, -1, 1),
            "coop4k_w4": Config("coop", 1, 4096, 4),
        }
    return {
        "coop4k_w4": Config("coop", 1, 4096, 4),
        "coop8k_w8": Config("coop", 1, 8192, 8),
        "coop16k_w16": Config("coop", 1, 16384, 16),
        "split2r_8k_w8": Config("split2r", 1, 8192, 8),
        "online4k_w8": Config("online", 1, 4096, 8),  # the previous long-row path
    }


def backward_candidates(n: int) -> dict[str, Config]:
    if n <= 4096:
        return {
            "tile4k_w4": Config("tile", max(1, 4096 // n), n, 4),
            "tile8k_w8_persist": Config("tile", max(1, 8192 // n), n, 8, -1, 1),
        }
    if n <= 16384:
        return {"tile_w8": Config("tile", 1, n, 8), "coop4k_w4": Config("coop", 1, 4096, 4)}
    return {"coop4k_w4": Config("coop", 1, 4096, 4), "split2r_8k_w8": Config("split2r", 1, 8192, 8)}


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> bool:
        return time.monotonic() < self.end


def bench(fn) -> float:
    return do_bench(fn, warmup=5, rep=25)


def copy_bandwidth() -> float:
    """GB/s of dst.copy_(src) on a 1 GB buffer, counting the read and the write."""
    src = torch.empty(
        2**30 if DEVICE == "cuda" else 2**20, device=DEVICE, dtype=torch.uint8
    ).random_()
    dst = torch.empty_like(src)
    return 2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e9


def run_shape(dtype_name, m, n, copy_gbs, budget, best, with_compile):
    """Check, time and print every variant of one shape, forward then backward."""
    dtype = DTYPES[dtype_name]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    x = torch.randn(m, n, device=DEVICE, dtype=dtype)
    y = torch.softmax(x, -1)
    dy = torch.randn_like(y)
    tol = TOLERANCES[dtype_name]

    fwd = {"eager": lambda: torch.softmax(x, -1)}
    if with_compile:
        compiled = torch.compile(lambda t: torch.softmax(t, -1), dynamic=False)
        fwd["compile_default"] = lambda: compiled(x)
    pick = _pick_config(n, m, False, False, x.device)
    fwd[f"default:{pick.design}"] = lambda: _forward(x, -1, direct, None)
    for name, cfg in forward_candidates(n).items():
        fwd[name] = lambda cfg=cfg: _forward(x, -1, direct, cfg)

    bwd = {"eager": lambda: torch.ops.aten._softmax_backward_data(dy, y, -1, dtype)}
    pick = _pick_config(n, m, False, True, x.device)
    bwd[f"default:{pick.design}"] = lambda: _backward(y, dy, -1, direct, None)
    for name, cfg in backward_candidates(n).items():
        bwd[name] = lambda cfg=cfg: _backward(y, dy, -1, direct, cfg)

    def fwd_reference():
        return torch.softmax(x.double(), -1)

    def bwd_reference():
        y64, dy64 = y.double(), dy.double()
        return y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))

    for pass_name, variants, reference_fn, nbytes in (
        ("fwd", fwd, fwd_reference, 2 * m * n * itemsize),
        ("bwd", bwd, bwd_reference, 3 * m * n * itemsize),
    ):
        reference = reference_fn()
        eager_ms = None
        for name, fn in variants.items():
            row = f"{dtype_name:5} {m:7d} {n:7d} {pass_name:4} {name:24}"
            if not budget.left():
                print(f"{row} SKIPPED (time budget)")
                continue
            try:
                err = relative_error(fn(), reference)
                if not err < tol:
                    raise AssertionError(f"relative error {err:.2e} >= {tol:.1e}")
                ms = bench(fn)
            except Exception as exc:  # one failing variant must not stop the probe
                msg = "".join(traceback.format_exception_only(exc)).strip().splitlines()
                print(f"{row} FAILED {msg[-1][:160] if msg else repr(exc)}")
                continue
            if name == "eager":
                eager_ms = ms
            gbs = nbytes / (ms * 1e-3) / 1e9
            ratio = f"{eager_ms / ms:7.2f}" if eager_ms else f"{'-':>7}"
            print(f"{row} {ms:8.4f} {gbs:6.0f} {100 * gbs / copy_gbs:5.1f}% {ratio}  err {err:.1e}")
            key = (dtype_name, n, pass_name)
            if name != "eager" and (key not in best or ms < best[key][1]):
                best[key] = (name, ms)
            sys.stdout.flush()
        del reference


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtypes", default="bf16,fp32")
    parser.add_argument("--budget", type=float, default=85.0, help="seconds for the whole probe")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--only", default="", help="comma list of N to run (default: all)")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter")
    args = parser.parse_args()
    if args.smoke:  # checks the probe itself, without a GPU (run with TRITON_INTERPRET=1)
        global DEVICE, ROWS, bench
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
    print(f"# copy bandwidth (read+write 1 GB): {copy_gbs:.0f} GB/s")
    header = f"{'dtype':5} {'M':>7} {'N':>7} {'pass':4} {'variant':24} {'ms':>8} {'GB/s':>6}"
    print(header + f" {'%copy':>6} {'x eager':>7}  note")

    best: dict[tuple, tuple[str, float]] = {}
    only = {int(v) for v in args.only.split(",") if v}
    for dtype_name in args.dtypes.split(","):
        for m, n in ROWS:
            if not only or n in only:
                run_shape(dtype_name, m, n, copy_gbs, budget, best, args.compile)
                if DEVICE == "cuda":
                    torch.cuda.empty_cache()

    print("# best Triton variant per shape (GB/s, % of copy)")
    for (dtype_name, n, pass_name), (name, ms) in best.items():
        m = dict((nn, mm) for mm, nn in ROWS)[n]
        itemsize = torch.empty(0, dtype=DTYPES[dtype_name]).element_size()
        nbytes = (2 if pass_name == "fwd" else 3) * m * n * itemsize
        gbs = nbytes / (ms * 1e-3) / 1e9
        print(f"#  {dtype_name} N={n:<7d} {pass_name}: {name:24} {gbs:6.0f} GB/s "
              f"{100 * gbs / copy_gbs:5.1f}%")  # fmt: skip
    print(f"# probe took {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
