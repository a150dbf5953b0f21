"""The tile design: rows that fit on chip, forward and backward, and the row-indexing helpers
the other Triton designs share.

A program holds a (BLOCK_ROWS, BLOCK_COLS) tile in registers: several short rows at once, so
that each thread loads 16 bytes at a time, or one row of up to ONE_PASS_MAX_ELEMS values. x is
read once and y written once. Rows are addressed through the tensors' own strides as (outer,
inner) row indices, so softmax over a middle dim or over a sliced view needs no copy.

Functions:
    _tile_rows, _columns    tile index -> row indices and their mask; the column arange
    _load_in, _store_out    loads and stores, unmasked where EVEN
    _exp_shifted            exp(x - shift) in the three forms Config.exp2 names
    _scaled                 x·scale where SCALED (softmax's scale=), masked lanes kept as filled
    softmax_tile_kernel             forward, a program a tile
    softmax_backward_tile_kernel    backward: dx = y * (dy - sum(y * dy))
"""

import triton
import triton.language as tl

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)


@triton.jit
def _tile_rows(tile, rows_inner, BLOCK_ROWS: tl.constexpr, INT32: tl.constexpr = False,
               ONE_OUTER: tl.constexpr = False):  # fmt: skip
    """Tile index -> one outer row index, BLOCK_ROWS consecutive inner ones, and their mask.

    Splitting the tile index rather than each row index keeps the inner indices an arange, so
    the compiler sees contiguous addresses when the inner row stride is 1. The indices are
    int64 unless INT32 (the caller knows every offset fits in 32 bits). ONE_OUTER: there is one
    outer index (rows_outer == 1), so no integer division before the first load.
    """
    if ONE_OUTER:
        outer = tile * 0
        first = tile * BLOCK_ROWS
    else:
        blocks_per_outer = tl.cdiv(rows_inner, BLOCK_ROWS)
        outer = tile // blocks_per_outer
        first = (tile % blocks_per_outer) * BLOCK_ROWS
    if not INT32:
        outer = outer.to(tl.int64)
        first = first.to(tl.int64)
    inner = first + tl.arange(0, BLOCK_ROWS)
    return outer, inner, inner < rows_inner


@triton.jit
def _columns(BLOCK_COLS: tl.constexpr, INT32: tl.constexpr):
    """tl.arange(0, BLOCK_COLS) as a (1, BLOCK_COLS) row, int64 unless INT32."""
    cols = tl.arange(0, BLOCK_COLS)
    if not INT32:
        cols = cols.to(tl.int64)
    return cols[None, :]


@triton.jit
def _load_in(ptrs, ok, fill, POLICY: tl.constexpr, EVEN: tl.constexpr):
    """tl.load of ptrs where ok (fill elsewhere); EVEN: every lane is in range, no mask."""
    if EVEN:
        x = tl.load(ptrs, eviction_policy=POLICY)
    else:
        x = tl.load(ptrs, mask=ok, other=fill, eviction_policy=POLICY)
    return x


@triton.jit
def _store_out(ptrs, y, ok, POLICY: tl.constexpr, EVEN: tl.constexpr):
    """tl.store of y where ok; EVEN: every lane is in range, no mask."""
    if EVEN:
        tl.store(ptrs, y, eviction_policy=POLICY)
    else:
        tl.store(ptrs, y, mask=ok, eviction_policy=POLICY)


@triton.jit
def _exp_shifted(x, shift, EXP2: tl.constexpr):
    """exp(x - shift[:, None]). EXP2 0: tl.exp (sub, mul, ex2 with denormal handling); 1:
    exp2((x - shift)·log2e); 2: exp2(x·log2e - shift·log2e), one FMA and an ex2, whose rounding
    of shift·log2e is an error relative to |shift|, not |x - shift| (no matter in 16-bit
    outputs). Every way, -inf entries give 0 and a shift of -inf (an all -inf row) gives NaN.
    """
    if EXP2 == 2:
        return tl.exp2(x * LOG2E - (shift * LOG2E)[:, None])
    elif EXP2 == 1:
        return tl.exp2((x - shift[:, None]) * LOG2E)
    else:
        return tl.exp(x - shift[:, None])


@triton.jit
def _scaled(x, scale, ok, SCALED: tl.constexpr, EVEN: tl.constexpr):
    """x·scale where SCALED (softmax's scale=: the product never goes through memory). Masked
    lanes keep their fill: a scale of 0 or below would turn -inf into NaN or +inf."""
    if SCALED:
        if EVEN:
            x = x * scale
        else:  # masked lanes times 1: their fill, with no NaN made on the way
            x = x * tl.where(ok, scale, 1.0)
    return x


@triton.jit
def softmax_tile_kernel(
    x_ptr, y_ptr,
    # sizes: rows are indexed (outer, inner), inner < rows_inner; each is n_cols long; n_tiles,
    # the grid, is not read (a program is its tile) but stays in the compiled signature
    rows_inner, n_cols, n_tiles,
    # strides, in elements: outer row dim, inner row dim, column
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    # softmax(x·scale): scale is read only where SCALED (scale != 1)
    scale, SCALED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
    # EVEN: n_cols == BLOCK_COLS and rows_inner % BLOCK_ROWS == 0 (no masks); INT32: every
    # offset fits in 32 bits (otherwise int64, so that column × stride cannot overflow when
    # softmax runs over an outer dim); ONE_OUTER: rows_outer == 1 (_tile_rows); DENSE: x's and
    # y's rows are BLOCK_COLS apart, so the row stride is a constant
    EVEN: tl.constexpr, INT32: tl.constexpr, ONE_OUTER: tl.constexpr, DENSE: tl.constexpr,
):  # fmt: skip
    if DENSE:
        x_stride_inner = BLOCK_COLS
        y_stride_inner = BLOCK_COLS
    cols = _columns(BLOCK_COLS, INT32)
    col_ok = cols < n_cols
    outer, inner, row_ok = _tile_rows(tl.program_id(0), rows_inner, BLOCK_ROWS, INT32, ONE_OUTER)
    row_ok = row_ok[:, None]
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    # Masked columns read -inf, which exp turns into 0. Rows past the end read 0 instead: an
    # all -inf row would compute NaNs (never stored, but the interpreter warns about them).
    fill = tl.where(row_ok, -float("inf"), 0.0)
    ok = row_ok & col_ok
    x = _load_in(x_rows + cols * x_stride_col, ok, fill, "", EVEN).to(tl.float32)
    x = _scaled(x, scale, ok, SCALED, EVEN)
    # A row of only -inf gives -inf - -inf = NaN everywhere, as torch.softmax does.
    exp = _exp_shifted(x, tl.max(x, axis=1), 0)
    y = (exp * (1.0 / tl.sum(exp, axis=1))[:, None]).to(y_ptr.dtype.element_ty)
    _store_out(y_rows + cols * y_stride_col, y, ok, "", EVEN)


@triton.jit
def softmax_backward_tile_kernel(
    y_ptr, dy_ptr, dx_ptr,
    rows_inner, n_cols, n_tiles,
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    # the gradient of softmax(x·scale): scale·y·(dy - Σ y·dy), scaled where SCALED
    scale, SCALED: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
):  # fmt: skip
    cols = tl.arange(0, BLOCK_COLS).to(tl.int64)[None, :]
    col_ok = cols < n_cols
    # a grid-stride loop over the tiles; the grid is one program a tile, so it runs once
    for tile in tl.range(tl.program_id(0), n_tiles, tl.num_programs(0), num_stages=1):
        outer, inner, row_ok = _tile_rows(tile, rows_inner, BLOCK_ROWS)
        mask = row_ok[:, None] & col_ok
        y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
        dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
        dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
        y = tl.load(y_rows + cols * y_stride_col, mask=mask, other=0.0)
        dy = tl.load(dy_rows + cols * dy_stride_col, mask=mask, other=0.0)
        y, dy = y.to(tl.float32), dy.to(tl.float32)
        dx = y * (dy - tl.sum(y * dy, axis=1)[:, None])
        if SCALED:
            dx = dx * scale
        tl.store(dx_rows + cols * dx_stride_col, dx.to(dx_ptr.dtype.element_ty), mask=mask)
