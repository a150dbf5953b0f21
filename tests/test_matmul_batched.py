"""kernels.matmul with a batched b, against float64 torch.matmul: the batch dims broadcast as
torch broadcasts them, one launch over every matrix, on the pointer kernel (this machine's
design) and on the Hopper host-descriptor TMA kernel (interpreted under pretend_gpu), with
transposed, offset and broadcast operands, odd sizes, every dtype, the per-key plan, and the
errors of a bad call."""

import pytest
import torch

import kernels.ops
from experiments.correctness import relative_error, tolerance
from kernels._common import dot_precision, pretend_gpu
from kernels.matmul import dispatch, matmul
from kernels.matmul.batched import batched_views, merged_stride
from kernels.matmul.dispatch import batched_plan
from kernels.matmul.pointer import matmul_kernel
from kernels.matmul.tma import DECODE_TILE, HEAD_TILE, LARGE_TILE, WAVE_TILES
from tests.conftest import fast_subset

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
HOPPER = (9, 0)

# (a's shape, b's shape) with M = 17, N = 9, K = 33: every size odd, no tile fits them
SHAPES = {
    "bmm": ((3, 17, 33), (3, 33, 9)),
    "bhmk": ((2, 3, 17, 33), (2, 3, 33, 9)),
    "a-batch-1": ((1, 17, 33), (3, 33, 9)),
    "a-2d": ((17, 33), (3, 33, 9)),
    "outer": ((2, 1, 17, 33), (1, 3, 33, 9)),  # both broadcast: neither merges, both copied
    "a-1d": ((33,), (2, 3, 33, 9)),
    "b-1d": ((2, 3, 17, 33), (33,)),
    "b-batch-1": ((3, 17, 33), (1, 1, 33, 9)),  # b one matrix: folded into one 2-D GEMM
}


def tol(dtype: torch.dtype) -> float:
    name = {v: k for k, v in DTYPES.items()}[dtype]
    return tolerance(name, dot_precision(dtype, torch.backends.cuda.matmul.allow_tf32) == "tf32")


def randn(*shape, dtype, device, gen):
    return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)


def check(a, b):
    """matmul(a, b) against float64 torch.matmul: shape, dtype, contiguity, and the relative
    error of every matrix of the batch on its own (a wrong batch offset shows in one)."""
    c = matmul(a, b)
    ref = torch.matmul(a.double(), b.double())
    assert c.shape == ref.shape and c.dtype == a.dtype and c.is_contiguous()
    rows = ref.shape[-2:] if ref.dim() >= 2 else ref.shape
    for out, want in zip(c.reshape(-1, *rows), ref.reshape(-1, *rows), strict=True):
        err = relative_error(out, want)
        assert err < tol(a.dtype), f"relative error {err:.2e}"
    return c


def planned_kernel(a, b) -> str:
    views = batched_views(a, b)
    return batched_plan(views.a, views.b).kernel


# ---- the pointer kernel (this machine's design) ----
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shapes", SHAPES.values(), ids=SHAPES.keys())
def test_broadcast_shapes(shapes, dtype_name, device):
    gen = torch.Generator().manual_seed(0)
    dtype = DTYPES[dtype_name]
    a = randn(*shapes[0], dtype=dtype, device=device, gen=gen)
    b = randn(*shapes[1], dtype=dtype, device=device, gen=gen)
    check(a, b)


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_strided_views(dtype_name, device):
    """b a transposed view (B, N, K).transpose(-1, -2), a a transposed one, a the second piece
    of a split along K (offset storage, wide rows), a batch whose stride is smaller than the
    row stride ((M, B, K).transpose(0, 1)): all read in place, one launch each."""
    gen = torch.Generator().manual_seed(1)
    dtype = DTYPES[dtype_name]
    B, M, N, K = 3, 17, 9, 33
    bt = randn(B, N, K, dtype=dtype, device=device, gen=gen).transpose(-1, -2)
    at = randn(B, K, M, dtype=dtype, device=device, gen=gen).transpose(-1, -2)
    a_split = randn(B, M, K + 3, dtype=dtype, device=device, gen=gen).split([3, K], dim=-1)[1]
    a_rows = randn(M, B, K, dtype=dtype, device=device, gen=gen).transpose(0, 1)
    for a in (at, a_split, a_rows):
        assert not batched_views(a, bt).copied
        check(a, bt)


def batched_plans() -> list:
    return [p for key, p in dispatch._PLANS.items() if key[0] == "batched"]


def test_one_launch(monkeypatch, device):
    """A batch of 2 x 3 matrices is one matmul_kernel launch, its grid every tile of every
    matrix (the interpreter's 32x32 tile: one per 17 x 9 matrix), not a loop over the batch.
    On a GPU the autotuner launches each of its tiles once first, each on that whole grid."""
    grids = []
    run = matmul_kernel.run

    def counted(*args, grid, **kwargs):
        grids.append(grid)
        return run(*args, grid=grid, **kwargs)

    monkeypatch.setattr(matmul_kernel, "run", counted)
    gen = torch.Generator().manual_seed(6)
    a = randn(2, 3, 17, 33, dtype=torch.float32, device=device, gen=gen)
    b = randn(2, 3, 33, 9, dtype=torch.float32, device=device, gen=gen)
    check(a, b)
    assert grids and {grid({"BLOCK_M": 32, "BLOCK_N": 32}) for grid in grids} == {(6, 1)}
    assert len(grids) == 1 or device == "cuda"


def test_plan_per_key(device):
    """A repeated call takes its plan (no checks, no views where none copies): the same result;
    a call whose views copy an operand copies it again; another stride is another key."""
    gen = torch.Generator().manual_seed(2)
    a = randn(2, 1, 17, 33, dtype=torch.float32, device=device, gen=gen)
    b = randn(1, 3, 33, 9, dtype=torch.float32, device=device, gen=gen)
    bt = randn(1, 3, 9, 33, dtype=torch.float32, device=device, gen=gen).transpose(-1, -2)
    dispatch._PLANS.clear()
    first = check(a, b)
    assert torch.equal(matmul(a, b), first)
    plans = batched_plans()
    assert len(plans) == 1 and plans[0].copied and len(plans[0].launches.steps) == 1
    check(a.mT.contiguous().mT, b)  # a column-major a: another key
    check(a, bt)
    assert len(batched_plans()) == 3


# ---- the Hopper TMA kernel, interpreted ----
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["bf16"]))
@pytest.mark.parametrize(
    "a_shape, b_shape, b_transposed, sms",
    # K = 40: 16-byte rows in 16-bit; N = 9 with a (B, N, K) stored b: C's rows are not 16-byte
    # aligned (the masked store); 2 x 130 x 264 on one SM: the subtiled 128x256 epilogue
    [((3, 17, 40), (3, 40, 24), False, 132),
     ((2, 3, 17, 40), (2, 3, 40, 24), False, 132),
     ((17, 40), (3, 40, 9), True, 132),
     ((1, 17, 40), (3, 40, 24), True, 132),
     ((40,), (2, 3, 40, 24), False, 132),
     ((2, 1, 17, 40), (1, 3, 40, 24), False, 132),
     pytest.param((2, 130, 72), (2, 72, 264), True, 1, marks=pytest.mark.slow),  # 5 s in fp32
     ((2, 136, 128), (2, 128, 40), True, 132),
     ((2, 136, 200), (2, 200, 24), False, 132)],
    ids=["bmm", "bhmk", "a-2d-masked-store", "a-batch-1", "a-1d", "outer", "subtiled",
         "head-tile-qk", "head-tile-pv"],
)  # fmt: skip
def test_hopper_tma(a_shape, b_shape, b_transposed, sms, dtype_name, device):
    """16-bit operands TMA can read take the batched host-descriptor kernel (3-D descriptors
    for batched operands, a broadcast operand's 2-D one); fp32 takes the pointer kernel."""
    gen = torch.Generator().manual_seed(3)
    dtype = DTYPES[dtype_name]
    a = randn(*a_shape, dtype=dtype, device=device, gen=gen)
    if b_transposed:
        b = randn(*b_shape[:-2], b_shape[-1], b_shape[-2], dtype=dtype, device=device, gen=gen)
        b = b.transpose(-1, -2)
    else:
        b = randn(*b_shape, dtype=dtype, device=device, gen=gen)
    with pretend_gpu(HOPPER, sms):
        want = "pointer" if dtype_name == "fp32" else "tma_host_desc"
        assert planned_kernel(a, b) == want
        first = check(a, b)
        assert torch.equal(matmul(a, b), first)  # the plan's launch
        (plan,) = batched_plans()
        assert plan.launches.kernel == want and len(plan.launches.steps) == 1


def test_hopper_fallbacks(device):
    """What TMA cannot read takes the pointer kernel: a batch stride that is not 16-byte
    aligned, a transposed a whose rows are not (M = 17), K = 0 (the empty sum)."""
    gen = torch.Generator().manual_seed(4)
    f16 = dict(dtype=torch.float16, device=device, gen=gen)
    b = randn(3, 40, 24, **f16)
    shifted = randn(3, 17 * 40 + 4, **f16)[:, : 17 * 40].view(3, 17, 40)  # 1368-byte batches
    at = randn(3, 40, 17, **f16).transpose(-1, -2)
    aligned = randn(3, 40, 24, **f16).transpose(-1, -2)
    with pretend_gpu(HOPPER, 132):
        for a in (shifted, at):
            assert planned_kernel(a, b) == "pointer"
            check(a, b)
        assert planned_kernel(aligned, b) == "tma_host_desc"
        c = matmul(torch.ones(3, 5, 0, dtype=torch.float16), torch.ones(3, 0, 8).half())
        assert torch.equal(c, torch.zeros(3, 5, 8, dtype=torch.float16))


def meta(*shape, dtype=torch.bfloat16):
    """Shape-only operands (the plan reads shapes, strides and dtype, never data)."""
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_batched_dispatch():
    """Attention's batched products (a head dim of 128 as K or N) take the head tile, one of
    them alone the wave-time pick (128x64); other batched products count every matrix's tiles
    (8 products of 1024 x 512 x 1024: the 128x256 tile); fp32 and an unaligned batch stride
    take the pointer kernel; without TMA, the pointer kernel."""
    qk = (meta(64, 1024, 128), meta(64, 1024, 128).transpose(-1, -2))
    pv = (meta(64, 1024, 1024), meta(64, 1024, 128))
    with pretend_gpu(HOPPER, 132):
        assert batched_plan(*qk) == batched_plan(*pv) == ("tma_host_desc", 1, HEAD_TILE)
        assert dispatch.plan(qk[0][0], qk[1][0]) == ("tma_host_desc", 1, WAVE_TILES[2])
        wide = batched_plan(meta(8, 1024, 512), meta(8, 512, 1024))
        assert wide == ("tma_host_desc", 1, LARGE_TILE)
        decode = batched_plan(meta(8, 16, 512), meta(8, 512, 4096))
        assert decode == ("tma_host_desc", 1, DECODE_TILE)
        assert batched_plan(*(t.float() for t in qk)) == ("pointer", 1, None)
        odd_batch = meta(8, 1024 * 128 + 4).as_strided((8, 1024, 128), (1024 * 128 + 4, 128, 1))
        assert batched_plan(odd_batch, qk[1]) == ("pointer", 1, None)
    with pretend_gpu((8, 0), 108):
        assert batched_plan(*qk) == ("pointer", 1, None)


# ---- the views ----
@pytest.mark.parametrize(
    "sizes, strides, merged",
    [((2, 3), (3, 1), 1), ((2, 3), (0, 0), 0), ((2, 1, 3), (3, 7, 1), 1), ((2, 3), (1, 2), None),
     ((2, 3), (5, 0), None), ((), (), 0), ((1,), (9,), 0)],
)  # fmt: skip
def test_merged_stride(sizes, strides, merged):
    assert merged_stride(sizes, strides) == merged


def test_empty_batch(device):
    c = matmul(torch.ones(0, 4, 5, device=device), torch.ones(0, 5, 3, device=device))
    assert c.shape == (0, 4, 3)


# ---- bad input ----
@pytest.mark.parametrize(
    "a_shape, b_shape, match",
    [((3, 17, 33), (3, 34, 9), r"inner dims differ: a has shape \(3, 17, 33\) and b has shape "
                               r"\(3, 34, 9\)"),
     ((2, 17, 33), (3, 33, 9), r"batch dims do not broadcast: a has shape \(2, 17, 33\) and b "
                               r"has shape \(3, 33, 9\)"),
     ((4, 2, 17, 33), (3, 1, 33, 9), r"batch dims do not broadcast.*\(4, 2, 17, 33\).*"
                                     r"\(3, 1, 33, 9\)")],
    ids=["inner-dim", "batch", "batch-4d"],
)  # fmt: skip
def test_bad_shapes(a_shape, b_shape, match):
    with pytest.raises(ValueError, match=match):
        matmul(torch.ones(a_shape), torch.ones(b_shape))


def test_bad_types():
    with pytest.raises(TypeError, match="b has dtype torch.float16"):
        matmul(torch.ones(3, 4, 5), torch.ones(3, 5, 2, dtype=torch.float16))
    with pytest.raises(TypeError, match="supported dtypes"):
        matmul(torch.ones(3, 4, 5, dtype=torch.float64), torch.ones(3, 5, 2))


@pytest.mark.parametrize("a_shape, b_shape", [((4, 5), (2, 5, 3)), ((2, 1, 4, 5), (3, 5, 3)),
                                              ((5,), (2, 5, 3))])
def test_custom_op_takes_a_batched_b(a_shape, b_shape, device):
    """kernels/ops.py's custom op (mode=triton-compiled) takes a batched b as the direct call
    does; matmul_nd with another 2-D function refuses it with one clear error."""
    from kernels.matmul.dispatch import matmul_nd

    gen = torch.Generator().manual_seed(6)
    a = torch.randn(a_shape, generator=gen).to(device)
    b = torch.randn(b_shape, generator=gen).to(device)
    err = relative_error(kernels.ops.matmul(a, b), torch.matmul(a.double(), b.double()))
    assert err <= tolerance("fp32", False)
    with pytest.raises(ValueError, match=r"b has shape \(2, 5, 3\): a batched b"):
        matmul_nd(torch.ones(4, 5), torch.ones(2, 5, 3), torch.matmul)


# ---- on the GPU ----
@pytest.mark.gpu
def test_attention_shapes_on_gpu():
    """Attention's two batched products in bf16, B = 4, H = 16, M = N = 1024, K = 128:
    q @ k.transpose(-1, -2) (a column-major b) and p @ v, against float64 torch.matmul, twice
    (the second call launches the kept plan)."""
    gen = torch.Generator().manual_seed(5)
    bf16 = dict(dtype=torch.bfloat16, device="cuda", gen=gen)
    q, k, v = (randn(4, 16, 1024, 128, **bf16) for _ in range(3))
    p = randn(4, 16, 1024, 1024, **bf16).softmax(-1)
    assert planned_kernel(q, k.transpose(-1, -2)) == "tma_host_desc"
    for _ in range(2):
        for a, b in [(q, k.transpose(-1, -2)), (p, v)]:
            err = relative_error(matmul(a, b), torch.matmul(a.double(), b.double()))
            assert err < tolerance("bf16", False), f"relative error {err:.2e}"


@pytest.mark.gpu
def test_descriptors_on_a_fresh_thread():
    """A thread with no current CUDA context (autograd's backward thread on device 0) builds
    host TMA descriptors: kernels._launch.bind_context."""
    import threading

    a = torch.randn(8, 1000, 128, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8, 128, 1000, device="cuda", dtype=torch.bfloat16)
    out, errors = [], []

    def work():
        try:
            out.append(matmul(a, b))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert not errors, errors
    want = (a.double() @ b.double()).float()
    torch.testing.assert_close(out[0].float(), want, rtol=2e-2, atol=2e-2)
