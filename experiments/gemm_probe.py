"""Forced (tile, K split) probe of the Hopper TMA GEMM on the GEMMs the models call, against
cuBLAS: what kernels.matmul.tma.split_plan could pick on each, and what it leaves.

    python -m experiments.gemm_probe [--shapes convnext_tiny,vit_b_16,llama]
        [--splits 1,2,3,4,6,8] [--gemm M,N,K ...] [--csv out.csv]

Each linear shape {m, n, k} of the recorded sets (conf/kernel/recorded/linear.yaml) is the three
GEMMs of a training step, each in the layouts the linear's forward and backward pass:
    fwd    x (m, k) @ W^T            (M, N, K) = (m, n, k), B column-major
    dgrad  dY (m, n) @ W             (m, k, n), both row-major
    wgrad  dY^T (n, m) @ x (m, k)    (n, k, m), A column-major
--conv adds the 1x1 stride-1 layers of conv shape sets as the same three GEMMs of (m, n, k) =
(N·H·W, K, C) (the conv's dgrad of such a layer is this dgrad GEMM, kernels/conv/backward.py).
--gemm adds row-major (M, K) @ (K, N) GEMMs. Per GEMM: cuBLAS (torch.mm on the same operands),
the public matmul as dispatched (its plan's tile and split), then each of the host-descriptor
kernel's WAVE_TILES at each split of --splits that keeps SPLIT_MIN_STEPS K steps a slice,
launched directly (host_desc_step) after a check against torch. Times are GPU µs, one call after
an L2 flush, median of 3 x 30 (experiments.tile_probe.gpu_us). M <= SKINNY_M rows take other
tiles (heuristic_tile) and are not probed. Off a GPU it only checks the kernels in the
interpreter (under pretend_gpu), untimed, on --gemm shapes alone.
"""

import argparse
import csv
import math
import sys
from functools import partial

import torch

import kernels
from experiments.tile_probe import _fmt, gpu_us
from experiments.workloads import kernel_config
from kernels._common import ACTIVATIONS, next_power_of_2, pretend_gpu, tile_counters
from kernels.matmul import dispatch, tma
from kernels.matmul.pointer import SKINNY_M

TOLERANCE = 3e-2  # bf16 over K up to a few thousand, against torch's own bf16 GEMM


def gemms(shape_sets: list[str], extra: list[tuple[int, int, int]],
          conv_sets: list[str] = ()) -> list[tuple]:  # fmt: skip
    """(label, role, M, N, K, A column-major?, B column-major?) of each GEMM, each once."""
    out = [(f"{m}x{n}x{k}", "mm", m, n, k, False, False) for m, n, k in extra]
    linear = kernel_config("linear").shape_sets
    conv = kernel_config("conv").shape_sets
    named = []
    for name in shape_sets:
        if name not in linear:
            raise ValueError(f"unknown linear shape set {name!r}; choose from {sorted(linear)}")
        named += [(name, s["m"], s["n"], s["k"]) for s in linear[name]]
    for name in conv_sets:  # a 1x1 stride-1 conv is x (N·H·W, C) @ w (K, C)^T
        if name not in conv:
            raise ValueError(f"unknown conv shape set {name!r}; choose from {sorted(conv)}")
        named += [(f"conv-{name}", s["n"] * s["h"] * s["w"], s["k"], s["c"]) for s in conv[name]
                  if s["r"] == s["s"] == 1 and s.get("stride", 1) == 1
                  and s.get("groups", 1) == 1]  # fmt: skip
    for name, m, n, k in named:
        label = f"{name}:{m}x{n}x{k}"
        for role, size, a_col, b_col in (("fwd", (m, n, k), False, True),
                                         ("dgrad", (m, k, n), False, False),
                                         ("wgrad", (n, k, m), True, False)):  # fmt: skip
            if not any(g[2:] == (*size, a_col, b_col) for g in out):
                out.append((label, role, *size, a_col, b_col))
    return out


def operands(M, N, K, a_col, b_col, device, generator):
    def randn(rows, cols, col_major):
        if col_major:
            return torch.randn(cols, rows, generator=generator).t()
        return torch.randn(rows, cols, generator=generator)

    a, b = randn(M, K, a_col), randn(K, N, b_col)
    to = dict(device=device, dtype=torch.bfloat16)
    a = (a.t().to(**to).t() if a_col else a.to(**to)) / K**0.25
    b = (b.t().to(**to).t() if b_col else b.to(**to)) / K**0.25
    return a, b


def forced(a, b, tile, split, sms):
    """A function launching the host-descriptor kernel on (a, b) at `tile` split `split`, and
    its output."""
    M, K = a.shape
    N = b.shape[1]
    c = torch.full((M, N), math.nan, device=a.device, dtype=a.dtype)
    common = dispatch.launch_constexprs(a.dtype, False, ACTIVATIONS["none"], False)
    step = tma.host_desc_step(a, b, c, None, None, tile, common, sms, split)
    numel, counters = tma.split_k_scratch(M, N, K, tile, split, sms)
    scratch = ()
    if split != 1:
        scratch = (torch.empty(numel, device=a.device, dtype=torch.float32),
                   tile_counters(a.device, counters))  # fmt: skip
    return partial(step, a, b, c, None, None, *scratch), c


def probe(items, splits, device, sms, out=print, done=lambda row: None) -> list[dict]:
    """Each GEMM's row (see the module docstring), printed by `out` and passed to `done` as it
    is measured."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    out("GEMM | role | M N K | cuBLAS | ours as dispatched (tile/split) | best forced | all "
        "(BMxBN/split: µs, x cuBLAS)")
    for label, role, M, N, K, a_col, b_col in items:
        if M <= SKINNY_M:
            continue
        a, b = operands(M, N, K, a_col, b_col, device, generator)
        ref = torch.mm(a, b)
        p = dispatch.plan(a, b)
        plan = f"{p.tile.block_m}x{p.tile.block_n}/{p.split_k or 'sk'}" if p.tile else p.kernel
        row = {"gemm": label, "role": role, "M": M, "N": N, "K": K,
               "cublas": gpu_us(partial(torch.mm, a, b)),
               "plan": plan,
               "dispatched": gpu_us(partial(kernels.matmul, a, b)), "forced": {}}  # fmt: skip
        for tile in tma.WAVE_TILES if p.kernel == "tma_host_desc" else ():
            if tile.block_n > max(64, next_power_of_2(N)):  # as split_plan prunes
                continue
            for split in (*splits, tma.STREAM_K):
                if split > 1 and math.ceil(K / tile.block_k) < split * tma.SPLIT_MIN_STEPS:
                    continue
                key = f"{tile.block_m}x{tile.block_n}/{split or 'sk'}"
                try:
                    launch, c = forced(a, b, tile, split, sms)
                    launch()
                    torch.testing.assert_close(c.float(), ref.float(), rtol=TOLERANCE,
                                               atol=TOLERANCE)  # fmt: skip
                    row["forced"][key] = gpu_us(launch)
                except Exception as exc:  # noqa: BLE001 - a failed config is a row, not the end
                    row["forced"][key] = f"{type(exc).__name__}: {exc}"[:160]
        rows.append(row)
        out(_line(row))
        done(row)
    return rows


def _line(row) -> str:
    timed = sorted((us, key) for key, us in row["forced"].items() if isinstance(us, float))
    failed = [f"  failed {key}: {err}" for key, err in row["forced"].items()
              if isinstance(err, str)]  # fmt: skip
    base = row["cublas"]
    ratio = (lambda us: f"{base / us:.2f}") if not math.isnan(base) else (lambda us: "-")
    best = f"{_fmt(timed[0][0])} {timed[0][1]} ({ratio(timed[0][0])})" if timed else "-"
    listing = " ".join(f"{key}:{_fmt(us)}" for us, key in sorted(timed, key=lambda t: t[1]))
    line = " | ".join([row["gemm"], row["role"], f"{row['M']} {row['N']} {row['K']}", _fmt(base),
                       f"{_fmt(row['dispatched'])} ({row['plan']}, {ratio(row['dispatched'])})",
                       best, listing])  # fmt: skip
    return "\n".join([line, *failed])


CSV_HEADER = ["gemm", "role", "M", "N", "K", "variant", "us"]


def csv_rows(r: dict) -> list[list]:
    """One GEMM's timings as CSV rows (CSV_HEADER)."""
    head = [r["gemm"], r["role"], r["M"], r["N"], r["K"]]
    rows = [[*head, "cublas", r["cublas"]], [*head, f"dispatched {r['plan']}", r["dispatched"]]]
    for key, us in r["forced"].items():
        rows.append([*head, key, us if isinstance(us, float) else "failed"])
    return rows


def _gemm(text: str) -> tuple[int, int, int]:
    parts = tuple(int(part) for part in text.split(","))
    if len(parts) != 3 or min(parts) < 1:
        raise argparse.ArgumentTypeError(f"--gemm {text!r}: expected M,N,K positive ints")
    return parts


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="convnext_tiny,vit_b_16,llama",
                        help="comma-separated recorded linear shape sets")
    parser.add_argument("--conv", default="",
                        help="comma-separated conv shape sets: their 1x1 stride-1 layers' GEMMs")
    parser.add_argument("--splits", default="1,2,3,4,6,8")
    parser.add_argument("--gemm", action="append", default=[], type=_gemm)
    parser.add_argument("--csv", help="write every timing here, each GEMM as it is measured")
    args = parser.parse_args(argv)
    try:
        splits = tuple(int(part) for part in args.splits.split(","))
        on_gpu = torch.cuda.is_available()
        items = gemms(args.shapes.split(",") if on_gpu else [], args.gemm,
                      [name for name in args.conv.split(",") if name and on_gpu])  # fmt: skip
    except ValueError as exc:
        print(f"gemm_probe: {exc}", file=sys.stderr)
        return 2
    done = lambda row: None  # noqa: E731
    if args.csv:
        handle = open(args.csv, "w", newline="")  # noqa: SIM115 - open for the whole probe
        writer = csv.writer(handle)
        writer.writerow(CSV_HEADER)

        def done(row):
            writer.writerows(csv_rows(row))
            handle.flush()
    if on_gpu:
        device = torch.device("cuda")
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        print(f"{torch.cuda.get_device_name(device)}; torch {torch.__version__}; bf16; µs, "
              "flushed L2")  # fmt: skip
        rows = probe(items, splits, device, sms, done=done)
    else:  # the interpreter: correctness of every forced launch, nothing timed
        with pretend_gpu((9, 0), 132):
            rows = probe(items, splits, torch.device("cpu"), 132, done=done)
    return int(any(isinstance(us, str) for r in rows for us in r["forced"].values()))


if __name__ == "__main__":
    sys.exit(main())
