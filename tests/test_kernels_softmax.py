"""kernels.softmax against torch.softmax in float64: shapes, dims, strides, dtypes, gradients."""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

from experiments.correctness import TOLERANCES, relative_error
from kernels._common import pretend_gpu
from kernels.softmax import (
    Config,
    _backward,
    _forward,
    _programs_per_sm,
    direct,
    softmax,
    softmax_backward,
    softmax_forward,
    softmax_reference,
)

# kernels/__init__.py rebinds the attribute kernels.softmax to the function, so
# `import kernels.softmax as m` would give the function; the module is needed to patch its knobs.
softmax_module = importlib.import_module("kernels.softmax")

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def assert_matches_reference(x: torch.Tensor, dim: int, dtype_name: str) -> torch.Tensor:
    y = softmax(x, dim)
    assert y.dtype == x.dtype and y.shape == x.shape
    err = relative_error(y, torch.softmax(x.double(), dim))
    # the output rounding dominates: one fp16/bf16 rounding per element
    assert err < TOLERANCES[dtype_name], f"relative error {err:.2e} for {dtype_name}"
    return y


@pytest.fixture(autouse=True)
def fresh_plans(monkeypatch):
    """Each test starts with no remembered launches (_PLANS), so that one test's knobs (patched
    constants, a tuner's choice) never reach another's calls on the GPU."""
    monkeypatch.setattr(softmax_module, "_PLANS", {})


@pytest.fixture(params=["tile", "split", "online"])
def row_path(request, monkeypatch):
    """Run on every long-row path at small sizes.

    "split" sends rows longer than 512 through the split design (chunks of 512; on the CPU the
    two-launch split2, whose partials and combine are the cooperative kernel's); "online"
    allows one chunk per row, which sends them through the two-pass loop.
    """
    if request.param != "tile":
        monkeypatch.setattr(softmax_module, "ONE_PASS_MAX_ELEMS", 512)
    if request.param == "online":
        monkeypatch.setattr(softmax_module, "MAX_SPLIT_CHUNKS", 1)
    return request.param


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (37, 1000), (5, 4097), (1, 8192)])
def test_last_dim_odd_sizes(shape, dtype_name, device):
    x = torch.randn(shape, device=device, dtype=DTYPES[dtype_name])
    assert_matches_reference(x, -1, dtype_name)


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "shape, dim",
    [
        ((9, 13), 0),
        ((9, 13), 1),
        ((5, 6, 7), 0),
        ((5, 6, 7), 1),
        ((5, 6, 7), -1),
        ((2, 3, 5, 7), 0),
        ((2, 3, 5, 7), 1),
        ((2, 3, 5, 7), 2),
        ((2, 3, 5, 7), -1),
    ],
)
def test_any_dim(shape, dim, dtype_name, device):
    x = torch.randn(shape, device=device, dtype=DTYPES[dtype_name])
    y = assert_matches_reference(x, dim, dtype_name)
    # the output is written row-major in the moved layout and handed back as a view of it
    assert y.movedim(dim, -1).is_contiguous()


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_split_view_along_dim1(dim, device):
    _, x = torch.split(torch.randn(6, 19, 11, device=device), [8, 11], dim=1)
    assert not x.is_contiguous()
    assert_matches_reference(x, dim, "fp32")


@pytest.mark.parametrize("dim", [0, 1])
def test_transposed_slice(dim, device):
    x = torch.randn(23, 40, device=device).t()[3:31:2]
    assert x.stride() == (2, 40)
    assert_matches_reference(x, dim, "fp32")


@pytest.mark.parametrize("dim", [0, 2, 3])
def test_permuted_view_three_row_dims(dim, device):
    # three leading dims that cannot merge: the wrapper copies the moved view to plain rows
    x = torch.randn(4, 5, 6, 7, device=device).permute(2, 0, 3, 1)
    assert_matches_reference(x, dim, "fp32")


def test_broadcast_zero_strides(device):
    x = torch.randn(1, 9, device=device).expand(5, 9)
    assert_matches_reference(x, -1, "fp32")
    assert_matches_reference(x, 0, "fp32")


@pytest.mark.parametrize("row_path", ["split", "online"], indirect=True)
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("dim", [0, -1])
def test_long_row_paths(dim, dtype_name, row_path, device):
    shape = (4097, 3) if dim == 0 else (3, 4097)
    x = torch.randn(shape, device=device, dtype=DTYPES[dtype_name])
    assert_matches_reference(x, dim, dtype_name)


# Explicit configs: what the probe compares on the GPU, each checked here at small sizes.
# Under the interpreter the SM count is INTERPRETER_SMS (3), so a persistent grid of 1 or 2
# programs per SM walks several tiles per program.
CONFIGS = {
    "tile_rows8": Config("tile", 8, 128, 4),
    "tile_persist_estimate": Config("tile", 4, 128, 4, per_sm=-1),
    "tile_persist_1": Config("tile", 2, 128, 8, per_sm=1),
    "tile_persist_pipelined": Config("tile", 4, 128, 4, per_sm=2, num_stages=2),
    "split2": Config("split2", 1, 32, 4),
    "split2_rows4": Config("split2", 4, 16, 4),
    "split2r": Config("split2r", 2, 64, 4),
    "online": Config("online", 2, 32, 4),
    # round 3 knobs (kernels/notes/softmax.md): each must give the same answer as round 2's
    "tile_exp2_evict": Config("tile", 8, 128, 4, evict=True, exp2=1),
    "tile_persist_exp2": Config("tile", 4, 128, 4, per_sm=2, num_stages=2, exp2=1),
    # counter and sleep_ns only act in the waiting (GPU) kernel; split2 must ignore them
    "split2_knobs": Config("split2", 1, 32, 4, sleep_ns=0, counter=True, evict=True, exp2=1),
    "split2_loop": Config("split2", 1, 64, 4, loop_cols=16),
    "split2_loop_rows4_knobs": Config("split2", 4, 32, 4, loop_cols=16, evict=True, exp2=1),
    "split2r_loop": Config("split2r", 2, 64, 4, loop_cols=32, counter=True),
    "split2_loop_one_tile": Config("split2", 1, 128, 4, loop_cols=128, exp2=1),
    "online_knobs": Config("online", 2, 32, 4, num_stages=2, evict=True, exp2=1),
}


@pytest.mark.parametrize("config_name", CONFIGS)
@pytest.mark.parametrize("shape, dim", [((45, 101), -1), ((101, 13), 0), ((3, 21, 7), 1)])
def test_configs_forward_and_backward(config_name, shape, dim, device):
    config = CONFIGS[config_name]
    x = torch.randn(shape, device=device)
    x.select(dim, 5).fill_(-float("inf"))  # -inf entries, in one chunk or another
    y = _forward(x, dim, direct, config)
    y_ref = torch.softmax(x.double(), dim)
    assert relative_error(y, y_ref) < TOLERANCES["fp32"]
    # the fp32 row sum in the kernel is good to about N ulps, so a row sums to 1 within N * eps,
    # not within float64's default 1e-7 (a 101-column row read 1 + 2.0e-7 in CI)
    ones = torch.ones_like(y_ref.sum(dim))
    sum_atol = x.shape[dim] * torch.finfo(torch.float32).eps
    torch.testing.assert_close(y.double().sum(dim), ones, rtol=0, atol=sum_atol)
    dy = torch.randn_like(x).transpose(0, -1).contiguous().transpose(0, -1)  # non-contiguous
    dx = _backward(y, dy, dim, direct, config)
    y64 = y.double()
    dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(dim, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES["fp32"]


# Round 3 long-row variants at the edges: whole chunks and whole loop tiles of -inf, huge
# magnitudes, equal values, an all -inf row, 16-bit dtypes, odd sizes, a strided view.
ROUND3_LONG = {
    "split2_loop": Config("split2", 1, 256, 4, loop_cols=64, evict=True, exp2=2),
    "split2_loop_rows2": Config("split2", 2, 128, 4, loop_cols=32, exp2=1),
    "split2_exp2fma": Config("split2", 1, 128, 4, exp2=2, counter=True),
    "online_exp2": Config("online", 1, 64, 4, evict=True, exp2=1),
    # round 8's pick for 16-bit rows of 65536 with rows enough (coop since round 9), in small
    "online_exp2fma": Config("online", 1, 64, 8, evict=True, exp2=2),
    "tile_exp2fma": Config("tile", 1, 2048, 8, exp2=2),
    # round 9: no second exp after the wait (forward only; the backward drops the knob)
    "split2_rescale": Config("split2", 1, 256, 4, rescale=True),
    "split2_rescale_exp2fma": Config("split2", 1, 128, 4, rescale=True, exp2=2, counter=True),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero encountered")
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("config_name", ROUND3_LONG)
def test_round3_long_row_variants_extremes(config_name, dtype_name, device):
    config = ROUND3_LONG[config_name]
    dtype = DTYPES[dtype_name]
    n = 1037  # 5 chunks of 256 (the last short), loop tiles past the row's end
    x = torch.randn(7, n, device=device) * 3
    x[0] *= 1e4 if dtype != torch.float16 else 1e3  # exp overflows without the max shift
    x[1, :700] = -float("inf")  # whole chunks and loop tiles of -inf first
    x[2] = 3.25  # all equal
    x[3, ::3] = -float("inf")
    x[4] = -float("inf")  # NaN, as torch gives
    x[5, n - 1] = 1e4  # the maximum in the last, short chunk
    x = x.to(dtype)
    y = _forward(x, -1, direct, config)
    ref = torch.softmax(x.double(), -1)
    assert torch.isnan(y[4]).all()
    keep = [0, 1, 2, 3, 5, 6]
    if dtype == torch.float16:
        ref = ref.to(dtype).double()  # subnormal fp16 outputs: compare as rounded
    assert relative_error(y[keep], ref[keep]) < TOLERANCES[dtype_name]
    assert (y[1, :700] == 0).all() and (y[3, ::3] == 0).all()
    # the backward, on a strided view of y and a non-contiguous dy
    yk = y[keep]
    dy = torch.randn(n, len(keep), device=device, dtype=dtype).t()
    dx = _backward(yk, dy, -1, direct, config._replace(rescale=False))
    y64, dy64 = yk.double(), dy.double()
    dx_ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES[dtype_name]


@pytest.mark.parametrize("dim", [0, 1, 2])
def test_round3_loop_over_any_dim(dim, device):
    # softmax over an outer or middle dim: rows adjacent in memory, strided columns
    x = torch.randn(12, 3, 41, device=device)[:, :, 1:].transpose(0, 1)  # a (3, 12, 40) view
    config = Config("split2", 2, 16, 4, loop_cols=8, evict=True, exp2=2)
    y = _forward(x, dim, direct, config)
    assert relative_error(y, torch.softmax(x.double(), dim)) < TOLERANCES["fp32"]
    dy = torch.randn_like(x)
    dx = _backward(y, dy, dim, direct, config)
    y64 = y.double()
    dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(dim, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES["fp32"]


# Round 14: the tile and online forward without masks (rows that fill the blocks exactly) and
# with 32-bit offsets; each knob only acts where the rows allow it, so every shape stays right.
INDEX_CONFIGS = {
    "tile_even_int32": Config("tile", 8, 128, 4, even=True, int32=True),
    "tile_even": Config("tile", 4, 128, 2, even=True, exp2=1),
    "tile_int32_persist": Config("tile", 4, 128, 4, per_sm=1, int32=True),
    "online_even_int32": Config("online", 1, 128, 4, even=True, int32=True, evict=True, exp2=1),
    "online_rows2_even": Config("online", 2, 32, 4, even=True),
    # round 22: the stores without evict_first (Inductor's policy)
    "online_store_default": Config("online", 1, 128, 4, even=True, int32=True, evict=True,
                                   exp2=1, store_default=True),
}


@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero encountered")
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("config_name", INDEX_CONFIGS)
@pytest.mark.parametrize(
    "shape, dim",
    [
        ((48, 128), -1),  # fills the blocks: EVEN
        ((45, 101), -1),  # ragged rows and columns: masks
        ((128, 40), 0),  # rows adjacent in memory, strided columns
        ((3, 16, 128), 1),  # a middle dim
    ],
)
def test_even_and_int32_forward(config_name, dtype_name, shape, dim, device):
    config = INDEX_CONFIGS[config_name]
    dtype = DTYPES[dtype_name]
    moved = list(shape)
    moved.append(moved.pop(dim))
    rows = torch.randn(moved, device=device).view(-1, moved[-1]) * 3  # the softmax rows
    rows[0, 3] = 1e4 if dtype != torch.float16 else 1e3
    rows[1, ::3] = -float("inf")
    rows[2] = 2.5  # all equal
    rows[3] = -float("inf")  # NaN, as torch gives
    x = rows.view(moved).movedim(-1, dim).contiguous().to(dtype)

    def as_rows(t):
        return t.movedim(dim, -1).reshape(-1, moved[-1])

    y = _forward(x, dim, direct, config)
    ref = torch.softmax(x.double(), dim)
    assert torch.isnan(as_rows(y)[3]).all()
    keep = [i for i in range(rows.shape[0]) if i != 3]
    y_rows, ref_rows = as_rows(y)[keep], as_rows(ref)[keep]
    if dtype == torch.float16:
        ref_rows = ref_rows.to(dtype).double()  # subnormal fp16 outputs: compare as rounded
    assert relative_error(y_rows, ref_rows) < TOLERANCES[dtype_name]
    assert (as_rows(y)[1, ::3] == 0).all()


def test_index_hints():
    """EVEN only where the rows fill the blocks; INT32 only where the largest offset the kernel
    forms (padded rows and columns included) is below 2^31; neither unless the config asks."""
    hints = softmax_module._index_hints
    tile = Config("tile", 8, 128, 4, even=True, int32=True)
    assert hints(tile, (1, 64), [(0, 128, 1)] * 2, 128) == dict(
        EVEN=True, INT32=True, ONE_OUTER=True, DENSE=True
    )
    assert hints(tile, (1, 60), [(0, 128, 1)] * 2, 128)["EVEN"] is False  # ragged rows
    assert hints(tile, (1, 64), [(0, 128, 1)] * 2, 100)["EVEN"] is False  # ragged columns
    assert hints(tile._replace(even=False, int32=False), (1, 64), [(0, 128, 1)] * 2, 128) == dict(
        EVEN=False, INT32=False, ONE_OUTER=True, DENSE=True
    )
    # 2^24 rows of 128: the last offset is 2^31 - 1, just inside; one more row is not
    assert hints(tile, (1, 2**24), [(0, 128, 1)] * 2, 128)["INT32"] is True
    assert hints(tile, (1, 2**24 + 8), [(0, 128, 1)] * 2, 128)["INT32"] is False
    # the output's strides count too, and the outer dim, and padded rows past the end
    assert hints(tile, (1, 64), [(0, 128, 1), (0, 2**26, 1)], 128)["INT32"] is False
    assert hints(tile, (2**10, 2**13), [(2**20, 128, 1)] * 2, 128)["INT32"] is True
    assert hints(tile, (2**10, 2**13), [(2**21 + 2**11, 128, 1)] * 2, 128)["INT32"] is False
    assert hints(tile, (1, 2**24 - 1), [(0, 128, 1)] * 2, 128)["INT32"] is True
    assert hints(tile, (1, 2**24 - 1), [(0, 128, 2)] * 2, 128)["INT32"] is False
    online = Config("online", 1, 4096, 4, even=True)
    assert hints(online, (1, 5), [(0, 8192, 1)] * 2, 8192)["EVEN"] is True  # two whole steps
    assert hints(online, (1, 5), [(0, 8192, 1)] * 2, 8000)["EVEN"] is False


def test_lean_index_hints():
    """Config.lean (round 23): ONE_OUTER where the rows have one outer index; DENSE where every
    tensor's rows are the block's columns apart, with unit column strides; the online loop's
    ONE_STEP where a row is one step (any column count up to the step, masks or not); none
    without lean; ONE_STEP is the online kernel's only."""
    hints = softmax_module._index_hints
    tile = Config("tile", 8, 128, 4, even=True, int32=True)
    assert hints(tile, (1, 64), [(0, 128, 1)] * 2, 128)["ONE_OUTER"] is True
    assert hints(tile, (3, 64), [(8192, 128, 1)] * 2, 128)["ONE_OUTER"] is False
    assert hints(tile, (3, 64), [(8192, 128, 1)] * 2, 128)["DENSE"] is True
    assert hints(tile, (1, 64), [(0, 128, 1), (0, 256, 1)], 128)["DENSE"] is False  # y's rows
    assert hints(tile, (1, 64), [(0, 128, 1)] * 2, 100)["DENSE"] is False  # padded columns
    assert hints(tile, (1, 64), [(0, 128, 2)] * 2, 128)["DENSE"] is False
    assert "ONE_STEP" not in hints(tile, (1, 64), [(0, 128, 1)] * 2, 128)
    online = Config("online", 1, 4096, 16, even=True, int32=True)
    assert hints(online, (1, 5), [(0, 4096, 1)] * 2, 4096)["ONE_STEP"] is True
    assert hints(online, (1, 5), [(0, 4096, 1)] * 2, 4000)["ONE_STEP"] is False
    assert hints(online._replace(block_cols=2048), (1, 5), [(0, 4096, 1)] * 2, 4096)[
        "ONE_STEP"] is False  # fmt: skip
    old = hints(online._replace(lean=False), (1, 5), [(0, 4096, 1)] * 2, 4096)
    assert not (old["ONE_OUTER"] or old["ONE_STEP"] or old["DENSE"])


@pytest.mark.parametrize(
    "shape, split, config",
    [
        ((37, 128), False, Config("tile", 8, 128, 4, even=True, int32=True)),  # ragged last tile
        ((3, 40, 128), False, Config("tile", 16, 128, 4)),
        ((4, 6, 100), True, Config("tile", 4, 128, 4)),
        ((9, 4096), False, Config("online", 1, 4096, 16, evict=True, exp2=1, even=True,
                                  int32=True)),  # fmt: skip
        ((9, 3001), False, Config("online", 1, 4096, 4, evict=True, exp2=1, even=True,
                                  int32=True)),  # fmt: skip
        ((5, 7, 1024), True, Config("online", 1, 1024, 4, even=True, int32=True)),
    ],
    ids=["tile_even", "tile", "tile_two_row_dims", "online_one_step", "online_masked",
         "online_two_row_dims"],
)  # fmt: skip
def test_lean_is_the_same_softmax(shape, split, config, device):
    """Config.lean's index and loop code (round 23) against the code before it: the same bits,
    and the float64 softmax, on rows with -inf entries, an all -inf row and +-1e4. split: the
    two leading dims laid out so that they do not merge (rows_outer > 1, no ONE_OUTER)."""
    x = torch.randn(shape, device=device) * 4
    rows = x.view(-1, shape[-1])
    rows[1, : shape[-1] // 3] = -float("inf")
    rows[2] = -float("inf")
    rows[3, 5], rows[3, 6] = 1e4, -1e4
    if split:  # the same values, dim 1 outermost in memory
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
        assert softmax_module._row_dims([x, torch.empty_like(x)])[0][0] == shape[0]
    y = _forward(x, -1, direct, config)
    y_old = _forward(x, -1, direct, config._replace(lean=False))
    torch.testing.assert_close(y, y_old, rtol=0, atol=0, equal_nan=True)
    ref = torch.softmax(x.double(), -1)
    finite = ~torch.isnan(ref)
    assert torch.isnan(y[~finite]).all()
    assert relative_error(y[finite], ref[finite]) < TOLERANCES["fp32"]


def test_round14_knobs_are_forward_knobs(device):
    x = torch.randn(8, 128, device=device)
    for config in (Config("tile", 8, 128, 4, even=True), Config("online", 1, 128, 4, int32=True)):
        with pytest.raises(ValueError, match="even and int32 are knobs of the tile/online forward"):
            _backward(x, x, -1, direct, config)
    with pytest.raises(ValueError, match="even and int32 are knobs"):
        _forward(x, -1, direct, Config("split2", 1, 64, 4, int32=True))
    with pytest.raises(ValueError, match="fold is a knob of the smem forward"):
        _forward(x, -1, direct, Config("split2", 1, 64, 4, fold=True))
    with pytest.raises(ValueError, match="fold is a knob of the smem forward"):
        _forward(x, -1, direct, Config("split2", 1, 64, 4, fold=2))
    with pytest.raises(ValueError, match="fold is 0, 1 .* or 2"):
        _forward(x, -1, direct, Config("smem", 1, 64, 4, fold=3))


def test_held_pieces_are_a_one_shot_smem_forward_knob(device):
    x = torch.randn(8, 128, device=device)
    for config in (Config("split2", 1, 64, 4, regs=1), Config("smem", 1, 64, 4, regs=1, per_sm=1)):
        with pytest.raises(ValueError, match="regs is a knob of the one-shot smem forward"):
            _forward(x, -1, direct, config)
    with pytest.raises(ValueError, match="regs is a knob"):
        _backward(x, x, -1, direct, Config("smem", 1, 64, 4, regs=1))


def test_chunks_by_program_id_are_a_one_shot_smem_knob(device):
    x = torch.randn(8, 128, device=device)
    for config in (
        Config("split2", 1, 64, 4, by_pid=True),
        Config("smem", 1, 64, 4, by_pid=True, regs=1),
    ):
        with pytest.raises(ValueError, match="by_pid is a knob of the one-shot smem kernels"):
            _forward(x, -1, direct, config)
    # the persistent forward takes it since round 22 (here it needs the GPU the smem design
    # does); the backward's one-shot kernel since round 21, its persistent kernel not
    with pytest.raises(ValueError, match="needs a GPU"):
        _forward(x, -1, direct, Config("smem", 1, 64, 4, by_pid=True, per_sm=1))
    for config in (Config("smem", 1, 64, 4, by_pid=True, per_sm=-1),
                   Config("coop", 1, 64, 4, by_pid=True)):  # fmt: skip
        with pytest.raises(ValueError, match="by_pid is a knob of the one-shot smem kernels"):
            _backward(x, x, -1, direct, config)


@pytest.mark.parametrize("lanes", [1, 2, 3, 4])
@pytest.mark.parametrize("dtype_name", ["fp32", "fp16"])
@pytest.mark.parametrize("n, block_cols", [(4096, 4096), (3001, 1024), (700, 1024)])
def test_online_lanes(n, block_cols, dtype_name, lanes, device):
    """Config.lanes (round 23; 2-4, round 24: libdevice's exp, Inductor's max): the online loop's
    first pass lane by lane, over one step, three masked steps, and one padded step; rows with
    -inf runs, an all -inf row (NaN, as torch), +-1e4 and equal values, against float64. The
    interpreter has no extern calls: there libdevice's exp is tl.exp (LIBDEVICE off); the GPU
    run covers it."""
    dtype = DTYPES[dtype_name]
    x = torch.randn(7, n, device=device) * 4
    x[1, : n // 2] = -float("inf")
    x[2] = -float("inf")
    x[3, n - 1], x[3, 0] = 1e4, -1e4
    x[4] = 2.5
    x = x.to(dtype)
    config = Config("online", 1, block_cols, 4, evict=True, exp2=1, even=True, int32=True,
                    lanes=lanes)  # fmt: skip
    y = _forward(x, -1, direct, config)
    ref = torch.softmax(x.double(), -1)
    assert torch.isnan(y[2]).all()
    keep = [0, 1, 3, 4, 5, 6]
    assert relative_error(y[keep], ref[keep]) < TOLERANCES[dtype_name]
    torch.testing.assert_close(y[keep].double().sum(-1), torch.ones(6, dtype=torch.float64,
                               device=device), rtol=0, atol=TOLERANCES[dtype_name])  # fmt: skip


@pytest.mark.parametrize("knob", ["store_default", "lanes"])
def test_online_forward_knobs(knob, device):
    """Config.store_default (round 22) and Config.lanes (round 23): the online forward's only."""
    x = torch.randn(8, 128, device=device)
    with pytest.raises(ValueError, match=f"{knob} is a knob of the online forward"):
        _forward(x, -1, direct, Config("tile", 1, 128, 4, **{knob: True}))
    with pytest.raises(ValueError, match=f"{knob} is a knob of the online forward"):
        _backward(x, x, -1, direct, Config("online", 1, 128, 4, **{knob: True}))


def test_one_copy_is_a_one_shot_smem_forward_knob(device):
    x = torch.randn(8, 128, device=device)
    for config in (Config("split2", 1, 64, 4, one_copy=True),
                   Config("smem", 1, 64, 4, one_copy=True, per_sm=1),
                   Config("smem", 1, 64, 4, one_copy=True, fold=2),
                   Config("smem", 1, 64, 4, one_copy=True, regs=1)):  # fmt: skip
        with pytest.raises(ValueError, match="one_copy is a knob of the one-shot smem forward"):
            _forward(x, -1, direct, config)
    with pytest.raises(ValueError, match="one_copy is a knob of the one-shot smem forward"):
        _backward(x, x, -1, direct, Config("smem", 1, 64, 4, one_copy=True))


def test_left_group_is_a_one_shot_smem_forward_by_pid_knob(device):
    x = torch.randn(8, 128, device=device)
    for config in (Config("split2", 1, 64, 4, left_group=4),
                   Config("smem", 1, 64, 4, left_group=4),
                   Config("smem", 1, 64, 4, left_group=4, by_pid=True, per_sm=1)):  # fmt: skip
        with pytest.raises(ValueError, match="left_group is a knob of the one-shot smem forward"):
            _forward(x, -1, direct, config)
    with pytest.raises(ValueError, match="left_group is a knob of the one-shot smem forward"):
        _backward(x, x, -1, direct, Config("smem", 1, 64, 4, left_group=4, by_pid=True))


def test_poly_exp2_is_a_one_shot_smem_forward_knob(device):
    x = torch.randn(8, 128, device=device)
    for config in (Config("split2", 1, 64, 4, poly=1), Config("smem", 1, 64, 4, poly=1, per_sm=1),
                   Config("tile", 1, 128, 4, poly=2)):  # fmt: skip
        with pytest.raises(ValueError, match="poly is a knob of the one-shot smem forward"):
            _forward(x, -1, direct, config)
    with pytest.raises(ValueError, match="poly is a knob of the one-shot smem forward"):
        _backward(x, x, -1, direct, Config("smem", 1, 64, 4, poly=1))


@pytest.mark.parametrize(
    "knobs, match",
    [
        (dict(by_pid=True, programs=132, backward=True), "by_pid is a knob of the one-shot"),
        (dict(by_pid=True, regs=1), "by_pid is a knob of the one-shot"),
        (dict(by_pid=True, leave_polls=0), "leaving after at least 1 poll"),
        (dict(by_pid=True, leave_polls=0, backward=True), "leaving after at least 1 poll"),
        (dict(even=True, programs=132), "even is a knob of the one-shot kernels"),
        (dict(even=True, programs=132, backward=True), "even is a knob of the one-shot kernels"),
        (dict(transpose=True), "transpose orders the program ids of by_pid"),
        (dict(transpose=True, by_pid=True, programs=132), "transpose orders the program ids"),
        (dict(poly=1), "poly .1 or 2. is a knob of the one-shot 16-bit forward"),  # fp32 rows
        (dict(poly=1, backward=True, half=True), "poly .1 or 2. is a knob"),
        (dict(poly=3, half=True), "poly .1 or 2. is a knob"),
        (dict(poly=1, programs=132, half=True), "poly .1 or 2. is a knob"),
        (dict(one_copy=True, backward=True), "one_copy is a knob of the one-shot forward"),
        (dict(one_copy=True, fold=2), "one_copy is a knob of the one-shot forward"),
        (dict(one_copy=True, programs=132), "one_copy is a knob of the one-shot forward"),
        (dict(left_group=4), "left_group is a knob of the one-shot forward by program id"),
        (dict(left_group=4, by_pid=True, backward=True), "left_group is a knob"),
        (dict(left_group=4, by_pid=True, programs=132), "left_group is a knob"),
        (dict(left_group=3, by_pid=True), "left_group is a knob"),
        (dict(left_group=16, by_pid=True), "left_group is a knob"),  # 8 pieces a chunk
    ],
)
def test_smem_launch_refuses_knobs_it_cannot_run(knobs, match):
    """softmax_smem.launch checks before it launches (no GPU needed)."""
    if softmax_module.softmax_smem is None:
        pytest.skip("this Triton has no Gluon")
    x = torch.empty(2, 4096, dtype=torch.bfloat16 if knobs.pop("half", False) else torch.float32)
    backward = knobs.pop("backward", False)
    tensors = [x, x, x] if backward else [x, x]
    with pytest.raises(ValueError, match=match):
        softmax_module.softmax_smem.launch(
            lambda k: None, backward, tensors, x, None, (1, 2), [(0, 4096, 1)] * len(tensors),
            4096, 4, **knobs,
        )  # fmt: skip


@pytest.mark.parametrize(
    "programs, n_slots, n_chunks, grid",
    [
        (396, 8192, 16, 384),  # 512 rows of 16 chunks: 24 rows a round (21.3 rounds)
        (396, 8192, 4, 392),  # 2048 rows of 4: 99 a round fit, 21 rounds of 98 even them out
        (264, 8192, 16, 256),  # 16 rows a round: 32 rounds exactly
        (100, 6 * 128, 128, 128),  # fewer programs than a row's chunks: still one whole row
        (396, 48, 16, 48),  # 3 rows: one round
    ],
)
def test_persistent_by_pid_grid(programs, n_slots, n_chunks, grid):
    """The persistent forward by program id (round 22) runs on whole rows a round: a multiple
    of n_chunks, at most `programs` where a row fits, over as few rounds as `programs` allow,
    as even as whole rows let them be; its launch takes that grid."""
    if softmax_module.softmax_smem is None:
        pytest.skip("this Triton has no Gluon")
    smem = softmax_module.softmax_smem
    got = smem.pid_programs(programs, n_slots, n_chunks)
    assert got == grid
    assert got % n_chunks == 0 and (got <= programs or got == n_chunks)
    n_rows, per_round = n_slots // n_chunks, max(1, programs // n_chunks)
    assert -(-n_slots // got) == -(-n_rows // per_round)  # no more rounds than needed
    launched = []

    class Record:  # a launcher that records the grid and the meta instead of launching
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append((grid, meta))

    chunk = 1024
    x = torch.empty(n_slots // n_chunks, n_chunks * chunk)
    ws = torch.zeros(smem.workspace_words(n_slots, n_chunks, True), dtype=torch.int64)
    smem.launch(lambda kernel: Record(), False, [x, x], ws, None, (1, x.shape[0]),
                [(0, x.shape[1], 1)] * 2, chunk, 4, programs=programs, by_pid=True,
                even=True)  # fmt: skip
    (launch_grid, meta), = launched
    assert launch_grid == (grid,)
    assert meta["BY_PID"] and meta["EVEN"] and "TRANSPOSE" not in meta


def test_smem_launch_refuses_a_short_workspace():
    """Chunks by program id take a count word a row and a left flag a chunk past the slots:
    a workspace sized for the ticket alone is refused, not written past its end."""
    if softmax_module.softmax_smem is None:
        pytest.skip("this Triton has no Gluon")
    smem = softmax_module.softmax_smem
    x = torch.empty(3, 8192)
    assert smem.workspace_words(6, 2, False) == 7
    assert smem.workspace_words(6, 2, True) == 16  # 6 slots, the counter, 3 counts, 6 flags
    ws = torch.zeros(7, dtype=torch.int64)
    launched = []

    class Record:  # a launcher that records the grid instead of launching
        def __getitem__(self, grid):
            return lambda *args, **meta: launched.append(grid)

    smem.launch(lambda kernel: Record(), False, [x, x], ws, None, (1, 3), [(0, 8192, 1)] * 2,
                4096, 4)  # the ticket: 7 words are enough
    assert launched == [(6,)]
    with pytest.raises(ValueError, match="short of the 16"):
        smem.launch(lambda k: None, False, [x, x], ws, None, (1, 3), [(0, 8192, 1)] * 2, 4096,
                    4, by_pid=True)  # fmt: skip
    with pytest.raises(ValueError, match="short of the 16"):  # the backward's too (round 21)
        smem.launch(lambda k: None, True, [x, x, x], ws, None, (1, 3), [(0, 8192, 1)] * 3, 4096,
                    4, by_pid=True)  # fmt: skip


@pytest.mark.parametrize("regs", [3, 8, 16])
def test_held_pieces_are_a_power_of_2_below_the_chunk(regs):
    """softmax_smem.launch refuses held pieces it cannot lay out (no GPU needed: it checks
    before it launches)."""
    if softmax_module.softmax_smem is None:
        pytest.skip("this Triton has no Gluon")
    x = torch.empty(2, 4096)  # fp32, 4 warps: pieces of 512 values, 8 a chunk of 4096
    with pytest.raises(ValueError, match=f"regs = {regs}: pieces held in registers"):
        softmax_module.softmax_smem.launch(
            lambda k: None, False, [x, x], x, None, (1, 2), [(0, 4096, 1)] * 2, 4096, 4, regs=regs
        )


def test_rescale_is_a_plain_split_forward_knob(device):
    x = torch.randn(4, 300, device=device)
    for config in (
        Config("tile", 1, 512, 4, rescale=True),
        Config("split2", 1, 128, 4, rescale=True, loop_cols=64),
        Config("split2", 1, 128, 4, rescale=True, pairs=True),
    ):
        with pytest.raises(ValueError, match="rescale is a knob of the plain coop/split2 forward"):
            _forward(x, -1, direct, config)
    with pytest.raises(ValueError, match="rescale is a knob"):
        _backward(x, x, -1, direct, Config("split2", 1, 128, 4, rescale=True))


def test_round8_probe_candidates_are_valid():
    """Round 8: forward long rows only, coop chunks that fit, rescale on all but controls."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            assert probe.round8_candidates(n, itemsize, True) == {}
            cands = probe.round8_candidates(n, itemsize, False)
            assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
            for name, cfg in cands.items():
                assert cfg.design == "coop" and not cfg.pairs and not cfg.loop_cols, name
                assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                assert cfg.rescale == ("_rs" in name), name


@pytest.mark.parametrize("block_rows, counter, pairs", [(1, False, False), (4, True, False),
                                                        (1, True, True)])  # fmt: skip
@pytest.mark.parametrize("backward", [False, True])
def test_coop_clears_the_next_workspace(block_rows, counter, pairs, backward, device):
    """A launch with CLEAR zeroes every word of the workspace the next launch takes (slots,
    arrival counters, ticket), whatever its rows, chunks and row blocks. Run as the publishing
    launch of split2 (the interpreter cannot wait), over a workspace full of garbage."""
    rows, n, chunk = 7, 1000, 128
    n_chunks, row_blocks = -(-n // chunk), -(-rows // block_rows)
    n_slots = rows * n_chunks
    n_ws = n_slots + 1 + (rows if counter else 0)
    dtype = torch.bfloat16 if pairs else torch.float32
    n_tensors = 3 if backward else 2
    tensors = [torch.randn(rows, n, device=device, dtype=dtype) for _ in range(n_tensors)]
    strides = [0, n, 1] * len(tensors)
    if pairs:
        tensors = [t.view(torch.int32) for t in tensors]
        strides, n, chunk = [0, n // 2, 1] * len(tensors), n // 2, chunk // 2
    name = ("softmax_backward_split" if backward else "softmax_split") + ("_pairs" if pairs else "")
    kernel = getattr(softmax_module, name + "_kernel")
    ws = torch.empty(n_slots, device=device, dtype=torch.int64)
    next_ws = torch.full((n_ws,), -5, device=device, dtype=torch.int64)
    extra = dict(HALF=1) if pairs else {}
    kernel[(row_blocks * n_chunks,)](
        *tensors, ws, rows, n, n_chunks, n_slots, *strides,
        BLOCK_ROWS=block_rows, CHUNK=chunk, MAX_CHUNKS=8, PHASE=0, REVERSE=False,
        COUNTER=counter, CLEAR=True, next_ptr=next_ws, **extra,
    )  # fmt: skip
    assert (next_ws == 0).all(), next_ws


def test_round9_probe_candidates_are_valid():
    """Round 9: long rows only; pairs only in the 16-bit backward; the forward as shipped."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            for backward in (False, True):
                cands = probe.round9_candidates(n, itemsize, backward)
                assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
                for name, cfg in cands.items():
                    assert cfg.design == "coop" and not cfg.loop_cols, name
                    assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                    assert cfg.pairs == (backward and itemsize == 2), name
                    assert cfg.rescale == (not backward), name
                    assert ("_ev" in name) == cfg.evict, name


def test_coop_workspace_cache_is_bounded(monkeypatch):
    """Workspaces of ever-new sizes do not pile up: past COOP_WORKSPACE_SIZES the oldest goes;
    a size asked again gets its own pair back, zeroed buffers, index 0."""
    monkeypatch.setattr(softmax_module, "_COOP_WORKSPACES", {})
    cpu = torch.device("cpu")
    first = softmax_module._coop_workspace(10, cpu)
    assert softmax_module._coop_workspace(10, cpu) is first
    assert first[2] == 0 and all((b == 0).all() and b.numel() == 10 for b in first[:2])
    for n in range(11, 11 + 2 * softmax_module.COOP_WORKSPACE_SIZES):
        softmax_module._coop_workspace(n, cpu)
    assert len(softmax_module._COOP_WORKSPACES) == softmax_module.COOP_WORKSPACE_SIZES
    assert softmax_module._coop_workspace(10, cpu) is not first  # dropped, made anew


def test_round3_bad_loop(device):
    x = torch.randn(4, 300, device=device)
    with pytest.raises(ValueError, match="loop of 48 for chunks of 128"):
        _forward(x, -1, direct, Config("split2", 1, 128, 4, loop_cols=48))


# Round 9 (kernels/notes/softmax.md): 16-bit chunks held as int32 pairs, with a register cap
PAIRS = {
    "pairs": Config("split2", 1, 256, 4, pairs=True),
    "pairs_exp2fma_counter_capped": Config(
        "split2", 1, 128, 4, pairs=True, exp2=2, counter=True, maxnreg=40
    ),
}


def _launched(call) -> list[str]:
    """Names of the kernels `call(launch)` launches."""
    names = []

    def launch(kernel):
        names.append(kernel.__name__)
        return kernel

    call(launch)
    return names


@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero encountered")
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
@pytest.mark.parametrize("config_name", PAIRS)
def test_pairs_extremes_views_and_fallback(config_name, dtype_name, device):
    config = PAIRS[config_name]
    dtype = DTYPES[dtype_name]
    n = 1038  # even: 519 pairs, chunks of 128 or 256 values with a short last one
    x = torch.randn(7, n, device=device) * 3
    x[0] *= 1e4 if dtype != torch.float16 else 1e3  # exp overflows without the max shift
    x[1, :700] = -float("inf")  # whole chunks of -inf first
    x[2] = 3.25  # all equal
    x[3, ::3] = -float("inf")  # pairs with one -inf half, either half
    x[4] = -float("inf")  # NaN, as torch gives
    x[5, n - 1] = 1e4  # the maximum in the high half of the last pair
    # a view at an even offset with an even row stride: pairs fit
    x = torch.empty(7, n + 6, device=device, dtype=dtype)[:, 2 : n + 2].copy_(x)
    ref = torch.softmax(x.double(), -1)
    if dtype == torch.float16:
        ref = ref.to(dtype).double()  # subnormal fp16 outputs: compare as rounded
    keep = [0, 1, 2, 3, 5, 6]

    out = {}
    names = _launched(lambda launch: out.update(y=_forward(x, -1, launch, config)))
    assert names == ["softmax_split_pairs_kernel"] * 2  # split2: partials, then finish
    y = out["y"]
    assert torch.isnan(y[4]).all()
    assert relative_error(y[keep], ref[keep]) < TOLERANCES[dtype_name]
    assert (y[1, :700] == 0).all() and (y[3, ::3] == 0).all()

    # the backward on an even-offset view of y and of dy: pairs again
    yk = torch.empty(len(keep), n + 2, device=device, dtype=dtype)[:, 2:].copy_(y[keep])
    dy = torch.randn(len(keep), n + 4, device=device, dtype=dtype)[:, 4:]
    names = _launched(lambda launch: out.update(dx=_backward(yk, dy, -1, launch, config)))
    assert names == ["softmax_backward_split_pairs_kernel"] * 2
    y64, dy64 = yk.double(), dy.double()
    dx_ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    assert relative_error(out["dx"], dx_ref) < TOLERANCES[dtype_name]

    # rows the pairs cannot address take the plain kernel: an odd offset, an odd row length
    wide = torch.randn(3, n + 6, device=device, dtype=dtype)
    for rows in (wide[:, 1 : n + 1], wide[:, : n - 1]):
        names = _launched(lambda go, rows=rows: out.update(y=_forward(rows, -1, go, config)))
        assert names == ["softmax_split_kernel"] * 2
        assert relative_error(out["y"], torch.softmax(rows.double(), -1)) < TOLERANCES[dtype_name]


@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_pairs_ignore_the_stride_of_a_size_one_dim(dtype_name, device):
    """A (1, n) view whose size-1 dim has an odd stride: torch will not view it as int32, but
    its rows are still pairs (the kernels read the merged row dims)."""
    dtype, n = DTYPES[dtype_name], 1000
    rows = torch.randn(3, 4, n + 1, device=device, dtype=dtype)[:1, :, :n]  # stride (.., n+1, 1)
    rows = rows[:, :1]  # (1, 1, n): both row dims of size 1, strides 4(n+1) and n+1 (odd)
    out = {}
    names = _launched(lambda go: out.update(y=_forward(rows, -1, go, PAIRS["pairs"])))
    assert names == ["softmax_split_pairs_kernel"] * 2
    assert relative_error(out["y"], torch.softmax(rows.double(), -1)) < TOLERANCES[dtype_name]
    # the backward's formula holds for any y: the strided rows themselves stand in for it
    dy = torch.randn(1, 1, n, device=device, dtype=dtype)
    names = _launched(lambda go: out.update(dx=_backward(rows, dy, -1, go, PAIRS["pairs"])))
    assert names == ["softmax_backward_split_pairs_kernel"] * 2
    y64, dy64 = rows.double(), dy.double()
    dx_ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    assert relative_error(out["dx"], dx_ref) < TOLERANCES[dtype_name]


def test_pairs_leave_fp32_to_the_plain_kernel(device):
    x = torch.randn(3, 1000, device=device)
    out = {}
    names = _launched(lambda launch: out.update(y=_forward(x, -1, launch, PAIRS["pairs"])))
    assert names == ["softmax_split_kernel"] * 2
    assert relative_error(out["y"], torch.softmax(x.double(), -1)) < TOLERANCES["fp32"]


def test_round7_probe_candidates_are_valid():
    """Round 7: long rows only; pairs only for 16-bit rows; caps only where they are named."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            for backward in (False, True):
                cands = probe.round7_candidates(n, itemsize, backward)
                if n <= softmax_module.ONE_PASS_MAX_ELEMS:
                    assert cands == {}
                    continue
                assert bool(cands) == (itemsize == 2 or not backward)
                for name, cfg in cands.items():
                    assert cfg.design == "coop" and cfg.block_cols <= 16384, name
                    assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                    assert cfg.pairs == name.startswith("p"), name
                    assert cfg.pairs <= (itemsize == 2), name
                    assert (f"_r{cfg.maxnreg}" in name) == bool(cfg.maxnreg), name


def test_round10_probe_candidates_are_valid():
    """Round 10: long rows only; smem chunks of whole pieces, one shared-memory budget, at most
    MAX_SPLIT_CHUNKS a row; the coop baseline is what _pick_config chose before smem."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            for backward in (False, True):
                cands = probe.round10_candidates(n, itemsize, backward)
                assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
                for name, cfg in cands.items():
                    if name == "coop":
                        assert cfg.design in ("coop", "split2"), cfg
                        continue
                    assert cfg.design == "smem" and cfg.block_rows == 1, name
                    assert cfg.block_cols % (16 // itemsize * 32 * cfg.num_warps) == 0, name
                    assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                    inputs = 2 if backward else 1
                    assert inputs * cfg.block_cols * itemsize <= softmax_module.SMEM_MAX_BYTES
                    assert ("_ev" in name) == cfg.evict, name


def test_round11_probe_candidates_are_valid():
    """Round 11: N = 16384 and past it; one-shot (s) and persistent (p) smem kernels with chunks
    of whole pieces (8 a chunk for the persistent ones), at most MAX_SPLIT_CHUNKS a row, and
    a program's buffers within SMEM_MAX_BYTES."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            for backward in (False, True):
                cands = probe.round11_candidates(n, itemsize, backward)
                assert bool(cands) == (n >= softmax_module.ONE_PASS_MAX_ELEMS)
                assert any(name.startswith("p") for name in cands) == bool(cands)
                inputs = 2 if backward else 1
                for name, cfg in cands.items():
                    assert cfg.design == "smem" and cfg.block_rows == 1, name
                    piece = 16 // itemsize * 32 * cfg.num_warps
                    assert cfg.block_cols % piece == 0, name
                    assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                    buffers = 2 if name.startswith("p") else 1
                    assert (cfg.per_sm == -1) == (buffers == 2), name
                    assert cfg.block_cols // piece == 8 or buffers == 1, name
                    assert buffers * inputs * cfg.block_cols * itemsize <= (
                        softmax_module.SMEM_MAX_BYTES
                    ), name


def test_round11_probe_smoke():
    """The probe's round 11 on the interpreter (persistent smem variants run as split2)."""
    out = _probe_smoke("--round11")
    assert "p8K_w4" in out and " 16384 " in out


@pytest.mark.parametrize(
    ("config", "itemsize", "backward", "programs"),
    [
        (Config("smem", 1, 8192, 4, per_sm=-1), 2, False, 132 * 6),  # 32 KB: 6 an SM
        (Config("smem", 1, 4096, 2, per_sm=-1), 2, False, 132 * 12),  # 16 KB: 12
        (Config("smem", 1, 2048, 1, per_sm=-1), 2, False, 132 * 22),  # 8 KB: 22
        (Config("smem", 1, 4096, 4, per_sm=-1), 2, True, 132 * 6),  # y and dy: 32 KB
        (Config("smem", 1, 1024, 16, per_sm=-1), 4, False, 132 * 4),  # the warps bind
        (Config("smem", 1, 8192, 4, per_sm=3), 2, False, 132 * 3),
        (Config("smem", 1, 8192, 4), 2, False, 0),  # one-shot: a program a chunk
    ],
)
def test_persistent_smem_grid(monkeypatch, config, itemsize, backward, programs):
    """Config.per_sm picks the persistent smem kernels: -1 gives as many programs an SM as
    their two chunk buffers (each input's) let shared memory hold, and the warps allow."""
    seen = {}
    monkeypatch.setattr(softmax_module, "is_interpreter", lambda: False)
    monkeypatch.setattr(softmax_module.softmax_smem, "launch",
                        lambda *args, **kwargs: seen.update(kwargs))  # fmt: skip
    dtype = torch.bfloat16 if itemsize == 2 else torch.float32
    x = torch.randn(2, 65536, dtype=dtype)
    with pretend_gpu((9, 0), 132):
        if backward:
            _backward(x, x.clone(), -1, direct, config)
        else:
            _forward(x, -1, direct, config)
    assert seen["programs"] == programs


def test_round12_probe_candidates_are_valid():
    """Round 12: the forward at N <= 16384 only; tiles that fit ONE_PASS_MAX_ELEMS and hold
    whole rows, the online loop only at N = 16384, each with its _ev twin."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            assert not probe.round12_candidates(n, itemsize, True)
            cands = probe.round12_candidates(n, itemsize, False)
            assert bool(cands) == (n <= softmax_module.ONE_PASS_MAX_ELEMS)
            for name, cfg in cands.items():
                if cfg.design == "online":
                    assert n == softmax_module.ONE_PASS_MAX_ELEMS and n % cfg.block_cols == 0
                    assert cfg.evict == name.endswith("_ev") and name.removesuffix("_ev") in cands
                    continue
                assert cfg.design == "tile" and cfg.block_cols >= n, name
                assert cfg.block_rows * cfg.block_cols <= softmax_module.ONE_PASS_MAX_ELEMS


def test_round12_probe_smoke():
    """The probe's round 12 on the interpreter, Inductor's kernels compiled for the CPU."""
    out = _probe_smoke("--round12")
    assert "online_4K_w16_ev" in out and "inductor_mac" in out and "t4K_w2" in out


def test_round13_probe_candidates_are_valid():
    """Round 13: the forward at N <= 16384 only; the 16 KB tile, and from N = 1024 the looped
    form with the whole padded row a step, each with its _ev twin (evict_last, then
    evict_first)."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            assert not probe.round13_candidates(n, itemsize, True)
            cands = probe.round13_candidates(n, itemsize, False)
            assert bool(cands) == (n <= softmax_module.ONE_PASS_MAX_ELEMS)
            if not cands:
                continue
            tile = cands.pop("tile16K")
            assert tile.design == "tile" and tile.block_cols >= n
            assert tile.block_rows * tile.block_cols * itemsize in (16384, n * itemsize)
            assert bool(cands) == (n >= 1024)
            for name, cfg in cands.items():
                assert cfg.design == "online" and cfg.block_cols == triton.next_power_of_2(n)
                assert cfg.evict == name.endswith("_ev") and name.removesuffix("_ev") in cands


def test_round13_probe_smoke():
    """The probe's round 13 on the interpreter, Inductor's kernels compiled for the CPU afresh
    for each shape."""
    out = _probe_smoke("--round13")
    assert "loop_w16_ev" in out and "default_ev" in out and "inductor_mac" in out


def test_round14_probe_candidates_are_valid():
    """Round 14, the forward only: at N <= 16384 the pick with even / int32 / both (and other
    tiles with both where the pick is a tile); past it, the smem pick folded, and smem chunks of
    64 and 16 KB, each with its folded twin."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            assert not probe.round14_candidates(n, itemsize, True)
            cands = probe.round14_candidates(n, itemsize, False)
            if n <= softmax_module.ONE_PASS_MAX_ELEMS:
                pick = softmax_module._pick_config(n, 2**20, False, False, torch.device("cpu"),
                                                   itemsize)  # fmt: skip
                assert cands.pop("default_ui") == pick._replace(even=True, int32=True)
                assert cands.pop("default_u") == pick._replace(even=True)
                assert cands.pop("default_i") == pick._replace(int32=True)
                assert bool(cands) == (pick.design == "tile")
                for name, cfg in cands.items():
                    assert name.endswith("_ui") and cfg.even and cfg.int32
                    assert cfg.design == "tile" and cfg.block_cols == n
                continue
            with pretend_gpu((9, 0), 132):
                assert probe.round14_candidates(n, itemsize, False) == cands
            assert cands.pop("default_fold").fold
            assert len(cands) == 4
            for name, cfg in cands.items():
                kbytes = cfg.block_cols * itemsize // 1024
                assert cfg.design == "smem" and kbytes in (16, 64) and name.startswith("s")
                assert cfg.fold == name.endswith("_fold")
                assert cfg.num_warps == (16 if kbytes == 64 else 4)


def test_round14_probe_smoke():
    """The probe's round 14 on the interpreter: the even / int32 tiles and row loops beside
    Inductor's kernels, and the folded smem forward (run as split2 there)."""
    out = _probe_smoke("--round14")
    for name in ("default_ui", "t2K_w2_ui", "inductor_mac", "default_fold", "s32K_w16_fold"):
        assert name in out, name


@pytest.mark.parametrize("round_no", [15, 16])
def test_round15_16_probe_candidates_are_valid(round_no):
    """Rounds 15-16: forward tiles only, at the rows the pick gives a tile, each holding whole
    rows of the padded width, _ui twins with both index knobs."""
    probe = importlib.import_module("experiments.probe_softmax")
    candidates = getattr(probe, f"round{round_no}_candidates")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            assert not candidates(n, itemsize, True)
            cands = candidates(n, itemsize, False)
            pick = softmax_module._pick_config(n, 2**20, False, False, torch.device("cpu"),
                                               itemsize)  # fmt: skip
            assert bool(cands) == (pick.design == "tile")
            for name, cfg in cands.items():
                assert cfg.design == "tile" and cfg.block_cols == n and cfg.block_rows >= 1
                assert (cfg.even and cfg.int32) == name.endswith("_ui")


@pytest.mark.parametrize("round_flag", ["--round15", "--round16"])
def test_round15_16_probe_smoke(round_flag):
    out = _probe_smoke(round_flag)
    assert "t2K_w2_ui" in out and "inductor_mac" in out


def test_round10_probe_smoke():
    """The probe's round 10 on the interpreter: smem variants run as split2 there."""
    out = _probe_smoke("--round10")
    assert "s8K_w4_ev" in out and " coop " in out


def _probe_smoke(round_flag: str) -> str:
    """stdout of `probe_softmax <round_flag> --smoke` on the interpreter, which must exit 0
    with no variant FAILED (every variant checked against float64, timing stubbed)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "experiments.probe_softmax", round_flag, "--smoke"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "FAILED" not in run.stdout, run.stdout[-2000:]
    return run.stdout


def test_round7_probe_smoke():
    """The probe's round 7 on the interpreter (coop as split2), the pairs variants there."""
    out = _probe_smoke("--round7")
    assert "p16Kv_w16_r32" in out and "c4Kv_w4_r48" in out


def test_round3_probe_candidates_are_valid():
    """Every round 3 probe variant at the GPU shapes: a loop that divides its chunk, at most
    MAX_SPLIT_CHUNKS chunks a row (the coop wait needs them all resident), tiles that fit."""
    probe = importlib.import_module("experiments.probe_softmax")
    cpu = torch.device("cpu")
    for m, n in probe.ROWS:
        for itemsize in (2, 4):
            for backward in (False, True):
                pick = softmax_module._pick_config(n, m, False, backward, cpu, itemsize)
                for name, cfg in probe.round3_candidates(n, itemsize, backward, pick).items():
                    if cfg.design == "tile":
                        assert cfg.block_cols >= n and cfg.block_rows * cfg.block_cols <= 16384
                        assert cfg.exp2 == 0 or not backward
                        continue
                    if cfg.design == "online":
                        continue
                    assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                    assert cfg.loop_cols == 0 or cfg.block_cols % cfg.loop_cols == 0, name
                    assert cfg.loop_cols or cfg.block_cols <= 16384, name


def test_pick_config_chunks(monkeypatch, device):
    pick = softmax_module._pick_config
    monkeypatch.setattr(softmax_module, "ONE_PASS_MAX_ELEMS", 512)
    monkeypatch.setattr(softmax_module, "SPLIT_CHUNK_ELEMS", 64)
    monkeypatch.setattr(softmax_module, "MAX_SPLIT_CHUNKS", 16)
    cpu = torch.device("cpu")
    # the forward: no second exp after the wait (rescale), exp2; evict_first in 16-bit
    fwd = dict(rescale=True, exp2=1)
    assert pick(600, 3, False, False, cpu) == Config("split2", 1, 64, 4, **fwd)
    assert pick(600, 3, False, False, cpu, 2) == Config(
        "split2", 1, 64, 4, rescale=True, exp2=2, evict=True
    )
    # 2000 columns in chunks of 64 would be 32 > 16 chunks: chunks of 128 instead, with twice
    # the warps
    assert pick(2000, 3, False, False, cpu) == Config("split2", 1, 128, 8, **fwd)
    assert pick(9000, 3, False, False, cpu).design == "online"  # chunks would pass 512
    # the 16-bit backward, rows one a program: int32 pairs, the forward's chunk; adjacent rows
    # (an outer dim) keep the plain kernel and 16 KB chunks
    assert pick(600, 3, False, True, cpu, 2) == Config("split2", 1, 64, 4, pairs=True)
    assert pick(600, 3, False, True, cpu, 4) == Config("split2", 1, 512, 4)  # 16 KB, capped
    assert pick(200, 64, True, True, cpu, 2) == Config("split2", 32, 512 // 32, 4)
    # the same rows, long chunks on the path
    x = torch.randn(3, 2000, device=device)
    y = softmax(x, -1)
    assert relative_error(y, torch.softmax(x.double(), -1)) < TOLERANCES["fp32"]
    (dx,) = torch.autograd.grad(softmax(x.requires_grad_(), -1).sum(), x)
    assert dx.abs().max() < 1e-6  # the gradient of a constant sum is 0


def test_pick_config_takes_smem_where_the_rows_fit_it():
    """On a GPU, rows past the tile whose starts are 16-byte aligned (smem_ok) take the smem
    design: the forward one 32 KB chunk a program (round 10) by program id without masks where
    rows are whole chunks (round 20; 8 warps capped at SMEM_PID_MAXNREG registers), the backward
    16 KB chunks of y and of dy a program by program id, with masks (round 21; round 11's
    persistent kernels before); rows that do not fit keep coop. The forward's grids of several
    waves of 32 KB programs go behind lead programs (round 27), and a row's chunks are
    interleaved (round 28; the launch keeps whole chunks on rows that are not)."""
    pick = softmax_module._pick_config
    cpu = torch.device("cpu")
    pid = dict(by_pid=True, even=True)
    il = dict(interleave=True)  # the forward
    cap = softmax_module.SMEM_PID_MAXNREG
    with pretend_gpu((9, 0), 132):
        assert pick(65536, 512, False, False, cpu, 2, smem_ok=True) == Config(
            "smem", 1, 16384, 8, exp2=2, maxnreg=cap, **pid, **il
        )
        assert pick(65536, 512, False, True, cpu, 2, smem_ok=True) == Config(
            "smem", 1, 8192, 4, by_pid=True
        )
        assert pick(262144, 64, False, False, cpu, 4, smem_ok=True) == Config(
            "smem", 1, 8192, 4, exp2=1, **pid, **il
        )
        # grids of 32 KB programs at least SMEM_LEAD_MIN_PROGRAMS_PER_SM an SM (24): behind
        # lead programs (round 27), as the bench's rows (2^27 elements) are; 23 an SM: none
        lead = dict(lead=softmax_module.SMEM_LEAD_PER_SM, lead_ns=softmax_module.SMEM_LEAD_NS)
        assert softmax_module.SMEM_LEAD_MIN_PROGRAMS_PER_SM == 24
        assert pick(262144, 128, False, False, cpu, 4, smem_ok=True) == Config(
            "smem", 1, 8192, 4, exp2=1, **pid, **lead, **il
        )
        assert pick(262144, 512, False, False, cpu, 2, smem_ok=True) == Config(
            "smem", 1, 16384, 8, exp2=2, maxnreg=cap, **pid, **lead, **il
        )
        assert pick(262144, 99, False, False, cpu, 2, 2, smem_ok=True).lead  # 198 rows: 24.0
        assert not pick(262144, 97, False, False, cpu, 2, 2, smem_ok=True).lead  # 23.5
        assert not pick(262144, 128, False, True, cpu, 4, smem_ok=True).lead  # the backward
        assert not pick(2**22, 512, False, False, cpu, 2, smem_ok=True).lead  # 64 KB programs
        assert pick(65536, 256, False, False, cpu, 4, smem_ok=True) == Config(
            "smem", 1, 8192, 4, exp2=1, **pid, **il
        )
        assert pick(262144, 128, False, True, cpu, 4, smem_ok=True) == Config(
            "smem", 1, 4096, 4, by_pid=True
        )
        # not fitting: coop (pairs in the 16-bit backward)
        assert pick(65536, 512, False, False, cpu, 2).design == "coop"
        assert pick(65536, 512, False, True, cpu, 2) == Config("coop", 1, 4096, 4, pairs=True)
        # rows past MAX_SPLIT_CHUNKS chunks: bigger chunks, warps in proportion
        assert pick(2**22, 2, False, False, cpu, 2, smem_ok=True) == Config(
            "smem", 1, 32768, 16, exp2=2, maxnreg=cap, **pid, **il
        )
        assert pick(2**21, 2, False, True, cpu, 2, smem_ok=True) == Config(
            "smem", 1, 16384, 8, by_pid=True
        )
        assert pick(2**20, 2, False, True, cpu, 4, smem_ok=True) == Config(
            "smem", 1, 8192, 8, by_pid=True
        )
        # until a program's chunks would pass SMEM_MAX_BYTES of shared memory (the backward
        # keeps the persistent kernels' bound, four buffers: half the row length the forward's
        # one chunk reaches)
        assert pick(2**22, 2, False, True, cpu, 2, smem_ok=True).design != "smem"
        assert pick(2**21, 2, False, True, cpu, 4, smem_ok=True).design != "smem"
        assert pick(2**23, 2, False, False, cpu, 2, smem_ok=True).design == "smem"
        # rows that fit the tile never take it (the forward's row loop; the backward's tile)
        assert pick(16384, 2048, False, False, cpu, 2, smem_ok=True).design == "online"
        assert pick(16384, 2048, False, True, cpu, 2, smem_ok=True).design == "tile"


@pytest.mark.parametrize(
    "make, fits",
    [
        (lambda: torch.empty(4, 4096, dtype=torch.bfloat16), True),
        (lambda: torch.empty(4, 4104, dtype=torch.bfloat16)[:, 8:], True),  # 16 bytes in
        (lambda: torch.empty(4, 4097, dtype=torch.bfloat16)[:, 1:], False),  # 2 bytes in
        (lambda: torch.empty(4, 4100, dtype=torch.float32)[:, :4096], True),  # stride 4100
        (lambda: torch.empty(4, 4098, dtype=torch.float32)[:, :4096], False),  # stride 4098
        (lambda: torch.empty(4096, 4, dtype=torch.float32).t(), False),  # column stride 4
        (lambda: torch.empty(4, 4094, dtype=torch.float32), False),  # rows of 16376 bytes
        (lambda: torch.empty(4, 2, 4096, dtype=torch.float16)[:, 1], True),  # two row dims
    ],
)
def test_smem_fits(make, fits):
    x = make()
    out = torch.empty(x.shape, dtype=x.dtype)
    _, strides = softmax_module._row_dims([x, out])
    assert softmax_module._smem_fits([x, out], strides, x.shape[-1]) is fits


def test_smem_is_offered_to_direct_launches_on_hopper_only(monkeypatch):
    """_launch_rows lets _pick_config take smem (smem_ok) only for rows past the tile, on a
    compute capability 9.x GPU, through a direct launch (not wrap_triton), where they fit."""
    seen = []

    class Picked(Exception):
        pass

    def pick(*args):
        seen.append(args[7])  # smem_ok
        raise Picked

    monkeypatch.setattr(softmax_module, "_pick_config", pick)
    base = torch.empty(2, 20000, dtype=torch.bfloat16)
    cases = [
        ((9, 0), direct, base[:, 8:], True),
        ((8, 0), direct, base[:, 8:], False),  # Ampere: not measured
        ((10, 0), direct, base[:, 8:], False),
        ((9, 0), lambda kernel: kernel, base[:, 8:], False),  # not a direct launch
        ((9, 0), direct, base[:, 1:], False),  # 2 bytes off 16-byte alignment
        ((9, 0), direct, base[:, :16384], False),  # fits the tile
    ]
    for capability, launch, x, offered in cases:
        with pretend_gpu(capability, 132), pytest.raises(Picked):
            _forward(x, -1, launch, None)
        assert seen.pop() is offered, (capability, x.shape, x.storage_offset())


def test_smem_design_needs_a_gpu(device):
    x = torch.randn(2, 4096, device=device)
    with pytest.raises(ValueError, match="smem design .* needs a GPU"):
        _forward(x, -1, direct, Config("smem", 1, 1024, 4))


def test_pick_config_row_loop():
    """Forward rows of one a program, from 1024 columns in fp32 and 4096 in 16-bit up to the
    tile's limit, take the looped form with the whole padded row a step and the evict hints
    (probe round 13), without masks and with 32-bit offsets where the rows allow (round 23);
    shorter rows, the backward and adjacent rows keep the tile, longer rows the long-row
    designs."""
    pick = softmax_module._pick_config
    cpu = torch.device("cpu")
    loop = lambda cols, warps: Config("online", 1, cols, warps, evict=True, exp2=1,  # noqa: E731
                                      even=True, int32=True)  # fmt: skip
    with pretend_gpu((9, 0), 132):
        assert pick(1024, 131072, False, False, cpu, 4) == loop(1024, 4)
        assert pick(1000, 7, False, False, cpu, 4) == loop(1024, 4)  # few rows too
        assert pick(4096, 32768, False, False, cpu, 4) == loop(4096, 16)
        assert pick(16384, 8192, False, False, cpu, 4) == loop(16384, 8)
        assert pick(4096, 32768, False, False, cpu, 2) == loop(4096, 4)
        assert pick(2048, 65536, False, False, cpu, 4) == loop(2048, 4)
        assert pick(8192, 16384, False, False, cpu, 4) == loop(8192, 8)
        assert pick(4097, 300, False, False, cpu, 2) == loop(8192, 16)
        assert pick(16384, 8192, False, False, cpu, 2) == loop(16384, 8)
        assert pick(2048, 65536, False, False, cpu, 2).design == "tile"
        assert pick(512, 65536, False, False, cpu, 4).design == "tile"
        assert pick(4096, 32768, False, True, cpu, 4).design == "tile"
        assert pick(1024, 32768, True, False, cpu, 4).design != "online"
        assert pick(16385, 512, False, False, cpu, 4).design != "online"


def test_pick_config_spreads_few_rows_over_the_sms():
    """Launch-bound sizes (fewer full tiles than SMs) get smaller tiles, down to the minimum
    rows a program; sizes with tiles enough keep theirs (16 KB of each input; forward rows of up
    to 1024 columns: 2 KB on 2 warps in 16-bit, 4 KB on 4 in fp32)."""
    pick = softmax_module._pick_config
    cpu = torch.device("cpu")
    with pretend_gpu((9, 0), 132):
        assert pick(128, 262144, False, True, cpu, 2).block_rows == 64  # the rows set: 16 KB
        # 16-bit forward rows of up to 1024 columns: 2 KB tiles on 2 warps, without masks and
        # with 32-bit offsets where the rows allow (probes 15-16); 2048 columns: 16 KB again
        small = dict(even=True, int32=True)
        assert pick(128, 262144, False, False, cpu, 2) == Config("tile", 8, 128, 2, **small)
        assert pick(256, 262144, False, False, cpu, 2).block_rows == 4
        assert pick(512, 262144, False, False, cpu, 2) == Config("tile", 2, 512, 2, **small)
        assert pick(1024, 32768, False, False, cpu, 2) == Config("tile", 1, 1024, 2, **small)
        assert pick(2048, 32768, False, False, cpu, 2) == Config("tile", 4, 2048, 4)
        # fp32: 4 KB on 4 warps
        assert pick(128, 262144, False, False, cpu, 4) == Config("tile", 8, 128, 4, **small)
        # adjacent rows (32 a program) make the tile bigger than the small one: warps by size
        assert pick(128, 262144, True, False, cpu, 2) == Config("tile", 32, 128, 4)
        # fp32 forward rows of up to 512 columns: 4 KB tiles (probe round 12); from 1024 columns
        # one row a program takes the looped form (test_pick_config_row_loop); the backward and
        # adjacent rows keep 16 KB tiles
        assert pick(128, 262144, False, False, cpu, 4).block_rows == 8
        assert pick(2048, 65536, False, True, cpu, 4).block_rows == 2
        assert pick(256, 131072, True, False, cpu, 4) == Config("tile", 32, 256, 8)
        assert pick(128, 262144, False, True, cpu, 4).block_rows == 32  # the backward: 16 KB
        assert pick(128, 64, False, False, cpu, 2).block_rows == 1  # 64 rows: one a program
        assert pick(1024, 32, False, False, cpu, 2).block_rows == 1
        assert pick(4096, 128, False, True, cpu, 2).block_rows == 1
        # 300 rows of 128: tiles of 2 rows give 150 programs, tiles of 4 only 75
        assert pick(128, 300, False, True, cpu, 2).block_rows == 2
        # rows over an outer dim count too: 8 x 64 rows in tiles of 4 give 128 programs, of 2 256
        assert pick(128, 64, False, True, cpu, 2, rows_outer=8).block_rows == 2
        # adjacent rows (softmax over a non-last dim) never go below ADJACENT_ROWS
        adjacent = pick(64, 64, True, False, cpu, 2)
        assert adjacent.block_rows == min(softmax_module.ADJACENT_ROWS, 64)


def test_bad_config(device):
    x = torch.randn(4, 300, device=device)
    with pytest.raises(ValueError, match="tile of 256 columns for rows of 300"):
        _forward(x, -1, direct, Config("tile", 1, 256, 4))
    with pytest.raises(ValueError, match="unknown softmax design"):
        _forward(x, -1, direct, Config("nope", 1, 256, 4))


def test_programs_per_sm_estimate():
    # 2048 fp32 values over 4 warps: 16 a thread, 16 · 1.5 + 24 = 48 registers; 10 programs
    # by registers (65536 / (128 · 48)), 16 by warps
    assert _programs_per_sm(2048, 4, 1) == 10
    # 8192 values over 8 warps: 72 registers, 3 programs; the backward (two inputs): 104, 2
    assert _programs_per_sm(8192, 8, 1) == 3
    assert _programs_per_sm(8192, 8, 2) == 2
    # 1024 values over 8 warps: 4 · 1.5 + 24 = 30, rounded to 32 registers: 8 programs by
    # registers and by warps
    assert _programs_per_sm(1024, 8, 1) == 8
    assert _programs_per_sm(2**20, 16, 2) >= 1  # never 0


# Round 4: the banded two-pass design. band_bytes counts every input (x; y and dy), so the
# bands below hold 1 to a few rows: remainders, bands inside one outer row, bands of whole
# outer rows, row blocks (softmax over an outer dim) and a single band over everything.
BAND = {
    "band_1row": Config("band", 1, 32, 4, band_bytes=1),
    "band_3rows_ev": Config("band", 1, 32, 4, band_bytes=3 * 4 * 101 * 2, evict=True),
    "bandr_2rows": Config("bandr", 1, 64, 4, band_bytes=2 * 4 * 101 * 2),
    "band_rows4": Config("band", 4, 16, 4, band_bytes=700),
    "band_loop": Config("band", 2, 64, 4, band_bytes=900, loop_cols=16, evict=True, exp2=1),
    "band_exp2fma": Config("band", 1, 128, 4, band_bytes=5000, exp2=2),
    "band_all": Config("band", 1, 32, 8, band_bytes=2**40),
}


@pytest.mark.parametrize("config_name", BAND)
@pytest.mark.parametrize(
    "shape, dim", [((45, 101), -1), ((101, 13), 0), ((3, 21, 7), 1), ((5, 3, 77), -1)]
)
def test_band_forward_and_backward(config_name, shape, dim, device):
    config = BAND[config_name]
    x = torch.randn(shape, device=device) * 3
    x.select(dim, 5).fill_(-float("inf"))
    x = x.transpose(0, -1).contiguous().transpose(0, -1)  # non-contiguous, any dim
    y = _forward(x, dim, direct, config)
    y_ref = torch.softmax(x.double(), dim)
    assert relative_error(y, y_ref) < TOLERANCES["fp32"]
    dy = torch.randn_like(x)  # x's (non-contiguous) strides; y's are row-major along dim
    dx = _backward(y, dy, dim, direct, config)
    y64 = y.double()
    dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(dim, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES["fp32"]


@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero encountered")
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_band_extremes_and_views(dtype_name, device):
    """Odd M and N, a band size that leaves a remainder, -inf chunks and rows, a sliced view."""
    dtype = DTYPES[dtype_name]
    n = 1037
    base = torch.randn(9, n + 6, device=device) * 3
    base[0] *= 1e4 if dtype != torch.float16 else 1e3
    base[1, :700] = -float("inf")
    base[2] = 3.25
    base[4] = -float("inf")
    base[5, n + 2] = 1e4  # maximum in the last, short chunk (the view starts at column 3)
    x = base.to(dtype)[:, 3 : n + 3]  # rows with a stride of n + 6, offset start
    itemsize = x.element_size()
    config = Config("band", 1, 256, 4, band_bytes=2 * n * itemsize, evict=True)  # 2 rows
    y = _forward(x, -1, direct, config)
    ref = torch.softmax(x.double(), -1)
    assert torch.isnan(y[4]).all()
    keep = [0, 1, 2, 3, 5, 6, 7, 8]
    if dtype == torch.float16:
        ref = ref.to(dtype).double()
    assert relative_error(y[keep], ref[keep]) < TOLERANCES[dtype_name]
    assert (y[1, :697] == 0).all()  # the view starts at column 3
    yk = y[keep]
    dy = torch.randn(n, len(keep), device=device, dtype=dtype).t()
    dx = _backward(yk, dy, -1, direct, config._replace(design="bandr"))
    y64, dy64 = yk.double(), dy.double()
    dx_ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES[dtype_name]


@pytest.mark.parametrize(
    "rows_outer, rows_inner, band_rows", [(1, 10, 3), (4, 5, 2), (4, 5, 5), (7, 3, 6), (3, 2, 99)]
)
def test_band_slices_cover_every_row_once(rows_outer, rows_inner, band_rows):
    seen = torch.zeros(rows_outer, rows_inner, dtype=torch.int64)
    for outer, inner in softmax_module._band_slices(rows_outer, rows_inner, band_rows):
        seen[outer, inner] += 1
    assert (seen == 1).all()


def test_bad_band(device):
    x = torch.randn(4, 300, device=device)
    with pytest.raises(ValueError, match="band_bytes > 0"):
        _forward(x, -1, direct, Config("band", 1, 128, 4))


def test_round4_probe_candidates_are_valid():
    """Every round 4 probe variant at its GPU shapes: chunks that fit in registers and at most
    MAX_SPLIT_CHUNKS a row (the finish gathers a row's partials in one tile)."""
    probe = importlib.import_module("experiments.probe_softmax")
    for n in (16384, 65536, 262144):
        for itemsize in (2, 4):
            for backward in (False, True):
                for name, cfg in probe.round4_candidates(n, itemsize, backward).items():
                    assert cfg.design in ("band", "bandr", "split2"), name
                    assert cfg.block_cols <= 16384, name
                    assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                    assert cfg.design == "split2" or cfg.band_bytes >= 2**22, name


def test_round5_probe_candidates_are_valid():
    """Every round 5 probe variant at the GPU shapes: coop chunks that fit in registers and
    at most MAX_SPLIT_CHUNKS a row (the coop wait needs all of a row's programs resident)."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            for backward in (False, True):
                cands = probe.round5_candidates(n, itemsize, backward)
                assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
                for name, cfg in cands.items():
                    assert cfg.block_cols <= 16384, name
                    assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS, name
                    assert cfg.design in ("coop", "online"), name
                    assert not (backward and cfg.design == "online"), name


def test_round6_probe_candidates_are_valid():
    """Round 6 tiles: forward only, short rows only, whole power-of-2 rows that fit a program."""
    probe = importlib.import_module("experiments.probe_softmax")
    for _, n in probe.ROWS:
        for itemsize in (2, 4):
            assert probe.round6_candidates(n, itemsize, True) == {}
            cands = probe.round6_candidates(n, itemsize, False)
            assert bool(cands) == (n <= 4096)
            for name, cfg in cands.items():
                assert cfg.design == "tile" and cfg.block_cols >= n, name
                assert cfg.block_rows * cfg.block_cols <= softmax_module.ONE_PASS_MAX_ELEMS, name


def test_round6_probe_smoke():
    """The probe's round 6 on the interpreter: every tile and Inductor's kernels there."""
    out = _probe_smoke("--round6")
    assert "inductor_mac" in out and "t4K_w2" in out


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_long_rows(dtype_name, device):
    # fp16 is left out: its outputs (~1/262144) are subnormal and lose digits, in torch as well
    x = torch.randn(2, 262144, device=device, dtype=DTYPES[dtype_name])
    assert_matches_reference(x, -1, dtype_name)


def test_extreme_and_equal_values(row_path, device):
    n = 1500
    x = torch.randn(4, n, device=device)
    x[0] *= 1e4  # magnitudes near ±1e4: exp overflows without the max shift
    x[1] = -1e4
    x[1, n // 2] = 1e4
    x[2] = 3.25  # all equal
    x[3, ::3] = -float("inf")  # partly -inf, including the first column
    y = assert_matches_reference(x, -1, "fp32")
    # row sums to 1 within the N ulps of an fp32 sum (the default 1e-5 is tighter than that bound)
    ones = torch.ones(4, device=device)
    torch.testing.assert_close(y.sum(-1), ones, rtol=0, atol=n * torch.finfo(torch.float32).eps)
    assert (y[3, ::3] == 0).all()
    assert torch.allclose(y[2], torch.full((n,), 1.0 / n, device=device))


def test_leading_minus_inf_block(row_path, device):
    # the loop's first column blocks are all -inf: the running sum must stay 0, not NaN
    x = torch.randn(2, 2000, device=device)
    x[:, :1200] = -float("inf")
    assert_matches_reference(x, -1, "fp32")


# numpy, under the interpreter, warns while computing the NaNs (1/0 and -inf - -inf)
@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero encountered")
def test_all_minus_inf_row_is_nan_like_torch(row_path, device):
    x = torch.randn(3, 1000, device=device)
    x[1] = -float("inf")
    y = softmax(x, -1)
    assert torch.isnan(torch.softmax(x, -1)[1]).all()
    assert torch.isnan(y[1]).all()
    torch.testing.assert_close(y[[0, 2]], torch.softmax(x, -1)[[0, 2]])


@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "shape, dim",
    [((7, 33), -1), ((3, 5, 6), 1), ((5, 3), -1), ((3, 1100), -1), ((1100, 3), 0), ((3, 4097), -1)],
)
def test_gradient(shape, dim, dtype_name, row_path, device):
    dtype = DTYPES[dtype_name]
    x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
    # a non-contiguous upstream gradient
    dy = torch.randn(tuple(reversed(shape)), device=device, dtype=dtype).permute(
        *reversed(range(len(shape)))
    )
    (dx,) = torch.autograd.grad(softmax(x, dim), x, dy)
    x64 = x.detach().double().requires_grad_()
    (dx_ref,) = torch.autograd.grad(torch.softmax(x64, dim), x64, dy.double())
    assert dx.dtype == dtype
    err = relative_error(dx, dx_ref)
    # y is rounded to the dtype before the backward uses it and dx once more: both well in budget
    assert err < TOLERANCES[dtype_name], f"relative error {err:.2e} for {dtype_name}"


def test_single_column_rows(device):
    # N = 1: every output is 1 and every gradient 0, exactly
    x = torch.randn(7, 1, device=device, requires_grad=True)
    y = softmax(x, -1)
    assert (y == 1).all()
    (dx,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert (dx == 0).all()


def test_backward_function_matches_formula(device):
    x = torch.randn(4, 9, 10, device=device)
    y = softmax_forward(x, 1)
    dy = torch.randn_like(x)
    dx = softmax_backward(y, dy, 1)
    expected = y.double() * (dy.double() - (y.double() * dy.double()).sum(1, keepdim=True))
    assert relative_error(dx, expected) < TOLERANCES["fp32"]


def test_scalar_and_empty(device):
    assert softmax(torch.tensor(2.5, device=device), 0).item() == 1.0
    empty = torch.randn(0, 5, device=device)
    assert softmax(empty, -1).shape == (0, 5)
    assert softmax(torch.randn(3, 0, device=device), 0).shape == (3, 0)


def test_reference_matches_torch(device):
    x = torch.randn(5, 300, device=device, dtype=torch.float16)
    torch.testing.assert_close(softmax_reference(x, -1), torch.softmax(x, -1))


def test_bad_inputs(device):
    x = torch.randn(3, 4, device=device)
    with pytest.raises(ValueError, match=r"dim 2 is out of range .*\(3, 4\)"):
        softmax(x, 2)
    with pytest.raises(ValueError, match="dim -3"):
        softmax(x, -3)
    with pytest.raises(TypeError, match="dim must be an int"):
        softmax(x, 1.0)
    with pytest.raises(TypeError, match="int64"):
        softmax(torch.arange(12, device=device).reshape(3, 4), -1)
    with pytest.raises(TypeError, match="float64"):
        softmax(x.double(), -1)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        softmax([[1.0, 2.0]], -1)
    with pytest.raises(ValueError, match="dy has shape"):
        softmax_backward(x, x[:, :2], -1)
    with pytest.raises(TypeError, match="dy has dtype"):
        softmax_backward(x, x.half(), -1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "shape, dim",
    [
        ((4, 262144), -1),  # coop
        ((300, 65536), -1),  # rows enough to fill the GPU twice (once the 16-bit online loop)
        ((2, 1048576), -1),  # coop with chunks grown to keep 128 per row
        ((2048, 4096), -1),  # the row loop (round 13)
        ((257, 16384), -1),  # the row loop at the tile's limit
        ((33, 5000), -1),  # the row loop over a padded row of 8192
        ((1024, 4096), 0),  # 32 adjacent rows a program: coop
        ((2, 6, 1024, 1024), -1),
        ((2, 6, 1024, 1024), 2),  # coop over adjacent rows, output rows strided
        ((1823, 781), -1),
    ],
)
def test_big_shapes_on_gpu(shape, dim, dtype_name):
    dtype = DTYPES[dtype_name]

    def rounded(ref):
        # fp16 values below 6e-5 (long rows) are subnormal, with fewer digits: compare against
        # the reference rounded the same way
        return ref.to(dtype).double() if dtype == torch.float16 else ref

    x = torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
    y = softmax(x, dim)
    assert (
        relative_error(y, rounded(torch.softmax(x.detach().double(), dim))) < TOLERANCES[dtype_name]
    )
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    # the backward sees the rounded y, so the check for it starts from that y
    y64 = y.detach().double()
    dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(dim, keepdim=True))
    assert relative_error(dx, rounded(dx_ref)) < TOLERANCES[dtype_name]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_smem_on_views_and_its_fallback_on_gpu(dtype_name):
    """Long rows through views: 16-byte aligned ones take the smem kernels (a torch.split view
    along dim 1, softmax over dim 0 of a transposed view, whose rows are the base's), others
    coop (a column offset of one element, every other column); every one is checked forward
    and backward against float64."""
    dtype = DTYPES[dtype_name]
    base = torch.randn(5, 65536 + 64, device="cuda", dtype=dtype) * 4
    base[2, 100:9000] = -float("inf")
    views = {
        "aligned offset": (base[:, 64:], -1, True),
        "one element in": (base[:, 1:65537], -1, False),
        "split along dim 1": (torch.split(base, [32, 65568], dim=1)[1], -1, True),
        "dim 0 of a transpose": (base[:, :65536].t(), 0, True),
        "every other column": (base[:, ::2], -1, False),
    }
    for name, (x, dim, aligned) in views.items():
        rows = x.movedim(dim, -1)
        layout = softmax_module._row_dims([rows, torch.empty(rows.shape, dtype=dtype)])
        fits = softmax_module._smem_fits([rows, rows], layout[1], rows.shape[-1])
        assert fits is aligned, name
        y = softmax_forward(x, dim)
        ref = torch.softmax(x.double(), dim)
        assert relative_error(y, ref) < TOLERANCES[dtype_name], name
        dy = torch.randn_like(x)
        dx = softmax_backward(y, dy, dim)
        y64 = y.double()
        dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(dim, keepdim=True))
        assert relative_error(dx, dx_ref) < TOLERANCES[dtype_name], name


@pytest.mark.gpu
def test_coop_workspace_reuse_on_gpu():
    """Back-to-back coop launches take the two cached workspaces in turn, each zeroing the
    other for the next: every call right, forward and backward, plain and pairs, with and
    without arrival counters; under CUDA graph capture a launch zeroes its own."""
    x32 = torch.randn(6, 65536, device="cuda") * 3
    dy32 = torch.randn_like(x32)
    for _ in range(4):
        for dtype_name in ("fp32", "bf16"):
            x, dy = x32.to(DTYPES[dtype_name]), dy32.to(DTYPES[dtype_name])
            y = softmax_forward(x, -1)
            assert relative_error(y, torch.softmax(x.double(), -1)) < TOLERANCES[dtype_name]
            dx = softmax_backward(y, dy, -1)
            y64, dy64 = y.double(), dy.double()
            dx_ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
            assert relative_error(dx, dx_ref) < TOLERANCES[dtype_name]
        y = _forward(x32, -1, direct, Config("coop", 1, 4096, 4, counter=True))
        assert relative_error(y, torch.softmax(x32.double(), -1)) < TOLERANCES["fp32"]
    for dtype_name in ("fp32", "bf16"):  # coop and smem
        static_x = x32.to(DTYPES[dtype_name])
        softmax_forward(static_x, -1)  # compiled before the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_y = softmax_forward(static_x, -1)
        for scale in (1.0, 2.0, 0.5):
            static_x.copy_(x32 * scale)
            graph.replay()
            ref = torch.softmax(static_x.double(), -1)
            assert relative_error(static_y, ref) < TOLERANCES[dtype_name]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("n", [1024, 3001, 4096, 16384])
def test_row_loop_on_gpu(n, dtype_name):
    """The shipped row loop (the padded row a step, loaded twice, evict hints) on fresh rows with
    -inf entries, an all -inf row, 1e4 and -1e4, a row of equal values, and on a split view
    along dim 1 (unit column stride, rows 2n apart)."""
    dtype = DTYPES[dtype_name]
    base = torch.randn(37, 2 * n, device="cuda", dtype=dtype) * 4
    x = base[:, :n]
    x[1, : n // 3] = -float("inf")
    x[2] = -float("inf")
    x[3, n // 2] = 1e4
    x[4, 7] = -1e4
    x[5] = 2.5
    config = softmax_module._pick_config(n, 37, False, False, x.device, x.element_size())
    assert config.design == "online" or (dtype_name != "fp32" and n == 1024), config
    y = _forward(x, -1, direct, None)
    ref = torch.softmax(x.double(), -1)
    assert torch.isnan(y[2]).all()
    keep = [i for i in range(37) if i != 2]
    assert relative_error(y[keep], ref[keep]) < TOLERANCES[dtype_name]
    torch.testing.assert_close(
        y[keep].double().sum(-1), torch.ones(36, device="cuda", dtype=torch.float64),
        rtol=0, atol=TOLERANCES[dtype_name],
    )  # fmt: skip


# Every long-row design and knob a probe round shipped: run on the GPU
# (test_long_row_designs_on_gpu) and compiled for sm_90 on the CPU
# (test_long_row_designs_compile_for_sm90), forward and backward (_backward_design).
LONG_ROW_DESIGNS = [
    Config("coop", 1, 4096, 4),
    Config("split2r", 1, 8192, 8),
    Config("online", 1, 4096, 8),
    # round 3: counter, no sleep, exp2; the coop-loop (4 chunks of 65536 read twice)
    Config("coop", 1, 4096, 4, sleep_ns=0, counter=True, evict=True, exp2=2),
    Config("coop", 1, 65536, 8, counter=True, evict=True, exp2=1, loop_cols=4096),
    Config("online", 1, 4096, 8, evict=True, exp2=2),
    # round 4: bands of 2 rows (bf16; 1 row in fp32 and in the backward)
    Config("band", 1, 4096, 4, evict=True, band_bytes=2**20),
    # round 9: bf16 chunks held as int32 pairs (fp32 takes the plain kernel), capped
    Config("coop", 1, 4096, 4, pairs=True),
    Config("coop", 1, 8192, 8, pairs=True, maxnreg=40),
    Config("coop", 1, 4096, 4, rescale=True),  # the backward drops the knob
    # round 10: chunks held in shared memory (Gluon); 2 warps, pieces of 256-512 values
    Config("smem", 1, 8192, 4, exp2=2),
    Config("smem", 1, 4096, 2, exp2=1, evict=True, sleep_ns=0),
    # round 11: persistent, two buffers; one program an SM takes about 3 chunks in turn,
    # often two of one row (the published-first order)
    Config("smem", 1, 4096, 2, exp2=1, per_sm=1),
    Config("smem", 1, 8192, 4, exp2=2, per_sm=-1),
    # round 14: the partial folded into the pass over the landing pieces, one-shot and
    # persistent (16 pieces a chunk; a whole chunk of -inf before the first finite value)
    Config("smem", 1, 16384, 8, exp2=2, fold=True),
    Config("smem", 1, 4096, 2, exp2=1, per_sm=1, fold=True),
    Config("smem", 1, 16384, 8, exp2=2, fold=2),
    Config("smem", 1, 8192, 4, exp2=1, fold=2),
    Config("smem", 1, 4096, 2, exp2=1, per_sm=1, fold=2),
    # round 18: the chunk's last pieces held in registers (bf16 as pairs): 2 of 16 (fp32:
    # of 32), 4 of 16 (32) on 2 warps, 1 of 4 (8) with tl.exp's form
    Config("smem", 1, 16384, 4, exp2=2, regs=2),
    Config("smem", 1, 8192, 2, exp2=1, regs=4),
    Config("smem", 1, 4096, 4, regs=1),
    # round 19: chunks by program id (the backward drops the knob), capped as in the probe;
    # round 20: leaving a chunk to the row's last publisher, and rows without masks (even)
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40),
    Config("smem", 1, 4096, 4, exp2=1, by_pid=True, maxnreg=40),
    Config("smem", 1, 16384, 8, exp2=2, even=True),
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True),
    Config("smem", 1, 8192, 4, exp2=1, by_pid=True, even=True),
    # round 21: the exp2 of odd pieces on the FMA pipe (16-bit only), the write's and the
    # sum pass's; the backward takes by_pid and even from each config above
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True, poly=1),
    Config("smem", 1, 8192, 4, exp2=2, by_pid=True, poly=2),
    # and the folded partials by program id, with and without masks
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True, fold=2),
    Config("smem", 1, 8192, 4, exp2=1, by_pid=True, fold=2),
    Config("smem", 1, 8192, 4, exp2=1, by_pid=True, even=True, fold=1),
    # round 22: the persistent forward by program id (the backward takes the persistent
    # ticketed kernel for these): whole rows a round, as many programs an SM as shared
    # memory holds, without masks; one an SM with masks (128 programs, 3 rounds of 2 rows)
    Config("smem", 1, 8192, 4, exp2=2, per_sm=-1, by_pid=True, even=True),
    Config("smem", 1, 4096, 4, exp2=1, per_sm=1, by_pid=True),
    # and the one-shot forward's chunk copied in as one copy and one commit group
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True, one_copy=True),
    Config("smem", 1, 8192, 4, exp2=1, by_pid=True, one_copy=True),
    # round 23: leaving after 8 polls, the left chunks written 4 pieces a step
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True, leave_polls=8,
           left_group=4),
    # and the online loop's first pass lane by lane (Inductor's form), 64 steps a row
    Config("online", 1, 4096, 8, evict=True, exp2=1, even=True, int32=True, lanes=True),
    # round 24: and Inductor's arithmetic throughout (libdevice's exp, its max), the stores'
    # default policy
    Config("online", 1, 4096, 8, evict=True, exp2=1, even=True, int32=True, lanes=4,
           store_default=True),
    # round 26: bf16 widened by integer ops in the sum pass and the write (bf16 only), without
    # masks as the pick and with them
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True, widen=True),
    Config("smem", 1, 8192, 4, exp2=2, by_pid=True, widen=True),
    # round 27: lead programs ahead of the chunks' (3 an SM in 3 tiers, 2 of them prefetching
    # the last chunks into L2; 1 an SM with masks)
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True, lead=3,
           lead_ns=1000, tail_pf=2),
    Config("smem", 1, 4096, 4, exp2=1, by_pid=True, lead=1, lead_ns=500),
    # round 28: a row's chunks interleaved piece by piece (behind 3 leads an SM; on rows that
    # are not whole chunks the chunks stay whole)
    Config("smem", 1, 16384, 8, exp2=2, by_pid=True, maxnreg=40, even=True, lead=3,
           lead_ns=1000, interleave=True),
    Config("smem", 1, 8192, 4, exp2=1, by_pid=True, even=True, interleave=True),
]


def _design_id(c: Config) -> str:
    return (
        f"{c.design}{c.block_cols}"
        + (f"_loop{c.loop_cols}" if c.loop_cols else "")
        + ("_ctr" if c.counter else "")
        + (f"_exp2{c.exp2}" if c.exp2 else "")
        + ("_pairs" if c.pairs else "")
        + (f"_r{c.maxnreg}" if c.maxnreg else "")
        + ("_rescale" if c.rescale else "")
        + (f"_w{c.num_warps}" if c.design == "smem" else "")
        + (f"_persist{c.per_sm}" if c.per_sm else "")
        + (f"_fold{int(c.fold)}" if c.fold else "")
        + (f"_regs{c.regs}" if c.regs else "")
        + ("_pid" if c.by_pid else "")
        + ("_even" if c.even else "")
        + (f"_poly{c.poly}" if c.poly else "")
        + ("_one" if c.one_copy else "")
        + (f"_lp{c.leave_polls}_g{c.left_group}" if c.left_group > 1 else "")
        + (f"_lanes{int(c.lanes)}" if c.lanes else "")
        + ("_st" if c.store_default else "")
        + ("_widen" if c.widen else "")
        + (f"_lead{c.lead}" if c.lead else "")
        + ("_il" if c.interleave else "")
    )


def _backward_design(config: Config) -> Config:
    """What the backward takes of a forward design: not its forward-only knobs; by_pid and even
    on its one-shot smem kernel (round 21), not on its persistent one or another design's."""
    backward = config._replace(rescale=False, fold=0, regs=0, poly=0, one_copy=False,
                               left_group=1, lanes=0, store_default=False,
                               widen=False, lead=0, lead_ns=0, tail_pf=0,
                               interleave=False)  # fmt: skip
    if config.per_sm or config.design != "smem":
        backward = backward._replace(by_pid=False, even=False, int32=False)
    return backward


OFFLINE_DESIGNS_SCRIPT = """
import importlib, json, sys
import torch
from experiments.resources import OfflineCompiler
from kernels._common import direct, pretend_gpu
from kernels.softmax import Config  # noqa: F401 (the reprs below)
sm = importlib.import_module("kernels.softmax")
failed = []
with pretend_gpu((9, 0), 132), OfflineCompiler(90).active():
    for line in sys.stdin:
        forward, backward = (eval(part) for part in line.split("|"))
        for dtype in (torch.bfloat16, torch.float32):
            if (forward.poly or forward.widen) and dtype == torch.float32:
                continue
            x = torch.empty(6, 262144, dtype=dtype)
            for tensors, config in (([x, x.clone()], forward), ([x, x, x.clone()], backward)):
                try:
                    sm._launch_rows(direct, tensors, len(tensors) == 3, config)
                except Exception as exc:  # noqa: BLE001 (each design's error is reported)
                    failed.append(f"{config} {dtype} {type(exc).__name__}: {exc}"[:400])
print(json.dumps(failed))
"""


ROOT = Path(__file__).resolve().parents[1]


def test_long_row_designs_compile_for_sm90():
    """Every long-row design, forward and backward, compiled for sm_90 on the CPU (Triton's
    offline compiler, experiments.resources): the interpreter accepts a keyword a kernel does
    not have, and does not run Gluon, so a wrong constexpr or an smem kernel that does not
    compile would otherwise wait for a GPU run (round 22's STORE_POLICY did)."""
    if softmax_module.softmax_smem is None:
        pytest.skip("this Triton has no Gluon")
    lines = "".join(f"{c!r}|{_backward_design(c)!r}\n" for c in LONG_ROW_DESIGNS)
    done = subprocess.run(
        [sys.executable, "-c", OFFLINE_DESIGNS_SCRIPT], input=lines, cwd=ROOT,
        env={**os.environ, "TRITON_INTERPRET": "0"}, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("config", LONG_ROW_DESIGNS, ids=_design_id)
def test_long_row_designs_on_gpu(config, dtype_name):
    """Each long-row design at N = 262144 (64 chunks of 4096), with -inf entries and rows."""
    if config.poly and dtype_name == "fp32":
        pytest.skip("poly is a 16-bit knob (a cubic's 1e-4 is past fp32's rounding)")
    if config.widen and dtype_name == "fp32":
        pytest.skip("widen is a bf16 knob (two values a 32-bit word)")
    dtype = DTYPES[dtype_name]
    x = torch.randn(6, 262144, device="cuda", dtype=dtype) * 4
    x[1, :70000] = -float("inf")  # whole chunks of -inf before the first finite value
    x[2] = -float("inf")
    x[3, 123456] = 1e4
    y = _forward(x, -1, direct, config)
    ref = torch.softmax(x.double(), -1)
    assert torch.isnan(y[2]).all()
    keep = [0, 1, 3, 4, 5]
    assert relative_error(y[keep], ref[keep]) < TOLERANCES[dtype_name]
    # each y is rounded to the dtype (relative error u), so a row's sum is 1 within u, not within
    # float64's default tolerance, which failed every bf16 design and the fp32 online one on an H100
    torch.testing.assert_close(
        y[keep].double().sum(-1),
        torch.ones(5, device="cuda", dtype=torch.float64),
        rtol=0,
        atol=TOLERANCES[dtype_name],
    )
    dy = torch.randn_like(y)
    y64 = y[keep].double()
    dx = _backward(y[keep], dy[keep], -1, direct, _backward_design(config))
    dx_ref = y64 * (dy[keep].double() - (y64 * dy[keep].double()).sum(-1, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES[dtype_name]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("n", [70000, 16392])
def test_held_pieces_on_ragged_rows_on_gpu(dtype_name, n):
    """Config.regs where the row ends inside a chunk (70000: a last chunk of 4464 columns, held
    pieces past the end; 16392: a second chunk of 8 columns), on rows 64 columns apart (a view),
    with 1e4 and -inf in the held pieces."""
    dtype = DTYPES[dtype_name]
    base = torch.randn(5, n + 64, device="cuda", dtype=dtype) * 3
    x = base[:, :n]
    x[0, 16384 - 100] = 1e4  # the first chunk's last (held) piece
    x[1, 8192:16384] = -float("inf")  # its held pieces all -inf
    x[2, :-3] = -float("inf")  # one finite run, at the row's end
    for config in (
        Config("smem", 1, 16384, 4, exp2=2, regs=4),
        Config("smem", 1, 16384, 8, exp2=1, regs=1),
        Config("smem", 1, 8192, 2, regs=8),
    ):
        y = _forward(x, -1, direct, config)
        ref = torch.softmax(x.double(), -1)
        if dtype == torch.float16:
            ref = ref.to(dtype).double()  # subnormal fp16 outputs: compare as rounded
        assert relative_error(y, ref) < TOLERANCES[dtype_name], config
        ones = torch.ones(5, device="cuda", dtype=torch.float64)
        torch.testing.assert_close(y.double().sum(-1), ones, rtol=0, atol=TOLERANCES[dtype_name])


def _by_pid_rows(dtype_name: str, n: int, rows_per_sm: int):
    """(x, the pick) for the leave tests: rows_per_sm rows an SM (0: 6 rows) of n columns, with
    a 1e4 and a run of -inf; the pick is the smem forward by program id."""
    from kernels._common import gpu_info

    device = torch.device("cuda")
    rows = rows_per_sm * gpu_info(device).sms if rows_per_sm else 6
    x = torch.randn(rows, n, device=device, dtype=DTYPES[dtype_name]) * 3
    x[0, 5] = 1e4
    x[1, :20000] = -float("inf")
    pick = softmax_module._pick_config(n, rows, False, False, device, x.element_size(),
                                       smem_ok=True)  # fmt: skip
    assert pick.design == "smem" and pick.by_pid
    return x, pick


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp32"])
@pytest.mark.parametrize(
    "n, rows_per_sm, leave_polls, per_sm",
    [(65536, 5, 0, 3), (70000, 0, 0, 1), (65536, 5, 1, 3), (65536, 5, 0, 0)],
    ids=["rounds", "ragged_rows", "leave_at_once", "oversubscribed"],
)  # fmt: skip
def test_persistent_forward_by_program_id_on_gpu(dtype_name, n, rows_per_sm, leave_polls,
                                                 per_sm):  # fmt: skip
    """The persistent forward by program id (round 22). rounds: 5 rows an SM of 4 chunks, 3
    programs an SM, about 7 rounds, no masks; ragged_rows: 6 rows of 70000 columns (a last
    chunk of 4464, masks), 1e4 and a run of -inf; leave_at_once: every program that finds its
    row incomplete at its first poll leaves its chunk, which the row's last publisher writes
    a round later; oversubscribed: a program a chunk (one round), more programs than the SMs
    hold. (There the GPU starts a row's programs together, ids being consecutive, so none had
    to leave: softmax_gputests22_h200.log, where the test asked for leavers and failed.)"""
    from kernels._common import gpu_info

    smem = softmax_module.softmax_smem
    x, pick = _by_pid_rows(dtype_name, n, rows_per_sm)
    rows, device = x.shape[0], x.device
    n_chunks = triton.cdiv(n, pick.block_cols)
    programs = per_sm * gpu_info(device).sms if per_sm else rows * n_chunks
    ws = torch.zeros(smem.workspace_words(rows * n_chunks, n_chunks, True), device=device,
                     dtype=torch.int64)  # fmt: skip
    y = torch.full_like(x, float("nan"))
    smem.launch(
        direct, False, [x, y], ws, None, (1, rows), [(rows * n, n, 1)] * 2, pick.block_cols,
        pick.num_warps, exp2=pick.exp2, programs=programs, by_pid=True,
        leave_polls=leave_polls or smem.LEAVE_POLLS, even=n % pick.block_cols == 0,
    )  # fmt: skip
    ref = torch.softmax(x.double(), -1)
    assert relative_error(y, ref) < TOLERANCES[dtype_name]
    ones = torch.ones(rows, device=device, dtype=torch.float64)
    torch.testing.assert_close(y.double().sum(-1), ones, rtol=0, atol=TOLERANCES[dtype_name])
    left = ws[rows * n_chunks + 1 + rows:]  # flags past the slots, the counter, the counts
    if leave_polls:
        assert (left == 1).sum().item() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("dtype_name", ["bf16", "fp32"])
@pytest.mark.parametrize(
    "n, rows_per_sm, leave_polls, transpose, left_group, interleave",
    [(70000, 0, 1, False, 1, False), (65536, 5, 1, False, 1, False),
     (65536, 8, 0, True, 1, False), (70000, 0, 1, False, 4, False),
     (65536, 5, 1, False, 8, False), (65536, 5, 1, False, 1, True),
     (262144, 2, 1, False, 1, True), (65536, 8, 0, True, 1, True)],
    ids=["leave_at_once", "leave_at_once_many", "transposed", "leave_at_once_g4",
         "leave_at_once_many_g8", "leave_at_once_many_il", "leave_at_once_il_16",
         "transposed_il"],
)  # fmt: skip
def test_chunks_by_program_id_leave_on_gpu(dtype_name, n, rows_per_sm, leave_polls, transpose,
                                           left_group, interleave, backward):  # fmt: skip
    """Config.by_pid's leaving, forward and (round 21) backward. leave_at_once: every program
    that finds its row incomplete at its first poll leaves its chunk to the row's last
    publisher, which writes it from global memory (6 rows of 70000 columns: a last chunk of
    4464; a 1e4 and a run of -inf); _many: 5 rows an SM of whole chunks (the unmasked kernel),
    programs leaving in every wave (round 20's first runs lost whole rows' left chunks here
    while 6 rows passed). transposed: program ids go down the rows' first chunks first, on 8
    rows an SM, more than the SMs hold programs; the GPU's first programs then wait for chunks
    it starts only after them, and only leaving ends the launch. _gG: the forward's left
    chunks written G pieces a step (Config.left_group, round 23; the ragged last chunk of
    70000 columns masked within a step). _il: a row's chunks interleaved piece by piece
    (Config.interleave, round 28), so the left chunks' pieces are read and written a row's
    chunks apart; y is also the bits of the same launch where nobody leaves."""
    if backward and (left_group > 1 or interleave):
        pytest.skip("left_group and interleave are knobs of the forward")
    smem = softmax_module.softmax_smem
    x, config = _by_pid_rows(dtype_name, n, rows_per_sm)
    rows, device, dtype = x.shape[0], x.device, x.dtype
    if backward:  # the backward's one-shot kernel on half the forward's chunk (y and dy)
        config = config._replace(block_cols=config.block_cols // 2, num_warps=4, maxnreg=0)
        y = torch.softmax(x.float(), -1).to(dtype)
        dy = torch.randn_like(y)
        tensors = [y, dy, torch.full_like(y, float("nan"))]
        y64, dy64 = y.double(), dy.double()
        ref = y64 * (dy64 - (y64 * dy64).sum(-1, keepdim=True))
    else:
        tensors = [x, torch.full_like(x, float("nan"))]
        ref = torch.softmax(x.double(), -1)
    n_chunks = triton.cdiv(n, config.block_cols)
    ws = torch.zeros(smem.workspace_words(rows * n_chunks, n_chunks, True), device=device,
                     dtype=torch.int64)  # fmt: skip
    def run(leave_polls, transpose):
        smem.launch(
            direct, backward, tensors, ws, None, (1, rows), [(rows * n, n, 1)] * len(tensors),
            config.block_cols, config.num_warps, exp2=config.exp2, maxnreg=config.maxnreg,
            by_pid=True, leave_polls=leave_polls, transpose=transpose,
            even=n % config.block_cols == 0, left_group=left_group, interleave=interleave,
        )  # fmt: skip
        return tensors[-1]

    if interleave:  # the bits where nobody leaves (-1: never), program ids in row order (a
        # transposed grid of more rows than the GPU holds would never end without leaving)
        stay = run(-1, False).clone()
        ws.zero_()
        tensors[-1].fill_(float("nan"))
    out = run(leave_polls or smem.LEAVE_POLLS, transpose)
    if interleave:
        assert torch.equal(out.view(torch.uint8), stay.view(torch.uint8))
    assert relative_error(out, ref) < TOLERANCES[dtype_name]
    if not backward:
        ones = torch.ones(rows, device=device, dtype=torch.float64)
        torch.testing.assert_close(out.double().sum(-1), ones, rtol=0,
                                   atol=TOLERANCES[dtype_name])  # fmt: skip
    if rows_per_sm:  # programs did leave (flag 1 past the slots, the counter, the counts);
        # 6 rows complete before most first polls (the H200 left none in bf16, some in fp32)
        left = ws[rows * n_chunks + 1 + rows:]
        assert (left == 1).sum().item() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
@pytest.mark.parametrize("poly", [1, 2])
def test_poly_exp2_within_an_ulp_on_gpu(dtype_name, poly):
    """Config.poly's cubic exp2 (softmax_smem._exp2_poly) over the exponent's whole range:
    rows falling from 0 to about 2^-140 of their max (past where ex2.approx.ftz flushes), each
    y within one unit in the last place of the float64 softmax rounded to the dtype, as the
    MUFU's exp2 is; a -inf entry gives 0, an all -inf row NaN."""
    dtype = DTYPES[dtype_name]
    n = 65536
    ramp = -torch.linspace(0, 97, n, device="cuda", dtype=torch.float64)  # exp(-97) = 2^-140
    x = (ramp[None, :] + torch.rand(8, n, device="cuda", dtype=torch.float64) * 0.01).to(dtype)
    x[:, ::3] = x[:, torch.randperm(n, device="cuda")[: x[:, ::3].shape[1]]]  # shuffled
    x[1, 7] = -float("inf")
    x[2] = -float("inf")
    config = Config("smem", 1, 32768 // 2, 8, exp2=2, by_pid=True, even=True, maxnreg=40)
    y = _forward(x, -1, direct, config._replace(poly=poly))
    y_mufu = _forward(x, -1, direct, config)
    assert torch.isnan(y[2]).all() and y[1, 7] == 0
    keep = [0, 1, 3, 4, 5, 6, 7]
    ref = torch.softmax(x[keep].double(), -1).to(dtype).double()
    ulp = torch.finfo(dtype).eps  # an ulp relative to a value is at most eps
    tiny = torch.finfo(dtype).smallest_normal  # below: flushed or subnormal spacing
    for out in (y, y_mufu):
        err = (out[keep].double() - ref).abs()
        assert (err <= ulp * ref.abs() + tiny).all(), (err - ulp * ref.abs()).max().item()


@pytest.mark.gpu
@pytest.mark.parametrize(
    "config, n",
    [
        (Config("smem", 1, 16384, 8, exp2=2, by_pid=True, even=True, maxnreg=40), 262144),
        (Config("smem", 1, 8192, 4, exp2=2, by_pid=True), 70000),  # masks: a ragged last chunk
    ],
    ids=["even", "masked"],
)
def test_widen_matches_the_cvt_bit_for_bit_on_gpu(config, n):
    """Config.widen widens bf16 by a shift and a mask where ptxas gives cvt.f32.bf16: both are
    exact and the sum's order is the same (its first piece in place of 0 + it), so y must be
    the same bits, on rows with -inf entries, an all -inf row (NaN both ways) and a large
    value; and the float64 softmax's within bf16's tolerance."""
    x = _rows_with_extremes(7, n, torch.bfloat16)
    _assert_same_bits(x, config, config._replace(widen=True), "bf16")


def _rows_with_extremes(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """m random rows of n on the GPU, with a run of -inf entries (row 1), an all -inf row (row 2:
    NaN, as torch) and 1e4 (row 3)."""
    x = torch.randn(m, n, device="cuda", dtype=dtype) * 4
    x[1, 5:9000] = -float("inf")
    x[2] = -float("inf")
    x[3, n // 3] = 1e4
    return x


def _assert_same_bits(x: torch.Tensor, config: Config, knobbed: Config, dtype_name: str):
    """The forward of x (_rows_with_extremes) with `knobbed` gives config's bits, and every row
    but the all -inf one is within the dtype's tolerance of the float64 softmax."""
    y = _forward(x, -1, direct, knobbed)
    y_config = _forward(x, -1, direct, config)
    assert torch.equal(y.view(torch.uint8), y_config.view(torch.uint8))
    keep = [row for row in range(x.shape[0]) if row != 2]
    assert relative_error(y[keep], torch.softmax(x[keep].double(), -1)) < TOLERANCES[dtype_name]


def test_widen_is_a_knob_of_the_bf16_smem_forward():
    """Config.widen takes two bf16 values a 32-bit word: any other dtype, the backward or
    another design is refused with a message naming the knob."""
    x = torch.randn(4, 300)
    with pretend_gpu((9, 0), 132):
        for tensors, backward, config in (
            ([x, x.clone()], False, Config("smem", 1, 8192, 4, exp2=2, by_pid=True, widen=True)),
            ([x.bfloat16(), x.bfloat16()], False, Config("online", 1, 512, 4, widen=True)),
            ([x.bfloat16()] * 3, True, Config("smem", 1, 8192, 4, by_pid=True, widen=True)),
            ([x.bfloat16(), x.bfloat16()], False,
             Config("smem", 1, 8192, 4, exp2=2, fold=2, widen=True)),
        ):  # fmt: skip
            with pytest.raises(ValueError, match="widen is a knob"):
                softmax_module._launch_rows(direct, tensors, backward, config)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp32"])
@pytest.mark.parametrize("lead, tail_pf, n", [(3, 0, 262144), (3, 2, 262144), (1, 1, 70000),
                                               (6, 0, 65536)])  # fmt: skip
def test_lead_programs_change_no_bits_on_gpu(lead, tail_pf, n, dtype_name):
    """Config.lead only adds programs that hold their slots ahead of the chunks' (the ticket is
    the program id less the leads), and tail_pf has some of them prefetch the last chunks into
    L2, so y must be the pick's bits: whole chunks and a ragged last one (its prefetch stops at
    the row's end, the tensor's last row too), more lead programs an SM than fit beside a chunk
    program (6), -inf entries, an all -inf row and 1e4; and within the dtype's tolerance of the
    float64 softmax."""
    x = _rows_with_extremes(9, n, DTYPES[dtype_name])
    pick = softmax_module._pick_config(n, 9, False, False, x.device, x.element_size(),
                                       smem_ok=True)  # fmt: skip
    assert pick.design == "smem" and pick.by_pid, pick
    if tail_pf:  # the prefetch reads whole chunks: not with interleave (16-bit picks)
        pick = pick._replace(interleave=False)
    _assert_same_bits(x, pick, pick._replace(lead=lead, lead_ns=700, tail_pf=tail_pf),
                      dtype_name)  # fmt: skip


@pytest.mark.gpu
def test_softmax_takes_lead_programs_on_a_big_grid_on_gpu():
    """softmax() on rows of several waves of 32 KB programs (200 rows of 16 chunks: 24.2 an SM
    on 132 SMs) launches the pick behind lead programs, and matches the float64 softmax."""
    x = torch.randn(200, 262144, device="cuda", dtype=torch.bfloat16) * 4
    x[7, 1000:200000] = -float("inf")
    x[8, 5] = 1e4
    pick = softmax_module._pick_config(262144, 200, False, False, x.device, 2, smem_ok=True)
    if softmax_module._sm_count(x.device) == 132:
        assert pick.lead == softmax_module.SMEM_LEAD_PER_SM, pick
    y = softmax_module.softmax(x, -1)
    assert relative_error(y, torch.softmax(x.double(), -1)) < TOLERANCES["bf16"]


def test_lead_is_a_knob_of_the_smem_forward_by_program_id():
    """Config.lead (programs an SM) and lead_ns go together, on the one-shot smem forward by
    program id only, and tail_pf takes at most lead: anything else is refused with a message
    naming the knob."""
    x = torch.randn(4, 300)
    smem = Config("smem", 1, 8192, 4, exp2=2, by_pid=True)
    with pretend_gpu((9, 0), 132):
        for tensors, backward, config in (
            ([x, x.clone()], False, smem._replace(lead=2)),  # no lead_ns
            ([x, x.clone()], False, smem._replace(lead_ns=1000)),  # no lead
            ([x, x.clone()], False, smem._replace(by_pid=False, lead=2, lead_ns=1000)),
            ([x, x.clone()], False, smem._replace(per_sm=1, lead=2, lead_ns=1000)),
            ([x] * 3, True, smem._replace(lead=2, lead_ns=1000)),
            ([x, x.clone()], False, Config("online", 1, 512, 4, lead=1, lead_ns=1000)),
        ):  # fmt: skip
            with pytest.raises(ValueError, match="lead .* knobs of the one-shot smem forward"):
                softmax_module._launch_rows(direct, tensors, backward, config)
        for config in (smem._replace(tail_pf=1), smem._replace(lead=1, lead_ns=500, tail_pf=2)):
            with pytest.raises(ValueError, match="tail_pf is a knob of the lead programs"):
                softmax_module._launch_rows(direct, [x, x.clone()], False, config)


def test_interleave_is_a_knob_of_the_smem_forward_by_program_id():
    """Config.interleave (round 28) on the one-shot smem forward by program id only, without
    the knobs that place a chunk's pieces themselves: anything else is refused with a message
    naming the knob, in _launch_rows and in softmax_smem.launch (which also wants rows of
    whole chunks)."""
    x = torch.randn(4, 300)
    smem = Config("smem", 1, 8192, 4, exp2=2, by_pid=True, interleave=True)
    with pretend_gpu((9, 0), 132):
        for tensors, backward, config in (
            ([x, x.clone()], False, smem._replace(by_pid=False)),
            ([x, x.clone()], False, smem._replace(per_sm=1)),
            ([x, x.clone()], False, smem._replace(one_copy=True)),
            ([x, x.clone()], False, smem._replace(fold=2)),
            ([x, x.clone()], False, smem._replace(left_group=2)),
            ([x, x.clone()], False, smem._replace(lead=1, lead_ns=500, tail_pf=1)),
            ([x] * 3, True, smem),
            ([x, x.clone()], False, Config("online", 1, 512, 4, interleave=True)),
        ):  # fmt: skip
            with pytest.raises(ValueError, match="interleave is a knob of the one-shot smem"):
                softmax_module._launch_rows(direct, tensors, backward, config)
        smem_module = softmax_module.softmax_smem
        ws = torch.zeros(smem_module.workspace_words(6, 3, True), dtype=torch.int64)
        for n, backward, extra in (
            (8192 * 2 + 8, False, {}),  # rows not whole chunks (so not even)
            (8192 * 2, False, dict(even=True, one_copy=True)),
            (8192 * 2, False, dict(even=True, piece=256)),  # not the 512-wide piece
            (8192 * 2, True, dict(even=True)),
        ):  # fmt: skip
            x = torch.randn(2, n)
            with pytest.raises(ValueError, match="interleave is a knob of the one-shot forward"):
                smem_module.launch(direct, backward, [x, x.clone()], ws, None, (1, 2),
                                   [(x.numel(), n, 1)] * 2, 8192, 4, by_pid=True,
                                   interleave=True, **extra)  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("n, lead", [(32768, 0), (65536, 0), (262144, 0), (262144, 3),
                                     (70000, 0)])  # fmt: skip
def test_interleaved_chunks_on_gpu(dtype_name, n, lead):
    """Config.interleave (round 28): a row's chunks interleaved piece by piece give the float64
    softmax within the dtype's tolerance, rows of 2, 4 and 16 chunks (and behind leads), -inf
    entries, an all -inf row (NaN, as torch), 1e4; every row sums to 1. On rows that are not
    whole chunks (70000) the chunks stay whole: the pick's bits."""
    x = _rows_with_extremes(9, n, DTYPES[dtype_name])
    pick = softmax_module._pick_config(n, 9, False, False, x.device, x.element_size(),
                                       smem_ok=True)  # fmt: skip
    assert pick.design == "smem" and pick.by_pid, pick
    config = pick._replace(interleave=True, lead=lead, lead_ns=700 if lead else 0)
    if n % pick.block_cols:
        _assert_same_bits(x, pick._replace(interleave=False), config, dtype_name)
        return
    y = _forward(x, -1, direct, config)
    keep = [row for row in range(x.shape[0]) if row != 2]
    ref = torch.softmax(x[keep].double(), -1)
    assert relative_error(y[keep], ref) < TOLERANCES[dtype_name]
    assert torch.isnan(y[2]).all()
    ones = torch.ones(len(keep), device=x.device, dtype=torch.float64)
    torch.testing.assert_close(y[keep].double().sum(-1), ones, rtol=0,
                               atol=TOLERANCES[dtype_name])  # fmt: skip


# -- the first call's choice (softmax_module._tuned_config) --


def _fake_timer(times_by_label, calls=None):
    """A _time_candidate stand-in: runs the candidate once (so its output is computed) and
    gives the time listed for its label, or 1.0."""

    def timer(fn):
        fn()
        candidate = fn.args[0]
        if calls is not None:
            calls.append(candidate)
        return times_by_label.get(softmax_module._label(candidate), 1.0)

    return timer


@pytest.mark.parametrize(
    "itemsize, cols, rows, want",
    [
        # bf16 N = 128, rows enough for every SM: the pick (8 rows on 2 warps), then 1, 2 and 4 KB
        (2, 128, 2**20, [(8, 2), (4, 2), (8, 4), (16, 8)]),
        (2, 1024, 2**17, [(1, 2), (1, 4), (2, 8)]),  # a row is 2 KB: at least one row a tile
        (4, 512, 2**18, [(2, 4), (1, 4), (2, 8)]),
        (4, 128, 2**20, [(8, 4), (2, 2), (4, 4), (8, 8)]),  # (fp32 1024 takes the row loop)
        (2, 128, 64, [(1, 2), (1, 1)]),  # 64 rows on 132 SMs: one row a program
    ],
)
def test_tile_candidates(itemsize, cols, rows, want):
    """The pick, the tiles (want: rows and warps of each, the pick first), then (round 24) the
    row loop on the same blocks as the tiles after the pick, in the online pick's form."""
    with pretend_gpu((9, 0), 132):
        device = torch.device("cuda")
        pick = softmax_module._pick_config(cols, rows, False, False, device, itemsize)
        got = softmax_module._tile_candidates(pick, rows, 1, itemsize, device)
    assert got[0] == pick and pick.design == "tile"
    tiles = [c for c in got if c.design == "tile"]
    loops = [c for c in got if c.design == "online"]
    assert len(tiles) + len(loops) == len(got) == len(set(got))
    assert [(c.block_rows, c.num_warps) for c in tiles] == want
    assert [(c.block_rows, c.num_warps) for c in loops] == want[1:] or (
        want[1:] == [] and loops == []
    )  # fmt: skip
    for c in got[1:]:  # one 16-byte access a thread, at least one row, no masks, int32
        assert c.block_cols == cols and c.even and c.int32
        assert (c.evict, c.exp2) == ((True, 1) if c.design == "online" else (False, 0))
        if c.block_rows * cols * itemsize >= 512:
            assert c.block_rows * cols * itemsize == c.num_warps * 32 * 16


def test_tuned_config_times_once_keeps_the_fastest_and_logs_it(monkeypatch):
    candidates = [Config("tile", 8, 128, 2), Config("tile", 4, 128, 2), Config("tile", 8, 128, 4)]
    calls, runs = [], []
    times = {"tile 4x128 w2": 0.5, "tile 8x128 w4": 0.7}
    monkeypatch.setattr(softmax_module, "_time_candidate", _fake_timer(times, calls))
    monkeypatch.setattr(softmax_module, "_TUNED", {})
    log_before = len(softmax_module.TUNING_LOG)
    tuned = softmax_module._tuned_config
    assert tuned(("k",), lambda: candidates, runs.append, "forward bf16 8 x 128") == candidates[1]
    assert len(calls) == softmax_module.TUNE_ROUNDS * len(candidates)
    assert runs[: len(candidates)] == candidates  # each compiled and warmed up first
    (line,) = softmax_module.TUNING_LOG[log_before:]
    assert line.startswith("softmax forward bf16 8 x 128: chose tile 4x128 w2")
    assert "tile 8x128 w4 0.7" in line
    # remembered: no second timing, no second line
    assert tuned(("k",), lambda: candidates, runs.append, "again") == candidates[1]
    assert len(calls) == softmax_module.TUNE_ROUNDS * len(candidates)
    assert len(softmax_module.TUNING_LOG) == log_before + 1
    # a tie keeps the earlier candidate (the pick comes first)
    monkeypatch.setattr(softmax_module, "_time_candidate", _fake_timer({}))
    assert tuned(("tie",), lambda: candidates, runs.append, "tie") == candidates[0]


def test_reset_tuning_empties_the_cache(monkeypatch):
    from kernels._common import reset_tuning

    monkeypatch.setattr(softmax_module, "_time_candidate", _fake_timer({}))
    softmax_module._tuned_config(("reset",), lambda: [Config("tile", 1, 128, 1)], print, "r")
    assert ("reset",) in softmax_module._TUNED
    reset_tuning()
    assert softmax_module._TUNED == {}


def test_tuning_only_where_a_direct_gpu_launch_can_time(device):
    assert not softmax_module._tunable(direct, torch.device("cpu"))
    with pretend_gpu((9, 0), 132):  # a pretended GPU (experiments.resources) never times
        assert not softmax_module._tunable(direct, torch.device("cpu"))
    if device == "cuda":
        assert softmax_module._tunable(direct, torch.device("cuda"))
        assert not softmax_module._tunable(lambda kernel: kernel, torch.device("cuda"))


@pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:divide by zero encountered")
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize(
    "shape, dim, cols",
    [((64, 128), -1, 128), ((45, 101), -1, 101), ((7, 9, 33), 1, 9), ((3, 16, 512), -1, 512)],
)
def test_every_tuning_candidate_is_correct(shape, dim, cols, dtype_name, device):
    """Each tile the first call may time, on full and ragged blocks, a middle dim, extremes."""
    dtype = DTYPES[dtype_name]
    x = torch.randn(shape, device=device) * 3
    x.select(dim, 0).fill_(2.5)  # equal values along the rows
    x.view(-1)[5] = 1e4 if dtype != torch.float16 else 1e3
    x = x.to(dtype)
    rows = x.numel() // cols
    with pretend_gpu((9, 0), 4):  # few SMs: these few rows still fill tiles of several rows
        pick = softmax_module._pick_config(
            cols, rows, False, False, torch.device("cuda"), x.element_size()
        )
        candidates = softmax_module._tile_candidates(
            pick, rows, 1, x.element_size(), torch.device("cuda")
        )
    assert len(candidates) > 1
    ref = torch.softmax(x.double(), dim)
    for config in candidates:
        y = _forward(x, dim, direct, config)
        assert relative_error(y, ref) < TOLERANCES[dtype_name], config


@pytest.mark.parametrize("dtype_name", DTYPES)
def test_first_call_tunes_the_short_row_forward_once(dtype_name, device, monkeypatch):
    """Through softmax(): the forward of short rows takes the fastest candidate (by a fake
    timer here), keeps it for the next call, and stays correct; non-contiguous rows and the
    backward are not timed."""
    dtype = DTYPES[dtype_name]
    calls = []
    monkeypatch.setattr(softmax_module, "_tunable", lambda launch, device: launch is direct)
    monkeypatch.setattr(softmax_module, "_TUNED", {})
    x = torch.randn(96, 128, device=device).to(dtype).requires_grad_()
    monkeypatch.setattr(softmax_module, "TUNE_MIN_BYTES", x.nbytes)
    small = torch.randn(95, 128, device=device).to(dtype)  # a byte short: keeps the pick
    assert relative_error(softmax(small, -1), torch.softmax(small.double(), -1)) < 0.01
    assert softmax_module._TUNED == {}
    itemsize = x.element_size()
    pick = softmax_module._pick_config(128, 96, False, False, x.device, itemsize)
    last = softmax_module._tile_candidates(pick, 96, 1, itemsize, x.device)[-1]
    times = {softmax_module._label(last): 0.1}
    monkeypatch.setattr(softmax_module, "_time_candidate", _fake_timer(times, calls))
    log_before = len(softmax_module.TUNING_LOG)
    y = softmax(x, -1)
    assert relative_error(y, torch.softmax(x.double(), -1)) < TOLERANCES[dtype_name]
    assert list(softmax_module._TUNED.values()) == [last]
    timed = len(calls)
    assert timed > 0
    y2 = softmax(x.detach() * 1.5, -1)  # same shape: no new timing
    assert len(calls) == timed
    tol = TOLERANCES[dtype_name]
    assert relative_error(y2, torch.softmax(x.detach().double() * 1.5, -1)) < tol
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    y64 = torch.softmax(x.double(), -1)
    dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(-1, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES[dtype_name]
    lines = softmax_module.TUNING_LOG[log_before:]
    name = str(dtype).removeprefix("torch.")
    assert len(lines) == 1 and lines[0].startswith(f"softmax forward {name} 96 x 128: chose ")
    # rows adjacent in memory (softmax over dim 0) take the adjacent-rows tile: not timed
    xt = torch.randn(128, 40, device=device).to(dtype)
    assert relative_error(softmax(xt, 0), torch.softmax(xt.double(), 0)) < TOLERANCES[dtype_name]
    assert len(softmax_module._TUNED) == 1


def test_online_candidates():
    """Round 24: the row loop's pick, then Inductor's arithmetic (lanes 4, the stores' default
    policy), then half the warps where the pick has 8 or more."""
    with pretend_gpu((9, 0), 132):
        device = torch.device("cuda")
        fp32 = softmax_module._pick_config(4096, 32768, False, False, device, 4)
        bf16 = softmax_module._pick_config(4096, 32768, False, False, device, 2)
    assert fp32.design == bf16.design == "online" and fp32.num_warps >= 8 > bf16.num_warps
    got = softmax_module._online_candidates(fp32)
    assert got == [fp32, fp32._replace(lanes=4, store_default=True),
                   fp32._replace(num_warps=fp32.num_warps // 2)]  # fmt: skip
    assert softmax_module._online_candidates(bf16) == [bf16, bf16._replace(lanes=4,
                                                                          store_default=True)]
    assert len(set(got)) == 3
    assert softmax_module._label(got[1]).endswith(" lanes4")
    assert [softmax_module._label(c) for c in got[::2]] == ["online 1x4096 w16", "online 1x4096 w8"]


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_first_call_tunes_the_row_loop(dtype_name, device, monkeypatch):
    """Round 24, through softmax(): the forward of rows that take the row loop times its
    candidates (_online_candidates; a fake timer) and keeps the fastest, Inductor's form
    here, whose output is correct (rows of 4096 with extremes and a ragged last row count);
    the backward is not timed."""
    dtype = DTYPES[dtype_name]
    calls = []
    monkeypatch.setattr(softmax_module, "_tunable", lambda launch, device: launch is direct)
    monkeypatch.setattr(softmax_module, "_TUNED", {})
    x = torch.randn(5, 4096, device=device) * 3
    x[1, 7], x[2, :100] = 1e4, -float("inf")
    x = x.to(dtype).requires_grad_()
    monkeypatch.setattr(softmax_module, "TUNE_MIN_BYTES", x.nbytes)
    pick = softmax_module._pick_config(4096, 5, False, False, x.device, x.element_size())
    assert pick.design == "online"
    inductor_form = pick._replace(lanes=4, store_default=True)
    times = {softmax_module._label(inductor_form): 0.1}
    monkeypatch.setattr(softmax_module, "_time_candidate", _fake_timer(times, calls))
    y = softmax(x, -1)
    assert relative_error(y, torch.softmax(x.double(), -1)) < TOLERANCES[dtype_name]
    assert list(softmax_module._TUNED.values()) == [inductor_form]
    assert set(calls) == set(softmax_module._online_candidates(pick))
    timed = len(calls)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, dy)
    y64 = torch.softmax(x.double(), -1)
    dx_ref = y64 * (dy.double() - (y64 * dy.double()).sum(-1, keepdim=True))
    assert relative_error(dx, dx_ref) < TOLERANCES[dtype_name]
    assert len(calls) == timed and len(softmax_module._TUNED) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(65536, 128), (16384, 512), (4096, 1024), (2048, 4096)])
def test_first_call_tuning_on_gpu(shape, dtype_name, monkeypatch):
    """On the GPU the first call times its candidates with the real timer and writes one line;
    the choice is correct, and a CUDA graph captured on a new shape keeps the pick untimed.
    Short-row tiles and (round 24) the row loop are timed."""
    monkeypatch.setattr(softmax_module, "_TUNED", {})
    dtype = DTYPES[dtype_name]
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    log_before = len(softmax_module.TUNING_LOG)
    y = softmax(x, -1)
    torch.testing.assert_close(
        y.double(), torch.softmax(x.double(), -1), rtol=0, atol=TOLERANCES[dtype_name]
    )
    assert relative_error(y, torch.softmax(x.double(), -1)) < TOLERANCES[dtype_name]
    pick = softmax_module._pick_config(shape[1], shape[0], False, False, x.device, x.element_size())
    assert pick.design in ("tile", "online")
    (line,) = softmax_module.TUNING_LOG[log_before:]
    (chosen,) = softmax_module._TUNED.values()
    assert f"chose {softmax_module._label(chosen)} (" in line
    # a tile's candidates include the row loop on its blocks (round 24); the row loop's are
    # row loops
    assert chosen.design in (("tile", "online") if pick.design == "tile" else ("online",))
    # capture on a shape not yet tuned (more rows: the next power of 2): no timing inside it
    w = torch.randn(shape[0] + 3, shape[1], device="cuda", dtype=dtype)
    monkeypatch.setattr(softmax_module, "TUNE", False)
    softmax(w, -1)  # compiles the pick's kernel for w outside the capture, untimed
    monkeypatch.setattr(softmax_module, "TUNE", True)
    tuned_before = len(softmax_module._TUNED)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        out = softmax(w, -1)
    assert len(softmax_module._TUNED) == tuned_before
    w.copy_(torch.randn_like(w) * 2)
    graph.replay()
    torch.cuda.synchronize()
    assert relative_error(out, torch.softmax(w.double(), -1)) < TOLERANCES[dtype_name]


def test_round18_probe_candidates_are_valid():
    """Round 18: forward only, past the tile; smem chunks whose held pieces are a power of 2
    below the chunk's pieces (16 bytes a thread each), named for their chunk and warps."""
    probe = importlib.import_module("experiments.probe_softmax")
    with pretend_gpu((9, 0), 132):
        for n in (16384, 65536, 262144):
            for itemsize in (2, 4):
                assert not probe.round18_candidates(n, itemsize, True)
                cands = probe.round18_candidates(n, itemsize, False)
                if n == softmax_module.ONE_PASS_MAX_ELEMS:  # smem on rows of one or two chunks
                    assert [c.block_cols for c in cands.values()] == [n, n // 2]
                    assert all(c.design == "smem" for c in cands.values())
                    continue
                assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
                for name, cfg in cands.items():
                    pieces = cfg.block_cols * itemsize // (16 * 32 * cfg.num_warps)
                    assert cfg.block_rows == 1
                    if name == "default_p":
                        assert cfg.per_sm == -1 and not cfg.regs
                        continue
                    if name.startswith(("loop", "online")):
                        assert cfg.evict and not cfg.regs
                        assert cfg.loop_cols == 0 or cfg.block_cols % cfg.loop_cols == 0
                        assert -(-n // cfg.block_cols) <= softmax_module.MAX_SPLIT_CHUNKS
                        continue
                    assert cfg.design == "smem" and not cfg.per_sm
                    assert cfg.regs == 0 or (cfg.regs & (cfg.regs - 1) == 0 and cfg.regs < pieces)
                    kbytes = cfg.block_cols * itemsize // 1024
                    assert name.startswith(f"c{kbytes}K_w{cfg.num_warps}")


def test_phase_summary_of_known_stamps():
    """experiments.probe_softmax_phases.summarize on made-up stamps: 2 rows of 2 chunks on one
    SM, each program 0.5 us to its ticket, then 1 / 2 / 3 us (clock64 at 1000 cycles a us);
    the second row enters 10 us after the first, chunk 1 of a row 0.5 us after chunk 0."""
    phases = importlib.import_module("experiments.probe_softmax_phases")
    stamps = torch.zeros(4, phases.STAMPS, dtype=torch.int64)
    for ticket in range(4):
        entry = 10_000 * (ticket // 2) + 500 * (ticket % 2)  # ns
        g = [entry + 500, entry + 1500, entry + 3500, entry + 6500]
        stamps[ticket, 0:4] = torch.tensor(g)
        stamps[ticket, 4:8] = torch.tensor(g)  # cycles at 1 GHz: one a ns
        stamps[ticket, 9] = stamps[ticket, 10] = entry
    out = "\n".join(phases.summarize(stamps, n_chunks=2, sms=1))
    assert "17.00 us (first start to last end), 4 programs, SM clock 1000 MHz" in out
    assert "1.53 programs alive" in out  # 4 x 6.5 us over 17 us
    assert "ticket                0.50 /    0.50 /    0.50     7.7%" in out
    assert "wait                  2.00 /    2.00 /    2.00    30.8%" in out
    # two slots (both chunks of a row at once): each empty from 6.5 to 10 us
    assert "a slot empty between programs    3.50 /    3.50 /    3.50 us" in out
    assert "start spread    0.50 /    0.50 /    0.50 us" in out
    assert "ramp (to the first end) 6.50 us, tail (from the last start) 6.50 us" in out
    # writes end at 6.5, 7, 16.5 and 17 us: 10-90% of them over 10.2 us is 0.31 a us, 12.75 us
    # for all four, 4.25 less than the launch
    assert "all of them at that rate 12.75 us, so 4.25 us more a launch" in out
    # at 0, 2, 4, ... us: the first row's programs load (to 1.5 / 2), wait (to 3.5 / 4), write
    assert "first 16 us, programs every 2 us: loading 1 0 0 0 0 1 0 0; waiting 0 2 0" in out
    assert "last 16 us, programs every 2 us: loading 2 0 0 0 0 2 0 0;" in out


def _long_row_round_candidates(round_no: int, itemsizes=(2, 4)):
    """(n, itemsize, candidates) of a forward-only probe round past the tile, over N = 16384,
    65536 and 262144 in 16-bit and fp32 (or `itemsizes`), having checked that it has none for
    the backward and none for rows the tile takes. Run inside pretend_gpu."""
    probe = importlib.import_module("experiments.probe_softmax")
    for n in (16384, 65536, 262144):
        for itemsize in itemsizes:
            assert not probe.ROUND_CANDIDATES[round_no](n, itemsize, True)
            cands = probe.ROUND_CANDIDATES[round_no](n, itemsize, False)
            assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
            yield n, itemsize, cands


def _long_row_round_picks(round_no: int, itemsizes=(2, 4)):
    """(itemsize, candidates, the one-row pick) of _long_row_round_candidates past the tile
    only. Run inside pretend_gpu."""
    for n, itemsize, cands in _long_row_round_candidates(round_no, itemsizes):
        if n > softmax_module.ONE_PASS_MAX_ELEMS:  # none at the tile's (checked by the helper)
            pick = softmax_module._pick_config(n, 1, False, False, torch.device("cuda"),
                                               itemsize, smem_ok=True)  # fmt: skip
            yield itemsize, cands, pick


def test_round19_probe_candidates_are_valid():
    """Round 19: forward only, past the tile; the pick's chunks by program id on other chunks,
    poll intervals, without the fallback or the cap; earlier rounds' smem knobs keep the
    ticket."""
    probe = importlib.import_module("experiments.probe_softmax")
    with pretend_gpu((9, 0), 132):
        for n, itemsize, cands in _long_row_round_candidates(19):
            for name, cfg in cands.items():
                assert cfg.design == "smem" and not cfg.per_sm and cfg.by_pid, name
                assert (cfg.leave_polls == -1) == ("nohelp" in name)
                assert cfg.block_cols * itemsize % (16 * 32 * cfg.num_warps) == 0
            for round_no in (14, 17, 18):
                for cfg in probe.ROUND_CANDIDATES[round_no](n, itemsize, False).values():
                    assert not cfg.by_pid


def test_round22_probe_candidates_are_valid():
    """Round 22, the forward past the tile only: the persistent smem kernel by program id on the
    pick's chunk and on half of it; the pick copied in as one copy, with and without masks."""
    with pretend_gpu((9, 0), 132):
        for _, itemsize, cands in _long_row_round_candidates(22):
            for name, cfg in cands.items():
                assert cfg.design == "smem" and cfg.by_pid, name
                assert bool(cfg.per_sm) == name.startswith("ppid"), name
                assert cfg.one_copy == name.startswith("one_copy"), name
                assert cfg.even == (name != "one_copy_masked"), name
                assert cfg.block_cols * itemsize % (16 * 32 * cfg.num_warps) == 0
                assert 2 * cfg.block_cols * itemsize <= softmax_module.SMEM_MAX_BYTES
                if cfg.per_sm:
                    assert cfg.maxnreg == 0, name


def test_round23_probe_candidates_are_valid():
    """Round 23, the forward past the tile only: the one-shot pick leaving after fewer polls,
    some with the left chunks written several pieces a step."""
    with pretend_gpu((9, 0), 132):
        for itemsize, cands, pick in _long_row_round_picks(23):
            for name, cfg in cands.items():
                polls, _, group = name.removeprefix("lp").partition("_g")
                assert cfg == pick._replace(leave_polls=int(polls), left_group=int(group or 1),
                                            interleave=pick.interleave and not group), name
                pieces = cfg.block_cols * itemsize // (16 * 32 * cfg.num_warps)
                assert pieces % cfg.left_group == 0, name


def test_round26_probe_candidates_are_valid():
    """Round 26, the bf16 forward past the tile only: the pick widening by integer ops, and
    that with the chunk copied in as one copy; nothing for fp32."""
    with pretend_gpu((9, 0), 132):
        for _, cands, pick in _long_row_round_picks(26, itemsizes=(2,)):
            assert cands == {"widen": pick._replace(widen=True),
                             "widen_1c": pick._replace(widen=True, one_copy=True)}
        probe = importlib.import_module("experiments.probe_softmax")
        assert not probe.round26_candidates(262144, 4, False)


def test_round26_probe_smoke():
    """The probe's round 26 on the interpreter (the smem variants run as split2)."""
    out = _probe_smoke("--round26")
    assert "widen_1c" in out and " 70000 " in out


def test_round27_probe_candidates_are_valid():
    """Round 27, the forward past the tile only: the pick behind 3-5 lead programs an SM, in
    1.25-1.75 us tiers; 4 x 1.5 us with polls 100 and 400 ns apart, and with 1, 2 or 4 of its
    leads an SM prefetching the last chunks; the pick without leads."""
    with pretend_gpu((9, 0), 132):
        for _, cands, pick in _long_row_round_picks(27):
            assert not pick.lead  # one row: a small grid
            want = {f"lead{k}_{ns / 1000:g}us": pick._replace(lead=k, lead_ns=ns)
                    for k, ns in ((3, 1500), (4, 1250), (4, 1500), (4, 1750), (5, 1250))}
            for sleep_ns in (100, 400):
                want[f"lead4_1.5us_s{sleep_ns}"] = pick._replace(lead=4, lead_ns=1500,
                                                                  sleep_ns=sleep_ns)  # fmt: skip
            for k in (1, 2, 4):
                want[f"lead4_1.5us_pf{k}"] = pick._replace(lead=4, lead_ns=1500, tail_pf=k,
                                                           interleave=False)  # fmt: skip
            assert cands == {**want, "nolead": pick}


def test_round27_probe_smoke():
    """The probe's round 27 on the interpreter (the smem variants run as split2)."""
    out = _probe_smoke("--round27")
    assert "lead4_1.5us_s400" in out and " 70000 " in out


def test_round28_probe_candidates_are_valid():
    """Round 28, the forward past the tile only: the pick's 32 KB chunks on half its warps
    uncapped, with and without leads, (fp32) on 8 warps capped at 40 registers, and with a
    row's chunks interleaved, with and without leads."""
    with pretend_gpu((9, 0), 132):
        for itemsize, cands, pick in _long_row_round_picks(28):
            half = pick.num_warps // 2
            want = {f"lead_w{half}": pick._replace(lead=4, lead_ns=1500, num_warps=half,
                                                   maxnreg=0),
                    f"w{half}_nolead": pick._replace(num_warps=half, maxnreg=0)}  # fmt: skip
            if itemsize == 4:
                assert pick.num_warps == 4
                want["lead_w8"] = pick._replace(lead=4, lead_ns=1500, num_warps=8, maxnreg=40)
            want["il"] = pick._replace(lead=4, lead_ns=1500, interleave=True)
            want["il_nolead"] = pick._replace(interleave=True)
            want["whole"] = pick._replace(lead=4, lead_ns=1500, interleave=False)
            assert cands == want
            for cfg in cands.values():  # whole 16-byte vectors a thread, a piece at a time
                assert cfg.block_cols * itemsize % (16 * 32 * cfg.num_warps) == 0


def test_round28_probe_smoke():
    """The probe's round 28 on the interpreter (the smem variants run as split2)."""
    out = _probe_smoke("--round28")
    assert "w4_nolead" in out and " 70000 " in out


def test_round23_probe_smoke():
    """The probe's round 23 on the interpreter (the smem variants run as split2)."""
    out = _probe_smoke("--round23")
    assert "lp8_g4" in out and " 70000 " in out


def test_round22_probe_smoke():
    """The probe's round 22 on the interpreter (the persistent smem variants run as split2)."""
    out = _probe_smoke("--round22")
    assert "one_copy_masked" in out and " 70000 " in out


def test_round21_probe_candidates_are_valid():
    """Round 21, past the tile: the backward's pick (one-shot, by program id, masked) beside
    round 11's persistent kernel, the ticket, no masks and other chunks; the forward pick's
    poly exp2 (16-bit only), 64 KB chunks, poll intervals, evict hints and folded partials;
    each a config the launch takes."""
    probe = importlib.import_module("experiments.probe_softmax")
    with pretend_gpu((9, 0), 132):
        for n in (16384, 65536, 262144):
            for itemsize in (2, 4):
                for backward in (False, True):
                    cands = probe.round21_candidates(n, itemsize, backward)
                    assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
                    for name, cfg in cands.items():
                        assert cfg.design == "smem", name
                        assert bool(cfg.per_sm) == (name == "persist"), name
                        assert cfg.by_pid == (name not in ("oneshot", "persist")), name
                        assert bool(cfg.poly) == name.startswith("poly"), name
                        assert not cfg.poly or itemsize == 2, name
                        assert cfg.fold == (int(name[4:]) if name.startswith("fold") else 0)
                        assert cfg.block_cols * itemsize % (16 * 32 * cfg.num_warps) == 0
                        if backward:
                            assert cfg.even == (name == "pid_even"), name
                    if cands:
                        assert ("persist" in cands) == backward
                        assert ("poly1" in cands) == (not backward and itemsize == 2)


def test_round20_probe_candidates_are_valid():
    """Round 20: forward only, past the tile; the pick (chunks by program id, even) beside the
    ticket, masks, no cap, never leaving and 16 KB chunks, each a config _launch_rows takes."""
    probe = importlib.import_module("experiments.probe_softmax")
    with pretend_gpu((9, 0), 132):
        for n in (16384, 65536, 262144):
            for itemsize in (2, 4):
                assert not probe.round20_candidates(n, itemsize, True)
                cands = probe.round20_candidates(n, itemsize, False)
                assert bool(cands) == (n > softmax_module.ONE_PASS_MAX_ELEMS)
                for name, cfg in cands.items():
                    assert cfg.design == "smem" and not cfg.per_sm, name
                    assert cfg.by_pid == (not name.startswith("ticket")), name
                    assert cfg.even == (name not in ("ticket", "masked")), name
                    assert (cfg.leave_polls == -1) == (name == "stay"), name
                    assert cfg.block_cols * itemsize % (16 * 32 * cfg.num_warps) == 0


def test_plan_key_tells_rows_apart():
    """_plan_key: shapes, strides, dtype, pass and each tensor's 16-byte alignment (a view one
    bf16 value into a row has the same shape and strides as the row, not its alignment)."""
    base = torch.randn(8, 130, dtype=torch.bfloat16)
    aligned, shifted = base[:, :128], base[:, 1:129]
    out = torch.empty(8, 128, dtype=torch.bfloat16)
    key = softmax_module._plan_key
    assert aligned.shape == shifted.shape and aligned.stride() == shifted.stride()
    assert key([aligned, out], False) == key([aligned, out], False)
    assert key([aligned, out], False) != key([shifted, out], False)
    assert key([aligned, out], False) != key([aligned, out], True)
    assert key([aligned, out], False) != key([aligned.contiguous(), out], False)
    assert key([out, out], False) != key([out.float(), out.float()], False)
    assert key([out, out], False) != key([out[:4], out[:4]], False)


def _planned_cases():
    """(dtype, shape, dim, view): the tile (short rows, masks and not), the row loop, rows one
    value into a wider buffer (16-bit: not 16-byte aligned), a non-last dim, a transposed
    view."""
    return [
        ("bf16", (64, 128), -1, None), ("fp32", (32, 1024), -1, None),
        ("fp16", (33, 1000), -1, None), ("fp32", (128, 4096), -1, None),
        ("bf16", (64, 128), -1, "shift"), ("fp32", (40, 24, 17), 1, None),
        ("bf16", (96, 48), 0, "t"),
    ]  # fmt: skip


def _planned_input(shape, dtype, view, aligned=False):
    if view == "shift":  # the rows of a (rows, cols + 2) buffer, from column 1 (0 if aligned)
        full = torch.randn(shape[0], shape[1] + 2, device="cuda", dtype=dtype) * 4
        return full[:, :-2] if aligned else full[:, 1:-1]
    if view == "t":
        return (torch.randn(shape[::-1], device="cuda", dtype=dtype) * 4).t()
    return torch.randn(shape, device="cuda", dtype=dtype) * 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", _planned_cases(), ids=lambda c: f"{c[0]}_{c[1]}_{c[2]}_{c[3]}")
def test_a_second_call_launches_its_plan_on_gpu(case):
    """The first direct call remembers its launch (_PLANS), and the next calls with the same
    key launch it on their own tensors: fresh inputs each call, forward and backward, against
    float64; the shifted rows' last call is on aligned rows of the same shape and strides,
    which take a plan of their own."""
    dtype_name, shape, dim, view = case
    dtype = DTYPES[dtype_name]
    for call in range(3):
        x = _planned_input(shape, dtype, view, aligned=call == 2).requires_grad_()
        y = softmax(x, dim)
        dy = torch.randn_like(y)
        y.backward(dy)
        ref = torch.softmax(x.detach().double(), dim)
        ref_dx = ref * (dy.double() - (ref * dy.double()).sum(dim, keepdim=True))
        assert relative_error(y.detach(), ref) < TOLERANCES[dtype_name], call
        assert relative_error(x.grad, ref_dx) < 4 * TOLERANCES[dtype_name], call
        if call == 0:  # the forward's plan and the backward's
            assert len(softmax_module._PLANS) == 2
    assert len(softmax_module._PLANS) == (3 if view == "shift" else 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_untimed_pick_is_not_remembered_on_gpu(monkeypatch):
    """A call that would time its candidates but may not (as inside a capture) launches the
    pick and remembers nothing; the next call that may, times them and then remembers its
    choice."""
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    monkeypatch.setattr(softmax_module, "TUNE_MIN_BYTES", 0)
    monkeypatch.setattr(softmax_module, "_TUNED", {})
    monkeypatch.setattr(softmax_module, "_tunable", lambda launch, device: False)
    torch.testing.assert_close(softmax(x, -1).float(), torch.softmax(x.float(), -1),
                               atol=1e-2, rtol=0)  # fmt: skip
    assert not softmax_module._PLANS
    calls = []
    monkeypatch.setattr(softmax_module, "_tunable", lambda launch, device: launch is direct)
    monkeypatch.setattr(softmax_module, "_time_candidate", _fake_timer({}, calls))
    torch.testing.assert_close(softmax(x, -1).float(), torch.softmax(x.float(), -1),
                               atol=1e-2, rtol=0)  # fmt: skip
    assert calls and len(softmax_module._PLANS) == 1
    calls.clear()
    softmax(x, -1)
    assert not calls  # remembered: neither timed again nor picked again
