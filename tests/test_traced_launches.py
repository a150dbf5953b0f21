"""Every launch the triton-compiled ops trace names every parameter of its kernel.

torch.compile's Inductor reads which tensors a user-defined Triton kernel writes from the
kernel's TTIR, which it builds from the traced launch's arguments. A launch that leaves a
parameter to its default ("Incorrect number of arguments passed to kernel") makes that analysis
fail, and Inductor then takes every tensor argument as written: the inputs are cloned and copied
back (a copy per call in the forward), and in training the copy back into a leaf that requires
grad fails the compile ("a leaf Variable that requires grad is being used in an in-place
operation": the 1x1 conv's backward on an H100). On the CPU the interpreter launches directly,
so this records the launches the ops make through the traced path's code instead (the ops'
launcher swapped for a recorder that runs each kernel in the interpreter) and checks their
arguments the way Inductor's analysis does. A second test runs torch's analysis itself on the
launches an H100 would trace (in a process without the interpreter, an H100's target pretended):
a kernel whose TTIR it cannot read (inline assembly, say) costs the same clones.
"""

import contextlib

import pytest
import torch
from triton.runtime.autotuner import Autotuner, Heuristics

from kernels import ops
from kernels._common import pretend_gpu
from tests.conftest import fast_subset


class _Recorder:
    """What kernels.ops' launcher returns: records each launch, then runs it directly."""

    launches: list = []
    run = True  # False: record only

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            _Recorder.launches.append((self.kernel, args, kwargs))
            if _Recorder.run:
                return self.kernel[grid](*args, **kwargs)

        return launch


def _missing(kernel, args, kwargs) -> list[str]:
    """The kernel's parameters that the launch, its autotuner's configs and its heuristics leave
    to a default."""
    given = set(kwargs)
    fn = kernel
    while isinstance(fn, (Autotuner, Heuristics)):  # down to the JITFunction (interpreted on CPU)
        if isinstance(fn, Autotuner):
            for config in fn.configs[:1]:
                given |= set(config.all_kwargs())
        if isinstance(fn, Heuristics):
            given |= set(fn.values)
        fn = fn.fn
    given |= set(fn.arg_names[: len(args)])
    return [name for name in fn.arg_names if name not in given]


def _cases():
    g = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=g).to(dtype).requires_grad_()

    x4 = rand(2, 16, 6, 6).detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    w1 = rand(24, 16, 1, 1).detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    w3 = rand(16, 16, 3, 3).detach().contiguous(memory_format=torch.channels_last).requires_grad_()
    return {
        "matmul": lambda: ops.matmul(rand(37, 24), rand(24, 40)),
        "matmul-split-k": lambda: ops.matmul(rand(8, 1024), rand(1024, 16)),
        # 16-bit on an H100: the device-descriptor kernel at heuristic_tile's tile
        "matmul-bf16": lambda: ops.matmul(rand(37, 24, dtype=torch.bfloat16),
                                          rand(24, 40, dtype=torch.bfloat16)),
        "batched-matmul": lambda: ops.matmul(rand(3, 17, 24), rand(3, 24, 9)),
        "linear": lambda: ops.linear(rand(5, 24), rand(40, 24), rand(40), "gelu"),
        # past ACTIVATION_PASS_MIN_M rows, training: the GEMM stores z, a pass applies gelu
        "linear-activation-pass": lambda: ops.linear(rand(1030, 24), rand(40, 24), rand(40),
                                                     "gelu"),
        "softmax": lambda: ops.softmax(rand(6, 100), -1),
        "softmax-scaled": lambda: ops.softmax(rand(6, 100), -1, scale=0.125),
        "softmax-long-rows": lambda: ops.softmax(rand(2, 70000), -1),
        "conv-1x1": lambda: ops.conv2d(x4, w1, None, [1, 1], [0, 0], [1, 1], 1),
        "conv-3x3-s2": lambda: ops.conv2d(x4, w3, None, [2, 2], [1, 1], [1, 1], 1,
                                          activation="relu"),
        "conv-stem-c3": lambda: ops.conv2d(rand(1, 3, 9, 9), rand(8, 3, 3, 3), rand(8), [2, 2],
                                           [1, 1], [1, 1], 1),
        "conv-nchw-3x3": lambda: ops.conv2d(rand(1, 16, 7, 7), rand(8, 16, 3, 3), None, [1, 1],
                                            [1, 1], [1, 1], 1, activation="silu"),
        "conv-depthwise": lambda: ops.conv2d(x4, rand(16, 1, 3, 3), None, [1, 1], [1, 1], [1, 1],
                                             16),
        "conv-grouped": lambda: ops.conv2d(x4.detach(), rand(16, 4, 3, 3).detach(), None,
                                           [1, 1], [1, 1], [1, 1], 4),  # no backward
    }


# the fast suite: an H100's dispatch (what a GPU trace launches) of the cases that are cheap in the
# interpreter; every case on both dispatches in make test-all
FAST_CASES = ["matmul", "batched-matmul", "linear", "softmax-scaled", "conv-1x1", "conv-grouped"]


def _record(case, gpu, monkeypatch) -> list:
    """The (kernel, args, kwargs) of every launch a case's forward and backward trace, each run
    in the interpreter; with `gpu`, an H100's dispatch (pretend_gpu): the kernel choices and
    splits a GPU trace makes."""
    monkeypatch.setattr(ops, "_active_launch", [ops.naming(_Recorder)])
    _Recorder.launches = []
    with pretend_gpu((9, 0), 132) if gpu else contextlib.nullcontext():
        out = _cases()[case]()
        if out.requires_grad:
            out.float().square().sum().backward()
    assert _Recorder.launches, "no launch went through the traced path"
    return _Recorder.launches


@pytest.mark.parametrize("gpu", fast_subset([False, True], [True]),
                         ids=["cpu-dispatch", "h100-dispatch"])
@pytest.mark.parametrize("case", fast_subset(_cases(), FAST_CASES))
def test_traced_launches_name_every_parameter(case, gpu, monkeypatch):
    if gpu and case == "softmax-long-rows":
        pytest.skip("a GPU takes the coop design, whose programs wait on each other: the "
                    "interpreter runs them one at a time")
    for kernel, args, kwargs in _record(case, gpu, monkeypatch):
        missing = _missing(kernel, args, kwargs)
        name = getattr(getattr(kernel, "fn", kernel), "__name__", None) or repr(kernel)
        assert not missing, f"{case}: a traced launch leaves {missing} to their defaults ({name})"


class _Target:
    """Triton's active driver as far as TTIR generation asks: an H100's target, no GPU needed."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)


def _ttir_kwargs(kernel, args, kwargs) -> tuple:
    """(the JITFunction, every parameter by name) of a recorded launch, as Inductor's tracing
    resolves it: the autotuner's first config, then the heuristics under it."""
    layers, fn = [], kernel
    while isinstance(fn, (Autotuner, Heuristics)):
        layers.append(fn)
        fn = fn.fn
    named = {**dict(zip(fn.arg_names[: len(args)], args, strict=True)), **kwargs}
    for layer in layers:  # outermost first: a config's blocks feed the heuristics under it
        if isinstance(layer, Autotuner):
            named = {**layer.configs[0].all_kwargs(), **named}
        else:
            for name, rule in layer.values.items():
                named.setdefault(name, rule(named))
    return fn, {name: named[name] for name in fn.arg_names}


def unanalyzable_launches() -> dict:
    """Per case, the kernels of the launches an H100 would trace (dispatch by pretend_gpu, the
    launches recorded, not run) whose TTIR torch's analysis cannot read, so that Inductor falls
    back to "every input is mutated" and clones the inputs on every call. Needs real
    JITFunctions: run without TRITON_INTERPRET (no GPU needed; an H100's target is pretended)."""
    import logging

    import triton
    from torch._higher_order_ops import triton_kernel_wrap as wrap

    analyze = getattr(wrap, "identify_accessed_tensors", None) or wrap.identify_mutated_tensors
    ops._active_launch[0] = ops.naming(_Recorder)
    _Recorder.run = False
    seen, log = [], wrap.log

    class Said(logging.LoggerAdapter):  # the analysis says it fell back with a warning
        def warning(self, message, *args, **kwargs):
            seen.append(str(message))

    wrap.log = Said(log, {})
    before = triton.runtime.driver._active
    triton.runtime.driver.set_active(_Target())
    failures = {}
    try:
        for case, make in _cases().items():
            _Recorder.launches = []
            with pretend_gpu((9, 0), 132):
                out = make()
                if out.requires_grad:
                    out.float().square().sum().backward()
            assert _Recorder.launches, f"{case}: no launch went through the traced path"
            for kernel, args, kwargs in _Recorder.launches:
                fn, named = _ttir_kwargs(kernel, args, kwargs)
                seen.clear()
                analyze(fn, named, {})
                if any("assuming every input is mutated" in m for m in seen):
                    failures.setdefault(case, []).append(fn.__name__)
    finally:
        triton.runtime.driver._active = before
        wrap.log = log
    return failures


@pytest.mark.slow
def test_inductor_reads_what_each_traced_launch_writes():
    """torch's own TTIR analysis reads every kernel an H100 would trace, but for one known
    case: the coop softmax's split kernels (long rows) wait between polls with PTX nanosleep,
    inline assembly the analysis cannot read, so Inductor takes all their tensor arguments as
    written (an H100 run logs it: docs/kernels/host_path.md)."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import json, tests.test_traced_launches as t; "
            "print(json.dumps(t.unanalyzable_launches()))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    failures = json.loads(result.stdout.strip().splitlines()[-1])
    known = {"softmax_split_kernel", "softmax_backward_split_kernel"}  # the coop's nanosleep
    assert set(failures) <= {"softmax-long-rows"}, failures
    assert set(failures.get("softmax-long-rows", ())) <= known, failures


@pytest.mark.parametrize("gpu", fast_subset([False, True], [True]),
                         ids=["cpu-dispatch", "h100-dispatch"])
@pytest.mark.parametrize("case", fast_subset(_cases(), FAST_CASES))
def test_traced_launches_pass_no_memory_twice(case, gpu, monkeypatch):
    """No traced launch passes two tensors over the same memory. Inductor functionalizes each
    tensor a user-defined kernel writes as a clone of its own and copies the clones back in
    turn, so a second name for written memory gets its unwritten clone copied over the kernel's
    result: the unsplit conv wgrad passed dW as both its output and its workspace, and
    triton-compiled training gave NaN weight gradients on an H100."""
    if gpu and case == "softmax-long-rows":
        pytest.skip("a GPU takes the coop design, whose programs wait on each other: the "
                    "interpreter runs them one at a time")
    for kernel, args, kwargs in _record(case, gpu, monkeypatch):
        tensors = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)]
        storages = [t.untyped_storage().data_ptr() for t in tensors]
        name = getattr(getattr(kernel, "fn", kernel), "__name__", None) or repr(kernel)
        assert len(set(storages)) == len(storages), f"{case}: {name} gets one memory twice"
