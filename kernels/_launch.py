"""The host path of a direct launch: launch plans cached per call key, launched through the
compiled kernel's own launcher instead of the JIT's argument binding.

`kernel[grid](*args, **meta)` binds every argument, computes a specialization key, looks the
compiled kernel up, evaluates the grid and only then calls the C launcher: tens of microseconds
a launch on the GPU machines. A wrapper that already knows, for its own call key (shapes,
strides, dtype, device, flags), every argument but the tensors' pointers can skip all of that:

    Step(kernel, grid, args, meta)   one launch; args/meta are everything after the `lead`
                                     (pointer-like) arguments, fixed by the wrapper's key
    step(*lead)                      the first call launches through kernel[grid] (compiling, or
                                     autotuning) and keeps the CompiledKernel it returns; later
                                     calls go to CompiledKernel.run with the lead tensors'
                                     pointers and the remembered rest, where fast_ok() allows
    PlanCache                        the wrappers' per-key plans (bounded; emptied with the
                                     tuning caches, kernels._common.reset_tuning)
    host_descriptor(...)             TMA TensorDescriptors cached by (pointer, shape, strides,
                                     block): a value of all of them, so never stale

What stays on `kernel[grid]`: the interpreter, launches traced by torch.compile (wrap_triton in
kernels/ops.py never comes here), launches while Triton's launch hooks are set (profilers), an
autotuner with hooks, a pointer whose 16-byte alignment differs from the compiled kernel's
specialization, and a current CUDA device other than the one the kernel was loaded on.
The entry point `CompiledKernel.run(gx, gy, gz, stream, function, packed_metadata,
launch_metadata, enter_hook, exit_hook, *all_args)` is the one JITFunction.run calls in
triton 3.6 and 3.8 alike.
"""

from __future__ import annotations

import inspect

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


def hooks_unset() -> bool:
    """No launch hook (a profiler such as proton) wants to see each launch's metadata."""
    runtime = _knobs.runtime
    return _inactive(runtime.launch_enter_hook) and _inactive(runtime.launch_exit_hook)


def _inactive(hook) -> bool:
    # triton 3.6: None or a function; 3.8: a HookChain, inactive while it holds no calls
    return hook is None or getattr(hook, "calls", True) == []


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


# ---------------------------------------------------------------------------------------------
# Host TMA descriptors
# ---------------------------------------------------------------------------------------------
class _Pointer:
    """The base of a cached descriptor: the launcher reads only data_ptr() (and the descriptor's
    own shape/strides), so a cached descriptor keeps no tensor alive."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype):
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


_DESCRIPTORS: dict = {}
DESCRIPTORS_MAX = 4096


def host_descriptor(ptr: int, dtype: torch.dtype, shape: tuple, strides: tuple, block: tuple):
    """TensorDescriptor(memory at ptr, shape, strides, block) for a launch on the fast path,
    cached by all five: every field the launcher encodes, so an entry can only be reused for
    the same memory described the same way."""
    key = (ptr, dtype, shape, strides, block)
    desc = _DESCRIPTORS.get(key)
    if desc is None:
        if len(_DESCRIPTORS) >= DESCRIPTORS_MAX:
            _DESCRIPTORS.clear()
        desc = TensorDescriptor(_Pointer(ptr, dtype), list(shape), list(strides), list(block))
        _DESCRIPTORS[key] = desc
    return desc


# ---------------------------------------------------------------------------------------------
# One launch
# ---------------------------------------------------------------------------------------------
_SIGNATURES: dict = {}


def _signature(fn) -> inspect.Signature:
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = _SIGNATURES[fn] = inspect.signature(fn.fn)
    return sig


class _Compiled:
    """A CompiledKernel bound to its grid, device and every non-lead argument."""

    __slots__ = ("run", "function", "packed", "grid", "device", "rest", "kinds")

    def __init__(self, compiled, grid, device, rest, kinds):
        self.run = compiled.run
        self.function = compiled.function
        self.packed = compiled.packed_metadata
        self.grid, self.device, self.rest, self.kinds = grid, device, rest, kinds


def _kind(value):
    """How a lead argument was specialized: None (a constexpr), a descriptor, or a pointer and
    whether it was 16-byte aligned (Triton's pointer specialization)."""
    if value is None:
        return None
    if TensorDescriptor is not None and isinstance(value, TensorDescriptor):
        return "desc"
    return value.data_ptr() % 16 == 0


class Step:
    """One kernel launch of a plan; see the module docstring. `lead` arguments (tensors, None,
    descriptors) come with each call; `args` (positional, after the lead) and `meta` (keyword)
    are fixed by the plan's key."""

    __slots__ = ("kernel", "grid", "args", "meta", "compiled")

    def __init__(self, kernel, grid, args: tuple = (), meta: dict | None = None):
        self.kernel, self.grid, self.args, self.meta = kernel, grid, tuple(args), meta or {}
        self.compiled = None

    def __call__(self, *lead, descriptors=None):
        """Launch with these lead arguments. `descriptors` (a function of no arguments giving
        the lead with each descriptor slot filled by host_descriptor) is used on the fast path
        only; the JIT path takes `lead` as given."""
        compiled = self.compiled
        if compiled is not None and hooks_unset():
            if descriptors is not None:
                lead = descriptors()
            if self._fast(compiled, lead):
                return
        self._launch(lead)

    def _fast(self, compiled: _Compiled, lead) -> bool:
        device = compiled.device
        if torch._C._cuda_getDevice() != device:
            return False
        args = []
        for value, kind in zip(lead, compiled.kinds, strict=True):
            if value is None or kind == "desc":
                if (value is None) != (kind is None):
                    return False
                args.append(value)
                continue
            if kind is None:
                return False
            ptr = value.data_ptr()
            if (ptr % 16 == 0) != kind:
                return False  # compiled for the other alignment: the JIT path picks the right one
            args.append(ptr)
        gx, gy, gz = compiled.grid
        compiled.run(gx, gy, gz, torch._C._cuda_getCurrentRawStream(device), compiled.function,
                     compiled.packed, None, None, None, *args, *compiled.rest)  # fmt: skip
        return True

    def _launch(self, lead) -> None:
        result = self.kernel[self.grid](*lead, *self.args, **self.meta)
        if _FAST and self.compiled is None and isinstance(result, CompiledKernel):
            self.compiled = self._arm(result, lead)

    def _arm(self, result, lead) -> _Compiled | None:
        """The fast launch of what kernel[grid] just launched, or None where it does not apply."""
        kernel, meta = self.kernel, self.meta
        if isinstance(kernel, Autotuner):
            config = getattr(kernel, "best_config", None)
            if (config is None or config.pre_hook is not None or kernel.user_defined_pre_hook
                    or getattr(kernel, "user_defined_post_hook", False)):  # fmt: skip
                return None
            meta = {**meta, **config.all_kwargs()}
            kernel = kernel.fn
        if lead and isinstance(lead[0], torch.Tensor) and lead[0].device.type != "cuda":
            return None
        sig = _signature(kernel)
        bound = sig.bind(*lead, *self.args, **{k: v for k, v in meta.items()
                                               if k in sig.parameters})  # fmt: skip
        bound.apply_defaults()
        grid = self.grid(bound.arguments) if callable(self.grid) else self.grid
        grid = tuple(grid) + (1,) * (3 - len(grid))
        rest = tuple(bound.arguments.values())[len(lead) :]
        kinds = tuple(_kind(v) for v in lead)
        if result.function is None:  # not loaded (the JIT path loads it when it launches)
            return None
        return _Compiled(result, grid, torch._C._cuda_getDevice(), rest, kinds)


def fast_ok(device: torch.device) -> bool:
    """Whether direct launches on `device`'s tensors may take the cached plans' fast path: a
    CUDA tensor, Triton compiling for the GPU, and no torch.compile trace (which wants to see
    `kernel[grid]` itself)."""
    return _FAST and device.type == "cuda" and not torch.compiler.is_compiling()
