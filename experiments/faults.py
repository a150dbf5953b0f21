"""Deliberate faults, for testing that a sweep survives them: `fault.kind=kill fault.shape=1`.

illegal_address launches a Triton kernel that writes out of bounds: on a GPU this is the real
CUDA error that poisons the process (on a CPU the error is raised, not caused).

Each kind stands for a failure seen in real sweeps: an exception in a kernel or the compiler
(raise), a wrong result (nan_output), CUDA running out of memory (oom), a process killed
part-way, as a CUDA illegal-address error or the OOM killer would (kill), and one that exits
with an error no shape's handler catches (exit: a study worker died with exit code 1 so). The
fault fires at one index of the job's shape set; fault.kind=null (the default) injects nothing.
"""

import os
import signal

import torch

from experiments.errors import ConfigError
from experiments.schema import FAULT_KINDS as KINDS

# CUDA errors after which the process's context is unusable: every later call fails too.
STICKY_CUDA_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address",
                      "illegal instruction", "device-side assert")
POISONED_EXIT = 3  # exit code of a job that stopped because its CUDA context was lost


def is_sticky_cuda_error(reason: str | None) -> bool:
    return bool(reason) and any(text in reason for text in STICKY_CUDA_ERRORS)


def check(fault) -> None:
    if fault is None or fault.get("kind") is None:
        return
    if fault.get("kind") not in KINDS or not isinstance(fault.get("shape"), int):
        raise ConfigError(
            f"fault={dict(fault)}: kind must be one of {KINDS} or null, "
            "shape an index into the shape set"
        )


def fires(fault, shape_index: int, kind: str) -> bool:
    return fault is not None and fault.get("kind") == kind and fault.get("shape") == shape_index


def inject(fault, shape_index: int) -> None:
    """Raise, run out of memory or die now, if the fault targets this shape."""
    if fires(fault, shape_index, "raise"):
        raise RuntimeError("injected fault (fault.kind=raise)")
    if fires(fault, shape_index, "oom"):
        raise torch.cuda.OutOfMemoryError("injected fault: simulated CUDA out of memory")
    if fires(fault, shape_index, "kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if fires(fault, shape_index, "exit"):  # SystemExit passes every `except Exception`
        raise SystemExit("SystemExit: injected fault (fault.kind=exit)")
    if fires(fault, shape_index, "illegal_address"):
        write_out_of_bounds()


def write_out_of_bounds() -> None:
    """A real CUDA illegal-address fault from a Triton kernel (on a CPU it is only simulated)."""
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
    import triton
    import triton.language as tl

    @triton.jit
    def store_far_away(ptr):
        tl.store(ptr + (1 << 40), 1.0)  # a terabyte past a 4-byte buffer

    target = torch.empty(1, device="cuda")
    store_far_away[(1,)](target)
    torch.cuda.synchronize()


def nan_output(module):
    """The module with every output replaced by NaN: a kernel that computes garbage."""
    return lambda *inputs: module(*inputs) * float("nan")
