"""The timers, kept apart on purpose because they answer different questions.

- GPU time (`GpuTimer`): how long the device is busy with one call. CUDA events around each call,
  L2 flushed before it as in triton's do_bench. Before each sample a sleep kernel holds the GPU
  while the CPU enqueues the flush and the call, so the call's Python, guard and launch path is
  hidden and never counted as GPU time. Without that lead, a compiled or CUDA-graph-tree call whose
  CPU path outlasts its kernels would be charged for the idle GPU (triton's plain do_bench does
  exactly that, and is recorded beside ours as `do_bench_ms_*` to show the difference).
- CUDA-graph replay time (`cudagraph_ms`): triton's do_bench_cudagraph, the floor with no launch
  overhead at all, for modes that are not CUDA graphs already.
- Call latency (`call_latency_us`): wall-clock per call over back-to-back calls with one final
  sync: what a Python caller waits, CPU overhead included. This is what reduce-overhead cuts.

On a CPU device there is no separate GPU queue: `cpu_time_ms` is torch.utils.benchmark's
blocked_autorange on a fixed thread count (docs/methodology.md, "CPU timings").
"""

import time

import numpy as np
import torch

from kernels._timing import event_samples, flush_buffer, sleep_cycles

QUANTILES = (50, 20, 80)
MAX_SAMPLES = 1000
MAX_LEAD_US = 20_000.0  # the sleep lead's cap: 20 ms of idle GPU per sample
LEAD_MISS_SHARE = 0.05  # share of samples whose CPU time may outlast the lead before a retake
LEAD_RETRIES = 2


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(samples_ms) -> dict:
    p50, p20, p80 = np.percentile(np.asarray(samples_ms, dtype=np.float64), QUANTILES)
    return {"p50": float(p50), "p20": float(p20), "p80": float(p80), "samples": len(samples_ms)}


def first_call_s(fn, device) -> tuple[object, float]:
    """Wall time of one call, synchronized: the compile (and autotune) cost when it is the first."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def call_latency_us(fn, device, calls: int, samples: int = 5) -> dict:
    """Per-call wall time over `calls` back-to-back calls and one final sync (in microseconds).

    Also returns `enqueue_p80`: the CPU's own time per call (before the final sync), which sizes
    GpuTimer's lead.
    """
    per_call_us, enqueue_us = [], []
    for _ in range(samples):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        enqueued = time.perf_counter()
        synchronize(device)
        per_call_us.append((time.perf_counter() - start) / calls * 1e6)
        enqueue_us.append((enqueued - start) / calls * 1e6)
    return {**summarize(per_call_us), "enqueue_p80": float(np.percentile(enqueue_us, 80))}


def calls_for_budget(estimate_ms: float, budget_ms: float, lowest: int = 3) -> int:
    return int(min(MAX_SAMPLES, max(lowest, budget_ms / max(estimate_ms, 1e-3))))


def cpu_time_ms(fn, warmup_ms: float, rep_ms: float, threads: int | None = None) -> dict:
    """CPU time per call (ms) from torch.utils.benchmark's blocked_autorange.

    The calls run in blocks sized so each block is long against the clock's resolution and the
    timer's own overhead; the samples are the blocks' per-call means, so a call preempted by
    another process spoils one block, and the median over blocks leaves it out. The thread count
    is fixed for the measurement: `threads`, else the job's (experiments.run sets it from
    bench.cpu_threads, 1 by default), so two jobs on a small machine do not oversubscribe it.
    """
    from torch.utils import benchmark

    threads = torch.get_num_threads() if threads is None else threads
    # Warm up for warmup_ms of wall time, not for a count estimated from the first call: a cold
    # first call (allocator, caches, clock ramp) would make the count too small.
    fn()
    deadline = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < deadline:
        fn()
    # One thread: the calling thread's CPU clock, which does not run while another process holds
    # the core, so preemption costs nothing (cache pollution still does). More threads: the wall
    # clock, since the other threads' work is not on this thread's clock.
    clock, name = (time.thread_time, "cpu-thread-time") if threads == 1 else (
        time.perf_counter, "cpu-wall")
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=threads, timer=clock)
    measurement = timer.blocked_autorange(min_run_time=rep_ms / 1e3)
    samples_ms = [t * 1e3 for t in measurement.times]
    return {**summarize(samples_ms), "threads": threads, "timer": name,
            "calls": measurement.number_per_run * len(samples_ms)}


class GpuTimer:
    """Event-timed GPU time per call, with the L2 flushed and the CPU path kept off the clock
    (the samples come from kernels._timing, the timer the kernels' own tuners use)."""

    def __init__(self, device: torch.device, flush_l2: bool):
        self.device = device
        self.flush_l2 = flush_l2
        if flush_l2:
            flush_buffer(device)
        sleep_cycles(1.0)  # calibrate the sleep kernel's clock before any timing

    def measure(self, fn, warmup_ms: float, rep_ms: float, lead_us: float) -> dict:
        """GPU time per call; `lead_us` should exceed the CPU time of one call.

        The CPU time of every sample (from the sleep's enqueue to the end event's) is timed too.
        If more than LEAD_MISS_SHARE of the samples outlasted the lead, the GPU may have idled
        inside their window, so the samples are taken again with a lead sized from what was
        observed (twice the slowest sample, at most MAX_LEAD_US), up to LEAD_RETRIES times. The
        result says which lead was used (`lead_us`), how often it was raised (`lead_retries`) and
        the share of samples that still outlasted it (`lead_miss_share`).
        """
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            fn()
        end.record()
        torch.cuda.synchronize(self.device)
        estimate_ms = start.elapsed_time(end) / 5
        for _ in range(calls_for_budget(estimate_ms, warmup_ms, lowest=1)):
            fn()
        for retry in range(LEAD_RETRIES + 1):
            lead_us = min(lead_us, MAX_LEAD_US)
            n = calls_for_budget(estimate_ms + 0.1 + lead_us / 1e3, rep_ms, lowest=10)
            samples, host_us = event_samples(fn, n, lead_us, flush=self.flush_l2)
            missed = sum(h > lead_us for h in host_us) / n
            if missed <= LEAD_MISS_SHARE or lead_us >= MAX_LEAD_US or retry == LEAD_RETRIES:
                break
            lead_us = 2 * max(host_us) + 50
        return {
            **summarize(samples),
            "lead_us": float(lead_us),
            "lead_retries": retry,
            "lead_miss_share": float(missed),
        }


def do_bench_ms(fn, warmup_ms: float, rep_ms: float) -> dict:
    """triton.testing.do_bench as commonly run: the CPU path counts when it outlasts the flush."""
    import triton.testing

    p50, p20, p80 = triton.testing.do_bench(
        fn, warmup=warmup_ms, rep=rep_ms, quantiles=[q / 100 for q in QUANTILES]
    )
    return {"p50": p50, "p20": p20, "p80": p80}


def cudagraph_ms(fn, rep_ms: float) -> float:
    import triton.testing

    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))


def peak_memory_mb(fn, device: torch.device, calls: int = 3) -> float | None:
    """Peak allocation during `calls` calls, above what was allocated before them."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    for _ in range(calls):
        fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - baseline) / 2**20
