"""kernels.linear against float64 autograd: every activation, bias on and off, 3-D and strided
inputs, gradients of x, weight and bias on the pointer kernel and (a pretended Hopper) the TMA
kernels, the backward's dZ + db kernel, and bad input."""

import importlib

import pytest
import torch
from test_kernels_matmul import few_configs  # noqa: F401 - the fixture, shared with the GPU tests

from experiments.correctness import relative_error, tolerance
from kernels._common import ACTIVATIONS, direct, dot_precision, pretend_gpu
from kernels.linear import linear, linear_reference
from tests.conftest import fast_subset

# the module (kernels.linear is also the function), for its launch constants
backward = importlib.import_module("kernels.linear.backward")

# The interpreter evaluates sigmoid as 1 / (1 + exp(-x)) in numpy, which warns when exp(-x)
# overflows to inf for x < -88 even though the result, 0, is right.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def tol(dtype_name: str) -> float:
    # The kernel uses TF32 for fp32 exactly when torch's switch allows it (never interpreted).
    tf32 = dot_precision(DTYPES[dtype_name], torch.backends.cuda.matmul.allow_tf32) == "tf32"
    return tolerance(dtype_name, tf32)


def make_inputs(x_shape, out_features, dtype_name, device, *, layout="contiguous", bias=True):
    """Fresh random x, weight and bias. layout "sliced" makes x a column slice of a wider tensor
    (rows merge into one stride: a view), "transposed" swaps x's first two dims (flatten copies)."""
    gen = torch.Generator().manual_seed(sum(x_shape) + out_features)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=DTYPES[dtype_name])

    *lead, in_features = x_shape
    if layout == "sliced":
        x = randn(*lead, in_features + 5)[..., 2 : 2 + in_features]
    elif layout == "transposed":
        x = randn(lead[1], lead[0], *lead[2:], in_features).transpose(0, 1)
    else:
        x = randn(*x_shape)
    weight = randn(out_features, in_features)
    return x, weight, randn(out_features) if bias else None


def assert_close(out, ref, dtype_name, what):
    err = relative_error(out, ref)
    assert err < tol(dtype_name), f"{what}: relative error {err:.2e} >= {tol(dtype_name):.0e}"


def check_forward(x, weight, bias, activation, dtype_name):
    y = linear(x, weight, bias, activation)
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], weight.shape[0])
    ref = linear_reference(
        x.double(), weight.double(), None if bias is None else bias.double(), activation
    )
    assert_close(y, ref, dtype_name, "y")


def check_backward(x, weight, bias, activation, dtype_name, *, grad_of_sum=False):
    """Gradients of every input that requires one against float64 autograd. grad_of_sum
    backpropagates y.sum(), whose upstream gradient is a stride-0 expand; else a random dY."""
    leaves = [x, weight, bias]
    ref_leaves = [
        None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in leaves
    ]
    y = linear(x, weight, bias, activation)
    y_ref = linear_reference(*ref_leaves, activation)
    if grad_of_sum:
        y.sum().backward()
        y_ref.sum().backward()
    else:
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(y)
        y.backward(dy)
        y_ref.backward(dy.double())
    for name, t, t_ref in zip(["x", "weight", "bias"], leaves, ref_leaves, strict=True):
        if t is None or not t.requires_grad:
            assert t is None or t.grad is None, f"{name} got a gradient it did not ask for"
            continue
        assert t.grad.shape == t.shape and t.grad.dtype == t.dtype
        assert_close(t.grad, t_ref.grad, dtype_name, f"{name}.grad")


@pytest.mark.parametrize("has_bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("activation", list(ACTIVATIONS) + [None])
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_forward(dtype_name, activation, has_bias, device):
    x, weight, bias = make_inputs((3, 7, 65), 33, dtype_name, device, bias=has_bias)
    check_forward(x, weight, bias, activation, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "x_shape, out_features",
    fast_subset([((1, 1), 7), ((1823, 7), 65), ((5, 1, 65), 1), ((2, 3, 4, 7), 9), ((65,), 33)],
                [((1, 1), 7), ((5, 1, 65), 1), ((2, 3, 4, 7), 9), ((65,), 33)], unpack=True),
    ids=["1x1-to-7", "1823x7-to-65", "5x1x65-to-1", "4d", "1d"],
)
def test_forward_odd_shapes(x_shape, out_features, dtype_name, device):
    x, weight, bias = make_inputs(x_shape, out_features, dtype_name, device)
    check_forward(x, weight, bias, "gelu", dtype_name)


@pytest.mark.parametrize("layout", ["sliced", "transposed"])
def test_forward_strided_x(layout, device):
    x, weight, bias = make_inputs((4, 9, 33), 17, "fp32", device, layout=layout)
    assert not x.is_contiguous()
    check_forward(x, weight, bias, "silu", "fp32")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["bf16", "fp32"]))
def test_backward(dtype_name, activation, device):
    x, weight, bias = make_inputs((2, 9, 65), 33, dtype_name, device, layout="sliced")
    for t in (x, weight, bias):
        t.requires_grad_()
    check_backward(x, weight, bias, activation, dtype_name)


@pytest.mark.parametrize(
    "layout, has_bias, requires_grad",
    [
        ("contiguous", False, "x,weight"),
        ("transposed", True, "x,weight,bias"),
        ("sliced", True, "x"),
        ("contiguous", True, "weight"),
        ("transposed", True, "bias"),
    ],
)
def test_backward_layouts_and_partial_grads(layout, has_bias, requires_grad, device):
    x, weight, bias = make_inputs((3, 5, 40), 24, "fp32", device, layout=layout, bias=has_bias)
    named = {"x": x, "weight": weight, "bias": bias}
    for name in requires_grad.split(","):
        named[name].requires_grad_()
    check_backward(x, weight, bias, "gelu_tanh", "fp32")


@pytest.mark.parametrize(
    "activation, x_shape",
    # 1100 rows: db takes the two-pass path through fp32 partial sums (sum_rows: 64 a split),
    # and silu, saving z past ACTIVATION_PASS_MIN_M rows, runs its activation as a pass.
    fast_subset([("none", (7, 65)), ("relu", (7, 65)), ("silu", (1100, 7)), ("gelu", (65,))],
                [("none", (7, 65)), ("relu", (7, 65)), ("gelu", (65,))], unpack=True),
)
def test_backward_of_sum(activation, x_shape, device):
    x, weight, bias = make_inputs(x_shape, 33, "fp32", device)
    for t in (x, weight, bias):
        t.requires_grad_()
    check_backward(x, weight, bias, activation, "fp32", grad_of_sum=True)


def test_no_grad_returns_plain_tensor(device):
    x, weight, bias = make_inputs((7, 65), 33, "fp32", device)
    weight.requires_grad_()
    with torch.no_grad():
        y = linear(x, weight, bias, "gelu")
    assert y.grad_fn is None and not y.requires_grad


def tensor(*shape, dtype=torch.float32):
    return torch.ones(*shape, dtype=dtype)


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((torch.randn(()), tensor(3, 5)), ValueError, r"x must have at least 1 dims, got shape"),
        ((tensor(4, 5), tensor(2, 3, 5)), ValueError, r"weight must be 2-D"),
        ((tensor(4, 5), tensor(3, 6)), ValueError, r"\(4, 5\).*\(3, 6\).*in_features"),
        ((tensor(4, 5), tensor(3, 5, dtype=torch.bfloat16)), TypeError, "weight has dtype"),
        ((tensor(4, 5, dtype=torch.float64), tensor(3, 5)), TypeError, "supported dtypes"),
        ((tensor(4, 5), tensor(3, 5, dtype=torch.int32)), TypeError, "supported dtypes"),
        ((tensor(4, 5), tensor(3, 5), tensor(4)), ValueError, r"bias has shape \(4,\)"),
        ((tensor(4, 5), tensor(3, 5), tensor(1, 3)), ValueError, "bias must be 1-D"),
        ((tensor(4, 5), tensor(3, 5), None, "tanh"), ValueError, "unknown activation 'tanh'"),
    ],
    ids=[
        "x-1d", "weight-3d", "in-features", "dtype-mismatch", "float64", "int32",
        "bias-size", "bias-2d", "activation",
    ],
)  # fmt: skip
def test_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        linear(*args)


@pytest.mark.gpu
@pytest.mark.usefixtures("few_configs")
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_large_on_gpu(dtype_name):
    # (M, K) @ (N, K)^T with M = N = K = 2048, forward and every gradient.
    x, weight, bias = make_inputs((2048, 2048), 2048, dtype_name, "cuda")
    for t in (x, weight, bias):
        t.requires_grad_()
    check_forward(x.detach(), weight.detach(), bias.detach(), "gelu", dtype_name)
    check_backward(x, weight, bias, "gelu", dtype_name)


@pytest.fixture
def hopper():
    """Dispatch as on an H100: every GEMM whose operands TMA can read takes a TMA kernel (the
    host-descriptor one for 16-bit, the device-descriptor one for fp32), which the interpreter
    runs, so their layouts (weight.T as a column-major B in the forward, dZ.T as a column-major
    A for dW) are checked without a GPU."""
    with pretend_gpu((9, 0), 132):
        yield


@pytest.mark.parametrize("activation", ["gelu", "none"])
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_tma_forward_backward(dtype_name, activation, device, hopper):
    x, weight, bias = make_inputs((2, 8, 64), 48, dtype_name, device)
    check_forward(x, weight, bias, activation, dtype_name)
    for t in (x, weight, bias):
        t.requires_grad_()
    check_backward(x, weight, bias, activation, dtype_name)


@pytest.mark.gpu
@pytest.mark.usefixtures("few_configs")
@pytest.mark.parametrize(
    "x_shape, out_features, activation, dtype_name",
    [((4, 4, 4096), 4096, "gelu", "bf16"), ((2, 300, 1024), 2048, "silu", "fp16"),
     ((128, 1823), 640, "relu", "bf16"), ((1024, 512), 1536, "gelu_tanh", "fp32")],
    ids=["decode", "3d-prefill", "odd-k", "fp32"],
)  # fmt: skip
def test_llm_shapes_on_gpu(x_shape, out_features, activation, dtype_name):
    x, weight, bias = make_inputs(x_shape, out_features, dtype_name, "cuda")
    weight = weight / x_shape[-1] ** 0.5  # keep activations in their interesting range
    check_forward(x, weight, bias, activation, dtype_name)
    for t in (x, weight, bias):
        t.requires_grad_()
    check_backward(x, weight, bias, activation, dtype_name)


# (DZ_PROGRAMS, DB_MAX_SPLITS): single blocks; row loops with several splits; row loops to keep
# the row-splits at most 2
@pytest.mark.parametrize("programs, max_splits", [(1024, 512), (3, 512), (1024, 2)])
@pytest.mark.parametrize("activation", fast_subset(["gelu", "gelu_tanh", "silu", "relu"], ["gelu"]))
@pytest.mark.parametrize("M, N", fast_subset([(1, 1), (97, 300), (130, 7), (33, 513), (300, 64)],
                                             [(97, 300)], unpack=True))
def test_activation_backward_dz_db(M, N, activation, programs, max_splits, monkeypatch, device):
    """dZ = dY * act'(Z) and db = column sums of dZ (as stored) against float64, on odd shapes,
    with one block per program and with several blocks per program and row-splits (the fp32
    partial rows then summed by partial_sum), narrow blocks for narrow N; the same inputs give
    the same db bits."""
    import torch.nn.functional as F

    monkeypatch.setattr(backward, "DZ_PROGRAMS", programs)
    monkeypatch.setattr(backward, "DB_MAX_SPLITS", max_splits)
    gen = torch.Generator().manual_seed(12)
    dtype = torch.bfloat16
    z = torch.randn(M, N, generator=gen).to(device=device, dtype=dtype)
    dy = torch.randn(M, N, generator=gen).to(device=device, dtype=dtype)
    dz, db = backward.activation_backward(dy, z, ACTIVATIONS[activation], True, direct)
    zd = z.double().requires_grad_()
    act = {"gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
           "silu": F.silu, "relu": F.relu}[activation]  # fmt: skip
    (grad,) = torch.autograd.grad(act(zd), zd, dy.double())
    assert dz.dtype == dtype and db.dtype == dtype and db.shape == (N,)
    # dZ: one bf16 rounding of a float64 product; db: the sum of dZ as stored, rounded once
    torch.testing.assert_close(dz.double(), grad, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(db.double(), dz.double().sum(0), rtol=1e-2, atol=1e-2)
    _, db2 = backward.activation_backward(dy, z, ACTIVATIONS[activation], True, direct)
    assert torch.equal(db, db2)


def test_dz_rows():
    """Rows per dZ + db program: whole blocks of dz_block's rows, one block a program up to
    DZ_PROGRAMS blocks, then as many blocks a program as keep the program count near
    DZ_PROGRAMS; with db, at most DB_MAX_SPLITS row-splits, which partial_sum's one block
    covers. The block keeps DZ_BLOCK elements, narrowed to N's power of two (a conv's 64
    channels), never below 16 columns."""
    assert backward.dz_block(4096) == (backward.DZ_BLOCK // 512, 512)
    assert backward.dz_block(64) == (backward.DZ_BLOCK // 64, 64)
    assert backward.dz_block(7) == (backward.DZ_BLOCK // 16, 16)
    assert backward.dz_rows(7, 300) == backward.dz_block(300)[0]
    assert backward.DB_MAX_SPLITS <= backward.PARTIAL_BLOCK_M
    assert backward.SUM_MAX_SPLITS <= backward.PARTIAL_BLOCK_M
    for M, N in [(2048, 4096), (16384, 4096), (100000, 700), (100352, 64), (6272, 256)]:
        block_m, block_n = backward.dz_block(N)
        rows = backward.dz_rows(M, N)
        programs = -(-M // rows) * -(-N // block_n)
        assert rows % block_m == 0
        if -(-M // block_m) * -(-N // block_n) <= backward.DZ_PROGRAMS:
            assert rows == block_m
        else:
            assert backward.DZ_PROGRAMS // 2 <= programs <= 2 * backward.DZ_PROGRAMS
        rows_db = backward.dz_rows(M, N, need_db=True)
        assert rows_db % block_m == 0 and rows_db >= rows
        assert -(-M // rows_db) <= backward.DB_MAX_SPLITS


@pytest.mark.parametrize("M, N, need_db", [(300, 64, True), (97, 300, False), (5, 7, True)])
def test_dz_plan_repeats_activation_backward(M, N, need_db, monkeypatch, device):
    """The DzPlan a keyed call returns gives that call's bits on new tensors with no key (row
    splits and the partial sum included), and tensors in other strides go through the keyed
    path instead of the plan's launches."""
    monkeypatch.setattr(backward, "DZ_PROGRAMS", 3)
    gen = torch.Generator().manual_seed(21)
    relu = ACTIVATIONS["relu"]

    def inputs():
        return [torch.randn(M, N, generator=gen).to(device=device, dtype=torch.bfloat16)
                for _ in range(2)]  # fmt: skip

    def assert_same(got, want):
        for g, w in zip(got, want, strict=True):
            assert (g is None and w is None) or torch.equal(g, w)

    dy, z = inputs()
    _, _, plan = backward.planned_activation_backward(dy, z, relu, need_db, direct)
    assert plan is not None and (plan.sum_step is not None) == (need_db and plan.splits > 1)
    dy, z = inputs()
    want = backward.activation_backward(dy, z, relu, need_db, direct)
    assert_same(plan(dy, z), want)
    wide = torch.empty(M, N + 3, device=device, dtype=torch.bfloat16)[:, :N].copy_(dy)
    assert_same(plan(wide, z), want)
    want = backward.activation_backward(dy[: M - 1], z[: M - 1], relu, need_db, direct)
    assert_same(plan(dy[: M - 1], z[: M - 1]), want)  # fewer rows, the same strides


def _train_step(x, weight, bias, activation, dy, fn=linear):
    """One step of fn (linear, or linear_reference) on leaves x, weight, bias (any of which may
    not need a gradient): their .grad, None where not asked for."""
    leaves = [t for t in (x, weight, bias) if t is not None]
    for t in leaves:
        t.grad = None
    fn(x, weight, bias, activation).backward(dy)
    return [None if t is None or not t.requires_grad else t.grad for t in (x, weight, bias)]


@pytest.mark.parametrize("activation", fast_subset([None, "gelu", "relu"], ["gelu"]))
@pytest.mark.parametrize("frozen", ["none", "x", "weight", "bias"])
def test_kept_backward_writes_outputs_allocated_first(activation, frozen, device):
    """From a plan's second backward on, the kept backward (dispatch._Backward) allocates dX,
    dW, db and dZ before its launches and writes them in place: every call's gradients against
    float64, with one input's gradient off in turn, on new data each call."""
    from kernels._common import reset_tuning
    from kernels.linear import dispatch

    reset_tuning()
    gen = torch.Generator().manual_seed(31)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    weight, bias = randn(24, 40), randn(24)
    for t, name in ((weight, "weight"), (bias, "bias")):
        t.requires_grad_(frozen != name)
    for _ in range(4):
        x = randn(3, 7, 40).requires_grad_(frozen != "x")
        dy = randn(3, 7, 24)
        got = _train_step(x, weight, bias, activation, dy)
        ref = [t.detach().double().requires_grad_(t.requires_grad) for t in (x, weight, bias)]
        want = _train_step(*ref, activation, dy.double(), linear_reference)
        for g, w in zip(got, want, strict=True):
            assert (g is None) == (w is None)
            if g is not None:
                assert relative_error(g, w) < tol("fp32")
    kept = [b for p in dispatch._PLANS.values() for b in p.backward.values()]
    assert len(kept) == 1 and isinstance(kept[0], dispatch._Backward)
    assert (kept[0].dz is None) == (activation is None)
    assert kept[0].graphed.captures == 0  # no CUDA graph off the GPU
    reset_tuning()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(16, 4096, 4096), (2048, 1024, 512)], ids=["decode", "tile"])
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_a_graphed_linear_backward_gives_the_launches_bits(shape, activation, monkeypatch):
    """Training steps on the same tensors, bf16: from the second kept backward on, its launches
    (dZ and db, dX, dW; split-K where the GEMM takes it) are one CUDA graph, captured once the
    pointers repeat and then replayed, and every step's gradients are the bits of the same
    launches run one by one."""
    from kernels import _graphs
    from kernels._common import reset_tuning
    from kernels.linear import dispatch

    M, N, K = shape
    gen = torch.Generator().manual_seed(32)

    def randn(*size, scale=1.0):
        return (torch.randn(*size, generator=gen) * scale).to("cuda", torch.bfloat16)

    x = randn(M, K).requires_grad_()
    weight = randn(N, K, scale=K**-0.5).requires_grad_()
    bias = randn(N).requires_grad_()
    dy = randn(M, N)
    monkeypatch.setattr(_graphs, "GRAPHS", False)
    reset_tuning()
    want = [_train_step(x, weight, bias, activation, dy) for _ in range(3)][-1]
    monkeypatch.setattr(_graphs, "GRAPHS", True)
    captures = []
    for _ in range(16):
        got = _train_step(x, weight, bias, activation, dy)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        # a training loop holds no step's gradients past the next step: neither does this one,
        # so the allocator can hand each step the blocks of the last
        del got, g
        kept = [b for p in dispatch._PLANS.values() for b in p.backward.values()]
        assert len(kept) == 1
        captures.append(kept[0].graphed.captures)
    # as for a graphed conv backward (tests/test_conv_backward.py): the outputs may land on new
    # blocks for a few steps after a capture moves the intermediates into the graph's pool
    assert 1 <= captures[-1] <= 4 and captures[-6:] == [captures[-1]] * 6, captures
    assert not kept[0].graphed.broken
    reset_tuning()
