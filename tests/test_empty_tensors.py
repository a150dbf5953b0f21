"""Empty tensors behave as in torch in every op, forward and backward: a model can make them,
and under kernels.enable() they reach our kernels. With K = 0 a product is zeros (+ bias); with
M or N = 0 it is empty."""

import pytest
import torch
import torch.nn.functional as F

import kernels
from tests.conftest import DEVICE

# (op, torch's twin, the arguments' shapes; ints and None pass as they are)
CASES = {
    "matmul-k0-batched-a": ("matmul", torch.matmul, [(5, 5, 0), (0, 5)]),
    "matmul-m0": ("matmul", torch.matmul, [(0, 4), (4, 3)]),
    "matmul-n0": ("matmul", torch.matmul, [(4, 3), (3, 0)]),
    "matmul-k0": ("matmul", torch.matmul, [(4, 0), (0, 3)]),
    "matmul-batched-m0": ("matmul", torch.matmul, [(2, 0, 3), (2, 3, 4)]),
    "matmul-batch0": ("matmul", torch.matmul, [(0, 2, 3), (0, 3, 4)]),
    "matmul-batched-k0": ("matmul", torch.matmul, [(2, 4, 0), (2, 0, 3)]),
    "linear-m0": ("linear", F.linear, [(0, 8), (4, 8), (4,)]),
    "linear-k0": ("linear", F.linear, [(3, 0), (4, 0), (4,)]),
    "linear-k0-3d": ("linear", F.linear, [(2, 3, 0), (4, 0), (4,)]),
    "linear-n0": ("linear", F.linear, [(3, 8), (0, 8)]),
    "softmax-rows0": ("softmax", torch.softmax, [(0, 5), -1]),
    "softmax-cols0": ("softmax", torch.softmax, [(5, 0), -1]),
    "conv-n0": ("conv2d", F.conv2d, [(0, 3, 8, 8), (4, 3, 3, 3)]),
    "conv-depthwise-n0": ("conv2d", F.conv2d, [(0, 4, 8, 8), (4, 1, 3, 3), None, 1, 1, 1, 4]),
}


def _arguments(spec, grad: bool, generator):
    made = []
    for item in spec:
        if isinstance(item, tuple):
            t = torch.randn(item, generator=generator).to(DEVICE)
            made.append(t.requires_grad_(grad))
        else:
            made.append(item)
    return made


@pytest.mark.parametrize("grad", [False, True], ids=["fwd", "fwd_bwd"])
@pytest.mark.parametrize("case", list(CASES))
def test_empty_tensors_behave_as_in_torch(case, grad):
    op, twin, spec = CASES[case]
    ours_args = _arguments(spec, grad, torch.Generator().manual_seed(0))
    torch_args = _arguments(spec, grad, torch.Generator().manual_seed(0))
    got = getattr(kernels, op)(*ours_args)
    want = twin(*torch_args)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)  # zeros, or bias rows, where K = 0
    if not grad:
        return
    dy = torch.randn(want.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got.backward(dy)
    want.backward(dy)
    for ours, theirs in zip(ours_args, torch_args, strict=True):
        if isinstance(theirs, torch.Tensor):
            assert ours.grad is not None and ours.grad.shape == theirs.grad.shape
            torch.testing.assert_close(ours.grad, theirs.grad)


def test_a_conv_of_no_input_channels_is_its_bias():
    """C = 0: every output is the bias, activated (torch's CPU conv returns a 0-channel tensor
    here instead, which no conv defines; ours keeps the K channels of the weight)."""
    x = torch.randn(2, 0, 8, 8, device=DEVICE, requires_grad=True)
    w = torch.randn(4, 0, 3, 3, device=DEVICE, requires_grad=True)
    b = torch.randn(4, device=DEVICE, requires_grad=True)
    y = kernels.conv2d(x, w, b, activation="relu")
    torch.testing.assert_close(y, F.relu(b).view(1, 4, 1, 1).expand(2, 4, 6, 6))
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    torch.testing.assert_close(b.grad, (b > 0).float() * 36 * 2)


def test_a_conv_of_no_output_channels_is_refused_as_torch_refuses_it():
    x, w = torch.randn(2, 3, 8, 8, device=DEVICE), torch.randn(0, 3, 3, 3, device=DEVICE)
    with pytest.raises(RuntimeError):
        F.conv2d(x, w)
    with pytest.raises(ValueError, match="no output channels"):
        kernels.conv2d(x, w)
