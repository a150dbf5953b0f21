"""kernels.attention against torch's scaled_dot_product_attention backends, on one GPU.

    python scripts/attention_bench.py [--budget 280] [--seqs 1024,2048,4096,8192,16384]
        [--variants plain,tma] [--no-vit] [--csv out.csv]

Shapes (bf16): LLM-style causal GQA, batch 4, 32 query heads, 8 kv heads, head_dim 128, each
sequence length of --seqs; ViT-style, batch 32, 12 heads, head_dim 64, 197 tokens, not causal.
Rows: ours in each variant (plain, tma: kernels/attention/dispatch.py), then SDPA with the
backend torch picks (default) and each backend forced through torch.nn.attention.sdpa_kernel
(FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION; MATH only up to --math-max-seq, as the
reference). GQA goes to SDPA as enable_gqa=True; a backend that refuses it gets K and V expanded
to the query heads (noted in the row); one that refuses the shape is skipped with its reason.

Each row: forward and fwd_bwd (forward, then torch.autograd.grad of all three inputs for a
random dO) GPU time, the median of triton.testing.do_bench; TFLOP/s by the FlashAttention
convention: forward 4·B·Hq·Sq·Sk·D (two matmuls of 2·B·Hq·Sq·Sk·D), halved when causal, and
fwd_bwd 3.5x the forward (backward 2.5x: five matmuls, one of them the recomputed Q K^T); and
the wall-clock time of a call back to back as a Python caller sees it (N calls, one sync).
Ratios are speeds (reference time / our time: above 1, ours is faster), against the default
pick and against cuDNN, for each of our variants.

Before any timing, ours (every variant) is checked against SDPA's math backend in float64 at
one shape, in fp32 (TF32 off: to fp32's 1e-4) and bf16 (1.6e-2), forward and dQ, dK, dV.

Needs torch (2.5+ for enable_gqa), triton and this repo's `kernels` only. --budget (seconds,
from the start) skips the rows that would start after it, so the run ends in bounded time; the
autotuner's first call per shape (a few configs per kernel) is outside the timed region.
"""

import argparse
import csv
import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `kernels` from this checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def attention_flops(batch, heads, seq_q, seq_k, head_dim, causal: bool, backward: bool) -> float:
    """FLOPs by the FlashAttention convention (module docstring): forward 4·B·H·Sq·Sk·D, half
    of it causal (the masked half is skipped), fwd_bwd 3.5x the forward."""
    forward = 4 * batch * heads * seq_q * seq_k * head_dim * (0.5 if causal else 1.0)
    return forward * 3.5 if backward else forward


def relative_error(out, ref) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    return (torch.linalg.vector_norm(out - ref) / torch.linalg.vector_norm(ref)).item()


# ---------------------------------------------------------------------------------------------
# Implementations: each returns fn(q, k, v) -> out, or raises where it cannot run the shape
# ---------------------------------------------------------------------------------------------
def ours(variant):
    import kernels

    def run(q, k, v, causal):
        return kernels.attention(q, k, v, causal=causal, variant=variant)

    return run


def sdpa_backend(backend):
    """SDPA forced to `backend` (None: torch's pick). GQA by enable_gqa, or K/V expanded."""
    from torch.nn.attention import sdpa_kernel

    def run(q, k, v, causal, expand=False):
        gqa = q.shape[1] != k.shape[1]
        if gqa and expand:
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            gqa = False
        kwargs = {"is_causal": causal, "enable_gqa": gqa} if gqa else {"is_causal": causal}
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, **kwargs)
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    return run


def implementations(variants, seq, math_max_seq):
    from torch.nn.attention import SDPBackend

    rows = [(f"ours-{v}", ours(v)) for v in variants]
    rows.append(("sdpa-default", sdpa_backend(None)))
    rows += [("sdpa-flash", sdpa_backend(SDPBackend.FLASH_ATTENTION)),
             ("sdpa-efficient", sdpa_backend(SDPBackend.EFFICIENT_ATTENTION)),
             ("sdpa-cudnn", sdpa_backend(SDPBackend.CUDNN_ATTENTION))]  # fmt: skip
    if seq <= math_max_seq:
        rows.append(("sdpa-math", sdpa_backend(SDPBackend.MATH)))
    return rows


# ---------------------------------------------------------------------------------------------
# Correctness before timing
# ---------------------------------------------------------------------------------------------
def check_correctness(variants) -> bool:
    from torch.nn.attention import SDPBackend

    math_fn = sdpa_backend(SDPBackend.MATH)
    torch.manual_seed(0)
    batch, heads_q, heads_kv, seq, dim = 2, 8, 2, 1000, 128
    base = [torch.randn(batch, h, seq, dim, device="cuda") for h in (heads_q, heads_kv, heads_kv)]
    do = torch.randn(batch, heads_q, seq, dim, device="cuda")

    def grads(fn, dtype):
        leaves = [t.to(dtype).requires_grad_() for t in base]
        out = fn(*leaves, True)
        return [out, *torch.autograd.grad(out, leaves, do.to(dtype))]

    exact = grads(math_fn, torch.float64)
    ok = True
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 1.6e-2)):
        for variant in variants:
            try:
                got = grads(ours(variant), dtype)
            except Exception as error:  # a kernel that fails to compile or launch: say which
                print(f"check {dtype} ours-{variant}: FAIL, {type(error).__name__}: "
                      f"{str(error).strip()[:200]}", flush=True)  # fmt: skip
                ok = False
                continue
            errors = [relative_error(g, e) for g, e in zip(got, exact, strict=True)]
            passed = max(errors) < tolerance
            ok &= passed
            names = " ".join(f"{n} {e:.1e}" for n, e in zip(("o", "dq", "dk", "dv"), errors,
                                                            strict=True))  # fmt: skip
            print(
                f"check {str(dtype).removeprefix('torch.'):8s} ours-{variant:5s} vs math fp64 "
                f"(B{batch} Hq{heads_q} Hkv{heads_kv} S{seq} D{dim} causal): {names} "
                f"{'PASS' if passed else 'FAIL'} (< {tolerance:g})",
                flush=True,
            )
    return ok


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
def wall_us_per_call(fn, min_seconds=0.2, min_calls=10) -> float:
    """Back-to-back calls as a Python caller makes them, one synchronize at the end."""
    fn()
    torch.cuda.synchronize()
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < min_seconds:
        fn()
        calls += 1
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def measure(name, fn, shape, causal):
    """One row: fwd and fwd_bwd median GPU ms, TFLOP/s and wall us per call; or the reason it
    cannot run."""
    from triton.testing import do_bench

    batch, heads_q, heads_kv, seq, dim = shape
    q = torch.randn(batch, heads_q, seq, dim, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(batch, heads_kv, seq, dim, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))  # fmt: skip
    note = ""
    try:
        fn(q, k, v, causal)
    except RuntimeError as error:
        if heads_q == heads_kv or not name.startswith("sdpa"):
            return {"skipped": str(error).strip().splitlines()[0][:120]}
        try:  # a backend that refuses enable_gqa: K and V expanded to the query heads
            fn(q, k, v, causal, expand=True)
        except RuntimeError as again:
            return {"skipped": str(again).strip().splitlines()[0][:120]}
        note = "K/V expanded"
        fn = functools.partial(fn, expand=True)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)

    def forward():
        with torch.no_grad():
            return fn(q, k, v, causal)

    def fwd_bwd():
        return torch.autograd.grad(fn(*leaves, causal), leaves, do)

    row = {"note": note}
    for pass_name, run in (("fwd", forward), ("fwd_bwd", fwd_bwd)):
        ms = do_bench(run, return_mode="median")
        flops = attention_flops(batch, heads_q, seq, seq, dim, causal, pass_name == "fwd_bwd")
        row[f"{pass_name}_ms"] = ms
        row[f"{pass_name}_tflops"] = flops / (ms * 1e-3) / 1e12
        row[f"{pass_name}_wall_us"] = wall_us_per_call(run)
    return row


def shapes(seqs, vit: bool):
    for seq in seqs:
        yield f"llm S{seq}", (4, 32, 8, seq, 128), True
    if vit:
        yield "vit S197", (32, 12, 12, 197, 64), False


def print_table(results, variants):
    print(
        "\n| shape | impl | fwd ms | fwd TFLOP/s | fwd_bwd ms | fwd_bwd TFLOP/s | wall us "
        "fwd / fwd_bwd | note |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (label, impl), row in results.items():
        if "skipped" in row:
            print(f"| {label} | {impl} | - | - | - | - | - | skipped: {row['skipped']} |")
            continue
        print(
            f"| {label} | {impl} | {row['fwd_ms']:.3f} | {row['fwd_tflops']:.0f} | "
            f"{row['fwd_bwd_ms']:.3f} | {row['fwd_bwd_tflops']:.0f} | "
            f"{row['fwd_wall_us']:.0f} / {row['fwd_bwd_wall_us']:.0f} | {row['note']} |"
        )
    print("\nspeed ratios (reference time / ours: > 1 means ours is faster)")
    print(
        "| shape | ours | vs default fwd | vs default fwd_bwd | vs cuDNN fwd | vs cuDNN fwd_bwd |"
    )
    print("|---|---|---|---|---|---|")
    labels = dict.fromkeys(label for label, _ in results)
    for label in labels:
        for variant in variants:
            mine = results.get((label, f"ours-{variant}"), {})
            if "fwd_ms" not in mine:
                continue
            cells = []
            for ref in ("sdpa-default", "sdpa-cudnn"):
                theirs = results.get((label, ref), {})
                for pass_name in ("fwd", "fwd_bwd"):
                    key = f"{pass_name}_ms"
                    cells.append(f"{theirs[key] / mine[key]:.2f}" if key in theirs else "-")
            print(f"| {label} | {variant} | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=280.0, help="seconds for the whole run")
    parser.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    parser.add_argument("--variants", default="plain,tma")
    parser.add_argument("--math-max-seq", type=int, default=1024)
    parser.add_argument("--no-vit", action="store_true")
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        print("attention_bench: needs a CUDA GPU (and TRITON_INTERPRET unset)", file=sys.stderr)
        return 2
    import triton

    from kernels.attention import tma_unusable

    start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    print(
        f"{props.name}, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs; "
        f"torch {torch.__version__}, triton {triton.__version__}",
        flush=True,
    )
    variants = [v for v in args.variants.split(",") if v]
    probe = torch.empty(1, 1, 16, 128, device="cuda", dtype=torch.bfloat16)
    if tma_unusable(probe, probe, probe):
        print(f"TMA variants skipped: {tma_unusable(probe, probe, probe)}")
        variants = [v for v in variants if v == "plain"]
    ok = check_correctness(variants)
    torch.backends.cuda.matmul.allow_tf32 = False
    results = {}
    seqs = [int(s) for s in args.seqs.split(",") if s]
    for label, shape, causal in shapes(seqs, not args.no_vit):
        for impl, fn in implementations(variants, shape[3], args.math_max_seq):
            if time.perf_counter() - start > args.budget:
                results[label, impl] = {"skipped": f"time budget ({args.budget:.0f} s) spent"}
                continue
            try:
                row = measure(impl, fn, shape, causal)
            except torch.cuda.OutOfMemoryError:
                row = {"skipped": "out of memory"}
            except Exception as error:  # ours failing to compile or launch, say: the row says so
                row = {"skipped": f"{type(error).__name__}: {str(error).strip()[:120]}"}
            torch.cuda.empty_cache()  # the next row starts from an emptied pool
            results[label, impl] = row
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
            print(f"{label:10s} {impl:15s} {shown}", flush=True)
    if args.csv:
        fields = ["shape", "impl", "fwd_ms", "fwd_tflops", "fwd_wall_us", "fwd_bwd_ms",
                  "fwd_bwd_tflops", "fwd_bwd_wall_us", "note", "skipped"]  # fmt: skip
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fields)
            writer.writeheader()
            for (label, impl), row in results.items():
                writer.writerow({"shape": label, "impl": impl, **row})
    print_table(results, variants)
    print(
        f"\ncorrectness: {'PASS' if ok else 'FAIL'}; {time.perf_counter() - start:.0f} s; "
        f"FLOPs: forward 4·B·Hq·S²·D, halved causal; fwd_bwd 3.5x forward"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
