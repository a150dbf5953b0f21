"""The cached host path (kernels/_launch.py and the wrappers' plan caches): what is cached, under
which key, and that a cached plan never launches on a stale pointer or layout.

On CPU the kernels run in the interpreter, which keeps the JIT launch, so the plan caches are
exercised through the real wrappers (results against float64) and the fast launch through a
stand-in compiled kernel that records what it would have launched. The GPU tests at the end
capture a cached call in a CUDA graph and compile the traced softmax over 65536-column rows."""

import contextlib
import gc
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

import kernels
from experiments.correctness import relative_error, tolerance
from kernels import _launch
from kernels._common import pretend_gpu, reset_tuning
from kernels._launch import Step
from kernels.linear import linear, linear_reference
from kernels.matmul import dispatch as matmul_dispatch
from kernels.matmul import matmul
from tests.conftest import fast_subset

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def _close(out, ref, dtype_name="fp32"):
    assert relative_error(out, ref) <= tolerance(dtype_name, False)


def _ref(a, b):
    return (a.double() @ b.double()).to(a.dtype)


# ---------------------------------------------------------------------------------------------
# The matmul plan cache, through the public function
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def plans():
    reset_tuning()
    yield matmul_dispatch._PLANS
    reset_tuning()


def test_new_tensor_same_shape_reuses_plan_and_reads_new_data(plans):
    g = torch.Generator().manual_seed(0)
    a1, b1 = torch.randn(17, 33, generator=g), torch.randn(33, 9, generator=g)
    _close(matmul(a1, b1), _ref(a1, b1))
    assert len(plans) == 1
    plan = next(iter(plans.values()))
    a2, b2 = torch.randn(17, 33, generator=g), torch.randn(33, 9, generator=g)
    _close(matmul(a2, b2), _ref(a2, b2))
    assert len(plans) == 1 and next(iter(plans.values())) is plan


def test_strides_dtype_and_device_are_in_the_key(plans):
    g = torch.Generator().manual_seed(1)
    a = torch.randn(16, 24, generator=g)
    b = torch.randn(24, 8, generator=g)
    matmul(a, b)
    # the same shapes, a transposed layout: another plan, and the right answer
    at = torch.randn(24, 16, generator=g).t()
    _close(matmul(at, b), _ref(at, b))
    assert len(plans) == 2
    # another dtype
    a16, b16 = a.to(torch.float16), b.to(torch.float16)
    _close(matmul(a16, b16), _ref(a16, b16), "fp16")
    assert len(plans) == 3
    key = matmul_dispatch._plan_key(a, b, None, 0, False)
    # another device (meta tensors: same shapes and strides, data_ptr 0)
    am, bm = a.to("meta"), b.to("meta")
    assert matmul_dispatch._plan_key(am, bm, None, 0, False) != key
    # another GPU (kernels._common.pretend_gpu stands in for a device of another capability):
    # the plans made for the device as it was are gone on the way in, and those made while
    # pretending on the way out
    assert plans
    with pretend_gpu((9, 0), 132):
        assert not plans
        matmul(a, b)
        assert plans
    assert not plans


def test_views_of_one_storage_and_in_place_changes(plans):
    g = torch.Generator().manual_seed(2)
    storage = torch.randn(40, 40, generator=g)
    a, b = storage[:16, :24], storage[8:32, 4:12]  # overlapping views of one buffer
    _close(matmul(a, b), _ref(a, b))
    storage.mul_(-0.5).add_(1.0)  # in place, between calls: the next call reads the new values
    _close(matmul(a, b), _ref(a, b))
    assert len(plans) == 1
    # the same shapes one element further in: other pointers, other alignment, same result
    a1, b1 = storage[1:17, :24], storage[9:33, 4:12]
    _close(matmul(a1, b1), _ref(a1, b1))
    # x @ x.t(): one tensor in both operands
    x = storage[:12, :20]
    _close(matmul(x, x.t()), _ref(x, x.t()))


def test_alignment_is_in_the_key():
    base = torch.zeros(64)
    aligned = base[:32].view(4, 8)
    shifted = base[1:33].view(4, 8)  # 4 bytes further: not 16-byte aligned
    b = torch.zeros(8, 4)
    key = matmul_dispatch._plan_key(aligned, b, None, 0, False)
    assert matmul_dispatch._plan_key(shifted, b, None, 0, False) != key


@pytest.mark.parametrize("requires_grad", [False, True])
def test_linear_requires_grad_on_and_off(plans, requires_grad):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 3, 16, generator=g)
    w = torch.randn(8, 16, generator=g)
    bias = torch.randn(8, generator=g)
    for leaf in (x, w, bias):
        leaf.requires_grad_(requires_grad)
    for _ in range(2):  # the second call on the cached plan
        y = linear(x, w, bias, activation="gelu")
        _close(y.detach(), linear_reference(x.detach().double(), w.detach().double(),
                                            bias.detach().double(), "gelu").float())  # fmt: skip
    # with a gradient the forward also stores the pre-activation: another plan
    if requires_grad:
        y.sum().backward()
        ref_x = x.detach().double().requires_grad_()
        ref_w, ref_b = w.detach().double(), bias.detach().double()
        linear_reference(ref_x, ref_w, ref_b, "gelu").sum().backward()
        _close(x.grad, ref_x.grad.float())
    keys = {k[-3:-1] for k in plans}  # (act_id, save_preact)
    assert any(save for _, save in keys) == requires_grad


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_planned_calls_match_float64(plans, activation):
    """The second call of a key takes linear's plan (no checks, no 2-D views, the GEMM's plan
    run on x and dY in place): 3-D x, with and without bias and gradients, a dY that is an
    expanded view, and an x whose rows do not merge (a copy: never planned)."""
    from kernels.linear import dispatch as linear_dispatch

    g = torch.Generator().manual_seed(4)
    w = torch.randn(8, 16, generator=g)
    bias = torch.randn(8, generator=g)
    for grad in (False, True):
        for b in (bias, None):
            for _ in range(3):  # planned from the second call on; new data every call
                x = torch.randn(2, 5, 16, generator=g)
                leaves = [t for t in (x, w, b) if t is not None]
                for t in leaves:
                    t.grad = None
                    t.requires_grad_(grad)
                y = linear(x, w, b, activation=activation)
                ref_leaves = [t.detach().double().requires_grad_(grad) for t in leaves]
                rx, rw, *rb = ref_leaves
                ref = linear_reference(rx, rw, rb[0] if rb else None, activation)
                _close(y.detach(), ref.detach().float())
                assert y.shape == (2, 5, 8)
                if grad:
                    dy = torch.randn(1, 1, 8, generator=g).expand(2, 5, 8)  # strides (0, 0, 1)
                    y.backward(dy)
                    ref.backward(dy.double())
                    for got, want in zip(leaves, ref_leaves, strict=True):
                        assert got.grad.shape == got.shape
                        _close(got.grad, want.grad.float())
            for t in (w, bias):
                t.requires_grad_(False)
    assert len(linear_dispatch._PLANS) == 4  # (grad, bias) pairs
    # the backward's GEMM plans, by dZ's layout: kept on the two plans with gradients
    assert sum(bool(p.backward) for p in linear_dispatch._PLANS.values()) == 2
    planned = next(iter(linear_dispatch._PLANS.values()))
    assert planned.layout == ((2, 5, 8), (40, 8, 1))
    # x whose leading dims do not merge: flatten copies, and the call stays unplanned
    x = torch.randn(5, 2, 16, generator=g).transpose(0, 1)
    for _ in range(2):
        _close(linear(x, w, bias), linear_reference(x.double(), w.double(), bias.double()).float())
    assert len(linear_dispatch._PLANS) == 4


@pytest.mark.slow
def test_conv_plans_take_new_tensors_layouts_and_weight_copies(plans):
    """conv2d's plans: new tensors at a planned key read their own data; NCHW and NHWC inputs
    and a weight that is not channels_last (its matrix copied per call) plan apart."""
    from kernels import conv2d
    from kernels.conv import dispatch as conv_dispatch

    g = torch.Generator().manual_seed(5)
    for channels_last in (False, True):
        for weight_cl in (False, True):
            for _ in range(2):
                x = torch.randn(2, 16, 7, 9, generator=g)
                w = torch.randn(12, 16, 3, 3, generator=g)
                if channels_last:
                    x = x.to(memory_format=torch.channels_last)
                if weight_cl:
                    w = w.to(memory_format=torch.channels_last)
                y = conv2d(x, w, None, 1, 1)
                ref = torch.nn.functional.conv2d(x.double(), w.double(), None, 1, 1)
                _close(y, ref.float())
                assert y.is_contiguous(
                    memory_format=torch.channels_last if channels_last else torch.contiguous_format)
                x.mul_(-1)  # in place between calls: the next call reads the new values
                _close(conv2d(x, w, None, 1, 1),
                       torch.nn.functional.conv2d(x.double(), w.double(), None, 1, 1).float())
    assert len(conv_dispatch._PLANS) == 4
    copies = sorted(p.copy_w for p in conv_dispatch._PLANS.values())
    assert copies == [False, False, True, True]


def test_alternating_plan_takes_the_workspaces_in_turn(monkeypatch):
    """The coop/smem plan launches on the zeroed buffer of its pair with the other as the one
    to zero next, flips the index, and declines (False) for a parity it has no step for yet,
    under CUDA-graph capture and on another stream than its pair's."""
    from kernels.softmax.coop import Alternate, AlternatingPlan

    state = {"capturing": False, "stream": 7}
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: state["capturing"],
                        raising=False)  # fmt: skip
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: state["stream"],
                        raising=False)  # fmt: skip
    calls = []

    def step(name):
        return lambda *args: calls.append((name, args))

    pair = [torch.zeros(4), torch.zeros(4), 1]  # a launch on buffer 0 just flipped it to 1
    x = torch.ones(2)
    plan = AlternatingPlan(Alternate(pair, 0, step("even"), with_next=True), 0)
    assert plan(x) is False and pair[2] == 1 and not calls  # no step for buffer 1 yet
    plan.steps[1] = step("odd")
    assert plan(x) is True and pair[2] == 0
    assert plan(x) is True and pair[2] == 1
    (first, (a, ws_a, next_a)), (second, (_, ws_b, next_b)) = calls
    assert (first, second) == ("odd", "even") and a is x
    assert ws_a is pair[1] and next_a is pair[0] and ws_b is pair[0] and next_b is pair[1]
    state["capturing"] = True
    assert plan(x) is False
    state["capturing"], state["stream"] = False, 8
    assert plan(x) is False and pair[2] == 1 and len(calls) == 2
    # coop's steps take only the buffer they launch on: the other is fixed in the step
    state["stream"] = 7
    coop = AlternatingPlan(Alternate(pair, 0, step("coop0"), with_next=False), 0)
    coop.steps[1] = step("coop1")
    assert coop(x) is True and calls[-1] == ("coop1", (x, pair[1]))


def test_reset_tuning_empties_the_plans(plans):
    matmul(torch.ones(4, 4), torch.ones(4, 4))
    assert plans
    reset_tuning()
    assert not plans


def _conv_case(c, k, r, stride=1, groups=1, dtype=torch.float32, train=True):
    def call():
        fmt = torch.channels_last
        x = torch.randn(2, c, 8, 8).to(dtype).contiguous(memory_format=fmt)
        w = (torch.randn(k, c // groups, r, r) * 0.1).to(dtype).contiguous(memory_format=fmt)
        if not train:
            with torch.no_grad():
                return [x, w, kernels.conv2d(x, w, None, stride, r // 2, 1, groups)]
        x.requires_grad_()
        w.requires_grad_()
        y = kernels.conv2d(x, w, None, stride, r // 2, 1, groups)
        y.backward(torch.randn_like(y))
        return [x, w, y, x.grad, w.grad]

    return call


PLANNED_CALLS = {
    "matmul": lambda: [a := torch.randn(33, 24), b := torch.randn(24, 40), matmul(a, b)],
    "linear fwd_bwd": lambda: _linear_step(),
    "softmax": lambda: [x := torch.randn(6, 100), kernels.softmax(x, -1)],
    "conv 1x1": _conv_case(16, 24, 1, train=False),
    "conv 3x3 s2 fwd_bwd": _conv_case(16, 16, 3, stride=2),
    "conv stem c3 fwd_bwd": _conv_case(3, 16, 3, stride=2),
    "conv grouped": _conv_case(16, 16, 3, groups=4, train=False),
    "conv depthwise fwd_bwd": _conv_case(16, 16, 3, stride=2, groups=16),
    "conv 1x1 fwd_bwd fp16 on an H100": _conv_case(32, 32, 1, dtype=torch.float16),
    "conv 3x3 s2 fwd_bwd fp16 on an H100": _conv_case(32, 32, 3, stride=2, dtype=torch.float16),
}


def _linear_step():
    x, w, bias = (torch.randn(*s, requires_grad=True) for s in ((5, 24), (40, 24), (40,)))
    y = linear(x, w, bias, "gelu")
    y.backward(torch.randn_like(y))
    return [x, w, bias, y, x.grad, w.grad, bias.grad]


@pytest.mark.parametrize("case",
                         fast_subset(PLANNED_CALLS, ["matmul", "linear fwd_bwd", "softmax"]))
def test_plans_keep_no_call_s_tensors_alive(case):
    """A plan outlives its first call but holds none of that call's tensors: the conv designs'
    grids once closed over the Conv record, so every plan kept its first input and output (a
    training plan its first dX too, and autograd then copied dX instead of taking it) for the
    plan's life: an activation per layer geometry on a GPU."""
    reset_tuning()
    gpu = "H100" in case
    with pretend_gpu((9, 0), 132) if gpu else contextlib.nullcontext():
        tensors = PLANNED_CALLS[case]()
        refs = [weakref.ref(t) for t in tensors]
        del tensors
        gc.collect()
        alive = [i for i, ref in enumerate(refs) if ref() is not None]
        assert not alive, f"{case}: the plans keep the call's tensors {alive} alive"
    reset_tuning()


# ---------------------------------------------------------------------------------------------
# The armed launch, with a stand-in compiled kernel
# ---------------------------------------------------------------------------------------------
def _kernel_fn(a_ptr, b_ptr, c_desc, M, N, stride, BLOCK, FLAG=0, EXTRA=7):
    pass


class _Kernel:
    """Stands in for a JIT kernel: indexed with a grid, it records the JIT path's launch."""

    fn = staticmethod(_kernel_fn)

    def __init__(self):
        self.jit = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit.append((grid, args, kwargs))
            for arg in args:  # a block pre-hook: the tuned box
                if isinstance(arg, _launch.TensorDescriptor):
                    arg.block_shape = [16, 8]

        return launch


class _Compiled:
    """Stands in for a CompiledKernel: its launcher records what it was called with."""

    SIGNATURE = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_desc": "tensordesc<fp16[16, 8]>",
                 "M": "i32", "N": "i32", "stride": "i32", "BLOCK": "constexpr",
                 "FLAG": "constexpr", "EXTRA": "i32"}  # fmt: skip

    def __init__(self):
        self.calls = []
        self.function, self.packed_metadata = "fn", ("warps", 1, 0)
        self.src = type("Src", (), {"signature": self.SIGNATURE})()
        self.metadata = type("Meta", (), {"tensordesc_meta": None})()
        self.run = lambda *args: self.calls.append(args)


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch's current device and stream as the armed launch reads them, on a CPU machine; the
    tensors pass for CUDA tensors where the armed launch asks."""
    state = {"device": 0}
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: state["device"], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 1000 + d, raising=False)
    return state


def _armed(fake_cuda, monkeypatch, raw=None):
    """A step over (a, b, c) whose slot 2 is a descriptor of c, launched once through the JIT
    path, then armed with the stand-in compiled kernel."""
    monkeypatch.setattr(_launch, "_raw_entry", lambda compiled: raw)
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: torch.device("cuda", 0)))
    kernel, compiled = _Kernel(), _Compiled()
    step = Step(kernel, lambda meta: (meta["M"] // meta["BLOCK"], 2), (64, 32, 8),
                {"BLOCK": 16}, descs=[(2, 2, (64, 32), (32, 1), (64, 64))])  # fmt: skip
    a, b, c = (torch.zeros(64 * 32, dtype=torch.float16) for _ in range(3))
    step(a, b, c)
    launched_lead = list(kernel.jit[0][1][:3])
    step.fast = _launch.arm(step, compiled, (a, b, c), launched_lead)
    return step, kernel, compiled, (a, b, c)


def test_armed_launch_passes_current_pointers_and_the_bound_rest(fake_cuda, monkeypatch):
    step, kernel, compiled, (a, b, c) = _armed(fake_cuda, monkeypatch)
    assert step.fast is not None and len(kernel.jit) == 1
    grid, args, kwargs = kernel.jit[0]
    assert args[2].block_shape == [16, 8] and kwargs == {"BLOCK": 16}
    step(a, b, c)
    a2 = torch.ones(64 * 32, dtype=torch.float16)  # a new tensor: its own pointer, never the old
    step(a2, b, c)
    assert len(kernel.jit) == 1
    first, second = compiled.calls
    # grid (from the callable, padded to 3-D), the stream of the current device, the function
    assert first[:6] == (4, 2, 1, 1000, "fn", ("warps", 1, 0))
    assert first[6:9] == (None, None, None)  # launch metadata and hooks
    assert first[9:11] == (a.data_ptr(), b.data_ptr())
    desc = first[11]  # a descriptor of c's memory with the block the pre-hook chose
    assert desc.base.data_ptr() == c.data_ptr() and desc.block_shape == [16, 8]
    assert (desc.shape, desc.strides) == ([64, 32], [32, 1])
    # M, N, stride, the constexprs (slots the launcher ignores), EXTRA's default
    assert first[12:] == (64, 32, 8, 16, 0, 7)
    assert second[9] == a2.data_ptr() and second[10:] == first[10:]
    assert second[11] is desc  # the same memory: the cached descriptor


def test_armed_launch_falls_back_to_the_jit(fake_cuda, monkeypatch):
    step, kernel, compiled, (a, b, c) = _armed(fake_cuda, monkeypatch)
    base = torch.zeros(64 * 33, dtype=torch.float16)
    step(base[1:2049], b, c)  # another alignment than the compiled kernel's specialization
    step(a, None, c)  # None where the kernel was compiled for a pointer
    fake_cuda["device"] = 1  # another current device than the one the kernel was loaded on
    step(a, b, c)
    fake_cuda["device"] = 0
    monkeypatch.setattr(_launch._knobs.runtime, "launch_enter_hook", lambda *args: None)
    step(a, b, c)  # a launch hook (a profiler) wants the JIT path's metadata
    assert not compiled.calls and len(kernel.jit) == 5
    assert all(grid == step.grid and kwargs == {"BLOCK": 16} for grid, _, kwargs in kernel.jit)


def test_armed_launch_through_the_c_launcher(fake_cuda, monkeypatch):
    """Where the driver's launcher is reachable, descriptors go in expanded (the CUtensorMap,
    shape and strides the launcher takes), expanded once per pointer."""
    launched, expanded = [], []

    def expand(desc, meta):
        expanded.append(desc.base.data_ptr())
        return [("map", desc.base.data_ptr()), *desc.shape, *desc.strides]

    raw = (lambda *args: launched.append(args), False, True, expand)
    step, kernel, compiled, (a, b, c) = _armed(fake_cuda, monkeypatch, raw=raw)
    step(a, b, c)
    step(a, b, c)
    assert not compiled.calls and len(launched) == 2 and expanded == [c.data_ptr()]
    args = launched[0]
    assert args[:13] == (4, 2, 1, 1000, "fn", False, True, None, None, ("warps", 1, 0), None,
                         None, None)  # fmt: skip
    assert args[13:] == (a.data_ptr(), b.data_ptr(), ("map", c.data_ptr()), 64, 32, 32, 1,
                         64, 32, 8, 16, 0, 7)  # fmt: skip


def test_arm_refuses_what_it_cannot_bind(fake_cuda, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "device", property(lambda t: torch.device("cuda", 0)))
    a = torch.zeros(8, dtype=torch.float16)
    compiled = _Compiled()
    # N has no value and no default, and is no constexpr
    step = Step(_Kernel(), (1,), (64,), {"BLOCK": 16}, descs=[(2, 2, (8,), (1,), (8,))])
    assert _launch.arm(step, compiled, (a, a, a), step.lead((a, a, a))) is None
    # a descriptor slot the step does not rebuild
    step = Step(_Kernel(), (1,), (64, 32, 8), {"BLOCK": 16})
    desc = _launch.TensorDescriptor(a, [8], [1], [8])
    assert _launch.arm(step, compiled, (a, a, desc), [a, a, desc]) is None


def test_unarmed_step_uses_the_jit_and_arms_only_on_a_compiled_kernel():
    kernel = _Kernel()
    step = Step(kernel, (3,), (5,), {"X": 1})
    step(torch.zeros(2))
    assert step.fast is None and len(kernel.jit) == 1  # the stand-in returned no CompiledKernel


def _compiling_kernel(monkeypatch):
    """A stand-in kernel whose JIT launch returns a compiled kernel (as on a GPU), with arming
    recorded instead of done: (kernel, the steps armed)."""
    compiled, armed = _Compiled(), []

    class Kernel(_Kernel):
        def __getitem__(self, grid):
            launch = super().__getitem__(grid)
            return lambda *args, **kwargs: launch(*args, **kwargs) or compiled

    monkeypatch.setattr(_launch, "_FAST", True)
    monkeypatch.setattr(_launch, "CompiledKernel", _Compiled)
    monkeypatch.setattr(_launch, "arm", lambda step, *rest: armed.append(step) or "armed")
    return Kernel(), armed


def test_once_launches_through_the_jit_without_arming(monkeypatch):
    """Step.once (a step built for a single call) launches through kernel[grid] and leaves the
    step unarmed, where a call would arm it on a compiled kernel."""
    kernel, armed = _compiling_kernel(monkeypatch)
    step = Step(kernel, (3,), (5,), {"X": 1})
    step.once(torch.zeros(2))
    assert step.fast is None and armed == [] and len(kernel.jit) == 1
    step(torch.zeros(2))
    assert armed == [step] and step.fast == "armed" and len(kernel.jit) == 2


def test_softmax_launch_without_a_plan_key_is_not_armed(monkeypatch):
    """A softmax launch that no plan keeps (a permuted view copied to rows, a capture) goes
    through Step.once; one under a key is armed and kept."""
    from kernels.softmax import dispatch as softmax_dispatch

    kernel, armed = _compiling_kernel(monkeypatch)
    moved = [torch.zeros(4, 8), torch.empty(4, 8)]
    got = softmax_dispatch._launch_planned(lambda k: k, kernel, 4, moved, (4, 8), {}, None)
    assert got is None and armed == [] and len(kernel.jit) == 1
    key = ("test-key",)
    try:
        got = softmax_dispatch._launch_planned(lambda k: k, kernel, 4, moved, (4, 8), {}, key)
        assert armed == [got] and softmax_dispatch._PLANS[key] is got and len(kernel.jit) == 2
    finally:
        softmax_dispatch._PLANS.pop(key, None)


@pytest.mark.slow
def test_compiled_host_cost_refuses_bad_arguments_before_any_work():
    """scripts/compiled_host_cost.py: an unknown shape, or no GPU, is one line and exit 2."""
    script = Path(__file__).resolve().parent.parent / "scripts" / "compiled_host_cost.py"
    bad = subprocess.run([sys.executable, str(script), "--shape", "1x1"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--shape 1x1: not in softmax's default set" in bad.stderr
    if not torch.cuda.is_available():
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        assert run.returncode == 2 and run.stderr.strip() == "compiled_host_cost: needs a CUDA GPU"


def test_descriptor_cache_is_keyed_by_pointer():
    t = torch.zeros(64, 64, dtype=torch.float16)
    other = torch.zeros(64, 64, dtype=torch.float16)
    get = _launch.desc_cache(torch.float16, (64, 64), (64, 1), (16, 32))
    d1 = get(t.data_ptr())
    assert get(t.data_ptr()) is d1 and get(other.data_ptr()) is not d1
    assert get(other.data_ptr()).base.data_ptr() == other.data_ptr()
    assert (d1.shape, d1.strides, d1.block_shape) == ([64, 64], [64, 1], [16, 32])
    # a cached descriptor keeps no tensor alive
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None


def test_descriptors_bind_a_context_once_per_thread(monkeypatch):
    """Autograd's backward thread may have no current CUDA context: a descriptor is encoded
    only after one runtime call per thread has bound the primary context."""
    import threading

    calls = []

    class Stream:
        def query(self):
            calls.append(threading.get_ident())
            return True

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
    monkeypatch.setattr(_launch, "_THREAD", threading.local())
    t = torch.zeros(64, 64, dtype=torch.float16)
    get = _launch.desc_cache(torch.float16, (64, 64), (64, 1), (16, 32))
    get(t.data_ptr())
    get(t.data_ptr() + 4096)
    assert len(calls) == 1
    worker = threading.Thread(target=lambda: get(t.data_ptr() + 8192))
    worker.start()
    worker.join()
    assert len(calls) == 2 and calls[0] != calls[1]


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("op", ["matmul", "softmax", "linear", "conv"])
def test_cuda_graph_capture_of_a_cached_call(op):
    import kernels

    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16

    def rand(*shape):
        return torch.randn(*shape, generator=g, device="cuda", dtype=dt)

    if op == "matmul":
        args, fn, ref = (rand(256, 512), rand(512, 384)), kernels.matmul, torch.matmul
    elif op == "softmax":
        args, fn = (rand(512, 65536),), kernels.softmax
        ref = lambda x: torch.softmax(x.float(), -1).to(dt)  # noqa: E731
    elif op == "linear":
        args, fn = (rand(64, 512), rand(384, 512), rand(384)), kernels.linear
        ref = torch.nn.functional.linear
    else:
        x = rand(8, 64, 28, 28).to(memory_format=torch.channels_last)
        w = rand(64, 64, 3, 3).to(memory_format=torch.channels_last)
        args = (x, w, None, 1, 1)
        fn, ref = kernels.conv2d, torch.nn.functional.conv2d
    for _ in range(3):  # compiled, then launched from the cached plan
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*args)
    for t in args:  # new values in place: the replay must read them
        if isinstance(t, torch.Tensor):
            t.copy_(torch.randn(t.shape, generator=g, device="cuda", dtype=dt))
    graph.replay()
    torch.cuda.synchronize()
    expected = ref(*[t.double() if isinstance(t, torch.Tensor) else t for t in args])
    assert relative_error(out, expected.to(dt)) <= tolerance("bf16", False)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [65536, 262144])
def test_long_row_plans_over_repeated_calls(n):
    """Long rows (smem / coop designs) on their alternating plans: new values every call, the
    forward and the backward, both buffers of the pair taken."""
    import kernels
    from kernels.softmax import dispatch as softmax_dispatch
    from kernels.softmax.coop import AlternatingPlan

    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(5):
        x = torch.randn(64, n, generator=g, device="cuda", dtype=torch.bfloat16)
        x.requires_grad_(True)
        dy = torch.randn(64, n, generator=g, device="cuda", dtype=torch.bfloat16)
        y = kernels.softmax(x, -1)
        y.backward(dy)
        xd = x.detach().double().requires_grad_(True)
        ref = torch.softmax(xd, -1)
        ref.backward(dy.double())
        want = ref.detach().to(torch.bfloat16)
        assert relative_error(y.detach(), want) <= tolerance("bf16", False)
        dx = xd.grad.to(torch.bfloat16)
        assert relative_error(x.grad, dx) <= tolerance("bf16", False)
    plans = [p for p in softmax_dispatch._PLANS.values() if isinstance(p, AlternatingPlan)]
    assert plans and all(None not in p.steps for p in plans)


@pytest.mark.gpu
def test_triton_compiled_softmax_long_rows_fullgraph():
    """triton-compiled softmax over rows of 65536 (the coop design under wrap_triton) compiles
    with fullgraph=True and stays right over repeated calls of one compiled graph (each call
    zeroes its own workspace)."""
    import kernels.ops

    torch.compiler.reset()
    compiled = torch.compile(lambda x: kernels.ops.softmax(x, -1), fullgraph=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(3):
        x = torch.randn(512, 65536, generator=g, device="cuda", dtype=torch.bfloat16)
        ref = torch.softmax(x.double(), -1).to(torch.bfloat16)
        assert relative_error(compiled(x), ref) <= tolerance("bf16", False)


# ---------------------------------------------------------------------------------------------
# A failed row's reason (experiments.measure.failure_reason)
# ---------------------------------------------------------------------------------------------
def test_failure_reason_names_the_root_exception():
    from experiments.measure import failure_reason

    class BackendCompilerFailed(Exception):  # torch._dynamo's wrapper, whose text can be empty
        pass

    try:
        try:
            try:
                raise AssertionError("tensor fake mode mismatch")
            except AssertionError as inner:
                raise RuntimeError("lowering failed") from inner
        except RuntimeError:
            raise BackendCompilerFailed("") from None
    except BackendCompilerFailed as exc:
        flat = failure_reason(exc)  # `from None`: nothing below the wrapper to report
    assert flat == "BackendCompilerFailed"

    try:
        try:
            raise AssertionError("\n  tensor fake mode mismatch\nmore")
        except AssertionError as inner:
            raise BackendCompilerFailed("backend='inductor' raised:\n") from inner
    except BackendCompilerFailed as exc:
        reason = failure_reason(exc)
    assert reason == "AssertionError: tensor fake mode mismatch (via BackendCompilerFailed)"

    try:
        try:
            raise ValueError("x" * 1000)
        except ValueError:
            raise KeyError("during handling")  # noqa: B904 - an implicit __context__ chain
    except KeyError as exc:
        long = failure_reason(exc, limit=80)
    assert long.startswith("ValueError: xxx") and long.endswith("... (via KeyError)")
    assert len(long) == 80


def test_failure_reason_of_a_compile_worker_names_the_worker_s_exception():
    from torch._inductor.compile_worker.subproc_pool import SubprocException

    from experiments.measure import failure_reason

    details = ('Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
               "triton.compiler.errors.CompilationError: at 12:4: out of resource: shared\n")
    try:
        try:
            raise SubprocException(details, name="compile")
        except SubprocException as inner:
            raise RuntimeError("InductorError") from inner
    except RuntimeError as exc:
        reason = failure_reason(exc)
    assert reason == ("SubprocException: An exception occurred in a subprocess: triton.compiler."
                      "errors.CompilationError: at 12:4: out of resource: shared (via "
                      "RuntimeError)")  # fmt: skip


def test_failure_reason_of_an_empty_assert():
    from experiments.measure import failure_reason

    assert failure_reason(AssertionError()) == "AssertionError"


@pytest.mark.parametrize("argv", [["--ops", "matmul,nope"], ["--dtype", "fp8"], ["--calls", "3"]])
def test_host_path_script_rejects_bad_arguments(argv, capsys):
    from experiments.host_path import parse_args

    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith("host_path: ")


def test_conv_training_checks_run_once_per_call_key(plans, monkeypatch):
    """A training call (inputs that need a gradient) checks its arguments once per call key, as a
    planned forward does: the same key again runs no check and still gives the right gradients;
    another layout or padding is checked again, and a bad argument is refused at its first call."""
    from kernels import conv2d
    from kernels.conv import dispatch as conv_dispatch

    checks, keys = [], []
    real_check, real_key = conv_dispatch._check, conv_dispatch._plan_key
    monkeypatch.setattr(conv_dispatch, "_check",
                        lambda *a, **k: checks.append(1) or real_check(*a, **k))  # fmt: skip
    monkeypatch.setattr(conv_dispatch, "_plan_key",
                        lambda *a, **k: keys.append(1) or real_key(*a, **k))  # fmt: skip
    g = torch.Generator().manual_seed(9)
    for step in range(2):
        keys.clear()
        x = torch.randn(2, 8, 7, 9, generator=g).to(memory_format=torch.channels_last)
        w = torch.randn(6, 8, 3, 3, generator=g).to(memory_format=torch.channels_last)
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        conv2d(xg, wg, None, 2, 1).sum().backward()
        xr, wr = x.double().requires_grad_(), w.double().requires_grad_()
        torch.nn.functional.conv2d(xr, wr, None, 2, 1).sum().backward()
        _close(xg.grad, xr.grad.float())
        _close(wg.grad, wr.grad.float())
        if step == 0:  # the training entry's checks, then the forward's own (its first plan)
            first = len(checks)
            assert first == 2
    assert len(checks) == first  # the second step: no check at all
    assert len(keys) == 1  # and one key, which the forward's plan is kept under too
    conv2d(xg.detach().contiguous().requires_grad_(), wg, None, 2, 1)  # NCHW: another key
    conv2d(xg, wg, None, 2, 0)  # another padding
    assert len(checks) == first + 4
    with pytest.raises(ValueError, match="channels"):
        conv2d(torch.randn(2, 5, 7, 9, requires_grad=True), wg, None, 2, 1)
