"""linear's backward kernels: dZ = dY * act'(Z) with db's column sums from the same registers,
and the column sums of a matrix (db when there is no activation, and the second pass that adds
the row-splits' fp32 partial sums). dX and dW are GEMMs (kernels.matmul.fused_matmul).

Both kernels split dZ's rows into programs that each write one fp32 row of partial column sums;
column_sum_kernel then adds those rows in order, so db is deterministic (no atomics).

Functions:
    activation_grad(z, ACTIVATION)
        @triton.jit: d act(z) / dz in fp32; the inverse of kernels.matmul's apply_activation.
    activation_backward_kernel[grid](dy_ptr, z_ptr, dz_ptr, colsum_ptr, M, N, rows_per_program,
                                     strides..., ACTIVATION, COLUMN_SUMS, BLOCK_M, BLOCK_N)
    column_sum_kernel[grid](x_ptr, out_ptr, M, N, rows_per_program, strides..., BLOCK_M, BLOCK_N)
    activation_backward(dy, z, act_id, need_db, launch) -> (dz, db | None)
    planned_activation_backward(...) -> (dz, db | None, DzPlan | None): the same, and its plan
    DzPlan(dy, z) -> (dz, db | None): a key's launches again, with no key
    column_sum(x, launch, out) -> (N,) sums of x's columns
    partial_sum(partial, out, launch): out = the column sums of row-split partial sums
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels._common import cdiv, direct
from kernels._launch import PlanCache, Step
from kernels.matmul import GELU, GELU_TANH, GELU_TANH_CUBIC, RELU, SILU, SQRT_2_OVER_PI, SQRT_HALF

INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1/sqrt(2·pi), the normal density's scale

# activation_backward_kernel's blocks: DZ_BLOCK elements, DZ_BLOCK_N columns (16-byte vector
# loads along N) or N's power of two where narrower, by DZ_BLOCK / that many rows (dz_block);
# DZ_NUM_WARPS warps; each program covers as few rows as keep the program count near
# DZ_PROGRAMS (a 2-D grid of single blocks up to that size), and with db at most DB_MAX_SPLITS
# row-splits, so partial_sum's one pass over them is a single block. A fixed 8 x 512 block
# left a conv's 64-channel dZ 7/8 masked lanes: 29.7 us where Inductor took 9.2, and 1046
# row-splits, whose second pass, one 64-column program stepping through them, took 26 us more
# (H100, the 32x256x56x56 bottleneck; docs/kernels/conv.md, "Backward (training)"). Evidence
# for the wide block: docs/kernels/matmul.md, "Shipped design".
DZ_BLOCK = 4096
DZ_BLOCK_N = 512
DZ_NUM_WARPS = 4
DZ_PROGRAMS = 1024  # ~8 per SM on an H100
DB_MAX_SPLITS = 512
# partial_sum's block: the fp32 row-split sums of a first pass (at most PARTIAL_BLOCK_M rows:
# DB_MAX_SPLITS, SUM_MAX_SPLITS) in one step of a tall, narrow block, so the programs along N
# wait on one load each, not on one per 64 rows
PARTIAL_BLOCK_M = 512
PARTIAL_BLOCK_N = 16
PARTIAL_NUM_WARPS = 8
# column_sum_kernel's block (64 columns: 128-byte rows of 16-bit x) and how many programs the
# first pass aims at, by the rows each adds up (a multiple of SUM_BLOCK_M): about 8 an SM on an
# H100, each with its loads in flight. A fixed 512 rows a program left 2048x4096 (the mlp's db
# at 2048 tokens) 256 programs: 11.5 us alone and 18 in the block, against 9.8 and 9.9 now
# (docs/kernels/matmul.md, "The activation pass"). Up to SUM_ONE_PASS_M rows one pass does it
# (a second launch cost more than it saved at 128 rows); past SUM_MAX_SPLITS row-splits the
# rows a program grow instead (narrow x, where the second pass is one program).
SUM_BLOCK_M = 64
SUM_BLOCK_N = 64
SUM_PROGRAMS = 1024
SUM_ONE_PASS_M = 512
SUM_MAX_SPLITS = 256


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


def _rows_for(M: int, N: int, block_m: int, block_n: int, programs: int) -> int:
    """Rows a program of (block_m, block_n) blocks covers so an (M, N) matrix makes about
    `programs` programs: a multiple of block_m, at least one block."""
    blocks = cdiv(M, block_m) * cdiv(N, block_n)
    return block_m * max(1, blocks // programs)


def dz_block(N: int) -> tuple[int, int]:
    """activation_backward_kernel's (BLOCK_M, BLOCK_N) for N columns: DZ_BLOCK elements, at most
    DZ_BLOCK_N wide, no wider than N's power of two (at least 16: one 32-byte sector of bf16)."""
    block_n = min(DZ_BLOCK_N, max(16, triton.next_power_of_2(N)))
    return DZ_BLOCK // block_n, block_n


def dz_rows(M: int, N: int, need_db: bool = False) -> int:
    """Rows per activation_backward_kernel program: a multiple of dz_block's BLOCK_M, enough for
    at most DB_MAX_SPLITS row-splits where db's partial sums are taken."""
    block_m, block_n = dz_block(N)
    rows = _rows_for(M, N, block_m, block_n, DZ_PROGRAMS)
    if need_db:
        rows = max(rows, block_m * cdiv(cdiv(M, block_m), DB_MAX_SPLITS))
    return rows


# Direct launches' Steps by (kernel, shapes, strides, dtype, device, alignments, flags): the
# backward's host path skips the JIT's argument binding as the GEMMs' plans do (kernels/_launch.py)
_PLANS = PlanCache()


def _planned(launch, key, make) -> Step:
    """make() (a Step), kept under key() for direct launches outside a torch.compile trace
    (a traced launch's tensors are fakes: no data pointers to key on)."""
    if launch is not direct or torch.compiler.is_compiling():
        return make()
    key = key()
    step = _PLANS.get(key)
    if step is None:
        step = _PLANS.put(key, make())
    return step


class DzPlan(NamedTuple):
    """activation_backward's launches for one key (dY's and Z's strides among it), run with no
    key, no row arithmetic and no plan lookup: a caller that keeps a whole backward's plan
    (kernels.conv.backward.Backward) holds one. Tensors in another shape or other strides than
    the plan's go through activation_backward."""

    act_id: int
    need_db: bool
    layout: tuple  # (dY's shape, dY's strides, Z's strides) it was made for
    splits: int  # db's row-splits (1: the step writes db itself)
    step: Step
    sum_step: Step | None  # partial_sum's launch where splits > 1

    def __call__(self, dy, z, out=(None, None)):
        """(dZ, db | None); out: (dZ, db) to write into, either None to allocate it (dZ
        row-major (M, N), db (N,)); honoured only in the plan's own layout."""
        if (dy.shape, dy.stride(), z.stride()) != self.layout:
            return activation_backward(dy, z, self.act_id, self.need_db, direct)
        dz, db, partial = _dz_outputs(dy, self.need_db, self.splits, *out)
        self.step(dy, z, dz, partial)
        if self.sum_step is not None:
            self.sum_step(partial, db)
        return dz, db


def _dz_outputs(dy, need_db: bool, splits: int, dz=None, db=None):
    """(dZ, db, where the kernel writes db's sums) for dY (M, N): dZ row-major, db (N,) or None,
    the sums into db itself for one row-split, else into an fp32 (splits, N) for partial_sum.
    dz, db: the caller's, where it allocated them."""
    M, N = dy.shape
    if dz is None:
        dz = dy.new_empty_strided((M, N), (N, 1))
    if not need_db:
        return dz, None, None
    if db is None:
        db = dy.new_empty_strided((N,), (1,))
    return dz, db, db if splits == 1 else dy.new_empty((splits, N), dtype=torch.float32)


def activation_backward(dy, z, act_id, need_db, launch):
    """(dZ, db | None): dZ = dY * act'(Z), with db = column sums of dZ fused in when need_db."""
    return planned_activation_backward(dy, z, act_id, need_db, launch)[:2]


def planned_activation_backward(dy, z, act_id, need_db, launch):
    """activation_backward's (dZ, db | None), and for a direct call outside a trace the DzPlan
    that repeats it (else None)."""
    M, N = dy.shape
    if dy.numel() == 0:
        dz, db, _ = _dz_outputs(dy, need_db, 1)
        if db is not None:
            db.zero_()
        return dz, db, None
    rows = dz_rows(M, N, need_db)
    splits = cdiv(M, rows)
    dz, db, partial = _dz_outputs(dy, need_db, splits)
    block_m, block_n = dz_block(N)

    def make():
        return Step(
            launch(activation_backward_kernel), (cdiv(N, block_n), splits),
            (M, N, rows,
             dy.stride(0), dy.stride(1), z.stride(0), z.stride(1), dz.stride(0), dz.stride(1),
             partial.stride(0) if partial is not None and partial.dim() == 2 else 0),
            dict(ACTIVATION=act_id, COLUMN_SUMS=need_db, BLOCK_M=block_m, BLOCK_N=block_n,
                 num_warps=DZ_NUM_WARPS),
        )  # fmt: skip

    def key():
        return ("dz", dy.shape, dy.stride(), z.stride(), dy.dtype, z.dtype, dy.device,
                dy.data_ptr() % 16, z.data_ptr() % 16, act_id, need_db, rows)  # fmt: skip

    step = _planned(launch, key, make)
    step(dy, z, dz, partial)
    sum_step = partial_sum(partial, db, launch) if need_db and splits > 1 else None
    plan = None
    if launch is direct and not torch.compiler.is_compiling():
        plan = DzPlan(act_id, need_db, (dy.shape, dy.stride(), z.stride()), splits, step,
                      sum_step)  # fmt: skip
    return dz, db, plan


def sum_rows(M: int, N: int) -> int:
    """Rows per column_sum_kernel program in the first pass: all of them up to SUM_ONE_PASS_M,
    else a multiple of SUM_BLOCK_M that keeps the program count near SUM_PROGRAMS."""
    if M <= SUM_ONE_PASS_M:
        return max(M, 1)
    narrow = SUM_BLOCK_M * cdiv(cdiv(M, SUM_BLOCK_M), SUM_MAX_SPLITS)  # at most SUM_MAX_SPLITS
    return max(_rows_for(M, N, SUM_BLOCK_M, SUM_BLOCK_N, SUM_PROGRAMS), narrow)


def _launch_column_sum(x, out, rows_per_program, launch,
                       blocks=(SUM_BLOCK_M, SUM_BLOCK_N, 4)):  # fmt: skip
    """Column sums of each rows_per_program rows of x (M, N): out is (N,) or (splits, N).
    blocks: the kernel's (BLOCK_M, BLOCK_N, num_warps)."""
    M, N = x.shape
    block_m, block_n, warps = blocks

    def make():
        grid = (cdiv(N, block_n), max(1, cdiv(M, rows_per_program)))
        return Step(
            launch(column_sum_kernel), grid,
            (M, N, rows_per_program, x.stride(0), x.stride(1),
             out.stride(0) if out.dim() == 2 else 0),
            dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps),
        )  # fmt: skip

    def key():
        return ("sum", x.shape, x.stride(), x.dtype, out.shape, out.dtype, x.device,
                x.data_ptr() % 16, rows_per_program, blocks)  # fmt: skip

    step = _planned(launch, key, make)
    step(x, out)
    return step


def partial_sum(partial, out, launch) -> Step:
    """out (N,) = the column sums of a first pass's fp32 row-split sums (splits, N), in one
    launch of tall, narrow blocks (PARTIAL_BLOCK_M x PARTIAL_BLOCK_N); returns that launch."""
    blocks = (PARTIAL_BLOCK_M, PARTIAL_BLOCK_N, PARTIAL_NUM_WARPS)
    return _launch_column_sum(partial, out, partial.shape[0], launch, blocks)


def column_sum(x, launch, out=None):
    """x's column sums (N,) in x's dtype (into `out` where given), accumulated in fp32 (a second
    pass over the row-splits' partial sums where sum_rows splits the rows)."""
    M, N = x.shape
    if out is None:
        out = torch.empty((N,), device=x.device, dtype=x.dtype)
    if N == 0:
        return out
    rows = sum_rows(M, N)
    splits = cdiv(M, rows)
    if splits <= 1:
        _launch_column_sum(x, out, rows, launch)
        return out
    partial = torch.empty((splits, N), device=x.device, dtype=torch.float32)
    _launch_column_sum(x, partial, rows, launch)
    partial_sum(partial, out, launch)
    return out
