"""The one GPU timer: event-timed calls behind a sleep kernel, with the L2 flushed before each.

Two users share it: the first-call tuners inside the kernels (softmax's candidates, conv's
autotuner), and the benchmark's timer (experiments.timing.GpuTimer), which adds warm-up and
its lead checks on top. A sleep kernel holds the GPU while the CPU enqueues the calls, so the
Python path of a call is off the clock; triton's do_bench times each call between two events
and counts that path whenever it outlasts the kernel.

Functions:
    sleep_cycles(us)          GPU clock cycles for torch.cuda._sleep to hold the GPU `us` us
    flush_buffer(device)      the L2 flush buffer of a device (FLUSH_BYTES, made once)
    event_samples(...)        per-call GPU times (ms) and host enqueue times (us)
    gpu_ms_flushed(fn, calls) median GPU time of one flushed call, one lead for the batch
    gpu_ms_per_call(fn, calls) GPU time per call over a back-to-back batch (no flush)
"""

import time
from collections.abc import Callable

import torch

# An L2 flush: a write over more bytes than any current L2 holds (H100: 50 MB, H200: 60 MB), the
# size triton's do_bench flushes with too.
FLUSH_BYTES = 256 * 1024 * 1024

_CYCLES_PER_US: list[float] = []
_FLUSH_BUFFERS: dict = {}


def sleep_cycles(us: float) -> int:
    """GPU clock cycles for torch.cuda._sleep to hold the GPU about `us` microseconds (the clock
    is calibrated once a process)."""
    if not _CYCLES_PER_US:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        cycles = 10_000_000
        torch.cuda._sleep(1000)  # load the sleep kernel before timing it
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        torch.cuda.synchronize()
        _CYCLES_PER_US.append(cycles / (start.elapsed_time(end) * 1e3))
    return int(us * _CYCLES_PER_US[0])


def flush_buffer(device) -> torch.Tensor:
    device = torch.device(device)
    index = torch.cuda.current_device() if device.index is None else device.index
    if index not in _FLUSH_BUFFERS:
        _FLUSH_BUFFERS[index] = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=f"cuda:{index}")
    return _FLUSH_BUFFERS[index]


def event_samples(
    fn: Callable[[], object], n: int, lead_us: float, *, flush: bool = True,
    lead_each: bool = True,
) -> tuple[list[float], list[float]]:  # fmt: skip
    """`n` calls of `fn`, each between its own two events after an L2 flush: their GPU times
    (ms) and the host time (us) from each call's lead to its end event's enqueue. The sleep
    lead comes before every call (lead_each) or once before the whole batch, `n` x lead_us."""
    buffer = flush_buffer(torch.cuda.current_device()) if flush else None
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    host_us = []
    if not lead_each:
        torch.cuda._sleep(sleep_cycles(n * lead_us))
    for i in range(n):
        if lead_each:
            torch.cuda._sleep(sleep_cycles(lead_us))
        queued = time.perf_counter()
        if buffer is not None:
            buffer.zero_()
        starts[i].record()
        fn()
        ends[i].record()
        host_us.append((time.perf_counter() - queued) * 1e6)
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)], host_us


def gpu_ms_flushed(fn: Callable[[], object], calls: int, cpu_us_per_call: float = 100.0) -> float:
    """Median GPU time of one call of `fn` (ms) over `calls` flushed calls, all enqueued behind
    one sleep that holds the GPU while the CPU enqueues them (`cpu_us_per_call` each, at most).
    Back-to-back batches (gpu_ms_per_call) ranked the softmax forward's candidates within 0.1%
    where this ranks them 1% apart (docs/kernels/softmax.md)."""
    fn()
    torch.cuda.synchronize()
    samples, _ = event_samples(fn, calls, cpu_us_per_call, lead_each=False)
    return sorted(samples)[len(samples) // 2]


def gpu_ms_per_call(fn: Callable[[], object], calls: int, cpu_us_per_call: float = 100.0) -> float:
    """GPU time per call of `fn` (ms) over `calls` back-to-back calls, enqueued behind a sleep
    kernel that holds the GPU while the CPU enqueues them all (`cpu_us_per_call` each, at most)."""
    fn()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(sleep_cycles(calls * cpu_us_per_call))
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls
