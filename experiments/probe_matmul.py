"""GPU probe for kernels.matmul and kernels.linear: every variant checked, then timed against torch.

    python -m experiments.probe_matmul [--quick] [--shapes 4096x4096x4096,16x4096x4096]
                                       [--sections mm,splitk,flags,dtypes,linear,round3]
    TRITON_INTERPRET=1 python -m experiments.probe_matmul --sections round3 --smoke   # no GPU
    TRITON_INTERPRET=1 python -m experiments.probe_matmul --sections round4 --smoke   # no GPU

Sections (each row: shape, variant, winning config, ms, TFLOP/s, GB/s, ratio = torch ms / ours):
    mm       bf16 square and LLM shapes: torch.matmul, our automatic path, forced TMA without
             split-K, forced pointer kernel (a few shapes), B given transposed (W.t()).
    splitk   skinny shapes (M <= 128): TMA with split_k of 1, 2, 4, 8, 16.
    flags    8192^3 (4096^3 with --quick): TMA with FLATTEN off, WARP_SPECIALIZE on.
    dtypes   fp16 and fp32 (TF32 on, as torch's switch says) on a few shapes.
    linear   bias+gelu forward vs F.linear+gelu, and forward+backward vs eager autograd.
    round3   the round-3 variants (kernels.matmul.VARIANTS and explicit tiles with host-side
             descriptors / in-kernel split-K) on the small and mid shapes, ratio tables, then
             linear 2048x4096x4096 under three VARIANT settings; about 2 minutes on an H100.
    linbwd   linear bias+gelu backward piece by piece (dZ+db, dX, dW), eager vs ours.
    round4   one run, ~2.5 min on an H100 (--r4-budget): (a) the shipped default (host-side
             descriptors, hd_config) vs torch on the 19 square + LLM shapes with a ratio table;
             (c) the linear backward pieces with dZ+db settings; (b) linear forward tiles
             with and without the epilogue activation, and fwd_bwd, on the 4 linear shapes.
             --r4-parts c runs only (c), a, b or any mix likewise.
    round8   1024^3 (bf16, fp16) and 2048^3: the shipped tile against other one-wave tiles
             (fewer K steps, stage counts, 64x64 two-wave tiles, no flatten); under a minute.

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
    emit(
        f"{'shape':>20} {'variant':<22} {'ms':>9} {'TFLOP/s':>8} {'GB/s':>7} {'ratio':>6} "
        f"{'host_us':>7}  config"
    )


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


_FLUSH: list = []
LAST_HOST_US = [0.0]


def bench(fn, budget_ms: float = 40.0) -> float:
    """Median GPU ms of fn, L2 flushed before each call, with the host's enqueue time hidden:
    a torch.cuda._sleep lead longer than the host needs to enqueue fn runs before the start
    event, so a call whose Python and launch path is slow is not charged for it (the benchmark
    harness, experiments/timing.py, hides it the same way). Also records the host time per call
    (LAST_HOST_US), which is what a launch-bound caller would see."""
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 * 2**20, dtype=torch.int8, device="cuda"))
    flush = _FLUSH[0]
    fn()
    torch.cuda.synchronize()
    host = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    host_ms = sorted(host)[2] * 1e3
    LAST_HOST_US[0] = host_ms * 1e3
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    est_ms = (time.perf_counter() - t0) * 1e3
    reps = max(5, min(100, int(budget_ms / max(est_ms, 1e-3))))
    lead_cycles = int((1.5 * host_ms + 0.05) * 2.0e6)  # ~2 GHz SM clock
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        torch.cuda._sleep(lead_cycles)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(st.elapsed_time(en) for st, en in zip(starts, ends, strict=True))
    return times[len(times) // 2]


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
    emit(
        f"{shape_str:>20} {variant:<22} {ms:9.4f} {tflops:8.1f} {gbs:7.0f} {ratio:6.2f} "
        f"{LAST_HOST_US[0]:7.0f}  {config}"
    )


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
        report_failure(shape_str, variant, exc)
        return None


def report_failure(shape_str, variant, exc):
    """One FAILED line in place of the variant's row (the traceback too with -v)."""
    msg = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
    emit(f"{shape_str:>20} {variant:<22} FAILED {msg}")
    if "-v" in sys.argv:
        traceback.print_exc()


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


def launch_config(a, b, meta, *, split_k=1, flatten=True, persistent=True):
    """One explicit config of the TMA kernel, past the autotuner (its .fn is the jit function)."""
    (bm, bn, bk, stages, warps, sub, group) = meta
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, device=a.device, dtype=a.dtype)
    partial = (
        torch.empty(split_k, M, N, device=a.device, dtype=torch.float32) if split_k > 1 else None
    )
    la, lb = km._tma_layout(a), km._tma_layout(b)
    triton.set_allocator(km._alloc_scratch)
    work = triton.cdiv(M, bm) * triton.cdiv(N, bn) * split_k
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = (min(sms, work) if persistent else work,)
    km.matmul_tma_kernel.fn[grid](
        a, b, c, None, None, partial, M, N, K, split_k, la[1], lb[1], c.stride(0), 0,
        A_COL_MAJOR=la[0], B_COL_MAJOR=lb[0], HAS_BIAS=False, ACTIVATION=0, STORE_PREACT=False,
        TMA_STORE=True, INPUT_PRECISION="ieee", SPLIT=split_k > 1,
        UPCAST_TO_FP32=km.is_interpreter() and a.dtype == torch.bfloat16,
        FLATTEN=flatten, WARP_SPECIALIZE=False, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=group,
        EPILOGUE_SUBTILE=sub, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if split_k > 1:
        return partial.sum(0).to(a.dtype)
    return c


SWEEP_BIG = [  # (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps, subtile, GROUP_M)
    (128, 256, 64, 3, 8, False, 8),
    (128, 256, 64, 4, 8, True, 8),
    (128, 256, 64, 3, 8, True, 8),
    (128, 256, 64, 4, 8, True, 16),
    (256, 128, 64, 3, 8, False, 8),
    (256, 128, 64, 4, 8, True, 8),
    (128, 256, 128, 2, 8, True, 8),
    (128, 128, 64, 5, 4, False, 8),
]
SWEEP_SKINNY = [
    (64, 128, 128, 4, 4, False, 8),
    (64, 64, 128, 6, 4, False, 8),
    (16, 128, 256, 4, 4, False, 8),
    (16, 64, 256, 5, 4, False, 8),
    (32, 64, 256, 4, 4, False, 8),
]


def section_sweep(quick):
    """Explicit TMA configs on the shapes that miss: 8192^3, and the decode shapes with split_k."""
    emit("== config sweep (explicit configs, no autotuner), bf16 ==")
    header()
    big = [(4096, 4096, 4096)] if quick else [(8192,) * 3, (4096, 14336, 4096)]
    for M, N, K in big:
        variants = []
        for meta in SWEEP_BIG:
            tag = "x".join(map(str, meta[:3])) + f"s{meta[3]}w{meta[4]}" + ("S" if meta[5] else "")
            tag += f"g{meta[6]}"
            variants.append((tag, meta, {}))
        variants.append(("nonflat:" + "128x256x64s3w8", SWEEP_BIG[0], {"flatten": False}))
        variants.append(("nonpers:" + "128x256x64s3w8", SWEEP_BIG[0], {"persistent": False}))
        variants.append(("nonpers:" + "128x256x64s4w8S", SWEEP_BIG[1], {"persistent": False}))
        sweep_case(M, N, K, variants)
    for M, N, K in [(16, 4096, 4096), (16, 14336, 4096)] + ([] if quick else [(128, 4096, 14336)]):
        variants = []
        for meta in SWEEP_SKINNY:
            for split in (1, 4, 8):
                tag = "x".join(map(str, meta[:3])) + f"s{meta[3]}w{meta[4]}" + f"-sk{split}"
                variants.append((tag, meta, {"split_k": split}))
        sweep_case(M, N, K, variants)


def sweep_case(M, N, K, variants):
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    a = torch.randn(M, K, device="cuda", dtype=dtype, generator=gen)
    b = torch.randn(K, N, device="cuda", dtype=dtype, generator=gen)
    rows = min(M, CHECK_ROWS)
    ref_rows = a[:rows].double() @ b.double()
    flops = 2.0 * M * N * K
    nbytes = (M * K + K * N + M * N) * a.element_size()
    shape_str = f"{M}x{N}x{K}"
    check = lambda out: check_rows(out, ref_rows, dtype, shape_str)  # noqa: E731
    base = run_variant(shape_str, "torch", lambda: a @ b, check, flops, nbytes, None)
    for tag, meta, kw in variants:
        fn = lambda meta=meta, kw=kw: launch_config(a, b, meta, **kw)  # noqa: E731
        run_variant(shape_str, tag, fn, check, flops, nbytes, base)


def section_host():
    """Where the host time of one call goes (cProfile), for a launch-bound shape."""
    import cProfile
    import pstats

    emit("== host profile: 200 calls of fused_matmul, 1024^3 bf16 and 16x4096x4096 ==")
    for M, N, K in [(1024, 1024, 1024), (16, 4096, 4096)]:
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        km.fused_matmul(a, b)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            km.fused_matmul(a, b)
        torch.cuda.synchronize()
        emit(
            f"{M}x{N}x{K}: {(time.perf_counter() - t0) / 200 * 1e6:.0f} us per call (wall, synced)"
        )
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            km.fused_matmul(a, b)
        prof.disable()
        torch.cuda.synchronize()
        import io

        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        for line in out.getvalue().splitlines():
            if line.strip() and ("{" in line or "/" in line or "ncalls" in line):
                emit("   " + line.strip()[:150])


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
            matmul_case(M, N, K, torch.float32, [("auto", {}), ("pointer", {"path": "pointer"})])
        matmul_case(4096, 4096, 4096, torch.float32, [("auto", {})], b_transposed=True)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def section_linear(shapes):
    emit("== linear bf16, bias + gelu: forward (no grad) and forward+backward ==")
    header()
    for M, N, K in shapes:
        linear_case(M, N, K, torch.bfloat16)


def fwd_bwd_steps(x, w, b, dy):
    """Leaf copies (xg, wg, bg) of x, w, b, and two calls that clear their gradients and run
    forward + backward(dy) of bias+gelu linear: eager's and ours. Each returns xg.grad."""
    xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))

    def step(fwd):
        def run():
            for t in (xg, wg, bg):
                t.grad = None
            fwd().backward(dy)
            return xg.grad

        return run

    eager_fn = step(lambda: F.gelu(F.linear(xg, wg, bg)))
    ours_fn = step(lambda: linear(xg, wg, bg, "gelu"))
    return (xg, wg, bg), eager_fn, ours_fn


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
    dy = torch.randn(M, N, device="cuda", dtype=dtype, generator=gen)
    (xg, wg, bg), eager_fn, ours_fn = fwd_bwd_steps(x, w, b, dy)
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


def _close_to(ref_f):
    def check(out):
        atol = 2e-2 * ref_f.abs().mean().item()
        torch.testing.assert_close(out.float(), ref_f, rtol=2e-2, atol=atol)

    return check


def section_linbwd(shapes=((2048, 4096, 4096),)):
    """linear bias+gelu backward piece by piece, eager against ours (GPU ms each): where does
    fwd_bwd time go? dZ = dY·gelu'(Z) (+ db), dX = dZ W, dW = dZ^T X."""
    emit("== linear backward pieces, bf16, gelu (ratio = eager ms / ours) ==")
    header()
    for M, N, K in shapes:
        _linbwd_case(M, N, K)


def _linbwd_case(M, N, K):
    from kernels._common import ACTIVATIONS, direct
    from kernels.linear import _activation_backward

    gelu = ACTIVATIONS["gelu"]
    gen = torch.Generator(device="cuda").manual_seed(M + N + K)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16, generator=gen) / math.sqrt(K)
    z = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    dy = torch.randn(M, N, device="cuda", dtype=torch.bfloat16, generator=gen)
    sh = f"{M}x{N}x{K}"
    dz_ref = torch.ops.aten.gelu_backward(dy, z)
    db_ref = dz_ref.float().sum(0)

    def eager_dz():
        dz = torch.ops.aten.gelu_backward(dy, z)
        return dz, dz.sum(0)

    def check_dz(out):
        _close_to(dz_ref.float())(out[0])
        _close_to(db_ref)(out[1])

    pieces = [
        ("dZ+db", 0.0, 3 * M * N * 2, eager_dz,
         lambda: _activation_backward(dy, z, gelu, True, direct), check_dz),
        ("dX=dZ W", 2.0 * M * N * K, (M * N + N * K + M * K) * 2, lambda: dz_ref @ w,
         lambda: km.fused_matmul(dz_ref, w)[0], _close_to((dz_ref @ w).float())),
        ("dW=dZ^T X", 2.0 * M * N * K, (M * N + M * K + N * K) * 2, lambda: dz_ref.t() @ x,
         lambda: km.fused_matmul(dz_ref.t(), x)[0], _close_to((dz_ref.t() @ x).float())),
    ]  # fmt: skip
    for name, flops, nbytes, eager, ours, check in pieces:
        base = run_variant(sh, f"{name} eager", eager, lambda _: None, flops, nbytes, None)
        run_variant(sh, f"{name} ours", ours, check, flops, nbytes, base, km.matmul_tma_kernel)


# ---- round 3: small and mid shapes (kernels/notes/matmul.md, "Round 3") ----
R3_SHAPES = [  # (M, N, K, dtype), most wanted first: the budget cuts from the end
    (1024, 1024, 1024, torch.bfloat16),
    (2048, 2048, 2048, torch.bfloat16),
    (1024, 4096, 4096, torch.bfloat16),
    (128, 4096, 4096, torch.bfloat16),
    (16, 4096, 4096, torch.bfloat16),
    (1024, 1024, 1024, torch.float16),
    (1024, 14336, 4096, torch.bfloat16),
    (4096, 4096, 4096, torch.bfloat16),
]
R3_SMOKE_SHAPES = [(160, 64, 96, torch.float16), (16, 48, 160, torch.bfloat16)]
R3_BUDGET_S = 140.0  # variants not started by then are reported SKIPPED
R3_IDLE_S = 0.2  # idle between a variant's first (compiling) call and its timing: heat


def _meta(bm, bn, bk, stages, warps, sub=False, flatten=True):
    return km._r3_meta((bm, bn, bk, stages, warps, sub), flatten=flatten)


def r3_variants(M, N, K, dtype=torch.bfloat16, smoke=False):
    """(name, fused_matmul kwargs) for one shape: the module's variants, then explicit tiles
    (bf16 only: fp16 gets the module's variants but "sk", to save compile time)."""
    out = [(v, {"variant": v}) for v in km.VARIANTS]
    if dtype == torch.float16 and not smoke:
        return [(n, kw) for n, kw in out if n != "sk"]
    if smoke:
        return out + [
            ("hd:32x32x32", {"variant": "wave-hd", "config": _meta(32, 32, 32, 1, 4)}),
            ("sk3:32x32x32S", {"variant": "sk", "config": _meta(32, 32, 32, 1, 4, True, False),
                               "split_k": 3}),
        ]  # fmt: skip
    big = [(128, 256, 64, 3, 8, True), (128, 128, 64, 4, 8), (128, 64, 64, 4, 4),
           (64, 128, 64, 4, 4)]  # fmt: skip
    if M > 128:
        few_tiles = triton.cdiv(M, 128) * triton.cdiv(N, 256) <= 132
        for t in big if few_tiles else big[:2]:
            name = "hd:{}x{}x{}s{}w{}".format(*t[:5]) + ("S" if len(t) > 5 and t[5] else "")
            out.append((name, {"variant": "wave-hd", "config": _meta(*t)}))
        if (M, N, K) == (1024, 1024, 1024):
            for t, split in [((128, 128, 64, 4, 8), 2), ((128, 64, 64, 4, 4), 2)]:
                name = "skhd:{}x{}x{}s{}w{}".format(*t) + f"-sk{split}"
                out.append((name, {"variant": "sk-hd", "config": _meta(*t, flatten=False),
                                   "split_k": split}))  # fmt: skip
    else:
        skinny = [((64, 128, 128, 4, 4), 1), ((64, 64, 128, 6, 4), 1), ((64, 128, 128, 4, 4), 4)]
        if M <= 32:
            skinny += [((16, 64, 256, 5, 4), 1), ((16, 64, 256, 5, 4), 4)]
        for t, split in skinny:
            name = ("skhd:" if split > 1 else "hd:") + "{}x{}x{}s{}w{}".format(*t)
            name += f"-sk{split}" if split > 1 else ""
            out.append(
                (
                    name,
                    {
                        "variant": "sk-hd" if split > 1 else "wave-hd",
                        "config": _meta(*t, flatten=split == 1),
                        "split_k": split,
                    },
                )
            )
    return out


def r3_config_str(kw):
    """The tile a call used: the round-3 kernel's (LAST_R3) or the autotuner's choice."""
    last = km.LAST_R3[0]
    if last is None:
        return "default " + cfg_str(km.matmul_tma_kernel)
    meta, split, hd = last
    text = f"{meta['BLOCK_M']}x{meta['BLOCK_N']}x{meta['BLOCK_K']} s{meta['num_stages']}"
    text += f" w{meta['num_warps']}" + (" sub" if meta["EPILOGUE_SUBTILE"] else "")
    text += f" sk{split}" + (" hd" if hd else "") + ("" if meta["FLATTEN"] else " noflat")
    if meta.get("BIAS_IN_ACC"):
        text += " biasacc"
    if meta.get("CTAS_PER_SM", 1) != 1:
        text += f" x{meta['CTAS_PER_SM']}/SM"
    return text


def _r3_checker(ref_rows, ref_full, dtype, shape_str):
    """float64 on the first rows, and torch's own result on the whole output (every tile)."""

    def check(out):
        check_rows(out, ref_rows, dtype, shape_str)
        atol = TOL[dtype] * ref_full.abs().mean().item()
        torch.testing.assert_close(out.float(), ref_full, rtol=TOL[dtype], atol=atol)

    return check


def _checked_case(M, N, K, dtype, dev, smoke):
    """Seeded operands of one GEMM shape and its checker (float64 rows, torch's whole output):
    (a, b, shape label, flops, bytes moved, check)."""
    gen = torch.Generator(device=dev).manual_seed(M + N + K)
    a = torch.randn(M, K, device=dev, dtype=dtype, generator=gen)
    b = torch.randn(K, N, device=dev, dtype=dtype, generator=gen)
    ref_rows = a[: min(M, CHECK_ROWS)].double() @ b.double()
    ref_full = (a.float() @ b.float()) if smoke else (a @ b).float()
    shape_str = f"{M}x{N}x{K}" + ("" if dtype == torch.bfloat16 else "-fp16")
    flops, nbytes = 2.0 * M * N * K, (M * K + K * N + M * N) * a.element_size()
    return a, b, shape_str, flops, nbytes, _r3_checker(ref_rows, ref_full, dtype, shape_str)


def section_round3(quick, smoke=False, budget_s=R3_BUDGET_S):
    """Each round-3 variant against torch.matmul on the small and mid shapes, bf16 (and fp16 at
    1024^3): checked against torch on the whole output and float64 on the first rows, before and
    after timing (the split-K counters must reset), then ratio tables."""
    dev = "cpu" if smoke else "cuda"
    note = " (SMOKE: interpreter, no timing)" if smoke else ""
    emit(f"== round 3: variants vs torch.matmul{note} ==")
    header()
    start = time.time()
    shapes = R3_SMOKE_SHAPES if smoke else (R3_SHAPES[:2] + R3_SHAPES[-1:] if quick else R3_SHAPES)
    table: dict = {}
    configs: dict = {}
    for M, N, K, dtype in shapes:
        a, b, shape_str, flops, nbytes, check = _checked_case(M, N, K, dtype, dev, smoke)
        base = None
        if not smoke:
            base = run_variant(shape_str, "torch", lambda: a @ b, check, flops, nbytes, None)  # noqa: B023
        seen = set()
        for name, kw in r3_variants(M, N, K, dtype, smoke):
            if smoke:  # plan() picks the pointer kernel without a GPU: force the TMA path
                kw = {**kw, "path": "tma"}
            if time.time() - start > budget_s:
                emit(f"{shape_str:>20} {name:<22} SKIPPED (round-3 budget of {budget_s:.0f} s)")
                continue
            try:
                km.LAST_R3[0] = None
                out = km.fused_matmul(a, b, **kw)[0]
                if not smoke:
                    torch.cuda.synchronize()
                cfg = r3_config_str(kw)
                if cfg in seen:  # the same launch as an earlier variant: not timed again
                    emit(f"{shape_str:>20} {name:<22} = an earlier row ({cfg})")
                    table[(shape_str, name)] = table.get((shape_str, "dup:" + cfg))
                    configs[(shape_str, name)] = cfg
                    continue
                seen.add(cfg)
                check(out)
                if smoke:
                    emit(f"{shape_str:>20} {name:<22} ok (checked)  {cfg}")
                    continue
                fn = lambda kw=kw: km.fused_matmul(a, b, **kw)[0]  # noqa: E731, B023
                # the default's first call autotuned (seconds of GEMMs: heat): a longer idle
                time.sleep(R3_IDLE_S * (5 if name == "default" else 1))
                ms = bench(fn)
                row(shape_str, name, ms, flops, nbytes, base, cfg)
                check(fn())  # again after the timed runs: split-K counters left at zero
                ratio = base / ms if base else float("nan")
                table[(shape_str, name)] = table[(shape_str, "dup:" + cfg)] = ratio
                configs[(shape_str, name)] = cfg
            except Exception as exc:  # noqa: BLE001 - the probe reports and goes on
                report_failure(shape_str, name, exc)
        if not smoke:
            # The default once more, long after its autotuning; the table keeps its better time.
            again = run_variant(shape_str, "default (again)",
                                lambda: km.fused_matmul(a, b, variant="default")[0],  # noqa: B023
                                check, flops, nbytes, base, km.matmul_tma_kernel)  # fmt: skip
            if again and base:
                table[(shape_str, "default")] = max(table.get((shape_str, "default")) or 0,
                                                    base / again)  # fmt: skip
            run_variant(shape_str, "torch (again)", lambda: a @ b, check, flops, nbytes, base)  # noqa: B023
    if smoke:
        emit("-- round 3 smoke done (no timings)")
        return
    _r3_tables(table, configs, [f"{m}x{n}x{k}" + ("" if d == torch.bfloat16 else "-fp16")
                                for m, n, k, d in shapes])  # fmt: skip
    if time.time() - start < budget_s - 40 and not quick:  # the linear runs take ~30 s
        _r3_linear()


# Round 8: the one-wave shapes (1024^3 sits at 0.85 of cuBLAS): tiles with fewer K steps,
# other stage counts, two waves of small tiles, and the persistent loop not flattened.
R8_SHAPES = [(1024, 1024, 1024, torch.bfloat16), (1024, 1024, 1024, torch.float16),
             (2048, 2048, 2048, torch.bfloat16)]  # fmt: skip
R8_TILES = [(128, 64, 64, 4, 4), (128, 64, 64, 3, 4), (128, 64, 64, 5, 4), (128, 64, 128, 3, 4),
            (64, 128, 128, 3, 4), (64, 128, 64, 4, 4), (64, 128, 64, 6, 4), (128, 128, 64, 3, 4),
            (64, 64, 128, 4, 4), (64, 64, 64, 6, 4), (128, 128, 128, 2, 8)]  # fmt: skip


def section_round8(smoke=False):
    """The shipped hd tile against R8_TILES (host-side descriptors) and torch on R8_SHAPES,
    each checked against float64 rows and torch's whole output, torch timed first and last."""
    dev = "cpu" if smoke else "cuda"
    emit("== round 8: one-wave tiles vs torch.matmul" + (" (SMOKE)" if smoke else "") + " ==")
    header()
    shapes = R3_SMOKE_SHAPES if smoke else R8_SHAPES
    for M, N, K, dtype in shapes:
        a, b, shape_str, flops, nbytes, check = _checked_case(M, N, K, dtype, dev, smoke)
        base = None if smoke else run_variant(
            shape_str, "torch", lambda: a @ b, check, flops, nbytes, None  # noqa: B023
        )  # fmt: skip
        variants = [("shipped (hd)", {"variant": "hd"})]
        tiles = [(32, 32, 32, 1, 4)] if smoke else R8_TILES
        for t in tiles:
            name = "hd:{}x{}x{}s{}w{}".format(*t)
            variants.append((name, {"variant": "wave-hd", "config": _meta(*t)}))
        noflat = _meta(128, 64, 64, 4, 4, flatten=False)
        variants.append(("hd:128x64x64s4w4 noflat", {"variant": "wave-hd", "config": noflat}))
        for name, kw in variants:
            if smoke:
                kw = {**kw, "path": "tma"}
            try:
                fn = lambda kw=kw: km.fused_matmul(a, b, **kw)[0]  # noqa: E731, B023
                check(fn())
                if smoke:
                    emit(f"{shape_str:>20} {name:<22} ok (checked)")
                    continue
                time.sleep(R3_IDLE_S)
                row(shape_str, name, bench(fn), flops, nbytes, base, r3_config_str(kw))
            except Exception as exc:  # noqa: BLE001 - the probe reports and goes on
                report_failure(shape_str, name, exc)
        if not smoke:
            run_variant(shape_str, "torch (again)", lambda: a @ b, check, flops, nbytes, base)  # noqa: B023


def _r3_tables(table, configs, shape_strs):
    emit("== round 3 ratios (torch ms / ours; > 1 is faster than cuBLAS; default: the better of")
    emit("   its two timings, right after autotuning + 1 s idle and at the end of the shape) ==")
    names = list(km.VARIANTS)
    emit(f"{'shape':>20} " + " ".join(f"{n:>8}" for n in names) + "  best explicit tile")
    geo = {n: [] for n in names}
    for sh in shape_strs:
        cells = []
        for n in names:
            r = table.get((sh, n))
            if configs.get((sh, n), "").startswith("default"):  # fell back to the default kernel
                r = table.get((sh, "default"))
            cells.append(f"{r:8.3f}" if r else f"{'-':>8}")
            if r:
                geo[n].append(r)
        extra = [(r, n) for (s2, n), r in table.items()
                 if s2 == sh and r and n not in names and not n.startswith("dup:")]  # fmt: skip
        best = max(extra) if extra else None
        best_txt = f"{best[1]} {best[0]:.3f} ({configs.get((sh, best[1]), '')})" if best else "-"
        emit(f"{sh:>20} " + " ".join(cells) + "  " + best_txt)
    cells = []
    for n in names:
        v = geo[n]
        cells.append(f"{math.exp(sum(map(math.log, v)) / len(v)):8.3f}" if v else f"{'-':>8}")
    emit(f"{'geomean':>20} " + " ".join(cells))
    emit("configs per variant:")
    for sh in shape_strs:
        emit(
            f"  {sh}: " + "; ".join(f"{n}={configs[(sh, n)]}" for n in names if (sh, n) in configs)
        )


def _r3_linear():
    """Linear bias+gelu 2048x4096x4096 (fwd and fwd_bwd) under three module variants."""
    for v in ("default", "wave-hd", "sk-hd"):
        emit(f"== round 3 linear with kernels.matmul.VARIANT = {v!r} ==")
        header()
        km.VARIANT = v
        try:
            linear_case(2048, 4096, 4096, torch.bfloat16)
        except Exception as exc:  # noqa: BLE001
            emit(f"linear {v} FAILED {type(exc).__name__}: {exc}")
        finally:
            km.VARIANT = "default"


# ---- round 4: the shipped host-descriptor default, linear forward tiles, dZ+db ----
R4_BUDGET_S = 130.0  # no variant starts after this many seconds (the section's whole budget)
R4_SMOKE_MM = [(16, 48, 160), (72, 40, 64), (160, 64, 96)]
R4_SMOKE_LINEAR = [(16, 40, 64), (136, 48, 96)]
R4_LINBWD_SHAPE = (2048, 4096, 4096)


class _R4:
    """Budget, smoke mode and the timing/check routine shared by the round-4 parts."""

    def __init__(self, budget_s, smoke):
        self.start = time.time()
        self.budget_s = budget_s
        self.smoke = smoke
        self.dev = "cpu" if smoke else "cuda"

    def over(self):
        return time.time() - self.start > self.budget_s

    def run(self, shape_str, name, fn, check, flops, nbytes, base, config=lambda: "-"):
        """Call fn, check its output, then (on the GPU) time it and check it again; a row, or
        SKIPPED past the budget, or FAILED. Returns ms (None in smoke mode or on failure)."""
        if self.over():
            emit(f"{shape_str:>20} {name:<22} SKIPPED (round-4 budget of {self.budget_s:.0f} s)")
            return None
        try:
            km.LAST_R3[0] = None
            out = fn()
            if not self.smoke:
                torch.cuda.synchronize()
            cfg = config()
            check(out)
            if self.smoke:
                emit(f"{shape_str:>20} {name:<22} ok (checked)  {cfg}")
                return None
            time.sleep(R3_IDLE_S)
            ms = bench(fn)
            row(shape_str, name, ms, flops, nbytes, base, cfg)
            check(fn())
            return ms
        except Exception as exc:  # noqa: BLE001 - the probe reports and goes on
            report_failure(shape_str, name, exc)
            return None


def _r4_mm(r4):
    """(a) The shipped default (VARIANT "hd") against torch.matmul on the 19 square + LLM
    shapes, bf16; a ratio table with geomean and worst."""
    emit("== round 4 (a): shipped default (host descriptors, hd_config) vs torch.matmul, bf16 ==")
    header()
    shapes = R4_SMOKE_MM if r4.smoke else [(s, s, s) for s in SQUARE] + LLM
    ratios = []
    for M, N, K in shapes:
        got = _r4_mm_shape(r4, M, N, K)
        if got:
            ratios.append(got)
    if ratios:
        emit("== round 4 (a) ratios (torch ms / ours) ==")
        for r, sh, cfg in ratios:
            emit(f"{sh:>20} {r:6.3f}  {cfg}")
        geo = math.exp(sum(math.log(r) for r, _, _ in ratios) / len(ratios))
        worst = min(ratios)
        emit(
            f"{'geomean':>20} {geo:6.3f} over {len(ratios)} shapes; worst {worst[1]} {worst[0]:.3f}"
        )


def _r4_mm_shape(r4, M, N, K):
    a, b, sh, flops, nbytes, check = _checked_case(M, N, K, torch.bfloat16, r4.dev, r4.smoke)
    kw = {"path": "tma"} if r4.smoke else {}
    base = None
    if not r4.smoke:
        base = r4.run(sh, "torch", lambda: a @ b, check, flops, nbytes, None)
    ms = r4.run(sh, "shipped (hd)", lambda: km.fused_matmul(a, b, **kw)[0], check, flops, nbytes,
                base, lambda: r3_config_str({}))  # fmt: skip
    if ms and base:
        return base / ms, sh, r3_config_str({})
    return None


def _r4_dz_settings():
    """(name, linear-module overrides) for the dZ+db kernel: shipped, round 3's, round 4's, and
    (round 7) the blocks that `make resources` compiles to 128 registers for gelu instead of the
    shipped 16x512 w4's 167, for more programs per SM (kernels/notes/matmul.md, round 7)."""
    return [
        ("dZ+db shipped", {}),
        ("dZ+db r3 16x128/256r",
         {"DZ_BLOCK_M": 16, "DZ_BLOCK_N": 128, "ACTIVATION_BACKWARD_ROWS": 256}),
        ("dZ+db 64x256 w8", {"DZ_BLOCK_M": 64, "DZ_BLOCK_N": 256, "DZ_NUM_WARPS": 8}),
        ("dZ+db 16x512 w8", {"DZ_BLOCK_M": 16, "DZ_BLOCK_N": 512, "DZ_NUM_WARPS": 8}),
        ("dZ+db 8x512 w4", {"DZ_BLOCK_M": 8, "DZ_BLOCK_N": 512, "DZ_NUM_WARPS": 4}),
        ("dZ+db 16x256 w4", {"DZ_BLOCK_M": 16, "DZ_BLOCK_N": 256, "DZ_NUM_WARPS": 4}),
    ]  # fmt: skip


def _r4_linbwd(r4):
    """(c) linear bias+gelu backward pieces, 2048x4096x4096: dZ+db settings, dX, dW vs eager."""
    from kernels._common import ACTIVATIONS, direct

    kl = importlib.import_module("kernels.linear")
    emit("== round 4 (c): linear backward pieces, bf16, gelu (ratio = eager ms / ours) ==")
    header()
    M, N, K = (72, 40, 64) if r4.smoke else R4_LINBWD_SHAPE
    gelu = ACTIVATIONS["gelu"]
    gen = torch.Generator(device=r4.dev).manual_seed(M + N + K)
    dt = torch.bfloat16
    x = torch.randn(M, K, device=r4.dev, dtype=dt, generator=gen)
    w = torch.randn(N, K, device=r4.dev, dtype=dt, generator=gen) / math.sqrt(K)
    z = torch.randn(M, N, device=r4.dev, dtype=dt, generator=gen)
    dy = torch.randn(M, N, device=r4.dev, dtype=dt, generator=gen)
    sh = f"{M}x{N}x{K}"
    dz_ref = torch.ops.aten.gelu_backward(dy, z)
    db_ref = dz_ref.float().sum(0)

    def check_dz(out):
        _close_to(dz_ref.float())(out[0])
        _close_to(db_ref)(out[1])

    def eager_dz():
        dz = torch.ops.aten.gelu_backward(dy, z)
        return dz, dz.sum(0)

    nbytes = 3 * M * N * 2
    base = (
        None if r4.smoke else r4.run(sh, "dZ+db eager", eager_dz, lambda _: None, 0.0, nbytes, None)
    )
    for name, overrides in _r4_dz_settings():
        saved = {k: getattr(kl, k) for k in overrides}
        try:
            for k, v in overrides.items():
                setattr(kl, k, v)
            r4.run(sh, name, lambda: kl._activation_backward(dy, z, gelu, True, direct), check_dz,
                   0.0, nbytes, base, lambda: f"rows/program {kl._dz_rows(M, N)}")  # fmt: skip
        finally:
            for k, v in saved.items():
                setattr(kl, k, v)
    kw = {"path": "tma"} if r4.smoke else {}
    pieces = [
        ("dX=dZ W", lambda: dz_ref @ w, lambda: km.fused_matmul(dz_ref, w, **kw)[0],
         (dz_ref.float() @ w.float())),
        ("dW=dZ^T X", lambda: dz_ref.t() @ x, lambda: km.fused_matmul(dz_ref.t(), x, **kw)[0],
         (dz_ref.float().t() @ x.float())),
    ]  # fmt: skip
    for name, eager, ours, ref in pieces:
        flops, nb = 2.0 * M * N * K, (M * N + N * K + M * K) * 2
        b2 = (
            None
            if r4.smoke
            else r4.run(sh, f"{name} eager", eager, lambda _: None, flops, nb, None)
        )
        r4.run(sh, f"{name} ours", ours, _close_to(ref), flops, nb, b2, lambda: r3_config_str({}))


def r4_sms():
    """The GPU's SM count (None without one)."""
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).multi_processor_count


def _r4_linear_variants(M, N, K):
    """(name, act, bias?, meta or None) for the linear forward at (M, N, K): the shipped tile
    with gelu, bias only, no epilogue and gelu_tanh; then explicit tiles with gelu."""
    tiles = []
    if M > 128:
        tiles = [
            ("128x128s4", _meta(128, 128, 64, 4, 8)),
            ("128x256s3S", _meta(128, 256, 64, 3, 8, True)),
            ("128x256s4S", _meta(128, 256, 64, 4, 8, True)),
            ("128x128s3S-2cta", km._r3_meta((128, 128, 64, 3, 8, True), ctas_per_sm=2)),
            ("128x128s2S-2cta", km._r3_meta((128, 128, 64, 2, 8, True), ctas_per_sm=2)),
        ]
    out = [("shipped gelu", "gelu", True, None), ("shipped bias only", "none", True, None),
           ("shipped gemm only", "none", False, None),
           ("shipped gelu_tanh", "gelu_tanh", True, None)]  # fmt: skip
    # the bias starting the accumulator (kernels.matmul.BIAS_IN_ACC): fewer epilogue registers
    shipped = km.hd_config(M, N, K, 132 if r4_sms() is None else r4_sms())
    out += [("shipped gelu biasacc", "gelu", True, {**shipped, "BIAS_IN_ACC": True}),
            ("shipped bias biasacc", "none", True, {**shipped, "BIAS_IN_ACC": True})]  # fmt: skip
    out += [(f"{n} gelu", "gelu", True, m) for n, m in tiles]
    if tiles:  # the two best plain-matmul tiles without the epilogue activation too
        out += [(f"{n} bias only", "none", True, m) for n, m in tiles[:2]]
    out.append(("autotune gelu", "gelu", True, "autotune"))
    return out


def _r4_linear(r4):
    """(b) linear forward, x @ W^T (+ bias, activation) through fused_matmul with W^T as a
    K-major B, as linear_forward calls it: variants vs eager F.linear (+ activation); then
    forward + backward vs eager autograd."""

    emit("== round 4 (b): linear forward variants (no grad) vs eager, bf16; then fwd_bwd ==")
    header()
    # 2048x4096x4096 first (round 3's 0.86), the decode shape last (fewest new questions)
    for M, N, K in R4_SMOKE_LINEAR if r4.smoke else LINEAR[1:] + LINEAR[:1]:
        _r4_linear_shape(r4, M, N, K)


def _r4_linear_shape(r4, M, N, K):
    from kernels._common import ACTIVATIONS

    dt = torch.bfloat16
    gen = torch.Generator(device=r4.dev).manual_seed(M + N)
    x = torch.randn(M, K, device=r4.dev, dtype=dt, generator=gen)
    w = torch.randn(N, K, device=r4.dev, dtype=dt, generator=gen) / math.sqrt(K)
    bias = torch.randn(N, device=r4.dev, dtype=dt, generator=gen)
    sh = f"{M}x{N}x{K}"
    flops, nbytes = 2.0 * M * N * K, (M * K + N * K + M * N) * 2
    zf = x.float() @ w.float().t()
    refs = {
        ("none", False): zf,
        ("none", True): zf + bias.float(),
        ("gelu", True): F.gelu(zf + bias.float()),
        ("gelu_tanh", True): F.gelu(zf + bias.float(), approximate="tanh"),
    }
    eager = {
        ("none", False): lambda: x @ w.t(),
        ("none", True): lambda: F.linear(x, w, bias),
        ("gelu", True): lambda: F.gelu(F.linear(x, w, bias)),
        ("gelu_tanh", True): lambda: F.gelu(F.linear(x, w, bias), approximate="tanh"),
    }
    bases = {}
    with torch.no_grad():
        if not r4.smoke:
            for key, fn in eager.items():
                name = f"eager {key[0]}" + ("" if key[1] else " nobias")
                bases[key] = r4.run(sh, name, fn, _close_to(refs[key]), flops, nbytes, None)
        for name, act, has_bias, meta in _r4_linear_variants(M, N, K):
            kw = {"path": "tma"} if r4.smoke else {}
            if meta == "autotune":
                kw["variant"] = "autotune"
            elif meta is not None:
                kw.update(variant="hd", config=meta)
            fn = lambda act=act, hb=has_bias, kw=kw: km.fused_matmul(  # noqa: E731
                x, w.t(), bias if hb else None, ACTIVATIONS[act], False, **kw
            )[0]
            if meta == "autotune":
                cfg = lambda: "default " + cfg_str(km.matmul_tma_kernel)  # noqa: E731
            else:
                cfg = lambda: r3_config_str({})  # noqa: E731
            r4.run(sh, name, fn, _close_to(refs[(act, has_bias)]), flops, nbytes,
                   bases.get((act, has_bias)), cfg)  # fmt: skip
    del zf, refs
    # forward + backward through autograd (the shipped defaults), against eager
    if r4.smoke:
        xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, bias))
        linear(xg, wg, bg, "gelu").sum().backward()
        zb = x.float() @ w.float().t() + bias.float()
        want = torch.ops.aten.gelu_backward(torch.ones(M, N), zb).sum(0)
        torch.testing.assert_close(bg.grad.float(), want, rtol=3e-2, atol=3e-2)
        emit(f"{sh:>20} {'fwd_bwd':<22} ok (checked)")
        return
    if not r4.over():
        try:
            _r4_fwd_bwd(M, N, K, x, w, bias, r4)
        except Exception as exc:  # noqa: BLE001
            emit(f"{sh:>20} fwd_bwd FAILED {type(exc).__name__}: {exc}")


def _r4_fwd_bwd(M, N, K, x, w, b, r4):
    gen = torch.Generator(device=r4.dev).manual_seed(M + N + 1)
    dy = torch.randn(M, N, device=r4.dev, dtype=x.dtype, generator=gen)
    (xg, wg, bg), eager_fn, ours_fn = fwd_bwd_steps(x, w, b, dy)
    eager_fn()
    grads = {n: t.grad.double() for n, t in zip("xwb", (xg, wg, bg), strict=True)}

    def check_grads(_):
        for n, t in zip("xwb", (xg, wg, bg), strict=True):
            ref = grads[n]
            torch.testing.assert_close(
                t.grad.double(), ref, rtol=3e-2, atol=3e-2 * ref.abs().mean().item()
            )

    sh = f"{M}x{N}x{K}"
    flops, nbytes = 6.0 * M * N * K, 3 * (M * K + N * K + M * N) * 2
    base = r4.run(sh, "fwd_bwd eager", eager_fn, lambda _: None, flops, nbytes, None)
    r4.run(sh, "fwd_bwd ours", ours_fn, check_grads, flops, nbytes, base)


def section_round4(smoke=False, budget_s=R4_BUDGET_S, parts="acb"):
    """Round 4 in one run, most important first: (a) the shipped matmul default on the 19
    shapes, (c) the linear backward pieces (the new dZ+db kernel), (b) linear forward variants
    and fwd_bwd; `parts` picks some of them. One budget for all: variants not started by
    budget_s are SKIPPED."""
    r4 = _R4(budget_s, smoke)
    if smoke:
        emit("# round 4 SMOKE: interpreter, checks only, no timings")
    for name, part in [("a", _r4_mm), ("c", _r4_linbwd), ("b", _r4_linear)]:
        if name not in parts:
            continue
        t0 = time.time()
        try:
            part(r4)
        except Exception as exc:  # noqa: BLE001
            emit(f"round 4 ({name}) FAILED: {type(exc).__name__}: {exc}")
            if "-v" in sys.argv:
                traceback.print_exc()
        emit(f"-- round 4 ({name}): {time.time() - t0:.1f} s")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer shapes and variants")
    parser.add_argument("--shapes", help="MxNxK list (or one size for a cube) for mm/splitk/linear")
    parser.add_argument(
        "--sections",
        default="host,mm,sweep,dtypes,linear",
        help="comma list of host, mm, splitk, sweep, flags, dtypes, linear, round3, linbwd, round4",
    )
    parser.add_argument("-v", action="store_true", help="tracebacks for failures")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="round3 on tiny shapes in the interpreter, checks only (TRITON_INTERPRET=1, no GPU)",
    )
    parser.add_argument(
        "--r3-budget",
        type=float,
        default=R3_BUDGET_S,
        help="seconds after which round3 starts no more variants (default %(default)s)",
    )
    parser.add_argument(
        "--r4-budget",
        type=float,
        default=R4_BUDGET_S,
        help="seconds after which round4 starts no more variants (default %(default)s)",
    )
    parser.add_argument(
        "--r4-parts",
        default="acb",
        help="which parts of round4 to run, e.g. c for the dZ+db settings only (default acb)",
    )
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    if args.smoke or (
        not torch.cuda.is_available() and sections <= {"round3", "round4", "round8"}
    ):
        if not km.is_interpreter():
            sys.exit("the smoke run needs TRITON_INTERPRET=1 set before Python starts")
        t0 = time.time()
        if "round4" in sections:
            section_round4(smoke=True, parts=args.r4_parts)
        if "round3" in sections:
            section_round3(args.quick, smoke=True)
        if "round8" in sections:
            section_round8(smoke=True)
        emit(f"-- smoke: {time.time() - t0:.1f} s")
        return
    if not torch.cuda.is_available():
        sys.exit("probe_matmul needs a CUDA GPU (or TRITON_INTERPRET=1 and --smoke)")
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
        ("host", section_host),
        ("mm", lambda: section_mm(mm_shapes, args.quick)),
        ("sweep", lambda: section_sweep(args.quick)),
        ("splitk", lambda: section_splitk(mm_shapes)),
        ("flags", lambda: section_flags(args.quick)),
        ("dtypes", lambda: section_dtypes(args.quick)),
        ("linear", lambda: section_linear(linear_shapes)),
        ("round3", lambda: section_round3(args.quick, budget_s=args.r3_budget)),
        ("linbwd", section_linbwd),
        ("round4", lambda: section_round4(budget_s=args.r4_budget, parts=args.r4_parts)),
        ("round8", section_round8),
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
