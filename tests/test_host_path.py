"""The cached host path (kernels/_launch.py and the wrappers' plan caches): what is cached, under
which key, and that a cached plan never launches on a stale pointer or layout.

On CPU the kernels run in the interpreter, which keeps the JIT launch, so the plan caches are
exercised through the real wrappers (results against float64) and the fast launch through a
stand-in compiled kernel that records what it would have launched. The GPU tests at the end
capture a cached call in a CUDA graph and compile the traced softmax over 65536-column rows."""

import gc
import weakref

import pytest
import torch

from experiments.correctness import relative_error, tolerance
from kernels import _launch
from kernels._common import pretend_gpu, reset_tuning
from kernels._launch import Step, _Compiled, host_descriptor
from kernels.linear import linear, linear_reference
from kernels.matmul import dispatch as matmul_dispatch
from kernels.matmul import matmul

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
    # another GPU (kernels._common.pretend_gpu stands in for a device of another capability)
    with pretend_gpu((9, 0), 132):
        hopper = matmul_dispatch._plan_key(a, b, None, 0, False)
    with pretend_gpu((8, 0), 108):
        ampere = matmul_dispatch._plan_key(a, b, None, 0, False)
    assert len({key, hopper, ampere}) == 3


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


def test_reset_tuning_empties_the_plans(plans):
    matmul(torch.ones(4, 4), torch.ones(4, 4))
    assert plans
    reset_tuning()
    assert not plans


# ---------------------------------------------------------------------------------------------
# The fast launch, with a stand-in compiled kernel
# ---------------------------------------------------------------------------------------------
class _Recorder:
    """Stands in for CompiledKernel.run and for a kernel indexed with a grid."""

    def __init__(self):
        self.fast, self.jit = [], []

    def run(self, *args):
        self.fast.append(args)

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.jit.append((grid, args, kwargs))


@pytest.fixture
def fake_cuda(monkeypatch):
    state = {"device": 0}
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: state["device"], raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 1000 + d, raising=False)
    return state


def _armed_step(recorder, lead):
    step = Step(recorder, (7, 2), (11, 12), {"BLOCK": 64})
    compiled = type("C", (), {})()
    compiled.run, compiled.function, compiled.packed_metadata = recorder.run, "fn", "meta"
    kinds = tuple(_launch._kind(v) for v in lead)
    step.compiled = _Compiled(compiled, (7, 2, 1), 0, (11, 12, 64), kinds)
    return step


def test_fast_launch_passes_current_pointers(fake_cuda):
    rec = _Recorder()
    a, c = torch.zeros(8), torch.zeros(8)
    step = _armed_step(rec, (a, None, c))
    step(a, None, c)
    a2 = torch.ones(8)  # a new tensor at the same shape: its own pointer, never the old one
    step(a2, None, c)
    assert not rec.jit
    (first, second) = rec.fast
    assert first[:4] == (7, 2, 1, 1000) and first[4:6] == ("fn", "meta")
    assert first[9:] == (a.data_ptr(), None, c.data_ptr(), 11, 12, 64)
    assert second[9:] == (a2.data_ptr(), None, c.data_ptr(), 11, 12, 64)


def test_fast_launch_falls_back_to_the_jit(fake_cuda, monkeypatch):
    rec = _Recorder()
    base = torch.zeros(64)
    a = base[:8]
    step = _armed_step(rec, (a, None))
    step(base[1:9], None)  # another alignment than the compiled kernel's specialization
    step(a, a)  # a tensor where the kernel was compiled for None
    fake_cuda["device"] = 1  # another current device than the one the kernel was loaded on
    step(a, None)
    fake_cuda["device"] = 0
    monkeypatch.setattr(_launch._knobs.runtime, "launch_enter_hook", lambda *args: None)
    step(a, None)  # a launch hook (a profiler) wants the JIT path's metadata
    assert not rec.fast and len(rec.jit) == 4
    assert all(grid == (7, 2) and kwargs == {"BLOCK": 64} for grid, _, kwargs in rec.jit)


def test_unarmed_step_uses_the_jit_and_arms_only_on_a_compiled_kernel():
    rec = _Recorder()
    step = Step(rec, (3,), (5,), {"X": 1})
    step(torch.zeros(2))
    assert step.compiled is None and len(rec.jit) == 1  # the recorder returned no CompiledKernel


def test_host_descriptors_are_cached_by_pointer_and_layout():
    t = torch.zeros(64, 64, dtype=torch.float16)
    d1 = host_descriptor(t.data_ptr(), t.dtype, (64, 64), (64, 1), (16, 32))
    assert host_descriptor(t.data_ptr(), t.dtype, (64, 64), (64, 1), (16, 32)) is d1
    other = torch.zeros(64, 64, dtype=torch.float16)
    d2 = host_descriptor(other.data_ptr(), t.dtype, (64, 64), (64, 1), (16, 32))
    d3 = host_descriptor(t.data_ptr(), t.dtype, (64, 64), (64, 1), (32, 32))
    d4 = host_descriptor(t.data_ptr(), t.dtype, (64, 32), (64, 1), (16, 32))
    assert len({id(d) for d in (d1, d2, d3, d4)}) == 4
    assert d2.base.data_ptr() == other.data_ptr() and d3.block_shape == [32, 32]
    assert d4.shape == [64, 32] and d4.strides == [64, 1]
    # a cached descriptor keeps no tensor alive
    ref = weakref.ref(other)
    del other
    gc.collect()
    assert ref() is None


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
