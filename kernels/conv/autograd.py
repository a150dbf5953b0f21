"""kernels.conv2d, the public function, and the autograd Function that makes it trainable.

The top of the conv package's one-way chain: dispatch.py plans and launches the forward,
backward.py computes the gradients (its dgrad runs the forward's own designs, so it imports
dispatch.py), and this module puts them together: a call where no input needs a gradient goes
straight to dispatch.conv2d_forward; one where some input does goes through Conv2dFunction, whose
forward is conv2d_forward and whose backward is backward.py's. Neither of the two modules below
imports this one.

Functions:
    Training         a training call key's entry: checked geometry, arguments, its Backward
    Conv2dFunction   the autograd Function behind conv2d when an input needs a gradient
    conv2d           the public function: F.conv2d (any groups) then an activation
"""

import torch

from kernels._common import ACTIVATIONS, TORCH_ACTIVATIONS, direct, is_interpreter
from kernels._launch import PlanCache
from kernels.conv import dispatch  # by module: a test counts dispatch's checks and keys
from kernels.conv.backward import _backward, _upcast, save_mode


class Training:
    """A training call key's entry (_TRAINING): the checked geometry as pairs and the
    output size, the call's own arguments (its forward's plan lives under the same key), and,
    once a backward has planned all its launches, that Backward. A later step builds the one
    key, runs no check and computes no other key."""

    __slots__ = ("key", "args", "pairs", "pq", "activation", "act_id", "keep", "groups",
                 "backward")  # fmt: skip

    def __init__(self, key, args, pairs, pq, activation, groups):
        # key: the call's _plan_key, None where the forward cannot share it (an unbatched x,
        # run as a batch of one); args: its (stride, padding, dilation) as given; pq: the
        # output's (P, Q)
        self.key, self.args, self.pairs, self.pq, self.groups = key, args, pairs, pq, groups
        self.activation = activation
        self.act_id = ACTIVATIONS["none" if activation is None else activation]
        self.keep = save_mode(self.act_id)
        self.backward = None

    def forward(self, x, weight, bias, activation, residual):
        # the call's own activation on the call's own tensors: the forward's plan is the key's
        key = self.key if activation == self.activation else None
        return dispatch.conv2d_forward(x, weight, bias, *self.args, activation, self.groups,
                                       key=key, residual=residual)  # fmt: skip


class Conv2dFunction(torch.autograd.Function):
    """Autograd for a 4-D x, y = act(conv2d(x, weight) + bias + residual); kernels.conv2d only
    routes here when some input needs a gradient, with the call key's Training entry. The
    residual's gradient is dZ, which the conv's backward computes anyway: a ResNet block's
    shortcut and last activation cost no autograd node and no launch of their own."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, entry: Training):
        if entry.keep == "preact":
            z = entry.forward(x, weight, bias, None, residual)
            y = TORCH_ACTIVATIONS[entry.activation](z)
        else:
            y = z = entry.forward(x, weight, bias, entry.activation, residual)
        need_dw = ctx.needs_input_grad[1]
        # Keep only what the requested gradients read: dX needs W, dW needs X.
        ctx.save_for_backward(x if need_dw else None, weight, z if entry.keep != "none" else None)
        if not need_dw:
            ctx.x_meta = (x.shape, x.stride(), x.dtype, x.device)
        ctx.entry = entry
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, saved = ctx.saved_tensors
        entry, needs = ctx.entry, ctx.needs_input_grad[:3]
        planned = entry.backward
        if planned is not None and planned.fits(dy, needs):
            dx, dw, db, dz = planned(dy, x, weight, saved, ctx.needs_input_grad[3])
            return dx, dw, db, dz if ctx.needs_input_grad[3] else None, None
        if x is None:  # dX alone: only the shape and layout of x matter
            shape, strides, dtype, device = ctx.x_meta
            x = torch.empty_strided(shape, strides, dtype=dtype, device=device)
        if is_interpreter() and dy.dtype == torch.bfloat16:
            dx, dw, db, dz = _upcast(_grads, dy, x, weight, saved, entry, needs)
        else:
            (dx, dw, db, dz), plan = _backward(dy, x, weight, saved, entry.act_id, *entry.pairs,
                                               needs, direct, entry.groups)  # fmt: skip
            if plan is not None and entry.key is not None:
                entry.backward = plan
        return dx, dw, db, dz if ctx.needs_input_grad[3] else None, None


def _grads(dy, x, weight, saved, entry: Training, needs) -> tuple:
    """(dX, dW, db, dZ) of a training entry's call, unplanned."""
    return _backward(dy, x, weight, saved, entry.act_id, *entry.pairs, needs, direct,
                     entry.groups)[0]  # fmt: skip


# Training calls' entries (Training) by _plan_key: a key seen before passed every
# check, so a training step runs none (as a planned forward runs none), and its entry holds the
# backward's plan
_TRAINING = PlanCache()


def _trainable(x, weight, bias, stride, padding, dilation, activation, groups, residual=None):
    """conv2d through Conv2dFunction, after the forward's own checks (once per call
    key: the key's Training entry, kept in _TRAINING). A residual is checked against
    the entry's output size before any work; the Function adds it (in the 1x1 GEMM's epilogue
    where conv2d_forward fuses it) and takes its gradient."""
    try:
        key = dispatch._plan_key(x, weight, bias, stride, padding, dilation, activation, groups,
                                 residual)  # fmt: skip
    except (AttributeError, TypeError):
        key = None  # the checks below say what is wrong, or the call goes unplanned
    entry = None if key is None else _TRAINING.get(key)
    if entry is None:
        stride_hw, padding_hw, dilation_hw, pq, _ = dispatch._check(
            x, weight, bias, stride, padding, dilation, activation, groups
        )
        dispatch.check_trainable(groups, x.shape[-3])
        if residual is not None:
            dispatch.check_residual(residual, x, weight.shape[0], pq)
        entry = Training(None if x.dim() == 3 else key, (stride, padding, dilation),
                         (stride_hw, padding_hw, dilation_hw), pq, activation, groups)  # fmt: skip
        if key is not None:
            _TRAINING.put(key, entry)
    if x.dim() == 3:
        r = None if residual is None else residual.unsqueeze(0)
        return Conv2dFunction.apply(x.unsqueeze(0), weight, bias, r, entry).squeeze(0)
    return Conv2dFunction.apply(x, weight, bias, residual, entry)


def conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    groups: int = 1,
    *,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """F.conv2d(x, weight, bias, stride, padding, dilation, groups), + `residual`, then
    `activation`: the positional arguments are F.conv2d's, in its order; `activation` and
    `residual` are keyword-only.

    residual: a tensor of the output's shape, dtype and device, added before the activation
    (a ResNet block's act(conv(x) + b + shortcut)). Fused into the epilogue of the 1x1 GEMM
    (a 1x1, stride-1, unpadded conv between NHWC tensors, direct call, the residual in the
    output's layout, no upcast) whether or not a gradient is needed; every other call adds it
    after the conv, in the same values. Where an input needs a gradient the sum and
    the activation stay inside the conv's autograd Function, whose backward hands the residual
    dZ = dY·act'(Z), the tensor the conv's own backward starts from.

    groups: any int dividing C and K, with weight (K, C / groups, R, S): 1; grouped (grouped.py:
    an implicit GEMM with the groups on the grid); depthwise (groups = C, K a multiple of C: a
    memory-bound stencil, depthwise.py).
    padding is an int, a pair, 'valid' or 'same' (stride 1), as in F.conv2d; x may be unbatched
    (C, H, W). The output is channels_last when x is, else NCHW. Differentiable for groups=1
    (backward.py: dgrad by the forward's implicit GEMM, wgrad by a split reduction) and for
    depthwise (depthwise.py's stencils); other grouped convs are forward only. The kernels read
    the weight as channels_last (a (K, R·S·C) matrix): a weight in any other layout is copied to
    it in every call, so keep weights channels_last.
    """
    if isinstance(x, torch.Tensor) and x.dim() >= 3 and x.shape[-3] == 0:  # nothing to reduce
        return dispatch.conv2d_forward(x, weight, bias, stride, padding, dilation, activation,
                                       groups, residual=residual)  # fmt: skip
    if torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in (x, weight, bias, residual)  # bad types:
    ):  # the checks say
        return _trainable(x, weight, bias, stride, padding, dilation, activation, groups, residual)
    return dispatch.conv2d_forward(x, weight, bias, stride, padding, dilation, activation, groups,
                                   residual=residual)  # fmt: skip
