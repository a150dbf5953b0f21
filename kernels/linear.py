"""y = act(x @ weight.T + bias), differentiable, with every FLOP in Triton.

The forward is one launch of kernels.matmul's GEMM (two for skinny split-K shapes): weight.T is
weight with swapped strides, which the Hopper TMA kernel reads as a K-major B through a descriptor
over the weight as stored, and the bias add and activation run in its epilogue, where eager
PyTorch (addmm, then the activation) writes and re-reads the output. The backward is the same
GEMM plus one small kernel:

    dZ = dY * act'(Z)       activation_backward_kernel, which also sums dZ's columns for db from
    db = column sums of dZ  the same registers (fp32; a column_sum_kernel pass adds the partial
                            sums of the row-splits, in order: deterministic). For activation
                            "none" dZ = dY and column_sum_kernel alone gives db.
    dX = dZ @ W             fused_matmul, W as stored
    dW = dZ^T @ X           fused_matmul, dZ^T as swapped strides (a column-major A for TMA): no
                            transposed copies

Z, the pre-activation x @ weight.T + bias, is written by the forward epilogue in the input dtype
(a second store of the output tile) when an activation is used and a gradient is needed: that
costs M·N elements of memory, where recomputing Z would cost a whole extra GEMM in the backward.

Functions (the pieces kernels/ops.py composes into a custom op):
    linear(x, weight, bias=None, activation=None) -> y
        Public: x (..., in_features) with at least 2 dims, weight (out, in), bias (out,) or None;
        activation in ACTIVATIONS (None means "none"). Autograd-aware.
    check_linear_args(x, weight, bias)
        The TypeError/ValueError checks `linear` runs; the two functions below assume them.
    linear_forward(x2d, weight, bias, act_id, save_preact, *, launch=direct) -> (y, z | None)
        x2d (M, K) -> y (M, N); z is the pre-activation, returned only when save_preact.
    linear_backward(dy, x2d, weight, z, act_id, need_dx, need_dw, need_db, *, launch=direct)
        -> (dx | None, dw | None, db | None)
        z may be None when act_id is "none"; x2d may be None when not need_dw, weight when not
        need_dx. Each gradient is None unless asked for.
    linear_reference(x, weight, bias=None, activation=None) -> y
        The same computation in torch ops, for tests and benchmarks.

`launch` is kernels._common.direct or torch.library.wrap_triton; these functions allocate with
torch ops only and branch on shapes and flags, never on data.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels._common import (
    ACTIVATIONS,
    TORCH_ACTIVATIONS,
    activation_id,
    cdiv,
    check_same,
    check_tensor,
    direct,
)
from kernels.matmul import (
    GELU,
    GELU_TANH,
    GELU_TANH_CUBIC,
    RELU,
    SILU,
    SQRT_2_OVER_PI,
    SQRT_HALF,
    fused_matmul,
)

INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1/sqrt(2·pi), the normal density's scale


def linear_reference(x, weight, bias=None, activation=None):
    # 2·M·N·K FLOPs for M rows of x; reads (M·K + N·K + N)·bytes, writes M·N·bytes. Eager adds
    # a separate activation pass that reads and writes the M·N output again.
    return TORCH_ACTIVATIONS["none" if activation is None else activation](
        F.linear(x, weight, bias)
    )


@triton.jit
def activation_grad(z, ACTIVATION: tl.constexpr):
    """d act(z) / dz for fp32 z; the inverse of apply_activation in kernels.matmul."""
    if ACTIVATION == RELU:
        grad = tl.where(z > 0.0, 1.0, 0.0)
    elif ACTIVATION == GELU:
        # Phi(z) + z·phi(z)
        grad = 0.5 * (1.0 + tl.erf(z * SQRT_HALF)) + z * tl.exp(-0.5 * z * z) * INV_SQRT_2PI
    elif ACTIVATION == GELU_TANH:
        # d/dz [z·s] with s = sigmoid(2u), u = sqrt(2/pi)·(z + c·z³), and ds/du = 2·s·(1 - s)
        s = tl.sigmoid((z + z * z * z * GELU_TANH_CUBIC) * (2.0 * SQRT_2_OVER_PI))
        du_dz = (1.0 + z * z * (3.0 * GELU_TANH_CUBIC)) * SQRT_2_OVER_PI
        grad = s + z * 2.0 * s * (1.0 - s) * du_dz
    else:
        tl.static_assert(ACTIVATION == SILU, "activation_grad needs an activation other than none")
        s = tl.sigmoid(z)
        grad = s * (1.0 + z * (1.0 - s))
    return grad


@triton.jit
def activation_backward_kernel(
    # pointers: upstream gradient dY, saved pre-activation Z, output dZ, and the fp32 column sums
    # of dZ (one row of them per row-split; None when db is not needed)
    dy_ptr, z_ptr, dz_ptr, colsum_ptr,
    # sizes: all three are M×N; each program covers rows_per_program rows of BLOCK_N columns
    M, N, rows_per_program,
    # strides in elements (dY from autograd may be any view, even stride 0)
    stride_dym, stride_dyn, stride_zm, stride_zn, stride_dzm, stride_dzn, stride_cm,
    # meta-parameters
    ACTIVATION: tl.constexpr, COLUMN_SUMS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # dZ = dY * act'(Z), and db's partial column sums from the same registers: dZ is written
    # once and never read back for the bias gradient.
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_start = tl.program_id(1) * rows_per_program
    row_end = min(M, row_start + rows_per_program)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for m_start in range(row_start, row_end, BLOCK_M):
        offs_m = m_start + tl.arange(0, BLOCK_M)
        mask = (offs_m[:, None] < row_end) & (offs_n[None, :] < N)
        dy = tl.load(
            dy_ptr + offs_m[:, None] * stride_dym + offs_n[None, :] * stride_dyn, mask=mask
        )
        z = tl.load(z_ptr + offs_m[:, None] * stride_zm + offs_n[None, :] * stride_zn, mask=mask)
        dz = (dy.to(tl.float32) * activation_grad(z.to(tl.float32), ACTIVATION)).to(
            dz_ptr.dtype.element_ty
        )
        dz_ptrs = dz_ptr + offs_m[:, None] * stride_dzm + offs_n[None, :] * stride_dzn
        tl.store(dz_ptrs, dz, mask=mask)
        if COLUMN_SUMS:
            # Sum dZ as stored (rounded), as a separate pass over dZ would.
            acc += tl.where(mask, dz.to(tl.float32), 0.0)
    if COLUMN_SUMS:
        total = tl.sum(acc, axis=0)
        out_ptrs = colsum_ptr + tl.program_id(1) * stride_cm + offs_n
        tl.store(out_ptrs, total.to(colsum_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def column_sum_kernel(
    # pointers: input X, output sums (one row of them per row-split of X)
    x_ptr, out_ptr,
    # sizes: X is M×N; each program sums rows_per_program rows of BLOCK_N columns
    M, N, rows_per_program,
    # strides in elements
    stride_xm, stride_xn, stride_om,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # Programs own disjoint (row-split, column-block) tiles, so the sum needs no atomics and is
    # deterministic; splitting the rows is what gives a tall, narrow dZ enough programs.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    row_start = pid_m * rows_per_program
    row_end = min(M, row_start + rows_per_program)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for m_start in range(row_start, row_end, BLOCK_M):
        rows = m_start + offs_m
        mask = (rows[:, None] < row_end) & (offs_n[None, :] < N)
        x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_n[None, :] * stride_xn
        acc += tl.load(x_ptrs, mask=mask, other=0.0).to(tl.float32)
    # Reducing the BLOCK_M partial sums once at the end keeps the fp32 rounding error small.
    total = tl.sum(acc, axis=0)
    out_ptrs = out_ptr + pid_m * stride_om + offs_n
    tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=offs_n < N)


# Rows one column_sum_kernel program adds up: an 8192-row dZ gets 16 row-splits, enough programs
# to fill the GPU, while the second pass over the fp32 partial sums stays negligible.
COLUMN_SUM_ROWS = 512


# activation_backward_kernel's launch. Round 3 ran 16x128 blocks looping over 256 rows: 256
# programs for a 2048x4096 dZ, two per SM, 52.9 us on the H100 against eager's 35.8 and a
# copy-bandwidth floor of ~16 us (read dY and Z, write dZ: 48 MB). Each program takes
# DZ_BLOCK_M x DZ_BLOCK_N blocks (16-byte vector loads along N), and covers as few rows as keep
# the program count near DZ_PROGRAMS (a 2-D grid of single blocks up to that size); each program
# writes one fp32 row of column sums, and column_sum_kernel adds those rows in order: db is
# deterministic (no atomics). Measured at 2048x4096 gelu (H100, round 4, eager 37.2 us): 32x256
# w4 (round 4's default) 49.3 us, 64x256 w8 47.1, 16x512 w4 43.4 (shipped in round 5), round 3's
# 16x128 / 256 rows 53.6. To go back to round 4: DZ_BLOCK_M = 32, DZ_BLOCK_N = 256.
# Round 8 (probe round 4 (c), H100, eager 35.7 us): 8x512 w4 37.0 us against 16x512 w4's 45.1;
# it compiles to 128 registers for gelu instead of 168 (kernels/notes/matmul.md, rounds 7-8).
DZ_BLOCK_M = 8
DZ_BLOCK_N = 512
DZ_NUM_WARPS = 4
DZ_PROGRAMS = 1024  # ~8 per SM on an H100
# A fixed number of rows per program instead (round 3: 256, with DZ_BLOCK_M 16, DZ_BLOCK_N 128);
# None picks it from DZ_PROGRAMS.
ACTIVATION_BACKWARD_ROWS = None


def _dz_rows(M: int, N: int) -> int:
    """Rows per activation_backward_kernel program: a multiple of DZ_BLOCK_M."""
    if ACTIVATION_BACKWARD_ROWS:
        return ACTIVATION_BACKWARD_ROWS
    blocks = cdiv(M, DZ_BLOCK_M) * cdiv(N, DZ_BLOCK_N)
    return DZ_BLOCK_M * max(1, blocks // DZ_PROGRAMS)


def _activation_backward(dy, z, act_id, need_db, launch):
    """(dZ, db | None): dZ = dY * act'(Z), with db = column sums of dZ fused in when need_db."""
    M, N = dy.shape
    dz = torch.empty((M, N), device=dy.device, dtype=dy.dtype)
    db = torch.empty((N,), device=dy.device, dtype=dy.dtype) if need_db else None
    if dz.numel() == 0:
        if db is not None:
            db.zero_()
        return dz, db
    rows = _dz_rows(M, N)
    splits = cdiv(M, rows)
    partial = None
    if need_db:
        partial = (
            db if splits == 1 else torch.empty((splits, N), device=dy.device, dtype=torch.float32)
        )
    launch(activation_backward_kernel)[(cdiv(N, DZ_BLOCK_N), splits)](
        dy, z, dz, partial,
        M, N, rows,
        dy.stride(0), dy.stride(1), z.stride(0), z.stride(1), dz.stride(0), dz.stride(1),
        partial.stride(0) if partial is not None and partial.dim() == 2 else 0,
        ACTIVATION=act_id, COLUMN_SUMS=need_db, BLOCK_M=DZ_BLOCK_M, BLOCK_N=DZ_BLOCK_N,
        num_warps=DZ_NUM_WARPS,
    )  # fmt: skip
    if need_db and splits > 1:
        _launch_column_sum(partial, db, splits, launch)
    return dz, db


def _launch_column_sum(x, out, rows_per_program, launch):
    """Column sums of each rows_per_program rows of x (M, N): out is (N,) or (splits, N)."""
    M, N = x.shape
    grid = lambda META: (cdiv(N, META["BLOCK_N"]), max(1, cdiv(M, rows_per_program)))
    launch(column_sum_kernel)[grid](
        x, out,
        M, N, rows_per_program,
        x.stride(0), x.stride(1), out.stride(0) if out.dim() == 2 else 0,
        BLOCK_M=64, BLOCK_N=64,
    )  # fmt: skip


def _column_sum(x, launch):
    M, N = x.shape
    out = torch.empty((N,), device=x.device, dtype=x.dtype)
    if N == 0:
        return out
    splits = cdiv(M, COLUMN_SUM_ROWS)
    if splits <= 1:
        _launch_column_sum(x, out, COLUMN_SUM_ROWS, launch)
        return out
    partial = torch.empty((splits, N), device=x.device, dtype=torch.float32)
    _launch_column_sum(x, partial, COLUMN_SUM_ROWS, launch)
    _launch_column_sum(partial, out, splits, launch)
    return out


def linear_forward(x2d, weight, bias, act_id, save_preact, *, launch=direct):
    # weight.t() is a view: the GEMM reads W (N, K) as B (K, N) through swapped strides.
    return fused_matmul(x2d, weight.t(), bias, act_id, save_preact, launch=launch)


def linear_backward(dy, x2d, weight, z, act_id, need_dx, need_dw, need_db, *, launch=direct):
    if act_id == ACTIVATIONS["none"]:
        dz = dy
        db = _column_sum(dz, launch) if need_db else None
    else:
        dz, db = _activation_backward(dy, z, act_id, need_db, launch)
    dx = fused_matmul(dz, weight, launch=launch)[0] if need_dx else None
    dw = fused_matmul(dz.t(), x2d, launch=launch)[0] if need_dw else None
    return dx, dw, db


class _LinearFunction(torch.autograd.Function):
    """Autograd for a 2-D x; `linear` only routes here when some input needs a gradient."""

    @staticmethod
    def forward(ctx, x2d, weight, bias, act_id):
        save_preact = act_id != ACTIVATIONS["none"]
        y, z = linear_forward(x2d, weight, bias, act_id, save_preact)
        need_dx, need_dw, _ = ctx.needs_input_grad[:3]
        # Keep only what the requested gradients read: dX needs W, dW needs X.
        ctx.save_for_backward(x2d if need_dw else None, weight if need_dx else None, z)
        ctx.act_id = act_id
        return y

    @staticmethod
    def backward(ctx, dy):
        x2d, weight, z = ctx.saved_tensors
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        dx, dw, db = linear_backward(dy, x2d, weight, z, ctx.act_id, need_dx, need_dw, need_db)
        return dx, dw, db, None


def check_linear_args(x, weight, bias) -> None:
    check_tensor("x", x, min_ndim=2)
    check_tensor("weight", weight, ndim=2)
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
    check_same({"x": x, "weight": weight, "bias": bias})
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x has shape {tuple(x.shape)} but weight has shape {tuple(weight.shape)}: "
            "x's last dim must equal weight's in_features (dim 1)"
        )
    if bias is not None and bias.shape[0] != weight.shape[0]:
        raise ValueError(
            f"bias has shape {tuple(bias.shape)} but weight has shape {tuple(weight.shape)}: "
            "bias needs one entry per out_feature (weight's dim 0)"
        )


def linear(x, weight, bias=None, activation=None):
    """act(x @ weight.T + bias): torch.nn.functional.linear plus a fused activation."""
    act_id = activation_id(activation)
    check_linear_args(x, weight, bias)
    # A view whenever the leading dims merge (always for contiguous x); otherwise reshape copies,
    # because the GEMM walks x's rows with a single stride.
    x2d = x.flatten(0, -2)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias)
    )
    if needs_grad:
        y2d = _LinearFunction.apply(x2d, weight, bias, act_id)
    else:
        y2d, _ = linear_forward(x2d, weight, bias, act_id, save_preact=False)
    return y2d.view(*x.shape[:-1], weight.shape[0])
