"""The online design: a loop over the row, read twice (the max and sum, then the write).

Two uses. With the whole (padded) row one step and the first read kept in L2 (evict_last), it
is the forward of rows of one a program from ROW_LOOP_MIN_COLS columns up to the tile's limit:
Inductor's looped form, whose second read comes from cache, so that DRAM still sees one read
and a program holds nothing across the reduction. With shorter steps it is the fallback for
rows too long to split, forward and backward.

Functions:
    _max_nan, _lane_exp       Inductor's max (a NaN wins) and exp (libdevice's expf)
    softmax_online_kernel             forward: running max and rescaled sum, then the write
    softmax_backward_online_kernel    backward: the row's y·dy, then dx
"""

import triton
import triton.language as tl
from triton.language.extra import libdevice

from kernels.softmax.tile import _columns, _exp_shifted, _load_in, _scaled, _store_out, _tile_rows


@triton.jit
def _max_nan(a, b):
    """max(a, b) where a NaN wins, as Inductor's `maximum` (a select, not FMNMX)."""
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _lane_exp(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:  # expf (Inductor's exp where fast math is off)
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def softmax_online_kernel(
    x_ptr, y_ptr,
    rows_inner, n_cols,
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    # softmax(x·scale): scale is read only where SCALED (scale != 1), applied at both reads
    scale, SCALED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
    # the first read keeps x in L2 for the second (FIRST_POLICY), which may drop it (POLICY)
    FIRST_POLICY: tl.constexpr, POLICY: tl.constexpr, EXP2: tl.constexpr,
    # as the tile kernel's; EVEN here: n_cols a multiple of BLOCK_COLS
    EVEN: tl.constexpr, INT32: tl.constexpr,
    # the stores' policy
    STORE_POLICY: tl.constexpr,
    # ONE_OUTER and DENSE: as the tile kernel's; ONE_STEP: n_cols == BLOCK_COLS, so each loop
    # is one step of known bounds, straight code
    ONE_OUTER: tl.constexpr, ONE_STEP: tl.constexpr, DENSE: tl.constexpr,
    # INDUCTOR (Config.inductor): Inductor's arithmetic: the first pass keeps a running max and
    # sum per lane, not per row, combined across the row once; its max lets a NaN win; exp is
    # libdevice's expf where LIBDEVICE, and y a true division. The host passes LIBDEVICE False
    # under the Triton interpreter, which has no extern calls (tl.exp there)
    INDUCTOR: tl.constexpr, LIBDEVICE: tl.constexpr,
):  # fmt: skip
    if DENSE:
        x_stride_inner = BLOCK_COLS
        y_stride_inner = BLOCK_COLS
    outer, inner, row_ok = _tile_rows(tl.program_id(0), rows_inner, BLOCK_ROWS, INT32, ONE_OUTER)
    row_ok = row_ok[:, None]
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    cols = _columns(BLOCK_COLS, INT32)
    fill = tl.where(row_ok, -float("inf"), 0.0)
    end = n_cols
    if ONE_STEP:  # bounds the compiler knows: each loop folds to its one step
        end = BLOCK_COLS
    if INDUCTOR:  # each lane's own running max and sum, combined across the row once at the end
        lane_max = tl.full((BLOCK_ROWS, BLOCK_COLS), -float("inf"), tl.float32)
        lane_sum = tl.zeros((BLOCK_ROWS, BLOCK_COLS), tl.float32)
        for start in tl.range(0, end, BLOCK_COLS, num_stages=1):
            ok = row_ok & (start + cols < n_cols)
            x = _load_in(x_rows + (start + cols) * x_stride_col, ok, fill, FIRST_POLICY, EVEN)
            x = _scaled(x.to(tl.float32), scale, ok, SCALED, EVEN)
            new_max = _max_nan(lane_max, x)
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # as below
            lane_sum = (lane_sum * _lane_exp(lane_max - shift, LIBDEVICE)
                        + _lane_exp(x - shift, LIBDEVICE))  # fmt: skip
            lane_max = new_max
        row_max = tl.reduce(lane_max, 1, _max_nan)
        shift = tl.where(row_max == -float("inf"), 0.0, row_max)
        row_sum = tl.sum(lane_sum * _lane_exp(lane_max - shift[:, None], LIBDEVICE),
                         axis=1)  # fmt: skip
    else:
        # -- main loop: online softmax, running max and a sum rescaled whenever the max grows --
        row_max = tl.full((BLOCK_ROWS,), -float("inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_ROWS,), tl.float32)
        for start in tl.range(0, end, BLOCK_COLS, num_stages=1):
            ok = row_ok & (start + cols < n_cols)
            x = _load_in(x_rows + (start + cols) * x_stride_col, ok, fill, FIRST_POLICY, EVEN)
            x = _scaled(x.to(tl.float32), scale, ok, SCALED, EVEN)
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            # Until a row has seen a finite value, shift by 0 rather than -inf: exp(-inf - 0) =
            # 0 keeps the sum at 0, where exp(-inf - -inf) would poison it with NaN.
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)
            row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(_exp_shifted(x, shift, EXP2),
                                                                 axis=1)  # fmt: skip
            row_max = new_max
    # -- write-back: second read of the row --
    # An all -inf row keeps row_max = -inf, so exp(x - row_max) is NaN, matching torch.
    inv_sum = 1.0 / row_sum
    for start in tl.range(0, end, BLOCK_COLS, num_stages=1):
        ok = row_ok & (start + cols < n_cols)
        x = _load_in(x_rows + (start + cols) * x_stride_col, ok, fill, POLICY, EVEN)
        x = _scaled(x.to(tl.float32), scale, ok, SCALED, EVEN)
        if INDUCTOR:  # a true division, as Inductor's
            y = _lane_exp(x - row_max[:, None], LIBDEVICE)
            y = y / row_sum[:, None]
        else:
            y = _exp_shifted(x, row_max, EXP2) * inv_sum[:, None]
        y = y.to(y_ptr.dtype.element_ty)
        _store_out(y_rows + (start + cols) * y_stride_col, y, ok, STORE_POLICY, EVEN)


@triton.jit
def softmax_backward_online_kernel(
    y_ptr, dy_ptr, dx_ptr,
    rows_inner, n_cols,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    scale, SCALED: tl.constexpr,  # as the tile backward's
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    outer, inner, row_ok = _tile_rows(tl.program_id(0), rows_inner, BLOCK_ROWS)
    row_ok = row_ok[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
    cols = tl.arange(0, BLOCK_COLS).to(tl.int64)[None, :]
    # -- main loop: the row's dot product y·dy --
    row_dot = tl.zeros((BLOCK_ROWS,), tl.float32)
    for start in tl.range(0, n_cols, BLOCK_COLS, num_stages=1):
        ok = row_ok & (start + cols < n_cols)
        y = tl.load(y_rows + (start + cols) * y_stride_col, mask=ok, other=0.0)
        dy = tl.load(dy_rows + (start + cols) * dy_stride_col, mask=ok, other=0.0)
        row_dot += tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=1)
    # -- write-back --
    for start in tl.range(0, n_cols, BLOCK_COLS, num_stages=1):
        ok = row_ok & (start + cols < n_cols)
        y = tl.load(y_rows + (start + cols) * y_stride_col, mask=ok, other=0.0)
        dy = tl.load(dy_rows + (start + cols) * dy_stride_col, mask=ok, other=0.0)
        dx = y.to(tl.float32) * (dy.to(tl.float32) - row_dot[:, None])
        if SCALED:
            dx = dx * scale
        tl.store(dx_rows + (start + cols) * dx_stride_col, dx.to(dx_ptr.dtype.element_ty),
                 mask=ok)  # fmt: skip
