"""kernels.matmul against a float64 reference: odd sizes, strided views, every dtype, bad input."""

import importlib

import pytest
import torch
import triton
import triton.language as tl

from experiments.correctness import relative_error, tolerance
from kernels._common import _TILE_COUNTERS, ACTIVATIONS, TORCH_ACTIVATIONS, dot_precision
from kernels.matmul import (
    _tma_layout,
    apply_activation,
    fused_matmul,
    matmul,
    matmul_reference,
    plan,
)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}

# (M, N, K): each of 1, 7, 65 and 1823 in every position, in shapes the interpreter runs fast.
SHAPES = [(1823, 7, 65), (1, 65, 7), (65, 1823, 33), (7, 1, 1823), (65, 33, 1)]


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


def check(a, b, dtype_name):
    c = matmul(a, b)
    assert c.dtype == a.dtype and c.shape == (a.shape[0], b.shape[1]) and c.is_contiguous()
    err = relative_error(c, matmul_reference(a.double(), b.double()))
    assert err < tol(dtype_name), f"relative error {err:.2e} >= {tol(dtype_name):.0e}"


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes(shape, dtype_name, device):
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


def tensor(*shape, dtype=torch.float32, device="cpu"):
    return torch.ones(*shape, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "a, b, error, match",
    [
        ([[1.0]], tensor(1, 1), TypeError, "a must be a torch.Tensor"),
        (tensor(2, 4, 5), tensor(5, 3), ValueError, r"a must be 2-D, got shape \(2, 4, 5\)"),
        (tensor(4, 5), tensor(5), ValueError, r"b must be 2-D, got shape \(5,\)"),
        (tensor(4, 5), tensor(6, 3), ValueError, r"inner dims.*\(4, 5\).*\(6, 3\)"),
        (tensor(4, 5), tensor(5, 3, dtype=torch.float16), TypeError, "b has dtype torch.float16"),
        (tensor(4, 5, dtype=torch.float64), tensor(5, 3), TypeError, "supported dtypes"),
        (tensor(4, 5, dtype=torch.int32), tensor(5, 3), TypeError, "supported dtypes"),
        (tensor(4, 5), tensor(5, 3, device="meta"), ValueError, "b is on meta"),
    ],
    ids=["list", "a-3d", "b-1d", "inner-dim", "dtype-mismatch", "float64", "int32", "device"],
)
def test_bad_input(a, b, error, match):
    with pytest.raises(error, match=match):
        matmul(a, b)


# ---- both kernels and every epilogue through fused_matmul (the launch linear uses) ----
ACT_NAMES = ["none", "relu", "gelu", "gelu_tanh", "silu"]


def fused_reference(a, b, bias, activation):
    z = a.double() @ b.double()
    if bias is not None:
        z = z + bias.double()
    return TORCH_ACTIVATIONS[activation](z), z


@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("path", ["pointer", "tma"])
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "a_layout, b_layout, N",
    # N = 24 keeps C's rows 16-byte aligned (TMA store); N = 7 takes the masked-store epilogue.
    [("contiguous", "contiguous", 24), ("transposed", "transposed", 7),
     ("contiguous", "transposed", 24), ("transposed", "contiguous", 24)],
)  # fmt: skip
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_fused_epilogue_paths(a_layout, b_layout, N, dtype_name, path, split_k, device):
    """The TMA kernel runs here in the interpreter too (descriptors over each operand's stored
    layout); split_k 3 leaves one K slice short and goes through splitk_reduce_kernel."""
    M, K = 40, 104
    gen = torch.Generator().manual_seed(4)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, a_layout, dtype, device, gen)
    b = random_matrix(K, N, b_layout, dtype, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=dtype)
    for act in ACT_NAMES:
        c, z = fused_matmul(a, b, bias, ACTIVATIONS[act], True, path=path, split_k=split_k)
        ref_c, ref_z = fused_reference(a, b, bias, act)
        assert c.shape == z.shape == (M, N) and c.is_contiguous() and c.dtype == dtype
        for out, ref, what in [(c, ref_c, f"{act} c"), (z, ref_z, f"{act} z")]:
            err = relative_error(out, ref)
            assert err < tol(dtype_name), f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("path", ["pointer", "tma"])
def test_fused_no_bias_no_preact(path, device):
    gen = torch.Generator().manual_seed(5)
    a = random_matrix(40, 64, "contiguous", torch.float32, device, gen)
    b = random_matrix(64, 32, "transposed", torch.float32, device, gen)
    c, z = fused_matmul(a, b, None, ACTIVATIONS["relu"], False, path=path, split_k=2)
    assert z is None
    err = relative_error(c, fused_reference(a, b, None, "relu")[0])
    assert err < tol("fp32")


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
    assert _tma_layout(make()) == ok


def test_tma_path_refuses_unaligned(device):
    a = torch.randn(8, 7, device=device)
    b = torch.randn(7, 16, device=device)
    with pytest.raises(ValueError, match="TMA path needs 16-byte aligned"):
        fused_matmul(a, b, path="tma")


def test_plan_without_tma_is_pointer(device):
    a, b = torch.randn(16, 4096, device="cpu"), torch.randn(4096, 64, device="cpu")
    path, split_k = plan(a, b)
    assert path == "pointer" and split_k > 1  # skinny and deep: K is split
    assert plan(torch.randn(512, 64), torch.randn(64, 64)) == ("pointer", 1)


@pytest.fixture
def few_configs(monkeypatch):
    """One tile per kind (large / skinny, 16-bit / fp32) for the GPU tests: they check the kernels'
    logic, and autotuning every shipped config for every test shape would take minutes."""
    from triton.runtime.autotuner import Autotuner

    km = importlib.import_module("kernels.matmul")

    def keep(configs, wanted):
        def name(c):
            kw = c.kwargs
            sub = kw.get("EPILOGUE_SUBTILE", False)
            return (kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"], c.num_stages, sub)

        return [c for c in configs if name(c) in wanted]

    tma = keep(km.tma_configs(), {(128, 256, 64, 3, True), (64, 128, 128, 4, False),
                                  (128, 128, 32, 4, False), (64, 128, 32, 4, False)})  # fmt: skip
    pointer = keep(km.hopper_configs(), {(128, 128, 64, 4, False), (64, 64, 128, 4, False)})
    assert len(tma) == 4 and len(pointer) == 2
    for kernel, configs in [(km.matmul_tma_kernel, tma), (km.matmul_kernel, pointer)]:
        assert isinstance(kernel, Autotuner)
        monkeypatch.setattr(kernel, "configs", configs)
        monkeypatch.setattr(kernel, "cache", {})


GPU_CASES = [
    # (M, N, K), B layout, dtype, TF32: decode (skinny tiles), skinny with W.t() as B, odd M, an
    # odd K that TMA cannot take (pointer kernel), fp32 without and with TF32 (a row-major B is
    # copied K-major for TF32), square
    ((16, 4096, 4096), "contiguous", "bf16", False),
    ((128, 1024, 4096), "transposed", "fp16", False),
    ((1000, 1536, 520), "contiguous", "bf16", False),
    ((257, 1823, 1823), "contiguous", "bf16", False),
    ((512, 768, 1024), "transposed", "fp32", False),
    ((1000, 1536, 520), "contiguous", "fp32", True),
    ((2048, 2048, 2048), "transposed", "fp16", False),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "shape, b_layout, dtype_name, tf32",
    GPU_CASES,
    ids=["decode", "skinny-bT", "odd-m", "odd-k-pointer", "fp32-bT", "tf32-copy", "square"],
)
def test_paths_on_gpu(shape, b_layout, dtype_name, tf32, few_configs, monkeypatch):
    """The automatic path on the GPU (TMA on sm_90+, the pointer kernel for 1823-wide rows) with
    a fused bias + gelu epilogue and without, against float64."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    M, N, K = shape
    gen = torch.Generator().manual_seed(6)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, "contiguous", dtype, "cuda", gen)
    b = random_matrix(K, N, b_layout, dtype, "cuda", gen)
    bias = torch.randn(N, generator=gen).to(device="cuda", dtype=dtype)
    c, z = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], True)
    ref_c, ref_z = fused_reference(a, b, bias, "gelu")
    assert relative_error(c, ref_c) < tol(dtype_name)
    assert relative_error(z, ref_z) < tol(dtype_name)
    assert relative_error(matmul(a, b), a.double() @ b.double()) < tol(dtype_name)


# ---- round 3: matmul_tma_r3_kernel (explicit tile, host descriptors, in-kernel split-K) ----
def r3_meta(subtile=False):
    km = importlib.import_module("kernels.matmul")
    return km._r3_meta((32, 32, 32, 1, 4, subtile))


@pytest.mark.parametrize("variant", ["sk", "sk-hd"])
@pytest.mark.parametrize("split_k", [1, 2, 3])
@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
@pytest.mark.parametrize(
    "M, N, K, a_layout, b_layout",
    # 65 rows and 1 column; N = 24 keeps C's rows 16-byte aligned (TMA store), N = 7 and 65 take
    # the masked store; K = 1832 leaves the last of 3 slices short; transposed A and B.
    [(65, 24, 104, "contiguous", "contiguous"), (40, 7, 1832, "transposed", "transposed"),
     (1, 24, 64, "contiguous", "transposed"), (7, 65, 200, "contiguous", "transposed"),
     (72, 48, 96, "transposed", "contiguous")],
)  # fmt: skip
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_r3_kernel(M, N, K, a_layout, b_layout, dtype_name, split_k, variant, device):
    """The round-3 kernel against float64 with every activation, bias and the pre-activation;
    split_k > 1 runs the last-slice reduction, and the tile counters are left at zero."""
    km = importlib.import_module("kernels.matmul")
    gen = torch.Generator().manual_seed(7)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, a_layout, dtype, device, gen)
    b = random_matrix(K, N, b_layout, dtype, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=dtype)
    for i, act in enumerate(ACT_NAMES):
        meta = r3_meta(subtile=i % 2 == 1)
        with_bias = bias if i != 2 else None
        c, z = fused_matmul(a, b, with_bias, ACTIVATIONS[act], True, path="tma", variant=variant,
                            config=meta, split_k=split_k)  # fmt: skip
        assert km.LAST_R3[0][1] == min(split_k, triton.cdiv(K, 32))  # no more slices than steps
        assert km.LAST_R3[0][2] == variant.endswith("-hd")
        ref_c, ref_z = fused_reference(a, b, with_bias, act)
        assert c.shape == z.shape == (M, N) and c.is_contiguous() and c.dtype == dtype
        for out, ref, what in [(c, ref_c, f"{act} c"), (z, ref_z, f"{act} z")]:
            err = relative_error(out, ref)
            assert err < tol(dtype_name), f"{what}: relative error {err:.2e}"
    for locks in _TILE_COUNTERS.values():
        assert int(locks.abs().sum()) == 0


@pytest.mark.parametrize("variant", ["wave", "wave-hd", "sk", "sk-hd"])
def test_r3_variants_keep_default_for_fp32_and_pointer(variant, device):
    """fp32 and the pointer path ignore the variant (the default kernels run), and still match."""
    km = importlib.import_module("kernels.matmul")
    gen = torch.Generator().manual_seed(8)
    a = random_matrix(33, 40, "contiguous", torch.float32, device, gen)
    b = random_matrix(40, 24, "contiguous", torch.float32, device, gen)
    km.LAST_R3[0] = None
    for path in ("tma", "pointer"):
        c, _ = fused_matmul(a, b, None, ACTIVATIONS["none"], False, path=path, variant=variant,
                            config=r3_meta(), split_k=2)  # fmt: skip
        assert relative_error(c, a.double() @ b.double()) < tol("fp32")
    assert km.LAST_R3[0] is None


def test_r3_module_variant_switch(monkeypatch, device):
    """VARIANT is the default of fused_matmul's variant; an unknown name is an error."""
    km = importlib.import_module("kernels.matmul")
    gen = torch.Generator().manual_seed(9)
    a = random_matrix(24, 40, "contiguous", torch.float16, device, gen)
    b = random_matrix(40, 16, "contiguous", torch.float16, device, gen)
    with pytest.raises(ValueError, match="variant"):
        fused_matmul(a, b, path="tma", variant="nope", config=r3_meta())
    monkeypatch.setattr(km, "VARIANT", "wave-hd")
    km.LAST_R3[0] = None
    c, _ = fused_matmul(a, b, path="tma", config=r3_meta())
    assert km.LAST_R3[0] is not None and km.LAST_R3[0][2] is True
    assert relative_error(c, a.double() @ b.double()) < tol("fp16")


@pytest.mark.parametrize(
    "shape, tile, split",
    # H100 (132 SMs): (BLOCK_M, BLOCK_N) of wave_config, then split_config's tile and split
    [((1024, 1024, 1024), (128, 64), ((128, 128), 2)),
     ((2048, 2048, 2048), (128, 256), None),
     ((1024, 4096, 4096), (128, 256), None),
     ((1024, 14336, 4096), None, None),
     ((4096, 4096, 4096), None, None),
     ((128, 4096, 4096), None, ((64, 128), 2)),
     ((16, 4096, 4096), None, ((16, 64), 2)),
     ((16, 14336, 4096), None, None),
     ((1024, 1024, 128), (128, 64), None)],
)  # fmt: skip
def test_r3_heuristics(shape, tile, split):
    km = importlib.import_module("kernels.matmul")
    meta = km.wave_config(*shape, 132)
    assert (None if meta is None else (meta["BLOCK_M"], meta["BLOCK_N"])) == tile
    planned = km.split_config(*shape, 132)
    got = None if planned is None else ((planned[0]["BLOCK_M"], planned[0]["BLOCK_N"]), planned[1])
    assert got == split
    if planned is not None:  # no empty slice, and one wave at most
        m, n, k = shape
        tiles = triton.cdiv(m, planned[0]["BLOCK_M"]) * triton.cdiv(n, planned[0]["BLOCK_N"])
        k_tiles = triton.cdiv(k, planned[0]["BLOCK_K"])
        assert tiles * planned[1] <= 132
        assert (planned[1] - 1) * triton.cdiv(k_tiles, planned[1]) < k_tiles


R3_GPU_CASES = [
    # (M, N, K), B layout, dtype: 1024^3 (wave: 128x64 tiles; sk: 128x128 split 2), decode
    # (16-row tiles split 2), odd M with W.t() as B (masked edge tiles, K-major B)
    ((1024, 1024, 1024), "contiguous", "bf16"),
    ((16, 4096, 4096), "contiguous", "bf16"),
    ((1000, 1536, 1032), "transposed", "fp16"),
]


@pytest.mark.gpu
# device descriptors without a split, host descriptors with one (the probe checks all four)
@pytest.mark.parametrize("variant", ["wave", "sk-hd"])
@pytest.mark.parametrize(
    "shape, b_layout, dtype_name", R3_GPU_CASES, ids=["1024", "decode", "odd-bT"]
)
def test_r3_variants_on_gpu(shape, b_layout, dtype_name, variant):
    """Each round-3 variant with its heuristic tile and split, bias + gelu + pre-activation, twice
    in a row (the split-K tile counters must be back at zero after the first call)."""
    M, N, K = shape
    gen = torch.Generator().manual_seed(10)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, "contiguous", dtype, "cuda", gen)
    b = random_matrix(K, N, b_layout, dtype, "cuda", gen)
    bias = torch.randn(N, generator=gen).to(device="cuda", dtype=dtype)
    ref_c, ref_z = fused_reference(a, b, bias, "gelu")
    for _ in range(2):
        c, z = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], True, variant=variant)
        assert relative_error(c, ref_c) < tol(dtype_name)
        assert relative_error(z, ref_z) < tol(dtype_name)


# ---- round 4: the shipped "hd" rule (host descriptors, hd_config's tile) ----
@pytest.mark.parametrize(
    "shape, tile",
    # H100 (132 SMs): (BLOCK_M, BLOCK_N, BLOCK_K, stages, warps, subtile) of hd_config
    [((1024, 1024, 1024), (128, 64, 64, 5, 4, False)),
     ((2048, 2048, 2048), (128, 256, 64, 3, 8, True)),
     ((1024, 4096, 4096), (128, 256, 64, 3, 8, True)),
     ((1024, 14336, 4096), (128, 256, 64, 3, 8, True)),
     ((4096, 4096, 4096), (128, 256, 64, 3, 8, True)),
     ((16384, 16384, 16384), (128, 256, 64, 3, 8, True)),
     ((128, 4096, 4096), (64, 64, 128, 6, 4, False)),
     ((33, 14336, 4096), (64, 64, 128, 6, 4, False)),
     ((128, 14336, 4096), (64, 256, 64, 4, 4, False)),  # 64x64 tiles: 448 > 2 waves
     ((128, 4096, 14336), (64, 64, 128, 6, 4, False)),
     ((16, 4096, 4096), (16, 64, 256, 5, 4, False)),
     ((1, 4096, 14336), (16, 64, 256, 5, 4, False)),
     ((512, 512, 512), (64, 64, 64, 5, 4, False))],
)  # fmt: skip
def test_hd_heuristics(shape, tile):
    km = importlib.import_module("kernels.matmul")
    meta = km.hd_config(*shape, 132)
    got = (meta["BLOCK_M"], meta["BLOCK_N"], meta["BLOCK_K"], meta["num_stages"],
           meta["num_warps"], meta["EPILOGUE_SUBTILE"])  # fmt: skip
    assert got == tile


@pytest.mark.parametrize("dtype_name", ["fp16", "bf16"])
@pytest.mark.parametrize(
    "M, N, K, a_layout, b_layout",
    [(20, 24, 104, "contiguous", "transposed"), (72, 7, 200, "transposed", "transposed"),
     (130, 40, 72, "contiguous", "contiguous"),
     (72, 200, 104, "contiguous", "transposed")],  # the wide skinny tile (1 SM in the interpreter)
)  # fmt: skip
def test_hd_default_variant(M, N, K, a_layout, b_layout, dtype_name, device):
    """With no variant, a 16-bit TMA launch takes the shipped "hd" rule (host descriptors, no
    split); "default" / "autotune" and an explicit split_k reach the autotuned kernel."""
    km = importlib.import_module("kernels.matmul")
    assert km.VARIANT == "hd"
    gen = torch.Generator().manual_seed(11)
    dtype = DTYPES[dtype_name]
    a = random_matrix(M, K, a_layout, dtype, device, gen)
    b = random_matrix(K, N, b_layout, dtype, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=dtype)
    ref_c, ref_z = fused_reference(a, b, bias, "gelu")
    km.LAST_R3[0] = None
    c, z = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], True, path="tma")
    meta, split, hd = km.LAST_R3[0]
    num_sms = km._device_info(a.device)[1]
    want = km.hd_config(M, N, K, num_sms)
    assert hd and split == 1
    assert all(meta[k] == want[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "EPILOGUE_SUBTILE"))
    assert relative_error(c, ref_c) < tol(dtype_name)
    assert relative_error(z, ref_z) < tol(dtype_name)
    for kw in ({"variant": "default"}, {"variant": "autotune"}, {"split_k": 2}):
        km.LAST_R3[0] = None
        c, _ = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], False, path="tma", **kw)
        assert km.LAST_R3[0] is None, kw
        assert relative_error(c, ref_c) < tol(dtype_name)


@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("M, N, K", [(40, 24, 72), (65, 136, 104), (1, 64, 32), (70, 7, 40)])
def test_epilogue_splits(M, N, K, with_bias, splits, device):
    """The subtiled epilogue (round 5): the tile's columns in 1, 2 or 4 blocks, each adding its
    own slice of the bias, activating and storing by TMA (N = 7 takes the masked full-tile
    store). c and the pre-activation z against float64, every activation, bias on and off."""
    km = importlib.import_module("kernels.matmul")
    gen = torch.Generator().manual_seed(13)
    a = random_matrix(M, K, "contiguous", torch.bfloat16, device, gen)
    b = random_matrix(K, N, "transposed", torch.bfloat16, device, gen)
    bias = torch.randn(N, generator=gen).to(device=device, dtype=torch.bfloat16)
    bias = bias if with_bias else None
    meta = {**km._r3_meta((32, 64, 32, 1, 4, splits > 1)), "EPILOGUE_SPLITS": splits}
    for act in ACT_NAMES:
        c, z = fused_matmul(a, b, bias, ACTIVATIONS[act], True, path="tma", variant="hd",
                            config=meta)  # fmt: skip
        assert km.LAST_R3[0][0]["EPILOGUE_SPLITS"] == splits
        ref_c, ref_z = fused_reference(a, b, bias, act)
        assert relative_error(c, ref_c) < tol("bf16"), act
        assert relative_error(z, ref_z) < tol("bf16"), act
        c2, z2 = fused_matmul(a, b, bias, ACTIVATIONS[act], False, path="tma", variant="hd",
                              config=meta)  # fmt: skip
        assert z2 is None and torch.equal(c2, c), act


def test_epilogue_splits_rule():
    """4 column blocks with an activation, 2 without, 1 unsubtiled; an explicit count wins;
    never blocks under 16 columns; round 4's BIAS_IN_ACC key is accepted and ignored."""
    km = importlib.import_module("kernels.matmul")
    sub = km._r3_meta((128, 256, 64, 3, 8, True))
    plain = km._r3_meta((128, 128, 64, 4, 8, False))
    assert km.epilogue_splits(sub, ACTIVATIONS["none"], 256) == 2
    for act in ("relu", "gelu", "gelu_tanh", "silu"):
        assert km.epilogue_splits(sub, ACTIVATIONS[act], 256) == 4
        assert km.epilogue_splits(plain, ACTIVATIONS[act], 128) == 1
    assert km.epilogue_splits({**sub, "EPILOGUE_SPLITS": 1}, ACTIVATIONS["gelu"], 256) == 1
    assert km.epilogue_splits(km._r3_meta((32, 32, 32, 1, 4, True)), ACTIVATIONS["gelu"], 32) == 2
    assert not hasattr(km, "BIAS_IN_ACC")


def test_bias_in_acc_key_ignored(device):
    """A config with round 4's BIAS_IN_ACC key still runs (the probe passes it): same result."""
    km = importlib.import_module("kernels.matmul")
    gen = torch.Generator().manual_seed(17)
    a = random_matrix(40, 72, "contiguous", torch.bfloat16, device, gen)
    b = random_matrix(72, 24, "transposed", torch.bfloat16, device, gen)
    bias = torch.randn(24, generator=gen).to(device=device, dtype=torch.bfloat16)
    meta = r3_meta(True)
    c, _ = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], False, path="tma", variant="hd",
                        config={**meta, "BIAS_IN_ACC": True})  # fmt: skip
    assert "BIAS_IN_ACC" not in km.LAST_R3[0][0]
    c2, _ = fused_matmul(a, b, bias, ACTIVATIONS["gelu"], False, path="tma", variant="hd",
                         config=meta)  # fmt: skip
    assert torch.equal(c, c2)


@triton.jit
def _activation_kernel(x_ptr, y_ptr, n, ACTIVATION: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, apply_activation(x, ACTIVATION), mask=offs < n)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
def test_exact_gelu_fp32_accuracy(device):
    """apply_activation's exact gelu (round 5: an erfc formulation, no tl.erf) in fp32 against
    float64 x·Phi(x) over [-20, 20]: relative error <= 1e-5 wherever |gelu| > 1e-6 (the
    negative tail included) and <= 1e-6·max(|x|, 1) everywhere; not the tanh approximation."""
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
