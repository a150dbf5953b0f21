"""kernels.softmax against the float64 softmax: every design, dims, strides, dtypes and
gradients; which design a shape takes; the first call's timed choice; bad inputs; and, marked
gpu, the GPU-only designs (coop, the Gluon smem kernels: leaving, interleaved chunks, lead
programs) on a GPU."""

import pytest
import torch
import triton

from experiments.correctness import TOLERANCES, relative_error
from kernels._common import TUNING_CACHES, TUNING_LOG, direct, pretend_gpu, reset_tuning
from kernels.softmax import (
    Config,
    coop,
    dispatch,
    softmax,
    softmax_backward,
    softmax_forward,
    softmax_reference,
    split,
)
from tests.conftest import fast_subset

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
HOPPER = ((9, 0), 132)
# the first call's choices and the launch plans as the module registered them (fresh_caches
# patches the module's names in each test)
REGISTERED = (dispatch._TUNED, dispatch._PLANS)
NAN_ROW = pytest.mark.filterwarnings(
    "ignore:invalid value encountered", "ignore:divide by zero encountered"
)


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch):
    """No remembered launches (_PLANS, _FRONT) or choices (_TUNED) from another test's patched
    knobs."""
    monkeypatch.setattr(dispatch, "_PLANS", {})
    monkeypatch.setattr(dispatch, "_TUNED", {})
    dispatch._FRONT.clear()
    yield
    dispatch._FRONT.clear()


@pytest.fixture(params=["tile", "split", "online"])
def row_path(request, monkeypatch):
    """Every row path at small sizes: "split" sends rows past 512 columns through chunks of
    512 (on the CPU the two-launch split2, whose partials and combine are coop's), "online"
    allows one chunk a row, which sends them through the two-pass loop."""
    if request.param != "tile":
        monkeypatch.setattr(dispatch, "ONE_PASS_MAX_ELEMS", 512)
    if request.param == "online":
        monkeypatch.setattr(dispatch, "MAX_SPLIT_CHUNKS", 1)
    return request.param


def rows_with_extremes(shape, dtype, device, dim=-1):
    """Random rows (softmax along dim) with a run of -inf (row 1), a large value (row 0) and a
    row of equal values (row 2), if there are so many rows."""
    x = torch.randn(shape, device=device) * 3
    rows = x.movedim(dim, -1)
    n = rows.shape[-1]
    flat = rows.reshape(-1, n) if rows.is_contiguous() else None
    view = flat if flat is not None else rows.reshape(-1, n)
    if view.shape[0] > 2 and n > 2:
        view[0, n // 2] = 1e4
        view[1, : n // 3 + 1] = -float("inf")
        view[2] = 2.5
        if flat is None:  # reshape copied: put the rows back
            rows.copy_(view.view(rows.shape))
    return x.to(dtype)


def assert_close_to_float64(out, ref, dtype_name):
    if out.dtype == torch.float16:
        ref = ref.to(torch.float16).double()  # subnormal fp16 outputs: compare as rounded
    assert relative_error(out, ref) < TOLERANCES[dtype_name]


def check_forward_backward(x, dim, dtype_name):
    """softmax_forward and softmax_backward on x against float64, the backward from the y the
    forward gave (it sees the rounded y)."""
    y = softmax_forward(x, dim)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_close_to_float64(y, torch.softmax(x.double(), dim), dtype_name)
    dy = torch.randn_like(y)
    dx = softmax_backward(y, dy, dim)
    if x.shape[dim] == 1:  # y is all ones: dx = dy - dy
        assert (dx == 0).all()
        return
    y64, dy64 = y.double(), dy.double()
    assert_close_to_float64(dx, y64 * (dy64 - (y64 * dy64).sum(dim, keepdim=True)), dtype_name)


# -- correctness on the CPU path (the interpreter) or the GPU --------------------------------------
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["fp32", "bf16"]))
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (37, 1000), (5, 4097)])
def test_odd_sizes(shape, dtype_name, device):
    check_forward_backward(rows_with_extremes(shape, DTYPES[dtype_name], device), -1, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape, dim", [((3, 21, 7), 1), ((101, 13), 0), ((2, 3, 4, 5), 0)])
def test_any_dim(shape, dim, dtype_name, device):
    """A middle dim (rows strided), an outer dim (neighbouring rows adjacent in memory)."""
    check_forward_backward(rows_with_extremes(shape, DTYPES[dtype_name], device, dim), dim,
                           dtype_name)  # fmt: skip


@pytest.mark.parametrize("make, dim", [
    (lambda x: torch.split(x, [5, 31], dim=1)[1], -1),  # rows 36 apart, an offset start
    (lambda x: x[1:, ::3], -1),  # a column stride
    (lambda x: x.t()[3:17], 0),  # a transposed slice
    (lambda x: x.view(2, 3, 2, 36).permute(3, 1, 0, 2), 2),  # three row dims: copied to rows
    (lambda x: x[:1].expand(5, 36), -1),  # zero row stride
])  # fmt: skip
def test_views(make, dim, device):
    check_forward_backward(make(torch.randn(12, 36, device=device)), dim, "fp32")


@NAN_ROW
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["bf16"]))
@pytest.mark.parametrize("dim", fast_subset([0, -1], [-1]))
def test_long_row_paths(dim, dtype_name, row_path, device):
    """Rows longer than the tile through the split and online designs, forward and backward,
    ragged last chunks, -inf runs and large values; an all -inf row gives NaN, as torch."""
    dtype = DTYPES[dtype_name]
    x = rows_with_extremes((6, 1500) if dim == -1 else (1500, 6), dtype, device, dim)
    check_forward_backward(x, dim, dtype_name)
    x.movedim(dim, -1)[3] = -float("inf")
    y = softmax_forward(x, dim).movedim(dim, -1)
    assert torch.isnan(y[3]).all() and torch.isfinite(y[4]).all()


@NAN_ROW
@pytest.mark.parametrize("dtype_name", fast_subset(["bf16", "fp16"], ["fp16"]))
def test_16_bit_backward_as_pairs_and_its_fallback(dtype_name, device, monkeypatch):
    """The long-row 16-bit backward reads even rows as int32 pairs; an odd row length, an odd
    row stride or an odd start takes the plain kernel; all match float64."""
    monkeypatch.setattr(dispatch, "ONE_PASS_MAX_ELEMS", 512)
    dtype = DTYPES[dtype_name]
    base = rows_with_extremes((4, 1538), dtype, device)
    for y, pairs in ((base[:, :1536], True), (base[:, :1535], False), (base[:, 1:1537], False),
                     (base[:, 2:1538], True)):  # fmt: skip
        layout = dispatch._row_dims([y, y])
        assert split._pairs_fit([y, y], layout[1], 512) is pairs
        check_forward_backward(y, -1, dtype_name)


@NAN_ROW
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["fp32", "bf16"]))
@pytest.mark.parametrize("shape, dim", [((7, 300), -1), ((300, 7), 0), ((3, 1500), -1)])
def test_gradient_through_autograd(shape, dim, dtype_name, row_path, device):
    x = torch.randn(shape, device=device).to(DTYPES[dtype_name]).requires_grad_()
    y = softmax(x, dim)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    y64 = torch.softmax(x.detach().double(), dim)
    dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(dim, keepdim=True))
    assert_close_to_float64(dx, dx_ref, dtype_name)


@NAN_ROW
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["bf16"]))
@pytest.mark.parametrize("scale", fast_subset([0.0884, 3.0, -1.5, 0.0], [-1.5]))
def test_scale_in_every_row_path(scale, dtype_name, row_path, device):
    """softmax(x, scale=s) against float64 softmax(x·s), and its gradient s·y·(dy - Σ y·dy),
    through autograd: rows in one tile and past it (split, online), over the last dim of a
    strided view and over dim 0, odd sizes. A positive scale keeps the -inf runs and the large
    values; zero and negative ones take random rows (masked lanes keep their fill)."""
    dtype = DTYPES[dtype_name]
    for shape, dim in (((7, 301), -1), ((3, 1501), -1), ((301, 5), 0)):
        if scale > 0:
            base = rows_with_extremes((shape[0], 2 * shape[1]), dtype, device, dim)
        else:
            base = (torch.randn(shape[0], 2 * shape[1], device=device) * 3).to(dtype)
        x = base[:, ::2].detach().requires_grad_()  # columns two apart
        y = softmax(x, dim, scale=scale)
        x64 = x.detach().double()
        assert_close_to_float64(y, torch.softmax(x64 * scale, dim), dtype_name)
        dy = torch.randn_like(y)
        (dx,) = torch.autograd.grad(y, x, dy)
        y64, dy64 = y.detach().double(), dy.double()
        dx_ref = scale * y64 * (dy64 - (y64 * dy64).sum(dim, keepdim=True))
        if scale == 0:  # uniform rows whatever x is: no gradient
            assert (dx == 0).all()
        else:
            assert_close_to_float64(dx, dx_ref, dtype_name)
        # the same rows again unscaled: a scale is part of what a call's plan is kept under
        assert_close_to_float64(softmax(x.detach(), dim), torch.softmax(x64, dim), dtype_name)


def test_scale_through_the_custom_op(device):
    """kernels.ops.softmax's scale=, forward and gradient, as kernels.softmax's."""
    import kernels.ops

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(6, 45, generator=g) * 2).to(device).requires_grad_()
    y = kernels.ops.softmax(x, -1, scale=0.25)
    y64 = torch.softmax(x.detach().double() * 0.25, -1)
    assert_close_to_float64(y, y64, "fp32")
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    dx_ref = 0.25 * y64 * (dy.double() - (y64 * dy.double()).sum(-1, keepdim=True))
    assert_close_to_float64(dx, dx_ref, "fp32")


def test_scalar_empty_and_reference(device):
    x = torch.randn((), device=device)
    assert softmax(x, 0).item() == 1.0 and softmax(x, -1).shape == ()
    assert softmax(torch.randn(0, 5, device=device), -1).shape == (0, 5)
    x = torch.randn(9, 33, device=device)
    torch.testing.assert_close(softmax_reference(x, -1), torch.softmax(x, -1))


@pytest.mark.parametrize("src, dst", [("bf16", "fp32"), ("fp32", "bf16"), ("fp16", "fp16")])
def test_dtype_keyword_casts_first(src, dst, device):
    """dtype= as in torch.softmax: x cast to it before the operation, the output of that dtype,
    and the gradient back in x's dtype."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(6, 37, generator=g) * 3).to(device=device, dtype=DTYPES[src])
    x.requires_grad_(True)
    y = softmax(x, -1, dtype=DTYPES[dst])
    assert y.dtype == DTYPES[dst]
    ref = torch.softmax(x.detach().to(DTYPES[dst]).double(), -1)
    torch.testing.assert_close(y.detach().double(), ref, rtol=0, atol=TOLERANCES[dst])
    y.sum().backward()
    assert x.grad.dtype == x.dtype and x.grad.shape == x.shape


def test_bad_inputs(device):
    x = torch.randn(4, 5, device=device)
    with pytest.raises(TypeError, match=r"dtype=torch.float64 is not supported"):
        softmax(x, -1, dtype=torch.float64)
    with pytest.raises(TypeError, match="dim must be an int"):
        softmax(x, 1.0)
    with pytest.raises(ValueError, match="out of range"):
        softmax(x, 2)
    with pytest.raises(TypeError, match="dtype"):
        softmax(x.to(torch.int32), -1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        softmax_forward([1.0, 2.0], -1)
    with pytest.raises(ValueError, match="dy has shape"):
        softmax_backward(x, torch.randn(4, 6, device=device), -1)
    with pytest.raises(TypeError, match="dtype"):
        softmax_backward(x, x.half(), -1)
    for bad, error in (("2", TypeError), (True, TypeError), (torch.tensor(2.0), TypeError),
                       (float("inf"), ValueError), (float("nan"), ValueError)):  # fmt: skip
        with pytest.raises(error, match="scale must be"):
            softmax(x, -1, scale=bad)
    with pytest.raises(ValueError, match="tile of 4 columns for rows of 5"):
        dispatch._forward(x, -1, direct, Config("tile", 1, 4, 1))
    with pytest.raises(ValueError, match="unknown softmax design"):
        dispatch._forward(x, -1, direct, Config("band", 1, 8, 1))


# -- which design a shape takes -------------------------------------------------------------------
def _launched(monkeypatch, shape, dtype, dim=-1, backward=False, view=None):
    """The Config the dispatch launches for these rows on a pretended Hopper GPU (nothing runs)."""
    seen = []
    monkeypatch.setattr(dispatch, "_launch_planned", lambda *a: seen.append(a[-2]))
    monkeypatch.setattr(dispatch, "_launch_smem", lambda *a: seen.append(a[-1]))
    monkeypatch.setattr(dispatch, "launch_split", lambda *a: seen.append(a[-1]))
    monkeypatch.setattr(dispatch, "_pick_config", _recording(dispatch._pick_config, seen))
    x = torch.empty(shape, dtype=dtype)
    x = view(x) if view else x
    with pretend_gpu(*HOPPER):
        if backward:
            dispatch._backward(x, torch.empty_like(x), dim, direct, None)
        else:
            dispatch._forward(x, dim, direct, None)
    return seen[0]


def _recording(pick, seen):
    def record(*args, **kwargs):
        config = pick(*args, **kwargs)
        seen.append(config)
        return config

    return record


@pytest.mark.parametrize("shape, dtype, dim, backward, view, want", [
    ((4096, 128), torch.bfloat16, -1, False, None, Config("tile", 8, 128, 2, even=True)),
    ((4096, 512), torch.float32, -1, False, None, Config("tile", 2, 512, 4, even=True)),
    ((2**20, 128), torch.bfloat16, -1, True, None, Config("tile", 64, 128, 8)),
    ((4096, 128), torch.bfloat16, -1, True, None, Config("tile", 16, 128, 4)),  # thinned
    ((4096, 2048), torch.bfloat16, -1, False, None, Config("tile", 4, 2048, 4)),
    ((4096, 4096), torch.float32, -1, False, None,
     Config("online", 1, 4096, 16, evict=True, exp2=1, even=True)),
    ((1024, 8), torch.float32, 0, False, None, Config("tile", 8, 1024, 8)),
    # long rows, 16-byte aligned: smem; a grid of 24+ programs an SM: lead programs
    ((512, 262144), torch.bfloat16, -1, False, None,
     Config("smem", 1, 16384, 8, exp2=2, even=True, maxnreg=40, lead=True)),
    ((8, 65536), torch.float32, -1, False, None, Config("smem", 1, 8192, 4, exp2=1, even=True)),
    ((8, 65536), torch.bfloat16, -1, True, None, Config("smem", 1, 8192, 4)),
    # long rows a column off 16 bytes: coop; fp32 past 16 chunks capped; 16-bit backward pairs
    ((8, 262145), torch.float32, -1, False, None, Config("coop", 1, 4096, 4, exp2=1, maxnreg=56)),
    ((8, 65537), torch.bfloat16, -1, False, None,
     Config("coop", 1, 4096, 4, exp2=2, evict=True)),
    ((8, 65538), torch.bfloat16, -1, True, lambda x: x[:, 1:-1],
     Config("coop", 1, 4096, 4, pairs=True)),
    ((65536, 64), torch.float32, 0, True, None, Config("coop", 32, 512, 16)),
    # past 128 chunks of the largest chunk: the online loop
    ((100000, 64), torch.float32, 0, False, None, Config("online", 32, 128, 8)),
])  # fmt: skip
def test_dispatch(shape, dtype, dim, backward, view, want, monkeypatch):
    assert _launched(monkeypatch, shape, dtype, dim, backward, view) == want


def test_dispatch_off_hopper_and_under_the_interpreter(monkeypatch):
    """smem only on compute capability 9.x and direct launches; without a GPU, split2."""
    x = torch.empty(8, 65536)
    layout = dispatch._row_dims([x, x])
    with pretend_gpu((8, 0), 108):
        pick = dispatch._pick_config(65536, 8, False, False, x.device, 4, 1, False)
    assert pick.design == "coop"
    assert dispatch._pick_config(65536, 8, False, False, x.device, 4).design == "split2"
    assert dispatch._smem_fits([x, x], layout[1], 65536)
    assert not dispatch._smem_fits([x[:, 1:], x[:, 1:]], [(0, 65536, 1)] * 2, 65535)


def test_index_hints():
    """EVEN only where the rows fill the blocks, INT32 only where every offset fits, both only
    where Config.even asks; ONE_OUTER, DENSE and (online) ONE_STEP from the rows."""
    tile = Config("tile", 4, 128, 4, even=True)
    hints = dispatch._index_hints(tile, (1, 64), [(0, 128, 1)] * 2, 128)
    assert hints == dict(EVEN=True, INT32=True, ONE_OUTER=True, DENSE=True)
    hints = dispatch._index_hints(tile, (3, 62), [(2**30, 200, 1), (62 * 128, 128, 1)], 100)
    assert hints == dict(EVEN=False, INT32=False, ONE_OUTER=False, DENSE=False)
    online = Config("online", 1, 4096, 8, even=False)
    hints = dispatch._index_hints(online, (1, 9), [(0, 4096, 1)] * 2, 4096)
    assert hints == dict(EVEN=False, INT32=False, ONE_OUTER=True, DENSE=True, ONE_STEP=True)


# -- the first call's choice ----------------------------------------------------------------------
def _fake_timer(times_by_label, calls):
    """A _time_candidate stand-in: runs the candidate once, gives its listed time (or 1.0)."""

    def timer(fn):
        fn()
        calls.append(fn.args[0])
        return times_by_label.get(dispatch._label(fn.args[0]), 1.0)

    return timer


@pytest.mark.parametrize("itemsize, cols, rows, want", [
    (2, 128, 2**20, [(8, 2), (4, 2), (8, 4), (16, 8)]),  # the pick, then 1, 2 and 4 KB tiles
    (4, 512, 2**18, [(2, 4), (1, 4), (2, 8)]),  # a row is 2 KB: at least one row a tile
    (2, 128, 64, [(1, 2), (1, 1)]),  # 64 rows on 132 SMs: one row a program
])  # fmt: skip
def test_first_call_candidates(itemsize, cols, rows, want):
    """Short-row tiles: the pick, tiles with one 16-byte access a thread, then the row loop on
    the same blocks. The row loop: the pick, Inductor's arithmetic, half the warps. Nothing
    for the backward or the other designs."""
    with pretend_gpu(*HOPPER):
        device = torch.device("cuda")
        pick = dispatch._pick_config(cols, rows, False, False, device, itemsize)
        got = dispatch._first_call_candidates(pick, False, rows, 1, itemsize, device)()
        loop = dispatch._pick_config(4096, 4096, False, False, device, 4)
        assert dispatch._first_call_candidates(pick, True, rows, 1, itemsize, device) is None
        long = dispatch._pick_config(65536, 64, False, False, device, 4, 1, True)
        assert dispatch._first_call_candidates(long, False, 64, 1, 4, device) is None
    assert got[0] == pick and len(got) == len(set(got))
    tiles = [(c.block_rows, c.num_warps) for c in got if c.design == "tile"]
    loops = [(c.block_rows, c.num_warps) for c in got if c.design == "online"]
    assert tiles == want and loops == want[1:]
    assert all(c.even and (c.evict, c.exp2) == (c.design == "online", int(c.design == "online"))
               for c in got[1:])  # fmt: skip
    assert dispatch._online_candidates(loop) == [
        loop, loop._replace(inductor=True), loop._replace(num_warps=loop.num_warps // 2)
    ]  # fmt: skip
    assert dispatch._label(loop._replace(inductor=True)) == "online 1x4096 w16 inductor"


@NAN_ROW
@pytest.mark.parametrize("dtype_name", fast_subset(DTYPES, ["bf16"]))
@pytest.mark.parametrize("shape, dim, cols", fast_subset(
    [((64, 128), -1, 128), ((7, 9, 33), 1, 9), ((9, 1024), -1, 1024)], unpack=True))  # fmt: skip
def test_every_first_call_candidate_is_correct(shape, dim, cols, dtype_name, device):
    """Each candidate the first call may time (tiles, row loops on their blocks, Inductor's
    arithmetic), on full and ragged blocks, a middle dim, extremes."""
    x = rows_with_extremes(shape, DTYPES[dtype_name], device, dim)
    rows = x.numel() // cols
    with pretend_gpu((9, 0), 4):  # few SMs: these few rows still fill tiles of several rows
        gpu = torch.device("cuda")
        pick = dispatch._pick_config(cols, rows, False, False, gpu, x.element_size())
        candidates = dispatch._first_call_candidates(pick, False, rows, 1, x.element_size(),
                                                     gpu)()  # fmt: skip
    assert len(candidates) > 1
    for config in candidates:
        y = dispatch._forward(x, dim, direct, config)
        assert_close_to_float64(y, torch.softmax(x.double(), dim), dtype_name)


def test_tuned_config_times_once_keeps_the_fastest_and_logs_it(monkeypatch):
    candidates = [Config("tile", 8, 128, 2), Config("tile", 4, 128, 2), Config("tile", 8, 128, 4)]
    calls, runs = [], []
    monkeypatch.setattr(dispatch, "_time_candidate", _fake_timer({"tile 4x128 w2": 0.5}, calls))
    log_before = len(TUNING_LOG)
    tuned = dispatch._tuned_config
    assert tuned(("k",), lambda: candidates, runs.append, "forward bf16 8 x 128") == candidates[1]
    assert len(calls) == dispatch.TUNE_ROUNDS * len(candidates)
    assert runs[: len(candidates)] == candidates  # each compiled and warmed up first
    (line,) = TUNING_LOG[log_before:]
    assert line.startswith("softmax forward bf16 8 x 128: chose tile 4x128 w2 (GPU ms a call: ")
    assert tuned(("k",), lambda: candidates, runs.append, "again") == candidates[1]  # remembered
    assert len(calls) == dispatch.TUNE_ROUNDS * len(candidates)
    assert len(TUNING_LOG) == log_before + 1
    monkeypatch.setattr(dispatch, "_time_candidate", _fake_timer({}, calls))
    assert tuned(("tie",), lambda: candidates, runs.append, "t") == candidates[0]  # ties: the pick


def test_tuning_caches_are_registered():
    """kernels._common.reset_tuning (each benchmark row's start) empties the first call's
    choices and the launch plans."""
    assert all(any(cache is c for c in TUNING_CACHES) for cache in REGISTERED)
    REGISTERED[0]["key"] = Config("tile", 1, 128, 1)
    reset_tuning()
    assert REGISTERED[0] == {}


@NAN_ROW
@pytest.mark.parametrize("shape, dtype_name", [((96, 128), "bf16"), ((5, 4096), "fp32")])
@pytest.mark.slow
def test_first_call_tunes_through_softmax(shape, dtype_name, device, monkeypatch):
    """Through softmax(): the forward takes the fastest candidate (a fake timer here), keeps it
    for the next call of the shape, writes one TUNING_LOG line, and stays correct; a byte
    less keeps the pick; the backward and rows adjacent in memory are not timed."""
    calls = []
    monkeypatch.setattr(dispatch, "_tunable", lambda launch, device: launch is direct)
    dtype = DTYPES[dtype_name]
    x = rows_with_extremes(shape, dtype, device).requires_grad_()
    monkeypatch.setattr(dispatch, "TUNE_MIN_BYTES", x.nbytes)
    small = torch.randn(shape[0] - 1, shape[1], device=device).to(dtype)
    assert_close_to_float64(softmax(small, -1), torch.softmax(small.double(), -1), dtype_name)
    assert dispatch._TUNED == {}
    pick = dispatch._pick_config(shape[1], shape[0], False, False, x.device, x.element_size())
    last = dispatch._first_call_candidates(pick, False, shape[0], 1, x.element_size(),
                                           x.device)()[-1]  # fmt: skip
    monkeypatch.setattr(dispatch, "_time_candidate", _fake_timer({dispatch._label(last): 0.1},
                                                                 calls))  # fmt: skip
    log_before = len(TUNING_LOG)
    y = softmax(x, -1)
    assert_close_to_float64(y, torch.softmax(x.detach().double(), -1), dtype_name)
    assert list(dispatch._TUNED.values()) == [last] and calls
    timed = len(calls)
    softmax(x.detach() * 1.5, -1)
    (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    xt = torch.randn(shape[1], 40, device=device).to(dtype)
    softmax(xt, 0)
    assert len(calls) == timed and len(dispatch._TUNED) == 1
    name = str(dtype).removeprefix("torch.")
    (line,) = TUNING_LOG[log_before:]
    assert line.startswith(f"softmax forward {name} {shape[0]} x {shape[1]}: chose ")


def test_tuning_only_where_a_direct_gpu_launch_can_time(device):
    assert not dispatch._tunable(direct, torch.device("cpu"))
    with pretend_gpu(*HOPPER):  # a pretended GPU (experiments.resources) never times
        assert not dispatch._tunable(direct, torch.device("cpu"))
    if device == "cuda":
        assert dispatch._tunable(direct, torch.device("cuda"))
        assert not dispatch._tunable(lambda kernel: kernel, torch.device("cuda"))


# -- the coop protocol's host side -----------------------------------------------------------------
@pytest.mark.parametrize("block_rows, pairs, backward", fast_subset([
    (1, False, False), (4, False, False), (1, False, True), (4, False, True), (1, True, True),
], [(4, False, True), (1, True, True)], unpack=True))  # fmt: skip
def test_coop_clears_the_next_workspace(block_rows, pairs, backward, device):
    """A launch with CLEAR zeroes every word of the workspace the next launch takes (slots,
    ticket), whatever its rows, chunks and row blocks. Run as split2's publishing launch (the
    interpreter cannot wait), over a workspace full of garbage."""
    rows, n, chunk = 7, 1000, 128
    n_chunks, row_blocks = -(-n // chunk), -(-rows // block_rows)
    n_slots = rows * n_chunks
    dtype = torch.bfloat16 if pairs else torch.float32
    n_tensors = 3 if backward else 2
    tensors = [torch.randn(rows, n, device=device, dtype=dtype) for _ in range(n_tensors)]
    strides = [0, n, 1] * len(tensors)
    kernel = split._KERNELS[backward]
    meta = dict(POLICY="", EXP2=1) if not backward else {}
    if pairs:
        tensors = [t.view(torch.int32) for t in tensors]
        strides, n, chunk = [0, n // 2, 1] * len(tensors), n // 2, chunk // 2
        kernel, meta = split.softmax_backward_split_pairs_kernel, dict(HALF=1)
    ws = torch.empty(n_slots, device=device, dtype=torch.int64)
    next_ws = torch.full((n_slots + 1,), -5, device=device, dtype=torch.int64)
    kernel[(row_blocks * n_chunks,)](
        *tensors, ws, rows, n, n_chunks, n_slots, *strides, BLOCK_ROWS=block_rows, CHUNK=chunk,
        MAX_CHUNKS=8, PHASE=0, SLEEP_NS=coop.SLEEP_NS, CLEAR=True, next_ptr=next_ws, **meta,
    )  # fmt: skip
    assert (next_ws == 0).all(), next_ws


def test_coop_workspace_cache_is_bounded(monkeypatch):
    """Past COOP_WORKSPACE_SIZES sizes the oldest goes; a size asked again gets its own pair
    back, zeroed buffers, index 0."""
    monkeypatch.setattr(coop, "_COOP_WORKSPACES", {})
    cpu = torch.device("cpu")
    first = coop.coop_workspace(10, cpu)
    assert coop.coop_workspace(10, cpu) is first
    assert first[2] == 0 and all((b == 0).all() and b.numel() == 10 for b in first[:2])
    for n in range(11, 11 + 2 * coop.COOP_WORKSPACE_SIZES):
        coop.coop_workspace(n, cpu)
    assert len(coop._COOP_WORKSPACES) == coop.COOP_WORKSPACE_SIZES
    assert coop.coop_workspace(10, cpu) is not first


def test_gpu_only_designs_refuse_the_interpreter(device):
    if device == "cuda":
        pytest.skip("the interpreter's refusals")
    x = torch.randn(4, 1024)
    with pytest.raises(ValueError, match="coop design needs a GPU"):
        dispatch._forward(x, -1, direct, Config("coop", 1, 512, 4))
    with pytest.raises(ValueError, match="smem design .* needs a GPU"):
        dispatch._forward(x, -1, direct, Config("smem", 1, 512, 4))


def test_smem_launch_checks_its_arguments():
    """smem.launch refuses chunks of partial pieces, short workspaces and leave_polls of 0
    before it launches anything (no GPU needed)."""
    smem = dispatch.smem
    if smem is None:
        pytest.skip("a Triton without Gluon")
    x = torch.randn(2, 16384)
    ws = torch.zeros(smem.workspace_words(4, 2), dtype=torch.int64)
    args = (direct, False, [x, x.clone()], ws, None, (1, 2), [(32768, 16384, 1)] * 2)
    with pytest.raises(ValueError, match="whole number of 512-wide pieces"):
        smem.launch(*args, 8000, 4)
    with pytest.raises(ValueError, match="short of the"):
        smem.launch(*args[:3], ws[:-1], *args[4:], 8192, 4)
    with pytest.raises(ValueError, match="leave_polls is at least 1"):
        smem.launch(*args, 8192, 4, leave_polls=0)
    with pytest.raises(ValueError, match="knobs of the forward"):
        smem.launch(direct, True, [x, x, x], ws, None, (1, 2), [(32768, 16384, 1)] * 3, 8192,
                    4, even=True)  # fmt: skip


# -- on a GPU: the GPU-only designs against float64 ------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape, dim", [
    ((65536, 128), -1),  # the short-row tile (and its first-call choice)
    ((2048, 4096), -1),  # the row loop
    ((33, 5000), -1),  # the row loop over a padded row of 8192
    ((1823, 781), -1),  # the 16 KB tile
    ((300, 65536), -1),  # smem, interleaved chunks
    ((9, 70000), -1),  # smem, a ragged last chunk
    ((2, 2**22), -1),  # smem with chunks grown to keep 128 a row
    ((1024, 4096), 0),  # coop over adjacent rows, 32 a program
    ((2, 6, 1024, 1024), 2),  # coop over adjacent rows, output rows strided
    ((4, 2**21 + 1), -1),  # unaligned, past 128 chunks of 16384: the online loop
])  # fmt: skip
def test_designs_on_gpu(shape, dim, dtype_name):
    check_forward_backward(rows_with_extremes(shape, DTYPES[dtype_name], "cuda", dim), dim,
                           dtype_name)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_smem_and_coop_on_views_on_gpu(dtype_name):
    """Long rows through views: 16-byte aligned ones take the smem kernels, others (a column
    offset of one element, every other column, an odd row length) coop with its pairs
    backward where the rows allow; each forward and backward against float64."""
    dtype = DTYPES[dtype_name]
    base = rows_with_extremes((5, 65536 + 64), dtype, "cuda")
    views = {
        "aligned offset": (base[:, 64:], -1, True),
        "one element in": (base[:, 1:65537], -1, False),
        "two elements in": (base[:, 2:65538], -1, False),
        "split along dim 1": (torch.split(base, [32, 65568], dim=1)[1], -1, True),
        "dim 0 of a transpose": (base[:, :65536].t(), 0, True),
        "every other column": (base[:, ::2], -1, False),
        "odd row length": (base[:, :65535], -1, False),
    }
    for name, (x, dim, aligned) in views.items():
        rows = x.movedim(dim, -1)
        layout = dispatch._row_dims([rows, rows])
        assert dispatch._smem_fits([rows, rows], layout[1], rows.shape[-1]) is aligned, name
        check_forward_backward(x, dim, dtype_name)


@pytest.mark.gpu
def test_coop_and_smem_workspaces_on_gpu():
    """Back-to-back launches take the two cached workspaces in turn, each zeroing the other
    for the next: every call right; under CUDA graph capture a launch zeroes its own."""
    x32 = torch.randn(6, 65536, device="cuda") * 3
    for _ in range(3):
        for x in (x32, x32.bfloat16(), x32[:, 1:], x32[:, 1:].bfloat16()):  # smem, coop
            check_forward_backward(x, -1, "fp32" if x.dtype == torch.float32 else "bf16")
    for static_x in (x32.clone(), x32[:, 1:].bfloat16()):
        softmax_forward(static_x, -1)  # compiled before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = softmax_forward(static_x, -1)
        for scale in (1.0, 2.0, 0.5):
            static_x.copy_(x32[:, -static_x.shape[1]:] * scale)
            graph.replay()
            assert relative_error(static_y, torch.softmax(static_x.double(), -1)) < 1.6e-2


def _smem_run(x, backward, leave_polls, lead=0):
    """One smem launch over x's rows (the forward, or the backward with y = softmax(x) and a
    random dy) on a fresh workspace, the pick's chunk and warps: (output, reference, the
    workspace's left flags)."""
    smem = dispatch.smem
    rows, n = x.shape
    pick = dispatch._pick_config(n, rows, False, backward, x.device, x.element_size(),
                                 smem_ok=True)  # fmt: skip
    assert pick.design == "smem", pick
    torch.manual_seed(1)
    if backward:
        y = torch.softmax(x.float(), -1).to(x.dtype)
        dy = torch.randn_like(y)
        tensors = [y, dy, torch.full_like(y, float("nan"))]
        y64, dy64 = y.double(), dy.double()
        ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    else:
        tensors = [x, torch.full_like(x, float("nan"))]
        ref = torch.softmax(x.double(), -1)
    n_chunks = triton.cdiv(n, pick.block_cols)
    ws = torch.zeros(smem.workspace_words(rows * n_chunks, n_chunks), device=x.device,
                     dtype=torch.int64)  # fmt: skip
    smem.launch(direct, backward, tensors, ws, None, (1, rows), [(rows * n, n, 1)] * len(tensors),
                pick.block_cols, pick.num_warps, exp2=pick.exp2, even=pick.even, lead=lead,
                maxnreg=pick.maxnreg, leave_polls=leave_polls)  # fmt: skip
    return tensors[-1], ref, ws[rows * n_chunks + 1 + rows:]


@pytest.mark.gpu
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("dtype_name", ["bf16", "fp32"])
@pytest.mark.parametrize("n, rows_per_sm", [(70000, 0), (65536, 5), (262144, 2)],
                         ids=["ragged", "interleaved_many", "interleaved_16"])  # fmt: skip
def test_smem_leaving_on_gpu(dtype_name, n, rows_per_sm, backward):
    """Every program that finds its row incomplete at its first poll leaves its chunk to the
    row's last publisher, which writes it from global memory (from the interleaved layout where
    rows are whole chunks): the float64 softmax, and the bits of the same launch where nobody
    leaves. ragged: 6 rows of 70000 columns (a last chunk of 4464, masked); _many: 5 rows an SM,
    programs leaving in every wave."""
    from kernels._common import gpu_info

    rows = rows_per_sm * gpu_info(torch.device("cuda")).sms if rows_per_sm else 6
    x = rows_with_extremes((rows, n), DTYPES[dtype_name], "cuda")
    stay, ref, _ = _smem_run(x, backward, -1)
    out, _, left = _smem_run(x, backward, 1)
    assert torch.equal(out.view(torch.uint8), stay.view(torch.uint8))
    assert relative_error(out, ref) < TOLERANCES[dtype_name]
    if rows_per_sm:  # programs did leave (6 rows often complete before the first poll)
        assert (left == 1).sum().item() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("n, lead", [(32768, 0), (262144, 0), (262144, 396), (70000, 132)])
def test_smem_forward_interleaved_and_lead_on_gpu(dtype_name, n, lead):
    """The smem forward's layouts: rows of 2 and 16 interleaved chunks, a ragged row (whole
    chunks), with and without lead programs (which only hold slots: the same bits), against
    float64 with -inf runs and 1e4; every row sums to 1."""
    x = rows_with_extremes((9, n), DTYPES[dtype_name], "cuda")
    y, ref, _ = _smem_run(x, False, dispatch.smem.LEAVE_POLLS, lead)
    if lead:
        plain, _, _ = _smem_run(x, False, dispatch.smem.LEAVE_POLLS)
        assert torch.equal(y.view(torch.uint8), plain.view(torch.uint8))
    assert relative_error(y, ref) < TOLERANCES[dtype_name]
    ones = torch.ones(9, device="cuda", dtype=torch.float64)
    torch.testing.assert_close(y.double().sum(-1), ones, rtol=0, atol=TOLERANCES[dtype_name])


@pytest.mark.gpu
def test_softmax_takes_lead_programs_on_a_big_grid_on_gpu():
    """200 rows of 16 chunks (24.2 programs an SM on 132 SMs): the pick has lead programs."""
    x = rows_with_extremes((200, 262144), torch.bfloat16, "cuda")
    pick = dispatch._pick_config(262144, 200, False, False, x.device, 2, smem_ok=True)
    assert pick.lead == (dispatch._sm_count(x.device) <= 133), pick
    assert_close_to_float64(softmax(x, -1), torch.softmax(x.double(), -1), "bf16")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(65536, 128), (4096, 1024), (2048, 4096)])
def test_first_call_tuning_on_gpu(shape, dtype_name, monkeypatch):
    """The first call times its candidates with the real timer and writes one line; the choice
    is correct, and a CUDA graph captured on a new shape keeps the pick untimed."""
    dtype = DTYPES[dtype_name]
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    log_before = len(TUNING_LOG)
    assert_close_to_float64(softmax(x, -1), torch.softmax(x.double(), -1), dtype_name)
    (line,) = TUNING_LOG[log_before:]
    (chosen,) = dispatch._TUNED.values()
    assert f"chose {dispatch._label(chosen)} (" in line
    w = torch.randn(shape[0] + 3, shape[1], device="cuda", dtype=dtype)
    monkeypatch.setattr(dispatch, "TUNE", False)
    softmax(w, -1)  # compiles the pick's kernel for w outside the capture, untimed
    monkeypatch.setattr(dispatch, "TUNE", True)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = softmax(w, -1)
    assert len(dispatch._TUNED) == 1
    w.copy_(torch.randn_like(w) * 2)
    graph.replay()
    torch.cuda.synchronize()
    assert_close_to_float64(out, torch.softmax(w.double(), -1), dtype_name)
