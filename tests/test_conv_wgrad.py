"""kernels.conv.wgrad (conv2d's weight gradient) against torch's wgrad in float64.

Geometry (filters, strides, paddings on one side or both, dilation, the flat (r, s, c) columns of
few-channel layers), dtypes, layouts and views of dz and x, the pixel splits, dW's layout, the
traced launch and the direct call's plan; on a GPU, ResNet-50 layer sizes. Sizes stay tiny: on CPU
every kernel runs in the Triton interpreter.
"""

import pytest
import torch

from experiments.correctness import relative_error
from kernels.conv import wgrad
from kernels.conv.wgrad import (
    conv2d_wgrad,
    conv2d_wgrad_reference,
    conv_wgrad_kernel,
    split_rule,
    wgrad_split_sum_kernel,
)
from tests.conftest import fast_subset

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def budget(dtype: torch.dtype) -> float:
    """Relative error allowed against the float64 reference. The reference takes the same rounded
    inputs and every product is exact in fp32 (8- or 11-bit mantissas), so what remains is the
    fp32 accumulation in another order and, for 16-bit dtypes, dW's one rounding: at most 2^-8
    (bf16: 8 significant bits) or 2^-11 (fp16: 11) of each element, in norm too."""
    if dtype == torch.float32:
        # TF32 (10-bit operands) on a GPU exactly when torch allows it for convolutions
        tf32 = torch.cuda.is_available() and torch.backends.cudnn.allow_tf32
        return 5e-3 if tf32 else 1e-4
    return {torch.bfloat16: 6e-3, torch.float16: 1e-3}[dtype]  # 2^-8, 2^-11 with a margin


def check(dz, x, kernel_rs, stride, padding, dilation, **options):
    """dW against the float64 reference: in norm and, so that one wrong tap or channel cannot
    hide in a large norm, element by element against the reference's largest entry."""
    dw = conv2d_wgrad(dz, x, kernel_rs, stride, padding, dilation, **options)
    ref = conv2d_wgrad_reference(dz.double(), x.double(), kernel_rs, stride, padding, dilation)
    K, C, R, S = dz.shape[1], x.shape[1], *kernel_rs
    assert dw.shape == (K, C, R, S) and dw.dtype == x.dtype
    assert dw.is_contiguous(memory_format=torch.channels_last)
    tol = budget(x.dtype)
    err = relative_error(dw, ref)
    assert err < tol, f"relative error {err:.2e} for {x.dtype}"
    worst = (dw.double() - ref.to(dw.device)).abs().max().item() / ref.abs().max().item()
    assert worst < tol, f"largest error {worst:.2e} of the largest entry for {x.dtype}"
    return dw


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def output_size(hw, rs, stride, padding, dilation):
    """(P, Q) of the forward; padding (top, left) or (top, left, bottom, right)."""
    pad = pair(padding) if isinstance(padding, int) or len(padding) == 2 else tuple(padding)
    lo, hi = pad[:2], pad[2:] or pad[:2]
    sizes = zip(hw, rs, stride, lo, hi, dilation, strict=True)
    return tuple((n + a + b - d * (k - 1) - 1) // s + 1 for n, k, s, a, b, d in sizes)


def make_inputs(geometry, dtype, device, channels_last=False):
    """Fresh random x and dz for a geometry; the kernel's (R, S) and its geometry pairs."""
    (n, c, h, w), (k, r, s), stride, padding, dilation = geometry
    stride, dilation = pair(stride), pair(dilation)
    p, q = output_size((h, w), (r, s), stride, padding, dilation)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, c, h, w, device=device, dtype=dtype).contiguous(memory_format=fmt)
    dz = torch.randn(n, k, p, q, device=device, dtype=dtype).contiguous(memory_format=fmt)
    top_left = pair(padding) if isinstance(padding, int) else tuple(padding[:2])
    return dz, x, ((r, s), stride, top_left, dilation)


# (N, C, H, W), (K, R, S), stride, padding (top, left[, bottom, right]), dilation. The
# interpreter's tile is 16 output x 32 input channels x 16 pixels: K = 20 has a ragged second
# block, C = 32 and K = 16 none; C < 16 takes the flat (r, s, c) columns.
GEOMETRIES = {
    "3x3-pad1-odd-7x9": ((2, 8, 7, 9), (20, 3, 3), 1, 1, 1),
    "1x1": ((2, 16, 9, 7), (20, 1, 1), 1, 0, 1),
    "1x1-stride2": ((2, 20, 9, 7), (12, 1, 1), 2, 0, 1),
    "7x7-stride2-pad3-C3": ((2, 3, 9, 9), (8, 7, 7), 2, 3, 1),
    "3x3-stride3-pad0-N1": ((1, 17, 9, 8), (6, 3, 3), 3, 0, 1),
    "3x3-dilation2-pad2": ((2, 18, 9, 9), (5, 3, 3), 1, 2, 2),
    "2x5-mixed-pairs-C5": ((2, 5, 8, 9), (9, 2, 5), (2, 1), (1, 2), (1, 2)),
    "3x3-pad(2,0)-K1": ((1, 20, 6, 7), (1, 3, 3), 1, (2, 0), 1),
    "3x3-K1-C3": ((2, 3, 7, 7), (1, 3, 3), 1, 1, 1),
    "3x3-C32-K16-whole-blocks": ((1, 32, 5, 6), (16, 3, 3), 1, 1, 1),
    # padding 'same' of an even kernel: the extra row and columns at the bottom and right, seen
    # by the kernel only as P, Q
    "2x4-same-bottom-right": ((2, 6, 7, 7), (4, 2, 4), 1, (0, 1, 1, 2), 1),
}


@pytest.mark.parametrize("channels_last", fast_subset([False, True], [True]))
@pytest.mark.parametrize("name", GEOMETRIES)
def test_geometry(name, channels_last, device):
    dz, x, args = make_inputs(GEOMETRIES[name], torch.float32, device, channels_last)
    check(dz, x, *args)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("name", fast_subset(["3x3-pad1-odd-7x9", "7x7-stride2-pad3-C3"]))
def test_dtypes(name, dtype_name, device):
    dz, x, args = make_inputs(GEOMETRIES[name], DTYPES[dtype_name], device, channels_last=True)
    check(dz, x, *args)


def channel_slice(t: torch.Tensor, extra: int = 3) -> torch.Tensor:
    """t's values as a slice along dim 1 of a bigger tensor of the same memory format."""
    n, c, h, w = t.shape
    fmt = torch.contiguous_format if t.is_contiguous() else torch.channels_last
    big = torch.randn(n, c + extra, h, w, device=t.device, dtype=t.dtype)
    big = big.contiguous(memory_format=fmt)
    big[:, 1 : c + 1] = t
    return big[:, 1 : c + 1]


@pytest.mark.parametrize(
    "dz_layout, x_layout",
    fast_subset([
        ("nchw", "channels_last"),  # dz from an NCHW consumer, x channels_last
        ("channels_last-slice", "channels_last"),  # dz a channel slice (a split or concat's grad)
        ("nchw-slice", "nchw"),
        ("channels_last", "channels_last-slice"),
        ("spatial-transpose", "nchw-slice"),  # dz a transposed view: no layout at all
    ], [("channels_last-slice", "channels_last"), ("spatial-transpose", "nchw-slice")],
        unpack=True),
)
def test_views(dz_layout, x_layout, device):
    dz, x, args = make_inputs(GEOMETRIES["3x3-pad1-odd-7x9"], torch.float16, device)
    x = x.contiguous(memory_format=torch.channels_last) if "channels_last" in x_layout else x
    x = channel_slice(x) if x_layout.endswith("slice") else x
    if dz_layout == "spatial-transpose":
        dz = dz.transpose(2, 3).contiguous().transpose(2, 3)
    else:
        if "channels_last" in dz_layout:
            dz = dz.contiguous(memory_format=torch.channels_last)
        dz = channel_slice(dz) if dz_layout.endswith("slice") else dz
    check(dz, x, *args)


# split_k: 3 even-ish splits; 7 splits of 30 pixels (2 steps of 16) leave 5 of them empty
@pytest.mark.parametrize(
    "name, geometry, split_k",
    fast_subset([
        ("3x3-dilation2-split3", ((1, 20, 9, 9), (20, 3, 3), 1, 2, 2), 3),
        ("1x1-split7-empty-splits", ((1, 20, 5, 6), (12, 1, 1), 1, 0, 1), 7),
        ("flat-C3-split2", ((2, 3, 7, 7), (8, 3, 3), 1, 1, 1), 2),
    ], [("1x1-split7-empty-splits", ((1, 20, 5, 6), (12, 1, 1), 1, 0, 1), 7),
        ("flat-C3-split2", ((2, 3, 7, 7), (8, 3, 3), 1, 1, 1), 2)], unpack=True),
)
def test_split_k(name, geometry, split_k, device):
    """Forced splits (the rule splits only on a GPU): the partials are summed in split order, so
    a repeat gives the same bits."""
    dz, x, args = make_inputs(geometry, torch.float32, device, channels_last=True)
    first = check(dz, x, *args, split_k=split_k)
    assert torch.equal(first, conv2d_wgrad(dz, x, *args, split_k=split_k))


def test_split_k_bf16(device):
    """The 16-bit dW comes out of the sum kernel, rounded once from the fp32 partials."""
    geometry = ((2, 20, 6, 6), (20, 3, 3), 1, 1, 1)
    dz, x, args = make_inputs(geometry, torch.bfloat16, device, channels_last=True)
    check(dz, x, *args, split_k=4)


@pytest.mark.parametrize("shape", [(0, 8, 5, 5), (2, 8, 0, 5)])
def test_no_pixels_gives_zeros(shape, device):
    n, c, h, w = shape
    x = torch.randn(n, c, h, w, device=device).contiguous(memory_format=torch.channels_last)
    dz = torch.randn(n, 6, h, w, device=device)
    dw = conv2d_wgrad(dz, x, (3, 3), (1, 1), (1, 1), (1, 1))
    assert dw.shape == (6, c, 3, 3) and dw.is_contiguous(memory_format=torch.channels_last)
    assert not dw.any()


def test_one_input_channel_layout(device):
    """C = 1 (and 1x1 filters) make dW both NCHW- and channels_last-contiguous: still the
    (K, R·S·C) matrix the forward reads."""
    dz, x, args = make_inputs(((2, 1, 6, 6), (4, 3, 3), 1, 1, 1), torch.float32, device)
    dw = check(dz, x, *args)
    assert dw.stride() == (9, 1, 3, 1)


@pytest.mark.parametrize("split_k", [1, 3])
def test_traced_launch_uses_hook_free_kernels(split_k, device):
    """Through a launcher other than `direct` (kernels/ops.py passes wrap_triton) the kernel runs
    under an autotuner with plain configs, the split workspace is an ordinary allocation and
    nothing is kept as a plan (a traced call's tensors are fakes)."""
    launched = []

    def launcher(kernel):
        launched.append(kernel)
        return kernel

    wgrad._PLANS.clear()
    dz, x, args = make_inputs(GEOMETRIES["3x3-pad1-odd-7x9"], torch.float16, device, True)
    check(dz, x, *args, launch=launcher, split_k=split_k)
    assert launched[0] is not conv_wgrad_kernel
    assert all(config.pre_hook is None for config in launched[0].configs)
    assert launched[1:] == ([wgrad_split_sum_kernel] if split_k > 1 else [])
    assert not wgrad._PLANS


def test_launcher_that_launches_nothing(device):
    """kernels/ops.py computes output shapes with a launcher that launches nothing."""

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    dz, x, args = make_inputs(GEOMETRIES["1x1-stride2"], torch.float32, device, True)
    dw = conv2d_wgrad(dz, x, *args, launch=lambda kernel: NoLaunch(), split_k=2)
    assert dw.shape == (12, 20, 1, 1) and dw.is_contiguous(memory_format=torch.channels_last)


def test_plan_reused(monkeypatch, device):
    """A direct call keeps its launches under its key: a second call with the same shapes and
    strides (new values) builds nothing and still gives the right dW."""
    wgrad._PLANS.clear()
    geometry = GEOMETRIES["3x3-stride3-pad0-N1"]
    dz, x, args = make_inputs(geometry, torch.float32, device, True)
    check(dz, x, *args, split_k=2)
    assert len(wgrad._PLANS) == 1

    def no_new_plan(*args, **kwargs):
        raise AssertionError("a planned call built its launches again")

    monkeypatch.setattr(wgrad, "_first_run", no_new_plan)
    dz, x, args = make_inputs(geometry, torch.float32, device, True)
    check(dz, x, *args, split_k=2)


@pytest.mark.slow
def test_each_config_takes_its_own_split(monkeypatch):
    """On a GPU a direct call splits each config by its own tiles (config_splits), and the plan
    keeps the tuned config's split: its workspace and its sum. A pretended 48-SM GPU, the
    interpreter's tile (12 tiles of two taps here) and 16 pixels a split at least: 4 splits."""
    from kernels._common import pretend_gpu

    monkeypatch.setattr(wgrad, "SPLIT_PIXELS_MIN", 16)
    geometry = ((2, 18, 6, 7), (20, 3, 3), 1, 1, 1)
    with pretend_gpu((9, 0), 48):
        for seed in (0, 1):  # the second call runs the plan
            torch.manual_seed(seed)
            dz, x, args = make_inputs(geometry, torch.float32, "cpu", channels_last=True)
            check(dz, x, *args)
            (plan,) = wgrad._PLANS.values()
            meta = conv_wgrad_kernel.best_config.kwargs
            splits = wgrad.config_splits(meta, 20, 18, 3, 3, 2 * 6 * 7, 48)
            assert splits == 4 and plan.workspace == splits * 20 * 18 * 9
            assert plan.reduce is not None and plan.reduce.args == (20 * 18 * 9, splits)


def test_config_splits():
    """A config's split counts its own tiles: the 128-channel 3x3 at 56x56 on 132 SMs."""
    one_tap = {"BLOCK_M": 128, "BLOCK_N": 128, "TAPS": 1}
    three = {"BLOCK_M": 128, "BLOCK_N": 64, "TAPS": 3}
    assert wgrad.config_splits(one_tap, 128, 128, 3, 3, 32 * 28 * 28, 132) == 14
    assert wgrad.config_splits(three, 128, 128, 3, 3, 32 * 28 * 28, 132) == 22
    flat = {"BLOCK_M": 64, "BLOCK_N": 64, "TAPS": 3}  # the stem: flat columns, no tap groups
    assert wgrad.config_splits(flat, 64, 3, 7, 7, 32 * 112 * 112, 132) == 44


def with_taps(monkeypatch, taps: int) -> None:
    """The autotuner keeps one config, its first with `taps` taps a program."""
    configs = [c for c in conv_wgrad_kernel.configs if c.kwargs["TAPS"] == taps] or [
        type(c)({**c.kwargs, "TAPS": taps}, num_warps=c.num_warps, num_stages=c.num_stages)
        for c in conv_wgrad_kernel.configs
    ]
    monkeypatch.setattr(conv_wgrad_kernel, "configs", configs[:1])
    monkeypatch.setattr(conv_wgrad_kernel, "cache", {}, raising=False)


@pytest.mark.parametrize("taps", fast_subset([1, 2, 3], [2]))
@pytest.mark.parametrize(
    "name, geometry",
    [
        ("3x3-dilation2-pad2", GEOMETRIES["3x3-dilation2-pad2"]),
        ("2x5-mixed-pairs", ((2, 17, 8, 9), (9, 2, 5), (2, 1), (1, 2), (1, 2))),
        ("1x1", GEOMETRIES["1x1"]),
        ("3x4-stride2-pad(0,3)", ((1, 20, 8, 9), (20, 3, 4), 2, (0, 3), 1)),
    ],
)
def test_taps_per_program(name, geometry, taps, monkeypatch, device):
    """A program's tap group: whole rows, a ragged last group (taps past the row's end are
    computed and dropped) and groups longer than the row, each tap's own bounds at the edges."""
    with_taps(monkeypatch, taps)
    dz, x, args = make_inputs(geometry, torch.float32, device, channels_last=True)
    check(dz, x, *args, split_k=2)


@pytest.mark.parametrize(
    "layer, split",
    [  # ResNet-50 at batch 32 on 132 SMs: (K, C, R, output H=W) -> pixel splits
        ((64, 64, 3, 56), 44),  # 3 tiles of 64x64, 3 taps each
        ((128, 128, 3, 28), 14),  # also the stride-2 3x3 from 56x56
        ((256, 64, 1, 56), 66),  # 2 tiles
        ((64, 256, 1, 56), 66),
        ((256, 256, 3, 14), 3),  # 36 tiles
        ((512, 512, 3, 7), 1),  # 144 tiles: more than one per SM already
        ((2048, 512, 1, 7), 1),  # 1568 pixels: too few to split
        ((64, 3, 7, 112), 66),  # the stem: flat columns, 147 of them in 2 tiles
    ],
)
def test_split_rule(layer, split):
    k, c, r, hw = layer
    assert split_rule(k, c, r, r, 32 * hw * hw, sms=132) == split


# ---------------------------------------------------------------------------------------------
# GPU: ResNet-50 layer sizes at batch 32
# ---------------------------------------------------------------------------------------------
# (N, C, H, W), (K, R, S), stride, padding, dilation
RESNET50_LAYERS = {
    "layer1-3x3": ((32, 64, 56, 56), (64, 3, 3), 1, 1, 1),
    "layer4-3x3": ((32, 512, 7, 7), (512, 3, 3), 1, 1, 1),
    "layer1-1x1-reduce": ((32, 256, 56, 56), (64, 1, 1), 1, 0, 1),
    "layer2-3x3-stride2": ((32, 128, 56, 56), (128, 3, 3), 2, 1, 1),
    "layer3-1x1-stride2": ((32, 512, 28, 28), (1024, 1, 1), 2, 0, 1),
    "stem-7x7": ((32, 3, 224, 224), (64, 7, 7), 2, 3, 1),
}


@pytest.fixture
def one_config(monkeypatch):
    """The autotuner keeps its first config: these tests check results, not speed."""
    monkeypatch.setattr(conv_wgrad_kernel, "configs", conv_wgrad_kernel.configs[:1])
    monkeypatch.setattr(conv_wgrad_kernel, "cache", {}, raising=False)


@pytest.mark.gpu
@pytest.mark.parametrize("taps", [1, 3])
@pytest.mark.parametrize("name", RESNET50_LAYERS)
def test_resnet50_layers_on_gpu(name, taps, monkeypatch):
    with_taps(monkeypatch, taps)
    dz, x, args = make_inputs(RESNET50_LAYERS[name], torch.bfloat16, "cuda", channels_last=True)
    first = check(dz, x, *args)
    assert torch.equal(first, conv2d_wgrad(dz, x, *args))  # deterministic, split or not


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["layer1-3x3", "layer2-3x3-stride2"])
def test_nchw_on_gpu(name, one_config):
    dz, x, args = make_inputs(RESNET50_LAYERS[name], torch.bfloat16, "cuda", channels_last=False)
    check(dz, x, *args)


@pytest.mark.gpu
def test_plan_armed_on_gpu(one_config):
    """The second call with the same shapes launches the kept plan's armed steps."""
    wgrad._PLANS.clear()
    dz, x, args = make_inputs(RESNET50_LAYERS["layer1-3x3"], torch.bfloat16, "cuda", True)
    check(dz, x, *args)
    (plan,) = wgrad._PLANS.values()
    check(dz, x, *args)
    assert next(iter(wgrad._PLANS.values())) is plan
    assert plan.main.fast is not None
    assert plan.reduce is None or plan.reduce.fast is not None


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])  # bf16: the interpreter's fp32 copies
def test_out_is_written_and_returned(dtype_name, device):
    """A caller that runs the wgrad on a side stream passes dW's memory, allocated on its own
    stream: the result lands there, planned call or not."""
    wgrad._PLANS.clear()
    geometry = GEOMETRIES["3x3-stride3-pad0-N1"]
    dz, x, args = make_inputs(geometry, DTYPES[dtype_name], device, True)
    want = conv2d_wgrad(dz, x, *args)
    for _ in range(2):  # the second call runs the plan the first one kept
        out = torch.empty_like(want)
        assert conv2d_wgrad(dz, x, *args, out=out) is out
        assert torch.equal(out, want)


@pytest.mark.parametrize(
    "name, grouped",
    fast_subset([("3x3-dilation2-pad2", True), ("1x1", False), ("7x7-stride2-pad3-C3", False),
                 ("2x5-mixed-pairs-C5", False)], 2, unpack=True),
)  # fmt: skip
def test_traced_launch_tunes_only_configs_it_can_use(name, grouped, device):
    """A traced launch's autotuner has no pruning, so a filter row shorter than three taps (or
    the flat columns) gets the one-tap configs only."""
    launched = []

    def launcher(kernel):
        launched.append(kernel)
        return kernel

    dz, x, args = make_inputs(GEOMETRIES[name], torch.float32, device, True)
    check(dz, x, *args, launch=launcher, split_k=1)
    assert launched[0] is (wgrad._TRACEABLE if grouped else wgrad._TRACEABLE_ONE_TAP)
    assert all(c.kwargs["TAPS"] == 1 for c in wgrad._ONE_TAP)


@pytest.mark.parametrize("split_k", [None, 1, 3])
def test_1x1_runs_as_a_tma_gemm_on_hopper(split_k):
    """A direct 1x1 (stride 1, unpadded, NHWC, 16-bit, 16-byte aligned rows) on a GPU with TMA
    takes wgrad_gemm.py's kernel: unsplit, split (the last split ragged: 70 pixels), and by its
    own config's split; K = 20 (40-byte rows of dZ) keeps the per-tap kernel. A pretended
    Hopper with 8 SMs runs the host descriptors in the interpreter."""
    from kernels._common import pretend_gpu
    from kernels.conv.wgrad_gemm import wgrad_gemm_kernel

    with pretend_gpu((9, 0), 8):
        for (n, c, h, w), k, takes_gemm in (((2, 24, 5, 7), 40, True), ((3, 48, 4, 5), 20, False)):
            torch.manual_seed(n + k)
            geometry = ((n, c, h, w), (k, 1, 1), 1, 0, 1)
            dz, x, args = make_inputs(geometry, torch.float16, "cpu", channels_last=True)
            check(dz, x, *args, split_k=split_k)
            (plan,) = [p for key, p in wgrad._PLANS.items() if key[0] == dz.shape]
            assert (plan.main.kernel is wgrad_gemm_kernel) == takes_gemm
            if split_k is not None:  # a forced split: its slabs and their sum, or neither
                assert plan.workspace == (0 if split_k == 1 else split_k * k * c)
                assert (plan.reduce is None) == (split_k == 1)
