"""kernels.conv against F.conv2d in float64.

Correctness of the public conv2d (geometry, layouts and views, dtypes, bias and activations), each
design through its own entry (TMA on or off, split-K), the dispatch (which design, split and tiles
a ResNet-50 layer takes on a pretended H100 or A100, or in a traced launch), bad input, and the
GPU-only runs on real layer sizes. Sizes stay small: on CPU every kernel runs in the Triton
interpreter.
"""

import pytest
import torch
import torch.nn.functional as F

from experiments.correctness import relative_error, tolerance
from kernels._common import direct, pretend_gpu
from kernels.conv import autograd, conv2d, conv2d_forward, conv2d_reference, dispatch
from kernels.conv.flat_reduction import conv_flat_kernel, flat_step
from kernels.conv.gemm import (
    GEMM_PERSISTENT_TILES,
    conv_gemm,
    conv_gemm_kernel,
    conv_gemm_persistent_kernel,
    gemm_persistent_step,
    persistent_config,
)
from kernels.conv.implicit_gemm import IMPLICIT_TILES, conv_implicit_kernel, implicit_step
from kernels.conv.window import conv_window_kernel, window_step
from tests.conftest import fast_subset

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

REFERENCE_ACTIVATIONS = {
    None: lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}


def reference(x, weight, bias, stride, padding, dilation, activation=None):
    bias64 = None if bias is None else bias.double()
    y = conv2d_reference(x.double(), weight.double(), bias64, stride, padding, dilation)
    return REFERENCE_ACTIVATIONS[activation](y)


def budget(dtype: torch.dtype) -> float:
    # fp32 runs as TF32 on a GPU when torch allows it for convolutions, as cuDNN would
    name = {v: k for k, v in DTYPES.items()}[dtype]
    return tolerance(name, tf32=torch.cuda.is_available() and torch.backends.cudnn.allow_tf32)


def assert_close(y, x, weight, bias, stride, padding, dilation, activation=None):
    ref = reference(x, weight, bias, stride, padding, dilation, activation)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = relative_error(y, ref)
    # the fp32 accumulation is exact enough; the output rounding to the dtype dominates
    assert err < budget(x.dtype), f"relative error {err:.2e} for {x.dtype}"


def check(x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None):
    y = conv2d(x, weight, bias, stride, padding, dilation, activation=activation)
    assert_close(y, x, weight, bias, stride, padding, dilation, activation)
    return y


# (N, C, H, W), (K, R, S), stride, padding, dilation
GEOMETRIES = {
    "3x3-odd-7x9": ((2, 4, 7, 9), (8, 3, 3), 1, 1, 1),
    "3x3-stride3-pad0": ((1, 17, 13, 11), (6, 3, 3), 3, 0, 1),
    "7x7-stride2-pad3-C3": ((2, 3, 13, 13), (8, 7, 7), 2, 3, 1),
    "3x3-dilation2-pad2": ((2, 18, 9, 9), (5, 3, 3), 1, 2, 2),
    "1x1": ((2, 16, 7, 7), (12, 1, 1), 1, 0, 1),
    "2x5-mixed-pairs": ((2, 5, 10, 12), (9, 2, 5), (2, 1), (1, 2), (1, 2)),
    # more channels and filters than one interpreter tile (16 and 32): tail blocks on both
    "3x3-C20-K40": ((2, 20, 5, 6), (40, 3, 3), 1, 1, 1),
}


def make_inputs(geometry, dtype, device, bias=True, channels_last=False):
    (n, c, h, w), (k, r, s), *_ = geometry
    x = torch.randn(n, c, h, w, device=device, dtype=dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(k, c, r, s, device=device, dtype=dtype)
    b = torch.randn(k, device=device, dtype=dtype) if bias else None
    return x, weight, b


# ---------------------------------------------------------------------------------------------
# conv2d: geometry, dtypes, layouts, epilogue
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("channels_last", fast_subset([False, True], [True]))
@pytest.mark.parametrize("name", fast_subset(GEOMETRIES, ["3x3-odd-7x9", "3x3-stride3-pad0",
                                                        "7x7-stride2-pad3-C3", "1x1",
                                                        "2x5-mixed-pairs"]))
def test_geometry(name, channels_last, device):
    """Each geometry on NCHW and NHWC inputs (NHWC 1x1: the GEMM design; C = 3: flat)."""
    geometry = GEOMETRIES[name]
    x, weight, bias = make_inputs(geometry, torch.float32, device, channels_last=channels_last)
    y = check(x, weight, bias, *geometry[2:])
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("name", fast_subset(["3x3-C20-K40", "7x7-stride2-pad3-C3", "1x1"]))
def test_dtypes(name, dtype_name, device):
    geometry = GEOMETRIES[name]
    x, weight, bias = make_inputs(geometry, DTYPES[dtype_name], device, channels_last=True)
    check(x, weight, bias, *geometry[2:], activation="relu")


def channel_slice(t: torch.Tensor, extra: int = 3) -> torch.Tensor:
    """t's values as a slice along C of a bigger tensor with the same memory format."""
    n, c, h, w = t.shape
    fmt = torch.channels_last if not t.is_contiguous() else torch.contiguous_format
    big = torch.randn(n, c + extra, h, w, device=t.device, dtype=t.dtype)
    big = big.contiguous(memory_format=fmt)
    big[:, 1 : c + 1] = t
    return big[:, 1 : c + 1]


@pytest.mark.parametrize(
    "layout, channels_last_out",
    fast_subset([
        ("nchw-channel-slice", False),
        ("channels_last-channel-slice", True),
        ("nchw-every-other-column", False),
    ], [("channels_last-channel-slice", True)], unpack=True),
)
def test_strided_views(layout, channels_last_out, device):
    geometry = GEOMETRIES["3x3-C20-K40"]
    x, weight, bias = make_inputs(geometry, torch.float16, device)
    if layout.startswith("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)
    if layout.endswith("channel-slice"):
        x = channel_slice(x)
    else:  # W stride 2: a view of a tensor twice as wide
        wide = torch.randn(*x.shape[:3], 2 * x.shape[3], device=device, dtype=x.dtype)
        wide[..., ::2] = x
        x = wide[..., ::2]
    assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    y = check(x, weight, bias, *geometry[2:])
    if channels_last_out:
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    else:
        assert y.is_contiguous()


def test_channels_last_weight(device):
    geometry = GEOMETRIES["2x5-mixed-pairs"]
    x, weight, bias = make_inputs(geometry, torch.float32, device, channels_last=True)
    check(x, weight.contiguous(memory_format=torch.channels_last), bias, *geometry[2:])


def test_ambiguous_layout_gives_nchw(device):
    # C == 1: the tensor is both NCHW- and channels_last-contiguous
    x = torch.randn(2, 1, 7, 7, device=device).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(4, 1, 3, 3, device=device)
    assert check(x, weight).is_contiguous()


@pytest.mark.parametrize("padding", [0, 2, 3])
def test_padding_without_bias(padding, device):
    x, weight, _ = make_inputs(((1, 3, 5, 6), (4, 3, 3), 1, 0, 1), torch.float32, device)
    check(x, weight, None, padding=padding)


# sigmoid(t) = 1 / (1 + exp(-t)) overflows to 1 / inf = 0 for very negative t, which is right;
# numpy, under the interpreter, warns about it
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_fused_activation(activation, device):
    geometry = GEOMETRIES["3x3-odd-7x9"]
    x, weight, bias = make_inputs(geometry, torch.float16, device)
    check(x, weight, bias, *geometry[2:], activation=activation)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("kernel_rs, dilation", fast_subset([((3, 3), 1), ((2, 4), 1), ((3, 2), 2)],
                                                            [((2, 4), 1)], unpack=True))
@pytest.mark.parametrize("channels_last", fast_subset([False, True], [True]))
def test_string_padding(padding, kernel_rs, dilation, channels_last, device):
    """'same' keeps the input's size, an even kernel's extra row and column padded at the bottom
    and right as torch does; 'valid' pads nothing. Both through the direct call and the
    traced custom op's padding form (top, left, bottom, right)."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 16, 7, 9, generator=g).to(device)
    weight = torch.randn(8, 16, *kernel_rs, generator=g).to(device)
    bias = torch.randn(8, generator=g).to(device)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    ref = F.conv2d(x.double(), weight.double(), bias.double(), 1, padding, dilation)
    y = conv2d(x, weight, bias, 1, padding, dilation)
    assert y.shape == ref.shape
    if padding == "same":
        assert y.shape[2:] == x.shape[2:]
    assert relative_error(y, ref) < budget(x.dtype)
    lo, hi = dispatch.resolve_padding(padding, kernel_rs, (1, 1), (dilation, dilation))
    y4 = conv2d_forward(x, weight, bias, 1, (*lo, *hi), dilation)
    assert torch.equal(y4, y)


def test_unbatched_input(device):
    x, weight, bias = make_inputs(GEOMETRIES["3x3-odd-7x9"], torch.float32, device)
    y = conv2d(x[0], weight, bias, padding=1)
    assert y.shape == (8, 7, 9)
    assert relative_error(y, reference(x[:1], weight, bias, 1, 1, 1)[0]) < budget(x.dtype)


def test_bad_inputs(device):
    x = torch.randn(1, 4, 8, 8, device=device)
    weight = torch.randn(6, 4, 3, 3, device=device)
    with pytest.raises(ValueError, match=r"x has 4 channels .* weight expects 5"):
        conv2d(x, torch.randn(6, 5, 3, 3, device=device))
    with pytest.raises(ValueError, match=r"x must be 3-D .* or 4-D .*got shape \(8, 8\)"):
        conv2d(x[0, 0], weight)
    with pytest.raises(ValueError, match=r"weight must be 4-D, got shape \(6, 4, 3\)"):
        conv2d(x, weight[..., 0])
    with pytest.raises(ValueError, match=r"bias has shape \(5,\) but weight has 6 output"):
        conv2d(x, weight, torch.randn(5, device=device))
    with pytest.raises(ValueError, match="bias must be 1-D"):
        conv2d(x, weight, torch.randn(6, 1, device=device))
    with pytest.raises(ValueError, match=r"spans 5x5, larger than the padded input 4x4"):
        conv2d(x[..., :4, :4], weight, dilation=2)
    with pytest.raises(ValueError, match=r"spans 9x9, larger than the padded input 8x8"):
        conv2d(x, torch.randn(6, 4, 9, 9, device=device))
    with pytest.raises(TypeError, match="weight has dtype torch.float16 but x has torch.float32"):
        conv2d(x, weight.half())
    with pytest.raises(TypeError, match="float64"):
        conv2d(x.double(), weight.double())
    with pytest.raises(TypeError, match="int32"):
        conv2d(x.int(), weight.int())
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        conv2d(x.tolist(), weight)
    with pytest.raises(ValueError, match=r"padding='same' needs stride 1, got stride=\(2, 2\)"):
        conv2d(x, weight, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding='full' is not supported"):
        conv2d(x, weight, padding="full")
    with pytest.raises(ValueError, match="stride must be >= 1"):
        conv2d(x, weight, stride=0)
    with pytest.raises(ValueError, match="padding must be >= 0"):
        conv2d(x, weight, padding=(1, -1))
    with pytest.raises(TypeError, match="dilation must be an int or a pair of ints"):
        conv2d(x, weight, dilation=(1, 2, 3))
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        conv2d(x, weight, activation="tanh")


# ---------------------------------------------------------------------------------------------
# Each design through its own entry, TMA on (Hopper) and off
# ---------------------------------------------------------------------------------------------
def run_design(design, x, weight, bias, stride, padding, dilation, activation="relu", **options):
    conv = dispatch.prepare(x, weight, bias, stride, padding, dilation, activation)
    made = design(conv, **options)  # a (Step, scratch), or None where it launched itself
    if made is not None:
        step, scratch = made
        extra = () if scratch is None else scratch(conv.x.device)
        step(conv.x, conv.w2d, conv.bias, conv.y, *extra)
    assert_close(conv.y, x, weight, bias, stride, padding, dilation, activation)
    return conv.y


# (N, C, H, W), K: odd pixel counts (M = 198 rows, several tiles per persistent program in the
# interpreter's 4-program grid), K not a multiple of the tile, C a multiple of 8 (TMA rows)
ONE_BY_ONE = ((2, 24, 9, 11), (40, 1, 1), 1, 0, 1)


@pytest.mark.parametrize("bias_on", [False, True])
@pytest.mark.parametrize("tma", [False, True])
def test_gemm_persistent(tma, bias_on, device):
    dtype = torch.float16 if tma else torch.float32  # TMA takes 16-bit operands only
    x, weight, bias = make_inputs(ONE_BY_ONE, dtype, device, bias_on, channels_last=True)
    y = run_design(gemm_persistent_step, x, weight, bias, 1, 0, 1, tma=tma)
    assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("tile", [t for t in GEMM_PERSISTENT_TILES if min(t[1:3]) < 64],
                         ids=lambda t: "x".join(map(str, t[:3])))  # fmt: skip
def test_gemm_few_channel_tile(tile, monkeypatch, device):
    """Each few-channel tile of the persistent 1x1 GEMM (a step or a width under 64) forced on
    a layer it is tuned for: 24 channels in, 16 or 40 out (within one 32-wide column tile or
    across several), 198 rows."""
    monkeypatch.setattr(conv_gemm_persistent_kernel, "configs", [persistent_config(tile)])
    monkeypatch.setattr(conv_gemm_persistent_kernel, "cache", {}, raising=False)
    (n, c, h, w), (k, r, s), *rest = ONE_BY_ONE
    for out in (16, 40):
        x, weight, bias = make_inputs(((n, c, h, w), (out, r, s), *rest), torch.float16, device,
                                      True, channels_last=True)  # fmt: skip
        run_design(gemm_persistent_step, x, weight, bias, 1, 0, 1, tma=True)


def test_gemm_pointer_kernel(device):
    """The one-tile GEMM kernel the traced launches run."""
    x, weight, bias = make_inputs(ONE_BY_ONE, torch.float16, device, channels_last=True)
    run_design(conv_gemm, x, weight, bias, 1, 0, 1)


@pytest.mark.parametrize("tma", [False, True])
def test_flat_reduction(tma, device):
    geometry = GEOMETRIES["7x7-stride2-pad3-C3"]
    x, weight, bias = make_inputs(geometry, torch.float16, device, channels_last=True)
    run_design(flat_step, x, weight, bias, *geometry[2:], tma=tma)


# geometry, tma, split_k: 5 splits of a reduction with fewer steps than that (C = 20: 2 channel
# blocks of 16 x 1 tap) leave some splits empty; C = 48: the TMA weight tile may not cross a tap
IMPLICIT_CASES = {
    "3x3-C48-tma": (((1, 48, 5, 6), (20, 3, 3), 1, 1, 1), True, 1),
    "3x3-stride2-split2-tma": (((1, 32, 9, 11), (36, 3, 3), 2, 1, 1), True, 2),
    "dilation2-split3": (((1, 16, 9, 9), (20, 3, 3), 1, 2, 2), False, 3),
    "1x1-stride2-split5": (((2, 20, 9, 7), (24, 1, 1), 2, 0, 1), False, 5),
}


@pytest.mark.parametrize("channels_last", fast_subset([False, True], [True]))
@pytest.mark.parametrize("case", IMPLICIT_CASES)
def test_implicit_gemm(case, channels_last, device):
    geometry, tma, split_k = IMPLICIT_CASES[case]
    dtype = torch.float16 if tma else torch.float32
    x, weight, bias = make_inputs(geometry, dtype, device, channels_last=channels_last)
    y = run_design(implicit_step, x, weight, bias, *geometry[2:], tma=tma, split_k=split_k)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)


# the window design reads x through a 4-D TMA box (fp16/bf16 only, stride 1); K = 20: a
# 40-byte output row, so the output goes by strides; K = 24: by 4-D TMA stores
WINDOW_CASES = {
    "3x3-pad1-split2": (((2, 32, 7, 9), (24, 3, 3), 1, 1, 1), True, 2),
    "3x3-pad2-dilation2": (((1, 32, 6, 5), (20, 3, 3), 1, 2, 2), True, 1),
    "3x2-pad(1,0)-weight-by-pointer": (((1, 24, 6, 5), (20, 3, 2), 1, (1, 0), 1), False, 1),
    "5x5-pad0-C40-split3": (((1, 40, 9, 10), (12, 5, 5), 1, 0, 1), False, 3),
}


@pytest.mark.parametrize("case", fast_subset(WINDOW_CASES, ["3x3-pad2-dilation2",
                                                          "3x2-pad(1,0)-weight-by-pointer"]))
def test_window(case, device):
    geometry, tma, split_k = WINDOW_CASES[case]
    x, weight, bias = make_inputs(geometry, torch.float16, device, channels_last=True)
    y = run_design(window_step, x, weight, bias, *geometry[2:], tma=tma, split_k=split_k)
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_split_k_counters_reset_between_calls(device):
    """The last program of each tile resets its counter: repeated calls give the same result."""
    from kernels._common import _TILE_COUNTERS

    geometry = ((1, 20, 6, 7), (40, 3, 3), 1, 1, 1)
    x, weight, bias = make_inputs(geometry, torch.float32, device)
    first = run_design(implicit_step, x, weight, bias, 1, 1, 1, split_k=3)
    for locks in _TILE_COUNTERS.values():
        assert int(locks.abs().sum()) == 0
    for _ in range(2):
        assert torch.equal(first, run_design(implicit_step, x, weight, bias, 1, 1, 1, split_k=3))


def test_tile_counters_are_cached_zeroed_and_grow(device):
    from kernels._common import tile_counters

    dev = torch.device(device)
    first = tile_counters(dev, 10, minimum=16)
    assert first.dtype == torch.int32 and first.numel() >= 16 and int(first.abs().sum()) == 0
    assert tile_counters(dev, 16, minimum=16) is first  # cached while it is large enough
    bigger = tile_counters(dev, first.numel() + 1, minimum=16)
    assert bigger.numel() == first.numel() + 1 and int(bigger.abs().sum()) == 0
    assert tile_counters(dev, 4, minimum=16) is bigger


@pytest.mark.parametrize("name", ["1x1", "3x3-odd-7x9", "7x7-stride2-pad3-C3"])
def test_traced_launch_uses_hook_free_kernels(name, device):
    """Through a launcher other than `direct` (kernels/ops.py passes wrap_triton) the kernels run
    under autotuners with plain configs: torch.compile cannot trace config pre-hooks."""
    launched = []

    def launcher(kernel):
        launched.append(kernel)
        return kernel

    geometry = GEOMETRIES[name]
    x, weight, bias = make_inputs(geometry, torch.float16, device, channels_last=True)
    y = conv2d_forward(x, weight, bias, *geometry[2:], launch=launcher)
    assert_close(y, x, weight, bias, *geometry[2:])
    direct_kernels = (conv_implicit_kernel, conv_flat_kernel, conv_gemm_persistent_kernel)
    assert len(launched) == 1 and launched[0] not in direct_kernels
    assert all(config.pre_hook is None for config in launched[0].configs)


# ---------------------------------------------------------------------------------------------
# Dispatch
# ---------------------------------------------------------------------------------------------
# ResNet-50 at batch 32: (C, H), (K, R), stride -> (design, split) on an H100 (132 SMs)
RESNET50_PLANS = {
    "stem-7x7-s2": ((3, 224), (64, 7), 2, ("flat", 1)),
    "layer1-1x1": ((64, 56), (256, 1), 1, ("gemm_persistent", 1)),
    "layer1-3x3": ((64, 56), (64, 3), 1, ("window", 1)),
    "layer2-3x3-s2": ((128, 56), (128, 3), 2, ("implicit", 1)),
    "layer3-3x3": ((256, 14), (256, 3), 1, ("window", 1)),  # 196 tiles: no split
    "layer3-1x1-s2": ((512, 28), (1024, 1), 2, ("implicit", 1)),
    # 100 tiles: split in two they would spill into a second wave
    "layer4-3x3-s2": ((512, 14), (512, 3), 2, ("implicit", 1)),
    "layer4-3x3": ((512, 7), (512, 3), 1, ("implicit", 1)),  # 7x7: no window
    "layer4-3x3-batch8": ((512, 7), (512, 3), 1, ("implicit", 2)),  # 28 tiles: split
}


def resnet_conv(layer, batch=None, dtype=torch.bfloat16, channels_last=True):
    (c, h), (k, r), stride, _ = RESNET50_PLANS[layer]
    batch = batch or (8 if layer.endswith("-batch8") else 32)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.empty(batch, c, h, h, dtype=dtype).contiguous(memory_format=fmt)
    weight = torch.empty(k, c, r, r, dtype=dtype).contiguous(memory_format=fmt)
    return dispatch.prepare(x, weight, None, stride, r // 2, 1)


@pytest.mark.parametrize("layer", RESNET50_PLANS)
def test_dispatch(layer):
    """What each ResNet-50 layer (bf16, NHWC) takes: on an H100, on an A100 (no TMA: no window
    design), in a traced launch (hook-free kernels, unsplit) and without a GPU."""
    conv = resnet_conv(layer)
    design, split = RESNET50_PLANS[layer][3]
    with pretend_gpu((9, 0), 132):
        assert dispatch.plan(conv, direct) == (design, True, split)
        traced = dispatch.plan(conv, lambda kernel: kernel)
    pointer_design = {"window": "implicit"}.get(design, design)
    assert traced == ({"gemm_persistent": "gemm"}.get(pointer_design, pointer_design), False, 1)
    with pretend_gpu((8, 0), 108):
        assert dispatch.plan(conv, direct) == (pointer_design, False, split)
    assert dispatch.plan(conv, direct) == (pointer_design, False, 1)


def test_dispatch_layouts_and_dtypes():
    """NCHW 1x1s and fp32 stride-1 3x3s take the implicit GEMM (no (M, C) matrix, no TMA box)."""
    with pretend_gpu((9, 0), 132):
        assert dispatch.plan(resnet_conv("layer1-1x1", channels_last=False)).design == "implicit"
        assert dispatch.plan(resnet_conv("layer1-3x3", channels_last=False)).design == "implicit"
        conv = resnet_conv("layer1-3x3", dtype=torch.float32)
        assert dispatch.plan(conv) == ("implicit", True, 1)


@pytest.mark.parametrize(
    "layer, split, beside",
    [  # ResNet-50 at batch 32 on 132 SMs: (C, output H=W, K, R) -> split, and the split of
        # the same conv beside another launch (a dgrad beside dW)
        ((512, 7, 512, 3), 1, 4),  # 32x512x7 3x3 (and 32x512x14 3x3 stride 2): 100 tiles, 200
        # split: a second wave; beside dW the split's short programs pack around dW's
        ((512, 4, 512, 3), 2, 4),  # 32 tiles: the split fits one wave
        ((256, 14, 256, 3), 1, 1),  # 196 tiles: split 2 lost here, beside dW too
        ((128, 28, 128, 3), 1, 1),  # 392 tiles: enough already
        ((64, 56, 64, 3), 1, 1),
        ((1024, 7, 2048, 1), 1, 1),  # strided 1x1 to 7x7: 400 tiles
        ((512, 7, 64, 3), 2, 4),  # 25 tiles: still 2 at most alone
        ((64, 7, 64, 3), 1, 1),  # 9 reduction steps: too few to split
        ((128, 7, 512, 3), 1, 1),  # 18 steps: each split would keep fewer
        ((256, 7, 512, 3), 1, 2),  # 36 steps: two splits of 18
    ],
)
def test_split_k_rule(layer, split, beside):
    c, hw, k, r = layer
    assert dispatch.split_k_rule(32 * hw * hw, k, c, r, r, sms=132) == split
    assert dispatch.split_k_rule(32 * hw * hw, k, c, r, r, sms=132, beside=True) == beside


def test_split_tiles():
    """A split launch tunes over the 128-channel-wide tiles of at most 128 rows only; TMA weight
    tiles must divide C (a 96-channel layer keeps the 32-channel steps only)."""
    from kernels.conv.common import config, prune

    configs = [config(*tile) for tile in IMPLICIT_TILES]
    args = dict(M=32 * 7 * 7, K=512, C=512, R=3)

    def tiles(kept):
        return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps)
                for c in kept]  # fmt: skip

    split = prune(configs, args, B_TMA=True, SPLIT_K=2)
    assert tiles(split) == [(64, 128, 64, 4), (128, 128, 64, 8), (128, 128, 64, 4)]
    wide = [t for t in IMPLICIT_TILES if t[1] >= 64]  # the 16-channel tiles: K <= 16 only
    assert len(prune(configs, args, B_TMA=True, SPLIT_K=1)) == len(wide)
    narrow = prune(configs, dict(args, C=96), B_TMA=True, SPLIT_K=1)
    assert tiles(narrow) == [(128, 128, 32, 4)]
    # a 3-channel dgrad (the stem's): the 64-wide tiles and the 16-wide ones
    few = tiles(prune(configs, dict(M=32 * 112 * 112, K=3, C=64, R=4), B_TMA=True, SPLIT_K=1))
    assert (128, 16, 64, 4) in few and (256, 16, 64, 8) in few and (128, 64, 64, 4) in few


def test_gemm_few_channel_tiles():
    """The persistent 1x1 GEMM tunes its shallow channel steps (BLOCK_K < 64) and narrow output
    tiles only on layers whose C and K fit them (MobileNetV2's 16-32-channel 1x1s)."""
    from kernels.conv.common import prune

    configs = [persistent_config(tile) for tile in GEMM_PERSISTENT_TILES]

    def tiles(**args):
        kept = prune(configs, args, A_TMA=True, B_TMA=True)
        return {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]) for c in kept}

    squeeze = tiles(M=32 * 112 * 112, C=32, K=16)  # 32 -> 16 channels at 112x112
    assert {(256, 16, 32), (256, 32, 32), (128, 32, 32)} <= squeeze
    expand = tiles(M=32 * 56 * 56, C=24, K=144)  # 24 -> 144: the wide shallow tiles, not 16-wide
    assert {(128, 128, 32), (128, 256, 32)} <= expand
    assert not any(n < 64 for _, n, _ in expand)
    for c, k in ((96, 24), (1024, 256)):  # deeper than 32 channels: 64- and 128-channel steps
        kept = tiles(M=32 * 56 * 56, C=c, K=k)
        assert kept and all(step >= 64 for *_, step in kept)
    assert (128, 32, 64) in tiles(M=32 * 56 * 56, C=144, K=24)  # many channels to few
    assert not any(n < 64 for _, n, _ in tiles(M=32 * 56 * 56, C=144, K=96))


@pytest.mark.parametrize(
    "geometry, design",
    fast_subset([  # 36 reduction steps of 64 channels, 4 tiles: split 2 on the pretended H100
        (((1, 256, 14, 14), (24, 3, 3), 1, 1, 1), "window"),
        (((1, 256, 7, 7), (24, 3, 3), 1, 1, 1), "implicit"),
    ], [(((1, 256, 7, 7), (24, 3, 3), 1, 1, 1), "implicit")], unpack=True),
)
def test_pretended_hopper_end_to_end(geometry, design, device):
    """conv2d as it runs on an H100, in the interpreter: TMA descriptors and split-K."""
    x, weight, bias = make_inputs(geometry, torch.float16, device, channels_last=True)
    with pretend_gpu((9, 0), 132):
        assert dispatch.plan(dispatch.prepare(x, weight, bias, *geometry[2:])) == (design, True, 2)
        if torch.cuda.is_available():
            pytest.skip("launching under a pretended GPU is for the interpreter")
        check(x, weight / 16, bias, *geometry[2:], activation="relu")


# ---------------------------------------------------------------------------------------------
# GPU: real ResNet-50 layer sizes
# ---------------------------------------------------------------------------------------------
# ResNet-50 convolutions at batch 2: (C, H, W), (K, R, S), stride, padding
RESNET50_LAYERS = {
    "stem-7x7": ((3, 224, 224), (64, 7, 7), 2, 3),
    "layer1-1x1-reduce": ((256, 56, 56), (64, 1, 1), 1, 0),
    "layer1-3x3": ((64, 56, 56), (64, 3, 3), 1, 1),
    "layer1-1x1-expand": ((64, 56, 56), (256, 1, 1), 1, 0),
    "layer2-3x3-stride2": ((128, 56, 56), (128, 3, 3), 2, 1),
    "layer3-3x3": ((256, 14, 14), (256, 3, 3), 1, 1),
    "layer4-3x3": ((512, 7, 7), (512, 3, 3), 1, 1),
    "layer4-downsample": ((1024, 14, 14), (2048, 1, 1), 2, 0),
}
# every layer in bf16 channels_last (the benchmarked case, every design), and a few layers in
# the other layouts and dtypes
GPU_CASES = [(name, "bf16", True) for name in RESNET50_LAYERS] + [
    ("stem-7x7", "bf16", False),
    ("layer1-3x3", "bf16", False),
    ("layer1-1x1-reduce", "bf16", False),
    ("layer1-3x3", "fp16", True),
    ("layer3-3x3", "fp16", True),
    ("stem-7x7", "fp32", True),
    ("layer1-1x1-expand", "fp32", True),
    ("layer2-3x3-stride2", "fp32", False),
]


@pytest.fixture
def one_config(monkeypatch):
    """Each autotuner keeps only its first config: the GPU tests check results, not speed, and
    compiling every config for every specialisation would take minutes."""
    for kernel in (conv_implicit_kernel, conv_flat_kernel, conv_gemm_kernel, conv_window_kernel,
                   conv_gemm_persistent_kernel):  # fmt: skip
        monkeypatch.setattr(kernel, "configs", kernel.configs[:1])
        monkeypatch.setattr(kernel, "cache", {}, raising=False)


def resnet_inputs(name, dtype, channels_last):
    (c, h, w), (k, r, s), stride, padding = RESNET50_LAYERS[name]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, c, h, w, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
    weight = torch.randn(k, c, r, s, device="cuda", dtype=dtype) / (c * r * s) ** 0.5
    bias = torch.randn(k, device="cuda", dtype=dtype)
    return x, weight.contiguous(memory_format=fmt), bias, stride, padding


@pytest.mark.gpu
@pytest.mark.parametrize("name, dtype_name, channels_last", GPU_CASES)
def test_resnet50_layers_on_gpu(name, dtype_name, channels_last, one_config):
    x, weight, bias, stride, padding = resnet_inputs(name, DTYPES[dtype_name], channels_last)
    y = check(x, weight, bias, stride, padding, activation="relu")
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, design, options",
    [
        ("layer1-3x3", implicit_step, dict(tma=False)),
        ("layer1-3x3", implicit_step, dict(tma=True)),
        ("layer1-3x3", window_step, dict(tma=False)),
        ("layer1-3x3", flat_step, dict(tma=False)),
        ("layer4-downsample", implicit_step, dict(tma=True)),
        ("layer1-1x1-expand", conv_gemm, {}),
        ("layer1-1x1-reduce", gemm_persistent_step, dict(tma=False)),
        ("layer4-3x3", implicit_step, dict(tma=True, split_k=2)),
        ("layer4-downsample", implicit_step, dict(tma=True, split_k=2)),
        ("layer3-3x3", window_step, dict(tma=True, split_k=2)),
    ],
)
def test_designs_on_gpu(name, design, options, one_config):
    """Each design on real layer sizes, also where the dispatch would not take it (TMA off on a
    Hopper, flat on 64 channels); split-K twice, on the counters the first call left at zero."""
    needs_hopper = options.get("tma") or design is window_step
    if needs_hopper and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs a Hopper GPU")
    x, weight, bias, stride, padding = resnet_inputs(name, torch.bfloat16, True)
    for _ in range(2):
        run_design(design, x, weight, bias, stride, padding, 1, **options)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [1, 2])
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_every_implicit_tile_on_gpu(dtype_name, split_k, monkeypatch):
    """Each implicit-GEMM tile alone (the autotuner would only run the winner) on the 7x7-output
    3x3 layer, TMA weights, unsplit and split in two, against float64."""
    from kernels.conv.common import config

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs a Hopper GPU")
    x, weight, bias, stride, padding = resnet_inputs("layer4-3x3", DTYPES[dtype_name], True)
    for tile in IMPLICIT_TILES:
        if tile[1] < 64:  # the 16-wide tiles: at most 16 output channels
            continue
        monkeypatch.setattr(conv_implicit_kernel, "configs", [config(*tile)])
        monkeypatch.setattr(conv_implicit_kernel, "cache", {}, raising=False)
        run_design(implicit_step, x, weight, bias, stride, padding, 1, tma=True, split_k=split_k)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_every_persistent_tile_on_gpu(dtype_name, monkeypatch):
    """Each persistent 1x1 GEMM tile alone on a long-reduction 1x1 (1024 -> 200 channels at 14x13:
    neither the rows nor the output channels a multiple of any tile), TMA operands, bias and
    relu, against float64."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs a Hopper GPU")
    dtype = DTYPES[dtype_name]
    cl = torch.channels_last
    x = torch.randn(2, 1024, 14, 13, device="cuda", dtype=dtype).contiguous(memory_format=cl)
    weight = (torch.randn(200, 1024, 1, 1, device="cuda", dtype=dtype) / 32).contiguous(
        memory_format=cl)
    bias = torch.randn(200, device="cuda", dtype=dtype)
    for tile in GEMM_PERSISTENT_TILES:
        monkeypatch.setattr(conv_gemm_persistent_kernel, "configs", [persistent_config(tile)])
        monkeypatch.setattr(conv_gemm_persistent_kernel, "cache", {}, raising=False)
        run_design(gemm_persistent_step, x, weight, bias, 1, 0, 1, tma=True)


@pytest.mark.gpu
def test_tile_counters_are_per_stream():
    """Split-K launches on two streams may overlap, so they must not share arrival counters."""
    from kernels._common import tile_counters

    dev = torch.device("cuda")
    here = tile_counters(dev, 8)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        there = tile_counters(dev, 8)
        assert tile_counters(dev, 8) is there
    assert there.data_ptr() != here.data_ptr()
    assert tile_counters(dev, 8) is here


@pytest.mark.parametrize("k, few", [(3, True), (16, True), (17, False)])
def test_traced_implicit_tiles_by_output_channels(k, few):
    """A traced launch's autotuner has no pruning: the 16-wide tiles go only to convs of at
    most 16 output channels."""
    from kernels.conv import implicit_gemm
    from kernels.conv.common import Conv

    x, w2d, y = torch.randn(1, 4, 5, 5), torch.randn(k, 36), torch.empty(1, k, 5, 5)
    conv = Conv(x, w2d, None, y, 1, 4, 5, 5, k, 5, 5, 3, 3, (1, 1), (1, 1), (1, 1), {})
    step, _ = implicit_step(conv, launch=lambda kernel: kernel)
    assert step.kernel is (implicit_gemm._TRACEABLE_FEW_CHANNELS if few
                           else implicit_gemm._TRACEABLE)  # fmt: skip
    assert all(c.kwargs["BLOCK_N"] >= 64 for c in implicit_gemm._WIDE)


# ---------------------------------------------------------------------------------------------
# residual=: a ResNet block's act(conv(x) + b + shortcut)
# ---------------------------------------------------------------------------------------------
# (C, K, R, stride, padding, layout of x, whether the 1x1 GEMM's epilogue adds the residual)
RESIDUAL_CASES = {
    "1x1 nhwc (fused)": (24, 40, 1, 1, 0, torch.channels_last, True),
    "3x3 nhwc": (16, 24, 3, 1, 1, torch.channels_last, False),
    "1x1 s2 nhwc": (24, 40, 1, 2, 0, torch.channels_last, False),
    "1x1 nchw": (24, 40, 1, 1, 0, torch.contiguous_format, False),
}


def _residual_inputs(case, dtype, seed, residual_layout=None):
    c, k, r, stride, padding, layout, _ = RESIDUAL_CASES[case]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, c, 7, 9, generator=g).to(DEVICE, dtype).contiguous(memory_format=layout)
    w = (torch.randn(k, c, r, r, generator=g) / (c * r * r) ** 0.5).to(DEVICE, dtype)
    w = w.contiguous(memory_format=torch.channels_last)
    b = torch.randn(k, generator=g).to(DEVICE, dtype)
    p = (7 + 2 * padding - r) // stride + 1
    q = (9 + 2 * padding - r) // stride + 1
    res = torch.randn(2, k, p, q, generator=g).to(DEVICE, dtype)
    res = res.contiguous(memory_format=residual_layout or layout)
    return x, w, b, stride, padding, res


@pytest.mark.parametrize("dtype", fast_subset(["fp32", "fp16", "bf16"], ["bf16"]))
@pytest.mark.parametrize("activation", fast_subset([None, "relu", "gelu"], ["relu"]))
@pytest.mark.parametrize("case", list(RESIDUAL_CASES))
def test_residual_matches_float64(case, activation, dtype):
    """act(conv(x) + b + residual) against float64, twice per call key (the second call runs
    the kept plan); the 1x1 NHWC GEMM adds it in its epilogue (its plan says so), every other
    call adds it after the conv, and a residual in another layout than the output's too."""
    dispatch._PLANS.clear()
    dt = DTYPES[dtype]
    fused = RESIDUAL_CASES[case][-1] and not (DEVICE == "cpu" and dt == torch.bfloat16)
    for seed in (1, 2):
        x, w, b, stride, padding, res = _residual_inputs(case, dt, seed)
        y = conv2d(x, w, b, stride, padding, activation=activation, residual=res)
        ref = reference(x, w, b, stride, padding, 1)
        ref = REFERENCE_ACTIVATIONS[activation](ref + res.double())
        assert y.dtype == dt and relative_error(y, ref) < budget(dt), case
    kept = [p for p in dispatch._PLANS.values() if getattr(p, "residual", False)]
    assert len(kept) == (1 if fused else 0)
    x, w, b, stride, padding, res = _residual_inputs(case, dt, 3, torch.contiguous_format)
    y = conv2d(x, w, b, stride, padding, activation=activation, residual=res)
    ref = REFERENCE_ACTIVATIONS[activation](reference(x, w, b, stride, padding, 1) + res.double())
    assert relative_error(y, ref) < budget(dt)


@pytest.mark.parametrize("activation", fast_subset([None, "relu", "gelu"], ["relu"]))
@pytest.mark.parametrize("case", fast_subset(["1x1 nhwc (fused)", "3x3 nhwc", "1x1 nchw"]))
def test_residual_trains(case, activation):
    """With inputs that need gradients the sum and the activation stay in the conv's autograd
    Function (no add or activation node of torch's): dX, dW, db and the residual's gradient
    match float64, at the first step and at the second (the key's planned backward), also
    where the residual is the conv's own input (a shortcut: autograd sums its two gradients)."""
    x, w, b, stride, padding, res = _residual_inputs(case, torch.float32, 4)
    autograd._TRAINING.clear()
    for step in range(2):
        leaves = [t.clone().requires_grad_() for t in (x, w, b, res)]
        y = conv2d(*leaves[:3], stride, padding, activation=activation, residual=leaves[3])
        assert "Conv2dFunction" in type(y.grad_fn).__name__, type(y.grad_fn).__name__
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(5 + step)).to(DEVICE)
        y.backward(dy)
        ref_leaves = [t.double().requires_grad_() for t in (x, w, b, res)]
        ref = F.conv2d(*ref_leaves[:3], stride, padding) + ref_leaves[3]
        REFERENCE_ACTIVATIONS[activation](ref).backward(dy.double())
        for got, want in zip(leaves, ref_leaves, strict=True):
            assert relative_error(got.grad, want.grad) < budget(torch.float32), (case, step)
    # the shortcut: residual=x, a square 1x1 conv, an unbatched one, and bf16 (upcast on the
    # CPU)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(2, 24, 5, 6, generator=g).to(DEVICE)
    x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.randn(24, 24, 1, 1, generator=g) / 24**0.5).to(DEVICE)
    w = w.contiguous(memory_format=torch.channels_last)
    # (bf16 without relu: a bf16 output near 0 may take the other side of relu's mask than the
    # float64 reference's, a gradient difference of a whole dY there)
    cases = [(x, torch.float32), (x[0], torch.float32)]
    for xs, dt in cases + ([] if activation == "relu" else [(x, torch.bfloat16)]):
        leaf, wl = [t.to(dt, copy=True).requires_grad_() for t in (xs, w)]
        conv2d(leaf, wl, activation=activation, residual=leaf).sum().backward()
        rl, rw = [t.detach().double().requires_grad_() for t in (leaf, wl)]
        REFERENCE_ACTIVATIONS[activation](F.conv2d(rl, rw) + rl).sum().backward()
        assert leaf.grad.dtype == dt
        assert relative_error(leaf.grad, rl.grad) < budget(dt)
        assert relative_error(wl.grad, rw.grad) < budget(dt)


def test_residual_bad_input_is_refused(monkeypatch):
    """One clear error, before any work: also where the residual is added after the conv (a
    training call, the triton-compiled op), which would otherwise run the conv first."""
    from kernels import ops

    x, w, b, stride, padding, res = _residual_inputs("1x1 nhwc (fused)", torch.float32, 6)
    with pytest.raises(ValueError, match="residual has shape"):
        conv2d(x, w, b, residual=res[:, :, :-1])
    from kernels.conv.autograd import Conv2dFunction

    ran = []  # the training forward starts in the Function
    monkeypatch.setattr(Conv2dFunction, "apply", lambda *a: ran.append(a))
    for fn in (conv2d, ops.conv2d):
        with pytest.raises(ValueError, match="residual has shape"):
            fn(x, w.clone().requires_grad_(), b, residual=res[:, :-1])
    assert ran == []
    with pytest.raises(TypeError, match="residual has dtype"):
        conv2d(x, w, b, residual=res.half())
    with pytest.raises(TypeError, match="residual must be a torch.Tensor"):
        conv2d(x, w, b, residual=1.0)
