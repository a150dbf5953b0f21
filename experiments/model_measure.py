"""Measure one whole model in one mode, as experiments/measure.py measures an op, with the
figures PyTorch's compiler dashboard reports per model.

Order, per row: build the library's model (seeded random weights) and its inputs; time the
first call cold and, after a reset, warm (compile and autotune); check accuracy against float64
on fresh inputs, eager's own error beside it; count which calls kernels.enable() routed (the
triton modes); warm up; then call latency, GPU time in interleaved (mode, eager) pairs, plain
do_bench, and peak memory of both. The timers are experiments.timing's, the schema Record's.

A step is one inference (eval forward under no_grad) or one training step: forward, the
cross-entropy loss on random labels (inside the module, so compile modes compile it too),
backward and an SGD step. The first calls and the accuracy check leave the SGD step out, so
every module checked holds the weights the float64 reference is copied from.

Accuracy follows the dashboard (torch._dynamo.utils.same): each tensor (the output, and in
training every weight gradient) passes where it is allclose to eager's at the dtype's tolerance,
or else where its error against the float64 reference, relative (||t - ref|| / ||ref||, the
dashboard's RMSE made scale-free), is at most 3x eager's own (2x in fp32) plus a tenth of the
dtype's tolerance. The ratio to
eager is taken on the output and on all gradients together (the worse of the two): a single
gradient's ratio is noise where both errors are tiny.
"""

import contextlib
import copy
import math
from dataclasses import dataclass

import torch

from experiments import measure, model_modes, models, timing
from experiments.correctness import relative_error, tolerance
from experiments.measure import Job, counter_totals, raise_correctness, spread
from experiments.records import Record

SGD_LR = 1e-4  # small: the timed steps move the random weights little
LATENCY_SAMPLES = 3
FALLBACK_FLAG = 0.5  # a row whose share of calls left to torch passes this is flagged


def measure_model(job: Job, shape: dict, index: int, progress) -> Record:
    return measure.measure_shape(job, shape, index, progress, body=_measure)


def make_step(mode: model_modes.ModelMode, x, labels, optimizer, train: bool, update: bool = True):
    """The zero-argument closure every timer calls: one inference, or one training step."""
    module, context, cudagraphs = mode.module, mode.context, mode.cudagraphs
    params = [p for group in optimizer.param_groups for p in group["params"]] if train else []

    def step():
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        with context():
            if not train:
                with torch.no_grad():
                    return module(x)
            for p in params:  # zero_grad(set_to_none=True): no accumulation kernel
                p.grad = None
            loss = module(x, labels)
            loss.backward()
            if update:
                optimizer.step()
            return loss

    return step


def _trainable(module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def checked_tensors(step, module, train: bool) -> list[torch.Tensor]:
    """The output (the loss in training) and every weight gradient, detached copies."""
    out = step().detach().clone()
    if not train:
        return [out]
    params = _trainable(module)
    if missing := [i for i, p in enumerate(params) if p.grad is None]:
        raise RuntimeError(f"the step left no gradient on {len(missing)} of {len(params)} "
                           "weights")  # fmt: skip
    return [out] + [p.grad.detach().clone() for p in params]


def float64_reference(eager, x, labels, train: bool) -> list[torch.Tensor]:
    ref = copy.deepcopy(eager).to(torch.float64)
    x64 = x.to(torch.float64) if x.is_floating_point() else x
    if not train:
        with torch.no_grad():
            return [ref(x64)]
    loss = ref(x64, labels)
    loss.backward()
    return [loss.detach()] + [p.grad for p in _trainable(ref)]


def _sq_norms(got, want) -> tuple[float, float]:
    diff = sum(float(torch.linalg.vector_norm(g.double() - w.double())) ** 2
               for g, w in zip(got, want, strict=True))  # fmt: skip
    ref = sum(float(torch.linalg.vector_norm(w.double())) ** 2 for w in want)
    return diff, ref


def _ratio(ours: float, eager: float) -> float:
    if ours == 0.0:
        return 0.0
    return ours / eager if eager > 0.0 else math.inf


def multiplier(dtype: torch.dtype) -> float:
    """How many times eager's error a mode may reach: the dashboard's 3 for 16-bit floats (its
    false alarms under AMP at 2), 2 otherwise (torch._dynamo.utils.same)."""
    return 3.0 if dtype in (torch.float16, torch.bfloat16) else 2.0


def _within(got, base, err: float, eager_err: float, tol: float) -> bool:
    """The dashboard's two tests of one tensor: close to eager's own result at the dtype's
    tolerance, or else an error against float64 within `multiplier` x eager's plus tol/10."""
    if got.shape == base.shape and torch.allclose(got.double(), base.double(), rtol=tol, atol=tol):
        return True
    return err <= multiplier(got.dtype) * eager_err + tol / 10


def accuracy(got, base, want, dtype_tolerance: float) -> dict:
    """The dashboard's check of the mode's tensors `got` against float64 `want`, eager's `base`
    beside them (output first, then the weight gradients)."""
    ours = [relative_error(g, w) for g, w in zip(got, want, strict=True)]
    eager = [relative_error(b, w) for b, w in zip(base, want, strict=True)]
    failing = [i for i, (g, b, o, e) in enumerate(zip(got, base, ours, eager, strict=True))
               if not _within(g, b, o, e, dtype_tolerance)]  # fmt: skip
    ratio = _ratio(ours[0], eager[0])
    if len(got) > 1:  # all weight gradients as one vector
        diff, ref = _sq_norms(got[1:], want[1:])
        eager_diff, _ = _sq_norms(base[1:], want[1:])
        ratio = max(ratio, _ratio(math.sqrt(diff / ref), math.sqrt(eager_diff / ref)))
    return {"worst": max(ours), "eager_worst": max(eager), "ratio": ratio, "pass": not failing,
            "failing": failing}


def count_flops(step) -> float | None:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(counter.get_total_flops()) or None


def _census(mode: model_modes.ModelMode, eager, x, labels, optimizer, train) -> dict | None:
    """triton-compiled: kernels.enable(custom_ops=True)'s counts over one step executed eagerly
    (a compiled step's trace routes its calls once, at compile time, and counts none)."""
    if mode.routed != "custom":
        return None
    from kernels import routing

    routing.reset_counts()
    census = model_modes.ModelMode(eager, lambda: routing.enabled(custom_ops=True))
    make_step(census, x, labels, optimizer, train, update=False)()
    counted = routing.counts()
    routing.reset_counts()
    return counted


@dataclass
class Row:
    """What one row builds before anything is timed: the eager model, its inputs and labels, the
    mode, and the steps of both (with and without the SGD update)."""

    workload: models.ModelWorkload
    shape: dict
    eager: models.ModelUnderTest
    x: torch.Tensor
    labels: torch.Tensor
    classes: int
    train: bool
    rebuild: object  # () -> (mode, step, first_step): the mode anew, as after a compiler reset
    mode: model_modes.ModelMode = None
    step: object = None
    first_step: object = None
    eager_step: object = None
    eager_first: object = None
    eager_opt: object = None


def prepare(workload, shape, mode_cfg, compile_cfg, dtype, device, train: bool, seed: int) -> Row:
    generator = torch.Generator(device=device).manual_seed(seed)
    eager = workload.build(shape, seed).to(device=device, dtype=dtype)
    if workload.spec.channels_last:
        eager = eager.to(memory_format=torch.channels_last)
    eager.train(train)
    eager.requires_grad_(train)
    classes = workload.classes(eager)
    (x,) = workload.make_inputs(shape, dtype, device, generator)
    labels = workload.make_labels(shape, classes, device, generator)
    example = (x, labels) if train else (x,)

    def optimizer_of(module):
        return torch.optim.SGD(_trainable(module), lr=SGD_LR) if train else None

    def rebuild():
        mode = model_modes.build_mode(mode_cfg, compile_cfg, eager, example)
        opt = optimizer_of(mode.module)
        return (mode, make_step(mode, x, labels, opt, train),
                make_step(mode, x, labels, opt, train, update=False))  # fmt: skip

    row = Row(workload, shape, eager, x, labels, classes, train, rebuild)
    row.mode, row.step, row.first_step = rebuild()
    eager_mode = model_modes.ModelMode(eager, contextlib.nullcontext)
    row.eager_opt = optimizer_of(eager)
    row.eager_step = make_step(eager_mode, x, labels, row.eager_opt, train)
    row.eager_first = make_step(eager_mode, x, labels, row.eager_opt, train, update=False)
    return row


def refill(row: Row, seed: int) -> None:
    generator = torch.Generator(device=row.x.device).manual_seed(seed)
    row.workload.refill((row.x,), row.labels, row.shape, row.classes, generator)


def check(row: Row, dtype_tolerance: float, seed: int) -> dict:
    """accuracy() of the mode's step against float64 on inputs of `seed`, eager's beside it,
    and the routed calls' counts (`fallbacks`, None for a mode that routes none)."""
    from kernels import routing

    refill(row, seed)
    routing.reset_counts()
    got = checked_tensors(row.first_step, row.mode.module, row.train)
    counted = routing.counts() if row.mode.routed == "triton" else None  # this step's own calls
    base = checked_tensors(row.eager_first, row.eager, row.train)
    want = float64_reference(row.eager, row.x, row.labels, row.train)
    finite = all(bool(torch.isfinite(t).all()) for t in got)
    checked = accuracy(got, base, want, dtype_tolerance)
    checked["finite"] = finite
    checked["fallbacks"] = counted if counted is not None else _census(
        row.mode, row.eager, row.x, row.labels, row.eager_opt, row.train)  # fmt: skip
    return checked


def _measure(job: Job, shape, index: int, record: Record, progress) -> None:
    cfg, workload, device, bench = job.cfg, job.workload, job.device, job.bench

    # ---- build: the model, its inputs and labels, the mode, all outside any timed region ----
    progress("build")
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    row = prepare(workload, shape, cfg.mode, cfg.compile, job.dtype, device, job.fwd_bwd,
                  cfg.seed)  # fmt: skip

    # ---- compile: first call cold, then warm after a reset ----
    if cfg.mode.kind != "eager":
        record.stage = "compile"
        progress("compile")
        _, record.compile_cold_s = timing.first_call_s(row.first_step, device)
        if row.mode.compiled:
            record.graphs_compiled, record.graph_breaks = counter_totals()
            torch.compiler.reset()
            row.mode, row.step, row.first_step = row.rebuild()
            _, record.compile_warm_s = timing.first_call_s(row.first_step, device)

    # ---- accuracy on fresh inputs, before any timing ----
    record.stage = "correctness"
    progress("correctness")
    record.tolerance = tolerance(cfg.dtype.name, bool(cfg.dtype.tf32))
    checked = check(row, record.tolerance, cfg.seed + 1)
    record.seeds_checked = 1
    if not checked["finite"]:
        raise_correctness(record, "output or gradient has NaN or inf", 0.0)
    record.max_rel_err, record.eager_max_rel_err = checked["worst"], checked["eager_worst"]
    record.accuracy_ratio, record.accuracy_pass = checked["ratio"], checked["pass"]
    if not checked["pass"]:
        raise_correctness(record, f"accuracy: tensors {checked['failing'][:5]} (0: the output) "
                          "neither close to eager's nor within the dashboard's multiple of its "
                          "error", checked["worst"])  # fmt: skip
    record.fallbacks = checked["fallbacks"]
    if record.fallbacks is not None:
        from kernels.routing import fallback_share

        record.fallback_share = fallback_share(record.fallbacks)
        if record.fallback_share > FALLBACK_FLAG:
            record.notes.append(f"{100 * record.fallback_share:.0f}% of the routed calls fell "
                                "back to torch")  # fmt: skip
    refill(row, cfg.seed)
    step, eager_step = row.step, row.eager_step

    # ---- warm up, then time ----
    record.stage = "timing"
    progress("warmup")
    for _ in range(bench.min_warmup_calls):
        step()
        eager_step()
    _, estimate_s = timing.first_call_s(step, device)
    timing.synchronize(device)
    graphs_before, breaks_before = counter_totals()

    progress("call latency")
    calls = max(3, min(bench.latency_calls, timing.calls_for_budget(estimate_s * 1e3,
                                                                    bench.rep_ms)))  # fmt: skip
    latency = timing.call_latency_us(step, device, calls, LATENCY_SAMPLES)
    eager_latency = timing.call_latency_us(eager_step, device, calls, LATENCY_SAMPLES)
    record.call_latency_us_p50 = latency["p50"]
    record.call_latency_us_p20, record.call_latency_us_p80 = latency["p20"], latency["p80"]
    record.eager_call_latency_us_p50 = eager_latency["p50"]
    record.latency_speedup_vs_eager = eager_latency["p50"] / latency["p50"]

    mode_runs, eager_runs = [], []
    slowest_enqueue_us = max(latency["enqueue_p80"], eager_latency["enqueue_p80"])
    for r in range(bench.repeats):
        progress(f"time pair {r + 1}/{bench.repeats}")
        mode_runs.append(measure.time_once(job, step, slowest_enqueue_us, record))
        eager_runs.append(measure.time_once(job, eager_step, slowest_enqueue_us, record))
    middle = sorted(mode_runs, key=lambda run: run["p50"])[len(mode_runs) // 2]
    record.time_ms_p50, record.time_ms_p20, record.time_ms_p80 = (
        middle["p50"], middle["p20"], middle["p80"])  # fmt: skip
    record.eager_time_ms_p50 = sorted(run["p50"] for run in eager_runs)[len(eager_runs) // 2]
    record.speedup_vs_eager = record.eager_time_ms_p50 / record.time_ms_p50
    record.repeat_spread = max(spread([run["p50"] for run in runs])
                               for runs in (mode_runs, eager_runs))  # fmt: skip
    record.noisy = record.repeat_spread > bench.noisy_threshold

    if device.type == "cuda":
        progress("do_bench")
        plain = timing.do_bench_ms(step, bench.warmup_ms, bench.rep_ms)
        record.do_bench_ms_p50, record.do_bench_ms_p20, record.do_bench_ms_p80 = (
            plain["p50"], plain["p20"], plain["p80"])  # fmt: skip
        record.eager_do_bench_ms_p50 = timing.do_bench_ms(
            eager_step, bench.warmup_ms, bench.rep_ms)["p50"]  # fmt: skip
    graphs_after, breaks_after = counter_totals()
    record.recompiles_during_timing = graphs_after - graphs_before
    record.graph_breaks_during_timing = breaks_after - breaks_before
    if record.recompiles_during_timing or record.graph_breaks_during_timing:
        record.notes.append("recompiled or broke the graph while being timed")

    progress("memory")
    record.peak_mem_mb = timing.peak_memory_mb(step, device)
    record.eager_peak_mem_mb = timing.peak_memory_mb(eager_step, device)
    if record.peak_mem_mb and record.eager_peak_mem_mb:
        record.peak_mem_ratio = record.peak_mem_mb / record.eager_peak_mem_mb
    record.flops = count_flops(row.eager_first)
    if record.flops:
        record.tflops = record.flops / (record.time_ms_p50 * 1e-3) / 1e12
        if job.peaks:
            record.pct_peak_flops = 100 * record.tflops / job.peaks["bf16_matmul_tflops"]
    record.stage = None
