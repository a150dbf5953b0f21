"""kernels.conv2d with groups (1 < groups < C: kernels/conv/grouped.py) against float64
F.conv2d(groups=G).

Geometry (2..32 groups of 2..20 input channels, K/G != C/G, 1x1 / 3x3 / 5x3 filters, strides 2
and 3, dilation 2, padding 0 / 1 / 'same'), NCHW and channels_last, channel slices and
non-channels_last weights, every dtype with bias and relu / gelu, unbatched input, several tiles
(several groups a tile, several taps a step, several column tiles a group), the traced launch and
the custom op under torch.compile, the dispatch's plans, what stays refused, and (GPU) the
ResNeXt-50 32x4d layers in bf16. Sizes stay small: on CPU the kernel runs in the interpreter.
"""

import pytest
import torch
import torch.nn.functional as F
import triton

import kernels
import kernels.ops
from experiments.correctness import relative_error, tolerance
from kernels._common import TORCH_ACTIVATIONS, pretend_gpu
from kernels.conv import conv2d_forward, dispatch
from kernels.conv.depthwise import conv_depthwise_kernel, conv_depthwise_sliding_kernel
from kernels.conv.grouped import (
    GROUPED_TILES,
    conv_grouped_kernel,
    grouped_reference,
    groups_per_tile,
)
from tests.conftest import fast_subset

# torch's own reference conv, on the even 'same' kernel
pytestmark = pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel:UserWarning")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CHANNELS_LAST = torch.channels_last


def budget(dtype: torch.dtype) -> float:
    # fp32 runs as TF32 on a GPU when torch allows it for convolutions, as cuDNN would; else the
    # fp32 accumulation is exact enough and the output rounding to the dtype dominates
    name = {v: k for k, v in DTYPES.items()}[dtype]
    return tolerance(name, tf32=torch.cuda.is_available() and torch.backends.cudnn.allow_tf32)


def reference(x, weight, bias, stride, padding, dilation, groups, activation="none"):
    bias64 = None if bias is None else bias.double()
    y = grouped_reference(x.double(), weight.double(), bias64, stride, padding, dilation, groups)
    return TORCH_ACTIVATIONS[activation](y)


def check(x, weight, bias, stride, padding, dilation, groups, activation=None, fn=kernels.conv2d):
    y = fn(x, weight, bias, stride, padding, dilation, groups, activation=activation)
    ref = reference(x, weight, bias, stride, padding, dilation, groups, activation or "none")
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = relative_error(y, ref)
    assert err < budget(x.dtype), f"relative error {err:.2e} for {x.dtype}"
    return y


def make_inputs(geometry, dtype=torch.float32, device="cpu", bias=True, channels_last=False):
    (n, c, h, w), (k, r, s), groups, *_ = geometry
    fmt = CHANNELS_LAST if channels_last else torch.contiguous_format
    x = torch.randn(n, c, h, w, device=device, dtype=dtype).contiguous(memory_format=fmt)
    weight = torch.randn(k, c // groups, r, s, device=device, dtype=dtype)
    weight = weight.contiguous(memory_format=fmt)
    b = torch.randn(k, device=device, dtype=dtype) if bias else None
    return x, weight, b


# (N, C, H, W), (K, R, S), groups, stride, padding, dilation. The interpreter's tile is 32 pixels
# by 16 columns with 16-wide steps: groups of K/G <= 8 share a tile (3-channel ones: two 8-channel
# taps a step), K/G = 20 spans two column tiles, C/G = 20 takes two channel steps a tap (the
# second masked), C/G = 2 with K/G = 16 eight taps a step.
GEOMETRIES = {
    "g3-c2-k3-3x3": ((2, 6, 7, 9), (9, 3, 3), 3, 1, 1, 1),
    # three 5-column groups a tile: the second tile holds one group, its other two are absent
    "g4-c3-k5-5x3-stride2": ((1, 12, 11, 10), (20, 5, 3), 4, 2, (2, 1), 1),
    "g8-c5-k2-stride3-pad0": ((2, 40, 13, 11), (16, 3, 3), 8, 3, 0, 1),
    "g2-c5-dilation2": ((2, 10, 9, 9), (6, 3, 3), 2, 1, 2, 2),
    "g2-c20-k20": ((1, 40, 6, 7), (40, 3, 3), 2, 1, 1, 1),
    "g2-c2-k16-taps": ((2, 4, 7, 9), (32, 3, 3), 2, 1, 1, 1),
    "g3-c4-1x1": ((2, 12, 5, 7), (12, 1, 1), 3, 1, 0, 1),
    "g32-c4-resnext": ((1, 128, 5, 6), (128, 3, 3), 32, 1, 1, 1),
}


@pytest.mark.parametrize("channels_last", fast_subset([False, True], [True]))
@pytest.mark.parametrize("name", fast_subset(GEOMETRIES, ["g4-c3-k5-5x3-stride2", "g2-c2-k16-taps",
                                                        "g3-c4-1x1"]))
def test_geometry(name, channels_last, device):
    """Each geometry on NCHW data (read in place by strides) and channels_last; the output
    follows x's layout."""
    geometry = GEOMETRIES[name]
    x, weight, bias = make_inputs(geometry, device=device, channels_last=channels_last)
    y = check(x, weight, bias, *geometry[3:], geometry[2], "relu")
    fmt = CHANNELS_LAST if channels_last else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("activation", fast_subset([None, "relu", "gelu"], ["gelu"]))
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_dtypes_and_activations(dtype_name, activation, device):
    """Every dtype (bf16: the interpreter runs the fp32 kernel on upcast copies, as the dispatch
    does for every tl.dot design) with bias and a fused activation."""
    geometry = GEOMETRIES["g3-c2-k3-3x3"]
    x, weight, bias = make_inputs(geometry, DTYPES[dtype_name], device, channels_last=True)
    check(x, weight, bias, 1, 1, 1, 3, activation)


@pytest.mark.parametrize("padding, kernel_rs", fast_subset(
    [("same", (3, 3)), ("same", (2, 4)), ("valid", (3, 3))], [("same", (2, 4))], unpack=True))
def test_string_padding_without_bias(padding, kernel_rs, device):
    """'same' (an even kernel's extra row and column at the bottom and right) and 'valid',
    through both entries."""
    x = torch.randn(2, 8, 7, 9, device=device)
    weight = torch.randn(12, 2, *kernel_rs, device=device)
    for fn in (kernels.conv2d, kernels.ops.conv2d):
        y = check(x, weight, None, 1, padding, 1, 4, fn=fn)
        if padding == "same":
            assert y.shape[2:] == x.shape[2:]


@pytest.mark.parametrize("channels_last", [False, True])
def test_channel_slice_and_strided_weight(channels_last, device):
    """x = x_big[:, 3:15] (contiguous in no format), and a weight that is every other tap of a
    bigger filter (not channels_last: copied into its matrix each call)."""
    fmt = CHANNELS_LAST if channels_last else torch.contiguous_format
    big = torch.randn(2, 17, 7, 9, device=device).contiguous(memory_format=fmt)
    x = big[:, 3:15]
    assert not x.is_contiguous() and not x.is_contiguous(memory_format=CHANNELS_LAST)
    weight = torch.randn(9, 4, 6, 6, device=device)[..., ::2, ::2]
    check(x, weight, torch.randn(9, device=device), 1, 1, 1, 3, "relu")


def test_unbatched_input(device):
    x, weight, bias = make_inputs(GEOMETRIES["g4-c3-k5-5x3-stride2"], device=device)
    y = kernels.conv2d(x[0], weight, bias, 2, (2, 1), 1, 4)
    ref = reference(x, weight, bias, 2, (2, 1), 1, 4)[0]
    assert y.shape == ref.shape and relative_error(y, ref) < budget(x.dtype)


# (BLOCK_M, BLOCK_N, BLOCK_K): 8 four-channel groups in 32 columns, one 32-channel tap a step;
# two taps a step (with absent groups: g4-c3-k5); 8 groups in two 16-channel steps a tap
TILES = [(32, 32, 32), (32, 16, 32), (64, 32, 16)]


@pytest.mark.parametrize("tile", fast_subset(TILES))
def test_other_tiles(tile, monkeypatch, device):
    """The autotuner's other tile shapes (the interpreter has one), each alone."""
    block_m, block_n, block_k = tile
    config = triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k},
                           num_warps=4, num_stages=1)  # fmt: skip
    monkeypatch.setattr(conv_grouped_kernel, "configs", [config])
    for name in ("g32-c4-resnext", "g4-c3-k5-5x3-stride2", "g2-c20-k20"):
        geometry = GEOMETRIES[name]
        x, weight, bias = make_inputs(geometry, device=device, channels_last=True)
        check(x, weight, bias, *geometry[3:], geometry[2], "relu")


def test_groups_per_tile():
    assert groups_per_tile(32, 4, 16) == 4  # ResNeXt stage 1: four groups a 16-wide tile
    assert groups_per_tile(32, 32, 16) == 1  # a group spans two tiles
    assert groups_per_tile(3, 3, 16) == 3  # no more groups than there are
    assert groups_per_tile(8, 5, 16) == 3  # whole groups only


def test_traced_launch_uses_hook_free_autotuner(device):
    """Through a launcher other than `direct` (kernels/ops.py passes wrap_triton) the kernel runs
    under an autotuner torch.compile can trace: the same configs, no pruning or custom timer."""
    launched = []

    def launcher(kernel):
        launched.append(kernel)
        return kernel

    geometry = GEOMETRIES["g3-c2-k3-3x3"]
    x, weight, bias = make_inputs(geometry, torch.float16, device, channels_last=True)
    y = conv2d_forward(x, weight, bias, 1, 1, 1, "gelu", 3, launch=launcher)
    assert len(launched) == 1 and launched[0] is not conv_grouped_kernel
    assert launched[0].early_config_prune is None
    assert all(config.pre_hook is None for config in launched[0].configs)
    direct_configs = [c.kwargs for c in conv_grouped_kernel.configs]
    assert [c.kwargs for c in launched[0].configs] == direct_configs
    ref = reference(x, weight, bias, 1, 1, 1, 3, "gelu")
    assert relative_error(y, ref) < budget(x.dtype)


@pytest.mark.slow
def test_custom_op_under_torch_compile(device):
    """mode=triton-compiled's op in one graph (a graph break is an error); on CPU the op is an
    opaque custom op, on a GPU it traces the kernel through wrap_triton."""
    torch.compiler.reset()
    compiled = torch.compile(kernels.ops.conv2d, fullgraph=True, dynamic=False)
    geometry = GEOMETRIES["g32-c4-resnext"]
    x, weight, bias = make_inputs(geometry, device=device, channels_last=True)
    check(x, weight, bias, 1, 1, 1, 32, "relu", fn=compiled)


def test_plans_are_kept_and_reused(device):
    """A direct call's launch is kept under its key (dispatch._PLANS): a second call with the
    same key takes it, on new data, and is right; another geometry gets its own plan."""
    geometry = GEOMETRIES["g2-c5-dilation2"]
    dispatch._PLANS.clear()
    for seed in range(2):
        torch.manual_seed(seed)
        x, weight, bias = make_inputs(geometry, device=device, channels_last=True)
        check(x, weight, bias, 1, 2, 2, 2, "relu")
        assert len(dispatch._PLANS) == 1
    (planned,) = dispatch._PLANS.values()
    assert planned.step.kernel is conv_grouped_kernel and not planned.copy_w
    check(x, weight, bias, 2, 2, 2, 2, "relu")  # stride 2: another plan
    assert len(dispatch._PLANS) == 2


def test_dispatch(device):
    """Any 1 < groups < C takes the grouped design, also where a groups=1 conv of the same shape
    would take the persistent GEMM (1x1, NHWC) or the window design (pretended H100); groups = C
    keeps the depthwise stencils (one channel a group): the sliding window at unit column stride,
    the tap tiles at stride 2."""
    x = torch.empty(2, 64, 14, 14, dtype=torch.bfloat16).contiguous(memory_format=CHANNELS_LAST)
    for r, groups in ((1, 4), (3, 32)):
        weight = torch.empty(64, 64 // groups, r, r, dtype=torch.bfloat16)
        with pretend_gpu((9, 0), 132):
            conv = dispatch.prepare(x, weight.contiguous(memory_format=CHANNELS_LAST), None, 1,
                                    r // 2, 1, None, groups)  # fmt: skip
            assert dispatch.plan(conv) == ("grouped", False, 1)
            assert dispatch.plan(conv, lambda kernel: kernel) == ("grouped", False, 1)
    x = torch.randn(2, 6, 7, 9, device=device)
    for stride, kernel in ((1, conv_depthwise_sliding_kernel), (2, conv_depthwise_kernel)):
        dispatch._PLANS.clear()
        check(x, torch.randn(12, 1, 3, 3, device=device), None, stride, 1, 1, 6)
        (planned,) = dispatch._PLANS.values()
        assert planned.step.kernel is kernel


def test_refused_cases_are_one_clear_error(device):
    x = torch.randn(1, 6, 8, 8, device=device)
    with pytest.raises(ValueError, match=r"groups=4 must divide C = 6 and K = 8, and the "
                                         r"weight's dim 1 must be C / groups$"):  # fmt: skip
        kernels.conv2d(x, torch.randn(8, 1, 3, 3, device=device), groups=4)
    with pytest.raises(ValueError, match=r"weight's dim 1 must be C / groups = 2$"):
        kernels.conv2d(x, torch.randn(9, 3, 3, 3, device=device), groups=3)
    with pytest.raises(TypeError, match="groups must be an int >= 1, got 0"):
        kernels.conv2d(x, torch.randn(9, 2, 3, 3, device=device), groups=0)
    trains = x.clone().requires_grad_()
    for fn in (kernels.conv2d, kernels.ops.conv2d):
        with pytest.raises(NotImplementedError, match="groups=3 has no backward"):
            fn(trains, torch.randn(9, 2, 3, 3, device=device), None, 1, 1, 1, 3)


def test_positional_arguments_are_f_conv2d_s(device):
    """groups is the seventh positional argument, as in F.conv2d, through kernels.conv2d and
    the custom op's wrapper; activation is keyword-only, and the order that had activation
    seventh gets one error that says so."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 6, 7, 9, generator=g).to(device)
    weight = torch.randn(8, 3, 3, 3, generator=g).to(device)
    want = F.conv2d(x.double(), weight.double(), None, 1, 1, 1, 2)
    for fn in (kernels.conv2d, kernels.ops.conv2d):
        assert relative_error(fn(x, weight, None, 1, 1, 1, 2), want) < 1e-4
        for x_ in (x, x.clone().requires_grad_()):  # the training entry checks it first too
            with pytest.raises(TypeError, match=r"got 'relu' \(activation is keyword-only"):
                fn(x_, weight, None, 1, 1, 1, "relu")
        with pytest.raises(TypeError, match="positional argument"):
            fn(x, weight, None, 1, 1, 1, 2, "relu")


# ---------------------------------------------------------------------------------------------
# GPU: the ResNeXt-50 32x4d grouped 3x3s at batch 32, bf16 channels_last
# ---------------------------------------------------------------------------------------------
# (C, H), stride: 32 groups, K = C, 3x3, padding 1 (conf/kernel/conv.yaml, resnext50)
RESNEXT50 = {
    "stage2-128x56": ((128, 56), 1),
    "stage3-256x56-stride2": ((256, 56), 2),
    "stage3-256x28": ((256, 28), 1),
    "stage4-512x14": ((512, 14), 1),
    "stage5-1024x14-stride2": ((1024, 14), 2),
    "stage5-1024x7": ((1024, 7), 1),
}


def resnext_inputs(name, dtype=torch.bfloat16):
    (c, h), stride = RESNEXT50[name]
    geometry = ((32, c, h, h), (c, 3, 3), 32)
    x, weight, bias = make_inputs(geometry, dtype, "cuda", channels_last=True)
    return x, weight / (c // 32 * 9) ** 0.5, bias, stride


@pytest.mark.gpu
@pytest.mark.parametrize("name", RESNEXT50)
def test_resnext50_layers_on_gpu_every_config(name, monkeypatch):
    """Each layer with each tuning config alone (the autotuner would only ever run the winner),
    then the autotuned kernel, against float64 and against torch's own bf16 conv."""
    x, weight, bias, stride = resnext_inputs(name)
    for config in conv_grouped_kernel.configs:
        monkeypatch.setattr(conv_grouped_kernel, "configs", [config])
        dispatch._PLANS.clear()
        check(x, weight, bias, stride, 1, 1, 32, "relu")
    monkeypatch.undo()
    assert len(conv_grouped_kernel.configs) == len(GROUPED_TILES)
    dispatch._PLANS.clear()
    y = check(x, weight, bias, stride, 1, 1, 32, "relu")
    assert y.is_contiguous(memory_format=CHANNELS_LAST)
    eager = F.relu(F.conv2d(x, weight, bias, stride, 1, 1, 32))
    assert relative_error(y, eager) < budget(torch.bfloat16)


@pytest.mark.gpu
def test_resnext50_through_wrap_triton():
    """The traced launch on a GPU: the custom op (launch=wrap_triton) under torch.compile."""
    torch.compiler.reset()
    compiled = torch.compile(kernels.ops.conv2d, fullgraph=True, dynamic=False)
    x, weight, bias, stride = resnext_inputs("stage3-256x56-stride2")
    check(x, weight, bias, stride, 1, 1, 32, "relu", fn=compiled)
    x, weight, bias, stride = resnext_inputs("stage4-512x14", torch.float16)
    check(x.contiguous(), weight, bias, stride, 1, 1, 32, None, fn=compiled)  # NCHW
