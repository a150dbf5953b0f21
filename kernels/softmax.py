"""Softmax over any dim of a tensor with any strides, forward and backward.

Softmax is memory-bound, so the target is eager torch.softmax's bandwidth: a row that fits on
chip is read once and written once; a longer row is read twice (online max/sum, then write).
Rows are addressed through the tensor's own strides, so softmax over a middle dim or over a
sliced view needs no transposing copy.
"""

import torch
import triton
import triton.language as tl

from kernels._common import Launcher, check_same, check_tensor, direct

# A program holds at most this many elements in registers for the one-pass kernel (16384 fp32
# values over 16 warps is 32 registers a thread); a longer row, or a block of rows that cannot
# fit, takes the two-pass loop. Tests lower it to reach the loop at small sizes.
ONE_PASS_MAX_ELEMS = 16384
# Tile of the two-pass loop: big enough to keep many loads in flight per program.
LOOP_TILE_ELEMS = 4096
# Short rows share a program until its tile holds this many elements, so N=7 is not 7 lanes busy.
MIN_TILE_ELEMS = 2048
# Softmax over an outer dim leaves neighbouring rows, not columns, adjacent in memory; a program
# then takes at least this many rows so each column load is one coalesced access across rows.
ADJACENT_ROWS = 32


def softmax_reference(x: torch.Tensor, dim: int) -> torch.Tensor:
    # reads MN, writes MN: 2·MN·bytes; rows too long for one pass read x twice: 3·MN·bytes
    x32 = x.float()
    exp = torch.exp(x32 - x32.amax(dim, keepdim=True))
    return (exp / exp.sum(dim, keepdim=True)).to(x.dtype)


@triton.jit
def _program_rows(rows_inner, BLOCK_ROWS: tl.constexpr):
    """One outer row index, BLOCK_ROWS consecutive inner ones, and a (BLOCK_ROWS, 1) row mask.

    Splitting the program id rather than each row index keeps the inner indices an arange, so
    the compiler sees contiguous addresses when the inner row stride is 1.
    """
    blocks_per_outer = tl.cdiv(rows_inner, BLOCK_ROWS)
    pid = tl.program_id(0)
    outer = (pid // blocks_per_outer).to(tl.int64)
    first_inner = ((pid % blocks_per_outer) * BLOCK_ROWS).to(tl.int64)
    inner = first_inner + tl.arange(0, BLOCK_ROWS)
    return outer, inner, (inner < rows_inner)[:, None]


@triton.jit
def softmax_kernel(
    # pointers
    x_ptr, y_ptr,
    # sizes: rows are indexed (outer, inner), inner < rows_inner; each is n_cols long
    rows_inner, n_cols,
    # strides, in elements: outer row dim, inner row dim, column
    x_stride_outer, x_stride_inner, x_stride_col,
    y_stride_outer, y_stride_inner, y_stride_col,
    # meta
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    # -- program-id mapping and pointer setup --
    outer, inner, row_ok = _program_rows(rows_inner, BLOCK_ROWS)
    x_rows = x_ptr + (outer * x_stride_outer + inner * x_stride_inner)[:, None]
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    # int64 so that column × stride cannot overflow when softmax runs over an outer dim
    cols = tl.arange(0, BLOCK_COLS).to(tl.int64)[None, :]
    # Masked columns read -inf, which exp turns into 0. Rows past the end read 0 instead: an
    # all -inf row would compute NaNs (never stored, but the interpreter warns about them).
    fill = tl.where(row_ok, -float("inf"), 0.0)

    if ONE_PASS:
        # -- whole row in registers --
        col_ok = cols < n_cols
        x = tl.load(x_rows + cols * x_stride_col, mask=row_ok & col_ok, other=fill)
        x = x.to(tl.float32)
        # A row of only -inf gives -inf - -inf = NaN everywhere, as torch.softmax does.
        exp = tl.exp(x - tl.max(x, axis=1)[:, None])
        y = exp / tl.sum(exp, axis=1)[:, None]
        tl.store(
            y_rows + cols * y_stride_col,
            y.to(y_ptr.dtype.element_ty),
            mask=row_ok & col_ok,
        )
    else:
        # -- main loop: online softmax, running max and a sum rescaled whenever the max grows --
        row_max = tl.full((BLOCK_ROWS,), -float("inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_ROWS,), tl.float32)
        for start in range(0, n_cols, BLOCK_COLS):
            col_ok = start + cols < n_cols
            x = tl.load(x_rows + (start + cols) * x_stride_col, mask=row_ok & col_ok, other=fill)
            x = x.to(tl.float32)
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            # Until a row has seen a finite value, shift by 0 rather than -inf: exp(-inf - 0) = 0
            # keeps the sum at 0, where exp(-inf - -inf) would poison it with NaN.
            shift = tl.where(new_max == -float("inf"), 0.0, new_max)
            row_sum = row_sum * tl.exp(row_max - shift) + tl.sum(tl.exp(x - shift[:, None]), axis=1)
            row_max = new_max
        # -- write-back: second read of the row --
        # An all -inf row keeps row_max = -inf, so exp(x - row_max) is NaN, matching torch.
        inv_sum = 1.0 / row_sum
        for start in range(0, n_cols, BLOCK_COLS):
            col_ok = start + cols < n_cols
            x = tl.load(x_rows + (start + cols) * x_stride_col, mask=row_ok & col_ok, other=fill)
            y = tl.exp(x.to(tl.float32) - row_max[:, None]) * inv_sum[:, None]
            tl.store(
                y_rows + (start + cols) * y_stride_col,
                y.to(y_ptr.dtype.element_ty),
                mask=row_ok & col_ok,
            )


@triton.jit
def softmax_backward_kernel(
    # pointers
    y_ptr, dy_ptr, dx_ptr,
    # sizes: as in softmax_kernel
    rows_inner, n_cols,
    # strides, in elements: outer row dim, inner row dim, column
    y_stride_outer, y_stride_inner, y_stride_col,
    dy_stride_outer, dy_stride_inner, dy_stride_col,
    dx_stride_outer, dx_stride_inner, dx_stride_col,
    # meta
    BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, ONE_PASS: tl.constexpr,
):  # fmt: skip
    # dx = y * (dy - sum(y * dy)) along each row.
    # -- program-id mapping and pointer setup --
    outer, inner, row_ok = _program_rows(rows_inner, BLOCK_ROWS)
    y_rows = y_ptr + (outer * y_stride_outer + inner * y_stride_inner)[:, None]
    dy_rows = dy_ptr + (outer * dy_stride_outer + inner * dy_stride_inner)[:, None]
    dx_rows = dx_ptr + (outer * dx_stride_outer + inner * dx_stride_inner)[:, None]
    cols = tl.arange(0, BLOCK_COLS).to(tl.int64)[None, :]

    if ONE_PASS:
        col_ok = cols < n_cols
        y = tl.load(y_rows + cols * y_stride_col, mask=row_ok & col_ok, other=0.0).to(tl.float32)
        dy = tl.load(dy_rows + cols * dy_stride_col, mask=row_ok & col_ok, other=0.0).to(tl.float32)
        dx = y * (dy - tl.sum(y * dy, axis=1)[:, None])
        tl.store(
            dx_rows + cols * dx_stride_col,
            dx.to(dx_ptr.dtype.element_ty),
            mask=row_ok & col_ok,
        )
    else:
        # -- main loop: the row's dot product y·dy --
        row_dot = tl.zeros((BLOCK_ROWS,), tl.float32)
        for start in range(0, n_cols, BLOCK_COLS):
            col_ok = start + cols < n_cols
            y = tl.load(y_rows + (start + cols) * y_stride_col, mask=row_ok & col_ok, other=0.0)
            dy = tl.load(dy_rows + (start + cols) * dy_stride_col, mask=row_ok & col_ok, other=0.0)
            row_dot += tl.sum(y.to(tl.float32) * dy.to(tl.float32), axis=1)
        # -- write-back --
        for start in range(0, n_cols, BLOCK_COLS):
            col_ok = start + cols < n_cols
            y = tl.load(y_rows + (start + cols) * y_stride_col, mask=row_ok & col_ok, other=0.0)
            dy = tl.load(dy_rows + (start + cols) * dy_stride_col, mask=row_ok & col_ok, other=0.0)
            dx = y.to(tl.float32) * (dy.to(tl.float32) - row_dot[:, None])
            tl.store(
                dx_rows + (start + cols) * dx_stride_col,
                dx.to(dx_ptr.dtype.element_ty),
                mask=row_ok & col_ok,
            )


def _normalize_dim(dim, ndim: int, shape: tuple) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise TypeError(f"dim must be an int, got {type(dim).__name__}")
    rank = max(ndim, 1)  # torch lets a 0-d tensor use dim 0 or -1
    if not -rank <= dim < rank:
        raise ValueError(f"dim {dim} is out of range for a tensor of shape {shape}")
    return dim % rank


def _row_dims(moved: list[torch.Tensor]):
    """Merge the leading (row) dims of same-shaped tensors whose last dim is the softmax dim.

    Adjacent dims merge when every tensor's strides allow it, so one row index can address them
    all. Returns (sizes, strides) with sizes = (rows_outer, rows_inner) and strides[i] =
    (outer, inner, col) for moved[i], or None when more than two row dims are left.
    """
    shape = moved[0].shape
    groups = []  # [size, per-tensor stride] of each merged dim, outermost first
    for d, size in enumerate(shape[:-1]):
        if size == 1:
            continue  # a size-1 dim's stride never matters
        strides = [t.stride(d) for t in moved]
        if groups and all(prev == s * size for prev, s in zip(groups[-1][1], strides, strict=True)):
            groups[-1] = [groups[-1][0] * size, strides]
        else:
            groups.append([size, strides])
    if len(groups) > 2:
        return None
    while len(groups) < 2:
        groups.insert(0, [1, [0] * len(moved)])
    (outer, outer_strides), (inner, inner_strides) = groups
    strides = [
        (so, si, t.stride(-1))
        for so, si, t in zip(outer_strides, inner_strides, moved, strict=True)
    ]
    return (outer, inner), strides


def _launch_rows(launch: Launcher, kernel, moved: list[torch.Tensor]) -> None:
    """Launch `kernel` over the rows of `moved` (inputs first, output last, same shape)."""
    n_cols = moved[0].shape[-1]
    if moved[0].numel() == 0:
        return
    layout = _row_dims(moved)
    if layout is None:
        # More than two non-mergeable row dims (e.g. a permuted 4-D view): the kernel decodes
        # only two row indices, so copy the inputs into plain rows. The output is contiguous.
        moved = [t.contiguous() for t in moved[:-1]] + moved[-1:]
        layout = _row_dims(moved)
    (rows_outer, rows_inner), strides = layout
    _, first_inner_stride, first_col_stride = strides[0]

    rows_adjacent = first_col_stride != 1 and first_inner_stride == 1
    min_rows = min(ADJACENT_ROWS if rows_adjacent else 1, triton.next_power_of_2(rows_inner))
    padded_cols = triton.next_power_of_2(n_cols)
    one_pass = min_rows * padded_cols <= ONE_PASS_MAX_ELEMS
    if one_pass:
        block_cols = padded_cols
        block_rows = max(min_rows, MIN_TILE_ELEMS // padded_cols)
        block_rows = min(block_rows, triton.next_power_of_2(rows_inner))
    else:
        block_rows = min_rows
        block_cols = min(LOOP_TILE_ELEMS, ONE_PASS_MAX_ELEMS) // block_rows
    tile = block_rows * block_cols
    num_warps = 4 if tile <= 2048 else 8 if tile <= 8192 else 16

    grid = (rows_outer * triton.cdiv(rows_inner, block_rows),)
    launch(kernel)[grid](
        *moved,
        rows_inner, n_cols,
        *(s for tensor_strides in strides for s in tensor_strides),
        BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols, ONE_PASS=one_pass,
        num_warps=num_warps,
    )  # fmt: skip


def softmax_forward(x: torch.Tensor, dim: int, *, launch: Launcher = direct) -> torch.Tensor:
    """torch.softmax(x, dim) without autograd; the output is a view of a row-major buffer."""
    check_tensor("x", x)
    dim = _normalize_dim(dim, x.dim(), tuple(x.shape))
    if x.dim() == 0:
        return softmax_forward(x.unsqueeze(0), 0, launch=launch).squeeze(0)
    x_moved = x.movedim(dim, -1)
    y_moved = torch.empty(x_moved.shape, device=x.device, dtype=x.dtype)
    _launch_rows(launch, softmax_kernel, [x_moved, y_moved])
    return y_moved.movedim(-1, dim)


def softmax_backward(
    y: torch.Tensor, dy: torch.Tensor, dim: int, *, launch: Launcher = direct
) -> torch.Tensor:
    """Gradient of softmax_forward: dx = y * (dy - sum(y * dy, dim)), y being its output."""
    check_tensor("y", y)
    check_tensor("dy", dy)
    check_same({"y": y, "dy": dy})
    if y.shape != dy.shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but y has {tuple(y.shape)}")
    dim = _normalize_dim(dim, y.dim(), tuple(y.shape))
    if y.dim() == 0:
        return softmax_backward(y.unsqueeze(0), dy.unsqueeze(0), 0, launch=launch).squeeze(0)
    y_moved, dy_moved = y.movedim(dim, -1), dy.movedim(dim, -1)
    dx_moved = torch.empty(y_moved.shape, device=y.device, dtype=y.dtype)
    _launch_rows(launch, softmax_backward_kernel, [y_moved, dy_moved, dx_moved])
    return dx_moved.movedim(-1, dim)


class _Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        y = softmax_forward(x, dim)
        ctx.save_for_backward(y)
        ctx.dim = dim
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return softmax_backward(y, dy, ctx.dim), None


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """torch.softmax(x, dim): same dtype out, fp32 math inside, differentiable once.

    A row that is entirely -inf gives NaN, as torch does; -inf entries in other rows give 0.
    """
    return _Softmax.apply(x, dim)
