"""linear's forward and backward as GEMM launches, its autograd Function and the public `linear`.

The forward is one launch of kernels.matmul's GEMM (two for skinny split-K shapes on the pointer
path): weight.T is weight with swapped strides, which the Hopper TMA kernels read as a K-major B
through a descriptor over the weight as stored, and the bias add and activation run in its
epilogue, where eager PyTorch (addmm, then the activation) writes and re-reads the output. The
backward is the same GEMM plus one small kernel (backward.py):

    dZ = dY * act'(Z)       activation_backward_kernel, which also sums dZ's columns for db from
    db = column sums of dZ  the same registers. For activation "none" dZ = dY and
                            column_sum_kernel alone gives db.
    dX = dZ @ W             fused_matmul, W as stored
    dW = dZ^T @ X           fused_matmul, dZ^T as swapped strides (a column-major A for TMA): no
                            transposed copies

Z, the pre-activation x @ weight.T + bias, is written by the forward epilogue in the input dtype
(a second store of the output tile) when an activation is used and a gradient is needed: that
costs M·N elements of memory, where recomputing Z would cost a whole extra GEMM in the backward.

Functions (the pieces kernels/ops.py composes into a custom op):
    linear_reference(x, weight, bias=None, activation=None) -> y
        The same computation in torch ops, for tests and benchmarks.
    check_linear_args(x, weight, bias)
        The TypeError/ValueError checks `linear` runs; the two functions below assume them.
    linear_forward(x2d, weight, bias, act_id, save_preact, *, launch=direct) -> (y, z | None)
        x2d (M, K) -> y (M, N); z is the pre-activation, returned only when save_preact.
    linear_backward(dy, x2d, weight, z, act_id, need_dx, need_dw, need_db, *, launch=direct)
        -> (dx | None, dw | None, db | None)
        z may be None when act_id is "none"; x2d may be None when not need_dw, weight when not
        need_dx. Each gradient is None unless asked for.
    linear(x, weight, bias=None, activation=None) -> y
        Public: x (..., in_features) with any leading dims (1-D x gives a 1-D y), weight
        (out, in), bias (out,) or None;
        activation in ACTIVATIONS (None means "none"). Autograd-aware.

`launch` is kernels._common.direct or torch.library.wrap_triton; these functions allocate with
torch ops only and branch on shapes and flags, never on data.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels._common import (
    ACTIVATIONS,
    TORCH_ACTIVATIONS,
    activation_id,
    as_rows,
    check_same,
    check_tensor,
    direct,
)
from kernels._graphs import Graphed
from kernels._launch import PlanCache
from kernels.linear.backward import (
    DzPlan,
    column_sum,
    planned_activation_backward,
)
from kernels.matmul import copies_operands, fused_matmul, planned, run_plan

NONE = ACTIVATIONS["none"]


def linear_reference(x, weight, bias=None, activation=None):
    # 2·M·N·K FLOPs for M rows of x; reads (M·K + N·K + N)·bytes, writes M·N·bytes. Eager adds
    # a separate activation pass that reads and writes the M·N output again.
    return TORCH_ACTIVATIONS["none" if activation is None else activation](
        F.linear(x, weight, bias)
    )


def check_linear_args(x, weight, bias) -> None:
    check_tensor("x", x, min_ndim=1)
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


def linear_forward(x2d, weight, bias, act_id, save_preact, *, launch=direct):
    # weight.t() is a view: the GEMM reads W (N, K) as B (K, N) through swapped strides.
    return fused_matmul(x2d, weight.t(), bias, act_id, save_preact, launch=launch)


def linear_backward(dy, x2d, weight, z, act_id, need_dx, need_dw, need_db, *, launch=direct):
    dz, db, _ = _dz_db(dy, z, act_id, need_db, launch)
    dx, dw = _gemm_grads(dz, x2d, weight, need_dx, need_dw, launch)
    return dx, dw, db


def _dz_db(dy, z, act_id, need_db, launch):
    """(dZ = dY * act'(Z), db | None, the activation backward's DzPlan | None); dZ is dY itself
    without an activation (and there is no plan)."""
    if act_id == NONE:
        return dy, (column_sum(dy, launch) if need_db else None), None
    return planned_activation_backward(dy, z, act_id, need_db, launch)


def _gemm_grads(dz, x2d, weight, need_dx, need_dw, launch):
    """(dX = dZ @ W, dW = dZ^T @ X), each None unless asked for."""
    dx = fused_matmul(dz, weight, launch=launch)[0] if need_dx else None
    dw = fused_matmul(dz.t(), x2d, launch=launch)[0] if need_dw else None
    return dx, dw


class _LinearFunction(torch.autograd.Function):
    """Autograd for a 2-D x; `linear` only routes here when some input needs a gradient."""

    @staticmethod
    def forward(ctx, x2d, weight, bias, act_id):
        save_preact = act_id != NONE
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


# ---------------------------------------------------------------------------------------------
# Planned calls (kernels/_launch.py): a direct call whose key was planned before skips the
# checks (each is a function of the key), the 2-D views and the GEMM's own key
# ---------------------------------------------------------------------------------------------
class _Planned(NamedTuple):
    gemm: object  # kernels.matmul's plan of x2d @ weight.T (+ bias, activation[, z])
    layout: tuple  # y's (shape, strides): x's leading dims, out_features; row-major
    x_layout: tuple  # x's (shape, contiguous strides): dX's
    act_id: int
    save_preact: bool
    has_bias: bool
    # (dY's 2-D strides and alignment, need dX, need dW, need db) -> its _Backward
    backward: dict


_PLANS = PlanCache()
_cublas_tf32 = torch._C._get_cublas_allow_tf32


def _plan_key(x, weight, bias, activation, grad: bool) -> tuple:
    """Raises AttributeError or TypeError for arguments that are not tensors."""
    return (
        x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, weight.dtype, x.device,
        weight.device, x.data_ptr() % 16, weight.data_ptr() % 16,
        (x.storage_offset() * x.element_size()) % 16,
        None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device,
                                   bias.data_ptr() % 16),
        activation, grad, _cublas_tf32(),
    )  # fmt: skip


def _plan(x, x2d, weight, bias, act_id, save_preact) -> _Planned | None:
    """The plan of a call just made, where its GEMM was planned and reads x in place."""
    if x2d.data_ptr() != x.data_ptr() or (x2d.dim() == 2 and x2d.stride(1) != x.stride(-1)):
        return None  # x2d is a copy: the plan would launch on x's memory
    gemm = planned(x2d, weight.t(), bias, act_id, save_preact)
    if gemm is None or copies_operands(gemm):
        return None
    N = weight.shape[0]
    shape = (*x.shape[:-1], N)
    return _Planned(gemm, (shape, _row_major(shape)), (tuple(x.shape), _row_major(tuple(x.shape))),
                    act_id, save_preact, bias is not None, {})  # fmt: skip


def _row_major(shape: tuple) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


class _Backward(NamedTuple):
    """A planned linear's backward for one dY layout: the plans of its launches (dZ and db, dX,
    dW), run into outputs allocated before them. Those launches then depend on nothing but
    pointers, so kernels._graphs captures them as one CUDA graph once the same pointers come
    back and replays it from then on, as a kept conv backward does (docs/kernels/host_path.md,
    "Graphed backward")."""

    dx: object  # kernels.matmul's plan of dZ @ W, or None
    dw: object  # ... of dZ^T @ X, or None
    dz: DzPlan | None  # dZ = dY * act'(Z) and db; None without an activation
    dw_layout: tuple | None  # dW's (shape, strides)
    graphed: Graphed

    def fits(self, dy2d, z) -> bool:
        return self.dz is None or self.dz.layout == (dy2d.shape, dy2d.stride(), z.stride())

    def __call__(self, p: _Planned, dy2d, x, weight, z, need_db):
        """(dX in x's shape, dW, db), each None where not planned or asked for."""
        act = self.dz is not None  # a planned activation backward exactly where there is one
        dz = dy2d.new_empty_strided(dy2d.shape, (dy2d.shape[1], 1)) if act else None
        db = dy2d.new_empty_strided((dy2d.shape[1],), (1,)) if need_db else None
        dx = None if self.dx is None else dy2d.new_empty_strided(*p.x_layout)
        dw = None if self.dw is None else dy2d.new_empty_strided(*self.dw_layout)

        def launches():
            grad = dy2d
            if act:
                grad = self.dz(dy2d, z, (dz, db))[0]
            elif need_db:
                column_sum(dy2d, direct, out=db)
            if dx is not None:
                run_plan(self.dx, grad, weight, None, False, p.x_layout, out=dx)
            if dw is not None:
                run_plan(self.dw, grad, x, None, False, out=dw)

        self.graphed.run(dy2d, (dy2d, x, weight, z, dz, db, dx, dw), launches,
                         lambda: (self.dx, self.dw, self.dz))  # fmt: skip
        return dx, dw, db


class _PlannedLinear(torch.autograd.Function):
    """_LinearFunction on a plan: x and dY as they come (the GEMMs read their memory as the
    plan's 2-D matrices), dX in x's shape."""

    @staticmethod
    def forward(ctx, x, weight, bias, p: _Planned):
        y, z = run_plan(p.gemm, x, weight, bias, p.save_preact, p.layout)
        need_dx, need_dw, _ = ctx.needs_input_grad[:3]
        ctx.save_for_backward(x if need_dw else None, weight if need_dx else None, z)
        ctx.plan = p
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, z = ctx.saved_tensors
        p = ctx.plan
        need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
        need_db = need_db and p.has_bias
        dy2d = as_rows(dy)
        key = (dy2d.stride(), dy2d.data_ptr() % 16, need_dx, need_dw, need_db)
        kept = p.backward.get(key)
        if kept is not None and kept.fits(dy2d, z):
            return *kept(p, dy2d, x, weight, z, need_db), None
        dz, db, dz_plan = _dz_db(dy2d, z, p.act_id, need_db, direct)
        x2d = as_rows(x) if need_dw else None
        dx, dw = _gemm_grads(dz, x2d, weight, need_dx, need_dw, direct)
        plans = (planned(dz, weight) if need_dx else None,
                 planned(dz.t(), x2d) if need_dw else None)  # fmt: skip
        if ((x2d is None or x2d.data_ptr() == x.data_ptr())
                and (p.act_id == NONE or dz_plan is not None)
                and all((q is not None and not copies_operands(q)) == need
                        for q, need in zip(plans, (need_dx, need_dw), strict=True))):  # fmt: skip
            dw_layout = None if dw is None else (tuple(dw.shape), dw.stride())
            p.backward[key] = _Backward(*plans, dz_plan, dw_layout, Graphed())
        # x's shape from the plan: x itself is saved only where dW needs it
        return (None if dx is None else dx.view(p.x_layout[0])), dw, db, None


def linear(x, weight, bias=None, activation=None):
    """act(x @ weight.T + bias): torch.nn.functional.linear plus a fused activation."""
    key = None
    if not torch.compiler.is_compiling():
        try:
            grad = torch.is_grad_enabled() and (
                x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
            )
            key = _plan_key(x, weight, bias, activation, grad)
            p = _PLANS.get(key)
        except (AttributeError, TypeError):
            key = p = None  # the checks below say what is wrong
        if p is not None:
            if grad:
                return _PlannedLinear.apply(x, weight, bias, p)
            return run_plan(p.gemm, x, weight, bias, False, p.layout)[0]
    act_id = activation_id(activation)
    check_linear_args(x, weight, bias)
    # A view whenever the leading dims merge (always for contiguous x; a 1-D x is one row);
    # otherwise reshape copies, because the GEMM walks x's rows with a single stride.
    x2d = as_rows(x)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias)
    )
    if needs_grad:
        y2d = _LinearFunction.apply(x2d, weight, bias, act_id)
    else:
        y2d, _ = linear_forward(x2d, weight, bias, act_id, save_preact=False)
    if key is not None:
        save_preact = needs_grad and act_id != NONE
        planned_call = _plan(x, x2d, weight, bias, act_id, save_preact)
        if planned_call is not None:
            _PLANS.put(key, planned_call)
    return y2d.view(*x.shape[:-1], weight.shape[0])
