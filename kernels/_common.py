"""Input checks and small helpers shared by every kernel wrapper.

Each wrapper validates its inputs here, so a bad call fails with one clear ValueError or
TypeError before anything is launched.
"""

import contextlib
import functools
import os
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

# The GPU timer of the first-call tuners, re-exported for the kernels that import it from here.
from kernels._timing import FLUSH_BYTES, gpu_ms_flushed, gpu_ms_per_call  # noqa: F401

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# Activation names accepted by linear and conv2d; the id is the constexpr the kernels branch on.
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}

# The same activations in torch ops: the references and the eager baseline use these.
TORCH_ACTIVATIONS = {
    "none": lambda y: y,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
    "silu": F.silu,
}

# A launcher turns a @triton.jit function into the object that is indexed with a grid and called.
# Direct calls use the kernel itself; the custom ops in kernels/ops.py pass
# torch.library.wrap_triton so that torch.compile can trace the launch without a graph break.
Launcher = Callable


def direct(kernel):
    return kernel


@functools.cache
def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1). Read once:
    `triton.jit` reads it when it decorates a kernel, so a later change would not take effect
    for the kernels anyway."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Host-side integer helpers. triton.cdiv and triton.next_power_of_2 are constexpr_functions, and
# a call from Python goes through their wrapper (an import and argument unwrapping): about 4 us a
# call on the CPU machine, and a matmul call made five of them. These are the same formulas.
def cdiv(x, y):
    """ceil(x / y) for positive integers."""
    return (x + y - 1) // y


def next_power_of_2(n):
    """The smallest power of 2 >= n (0 for n <= 0, as triton.next_power_of_2)."""
    n -= 1
    n |= n >> 1
    n |= n >> 2
    n |= n >> 4
    n |= n >> 8
    n |= n >> 16
    n |= n >> 32
    return n + 1


class GpuInfo(NamedTuple):
    capability: tuple[int, int]
    sms: int


_PRETEND: list[GpuInfo] = []


def gpu_info(device: torch.device) -> GpuInfo | None:
    """Compute capability and SM count of the GPU that runs kernels on `device`'s tensors, or None
    where none does (CPU tensors, the interpreter). Every kernel's dispatch asks this, and only
    this, about the hardware: by capability, never by name. Inside pretend_gpu() it answers the
    pretended GPU for any device."""
    if _PRETEND:
        return _PRETEND[-1]
    if device.type != "cuda" or is_interpreter():
        return None
    index = torch.cuda.current_device() if device.index is None else device.index
    return _cuda_info(index)


@functools.cache
def _cuda_info(index: int) -> GpuInfo:
    props = torch.cuda.get_device_properties(index)
    return GpuInfo((props.major, props.minor), props.multi_processor_count)


@contextlib.contextmanager
def pretend_gpu(capability: tuple[int, int], sms: int):
    """Dispatch as if the tensors sat on a GPU of this capability and SM count, whatever their
    device: for compiling the kernels a GPU would launch on a machine without one
    (experiments.resources). Launching anything inside it is the caller's problem. The tuning
    caches and plans are emptied on the way in and out: a plan's key holds the device, not the
    GPU dispatch saw there."""
    reset_tuning()
    _PRETEND.append(GpuInfo(tuple(capability), int(sms)))
    try:
        yield _PRETEND[-1]
    finally:
        _PRETEND.pop()
        reset_tuning()


def check_tensor(name: str, t, *, ndim: int | None = None, min_ndim: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise TypeError(f"{name} has dtype {t.dtype}; supported dtypes are {names}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    if min_ndim is not None and t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dims, got shape {tuple(t.shape)}")


def as_rows(t: torch.Tensor) -> torch.Tensor:
    """t as a (rows, last dim) matrix: a view where the leading dims merge. The row count is
    spelled out, since reshape(-1, 0) of an empty tensor with a zero last dim is ambiguous."""
    rows = 1
    for size in t.shape[:-1]:
        rows *= size
    return t.reshape(rows, t.shape[-1])


def check_same(tensors: dict) -> None:
    """All named tensors share one dtype and one device."""
    items = [(k, v) for k, v in tensors.items() if v is not None]
    first_name, first = items[0]
    for name, t in items[1:]:
        if t.dtype != first.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but {first_name} has {first.dtype}")
        if t.device != first.device:
            raise ValueError(f"{name} is on {t.device} but {first_name} is on {first.device}")


def activation_id(activation: str | None) -> int:
    key = "none" if activation is None else activation
    if key not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[key]


def dot_precision(dtype: torch.dtype, allow_tf32: bool) -> str:
    """tl.dot input precision for fp32 operands, following torch's own TF32 switch."""
    if dtype == torch.float32 and allow_tf32 and not is_interpreter():
        return "tf32"
    return "ieee"


# Split-K arrival counters, one zeroed int32 per output tile. Every kernel that uses them leaves
# them at zero (the last program of a tile resets its own), so one buffer serves every later call
# that runs after it on the same stream. Calls on two streams may overlap, so each stream gets
# its own buffer. A CUDA graph keeps the buffer of the stream it was captured on: two graphs
# captured on one stream and replayed concurrently on two others would still share it.
_TILE_COUNTERS: dict = {}


def tile_counters(device: torch.device, count: int, minimum: int = 1024) -> torch.Tensor:
    """At least `count` zeroed int32 counters for split-K launches on `device`'s current stream."""
    stream = None
    if device.type == "cuda":
        index = torch._C._cuda_getDevice() if device.index is None else device.index
        stream = torch._C._cuda_getCurrentRawStream(index)
    key = (device.type, device.index, stream)
    counters = _TILE_COUNTERS.get(key)
    if counters is None or counters.numel() < count:
        counters = torch.zeros(max(count, minimum), device=device, dtype=torch.int32)
        _TILE_COUNTERS[key] = counters
    return counters


def stream_tile_counters(stream: int) -> tuple[torch.Tensor, ...]:
    """The counters tile_counters keeps for CUDA stream `stream` (a raw stream pointer), on any
    device: what a CUDA graph captured on that stream launches with, and must keep alive
    (kernels._graphs)."""
    return tuple(t for (_, _, s), t in _TILE_COUNTERS.items() if s == stream)


# ---------------------------------------------------------------------------------------------
# Choosing a config by timing it on the GPU (conv's autotuner, softmax's first-call choice)
# ---------------------------------------------------------------------------------------------
# What a kernel chose by timing, one line per choice (kernel, shape key, winner and times): the
# benchmark copies the lines a measurement added into its record's notes, so a row says which
# config its numbers are of.
TUNING_LOG: list[str] = []
# The caches of those choices (softmax's first-call choice registers its own), which
# reset_tuning() empties: the benchmark does so before each row, as it resets torch.compile, so
# every row's first call makes its choice afresh and its record's notes name it.
TUNING_CACHES: list[dict] = []


def reset_tuning() -> None:
    for cache in TUNING_CACHES:
        cache.clear()

