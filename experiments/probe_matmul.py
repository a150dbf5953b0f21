"""GPU probe for kernels.matmul and kernels.linear: every variant checked, then timed against torch.

    python -m experiments.probe_matmul [--quick] [--shapes 4096x4096x4096,16x4096x4096]
                                       [--sections mm,splitk,flags,dtypes,linear]

Sections (each row: shape, variant, winning config, ms, TFLOP/s, GB/s, ratio = torch ms / ours):
    mm       bf16 square and LLM shapes: torch.matmul, our automatic path, forced TMA without
             split-K, forced pointer kernel (a few shapes), B given transposed (W.t()).
    splitk   skinny shapes (M <= 128): TMA with split_k of 1, 2, 4, 8, 16.
    flags    8192^3 (4096^3 with --quick): TMA with FLATTEN off, WARP_SPECIALIZE on.
    dtypes   fp16 and fp32 (TF32 on, as torch's switch says) on a few shapes.
    linear   bias+gelu forward vs F.linear+gelu, and forward+backward vs eager autograd.

Every variant is first compared with float64 on the first rows of the output
(torch.testing.assert_close); a failing variant prints FAILED and the probe goes on.
Timing: triton.testing.do_bench (median ms; it flushes L2 between runs).
"""

import argparse
import importlib
import math
import sys
import time
import traceback

import torch
import torch.nn.functional as F
import triton

from kernels.linear import linear

# The module, not the function that kernels/__init__.py exports under the same name.
km = importlib.import_module("kernels.matmul")

CHECK_ROWS = 256
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 6e-3}

SQUARE = [1024, 2048, 4096, 8192, 16384]
LLM = [
    (16, 4096, 4096),
    (16, 14336, 4096),
    (16, 4096, 14336),
    (128, 4096, 4096),
    (128, 14336, 4096),
    (128, 4096, 14336),
    (1024, 4096, 14336),
    (4096, 14336, 4096),
    (16384, 4096, 4096),
]
BT_SHAPES = [(4096, 4096, 4096), (16, 4096, 4096), (2048, 14336, 4096)]  # a @ W.t()
LINEAR = [(16, 4096, 4096), (2048, 4096, 4096), (2048, 14336, 4096), (2048, 4096, 14336)]

ROWS: list[str] = []


def emit(line: str) -> None:
    print(line, flush=True)
    ROWS.append(line)


def header() -> None:
    emit(f"{'shape':>20} {'variant':<22} {'ms':>9} {'TFLOP/s':>8} {'GB/s':>7} {'ratio':>6}  config")


def cfg_str(kernel) -> str:
    best = getattr(kernel, "best_config", None)
    if best is None:
        return "-"
    kw = dict(best.kwargs)
    text = f"{kw.pop('BLOCK_M')}x{kw.pop('BLOCK_N')}x{kw.pop('BLOCK_K')}"
    text += f" s{best.num_stages} w{best.num_warps}"
    if kw.pop("EPILOGUE_SUBTILE", False):
        text += " sub"
    return text


def bench(fn) -> float:
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median")


def check_rows(out, ref_rows, dtype, what):
    rows = ref_rows.shape[0]
    torch.testing.assert_close(
        out[:rows].double(),
        ref_rows,
        rtol=TOL[dtype],
        atol=TOL[dtype] * ref_rows.abs().mean().item(),
    )


def row(shape_str, variant, ms, flops, nbytes, base_ms, config):
    tflops = flops / ms / 1e9
    gbs = nbytes / ms / 1e6
    ratio = base_ms / ms if base_ms else float("nan")
    emit(f"{shape_str:>20} {variant:<22} {ms:9.4f} {tflops:8.1f} {gbs:7.0f} {ratio:6.2f}  {config}")


def run_variant(shape_str, variant, fn, check, flops, nbytes, base_ms, kernel=None):
    """Check fn's output, then time it; FAILED with the error instead of a row on any error."""
    try:
        out = fn()
        torch.cuda.synchronize()
        config = cfg_str(kernel) if kernel is not None else "-"
        check(out)
        ms = bench(fn)
        row(shape_str, variant, ms, flops, nbytes, base_ms, config)
        return ms
    except Exception as exc:  # noqa: BLE001 - the probe reports and goes on
        msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        emit(f"{shape_str:>20} {variant:<22} FAILED {msg}")
        if "-v" in sys.argv:
            traceback.print_exc()
        return None


def matmul_case(M, N, K, dtype, variants, *, b_transposed=False):
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
    if b_transposed:
        b = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen).t()
    else:
        b = torch.randn(K, N, device="cuda", dtype=dtype, generator=gen)
    rows = min(M, CHECK_ROWS)
    ref_rows = a[:rows].double() @ b.double()
    flops = 2.0 * M * N * K
    nbytes = (M * K + K * N + M * N) * a.element_size()
    tag = "bT" if b_transposed else ""
    shape_str = f"{M}x{N}x{K}{tag}"
    check = lambda out: check_rows(out, ref_rows, dtype, shape_str)  # noqa: E731
    base = run_variant(shape_str, "torch", lambda: a @ b, check, flops, nbytes, None)
    results = {"torch": base}
    for name, kwargs in variants:
        kernel = km.matmul_tma_kernel if kwargs.get("path", "tma") == "tma" else km.matmul_kernel
        if name == "auto":
            kernel = km.matmul_tma_kernel if km.plan(a, b)[0] == "tma" else km.matmul_kernel
            sk = km.plan(a, b)[1]
            name = f"auto(sk{sk})"
        fn = lambda kw=kwargs: km.fused_matmul(a, b, **kw)[0]  # noqa: E731
        results[name] = run_variant(shape_str, name, fn, check, flops, nbytes, base, kernel)
    return results


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        dims = [int(v) for v in item.lower().split("x")]
        shapes.append(tuple(dims) if len(dims) == 3 else (dims[0],) * 3)
    return shapes


def section_mm(shapes, quick):
    emit("== matmul bf16: torch vs ours (auto = the path and split_k kernels.matmul picks) ==")
    header()
    ratios = []
    pointer_shapes = {(1024,) * 3, (4096,) * 3, (16, 4096, 4096), (128, 4096, 14336)}
    for M, N, K in shapes:
        variants = [("auto", {})]
        if M <= km.SKINNY_M:
            variants.append(("tma-sk1", {"path": "tma", "split_k": 1}))
        if (M, N, K) in pointer_shapes and not quick:
            variants.append(("pointer", {"path": "pointer"}))
        res = matmul_case(M, N, K, torch.bfloat16, variants)
        auto = [v for k, v in res.items() if k.startswith("auto")]
        if res["torch"] and auto and auto[0]:
            ratios.append(res["torch"] / auto[0])
    if ratios:
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        emit(
            f"geomean ratio torch/auto over {len(ratios)} shapes: {geo:.3f}, min {min(ratios):.3f}"
        )
    emit("== B given transposed (a @ W.t(), the linear layout) ==")
    header()
    for M, N, K in BT_SHAPES:
        matmul_case(M, N, K, torch.bfloat16, [("auto", {})], b_transposed=True)


def section_splitk(shapes):
    emit("== split-K sweep on skinny shapes (TMA) ==")
    header()
    for M, N, K in shapes:
        if M > km.SKINNY_M:
            continue
        variants = [(f"tma-sk{s}", {"path": "tma", "split_k": s}) for s in (2, 4, 8, 16)]
        variants.append(("pointer-sk4", {"path": "pointer", "split_k": 4}))
        matmul_case(M, N, K, torch.bfloat16, variants)


def section_flags(quick):
    size = 4096 if quick else 8192
    emit(f"== persistent-loop flags at {size}^3 bf16 ==")
    header()
    for flatten, ws in [(False, False), (True, True)]:
        km.FLATTEN, km.WARP_SPECIALIZE = flatten, ws
        try:
            matmul_case(
                size, size, size, torch.bfloat16, [(f"tma-flat{int(flatten)}-ws{int(ws)}", {})]
            )
        finally:
            km.FLATTEN, km.WARP_SPECIALIZE = True, False


def section_dtypes(quick):
    emit("== fp16 and fp32 (allow_tf32 = True for both torch and ours) ==")
    header()
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        for M, N, K in [(4096,) * 3] + ([] if quick else [(8192,) * 3, (16, 4096, 4096)]):
            matmul_case(M, N, K, torch.float16, [("auto", {})])
        for M, N, K in [(4096,) * 3] + ([] if quick else [(16, 4096, 4096)]):
            matmul_case(M, N, K, torch.float32, [("auto", {})])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def section_linear(shapes):
    emit("== linear bf16, bias + gelu: forward (no grad) and forward+backward ==")
    header()
    for M, N, K in shapes:
        linear_case(M, N, K, torch.bfloat16)


def linear_case(M, N, K, dtype):
    gen = torch.Generator(device="cuda").manual_seed(M + N)
    x = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
    w = torch.randn(N, K, device="cuda", dtype=dtype, generator=gen) / math.sqrt(K)
    b = torch.randn(N, device="cuda", dtype=dtype, generator=gen)
    shape_str = f"{M}x{N}x{K}"
    rows = min(M, CHECK_ROWS)
    ref_rows = F.gelu(x[:rows].double() @ w.double().t() + b.double())
    flops = 2.0 * M * N * K
    nbytes = (M * K + N * K + M * N) * 2
    check = lambda out: check_rows(out, ref_rows, dtype, shape_str)  # noqa: E731
    with torch.no_grad():
        base = run_variant(
            shape_str,
            "fwd eager",
            lambda: F.gelu(F.linear(x, w, b)),
            check,
            flops,
            nbytes,
            None,
        )
        run_variant(
            shape_str,
            "fwd triton",
            lambda: linear(x, w, b, "gelu"),
            check,
            flops,
            nbytes,
            base,
            km.matmul_tma_kernel,
        )
    # forward + backward: gradients of x, w and b
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
    dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=gen)

    def step(fwd):
        def run():
            for t in (xg, wg, bg):
                t.grad = None
            fwd().backward(dy)
            return xg.grad

        return run

    eager_fn = step(lambda: F.gelu(F.linear(xg, wg, bg)))
    ours_fn = step(lambda: linear(xg, wg, bg, "gelu"))
    grads = {}
    try:
        eager_fn()
        grads = {n: t.grad.double() for n, t in zip("xwb", (xg, wg, bg), strict=True)}
    except Exception as exc:  # noqa: BLE001
        emit(f"{shape_str:>20} fwd_bwd eager FAILED {exc}")

    def check_grads(_):
        for n, t in zip("xwb", (xg, wg, bg), strict=True):
            ref = grads[n]
            torch.testing.assert_close(
                t.grad.double(), ref, rtol=3e-2, atol=3e-2 * ref.abs().mean().item()
            )

    fb_flops = 3 * flops
    fb_base = run_variant(
        shape_str, "fwd_bwd eager", eager_fn, lambda _: None, fb_flops, 3 * nbytes, None
    )
    run_variant(shape_str, "fwd_bwd triton", ours_fn, check_grads, fb_flops, 3 * nbytes, fb_base)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and variants")
    parser.add_argument("--shapes", help="MxNxK list (or one size for a cube) for mm/splitk/linear")
    parser.add_argument("--sections", default="mm,splitk,flags,dtypes,linear")
    parser.add_argument("-v", action="store_true", help="tracebacks for failures")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("probe_matmul needs a CUDA GPU")
    sections = set(args.sections.split(","))
    start = time.time()
    props = torch.cuda.get_device_properties(0)
    emit(
        f"# {props.name} sm_{props.major}{props.minor} {props.multi_processor_count} SMs; "
        f"torch {torch.__version__}, triton {triton.__version__}"
    )
    if args.shapes:
        mm_shapes = linear_shapes = parse_shapes(args.shapes)
    else:
        square = SQUARE[:4] if args.quick else SQUARE
        llm = LLM[:6] if args.quick else LLM
        mm_shapes = [(s, s, s) for s in square] + llm
        linear_shapes = LINEAR[:2] if args.quick else LINEAR
    for name, fn in [
        ("mm", lambda: section_mm(mm_shapes, args.quick)),
        ("splitk", lambda: section_splitk(mm_shapes)),
        ("flags", lambda: section_flags(args.quick)),
        ("dtypes", lambda: section_dtypes(args.quick)),
        ("linear", lambda: section_linear(linear_shapes)),
    ]:
        if name in sections:
            t0 = time.time()
            try:
                fn()
            except Exception as exc:  # noqa: BLE001
                emit(f"section {name} FAILED: {type(exc).__name__}: {exc}")
            emit(f"-- section {name}: {time.time() - t0:.1f} s")
    emit(f"# total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
