"""kernels.conv2d's backward (kernels/conv/backward.py) against float64 autograd of F.conv2d.

dX, dW and db of the public function and of the triton-compiled custom op, over the geometries
the issue names (C = 3, K = 1, 1x1 and 7x7, stride 2 and 3, dilation 2, N = 1), both layouts,
the activations, the dtypes, non-contiguous gradients and inputs; the dgrad's stride phases on
their own; plans reused only for the geometry they were made for; bad input. Sizes stay small:
on CPU every kernel runs in the Triton interpreter. GPU-marked tests run ResNet-50 layers.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F

import kernels
from experiments.correctness import relative_error
from kernels import ops
from kernels._common import reset_tuning
from kernels.conv import backward
from kernels.conv.backward import dgrad_convs
from tests.conftest import fast_subset
from tests.test_kernels_conv import DTYPES, REFERENCE_ACTIVATIONS, budget

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (N, C, H, W, K, R, S, stride, padding, dilation)
GEOMETRIES = {
    "3x3-s1": (1, 16, 7, 9, 16, 3, 3, 1, 1, 1),
    "3x3-s2-odd": (2, 16, 9, 8, 17, 3, 3, 2, 1, 1),
    "stem-7x7-s2-c3": (1, 3, 11, 10, 16, 7, 7, 2, 3, 1),
    "1x1-s2": (2, 16, 8, 8, 16, 1, 1, 2, 0, 1),
    "3x3-s3-d2": (1, 16, 10, 11, 16, 3, 3, 3, 2, 2),
    "k1-d2": (1, 16, 9, 9, 1, 3, 3, 1, 0, 2),
    "1x1-s1": (2, 16, 6, 5, 24, 1, 1, 1, 0, 1),
    "pad-past-window": (1, 16, 7, 7, 16, 3, 3, 1, 3, 1),  # the dgrad's padding is negative
    "5x3-s(2,3)": (1, 16, 9, 13, 8, (5, 3), None, (2, 3), (2, 1), 1),
}


def _make(geometry, channels_last, dtype, generator):
    n, c, h, w, k, r, s, stride, padding, dilation = geometry
    rs = r if isinstance(r, tuple) else (r, s)
    x = torch.randn(n, c, h, w, generator=generator).to(DEVICE, dtype)
    weight = torch.randn(k, c, *rs, generator=generator) / (c * rs[0] * rs[1]) ** 0.5
    weight = weight.to(DEVICE, dtype).contiguous(memory_format=torch.channels_last)
    bias = torch.randn(k, generator=generator).to(DEVICE, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, weight, bias, stride, padding, dilation


def _reference(x, weight, bias, stride, padding, dilation, activation, dy):
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    y = REFERENCE_ACTIVATIONS[activation](F.conv2d(*leaves, stride, padding, dilation))
    y.backward(dy.double())
    return y, *(t.grad for t in leaves)


def _check(fn, geometry, channels_last, activation, dtype, seed=0, dy_of=None):
    generator = torch.Generator().manual_seed(seed)
    x, weight, bias, stride, padding, dilation = _make(geometry, channels_last, dtype, generator)
    for t in (x, weight, bias):
        t.requires_grad_()
    y = fn(x, weight, bias, stride, padding, dilation, activation=activation)
    dy = torch.randn(y.shape, generator=generator).to(DEVICE, dtype)
    if dy_of is not None:
        dy = dy_of(dy)
    y.backward(dy)
    want = _reference(x, weight, bias, stride, padding, dilation, activation, dy)
    got = (y, x.grad, weight.grad, bias.grad)
    for name, g, ref in zip(("y", "dx", "dw", "db"), got, want, strict=True):
        assert g.shape == ref.shape and g.dtype == dtype, (name, g.shape, g.dtype)
        err = relative_error(g, ref)
        # fp32 accumulation throughout; the inputs' and outputs' rounding to the dtype dominates
        assert err < budget(dtype), f"{name}: relative error {err:.2e} ({dtype})"
    return x, y


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("name",
                         fast_subset(GEOMETRIES, ["3x3-s2-odd", "1x1-s1"]))
def test_gradients_match_float64(name, channels_last):
    x, y = _check(kernels.conv2d, GEOMETRIES[name], channels_last, "relu", torch.float32)
    if channels_last:  # dX follows x's layout, as the forward's output does
        assert x.grad.stride() == x.stride()
    else:
        assert x.grad.is_contiguous()


@pytest.mark.parametrize("activation", fast_subset([None, "gelu", "silu"], ["gelu"]))
def test_every_activation(activation):
    _check(kernels.conv2d, GEOMETRIES["3x3-s2-odd"], True, activation, torch.float32)


@pytest.mark.parametrize("dtype", fast_subset(["fp16", "bf16"], ["bf16"]))
@pytest.mark.parametrize("name", fast_subset(["3x3-s2-odd", "1x1-s1", "stem-7x7-s2-c3"]))
def test_half_dtypes(name, dtype):
    _check(kernels.conv2d, GEOMETRIES[name], True, "relu", DTYPES[dtype], seed=1)


def test_non_contiguous_gradient_and_input():
    # dY as a channel slice of a wider tensor; x a channel slice (channels_last, not dense)
    def sliced(dy):
        wide = torch.randn(dy.shape[0], dy.shape[1] + 3, *dy.shape[2:], device=DEVICE)
        wide = wide.to(dy.dtype).contiguous(memory_format=torch.channels_last)
        return wide[:, 1 : 1 + dy.shape[1]].copy_(dy)

    _check(kernels.conv2d, GEOMETRIES["3x3-s1"], True, "relu", torch.float32, dy_of=sliced)
    generator = torch.Generator().manual_seed(3)
    x_wide = torch.randn(2, 20, 7, 7, generator=generator).to(DEVICE)
    x = x_wide.contiguous(memory_format=torch.channels_last)[:, 2:18].requires_grad_()
    weight = torch.randn(8, 16, 3, 3, generator=generator).to(DEVICE).requires_grad_()
    y = kernels.conv2d(x, weight, None, 1, 1)
    dy = torch.randn(y.shape, generator=generator).to(DEVICE)
    y.backward(dy)
    ref = _reference(x, weight, torch.zeros(8), 1, 1, 1, None, dy)
    assert relative_error(x.grad, ref[1]) < budget(torch.float32)
    assert relative_error(weight.grad, ref[2]) < budget(torch.float32)


def test_only_the_requested_gradients():
    generator = torch.Generator().manual_seed(4)
    x, weight, bias, *geometry = _make(GEOMETRIES["3x3-s2-odd"], True, torch.float32, generator)
    weight.requires_grad_()
    y = kernels.conv2d(x, weight, bias, *geometry, activation="relu")
    y.sum().backward()  # an expanded (stride-0) dY
    assert x.grad is None and bias.grad is None and weight.grad is not None
    ref = _reference(x, weight, bias, *geometry, "relu", torch.ones(y.shape))
    assert relative_error(weight.grad, ref[2]) < budget(torch.float32)
    with torch.no_grad():  # no autograd graph under no_grad
        assert kernels.conv2d(x, weight, bias, *geometry).grad_fn is None


def test_unbatched_input_trains():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(16, 7, 7, generator=generator).to(DEVICE).requires_grad_()
    weight = torch.randn(8, 16, 3, 3, generator=generator).to(DEVICE).requires_grad_()
    y = kernels.conv2d(x, weight, padding="same")
    assert y.shape == (8, 7, 7)
    dy = torch.randn(y.shape, generator=generator).to(DEVICE)
    y.backward(dy)
    ref = _reference(x[None], weight, torch.zeros(8), 1, 1, 1, None, dy[None])
    assert relative_error(x.grad, ref[1][0]) < budget(torch.float32)


@pytest.mark.slow
def test_triton_compiled_trains_in_one_graph():
    def fn(x, weight, bias, stride, padding, dilation, activation):
        # a graph break is an error; static ints, as a module's attributes are
        compiled = torch.compile(ops.conv2d, fullgraph=True, dynamic=False)
        return compiled(x, weight, bias, stride, padding, dilation, activation=activation)

    torch.compiler.reset()
    _check(fn, GEOMETRIES["3x3-s2-odd"], True, "relu", torch.float32)
    _check(fn, GEOMETRIES["1x1-s1"], True, "silu", torch.float32)


def test_dgrad_phases_cover_dx_once_with_the_right_taps():
    """Brute force: every (dX row, tap, dZ row) triple with p·s + r·d - pad = h is in exactly
    one phase's sub-conv, and nothing else is."""
    for size, taps, stride, pad, dil in itertools.product(
        (1, 5, 8), (1, 2, 3, 7), (1, 2, 3), (0, 1, 3), (1, 2)
    ):
        out = (size + 2 * pad - dil * (taps - 1) - 1) // stride + 1
        if out < 1:
            continue
        want = {(h, r, p) for h in range(size) for r in range(taps) for p in range(out)
                if p * stride + r * dil - pad == h}  # fmt: skip
        convs, gaps = dgrad_convs((size, 1), (taps, 1), (stride, 1), (pad, 0), (dil, 1))
        got = set()
        for tc in convs:
            for i in range(tc.size[0]):
                h = tc.start[0] + i * stride
                for j, r in enumerate(tc.rows):
                    p = i - tc.padding[0] + j * tc.dilation[0]
                    if 0 <= p < out:
                        got.add((h, r, p))
        assert got == want, (size, taps, stride, pad, dil)
        covered = {tc.start[0] + i * stride for tc in convs for i in range(tc.size[0])}
        assert gaps == (covered != set(range(size)))


@pytest.mark.slow
def test_a_plan_serves_only_its_own_geometry():
    reset_tuning()  # the plans, the training entries that hold them too
    _check(kernels.conv2d, GEOMETRIES["3x3-s2-odd"], True, "relu", torch.float32, seed=6)
    planned = len(backward._DGRAD)
    _check(kernels.conv2d, GEOMETRIES["3x3-s2-odd"], True, "relu", torch.float32, seed=7)
    assert len(backward._DGRAD) == planned  # same geometry: the plan was reused, still right
    _check(kernels.conv2d, GEOMETRIES["3x3-s3-d2"], True, "relu", torch.float32, seed=8)
    assert len(backward._DGRAD) == planned + 1  # another geometry: its own plan


@pytest.mark.parametrize(
    "name, channels_last, activation",
    fast_subset([("3x3-s2-odd", True, None), ("3x3-s3-d2", True, "relu"), ("1x1-s1", True, "gelu"),
                 ("5x3-s(2,3)", False, None), ("pad-past-window", True, None)],
                [("1x1-s1", True, "gelu")], unpack=True),
)  # fmt: skip
def test_a_training_step_runs_its_kept_backward(name, channels_last, activation, monkeypatch):
    """The first step of a call key keeps its backward (backward.Backward) in the key's entry;
    the next steps, on new values, run it: no dgrad or wgrad key is built, and dX, dW and db
    still match float64. A dY in another layout, or another set of requested gradients, takes
    the planned-per-launch path again and is still right."""
    from kernels.conv import autograd, wgrad

    reset_tuning()
    _check(kernels.conv2d, GEOMETRIES[name], channels_last, activation, torch.float32, seed=20)
    entries = list(autograd._TRAINING.values())
    assert len(entries) == 1 and isinstance(entries[0].backward, backward.Backward)
    kept = entries[0].backward
    keys = []
    for module, attr in ((backward, "_dgrad_key"), (wgrad, "_plan_key")):
        real = getattr(module, attr)
        monkeypatch.setattr(module, attr, lambda *a, _real=real: keys.append(a) or _real(*a))
    for seed in (21, 22):
        _check(kernels.conv2d, GEOMETRIES[name], channels_last, activation, torch.float32,
               seed=seed)  # fmt: skip
    assert keys == [] and entries[0].backward is kept

    def transposed(dy):  # the same values in the other memory layout
        other = torch.contiguous_format if channels_last else torch.channels_last
        return dy.contiguous(memory_format=other)

    _check(kernels.conv2d, GEOMETRIES[name], channels_last, activation, torch.float32, seed=23,
           dy_of=transposed)  # fmt: skip
    generator = torch.Generator().manual_seed(24)
    x, weight, bias, *geometry = _make(GEOMETRIES[name], channels_last, torch.float32, generator)
    weight.requires_grad_()  # dW alone: another set of gradients
    y = kernels.conv2d(x, weight, bias, *geometry, activation=activation)
    dy = torch.randn(y.shape, generator=generator).to(DEVICE)
    y.backward(dy)
    ref = _reference(x, weight, bias, *geometry, activation, dy)
    assert x.grad is None and relative_error(weight.grad, ref[2]) < budget(torch.float32)
    reset_tuning()
    assert not autograd._TRAINING


def test_flipped_taps_address_the_forward_weights_taps():
    """A sub-conv's tap (i, j) is read at column col0 + i·col_r + j·col_s of the forward's
    (K, R·S·C) weight matrix: the forward's tap (rows[i], cols[j]), for every phase of every
    stride, dilation, padding and filter size the phase split covers."""
    for size, taps, stride, pad, dil in itertools.product(
        (5, 8, 9), (1, 2, 3, 5, 7), (1, 2, 3), (0, 1, 3), (1, 2, 3)
    ):
        convs, _ = dgrad_convs((size, size), (taps, taps + 1), (stride, stride), (pad, pad),
                               (dil, dil))  # fmt: skip
        C = 5
        for tc in convs:
            flip = backward._flipped(tc, taps + 1, C)
            for i, r in enumerate(tc.rows):
                for j, s in enumerate(tc.cols):
                    want = (r * (taps + 1) + s) * C
                    assert flip.col0 + i * flip.col_r + j * flip.col_s == want, (tc, i, j)


def _dgrad_against_float64(weight, x, dy, geometry):
    ref_x = x.detach().double().requires_grad_()
    F.conv2d(ref_x, weight.double(), None, *geometry).backward(dy.double())
    dx = backward.conv2d_backward(dy, x, weight, None, backward.NONE, *geometry, True, False,
                                  False)[0]  # fmt: skip
    err = relative_error(dx, ref_x.grad)
    assert err < budget(dx.dtype), f"dx: relative error {err:.2e}"


@pytest.mark.parametrize("layout", fast_subset(["channels_last", "nchw", "sliced"], ["sliced"]))
def test_dgrad_reads_any_weight_layout_in_place(layout):
    """The dgrad reads a channels_last weight as it lies (no copy in its plan) and a weight in
    any other layout through a (K, R·S·C) copy per call; a phase split whose output channels
    run past one tile (37 channels: a flipped box crosses into the next tap's columns, which
    must feed no stored channel) matches float64 on the call that plans and the one that runs
    the plan."""
    generator = torch.Generator().manual_seed(3)
    k, c = 20, 37
    full = torch.randn(k, c + 2, 3, 3, generator=generator).to(DEVICE) / (9 * c) ** 0.5
    weight = {"channels_last": full[:, :c].contiguous(memory_format=torch.channels_last),
              "nchw": full[:, :c].contiguous(),
              "sliced": full[:, 1 : c + 1]}[layout]  # fmt: skip
    geometry = ((3, 3), (2, 2), (2, 2))  # stride 3, dilation 2: phases, gaps
    x = torch.randn(2, c, 10, 11, generator=generator).to(DEVICE)
    x = x.contiguous(memory_format=torch.channels_last)
    p, q = F.conv2d(x, weight, None, *geometry).shape[2:]
    reset_tuning()
    for seed in (8, 9):  # the second call runs the plan the first one made
        gen = torch.Generator().manual_seed(seed)
        dy = torch.randn(2, k, p, q, generator=gen).to(DEVICE)
        dy = dy.contiguous(memory_format=torch.channels_last)
        _dgrad_against_float64(weight, x, dy, geometry)
        (plan,) = backward._DGRAD.values()
        assert plan.copy_w == (layout != "channels_last")
        assert len(plan.phases) == len(dgrad_convs((10, 11), (3, 3), *geometry)[0])


def test_grouped_training_is_refused_before_any_work():
    x = torch.randn(1, 4, 6, 6, device=DEVICE, requires_grad=True)
    weight = torch.randn(4, 2, 3, 3, device=DEVICE)
    for fn in (kernels.conv2d, ops.conv2d):
        with pytest.raises(NotImplementedError, match="groups=2 has no backward"):
            fn(x, weight, None, 1, 1, 1, 2)


# (N, C, H, W, multiplier, R, stride, padding, dilation)
DEPTHWISE = {
    "3x3-s1": (2, 16, 7, 9, 1, 3, 1, 1, 1),
    "3x3-s2": (1, 16, 9, 8, 1, 3, 2, 1, 1),
    "7x7-s1-p3": (1, 8, 9, 9, 1, 7, 1, 3, 1),
    "3x3-d2-m2": (1, 6, 9, 10, 2, 3, 1, 2, 2),
    "5x5-s3-m3": (2, 5, 11, 9, 3, 5, 3, 2, 1),
}


def _depthwise(name, channels_last, dtype, activation, fn=None, seed=9):
    n, c, h, w, m, r, stride, padding, dilation = DEPTHWISE[name]
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=generator).to(DEVICE, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(c * m, 1, r, r, generator=generator) / r).to(DEVICE, dtype)
    bias = torch.randn(c * m, generator=generator).to(DEVICE, dtype)
    for t in (x, weight, bias):
        t.requires_grad_()
    y = (fn or kernels.conv2d)(x, weight, bias, stride, padding, dilation, c, activation=activation)
    dy = torch.randn(y.shape, generator=generator).to(DEVICE, dtype)
    y.backward(dy)
    leaves = [t.detach().double().requires_grad_() for t in (x, weight, bias)]
    ref = F.conv2d(*leaves, stride, padding, dilation, c)
    REFERENCE_ACTIVATIONS[activation](ref).backward(dy.double())
    for name_, got, want in zip(("dx", "dw", "db"), (x.grad, weight.grad, bias.grad),
                                (t.grad for t in leaves), strict=True):  # fmt: skip
        err = relative_error(got, want)
        assert got.dtype == dtype and err < budget(dtype), f"{name_}: {err:.2e} ({dtype})"


@pytest.mark.parametrize("channels_last", [True, False], ids=["nhwc", "nchw"])
@pytest.mark.parametrize("name", fast_subset(DEPTHWISE, ["3x3-s2", "3x3-d2-m2"]))
def test_depthwise_gradients_match_float64(name, channels_last):
    _depthwise(name, channels_last, torch.float32, "relu")


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.slow
def test_depthwise_half_dtypes_and_the_compiled_op(dtype):
    _depthwise("3x3-s2", True, DTYPES[dtype], None)

    def compiled(*args, **kwargs):
        return torch.compile(ops.conv2d, fullgraph=True, dynamic=False)(*args, **kwargs)

    torch.compiler.reset()
    _depthwise("3x3-d2-m2", True, DTYPES[dtype], "silu", fn=compiled)


@pytest.mark.slow
def test_depthwise_dgrad_plan_is_kept_and_reused():
    """A direct depthwise backward keeps its per-phase steps (one a channel of the multiplier)
    and its tap gather index (on the device: no host copy a call) under its geometry, and the
    next call, on new values, runs those same steps with that index and is right (the taps'
    order in every phase is what the float64 gradient checks above hold it to)."""
    backward._DEPTHWISE_DGRAD.clear()
    for seed in (11, 12):
        _depthwise("5x5-s3-m3", True, torch.float32, None, seed=seed)
        ((gaps, index, phases),) = backward._DEPTHWISE_DGRAD.values()
        steps = [step for _, per_j in phases for step in per_j]
        assert len(phases) == 9 and len(steps) == 27 and None not in steps
        assert index.device.type == torch.device(DEVICE).type and index.numel() == 25
        if seed == 11:
            first, first_index = steps, index
    assert all(a is b for a, b in zip(steps, first, strict=True)) and index is first_index
    backward._DEPTHWISE_DGRAD.clear()


def _declined_graphs(monkeypatch) -> list:
    """Make every kept backward offer its launches to a CUDA graph (on a stand-in stream key,
    (0, 0), so on the CPU too) and decline each offer, so they run as they would be captured;
    the list that collects the offered keys."""
    from kernels import _graphs

    offered = []
    monkeypatch.setattr(_graphs, "usable", lambda t: True)
    monkeypatch.setattr(_graphs, "stream_key", lambda t: (0, 0))

    def decline(self, key, launches, keep=tuple):
        offered.append(key)
        return False

    monkeypatch.setattr(backward.Graphed, "__call__", decline)
    return offered


@pytest.mark.parametrize(
    "name, channels_last, activation",
    fast_subset([("3x3-s2", True, "relu"), ("3x3-d2-m2", False, None),
                 ("5x5-s3-m3", True, "gelu")], [("3x3-s2", True, "relu")], unpack=True),
)  # fmt: skip
def test_a_depthwise_training_step_runs_its_kept_backward(name, channels_last, activation,
                                                          monkeypatch):  # fmt: skip
    """The first step of a depthwise call key keeps a DepthwiseBackward in the key's entry; the
    next steps, on new values, run it: no dgrad or wgrad plan is looked up, its launches are
    offered to a CUDA graph keyed by the stream and the step's nine tensors (here declined, so
    they run as they would be captured), and dX, dW and db still match float64."""
    from kernels.conv import autograd, depthwise

    reset_tuning()
    _depthwise(name, channels_last, torch.float32, activation, seed=40)
    (entry,) = autograd._TRAINING.values()
    assert isinstance(entry.backward, backward.DepthwiseBackward)
    kept, lookups = entry.backward, []
    for module, attr in ((backward, "_depthwise_dgrad"), (depthwise, "wgrad_plan")):
        real = getattr(module, attr)
        monkeypatch.setattr(module, attr, lambda *a, _real=real, **k: lookups.append(a)
                            or _real(*a, **k))  # fmt: skip
    offered = _declined_graphs(monkeypatch)
    for seed in (41, 42):
        _depthwise(name, channels_last, torch.float32, activation, seed=seed)
    assert lookups == [] and entry.backward is kept and len(offered) == 2
    assert all(len(k) == 10 and k[0] == (0, 0) for k in offered)
    # dY, x, W, the saved output (relu) or pre-activation, dX, dW, db, dZ, the wgrad workspace
    assert (offered[0][4] != 0) == (activation is not None) and 0 not in offered[0][5:8]
    assert (offered[0][8] != 0) == (activation is not None) and offered[0][9] != 0
    reset_tuning()


@pytest.mark.parametrize(
    "kernel_rs, stride, padding, dilation, sliding",
    fast_subset([((3, 3), (1, 1), (1, 1), (1, 1), True),
                 # rows stride and dilate; 40 channels: two blocks
                 ((7, 5), (2, 1), (3, 2), (2, 1), True),
                 ((3, 3), (2, 2), (1, 1), (1, 1), False)],
                [((3, 3), (2, 2), (1, 1), (1, 1), False)], unpack=True),
)  # fmt: skip
def test_depthwise_wgrad_splits_agree(kernel_rs, stride, padding, dilation, sliding):
    """Any split gives the same dW (fp32 partial slabs added in split order), on both wgrad
    kernels: the sliding window's splits are runs of row blocks, the tap tiles' runs of pixels."""
    from kernels.conv.depthwise import depthwise_wgrad, slides

    assert slides(stride, dilation, kernel_rs) is sliding
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(2, 40, 13, 9, generator=generator).to(DEVICE)
    x = x.contiguous(memory_format=torch.channels_last)
    (R, S), (sh, sw), (ph, pw), (dh, dw_) = kernel_rs, stride, padding, dilation
    P = (13 + 2 * ph - dh * (R - 1) - 1) // sh + 1
    Q = (9 + 2 * pw - dw_ * (S - 1) - 1) // sw + 1
    dz = torch.randn(2, 40, P, Q, generator=generator).to(DEVICE)
    want = torch.nn.grad.conv2d_weight(x.double(), (40, 1, R, S), dz.double(), stride, padding,
                                       dilation, 40)  # fmt: skip
    for splits in (1, 3, 7):
        dw = depthwise_wgrad(dz, x, kernel_rs, stride, padding, dilation, splits=splits)
        assert relative_error(dw, want) < budget(torch.float32), splits


# ---------------------------------------------------------------------------------------------
# GPU: ResNet-50 layers at batch 32, bf16, channels_last
# ---------------------------------------------------------------------------------------------
RESNET50 = {
    "stem": (32, 3, 224, 224, 64, 7, 7, 2, 3, 1),
    "3x3-56": (32, 64, 56, 56, 64, 3, 3, 1, 1, 1),
    "1x1-56": (32, 64, 56, 56, 256, 1, 1, 1, 0, 1),
    "3x3-s2-28": (32, 128, 56, 56, 128, 3, 3, 2, 1, 1),
    "1x1-s2-down": (32, 512, 28, 28, 1024, 1, 1, 2, 0, 1),
    "3x3-7": (32, 512, 7, 7, 512, 3, 3, 1, 1, 1),
    "1x1-7": (32, 2048, 7, 7, 512, 1, 1, 1, 0, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(RESNET50))
def test_resnet50_layers_train_on_gpu(name):
    _check(kernels.conv2d, RESNET50[name], True, "relu", torch.bfloat16)
    _check(kernels.conv2d, RESNET50[name], True, None, torch.bfloat16, seed=2)
    # the same call key again: its kept Backward (no plan lookups) on new values
    _check(kernels.conv2d, RESNET50[name], True, None, torch.bfloat16, seed=3)


# (N, C, H, W, K, ...) with output channels C that no tile width divides: the flipped weight
# boxes (TMA on Hopper) cross into the next tap's columns on the last channel tile
ODD_CHANNELS = {
    "3x3-s1-14": (3, 72, 14, 14, 200, 3, 3, 1, 1, 1),
    "3x3-s2-15": (3, 200, 15, 15, 72, 3, 3, 2, 1, 1),
    "5x5-s1-d2-9": (2, 96, 9, 9, 136, 5, 5, 1, 4, 2),
    "3x3-s1-7-few": (4, 40, 7, 7, 8, 3, 3, 1, 1, 1),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(ODD_CHANNELS))
def test_flipped_weight_reads_odd_channels_on_gpu(name, dtype):
    _check(kernels.conv2d, ODD_CHANNELS[name], True, None, dtype)
    _check(kernels.conv2d, ODD_CHANNELS[name], True, None, dtype, seed=2)  # the kept backward


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["3x3-7", "1x1-7", "3x3-s2-28"])
def test_resnet50_layers_train_compiled_on_gpu(name):
    """The triton-compiled op's training on a GPU, where Inductor inlines its kernels (on the
    CPU it calls the op whole). The 7x7 layers' wgrad runs unsplit: it once passed dW as both of
    the kernel's outputs, and functionalization left dW uninitialised (NaN)."""

    def fn(x, weight, bias, stride, padding, dilation, activation):
        compiled = torch.compile(ops.conv2d, fullgraph=True, dynamic=False)
        return compiled(x, weight, bias, stride, padding, dilation, activation=activation)

    torch.compiler.reset()
    for seed in range(3):  # uninitialised memory is not NaN every time
        _check(fn, RESNET50[name], True, None, torch.bfloat16, seed=seed)


def _training_inputs(geometry, seed):
    """x and the weight (bf16, channels_last, needing gradients), a dY for their bias-free
    conv, and the (stride, padding, dilation) of the geometry."""
    generator = torch.Generator().manual_seed(seed)
    x, w, _, *conv_args = _make(geometry, True, torch.bfloat16, generator)
    x.requires_grad_()
    w.requires_grad_()
    dy = torch.randn_like(kernels.conv2d(x, w, None, *conv_args).detach())
    return x, w, dy, conv_args


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["3x3-s2-28", "3x3-7"])
def test_side_streams_give_the_serial_bits(name, monkeypatch):
    """A planned backward with dW and the dgrad's phases on side streams gives the bits of the
    same launches run in order (every kernel is deterministic), and leaves the caller's stream
    ordered after them: the gradients are read at once, with no synchronisation."""
    x, w, dy, (stride, pad, dil) = _training_inputs(RESNET50[name], seed=4)
    grads = {}
    # the first call plans (with dW beside it, the 7x7 dgrad splits: dispatch.split_k_rule), the
    # others run that plan, in order and then on the side streams
    for concurrent in (True, False, True):
        monkeypatch.setattr(backward, "CONCURRENT", concurrent)
        y = kernels.conv2d(x, w, None, stride, pad, dil)
        grads[concurrent] = [g.clone() for g in torch.autograd.grad(y, (x, w), dy)]
    for serial, overlapped in zip(grads[False], grads[True], strict=True):
        assert torch.equal(serial, overlapped)


@pytest.mark.gpu
def test_a_training_step_captures_in_a_cuda_graph():
    """A planned training step captured in a CUDA graph (the harness's replay reading, a user's
    whole-step capture) replays to the gradients an uncaptured step gives."""
    x, w, dy, (stride, pad, dil) = _training_inputs(RESNET50["3x3-s2-28"], seed=5)

    def step():
        return torch.autograd.grad(kernels.conv2d(x, w, None, stride, pad, dil), (x, w), dy)

    want = [g.clone() for g in step()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as torch.cuda.graph asks
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = step()
    graph.replay()
    torch.cuda.synchronize()
    for g, ref in zip(got, want, strict=True):
        assert torch.equal(g, ref)


def _kept_backward():
    from kernels.conv import autograd

    (entry,) = autograd._TRAINING.values()
    return entry.backward


def _leaf_grads(conv, tensors, conv_args, activation, dy):
    """The gradients of (x, W, bias, residual), None for a None tensor, of act(conv(x, W) + bias
    + residual) for dY: `conv` is kernels.conv2d or, with float64 leaves, F.conv2d. They come
    back as new tensors: the step's own are freed, so the next step's allocations may take their
    blocks, as in a training loop."""
    x, w, b, r = tensors
    if conv is F.conv2d:
        z = F.conv2d(x, w, b, *conv_args) + (0 if r is None else r)
        y = REFERENCE_ACTIVATIONS[activation](z)
    else:
        y = conv(x, w, b, *conv_args, activation=activation, residual=r)
    leaves = [t for t in tensors if t is not None]
    grads = iter(torch.autograd.grad(y, leaves, dy.to(y.dtype)))
    return [None if t is None else next(grads).clone() for t in tensors]


@pytest.mark.parametrize(
    "name, activation, bias, residual",
    fast_subset([("3x3-s2-odd", None, False, False), ("1x1-s1", None, True, False),
                 ("3x3-s1", "relu", False, False), ("5x3-s(2,3)", None, True, True),
                 ("3x3-s1", "relu", True, True), ("1x1-s1", "relu", False, True)],
                [("1x1-s1", None, True, False), ("3x3-s1", "relu", True, True),
                 ("1x1-s1", "relu", False, True)], unpack=True),
)  # fmt: skip
def test_a_kept_backward_launches_into_outputs_it_was_handed(name, activation, bias, residual,
                                                             monkeypatch):  # fmt: skip
    """The graphed path of a kept backward allocates its outputs first (dX, dW, db, and dZ
    wherever there is an activation) and launches into them (Backward.launch; the 1x1 dX GEMM
    through fused_matmul's out=), keyed by the step's pointers. Here every offer to graph it is
    declined, so the launches run as they would be captured, and the gradients still match
    float64."""
    offered = _declined_graphs(monkeypatch)
    reset_tuning()
    generator = torch.Generator().manual_seed(30)
    x, w, b, *conv_args = _make(GEOMETRIES[name], True, torch.float32, generator)
    y = kernels.conv2d(x, w, b, *conv_args, activation=activation)
    r = torch.randn(y.shape, generator=generator).to(DEVICE) if residual else None
    tensors = [x, w, b if bias else None, r]
    for t in tensors:
        if t is not None:
            t.requires_grad_()
    for seed in range(3):  # the first step plans; the next two are offered
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        got = _leaf_grads(kernels.conv2d, tensors, conv_args, activation, dy)
        double = [None if t is None else t.detach().double().requires_grad_() for t in tensors]
        want = _leaf_grads(F.conv2d, double, conv_args, activation, dy)
        for g, ref in zip(got, want, strict=True):
            assert (g is None) == (ref is None)
            if g is not None:
                assert relative_error(g, ref) < budget(torch.float32)
    # keyed by the stream, then dY, x, W, the saved output (relu), dX, dW, db and dZ: pointers
    assert len(offered) == 2 and all(len(k) == 9 and k[0] == (0, 0) for k in offered)
    key = offered[0]
    assert key[3] == w.data_ptr() and (key[4] != 0) == (activation == "relu")
    assert (key[7] != 0) == bias and (key[8] != 0) == (activation is not None)
    reset_tuning()


def _graphed_steps(monkeypatch, tensors, conv_args, activation, dy, steps: int) -> list[int]:
    """`steps` training steps of kernels.conv2d on the same tensors with graphs on, each one's
    gradients asserted to be the bits of the same launches run one by one (two steps with graphs
    off); the kept backward's capture count after each step."""
    from kernels import _graphs

    monkeypatch.setattr(_graphs, "GRAPHS", False)
    reset_tuning()
    want = [_leaf_grads(kernels.conv2d, tensors, conv_args, activation, dy) for _ in range(2)][-1]
    monkeypatch.setattr(_graphs, "GRAPHS", True)
    # the earlier tests' cached blocks out of the allocator, as in a new training process: with
    # them, the relu+bias+residual 7x7 step met new pointer sets for 7 of 16 steps on an H200,
    # while a loop of the same step in a new process captured once and then replayed
    torch.cuda.empty_cache()
    captures = []
    for _ in range(steps):
        got = _leaf_grads(kernels.conv2d, tensors, conv_args, activation, dy)
        for g, ref in zip(got, want, strict=True):
            assert (g is None and ref is None) or torch.equal(g, ref)
        del got  # as a training loop's zero_grad frees the gradients before the next step
        captures.append(_kept_backward().graphed.captures)
    return captures


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["3x3-s2-28", "3x3-7", "1x1-7", "3x3-56"])
@pytest.mark.parametrize("activation, extras", [(None, False), ("relu", False), ("relu", True)],
                         ids=["plain", "relu", "relu+bias+residual"])  # fmt: skip
def test_a_graphed_backward_gives_the_launches_bits(name, activation, extras, monkeypatch):
    """Training steps on the same tensors: from the second step on the backward's launches
    (side streams included) are one CUDA graph, captured once and then replayed, and every
    step's gradients (db and the residual's dZ too) are the bits of the same launches run one
    by one."""
    x, w, dy, conv_args = _training_inputs(RESNET50[name], seed=6)
    b = r = None
    if extras:
        b = torch.randn(w.shape[0], device=DEVICE, dtype=w.dtype).requires_grad_()
        r = torch.randn_like(dy).requires_grad_()
    captures = _graphed_steps(monkeypatch, [x, w, b, r], conv_args, activation, dy, 16)
    # a capture moves the step's intermediates out of the caching allocator (into the graph's
    # pool), so the next steps' outputs may land on other blocks: the allocator cycles through a
    # few pointer sets, each captured the second time it comes (on an H200 the 4 outputs of a
    # step with bias and residual took up to 6 steps to settle, and a relu step at 512x7x7 met
    # a set it had seen once again at its 16th step), and the other steps replay
    assert 1 <= captures[-1] <= 4 and captures[-1] - captures[7] <= 1
    assert not _kept_backward().graphed.broken


@pytest.mark.gpu
def test_each_pointer_set_gets_its_own_graph(monkeypatch):
    """Two dY tensors in turn: each gets graphs of its own (at most two, as above), and every
    step replays its own dY's gradients."""
    from kernels import _graphs

    x, w, dy, conv_args = _training_inputs(RESNET50["3x3-s2-28"], seed=7)
    dys = [dy, torch.randn_like(dy)]
    reset_tuning()
    monkeypatch.setattr(_graphs, "GRAPHS", False)
    want = [_leaf_grads(kernels.conv2d, [x, w, None, None], conv_args, None, d)[:2] for d in dys]
    monkeypatch.setattr(_graphs, "GRAPHS", True)
    captures = []
    for step in range(12):
        got = _leaf_grads(kernels.conv2d, [x, w, None, None], conv_args, None, dys[step % 2])[:2]
        for g, ref in zip(got, want[step % 2], strict=True):
            assert torch.equal(g, ref), step
        captures.append(_kept_backward().graphed.captures)
    assert 2 <= captures[-1] <= 4 and captures[-4:] == [captures[-1]] * 4


@pytest.mark.gpu
@pytest.mark.parametrize("channels, size, stride", [(32, 112, 1), (96, 112, 2), (960, 7, 1)])
def test_a_graphed_depthwise_backward_gives_the_launches_bits(channels, size, stride,
                                                             monkeypatch):  # fmt: skip
    """MobileNetV2's depthwise layers at batch 32 (bf16, channels_last): from the second step on
    the kept DepthwiseBackward replays one CUDA graph, and every step's dX and dW are the bits
    of the same launches run one by one."""
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(32, channels, size, size, generator=generator).to(DEVICE, torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    w = (torch.randn(channels, 1, 3, 3, generator=generator) / 3).to(DEVICE, torch.bfloat16)
    w.requires_grad_()
    conv_args = (stride, 1, 1, channels)
    dy = torch.randn_like(kernels.conv2d(x, w, None, *conv_args).detach())
    captures = _graphed_steps(monkeypatch, [x, w, None, None], conv_args, None, dy, 10)
    assert isinstance(_kept_backward(), backward.DepthwiseBackward)
    assert 1 <= captures[-1] <= 4 and captures[-1] == captures[-3]
    assert not _kept_backward().graphed.broken
