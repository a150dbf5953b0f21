"""The public API of every registered op, through its workload: our function against a float64
reference on the op's `cpu` shapes, in every dtype, on contiguous and strided inputs, with
gradients where the op trains, and one clear error for inputs it does not take.

Each op's own test file goes deeper (its designs, dispatch and GPU paths); this one is what every
op owes the harness, so a new op is held to it by registering it.
"""

import copy

import pytest
import torch
from omegaconf import OmegaConf

from experiments import registry
from experiments.correctness import allowed_error, relative_error, tolerance
from experiments.registry import make_workload
from experiments.workloads import resolve_shapes
from tests.conftest import CONF_DIR, DEVICE, fast_subset

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _no_tf32(monkeypatch):
    """fp32 is held to fp32's tolerance, so TF32 stays off: torch lets cuDNN convs use it by
    default, and the conv kernels follow that switch (on a GPU they would then round to TF32)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


def _workload(name):
    cfg = OmegaConf.load(CONF_DIR / "kernel" / f"{name}.yaml")
    workload = make_workload(cfg)
    _, shapes = resolve_shapes(workload, cfg, "cpu", on_gpu=False)
    return workload, shapes[0]


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a view whose last dim has stride 2 (a slice of a wider buffer)."""
    wide = t.new_empty(*t.shape[:-1], 2 * t.shape[-1])
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        wide = wide.contiguous(memory_format=torch.channels_last)  # keep the op's own layout
    view = wide[..., ::2]
    view.copy_(t)
    return view


def _modules(workload, shape, dtype):
    generator = torch.Generator(device=DEVICE).manual_seed(1)
    eager = workload.make_module(shape, registry.namespace("eager")).to(DEVICE)
    workload.init_parameters(eager, generator)
    eager = eager.to(dtype)
    ours = copy.copy(eager)
    ours.ops = registry.namespace("triton")
    reference = copy.deepcopy(eager).to(torch.float64)
    inputs = workload.make_inputs(shape, dtype, DEVICE, generator)
    return ours, reference, inputs


OP_NAMES = registry.names("op", "block")  # a whole model's API is its library's (test_models.py)
CASES = [(name, dtype, layout) for name in OP_NAMES for dtype in DTYPES
         for layout in ("contiguous", "strided")]  # fmt: skip


# every dtype in make test-all; fp32 and bf16 in the fast suite
@pytest.mark.parametrize("name, dtype_name, layout",
                         fast_subset(CASES, [c for c in CASES if c[1] != "fp16"], unpack=True))
def test_forward_matches_float64(name, dtype_name, layout):
    workload, shape = _workload(name)
    ours, reference, inputs = _modules(workload, shape, DTYPES[dtype_name])
    if layout == "strided":
        inputs = tuple(_strided(t) for t in inputs)
        assert not any(t.is_contiguous() for t in inputs)
    out = ours(*inputs)
    expected = reference(*(t.to(torch.float64) for t in inputs))
    assert out.dtype == inputs[0].dtype and out.shape == expected.shape
    assert relative_error(out, expected) < tolerance(dtype_name, tf32=False)


TRAINING = [(name, dtype) for name in OP_NAMES if "fwd_bwd" in registry.OPS[name].passes
            for dtype in DTYPES]  # fmt: skip


@pytest.mark.parametrize("name, dtype_name", fast_subset(
    TRAINING, [c for c in TRAINING if c[1] == "fp32"], unpack=True))
def test_gradients_match_float64(name, dtype_name):
    workload, shape = _workload(name)
    ours, reference, inputs = _modules(workload, shape, DTYPES[dtype_name])
    inputs = [t.requires_grad_() for t in inputs]
    ref_inputs = [t.detach().to(torch.float64).requires_grad_() for t in inputs]
    out = ours(*inputs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out)
    out.backward(grad)
    eager = copy.copy(ours)  # the same parameters through torch's ops: its own error is the bar
    eager.ops = registry.namespace("eager")
    eager_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    grads = [p.grad for p in ours.parameters()]
    for p in ours.parameters():
        p.grad = None
    eager(*eager_inputs).backward(grad)
    baseline = [t.grad for t in eager_inputs] + [p.grad for p in eager.parameters()]
    for p, g in zip(ours.parameters(), grads, strict=True):
        p.grad = g
    reference(*ref_inputs).backward(grad.to(torch.float64))
    got = [t.grad for t in inputs] + [p.grad for p in ours.parameters()]
    want = [t.grad for t in ref_inputs] + [p.grad for p in reference.parameters()]
    for g, b, w in zip(got, baseline, want, strict=True):
        # the dtype's budget, or twice eager's own error where a chain of roundings (a block's
        # backward) puts eager itself past it
        limit = allowed_error(tolerance(dtype_name, tf32=False), relative_error(b, w))
        assert relative_error(g, w) < limit


@pytest.mark.parametrize("name", OP_NAMES)
def test_an_unsupported_dtype_is_one_clear_error(name):
    """float64 is not among the kernels' dtypes: refused before anything is launched."""
    workload, shape = _workload(name)
    ours, _, inputs = _modules(workload, shape, torch.float32)
    ours = ours.to(torch.float64)
    with pytest.raises((TypeError, ValueError)) as info:
        ours(*(t.to(torch.float64) for t in inputs))
    message = str(info.value)
    assert "float64" in message and len(message.splitlines()) == 1


def test_torch_signatures_through_the_custom_ops():
    """What the torch.nn.functional twins take, through kernels.ops (mode=triton-compiled) as
    through the direct functions: a 1-D linear input, conv2d's string padding (an even kernel's
    'same' as the op's (top, left, bottom, right) form) and softmax's dtype=."""
    import torch.nn.functional as F

    import kernels
    import kernels.ops

    g = torch.Generator().manual_seed(11)
    x1, w, b = (torch.randn(*s, generator=g) for s in ((24,), (8, 24), (8,)))
    ref = F.linear(x1.double(), w.double(), b.double())
    for fn in (kernels.linear, kernels.ops.linear):
        y = fn(x1, w, b)
        assert y.shape == (8,) and relative_error(y, ref) <= tolerance("fp32", False)
    x, k = torch.randn(1, 16, 6, 7, generator=g), torch.randn(4, 16, 2, 3, generator=g)
    for padding in ("same", "valid"):
        ref = F.conv2d(x.double(), k.double(), None, 1, padding)
        for fn in (kernels.conv2d, kernels.ops.conv2d):
            y = fn(x, k, None, 1, padding)
            assert y.shape == ref.shape and relative_error(y, ref) <= tolerance("fp32", False)
    s = torch.randn(5, 33, generator=g).to(torch.bfloat16)
    ref = torch.softmax(s.double(), -1)
    for fn in (kernels.softmax, kernels.ops.softmax):
        y = fn(s, -1, dtype=torch.float32)
        assert y.dtype == torch.float32 and relative_error(y, ref) <= tolerance("fp32", False)


@pytest.mark.slow
def test_depthwise_conv_through_both_entries():
    """groups = C (depthwise, channel multiplier 2) through kernels.conv2d and the custom op of
    mode=triton-compiled; any other grouping is one clear error."""
    import torch.nn.functional as F

    import kernels
    import kernels.ops

    g = torch.Generator().manual_seed(12)
    w, b = torch.randn(12, 1, 3, 3, generator=g), torch.randn(12, generator=g)
    for _ in range(2):  # the direct call's second launch takes its plan, on new data
        x = torch.randn(2, 6, 7, 9, generator=g).to(memory_format=torch.channels_last)
        ref = F.conv2d(x.double(), w.double(), b.double(), 1, "same", 1, 6)
        for fn in (kernels.conv2d, kernels.ops.conv2d):
            y = fn(x, w, b, 1, "same", 1, 6)
            assert relative_error(y, ref) <= tolerance("fp32", False)
            assert y.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match=r"groups=4 must divide C = 6 and K = 12"):
        kernels.conv2d(x, torch.randn(12, 3, 3, 3, generator=g), groups=4)  # 6 channels, 4 groups
