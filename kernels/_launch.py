"""The host path of a direct launch: launch plans cached per call key, launched through Triton's
C launcher with arguments bound once per plan instead of the JIT's argument binding per call.

`kernel[grid](*args, **meta)` binds every argument, computes a specialization key, looks the
compiled kernel up (or, under an autotuner, looks the tuned config up and runs its pre-hook),
evaluates the grid, builds each host TMA descriptor's CUtensorMap and only then calls the C
launcher: tens of microseconds a launch on the GPU machines, several times what a cuBLAS call
costs its caller. A wrapper that knows, for its own call key (shapes, strides, dtype, device,
flags), every argument but the tensors' pointers skips all of that:

    Step(kernel, grid, args, meta, descs=...)
        One launch. Its lead arguments come with each call, `step(*tensors)`: tensors (or None)
        and, in the slots `descs` names, host TMA descriptors of one of those tensors with a
        shape, strides and block fixed by the key (DescSpec). `args` (positional, after the
        lead) and `meta` (keyword) are fixed by the key.
    the first call         launches through kernel[grid] (compiling, or autotuning), then arms
                           the step: binds the remaining arguments, the grid and the tuned
                           config once, and generates a function of the lead tensors that
                           checks what the compiled kernel was specialized on (each pointer's
                           16-byte alignment, None where None, the current device) and calls
                           the launcher
    later calls            that function: the tensors' data_ptr()s, a CUtensorMap per
                           descriptor from a cache keyed by pointer (its shape, strides, block
                           and dtype being the plan's), one C call
    PlanCache              the wrappers' per-key plans (bounded; emptied with the tuning
                           caches, kernels._common.reset_tuning)

The launcher is Triton's own per-kernel C module (`mod.launch`, what CompiledKernel.run calls
after expanding descriptors in Python), reached where the driver is the one this was written
against (triton 3.6's "iiiKKppOOOOOO" argument format); elsewhere the armed function calls
CompiledKernel.run with cached TensorDescriptors instead, as JITFunction.run does after binding.
Kernels that need a global scratch buffer (device-side descriptors) also go through
CompiledKernel.run, which asks the allocator for it.

What stays on `kernel[grid]` every call: the interpreter, launches traced by torch.compile
(wrap_triton: kernels/ops.py), launches while Triton's launch hooks are set (profilers), an
autotuner with a pre-hook other than one that only sets descriptor block shapes
(BLOCK_HOOKS), and a call that fails one of the checks above: it takes the JIT path, which
picks (or compiles) the right kernel.
"""

from __future__ import annotations

import inspect
import threading
from typing import NamedTuple

import torch

from kernels._common import TUNING_CACHES, is_interpreter

try:
    from triton import knobs as _knobs
    from triton.compiler import CompiledKernel
    from triton.runtime.autotuner import Autotuner
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - every pinned Triton has these
    _knobs = CompiledKernel = Autotuner = TensorDescriptor = None

_FAST = not is_interpreter() and CompiledKernel is not None

# Autotuner pre-hooks that only give the TMA descriptors a config's block shape: an armed step
# reads the tuned blocks off the descriptors after its first launch (kernels.conv registers
# its hook here).
BLOCK_HOOKS: set = set()
# Cached CUtensorMaps (or TensorDescriptors) of one descriptor slot, by pointer
DESC_CACHE_MAX = 64


_THREAD = threading.local()


def bind_context() -> None:
    """Make the current device's primary CUDA context current on this thread, once per thread.

    Autograd runs a backward on its own thread per device, and torch makes no context current
    there when the thread's device index is already the one asked for (c10's SetDevice skips
    cudaSetDevice then). Encoding a host TMA descriptor (cuTensorMapEncodeTiled) on such a
    thread fails with "invalid device context": Triton's launcher makes the context current
    itself, but only after the descriptors are built. Any runtime call that needs a context
    binds the primary one."""
    if not getattr(_THREAD, "bound", False) and torch.cuda.is_initialized():
        torch.cuda.current_stream().query()
        _THREAD.bound = True


def hooks_unset() -> bool:
    """No launch hook (a profiler such as proton) wants to see each launch's metadata."""
    runtime = _knobs.runtime
    return _inactive(runtime.launch_enter_hook) and _inactive(runtime.launch_exit_hook)


def _inactive(hook) -> bool:
    # triton 3.6: None or a function; 3.8: a HookChain, inactive while it holds no calls
    return hook is None or getattr(hook, "calls", True) == []


def fast_ok(device: torch.device) -> bool:
    """Whether direct launches on `device`'s tensors may take the cached plans' fast path: a
    CUDA tensor, Triton compiling for the GPU, and no torch.compile trace (which wants to see
    `kernel[grid]` itself)."""
    return _FAST and device.type == "cuda" and not torch.compiler.is_compiling()


class PlanCache(dict):
    """A wrapper's plans by call key; cleared, not grown, past `limit` keys, and emptied by
    kernels._common.reset_tuning (a plan may embed a choice the first call made by timing)."""

    def __init__(self, limit: int = 1024):
        super().__init__()
        self.limit = limit
        TUNING_CACHES.append(self)

    def put(self, key, value):
        if len(self) >= self.limit:
            self.clear()
        self[key] = value
        return value


class DescSpec(NamedTuple):
    """A host TMA descriptor in lead slot `slot`: `tensor` (an index into the step's tensors)
    described as `shape` / `strides` (elements, last stride 1), `block` its box (an autotuner's
    BLOCK_HOOKS pre-hook may change it per config)."""

    slot: int
    tensor: int
    shape: tuple
    strides: tuple
    block: tuple


class _Pointer:
    """The base of a cached descriptor: the launcher reads only data_ptr() and dtype (and the
    descriptor's own shape/strides), so a cached descriptor keeps no tensor alive."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


def desc_cache(dtype, shape, strides, block, padding="zero", expand=None):
    """ptr -> the descriptor of the memory at ptr (dtype, shape, strides, block), or what
    `expand` makes of it (the launcher's arguments for it: a CUtensorMap, shape, strides).
    Keyed by the pointer only, every other field being fixed: an entry describes exactly that
    memory so, and is never stale."""
    cache: dict = {}
    shape, strides, block = list(shape), list(strides), list(block)

    def get(ptr: int):
        value = cache.get(ptr)
        if value is None:
            bind_context()
            if len(cache) >= DESC_CACHE_MAX:
                cache.clear()
            desc = TensorDescriptor(_Pointer(ptr, dtype), shape, strides, block, padding=padding)
            value = cache[ptr] = desc if expand is None else expand(desc)
        return value

    return get


# ---------------------------------------------------------------------------------------------
# Triton's C launcher
# ---------------------------------------------------------------------------------------------
def _raw_entry(compiled):
    """(C launch function, cooperative-grid flag, PDL flag, descriptor expander) of a compiled
    kernel whose launcher has triton 3.6's layout and needs no scratch buffers; else None."""
    try:
        from triton.backends.nvidia import driver
    except ImportError:  # pragma: no cover
        return None
    runner = compiled.run
    if getattr(driver, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO":
        return None
    expand = getattr(driver, "make_tensordesc_arg", None)
    if expand is None or len(inspect.signature(expand).parameters) != 2:
        return None
    if getattr(runner, "global_scratch_size", 1) or getattr(runner, "profile_scratch_size", 1):
        return None
    launch = getattr(runner, "launch", None)
    if launch is not None and not inspect.isbuiltin(launch):
        # wrap_handle_tensordesc's `inner`: the module's launch is its closure's `launcher`
        code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
        if code is None or not cells or "launcher" not in code.co_freevars:
            return None
        launch = cells[code.co_freevars.index("launcher")].cell_contents
    if launch is None or not inspect.isbuiltin(launch):
        return None
    return launch, runner.launch_cooperative_grid, runner.launch_pdl, expand


def python_function(kernel):
    """The Python function under a JITFunction, an Autotuner or triton.heuristics wrapper."""
    while kernel is not None and not inspect.isfunction(kernel):
        kernel = getattr(kernel, "fn", None)
    return kernel


# ---------------------------------------------------------------------------------------------
# One launch
# ---------------------------------------------------------------------------------------------
class Step:
    """One kernel launch of a plan; see the module docstring."""

    __slots__ = ("kernel", "grid", "args", "meta", "descs", "width", "fast")

    def __init__(self, kernel, grid, args: tuple = (), meta: dict | None = None, *,
                 descs: tuple = (), width: int = 0):  # fmt: skip
        self.kernel, self.grid, self.args, self.meta = kernel, grid, tuple(args), meta or {}
        self.descs = tuple(DescSpec(*d) for d in descs)
        # lead slots: the tensors, then None up to `width` and past it up to the last descriptor
        self.width = max([width, *(d.slot + 1 for d in self.descs)])
        self.fast = None  # the armed launch (a generated function of the tensors)

    def __call__(self, *tensors) -> None:
        fast = self.fast
        if fast is not None and hooks_unset() and fast(tensors):
            return
        self._launch(tensors)

    def lead(self, tensors) -> list:
        """The JIT path's lead: the tensors, None past them up to `width`, and a new
        TensorDescriptor in each descriptor slot."""
        lead = list(tensors)
        lead.extend([None] * (self.width - len(lead)))
        for d in self.descs:
            lead[d.slot] = TensorDescriptor(tensors[d.tensor], list(d.shape), list(d.strides),
                                            list(d.block))  # fmt: skip
        return lead

    def once(self, *tensors) -> None:
        """One launch through kernel[grid], not armed: for a step built for a single call, where
        generating the armed function (hundreds of microseconds) would cost more than it saves."""
        self._launch(tensors, arm_after=False)

    def _launch(self, tensors, arm_after: bool = True) -> None:
        if self.descs and _FAST:
            bind_context()
        lead = self.lead(tensors)
        result = self.kernel[self.grid](*lead, *self.args, **self.meta)
        if arm_after and _FAST and self.fast is None and isinstance(result, CompiledKernel):
            self.fast = arm(self, result, tensors, lead)


def arm(step: Step, compiled, tensors, lead):
    """The fast launch of what step.kernel[grid] just launched as `compiled` with this lead, or
    None where it does not apply (see the module docstring)."""
    kernel, meta = step.kernel, dict(step.meta)
    if isinstance(kernel, Autotuner):
        config = getattr(kernel, "best_config", None)
        hook = None if config is None else config.pre_hook
        if (config is None or kernel.user_defined_pre_hook
                or getattr(kernel, "user_defined_post_hook", False)
                or (hook is not None and hook not in BLOCK_HOOKS)):  # fmt: skip
            return None
        meta.update(config.all_kwargs())
    fn = python_function(kernel)
    if fn is None or getattr(compiled, "function", None) is None:
        return None  # not loaded (the JIT path loads it when it launches)
    signature = compiled.src.signature
    names, types = list(signature), list(signature.values())
    width = len(lead)
    if width + len(step.args) > len(names):
        return None
    # every argument by name, as the grid function and the launcher see them
    named = dict(zip(names[:width], lead, strict=True))
    named.update(zip(names[width:width + len(step.args)], step.args, strict=True))
    defaults = inspect.signature(fn).parameters
    rest = []
    for name, ty in zip(names[width:], types[width:], strict=True):
        if name not in named:
            if name in meta:
                named[name] = meta[name]
            elif defaults[name].default is not inspect.Parameter.empty:
                named[name] = defaults[name].default
            elif ty != "constexpr":
                return None
            else:
                named[name] = None  # a constexpr: the launcher reads and ignores its slot
        rest.append(named[name])
    for key, value in meta.items():
        named.setdefault(key, value)
    grid = step.grid(named) if callable(step.grid) else step.grid
    grid = tuple(grid) + (1,) * (3 - len(grid))
    raw = _raw_entry(compiled)
    return _generate(step, compiled, tensors, lead, types, grid, rest, raw)


def _bound(value):
    """A fixed argument as the launcher takes it: a tensor (a keyword pointer, say a workspace
    the plan keeps alive) as its data pointer, skipping the launcher's pointer query."""
    return value.data_ptr() if isinstance(value, torch.Tensor) else value


def _generate(step, compiled, tensors, lead, types, grid, rest, raw):
    """The armed launch as a generated function of the tensors: one line per lead slot, so a
    call does no per-slot dispatch (Triton's own argument binder is generated the same way)."""
    descs = {d.slot: d for d in step.descs}
    tensordesc_meta = getattr(compiled.metadata, "tensordesc_meta", None) or None
    env = {"_device": torch._C._cuda_getDevice, "_stream": torch._C._cuda_getCurrentRawStream,
           "DEVICE": torch._C._cuda_getDevice(), "FUNCTION": compiled.function,
           "PACKED": compiled.packed_metadata, "REST": tuple(_bound(v) for v in rest),
           "KEEP": tuple(v for v in rest if isinstance(v, torch.Tensor))}  # fmt: skip
    checks, args = [], []
    desc_index = 0
    for slot, value in enumerate(lead):
        spec = descs.get(slot)
        if spec is not None:
            if not types[slot].startswith("tensordesc"):
                return None
            meta = tensordesc_meta[desc_index] if tensordesc_meta else None
            desc_index += 1
            expand = None if raw is None else (lambda d, m=meta, f=raw[3]: f(d, m))
            block = tuple(value.block_shape)  # as the tuned config's pre-hook left it
            env[f"D{slot}"] = desc_cache(tensors[spec.tensor].dtype, spec.shape, spec.strides,
                                         block, value.padding, expand)  # fmt: skip
            checks.append(f"q{slot} = t{spec.tensor}.data_ptr()")
            checks.append(f"if q{slot} & 15: return False")
            args.append(f"*D{slot}(q{slot})" if raw is not None else f"D{slot}(q{slot})")
        elif types[slot].startswith("tensordesc"):
            return None  # a descriptor the step does not rebuild
        elif value is None:
            if slot < len(tensors):
                checks.append(f"if t{slot} is not None: return False")
            args.append("None")
        elif isinstance(value, torch.Tensor) and value.device.type == "cuda":
            aligned = value.data_ptr() % 16 == 0
            checks.append(f"if t{slot} is None: return False")
            checks.append(f"p{slot} = t{slot}.data_ptr()")
            # compiled for the other alignment: the JIT path picks (or compiles) the right one
            checks.append(f"if {'' if aligned else 'not '}p{slot} & 15: return False")
            args.append(f"p{slot}")
        else:
            return None
    gx, gy, gz = grid
    head = f"{gx}, {gy}, {gz}, _stream(DEVICE), FUNCTION"
    if raw is not None:
        env["LAUNCH"] = raw[0]
        flags = f"{bool(raw[1])}, {bool(raw[2])}"  # cooperative grid, PDL
        call = f"LAUNCH({head}, {flags}, None, None, PACKED, None, None, None"
    else:
        env["LAUNCH"] = compiled.run
        call = f"LAUNCH({head}, PACKED, None, None, None"
    unpack = ", ".join(f"t{i}" for i in range(len(tensors)))
    source = "\n    ".join([
        "def fast(tensors):",
        f"if len(tensors) != {len(tensors)}: return False",
        f"{unpack}, = tensors" if tensors else "pass",
        *checks,
        "if _device() != DEVICE: return False",
        f"{call}, {', '.join([*args, '*REST'])})",
        "return True",
    ])  # fmt: skip
    name = getattr(python_function(step.kernel), "__name__", "kernel")
    exec(compile(source, f"<armed {name}>", "exec"), env)
    fast = env["fast"]
    fast.source = source  # for tests and for reading what a plan launches
    return fast
