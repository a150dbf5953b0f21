"""kernels.conv.depthwise against F.conv2d(groups=C) in float64.

Both kernels (the sliding window for unit column stride and dilation, the tap tiles otherwise):
geometry (odd sizes, multipliers 1 and 2, 3x3 / 7x7 / 2x2 / 5x3 filters, stride, dilation,
symmetric and asymmetric padding), dtypes with every activation, bias off, layouts and strided
views of x, weight and y, the traced launcher, is_depthwise, which kernel serves which call, bad
input, and (GPU) MobileNetV2 and ConvNeXt layers at batch 32 with every tuning config and under
torch.compile. Sizes stay small: on CPU the kernels run in the Triton interpreter.
"""

import pytest
import torch
import torch.nn.functional as F

from experiments.correctness import relative_error, tolerance
from kernels._common import ACTIVATIONS, TORCH_ACTIVATIONS
from kernels.conv.depthwise import (
    DEPTHWISE_TILES,
    SLIDING_TILES,
    conv_depthwise_kernel,
    conv_depthwise_sliding_kernel,
    depthwise_conv2d,
    depthwise_reference,
    is_depthwise,
    slides,
)
from tests.conftest import fast_subset

# sigmoid(t) = 1 / (1 + exp(-t)) overflows to 1 / inf = 0 for very negative t, which is right;
# numpy, under the interpreter, warns about it
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
CHANNELS_LAST = torch.channels_last


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def output_size(size, kernel, stride, pad_lo, pad_hi, dilation):
    return (size + pad_lo + pad_hi - dilation * (kernel - 1) - 1) // stride + 1


def reference(x, weight, bias, stride, pad_lo, dilation, out_hw, activation="none"):
    """float64 F.conv2d(groups=C) on x padded by pad_lo at the top / left and by whatever out_hw
    implies at the bottom / right (negative: cropped), then the activation."""
    (R, S), (sh, sw), (dh, dw) = weight.shape[2:], pair(stride), pair(dilation)
    (H, W), (P, Q), (top, left) = x.shape[2:], out_hw, pad_lo
    bottom = (P - 1) * sh + dh * (R - 1) + 1 - H - top
    right = (Q - 1) * sw + dw * (S - 1) + 1 - W - left
    padded = F.pad(x.double(), (left, right, top, bottom))
    bias64 = None if bias is None else bias.double()
    y = depthwise_reference(padded, weight.double(), bias64, (sh, sw), 0, (dh, dw))
    return TORCH_ACTIVATIONS[activation](y)


def check(x, weight, bias, stride=1, padding=0, dilation=1, activation="none", *, y=None,
          out_hw=None, out_format=torch.contiguous_format):  # fmt: skip
    """Run depthwise_conv2d into y (allocated in out_format when not given; P, Q from out_hw,
    else symmetric padding) and compare with the float64 reference."""
    stride, pad_lo, dilation = pair(stride), pair(padding), pair(dilation)
    N, _, H, W = x.shape
    K, _, R, S = weight.shape
    if out_hw is None:
        out_hw = (output_size(H, R, stride[0], pad_lo[0], pad_lo[0], dilation[0]),
                  output_size(W, S, stride[1], pad_lo[1], pad_lo[1], dilation[1]))  # fmt: skip
    if y is None:
        y = torch.empty(N, K, *out_hw, device=x.device, dtype=x.dtype)
        y = y.contiguous(memory_format=out_format)
    out = depthwise_conv2d(x, weight, bias, y, stride, pad_lo, dilation, ACTIVATIONS[activation])
    assert out is y
    ref = reference(x, weight, bias, stride, pad_lo, dilation, out_hw, activation)
    dtype_name = {v: k for k, v in DTYPES.items()}[x.dtype]
    # no TF32 (no tl.dot): fp32 accumulation of R·S products, then one rounding to the dtype
    err = relative_error(y, ref)
    assert err < tolerance(dtype_name, False), f"relative error {err:.2e} for {x.dtype}"
    return y


def make_inputs(shape, multiplier, kernel_rs, dtype=torch.float32, device="cpu", bias=True,
                x_format=torch.contiguous_format):  # fmt: skip
    N, C, H, W = shape
    R, S = pair(kernel_rs)
    x = torch.randn(N, C, H, W, device=device, dtype=dtype).contiguous(memory_format=x_format)
    weight = torch.randn(C * multiplier, 1, R, S, device=device, dtype=dtype)
    b = torch.randn(C * multiplier, device=device, dtype=dtype) if bias else None
    return x, weight, b


# (N, C, H, W), multiplier, (R, S), stride, padding, dilation. The interpreter's tiles: tap tiles
# 32 pixels by 16 channels (P·Q = 99 leaves a pixel tail, K = 5, 10, 48 channel tails or several
# blocks); sliding window 2 rows by 5 columns by 32 channels (P = 9 and Q = 11 leave row and
# column tails, K = 48 two channel blocks). Unit column stride and dilation take the sliding
# window, the others the tap tiles (test_geometries_cover_both_kernels).
GEOMETRIES = {
    "3x3-pad1": ((2, 5, 9, 11), 1, 3, 1, 1, 1),
    "3x3-mult2-stride2": ((2, 5, 9, 11), 2, 3, 2, 1, 1),
    "3x3-pad0-C24-mult2": ((2, 24, 9, 11), 2, 3, 1, 0, 1),
    "7x7-pad3-C24": ((2, 24, 9, 11), 1, 7, 1, 3, 1),  # ConvNeXt: window wider than half the image
    "7x7-stride2-pad3-mult2": ((1, 5, 13, 12), 2, 7, 2, 3, 1),
    "3x3-dilation2-pad2": ((2, 5, 9, 11), 1, 3, 1, 2, 2),
    "2x2-pad0": ((2, 5, 9, 11), 1, 2, 1, 0, 1),
    "5x3-mixed-pairs": ((1, 5, 9, 11), 2, (5, 3), (2, 1), (2, 1), (1, 2)),
    "3x3-wide-rows": ((2, 5, 6, 37), 1, 3, 1, 1, 1),  # pixel blocks span output rows
    "5x3-row-stride2-row-dilation2": ((2, 5, 13, 11), 1, (5, 3), (2, 1), (2, 1), (2, 1)),
}


@pytest.mark.parametrize("channels_last", fast_subset([False, True], [True]))
# the fast suite: the tap tiles' geometries, cheap in the interpreter (test_dtypes_and_activations
# runs the sliding window)
@pytest.mark.parametrize("name", fast_subset(GEOMETRIES, [
    "3x3-mult2-stride2", "7x7-stride2-pad3-mult2", "3x3-dilation2-pad2", "2x2-pad0",
    "5x3-mixed-pairs"]))  # fmt: skip
def test_geometry(name, channels_last, device):
    """Each geometry with the input and output in NCHW, then both channels_last."""
    shape, multiplier, rs, stride, padding, dilation = GEOMETRIES[name]
    fmt = CHANNELS_LAST if channels_last else torch.contiguous_format
    x, weight, bias = make_inputs(shape, multiplier, rs, device=device, x_format=fmt)
    check(x, weight, bias, stride, padding, dilation, out_format=fmt)


@pytest.mark.parametrize("tile", [(7, 7), (7, 14), (4, 7)])
@pytest.mark.parametrize("r", [3, 7])
@pytest.mark.slow
def test_sliding_tiles_of_seven(tile, r, device, monkeypatch):
    """The 7-row and 7-column sliding tiles (loop counts, not powers of 2) on a 7x7 image, where
    they fit exactly, and on a 9x11 one, where rows and columns are left over."""
    import triton

    block_p, block_q = tile
    config = triton.Config({"BLOCK_P": block_p, "BLOCK_Q": block_q, "BLOCK_C": 32}, num_warps=1,
                           num_stages=1)  # fmt: skip
    monkeypatch.setattr(conv_depthwise_sliding_kernel, "configs", [config])
    monkeypatch.setattr(conv_depthwise_sliding_kernel, "cache", {})
    for hw in ((7, 7), (9, 11)):
        x, weight, bias = make_inputs((2, 40, *hw), 1, r, device=device, x_format=CHANNELS_LAST)
        check(x, weight, bias, 1, r // 2, 1, "relu", out_format=CHANNELS_LAST)


# (R, S), stride, top / left padding, output (P, Q) of a 9x11 input: the bottom / right padding
# is what P, Q imply
ASYMMETRIC = {
    "2x2-same-pad-after": (2, 1, (0, 0), (9, 11)),  # TF "same": the extra row / column after
    "2x2-same-pad-before": (2, 1, (1, 1), (9, 11)),
    "4x4-lo1-hi2": (4, 1, (1, 1), (9, 11)),
    "3x3-stride2-lo1-hi0": (3, 2, (1, 1), (5, 5)),  # hi 0 at the bottom, -1 (unread) at the right
}


@pytest.mark.parametrize("name", fast_subset(ASYMMETRIC, ["2x2-same-pad-before",
                                                          "3x3-stride2-lo1-hi0"]))
def test_asymmetric_padding(name, device):
    rs, stride, pad_lo, out_hw = ASYMMETRIC[name]
    x, weight, bias = make_inputs((2, 5, 9, 11), 2, rs, device=device, x_format=CHANNELS_LAST)
    check(x, weight, bias, stride, pad_lo, out_hw=out_hw, out_format=CHANNELS_LAST)


@pytest.mark.parametrize("activation",
                         fast_subset(["none", "relu", "gelu", "gelu_tanh", "silu"], ["relu"]))
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["fp32", "bf16"]))
def test_dtypes_and_activations(dtype_name, activation, device):
    """Every dtype with every fused activation, channels_last with a channel tail (K = 10)."""
    x, weight, bias = make_inputs((2, 5, 9, 11), 2, 3, DTYPES[dtype_name], device,
                                  x_format=CHANNELS_LAST)  # fmt: skip
    check(x, weight, bias, 1, 1, 1, activation, out_format=CHANNELS_LAST)


@pytest.mark.parametrize("multiplier", fast_subset([1, 2]))
def test_without_bias(multiplier, device):
    x, weight, _ = make_inputs((2, 24, 9, 11), multiplier, 3, torch.float16, device, bias=False,
                               x_format=CHANNELS_LAST)  # fmt: skip
    check(x, weight, None, 1, 1, 1, "relu", out_format=CHANNELS_LAST)


@pytest.mark.parametrize("x_channels_last, y_channels_last", [(False, True), (True, False)])
def test_mixed_layouts(x_channels_last, y_channels_last, device):
    """Input and output in different layouts: every tensor is read and written by its strides."""
    x_fmt = CHANNELS_LAST if x_channels_last else torch.contiguous_format
    y_fmt = CHANNELS_LAST if y_channels_last else torch.contiguous_format
    x, weight, bias = make_inputs((2, 24, 9, 11), 2, 3, torch.bfloat16, device, x_format=x_fmt)
    check(x, weight, bias, 2, 1, 1, "silu", out_format=y_fmt)


def channel_slice(shape, dtype, device, memory_format, first=1, extra=4):
    """A (N, C, H, W) view of channels first .. first + C of a bigger tensor: not contiguous in
    any format."""
    N, C, H, W = shape
    big = torch.randn(N, C + extra, H, W, device=device, dtype=dtype)
    view = big.contiguous(memory_format=memory_format)[:, first : first + C]
    assert not view.is_contiguous() and not view.is_contiguous(memory_format=CHANNELS_LAST)
    return view


@pytest.mark.parametrize("channels_last", fast_subset([False, True]))
def test_channel_slices(channels_last, device):
    """x = x_big[:, 1:6] and y a channel slice of a bigger output (a concat buffer); the output
    channels around the slice stay untouched."""
    fmt = CHANNELS_LAST if channels_last else torch.contiguous_format
    x = channel_slice((2, 5, 9, 11), torch.float16, device, fmt)
    _, weight, bias = make_inputs((2, 5, 9, 11), 2, 3, torch.float16, device)
    y_big = torch.randn(2, 13, 9, 11, device=device, dtype=torch.float16)
    y_big = y_big.contiguous(memory_format=fmt)
    before = y_big.clone()
    check(x, weight, bias, 1, 1, 1, "relu", y=y_big[:, 2:12])
    assert torch.equal(y_big[:, :2], before[:, :2]) and torch.equal(y_big[:, 12:], before[:, 12:])


def test_strided_weight_and_input_columns(device):
    """A weight that is every other tap of a bigger filter, x every other column of a wider
    tensor."""
    weight = torch.randn(10, 1, 6, 6, device=device)[..., ::2, ::2]
    wide = torch.randn(2, 5, 9, 22, device=device)
    x = wide[..., ::2]
    assert not weight.is_contiguous() and x.stride(3) == 2
    check(x, weight, torch.randn(10, device=device), 1, 1, 1)


def test_geometries_cover_both_kernels():
    routes = {name: slides(pair(g[3]), pair(g[5]), pair(g[2])) for name, g in GEOMETRIES.items()}
    assert set(routes.values()) == {True, False}, routes


@pytest.mark.parametrize(
    "stride, dilation, kernel_rs, expected",
    [
        ((1, 1), (1, 1), (7, 7), True),  # ConvNeXt
        ((2, 1), (2, 1), (3, 5), True),  # rows may stride and dilate
        ((1, 2), (1, 1), (3, 3), False),  # column stride: the window would skip columns
        ((1, 1), (1, 2), (3, 3), False),  # column dilation
        ((1, 1), (1, 1), (9, 9), False),  # 81 taps: more weights than registers
    ],
)
def test_which_kernel_serves(stride, dilation, kernel_rs, expected):
    assert slides(stride, dilation, kernel_rs) is expected


def test_autotune_keys_cover_filter_and_layout():
    """A tuned tile is reused only for the same sizes, filter, row stride and layouts: a 3x3 and
    a 7x7 of equal sizes, or NHWC and NCHW, must each tune their own."""
    assert {"R", "S", "stride_xc", "stride_yk"} <= set(conv_depthwise_kernel.keys)
    assert {"R", "S", "CONV_STRIDE_H", "DIL_H", "stride_xc", "stride_yk"} <= set(
        conv_depthwise_sliding_kernel.keys
    )


@pytest.mark.parametrize("stride, kernel", fast_subset([(1, conv_depthwise_sliding_kernel),
                                                        (2, conv_depthwise_kernel)],
                                                       [(2, conv_depthwise_kernel)],
                                                       unpack=True))  # fmt: skip
def test_traced_launch_uses_hook_free_autotuner(stride, kernel, device):
    """Through a launcher other than `direct` (kernels/ops.py passes wrap_triton) each kernel runs
    under an autotuner torch.compile can trace: the same configs, no pruning or custom timer."""
    launched = []

    def launcher(kernel):
        launched.append(kernel)
        return kernel

    x, weight, bias = make_inputs((2, 5, 9, 11), 2, 3, torch.float16, device,
                                  x_format=CHANNELS_LAST)  # fmt: skip
    out_hw = (output_size(9, 3, stride, 1, 1, 1), output_size(11, 3, stride, 1, 1, 1))
    y = torch.empty(2, 10, *out_hw, device=device, dtype=x.dtype)
    depthwise_conv2d(x, weight, bias, y, (stride, stride), (1, 1), (1, 1), ACTIVATIONS["gelu"],
                     launch=launcher)  # fmt: skip
    assert len(launched) == 1 and launched[0] is not kernel
    assert launched[0].fn is kernel.fn
    assert launched[0].early_config_prune is None
    assert [c.kwargs for c in launched[0].configs] == [c.kwargs for c in kernel.configs]
    ref = reference(x, weight, bias, stride, (1, 1), 1, out_hw, "gelu")
    assert relative_error(y, ref) < tolerance("fp16", False)


@pytest.mark.parametrize(
    "C, K, groups, expected",
    [
        (32, 32, 32, True),
        (32, 64, 32, True),  # multiplier 2
        (1, 8, 1, True),  # one input channel: depthwise and dense at once
        (32, 48, 32, False),  # K not a multiple of C
        (32, 32, 1, False),  # dense
        (32, 32, 8, False),  # grouped, 4 channels a group
    ],
)
def test_is_depthwise(C, K, groups, expected):
    assert is_depthwise(C, K, groups) is expected


def test_bad_inputs(device):
    x = torch.randn(1, 4, 8, 8, device=device)
    y = torch.empty(1, 8, 8, 8, device=device)
    with pytest.raises(ValueError, match=r"weight \(6, 1, 3, 3\) is not depthwise for 4"):
        depthwise_conv2d(x, torch.randn(6, 1, 3, 3, device=device), None, y, (1, 1), (1, 1),
                         (1, 1), 0)  # fmt: skip
    with pytest.raises(ValueError, match=r"weight \(8, 2, 3, 3\) is not depthwise"):
        depthwise_conv2d(x, torch.randn(8, 2, 3, 3, device=device), None, y, (1, 1), (1, 1),
                         (1, 1), 0)  # fmt: skip
    weight = torch.randn(8, 1, 3, 3, device=device)
    with pytest.raises(ValueError, match=r"y has shape \(1, 4, 8, 8\), expected \(1, 8, P, Q\)"):
        depthwise_conv2d(x, weight, None, y[:, :4], (1, 1), (1, 1), (1, 1), 0)
    with pytest.raises(ValueError, match=r"bias has shape \(4,\), expected \(8,\)"):
        depthwise_conv2d(x, weight, torch.randn(4, device=device), y, (1, 1), (1, 1), (1, 1), 0)


def test_empty_batch_launches_nothing(device):
    x, weight, bias = make_inputs((0, 5, 9, 11), 2, 3, device=device)
    y = torch.empty(0, 10, 9, 11, device=device)
    assert depthwise_conv2d(x, weight, bias, y, (1, 1), (1, 1), (1, 1), 0) is y


# ---------------------------------------------------------------------------------------------
# GPU: real layer sizes at batch 32, bf16 channels_last
# ---------------------------------------------------------------------------------------------
# (C, H), multiplier, R, stride, padding, activation
GPU_LAYERS = {
    "mobilenetv2-144x56-3x3": ((144, 56), 1, 3, 1, 1, "relu"),
    "mobilenetv2-144x56-3x3-stride2": ((144, 56), 1, 3, 2, 1, "relu"),
    "convnext-96x56-7x7": ((96, 56), 1, 7, 1, 3, "none"),
    "convnext-768x7-7x7": ((768, 7), 1, 7, 1, 3, "none"),
}


def gpu_layer(name, dtype=torch.bfloat16):
    (c, h), multiplier, r, stride, padding, activation = GPU_LAYERS[name]
    x, weight, bias = make_inputs((32, c, h, h), multiplier, r, dtype, "cuda",
                                  x_format=CHANNELS_LAST)  # fmt: skip
    return x, weight / r, bias, stride, padding, activation


@pytest.mark.gpu
@pytest.mark.parametrize("name", GPU_LAYERS)
def test_layers_on_gpu_every_config(name, monkeypatch):
    """Each layer with each tuning config alone (the autotuner would only ever run the winner),
    then the autotuned kernel, against float64 and against torch's own bf16 conv."""
    x, weight, bias, stride, padding, activation = gpu_layer(name)
    sliding = slides(pair(stride), (1, 1), weight.shape[2:])
    kernel, tiles = ((conv_depthwise_sliding_kernel, SLIDING_TILES) if sliding
                     else (conv_depthwise_kernel, DEPTHWISE_TILES))  # fmt: skip
    for config in kernel.configs:
        monkeypatch.setattr(kernel, "configs", [config])
        check(x, weight, bias, stride, padding, 1, activation, out_format=CHANNELS_LAST)
    monkeypatch.undo()
    assert len(kernel.configs) == len(tiles)
    y = check(x, weight, bias, stride, padding, 1, activation, out_format=CHANNELS_LAST)
    eager = TORCH_ACTIVATIONS[activation](depthwise_reference(x, weight, bias, stride, padding, 1))
    assert relative_error(y, eager) < tolerance("bf16", False)


@pytest.mark.gpu
def test_compiled_through_wrap_triton():
    """The traced launch: a triton_op launching through wrap_triton, under torch.compile."""
    from torch.library import triton_op, wrap_triton

    @triton_op("depthwise_test::conv", mutates_args={})
    def conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x, memory_format=CHANNELS_LAST)
        return depthwise_conv2d(x, weight, bias, y, (1, 1), (3, 3), (1, 1), ACTIVATIONS["gelu"],
                                launch=wrap_triton)  # fmt: skip

    x, weight, bias, *_ = gpu_layer("convnext-96x56-7x7")
    y = torch.compile(conv, fullgraph=True)(x, weight, bias)
    ref = reference(x, weight, bias, 1, (3, 3), 1, (56, 56), "gelu")
    assert relative_error(y, ref) < tolerance("bf16", False)
