"""kernels.matmul against a float64 reference: odd sizes, strided views, every dtype, bad input."""

import pytest
import torch

from experiments.correctness import relative_error, tolerance
from kernels._common import dot_precision
from kernels.matmul import matmul, matmul_reference

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


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
@pytest.mark.parametrize("size", [1024, 4096])
def test_large_on_gpu(size, dtype_name):
    gen = torch.Generator().manual_seed(2)
    a = random_matrix(size, size, "contiguous", DTYPES[dtype_name], "cuda", gen)
    b = random_matrix(size, size, "transposed", DTYPES[dtype_name], "cuda", gen)
    check(a, b, dtype_name)
