"""Measure one shape in one mode: the same method for every mode, eager included.

Order, per shape: build the module and inputs outside any timed region; time the first call
(compile and autotune) cold and, after a reset, warm; check correctness against float64 on fresh
inputs; warm up; then time GPU time and call latency in interleaved (mode, eager) pairs on the
same inputs. Anything that raises becomes a failed row; the caller moves on to the next shape.
"""

import copy
import gc
import logging
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from experiments import faults, modes, timing
from experiments.blocks import fused_attention_rewrites
from experiments.correctness import allowed_error, relative_error, tolerance
from experiments.records import Record
from experiments.registry import eager_ops
from experiments.workloads import Workload
from kernels._common import TUNING_LOG, reset_tuning

log = logging.getLogger(__name__)


@dataclass
class Job:
    """Everything one Hydra job fixes: what runs, how it is timed, where code goes."""

    cfg: object  # the resolved Hydra config
    workload: Workload
    device: torch.device
    dtype: torch.dtype
    peaks: dict | None
    code_dir: object  # Path for Inductor's generated code, or None
    shape_set: str
    timer: timing.GpuTimer | None
    job_id: str
    config_hash: str | None = None

    @property
    def bench(self):
        return self.cfg.bench

    @property
    def fwd_bwd(self) -> bool:
        return self.cfg["pass"].name == "fwd_bwd"


def base_record(job: Job, shape: dict) -> Record:
    cfg = job.cfg
    names = getattr(job.workload, "parameter_names", None)  # a whole model's, without building it
    static = names(shape) if names else [
        name for name, _ in job.workload.make_module(shape, eager_ops()).named_parameters()]
    if cfg.bench.static_inputs:
        static += list(job.workload.input_names)
    return Record(
        kernel=job.workload.name,
        mode=cfg.mode.name,
        shape=dict(shape),
        shape_label=job.workload.label(shape),
        shape_set=job.shape_set,
        dtype=cfg.dtype.name,
        pass_=cfg["pass"].name,
        tf32=bool(cfg.dtype.tf32),
        device=str(job.device),
        static_inputs=static,
        run_name=cfg.name,
        job_id=job.job_id,
        config_hash=job.config_hash,
    )


def skipped_record(job: Job, shape: dict, reason: str) -> Record:
    """The row of a shape that this job's mode cannot run (experiments.registry.unsupported)."""
    record = base_record(job, shape)
    record.status, record.reason = "skipped", reason
    return record


def grad_output(eager, inputs, generator) -> torch.Tensor:
    """A random dY for a training step, in the output's layout (a channels_last conv's dY is
    channels_last in a real network)."""
    with torch.no_grad():
        example = eager(*inputs)
    values = torch.randn(example.shape, generator=generator, device=example.device)
    return torch.empty_like(example).copy_(values)


def make_step(module, inputs, grad_out, grad_tensors, cudagraphs) -> Callable:
    """The zero-argument closure that every timer calls: one forward (and backward)."""

    def step():
        if cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        if grad_out is None:
            return module(*inputs)
        for t in grad_tensors:  # like zero_grad(set_to_none=True): no accumulation kernel
            t.grad = None
        out = module(*inputs)
        out.backward(grad_out)
        return out

    return step


def outputs_of(step, inputs, params, fwd_bwd) -> list[torch.Tensor]:
    """The tensors correctness compares: the output, and for fwd_bwd every gradient."""
    out = step().detach().clone()
    if not fwd_bwd:
        return [out]
    tensors = (*inputs, *params)
    if missing := [i for i, t in enumerate(tensors) if t.grad is None]:
        # a mode whose ops record no autograd history for some tensor (a peer library's kernel
        # without a backward, say): say so, rather than fail on the missing gradient below
        raise RuntimeError(
            f"fwd_bwd left no gradient on {len(missing)} of the {len(tensors)} tensors that "
            f"require one (inputs then parameters, indices {missing}): the mode's forward "
            "recorded no autograd history for them"
        )
    return [out] + [t.grad.detach().clone() for t in tensors]


def reference_outputs(eager, inputs, grad_out, fwd_bwd) -> list[torch.Tensor]:
    """The same computation in float64 on the same (already rounded) values."""
    ref_module = copy.deepcopy(eager).to(torch.float64)
    ref_inputs = [t.detach().to(torch.float64).requires_grad_(fwd_bwd) for t in inputs]
    with torch.set_grad_enabled(fwd_bwd):
        out = ref_module(*ref_inputs)
        if not fwd_bwd:
            return [out]
        out.backward(grad_out.to(torch.float64))
    return [out.detach()] + [t.grad for t in (*ref_inputs, *ref_module.parameters())]


def refill(tensors, generator) -> None:
    """New random values written in place, so compiled graphs and static buffers stay valid."""
    with torch.no_grad():
        for t in tensors:
            t.copy_(torch.randn(t.shape, generator=generator, device=t.device))


def counter_totals() -> tuple[int, int]:
    counters = torch._dynamo.utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def root_exception(exc: BaseException) -> BaseException:
    """The innermost exception of exc's __cause__ / __context__ chain: what went wrong, where a
    wrapper such as torch._dynamo's BackendCompilerFailed says only where it surfaced."""
    seen = {id(exc)}
    while True:
        inner = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
        inner = inner or getattr(exc, "inner_exception", None)  # BackendCompilerFailed's own
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner


def failure_reason(exc: BaseException, limit: int = 500) -> str:
    """A failed row's reason: the root exception's type and the first non-empty line of its
    message, then, where a wrapper differs, ' (via <wrapper type>)'; at most `limit` chars."""
    root = root_exception(exc)
    lines = [line.strip() for line in str(root).splitlines() if line.strip()]
    # Inductor's compile workers send back their traceback as text (SubprocException.details):
    # its last line is the worker's own exception, where the first says only that one occurred
    details = getattr(root, "details", None)
    remote = [line.strip() for line in details.splitlines() if line.strip()] if isinstance(
        details, str) else []  # fmt: skip
    if remote:
        lines = [f"{lines[0].rstrip(':')}: {remote[-1]}" if lines else remote[-1]]
    reason = f"{type(root).__name__}: {lines[0]}" if lines else type(root).__name__
    via = f" (via {type(exc).__name__})" if root is not exc else ""
    if len(reason) + len(via) > limit:
        reason = reason[: max(0, limit - len(via) - 3)] + "..."
    return reason + via


def measure_shape(job: Job, shape: dict, index: int, progress: Callable[[str], None],
                  body: Callable | None = None) -> Record:  # fmt: skip
    """One row for `shape`, the `index`-th of the job's shape set; `body` measures it (this
    module's op measurement, or experiments.model_measure's for a whole model)."""
    record = base_record(job, shape)
    record.stage = "build"
    tuned_before = len(TUNING_LOG)
    reset_tuning()
    try:
        (body or _measure)(job, shape, index, record, progress)
    except Exception as exc:  # OOM, compile error, kernel error: one failed row, then move on
        record.status = "failed"
        record.reason = failure_reason(exc)
        log.warning(
            "%s %s failed at %s: %s", record.mode, record.shape_label, record.stage, record.reason
        )
    finally:
        # configs a kernel chose by timing them during this row (softmax's first call)
        record.notes.extend(TUNING_LOG[tuned_before:])
        torch.compiler.reset()
        gc.collect()
        if job.device.type == "cuda":
            try:
                torch.cuda.empty_cache()
            except RuntimeError:  # a lost CUDA context: the row says so and the job stops
                pass
    return record


def _measure(job: Job, shape, index: int, record: Record, progress) -> None:
    cfg, workload, device, bench = job.cfg, job.workload, job.device, job.bench
    fwd_bwd = job.fwd_bwd

    # ---- build: module, inputs and the closures, all outside any timed region ----
    progress("build")
    torch.compiler.reset()
    torch._dynamo.utils.counters.clear()
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    eager = workload.make_module(shape, eager_ops()).to(device=device, dtype=job.dtype)
    workload.init_parameters(eager, generator)
    params = list(eager.parameters())
    inputs = workload.make_inputs(shape, job.dtype, device, generator)
    for t in (*params, *inputs):
        t.requires_grad_(fwd_bwd)
    if bench.static_inputs and device.type == "cuda":
        for t in inputs:
            torch._dynamo.mark_static_address(t)
    grad_out = grad_output(eager, inputs, generator) if fwd_bwd else None
    grad_tensors = [*inputs, *params]
    random_tensors = [*params, *inputs] + ([grad_out] if fwd_bwd else [])  # refilled per seed

    faults.inject(cfg.get("fault"), index)

    def build_step():
        impl = modes.build(cfg.mode, cfg.compile, eager, inputs)
        module = impl.module
        if faults.fires(cfg.get("fault"), index, "nan_output"):
            module = faults.nan_output(module)
        return impl, make_step(module, inputs, grad_out, grad_tensors, impl.cudagraphs)

    impl, step = build_step()
    eager_step = make_step(eager, inputs, grad_out, grad_tensors, cudagraphs=False)

    # ---- compile: first call cold (and Inductor's code), then warm after a reset ----
    if cfg.mode.kind != "eager":
        record.stage = "compile"
        progress("compile")
        if impl.compiled and job.code_dir is not None:
            from torch._inductor.utils import run_and_get_code

            (_, record.compile_cold_s), codes = run_and_get_code(timing.first_call_s, step, device)
            save_code(job.code_dir, record.shape_label, codes)
        else:
            _, record.compile_cold_s = timing.first_call_s(step, device)
        record.graph_breaks = counter_totals()[1] if impl.compiled else None
        record.fused_attention = fused_attention_rewrites() > 0 if impl.compiled else None
        if impl.compiled:
            torch.compiler.reset()
            impl, step = build_step()
            _, record.compile_warm_s = timing.first_call_s(step, device)

    # ---- correctness on fresh inputs, before any timing ----
    record.stage = "correctness"
    progress("correctness")
    record.tolerance = tolerance(cfg.dtype.name, bool(cfg.dtype.tf32))
    worst = 0.0
    for i in range(bench.correctness_seeds):
        seeded = torch.Generator(device=device).manual_seed(cfg.seed + 1 + i)
        refill(random_tensors, seeded)
        got = outputs_of(step, inputs, params, fwd_bwd)
        want = reference_outputs(eager, inputs, grad_out, fwd_bwd)
        if i == 0:  # eager's own error on these inputs (experiments.correctness.allowed_error)
            baseline = outputs_of(eager_step, inputs, params, fwd_bwd)
            eager_error = max(relative_error(b, r) for b, r in zip(baseline, want, strict=True))
            record.tolerance = allowed_error(record.tolerance, eager_error)
        for out, ref in zip(got, want, strict=True):
            if not torch.isfinite(out).all():
                raise_correctness(record, "output has NaN or inf", worst)
            if out.count_nonzero() == 0:
                raise_correctness(record, "output is all zeros", worst)
            worst = max(worst, relative_error(out, ref))
        record.seeds_checked = i + 1
    record.max_rel_err = worst
    if worst > record.tolerance:
        raise_correctness(
            record, f"relative error {worst:.3g} > tolerance {record.tolerance:.3g}", worst
        )
    refill(random_tensors, torch.Generator(device=device).manual_seed(cfg.seed))

    # ---- warm up, then time: latency first, since it sizes the GPU timer's lead ----
    record.stage = "timing"
    progress("warmup")
    for _ in range(bench.min_warmup_calls):
        step()
        eager_step()
    timing.synchronize(device)
    graphs_before, breaks_before = counter_totals()

    progress("call latency")
    latency = timing.call_latency_us(step, device, bench.latency_calls)
    eager_latency = timing.call_latency_us(eager_step, device, bench.latency_calls)
    record.call_latency_us_p50 = latency["p50"]
    record.call_latency_us_p20, record.call_latency_us_p80 = latency["p20"], latency["p80"]
    record.eager_call_latency_us_p50 = eager_latency["p50"]
    record.latency_speedup_vs_eager = eager_latency["p50"] / latency["p50"]

    mode_runs, eager_runs = [], []
    slowest_enqueue_us = max(latency["enqueue_p80"], eager_latency["enqueue_p80"])
    for r in range(bench.repeats):
        progress(f"time pair {r + 1}/{bench.repeats}")
        mode_runs.append(time_once(job, step, slowest_enqueue_us, record))
        eager_runs.append(time_once(job, eager_step, slowest_enqueue_us, record))
    middle = sorted(mode_runs, key=lambda run: run["p50"])[len(mode_runs) // 2]
    record.time_ms_p50, record.time_ms_p20, record.time_ms_p80 = (
        middle["p50"],
        middle["p20"],
        middle["p80"],
    )
    record.eager_time_ms_p50 = sorted(run["p50"] for run in eager_runs)[len(eager_runs) // 2]
    record.speedup_vs_eager = record.eager_time_ms_p50 / record.time_ms_p50
    record.repeat_spread = max(
        spread([run["p50"] for run in runs]) for runs in (mode_runs, eager_runs)
    )
    record.noisy = record.repeat_spread > bench.noisy_threshold

    if device.type == "cuda":
        progress("do_bench")
        plain = timing.do_bench_ms(step, bench.warmup_ms, bench.rep_ms)
        record.do_bench_ms_p50, record.do_bench_ms_p20, record.do_bench_ms_p80 = (
            plain["p50"],
            plain["p20"],
            plain["p80"],
        )
        # eager's own reading: where a call's host path outlasts its GPU time (a training step
        # at small sizes) do_bench reads the host path, eager's as well as ours
        record.eager_do_bench_ms_p50 = timing.do_bench_ms(
            eager_step, bench.warmup_ms, bench.rep_ms)["p50"]  # fmt: skip
        if bench.cudagraph_replay:
            progress("cudagraph replay")
            record.cudagraph_ms = graph_replay(step, impl, bench, record, "mode")
            record.eager_cudagraph_ms = graph_replay(
                eager_step, modes.Impl(eager), bench, record, "eager"
            )

    graphs_after, breaks_after = counter_totals()
    record.recompiles_during_timing = graphs_after - graphs_before
    record.graph_breaks_during_timing = breaks_after - breaks_before
    if record.recompiles_during_timing or record.graph_breaks_during_timing:
        record.notes.append("recompiled or broke the graph while being timed")

    progress("memory")
    record.peak_mem_mb = timing.peak_memory_mb(step, device)
    derive(job, shape, record)
    if job.timer is not None and record.min_bytes:
        progress("same-bytes copy")
        record.copy_ms_same_bytes = same_bytes_copy_ms(job, record.min_bytes)
        record.pct_copy_same_bytes = 100 * record.copy_ms_same_bytes / record.time_ms_p50
    record.stage = None


def time_once(job: Job, fn, enqueue_us: float, record: Record) -> dict:
    bench = job.bench
    if job.timer is None:
        result = timing.cpu_time_ms(fn, bench.warmup_ms, bench.rep_ms)
        record.timer = result.get("timer", "cpu-wall")  # cpu-thread-time with one thread
        return result
    record.timer = "cuda-events-l2flush" if bench.flush_l2 else "cuda-events"
    result = job.timer.measure(fn, bench.warmup_ms, bench.rep_ms, lead_us=1.5 * enqueue_us + 20)
    if result["lead_retries"]:
        record.notes.append(
            f"GPU timer lead raised to {result['lead_us']:.0f} us ({result['lead_retries']}x): "
            "the CPU path of some calls outlasted the first lead"
        )
    if result["lead_miss_share"] > timing.LEAD_MISS_SHARE:
        record.notes.append(
            f"{100 * result['lead_miss_share']:.0f}% of samples outlasted the GPU timer's lead "
            f"of {result['lead_us']:.0f} us: their GPU time may include idle time"
        )
    return result


def graph_replay(fn, impl, bench, record: Record, who: str) -> float | None:
    if impl.cudagraphs:
        return None  # already a CUDA graph: its GPU time is its replay time
    try:
        return timing.cudagraph_ms(fn, bench.rep_ms)
    except Exception as exc:
        record.notes.append(f"{who} CUDA-graph capture failed: {type(exc).__name__}: {exc}"[:300])
        return None


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def raise_correctness(record: Record, reason: str, worst: float):
    record.max_rel_err = worst if worst else None
    raise AssertionError(f"correctness: {reason}")


# (device, bytes copied) -> GPU ms: same_bytes_copy_ms's readings, one per size a process
_COPY_MS: dict = {}
COPY_LEAD_US = 30.0  # a copy's host path is a few us: the timer's lead for it


def same_bytes_half(min_bytes: float) -> int:
    """The bytes a same-bytes copy reads (and writes): min_bytes / 2 in 16-byte multiples, as a
    kernel's vector loads."""
    return max(16, int(min_bytes) // 32 * 16)


def same_bytes_buffers(min_bytes: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, destination) of the copy that reads and writes same_bytes_half(min_bytes): a
    memory-bound row's own-size roofline (also experiments.tile_probe's)."""
    src = torch.empty(same_bytes_half(min_bytes), dtype=torch.uint8, device=device).random_()
    return src, torch.empty_like(src)


def same_bytes_copy_ms(job: Job, min_bytes: float) -> float:
    """GPU ms of a device-to-device copy that reads min_bytes / 2 and writes as many, timed by
    the job's timer as its rows are: the bandwidth roofline of a memory-bound row at its own
    size. The 1 GiB copy of the device's peaks (pct_peak_bw) is out of reach for a kernel that
    moves a few MB, where a copy too spends much of its time starting and draining."""
    key = (str(job.device), same_bytes_half(min_bytes))
    if key not in _COPY_MS:
        src, dst = same_bytes_buffers(min_bytes, job.device)
        bench = job.bench
        result = job.timer.measure(lambda: dst.copy_(src), bench.warmup_ms, bench.rep_ms,
                                   lead_us=COPY_LEAD_US)  # fmt: skip
        _COPY_MS[key] = result["p50"]
    return _COPY_MS[key]


def derive(job: Job, shape: dict, record: Record) -> None:
    """FLOP/s and bytes/s from analytic costs, and their share of the device's measured peaks."""
    workload, seconds = job.workload, record.time_ms_p50 * 1e-3
    pass_name = record.pass_
    record.flops = workload.flops(shape, pass_name)
    record.min_bytes = workload.min_bytes(shape, pass_name, job.dtype.itemsize)
    record.tflops = record.flops / seconds / 1e12
    record.gbps = record.min_bytes / seconds / 1e9
    if job.peaks:
        record.pct_peak_flops = 100 * record.tflops / job.peaks["bf16_matmul_tflops"]
        record.pct_peak_bw = 100 * record.gbps / job.peaks["copy_gbps"]


def save_code(code_dir, shape_label: str, codes: list[str]) -> None:
    for i, code in enumerate(codes):
        path = code_dir / f"{shape_label}_{i}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
