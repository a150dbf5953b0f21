"""kernels.conv2d against F.conv2d in float64: geometry, layouts, dtypes, epilogue, bad input.

Sizes stay small because every case runs in the Triton interpreter on CPU.
"""

import pytest
import torch
import torch.nn.functional as F

from experiments.correctness import relative_error, tolerance
from kernels.conv import conv2d, conv2d_forward, conv2d_reference, pack_conv_weight

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

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


def budget(dtype_name: str) -> float:
    # fp32 runs as TF32 on a GPU when torch allows it for convolutions, as cuDNN would
    return tolerance(dtype_name, tf32=torch.cuda.is_available() and torch.backends.cudnn.allow_tf32)


def check(
    x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None, *, dtype_name="fp32"
):
    y = conv2d(x, weight, bias, stride, padding, dilation, activation)
    ref = reference(x, weight, bias, stride, padding, dilation, activation)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = relative_error(y, ref)
    # the fp32 accumulation is exact enough; the output rounding to the dtype dominates
    assert err < budget(dtype_name), f"relative error {err:.2e} for {dtype_name}"
    return y


# (N, C, H, W), (K, R, S), stride, padding, dilation
GEOMETRIES = {
    "3x3-odd-7x9": ((2, 4, 7, 9), (8, 3, 3), 1, 1, 1),
    "3x3-stride2-pad0": ((1, 5, 13, 13), (6, 3, 3), 2, 0, 1),
    "7x7-stride2-pad3-C3": ((2, 3, 13, 13), (8, 7, 7), 2, 3, 1),
    "3x3-dilation2-pad2": ((2, 6, 9, 9), (5, 3, 3), 1, 2, 2),
    "1x1": ((2, 16, 7, 7), (12, 1, 1), 1, 0, 1),
    "1x3": ((1, 4, 8, 11), (7, 1, 3), 1, (0, 1), 1),
    "3x1": ((1, 4, 11, 8), (7, 3, 1), 1, (1, 0), 1),
    "2x5-mixed-pairs": ((2, 5, 10, 12), (9, 2, 5), (2, 1), (1, 2), (1, 2)),
    # more channels and filters than one interpreter tile (16 and 32): tail blocks on both
    "3x3-C20-K40": ((1, 20, 6, 6), (40, 3, 3), 1, 1, 1),
}


def make_inputs(geometry, dtype, device, bias=True):
    (n, c, h, w), (k, r, s), *_ = geometry
    x = torch.randn(n, c, h, w, device=device, dtype=dtype)
    weight = torch.randn(k, c, r, s, device=device, dtype=dtype)
    b = torch.randn(k, device=device, dtype=dtype) if bias else None
    return x, weight, b


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("name", GEOMETRIES)
def test_geometry(name, dtype_name, device):
    geometry = GEOMETRIES[name]
    x, weight, bias = make_inputs(geometry, DTYPES[dtype_name], device)
    check(x, weight, bias, *geometry[2:], dtype_name=dtype_name)


@pytest.mark.parametrize("padding", [0, 1, 2, 3])
def test_padding(padding, device):
    x, weight, bias = make_inputs(((1, 3, 5, 6), (4, 3, 3), 1, 0, 1), torch.float32, device)
    check(x, weight, bias, padding=padding)


def channel_slice(t: torch.Tensor, extra: int = 3) -> torch.Tensor:
    """t's values as a slice along C of a bigger tensor with the same memory format."""
    n, c, h, w = t.shape
    fmt = torch.channels_last if not t.is_contiguous() else torch.contiguous_format
    big = torch.randn(n, c + extra, h, w, device=t.device, dtype=t.dtype).contiguous(
        memory_format=fmt
    )
    big[:, 1 : c + 1] = t
    return big[:, 1 : c + 1]


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "layout, channels_last_out",
    [
        ("nchw", False),
        ("channels_last", True),
        ("nchw-channel-slice", False),
        ("channels_last-channel-slice", True),
    ],
)
def test_input_layouts(layout, channels_last_out, dtype_name, device):
    geometry = GEOMETRIES["3x3-odd-7x9"]
    x, weight, bias = make_inputs(geometry, DTYPES[dtype_name], device)
    if layout.startswith("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)
    if layout.endswith("channel-slice"):
        x = channel_slice(x)
        assert not x.is_contiguous() and not x.is_contiguous(memory_format=torch.channels_last)
    y = check(x, weight, bias, *geometry[2:], dtype_name=dtype_name)
    if channels_last_out:
        assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    else:
        assert y.is_contiguous()


@pytest.mark.parametrize("x_channels_last", [False, True])
def test_channels_last_weight(x_channels_last, device):
    geometry = GEOMETRIES["2x5-mixed-pairs"]
    x, weight, bias = make_inputs(geometry, torch.float32, device)
    if x_channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    weight = weight.contiguous(memory_format=torch.channels_last)
    check(x, weight, bias, *geometry[2:])


def test_ambiguous_layout_gives_nchw(device):
    # C == 1: the tensor is both NCHW- and channels_last-contiguous
    x = torch.randn(2, 1, 7, 7, device=device).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(4, 1, 3, 3, device=device)
    assert check(x, weight).is_contiguous()


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_without_bias(dtype_name, device):
    geometry = GEOMETRIES["3x3-stride2-pad0"]
    x, weight, _ = make_inputs(geometry, DTYPES[dtype_name], device, bias=False)
    check(x, weight, None, *geometry[2:], dtype_name=dtype_name)


# sigmoid(t) = 1 / (1 + exp(-t)) overflows to 1 / inf = 0 for very negative t, which is right;
# numpy, under the interpreter, warns about it
@pytest.mark.filterwarnings("ignore:overflow encountered in exp")
@pytest.mark.parametrize("dtype_name", ["fp32", "fp16"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_fused_activation(activation, dtype_name, device):
    geometry = GEOMETRIES["3x3-odd-7x9"]
    x, weight, bias = make_inputs(geometry, DTYPES[dtype_name], device)
    check(x, weight, bias, *geometry[2:], activation=activation, dtype_name=dtype_name)


def test_relu_without_bias_zeroes_negatives(device):
    x, weight, _ = make_inputs(GEOMETRIES["1x1"], torch.float32, device)
    y = check(x, weight, activation="relu")
    assert (y >= 0).all() and (y == 0).any()


def test_unbatched_input(device):
    x, weight, bias = make_inputs(GEOMETRIES["3x3-odd-7x9"], torch.float32, device)
    y = conv2d(x[0], weight, bias, padding=1)
    assert y.shape == (8, 7, 9)
    assert relative_error(y, reference(x[:1], weight, bias, 1, 1, 1)[0]) < budget("fp32")


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
    with pytest.raises(ValueError, match="padding='same' is not supported"):
        conv2d(x, weight, padding="same")
    with pytest.raises(ValueError, match="stride must be >= 1"):
        conv2d(x, weight, stride=0)
    with pytest.raises(ValueError, match="padding must be >= 0"):
        conv2d(x, weight, padding=(1, -1))
    with pytest.raises(TypeError, match="dilation must be an int or a pair of ints"):
        conv2d(x, weight, dilation=(1, 2, 3))
    with pytest.raises(ValueError, match="unknown activation 'tanh'"):
        conv2d(x, weight, activation="tanh")


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
# every layer in bf16 channels_last (the benchmarked case, all four auto paths), and a few
# layers in the other layouts and dtypes
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
    import kernels.conv as conv_module

    for kernel in (conv_module.conv_implicit_kernel, conv_module.conv_flat_kernel,
                   conv_module.conv_gemm_kernel, conv_module.conv_window_kernel,
                   conv_module.conv_gemm_persistent_kernel,
                   conv_module.conv_window_persistent_kernel):  # fmt: skip
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
    y = check(x, weight, bias, stride, padding, activation="relu", dtype_name=dtype_name)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert y.is_contiguous(memory_format=fmt)


# ---------------------------------------------------------------------------------------------
# Paths (gemm / implicit / flat), TMA descriptors, packed weights, NCHW handling
# ---------------------------------------------------------------------------------------------
def check_forward(x, weight, bias, stride, padding, dilation, activation=None, *, dtype_name,
                  **options):  # fmt: skip
    y = conv2d_forward(x, weight, bias, stride, padding, dilation, activation, **options)
    ref = reference(x, weight, bias, stride, padding, dilation, activation)
    assert y.dtype == x.dtype and y.shape == ref.shape
    err = relative_error(y, ref)
    assert err < budget(dtype_name), f"relative error {err:.2e} for {dtype_name} {options}"
    return y


# (geometry, paths that apply to it on a channels_last input)
PATH_CASES = {
    "1x1": ("1x1", ["gemm", "implicit", "flat"]),
    "3x3-C20-K40": ("3x3-C20-K40", ["implicit", "flat"]),
    "7x7-stride2-pad3-C3": ("7x7-stride2-pad3-C3", ["implicit", "flat"]),
    "2x5-mixed-pairs": ("2x5-mixed-pairs", ["implicit", "flat"]),
    "1x1-stride2": (((2, 16, 9, 7), (12, 1, 1), 2, 0, 1), ["implicit", "flat"]),
}


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("case", PATH_CASES)
def test_paths(case, tma, device):
    geometry, paths = PATH_CASES[case]
    geometry = GEOMETRIES.get(geometry, geometry)
    # TMA descriptors take 16-bit operands (fp32 always loads by pointer)
    dtype_name = "fp16" if tma else "fp32"
    x, weight, bias = make_inputs(geometry, DTYPES[dtype_name], device)
    x = x.contiguous(memory_format=torch.channels_last)
    for path in paths:
        y = check_forward(x, weight, bias, *geometry[2:], activation="relu", dtype_name=dtype_name,
                          path=path, tma=tma)  # fmt: skip
        assert y.is_contiguous(memory_format=torch.channels_last)


# the window path reads x through a 4-D TMA box (fp16/bf16 only), stride 1
WINDOW_CASES = {
    "3x3-pad1": ((2, 16, 7, 9), (20, 3, 3), 1, 1, 1),
    "3x3-pad2-dilation2": ((1, 32, 6, 5), (20, 3, 3), 1, 2, 2),
    "3x2-pad(1,0)": ((1, 24, 6, 5), (20, 3, 2), 1, (1, 0), 1),
    "5x5-pad0-C40": ((1, 40, 9, 10), (12, 5, 5), 1, 0, 1),
}


@pytest.mark.parametrize("tma", [False, True])  # the weight by pointer or by descriptor
@pytest.mark.parametrize("case", WINDOW_CASES)
def test_window_path(case, tma, device):
    geometry = WINDOW_CASES[case]
    x, weight, bias = make_inputs(geometry, torch.float16, device)
    x = x.contiguous(memory_format=torch.channels_last)
    y = check_forward(x, weight, bias, *geometry[2:], activation="relu", dtype_name="fp16",
                      path="window", tma=tma)  # fmt: skip
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_window_path_refuses_what_tma_cannot_read(device):
    x, weight, bias = make_inputs(GEOMETRIES["3x3-odd-7x9"], torch.float16, device)
    with pytest.raises(ValueError, match="path='window' needs a stride-1 conv"):
        conv2d_forward(x.contiguous(memory_format=torch.channels_last), weight, bias, 2, 1,
                       path="window")  # fmt: skip
    with pytest.raises(ValueError, match="path='window' needs"):  # C=4: 8-byte pixel rows
        conv2d_forward(x.contiguous(memory_format=torch.channels_last), weight, bias, 1, 1,
                       path="window")  # fmt: skip


@pytest.mark.parametrize("channels", [32, 48])  # 48: the TMA weight tile may not cross a tap
def test_tma_weight_tiles_stay_in_their_tap(channels, device):
    geometry = ((1, channels, 5, 6), (20, 3, 3), 1, 1, 1)
    x, weight, bias = make_inputs(geometry, torch.float16, device)
    x = x.contiguous(memory_format=torch.channels_last)
    check_forward(x, weight, bias, 1, 1, 1, dtype_name="fp16", path="implicit", tma=True)


@pytest.mark.parametrize("nchw", ["convert", "native"])
@pytest.mark.parametrize("name", ["3x3-odd-7x9", "1x1", "7x7-stride2-pad3-C3"])
def test_nchw_modes(name, nchw, device):
    geometry = GEOMETRIES[name]
    x, weight, bias = make_inputs(geometry, torch.float32, device)
    y = check_forward(x, weight, bias, *geometry[2:], dtype_name="fp32", nchw=nchw)
    assert y.is_contiguous()


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_packed_weight(dtype_name, device):
    geometry = GEOMETRIES["2x5-mixed-pairs"]
    x, weight, bias = make_inputs(geometry, DTYPES[dtype_name], device)
    packed = pack_conv_weight(weight)
    assert packed.shape == weight.shape and torch.equal(packed, weight)
    assert packed.is_contiguous(memory_format=torch.channels_last)
    assert pack_conv_weight(packed) is packed  # already packed: no copy
    x = x.contiguous(memory_format=torch.channels_last)
    y1 = check(x, weight, bias, *geometry[2:], dtype_name=dtype_name)
    y2 = conv2d(x, weight, bias, *geometry[2:], packed_weight=packed)
    y3 = conv2d(x, packed, bias, *geometry[2:])
    assert torch.equal(y1, y2) and torch.equal(y1, y3)


def test_bad_options(device):
    x = torch.randn(1, 4, 8, 8, device=device)
    weight = torch.randn(6, 4, 3, 3, device=device)
    with pytest.raises(ValueError, match=r"packed_weight has shape \(6, 4, 1, 1\)"):
        conv2d(x, weight, packed_weight=torch.randn(6, 4, 1, 1, device=device))
    with pytest.raises(TypeError, match="packed_weight has dtype torch.float16"):
        conv2d(x, weight, packed_weight=weight.half())
    with pytest.raises(ValueError, match="path='gemm' needs a 1x1"):
        conv2d_forward(x, weight, path="gemm")
    with pytest.raises(ValueError, match="path='im2col'"):
        conv2d_forward(x, weight, path="im2col")
    with pytest.raises(ValueError, match="nchw='copy'"):
        conv2d_forward(x, weight, nchw="copy")
    with pytest.raises(ValueError, match="weight must be 4-D"):
        pack_conv_weight(weight[0])
    with pytest.raises(ValueError, match=r"x has 4 channels .* weight expects 3"):
        conv2d(x, torch.randn(6, 3, 1, 1, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, path, tma",
    [
        ("layer1-3x3", "implicit", False),
        ("layer1-3x3", "implicit", True),
        ("layer1-3x3", "flat", False),
        ("layer1-3x3", "window", False),
        ("layer4-downsample", "implicit", True),
        ("layer1-1x1-expand", "gemm", False),
    ],
)
def test_resnet50_layers_every_path_on_gpu(name, path, tma, one_config):
    """The non-default paths (TMA off, implicit instead of window, flat) on real layer sizes."""
    x, weight, bias, stride, padding = resnet_inputs(name, torch.bfloat16, True)
    check_forward(x, weight, bias, stride, padding, 1, "relu", dtype_name="bf16", path=path,
                  tma=tma)  # fmt: skip


@pytest.mark.parametrize("name", ["1x1", "3x3-odd-7x9", "7x7-stride2-pad3-C3"])
def test_traced_launch_uses_hook_free_kernels(name, device):
    """Through a launcher other than `direct` (kernels/ops.py passes wrap_triton) the kernels run
    under autotuners with plain configs: torch.compile cannot trace config pre-hooks."""
    from kernels import conv as conv_module

    launched = []

    def launcher(kernel):
        launched.append(kernel)
        return kernel

    geometry = GEOMETRIES[name]
    x, weight, bias = make_inputs(geometry, torch.float16, device)
    x = x.contiguous(memory_format=torch.channels_last)
    check_forward(x, weight, bias, *geometry[2:], dtype_name="fp16", launch=launcher)
    assert len(launched) == 1 and launched[0] in conv_module.TRACEABLE.values()
    assert all(config.pre_hook is None for config in launched[0].configs)


@pytest.mark.parametrize("path", ["gemm", "implicit", "flat", "window"])
def test_tma_output_stores(path, device):
    """K·2 bytes a multiple of 16: the NHWC output goes out through TMA stores, ragged edges
    (M = 70 rows, 5x7 images, K = 24 of a 32-wide tile) clipped by the descriptor."""
    r = 1 if path == "gemm" else 3
    x = torch.randn(2, 32, 5, 7, device=device, dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(24, 32, r, r, device=device, dtype=torch.float16)
    bias = torch.randn(24, device=device, dtype=torch.float16)
    padding = 0 if path == "gemm" else 1
    y = check_forward(x, weight, bias, 1, padding, 1, "relu", dtype_name="fp16", path=path,
                      tma=True)  # fmt: skip
    assert y.is_contiguous(memory_format=torch.channels_last)


# ---------------------------------------------------------------------------------------------
# Round 3: persistent 1x1 paths (gemm_persistent, matmul) and split-K (implicit, window)
# ---------------------------------------------------------------------------------------------
# (N, C, H, W), K: odd pixel counts (M = 198 rows, several tiles per persistent program in the
# interpreter's 4-program grid), K not a multiple of the tile, C a multiple of 8 (TMA rows)
ONE_BY_ONE = ((2, 24, 9, 11), 40)


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("bias_on", [False, True])
@pytest.mark.parametrize("path", ["gemm_persistent", "matmul"])
def test_persistent_1x1_paths(path, bias_on, tma, device):
    (n, c, h, w), k = ONE_BY_ONE
    dtype_name = "fp16" if tma else "fp32"
    dtype = DTYPES[dtype_name]
    x = torch.randn(n, c, h, w, device=device, dtype=dtype).contiguous(
        memory_format=torch.channels_last
    )
    weight = torch.randn(k, c, 1, 1, device=device, dtype=dtype)
    bias = torch.randn(k, device=device, dtype=dtype) if bias_on else None
    y = check_forward(x, weight, bias, 1, 0, 1, "relu", dtype_name=dtype_name, path=path, tma=tma)
    assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("path", ["gemm_persistent", "matmul"])
def test_persistent_1x1_paths_bf16_no_activation(path, device):
    (n, c, h, w), k = ONE_BY_ONE
    x = torch.randn(n, c, h, w, device=device, dtype=torch.bfloat16)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(k, c, 1, 1, device=device, dtype=torch.bfloat16)
    bias = torch.randn(k, device=device, dtype=torch.bfloat16)
    check_forward(x, weight, bias, 1, 0, 1, dtype_name="bf16", path=path)


@pytest.mark.parametrize("path", ["gemm_persistent", "matmul"])
def test_persistent_1x1_paths_need_nhwc_unit_conv(path, device):
    x = torch.randn(1, 8, 5, 5, device=device)  # NCHW: not an (M, C) matrix
    weight = torch.randn(4, 8, 1, 1, device=device)
    with pytest.raises(ValueError, match="1x1, stride-1"):
        conv2d_forward(x, weight, path=path)
    x = x.contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="1x1, stride-1"):
        conv2d_forward(x, weight, stride=2, path=path)


def test_window_path_switch(device, monkeypatch):
    """WINDOW_PATH = 'window_persistent' makes auto take it where the window path applies."""
    import kernels.conv as conv_module

    monkeypatch.setattr(conv_module, "WINDOW_PATH", "window_persistent")
    x = torch.randn(1, 64, 14, 14, device=device, dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(16, 64, 3, 3, device=device, dtype=torch.float16)
    check_forward(x, weight, None, 1, 1, 1, dtype_name="fp16", tma=True)
    assert conv_module.last_launch[0][0] is conv_module.conv_window_persistent_kernel


@pytest.mark.parametrize("choice", ["gemm_persistent", "matmul"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_gemm_1x1_path_switch(choice, channels_last, device, monkeypatch):
    """GEMM_1X1_PATH makes auto take the new path on NHWC 1x1s; NCHW and fp32 inputs still work."""
    import kernels.conv as conv_module

    monkeypatch.setattr(conv_module, "GEMM_1X1_PATH", choice)
    (n, c, h, w), k = ONE_BY_ONE
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for dtype_name in ("fp32", "fp16"):
        x = torch.randn(n, c, h, w, device=device, dtype=DTYPES[dtype_name])
        x = x.contiguous(memory_format=fmt)
        weight = torch.randn(k, c, 1, 1, device=device, dtype=DTYPES[dtype_name])
        bias = torch.randn(k, device=device, dtype=DTYPES[dtype_name])
        y = check(x, weight, bias, activation="relu", dtype_name=dtype_name)
        assert y.is_contiguous(memory_format=fmt)


# (geometry, split_k values): odd sizes, stride 2, padding, dilation; 5 splits of a reduction with
# fewer steps than that (C = 20: 2 channel blocks of 16 x 1 tap) leave some splits empty
SPLIT_CASES = {
    "3x3-odd-7x9": (((2, 20, 7, 9), (40, 3, 3), 1, 1, 1), [2, 3]),
    "3x3-stride2-pad1": (((1, 24, 9, 11), (36, 3, 3), 2, 1, 1), [2, 4]),
    "3x3-dilation2-pad2": (((1, 16, 9, 9), (20, 3, 3), 1, 2, 2), [3]),
    "1x1-stride2": (((2, 20, 9, 7), (24, 1, 1), 2, 0, 1), [2, 5]),
}


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias_on", [False, True])
@pytest.mark.parametrize("case", SPLIT_CASES)
def test_split_k_implicit(case, bias_on, channels_last, device):
    geometry, splits = SPLIT_CASES[case]
    x, weight, bias = make_inputs(geometry, torch.float32, device, bias=bias_on)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=fmt)
    for split_k in splits:
        activation = "relu" if split_k % 2 == 0 else None
        y = check_forward(x, weight, bias, *geometry[2:], activation, dtype_name="fp32",
                          path="implicit", split_k=split_k)  # fmt: skip
        assert y.is_contiguous(memory_format=fmt)


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("split_k", [2, 3])
def test_split_k_window_fp16(split_k, tma, device):
    geometry = ((2, 32, 7, 9), (24, 3, 3), 1, 1, 1)
    x, weight, bias = make_inputs(geometry, torch.float16, device)
    x = x.contiguous(memory_format=torch.channels_last)
    check_forward(x, weight, bias, *geometry[2:], "relu", dtype_name="fp16", path="window",
                  tma=tma, split_k=split_k)  # fmt: skip


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("bias_on", [False, True])
@pytest.mark.parametrize("geometry", [((2, 32, 7, 9), (24, 3, 3), 1, 1, 1),
                                      ((1, 16, 9, 6), (40, 3, 3), 1, 2, 2)])  # fmt: skip
def test_window_persistent_path(geometry, bias_on, tma, device):
    """The persistent window kernel: several tiles per program (4 programs in the interpreter),
    ragged edge boxes, padding and dilation, with and without bias."""
    x, weight, bias = make_inputs(geometry, torch.float16, device, bias=bias_on)
    x = x.contiguous(memory_format=torch.channels_last)
    y = check_forward(x, weight, bias, *geometry[2:], "relu", dtype_name="fp16",
                      path="window_persistent", tma=tma)  # fmt: skip
    assert y.is_contiguous(memory_format=torch.channels_last)


def test_window_persistent_refuses_split_and_stride(device):
    x = torch.randn(1, 16, 8, 8, device=device, dtype=torch.float16)
    x = x.contiguous(memory_format=torch.channels_last)
    weight = torch.randn(8, 16, 3, 3, device=device, dtype=torch.float16)
    with pytest.raises(ValueError, match="split_k"):
        conv2d_forward(x, weight, padding=1, path="window_persistent", split_k=2)
    with pytest.raises(ValueError, match="stride-1"):
        conv2d_forward(x, weight, stride=2, padding=1, path="window_persistent")


def test_tile_counters_are_cached_zeroed_and_grow(device):
    from kernels._common import tile_counters

    dev = torch.device(device)
    first = tile_counters(dev, 10, minimum=16)
    assert first.dtype == torch.int32 and first.numel() >= 16 and int(first.abs().sum()) == 0
    assert tile_counters(dev, 16, minimum=16) is first  # cached while it is large enough
    bigger = tile_counters(dev, first.numel() + 1, minimum=16)
    assert bigger.numel() == first.numel() + 1 and int(bigger.abs().sum()) == 0
    assert tile_counters(dev, 4, minimum=16) is bigger


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


def test_split_k_counters_reset_between_calls(device):
    """The last program of each tile resets its counter: repeated calls give the same result."""
    geometry = ((1, 20, 6, 7), (40, 3, 3), 1, 1, 1)
    x, weight, bias = make_inputs(geometry, torch.float32, device)
    first = conv2d_forward(x, weight, bias, 1, 1, 1, "relu", path="implicit", split_k=3)
    from kernels._common import _TILE_COUNTERS

    for locks in _TILE_COUNTERS.values():
        assert int(locks.abs().sum()) == 0
    for _ in range(2):
        again = conv2d_forward(x, weight, bias, 1, 1, 1, "relu", path="implicit", split_k=3)
        assert torch.equal(first, again)


@pytest.mark.parametrize(
    "layer, split",
    [  # ResNet-50 at batch 32 on 132 SMs: (C, output H=W, K, R, stride 2?) -> split
        ((512, 7, 512, 3), 2),  # 32x512x7 3x3 (and 32x512x14 3x3 stride 2): 100 tiles
        ((256, 14, 256, 3), 1),  # 196 tiles: split 2 lost here in round 3 (0.74-0.80x)
        ((128, 28, 128, 3), 1),  # 392 tiles: enough already
        ((64, 56, 64, 3), 1),
        ((1024, 7, 2048, 1), 1),  # strided 1x1 to 7x7: 400 tiles
    ],
)
def test_split_k_rule(layer, split):
    from kernels.conv import split_k_rule

    c, hw, k, r = layer
    assert split_k_rule(32 * hw * hw, k, c, r, r, sms=132) == split


def test_split_k_bad_options(device):
    x = torch.randn(1, 3, 8, 8, device=device)
    weight = torch.randn(4, 3, 3, 3, device=device)
    with pytest.raises(ValueError, match="split_k"):
        conv2d_forward(x, weight, padding=1, path="flat", split_k=2)
    x1 = torch.randn(1, 8, 4, 4, device=device).contiguous(memory_format=torch.channels_last)
    w1 = torch.randn(4, 8, 1, 1, device=device)
    for path in ("gemm", "gemm_persistent", "matmul"):
        with pytest.raises(ValueError, match="split_k"):
            conv2d_forward(x1, w1, path=path, split_k=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="split_k"):
            conv2d_forward(x, weight, padding=1, split_k=bad)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, options",
    [
        ("layer1-1x1-expand", dict(path="gemm_persistent")),
        ("layer1-1x1-reduce", dict(path="gemm_persistent")),
        ("layer1-1x1-expand", dict(path="matmul")),
        ("layer4-3x3", dict(path="implicit", split_k=2)),
        ("layer4-3x3", dict(path="implicit", split_k=4)),
        ("layer4-downsample", dict(path="implicit", split_k=2)),
        ("layer3-3x3", dict(path="window", split_k=3)),
        ("layer1-3x3", dict(path="window_persistent")),
    ],
)
def test_resnet50_round3_paths_on_gpu(name, options, one_config):
    """The round-3 variants on real layer sizes: persistent 1x1 GEMMs, single-launch split-K."""
    x, weight, bias, stride, padding = resnet_inputs(name, torch.bfloat16, True)
    for _ in range(2):  # the second call reuses the split-K counters the first one left at zero
        check_forward(x, weight, bias, stride, padding, 1, "relu", dtype_name="bf16", **options)
