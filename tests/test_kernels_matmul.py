"""kernels.matmul against a float64 reference: odd sizes, strided views, every dtype, every
design (the Hopper TMA kernels run in the interpreter under kernels._common.pretend_gpu), the
fused bias + activation epilogue with the pre-activation, split-K, the dispatch, bad input."""

import contextlib

import pytest
import torch
import triton
import triton.language as tl

import kernels.ops
from experiments.correctness import relative_error, tolerance
from kernels._common import (
    ACTIVATIONS,
    TORCH_ACTIVATIONS,
    dot_precision,
    pretend_gpu,
    tile_counters,
)
from kernels.matmul import apply_activation, fused_matmul, matmul, matmul_reference, plan, planned
from kernels.matmul import dispatch as matmul_dispatch
from kernels.matmul.pointer import matmul_kernel, pointer_configs
from kernels.matmul.splitk import auto_split_k
from kernels.matmul.tma import (
    DECODE_TILE,
    LARGE_TILE,
    SKINNY_TALL_TILE,
    SKINNY_TILE,
    SKINNY_WIDE_TILE,
    STREAM_K,
    WAVE_TILES,
    host_desc_step,
    matmul_tma_device_desc_kernel,
    split_k_scratch,
    tma_configs,
    tma_layout,
)
from tests.conftest import fast_subset

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
ACT_NAMES = list(ACTIVATIONS)
HOPPER = (9, 0)

# The interpreter evaluates sigmoid as 1 / (1 + exp(-x)) in numpy, which warns when exp(-x)
# overflows to inf for x < -88 even though the result, 0, is right.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def tol(dtype_name: str) -> float:
    # The kernel uses TF32 for fp32 exactly when torch's switch allows it (never interpreted).
    tf32 = dot_precision(DTYPES[dtype_name], torch.backends.cuda.matmul.allow_tf32) == "tf32"
    return tolerance(dtype_name, tf32)


def random_matrix(rows, cols, layout, dtype, device, generator):
    """A (rows, cols) matrix stored as `layout`: contiguous, transposed (the .t() of a (cols, rows)
    tensor), or split (the second piece of a torch.split along dim 1: offset storage, wide rows)."""

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    if layout == "transposed":
        return randn(cols, rows).t()
    if layout == "split":
        return randn(rows, cols + 3).split([3, cols], dim=1)[1]
    return randn(rows, cols)


def fused_reference(a, b, bias, activation):
    z = a.double() @ b.double()
    if bias is not None:
        z = z + bias.double()
    return TORCH_ACTIVATIONS[activation](z), z


def check_fused(a, b, bias, dtype_name, activations=ACT_NAMES):
    """fused_matmul's c and z against float64 for each activation; without save_preact, the
    same c and no z."""
    M, N = a.shape[0], b.shape[1]
    for act in activations:
        c, z = fused_matmul(a, b, bias, ACTIVATIONS[act], True)
        ref_c, ref_z = fused_reference(a, b, bias, act)
        assert c.shape == z.shape == (M, N) and c.is_contiguous() and c.dtype == a.dtype
        for out, ref, what in [(c, ref_c, f"{act} c"), (z, ref_z, f"{act} z")]:
            err = relative_error(out, ref)
            assert err < tol(dtype_name), f"{what}: relative error {err:.2e}"
        c2, z2 = fused_matmul(a, b, bias, ACTIVATIONS[act], False)
        assert z2 is None and torch.equal(c2, c), act


def check(a, b, dtype_name):
    c = matmul(a, b)
    assert c.dtype == a.dtype and c.shape == (a.shape[0], b.shape[1]) and c.is_contiguous()
    err = relative_error(c, matmul_reference(a.double(), b.double()))
    assert err < tol(dtype_name), f"relative error {err:.2e} >= {tol(dtype_name):.0e}"


# ---- matmul on this machine's design (the pointer kernel in the interpreter) ----
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["bf16", "fp32"]))
@pytest.mark.parametrize(
    "shape", fast_subset([(1823, 7, 65), (1, 65, 7), (65, 1823, 33), (7, 1, 1823), (65, 33, 1)],
                         [(1823, 7, 65), (1, 65, 7), (7, 1, 1823), (65, 33, 1)]),
    ids=lambda s: "x".join(map(str, s)),
)  # fmt: skip
def test_odd_shapes(shape, dtype_name, device):
    """Each of 1, 7, 65 and 1823 in every position of (M, N, K)."""
    M, N, K = shape
    gen = torch.Generator().manual_seed(0)
    a = random_matrix(M, K, "contiguous", DTYPES[dtype_name], device, gen)
    b = random_matrix(K, N, "contiguous", DTYPES[dtype_name], device, gen)
    check(a, b, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "a_layout, b_layout",
    [("transposed", "contiguous"), ("contiguous", "transposed"), ("split", "split"),
     ("transposed", "split")],
)  # fmt: skip
def test_strided_views(a_layout, b_layout, dtype_name, device):
    M, N, K = 65, 33, 47
    gen = torch.Generator().manual_seed(1)
    a = random_matrix(M, K, a_layout, DTYPES[dtype_name], device, gen)
    b = random_matrix(K, N, b_layout, DTYPES[dtype_name], device, gen)
    assert not (a.is_contiguous() and b.is_contiguous())
    check(a, b, dtype_name)


@pytest.mark.parametrize("shape", [(0, 5, 3), (4, 0, 3), (4, 5, 0)])
def test_empty_dims(shape, device):
    M, N, K = shape
    a = torch.randn(M, K, device=device)
    b = torch.randn(K, N, device=device)
    c = matmul(a, b)
    assert c.shape == (M, N)
    assert torch.equal(c, torch.zeros(M, N, device=device))  # an empty sum is zero


# ---- every design's fused epilogue: bias, each activation, the pre-activation ----
@pytest.mark.parametrize("gpu", [None, HOPPER], ids=["pointer", "hopper"])
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["bf16"]))
@pytest.mark.parametrize(
    "a_layout, b_layout, N",
    # N = 24 keeps C's rows 16-byte aligned (TMA store); N = 7 takes the masked-store epilogue.
    fast_subset([("contiguous", "contiguous", 24), ("transposed", "transposed", 7),
                 ("contiguous", "transposed", 24), ("transposed", "contiguous", 24)], 2,
                unpack=True),
)  # fmt: skip
def test_fused_epilogue(a_layout, b_layout, N, dtype_name, gpu, device):
    """On a pretended Hopper the 16-bit dtypes take the host-descriptor TMA kernel (the skinny
    64x64x128 tile; K = 200 leaves its second K step short) and fp32 the device-descriptor one,
    each reading every operand as stored; else the pointer kernel."""
    M, K = 40, 200
    gen = torch.Generator().manual_seed(4)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, a_layout, dtype, device, gen)
    b = random_matrix(K, N, b_layout, dtype, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=dtype)
    if gpu is None:
        check_fused(a, b, bias, dtype_name)
        return
    with pretend_gpu(gpu, 132):
        want = "tma_device_desc" if dtype_name == "fp32" else "tma_host_desc"
        assert plan(a, b).kernel == want
        check_fused(a, b, bias, dtype_name)


@pytest.mark.parametrize("gpu", [None, HOPPER], ids=["pointer", "hopper"])
@pytest.mark.parametrize("dtype_name", fast_subset(["bf16", "fp32"]))
def test_activation_pass(gpu, dtype_name, monkeypatch, device):
    """Saving z with an activation other than relu, from ACTIVATION_PASS_MIN_M rows (lowered here
    to reach odd small shapes), the GEMM stores z alone and a pass of its own applies the
    activation: the plan says so, c and z stay within tolerance of float64, and c is the
    activation of the stored z (so it may differ from a call without z, whose epilogue applies
    the activation to z before rounding). Relu, no activation and calls that keep no z stay
    fused."""
    monkeypatch.setattr(matmul_dispatch, "ACTIVATION_PASS_MIN_M", 33)
    gen = torch.Generator().manual_seed(9)
    dtype = DTYPES[dtype_name]
    a = random_matrix(65, 200, "transposed", dtype, device, gen)
    b = random_matrix(200, 24, "contiguous", dtype, device, gen)
    bias = torch.randn(24, generator=gen).to(device=device, dtype=dtype)
    with pretend_gpu(gpu, 132) if gpu else contextlib.nullcontext():
        for act in ACT_NAMES:
            ref_c, ref_z = fused_reference(a, b, bias, act)
            for save in (True, False):
                c, z = fused_matmul(a, b, bias, ACTIVATIONS[act], save)
                p = planned(a, b, bias, ACTIVATIONS[act], save)
                assert p.act_pass == (save and act not in ("none", "relu")), (act, save)
                assert relative_error(c, ref_c) < tol(dtype_name), (act, save)
                if save:
                    assert relative_error(z, ref_z) < tol(dtype_name), act
                if p.act_pass:
                    want = TORCH_ACTIVATIONS[act](z.double())
                    assert relative_error(c, want) < tol(dtype_name), act
        short = random_matrix(32, 200, "contiguous", dtype, device, gen)
        fused_matmul(short, b, bias, ACTIVATIONS["gelu"], True)
        assert not planned(short, b, bias, ACTIVATIONS["gelu"], True).act_pass  # under the rows


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("N", [1016, 1015], ids=["tma-store", "masked-store"])
@pytest.mark.slow
def test_subtiled_epilogue(N, with_bias, device):
    """The 128x256 tile's epilogue in column blocks (2 without an activation, 4 with one, each
    adding its own slice of the bias), and its masked full-tile store where C's rows are not
    16-byte aligned. On one pretended SM, 130 x 1016 is 8 waves of 128x256 tiles, which
    heuristic_tile prices below 16 of 128x128 or 32 of 128x64."""
    M, K = 130, 72
    gen = torch.Generator().manual_seed(13)
    a = random_matrix(M, K, "contiguous", torch.bfloat16, device, gen)
    b = random_matrix(K, N, "transposed", torch.bfloat16, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=torch.bfloat16)
    with pretend_gpu(HOPPER, 1):
        assert plan(a, b).tile == LARGE_TILE and LARGE_TILE.subtile
        check_fused(a, b, bias if with_bias else None, "bf16")


def test_decode_tile(device):
    """M <= 32 on a pretended Hopper: the 16-row tile with BLOCK_K 256 (K = 312: a short step)."""
    gen = torch.Generator().manual_seed(14)
    a = random_matrix(5, 312, "contiguous", torch.float16, device, gen)
    b = random_matrix(312, 40, "transposed", torch.float16, device, gen)
    bias = torch.randn(40, generator=gen).to(device=device, dtype=torch.float16)
    with pretend_gpu(HOPPER, 132):
        assert plan(a, b).tile == DECODE_TILE
        check_fused(a, b, bias, "fp16", ["none", "silu"])


@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES))
def test_split_k(dtype_name, device):
    """A skinny, deep GEMM on the pointer path is cut into 2 K slices (the second one step short
    in the interpreter's 32-deep tiles); splitk_reduce_kernel adds them and runs the epilogue."""
    M, N, K = 16, 40, 1040
    gen = torch.Generator().manual_seed(5)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, "contiguous", dtype, device, gen)
    b = random_matrix(K, N, "transposed", dtype, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=dtype)
    if device == "cuda":
        pytest.skip("on a GPU this shape takes the device's own plan")
    assert plan(a, b) == ("pointer", 2, None)
    check_fused(a, b, bias, dtype_name, ["none", "gelu"])
    check_fused(a, b, None, dtype_name, ["relu"])


@pytest.mark.parametrize("K, a_layout, b_layout", [(4000, "transposed", "contiguous"),
                                                    (4040, "contiguous", "transposed")])
def test_split_k_tma(K, a_layout, b_layout, device):
    """A wgrad-like GEMM (few tiles, deep K) on a pretended 8-SM Hopper: 200 x 64 is 4 tiles of
    64x64, so split_plan cuts the K steps (63 at K = 4000, the last one short; 64 at 4040) into
    slices, each a work item of the persistent loop; the last
    slice of a tile to finish sums the fp32 partials and runs the fused epilogue. A column-major
    A (wgrad's dY^T) and B (the weight's .t()); a second call reuses the counters the first
    left at zero."""
    if device == "cuda":
        pytest.skip("on a GPU this shape takes the device's own plan")
    M, N = 200, 64
    gen = torch.Generator().manual_seed(21)
    a = random_matrix(M, K, a_layout, torch.bfloat16, device, gen)
    b = random_matrix(K, N, b_layout, torch.bfloat16, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=torch.bfloat16)
    with pretend_gpu(HOPPER, 8):
        kernel, split_k, _ = plan(a, b)
        assert kernel == "tma_host_desc" and split_k > 1
        check_fused(a, b, bias, "bf16", ["none", "gelu"])
        check(a, b, "bf16")


@pytest.mark.parametrize("split_k", [2, 3, STREAM_K], ids=["split2", "split3", "stream-k"])
def test_k_decompositions_of_the_tma_kernel(split_k, device):
    """Each decomposition split_plan may pick, forced on the host-descriptor kernel in the
    interpreter's 4 programs: 136 x 136 in 128x64 tiles is 6 tiles, K = 1000 is 16 steps (the
    last one short), so split 3 slices them 6/6/4 and stream-K runs 24 steps a program, every
    other tile shared by two; bias + gelu with the pre-activation, twice (the counters back at
    zero)."""
    if device == "cuda":
        pytest.skip("the interpreter's four programs; test_split_k_tma_on_gpu runs the GPU's")
    M, N, K = 136, 136, 1000
    gen = torch.Generator().manual_seed(23)
    a = random_matrix(M, K, "transposed", torch.bfloat16, device, gen)
    b = random_matrix(K, N, "transposed", torch.bfloat16, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=torch.bfloat16)
    ref_c, ref_z = fused_reference(a, b, bias, "gelu")
    tile = WAVE_TILES[2]
    common = matmul_dispatch.launch_constexprs(torch.bfloat16, True, ACTIVATIONS["gelu"], True)
    with pretend_gpu(HOPPER, 4):
        for _ in range(2):
            c, z = torch.full((2, M, N), float("nan"), dtype=torch.bfloat16).unbind()
            step = host_desc_step(a, b, c, bias, z, tile, common, 4, split_k)
            numel, counters = split_k_scratch(M, N, K, tile, split_k, 4)
            workspace = torch.empty(numel, dtype=torch.float32)
            step(a, b, c, bias, z, workspace, tile_counters(a.device, counters))
            assert relative_error(c, ref_c) < tol("bf16") and relative_error(z, ref_z) < tol("bf16")


# ---- the dispatch ----
def meta(M, K, N, dtype=torch.bfloat16, b_layout="contiguous"):
    """Shape-only operands (the plan reads shapes, strides and dtype, never data)."""
    a = torch.empty(M, K, dtype=dtype, device="meta")
    b = torch.empty(N, K, dtype=dtype, device="meta").t() if b_layout == "transposed" else None
    return a, b if b is not None else torch.empty(K, N, dtype=dtype, device="meta")


@pytest.mark.parametrize(
    "shape, tile",
    # H100 (132 SMs), 16-bit: by M, then by how many waves of tiles the shape makes
    [((16, 4096, 4096), DECODE_TILE),
     ((1, 4096, 14336), DECODE_TILE),
     ((128, 4096, 4096), SKINNY_TILE),
     ((33, 14336, 4096), SKINNY_TILE),
     ((64, 28672, 4096), SKINNY_WIDE_TILE),  # 64x64 tiles: 448 > 2 waves, at most 64 rows
     ((128, 14336, 4096), SKINNY_TALL_TILE),  # 448 > 2 waves, taller than 64 rows
     ((512, 512, 512), WAVE_TILES[3]),
     ((1024, 1024, 1024), WAVE_TILES[2]),  # 128x64: 128 tiles, about one wave
     ((2048, 2048, 2048), WAVE_TILES[0]),
     ((4096, 4096, 4096), LARGE_TILE),
     ((16384, 14336, 4096), LARGE_TILE)],
    ids=lambda v: "x".join(map(str, v)) if isinstance(v[0], int) and len(v) == 3 else None,
)  # fmt: skip
def test_dispatch_hopper_16bit_tiles(shape, tile):
    M, N, K = shape
    with pretend_gpu(HOPPER, 132):
        for dtype in (torch.bfloat16, torch.float16):
            assert plan(*meta(M, K, N, dtype, "transposed")) == ("tma_host_desc", 1, tile)


def test_dispatch():
    """Which kernel (and K split) representative calls take, by capability, layout and launch."""
    traced = lambda kernel: kernel  # any launcher other than kernels._common.direct
    with pretend_gpu(HOPPER, 132):
        assert plan(*meta(4096, 4096, 4096, torch.float32)) == ("tma_device_desc", 1, None)
        assert plan(*meta(16, 4096, 4096, torch.float32)) == ("tma_device_desc", 1, None)
        # rows of 1823 bf16 elements are not 16-byte aligned: the pointer kernel, split for M = 16
        assert plan(*meta(16, 1823, 4096)) == ("pointer", 2, None)
        assert plan(*meta(1024, 1823, 4096)) == ("pointer", 1, None)
        # launches traced by torch.compile: 16-bit takes the device-descriptor kernel at the
        # direct call's tile, but a host-bound GEMM the pointer kernel in one launch; fp32 and
        # operands TMA cannot read the pointer kernel, split over K where skinny
        assert plan(*meta(16, 4096, 4096), launch=traced) == ("tma_device_desc", 1, DECODE_TILE)
        assert plan(*meta(4096, 4096, 4096), launch=traced) == ("tma_device_desc", 1, LARGE_TILE)
        assert plan(*meta(2048, 2048, 2048), launch=traced) == ("pointer", 1, None)
        assert plan(*meta(16, 4096, 4096, torch.float32), launch=traced) == ("pointer", 8, None)
        assert plan(*meta(16, 1823, 4096), launch=traced) == ("pointer", 2, None)
        assert plan(*meta(64, 0, 64)) == ("pointer", 1, None)  # K = 0: nothing to describe
    with pretend_gpu(HOPPER, 66):  # split-K by the SM count: 32 tiles x 4 slices fill 2 x 66
        assert plan(*meta(16, 4096, 4096, torch.float32), launch=traced) == ("pointer", 4, None)
    with pretend_gpu((8, 0), 66):  # no TMA: the pointer kernel, split-K sized for 132 SMs
        assert plan(*meta(16, 4096, 4096)) == ("pointer", 8, None)
        assert plan(*meta(4096, 4096, 4096)) == ("pointer", 1, None)
    assert plan(*meta(16, 4096, 4096)) == ("pointer", 8, None)  # the interpreter, no GPU
    # slices at least 512 deep, at most 2 work items per SM
    assert auto_split_k(16, 4096, 4096, 132) == 8 and auto_split_k(16, 4096, 1000, 132) == 1
    assert auto_split_k(129, 4096, 4096, 132) == 1


@pytest.mark.parametrize(
    "make, ok",
    [
        (lambda: torch.randn(8, 16), (False, 16)),
        (lambda: torch.randn(16, 8).t(), (True, 8)),
        (lambda: torch.randn(8, 19)[:, 3:], None),  # offset start: 12 bytes
        (lambda: torch.randn(8, 20)[:, 4:], (False, 20)),  # offset 16 bytes, row stride 80 bytes
        (lambda: torch.randn(8, 7), None),  # 28-byte rows
        (lambda: torch.randn(16).expand(8, 16), None),  # stride 0
        (lambda: torch.randn(8, 32)[:, ::2], None),  # no unit stride
    ],
    ids=["row-major", "col-major", "offset", "aligned-slice", "odd-rows", "expand", "step"],
)
def test_tma_layout_rules(make, ok):
    assert tma_layout(make()) == ok


# ---- torch.matmul's other operand ranks ----
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((33,), (33, 7)), ((5, 33), (33,)), ((33,), (33,)), ((2, 3, 5, 33), (33, 7)),
     ((4, 5, 33), (33,))],
    ids=["vec-mat", "mat-vec", "dot", "batched-a", "batched-a-vec"],
)
def test_vector_and_batched_operands(a_shape, b_shape, device):
    """1-D operands and a batched a, as torch.matmul: results against float64, a batched a read
    in place (its batch dims merge with M) and a transposed one (they do not: reshape copies)."""
    g = torch.Generator().manual_seed(8)
    a = torch.randn(a_shape, generator=g).to(device)
    b = torch.randn(b_shape, generator=g).to(device)
    ref = torch.matmul(a.double(), b.double())
    for fn in (matmul, kernels.ops.matmul):
        c = fn(a, b)
        assert c.shape == ref.shape
        assert relative_error(c, ref) <= tolerance("fp32", False)
    if len(a_shape) > 2:
        swapped = (*a_shape[:-2], a_shape[-1], a_shape[-2])
        at = torch.randn(swapped, generator=g).to(device).transpose(-1, -2)  # columns unit
        ref = torch.matmul(at.double(), b.double())
        assert relative_error(matmul(at, b), ref) <= tolerance("fp32", False)


# ---- bad input ----
def tensor(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(*shape, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "a, b, error, match",
    [
        ([[1.0]], tensor(1, 1), TypeError, "a must be a torch.Tensor"),
        (tensor(4, 5), tensor(2, 6, 3), ValueError, r"inner dims.*\(4, 5\).*\(2, 6, 3\)"),
        (tensor(()), tensor(5), ValueError, r"at least 1 dim, got shapes \(\) and \(5,\)"),
        (tensor(4, 5), tensor(6, 3), ValueError, r"inner dims.*\(4, 5\).*\(6, 3\)"),
        (tensor(4, 5), tensor(5, 3, dtype=torch.float16), TypeError, "b has dtype torch.float16"),
        (tensor(4, 5, dtype=torch.float64), tensor(5, 3), TypeError, "supported dtypes"),
        (tensor(4, 5, dtype=torch.int32), tensor(5, 3), TypeError, "supported dtypes"),
        (tensor(4, 5), tensor(5, 3, device="meta"), ValueError, "b is on meta"),
    ],
    ids=["list", "b-3d", "a-0d", "inner-dim", "dtype-mismatch", "float64", "int32", "device"],
)
def test_bad_input(a, b, error, match):
    with pytest.raises(error, match=match):
        matmul(a, b)


# ---- the activation itself ----
@triton.jit
def _activation_kernel(x_ptr, y_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, apply_activation(x, ACTIVATION), mask=offs < n)


def test_exact_gelu_fp32_accuracy(device):
    """apply_activation's exact gelu (an erfc formulation, no tl.erf) in fp32 against float64
    x·Phi(x) over [-20, 20]: relative error <= 1e-5 wherever |gelu| > 1e-6 (the negative tail
    included) and <= 1e-6·max(|x|, 1) everywhere; not the tanh approximation."""
    x = torch.cat([torch.linspace(-20, 20, 40001, dtype=torch.float64),
                   torch.logspace(-7, 1, 801, dtype=torch.float64),
                   -torch.logspace(-7, 1, 801, dtype=torch.float64)])  # fmt: skip
    ref = x * 0.5 * torch.special.erfc(-x / 2**0.5)
    xf = x.float().to(device)
    y = torch.empty_like(xf)
    grid = (triton.cdiv(x.numel(), 1024),)
    _activation_kernel[grid](xf, y, x.numel(), ACTIVATION=ACTIVATIONS["gelu"], BLOCK=1024)
    err = (y.double().cpu() - ref).abs()
    big = ref.abs() > 1e-6
    assert (err[big] / ref[big].abs()).max() < 1e-5
    assert (err / x.abs().clamp_min(1.0)).max() < 1e-6
    tanh_form = torch.nn.functional.gelu(x, approximate="tanh")
    assert (tanh_form - ref).abs().max() > 1e-4  # the two forms are told apart at this precision


# ---- on the GPU: the device's own plan ----
@pytest.fixture
def few_configs(monkeypatch):
    """A few tiles per autotuned kernel for the GPU tests: they check the kernels' logic, and
    autotuning every shipped config for every test shape would take minutes."""
    from triton.runtime.autotuner import Autotuner

    def keep(configs, wanted):
        def name(c):
            kw = c.kwargs
            return (kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], c.num_stages)

        return [c for c in configs if name(c) in wanted]

    tma = keep(tma_configs(), {(128, 128, 32, 4), (64, 128, 32, 4)})
    # (64, 64, 32, 5) is the skinny tile that fits shared memory in fp32: the other skinny one
    # needs 256 KB there, and the autotuner must have a config it can launch
    pointer = keep(pointer_configs(), {(128, 128, 64, 4), (64, 64, 128, 4), (64, 64, 32, 5)})
    assert len(tma) == 2 and len(pointer) == 3
    for kernel, configs in [(matmul_tma_device_desc_kernel, tma), (matmul_kernel, pointer)]:
        assert isinstance(kernel, Autotuner)
        monkeypatch.setattr(kernel, "configs", configs)
        monkeypatch.setattr(kernel, "cache", {})


GPU_CASES = [
    # (M, N, K), B layout, dtype, TF32: decode (16-row tile), skinny with W.t() as B, odd M, an
    # odd K that TMA cannot take (pointer kernel), fp32 without and with TF32 (a row-major B is
    # copied K-major for TF32), skinny TF32 (pointer kernel, split-K), square (128x256 tile)
    ((16, 4096, 4096), "contiguous", "bf16", False),
    ((128, 1024, 4096), "transposed", "fp16", False),
    ((1000, 1536, 520), "contiguous", "bf16", False),
    ((257, 1823, 1823), "contiguous", "bf16", False),
    ((512, 768, 1024), "transposed", "fp32", False),
    ((1000, 1536, 520), "contiguous", "fp32", True),
    ((16, 1024, 4096), "contiguous", "fp32", True),
    ((2048, 2048, 2048), "transposed", "fp16", False),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, b_layout, dtype_name, tf32",
    GPU_CASES,
    ids=["decode", "skinny-bT", "odd-m", "odd-k-pointer", "fp32-bT", "tf32-copy", "tf32-skinny",
         "square"],
)  # fmt: skip
def test_paths_on_gpu(shape, b_layout, dtype_name, tf32, few_configs, monkeypatch):
    """The automatic path on the GPU (TMA on sm_90+, the pointer kernel for 1823-wide rows) with
    a fused bias + gelu epilogue and without, twice (a second call reuses tuned configs and
    descriptors' scratch), against float64."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    M, N, K = shape
    gen = torch.Generator().manual_seed(6)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, "contiguous", dtype, "cuda", gen)
    b = random_matrix(K, N, b_layout, dtype, "cuda", gen)
    bias = torch.randn(N, generator=gen).to(device="cuda", dtype=dtype)
    ref_c, ref_z = fused_reference(a, b, bias, "gelu")
    for _ in range(2):
        c, z = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], True)
        assert relative_error(c, ref_c) < tol(dtype_name)
        assert relative_error(z, ref_z) < tol(dtype_name)
    assert relative_error(matmul(a, b), a.double() @ b.double()) < tol(dtype_name)


# Wgrad-like GEMMs (few tiles, deep K) the GPU's own split_plan decomposes over K (one is
# enough; the first that does on the GPU at hand), in the layouts of a linear's forward, dgrad
# and wgrad
SPLIT_CASES = [(768, 192, 25088), (256, 512, 25088), (384, 96, 100352)]


@pytest.mark.gpu
@pytest.mark.parametrize("a_layout, b_layout", [("contiguous", "transposed"),
                                                ("contiguous", "contiguous"),
                                                ("transposed", "contiguous")])  # fmt: skip
def test_split_k_tma_on_gpu(a_layout, b_layout):
    """A split host-descriptor launch on the GPU (every tile's slices summed by the last one to
    finish), with the fused bias + gelu epilogue and without, three calls in a row (the tile
    counters must be back at zero after each), against float64."""
    gen = torch.Generator().manual_seed(22)
    for M, N, K in SPLIT_CASES:
        a = random_matrix(M, K, a_layout, torch.bfloat16, "cuda", gen)
        b = random_matrix(K, N, b_layout, torch.bfloat16, "cuda", gen)
        if plan(a, b).split_k != 1:  # split-K or stream-K
            break
    else:
        pytest.fail(f"no shape of {SPLIT_CASES} splits on this GPU")
    bias = torch.randn(N, generator=gen).to(device="cuda", dtype=torch.bfloat16)
    ref_c, ref_z = fused_reference(a, b, bias, "gelu")
    for _ in range(3):
        c, z = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], True)
        assert relative_error(c, ref_c) < tol("bf16") and relative_error(z, ref_z) < tol("bf16")
        assert relative_error(matmul(a, b), a.double() @ b.double()) < tol("bf16")


# (a shape, b shape): torch.matmul's cases, broadcast batch dims included
GRAD_CASES = [((5, 7), (7, 3)), ((7,), (7, 3)), ((5, 7), (7,)), ((7,), (7,)), ((2, 5, 7), (7, 3)),
              ((2, 5, 7), (2, 7, 3)), ((5, 7), (2, 7, 3)), ((3, 1, 5, 7), (2, 7, 4)),
              ((7,), (2, 7, 3))]  # fmt: skip


@pytest.mark.parametrize("shapes", GRAD_CASES, ids=lambda s: f"{s[0]}@{s[1]}")
def test_gradients_match_torch_matmul_in_float64(shapes, device):
    """Both gradients (matmuls themselves, summed over the dims an operand was broadcast along)
    against torch.matmul's in float64, for the public function and the triton-compiled op."""
    generator = torch.Generator().manual_seed(11)
    for fn in (matmul, kernels.ops.matmul):
        a = torch.randn(shapes[0], generator=generator).to(device).requires_grad_()
        b = torch.randn(shapes[1], generator=generator).to(device).requires_grad_()
        c = fn(a, b)
        grad = torch.randn(c.shape, generator=generator).to(device)
        c.backward(grad)
        a64, b64 = (t.detach().double().requires_grad_() for t in (a, b))
        c64 = torch.matmul(a64, b64)
        c64.backward(grad.double())
        assert c.shape == c64.shape
        for got, want in ((c, c64), (a.grad, a64.grad), (b.grad, b64.grad)):
            # fp32: the accumulation order (and TF32 where torch allows it on a GPU) differs
            assert relative_error(got, want) < tolerance("fp32", tf32=device == "cuda")
