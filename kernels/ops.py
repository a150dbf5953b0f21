"""The Triton kernels as torch.library custom ops, for the `triton-compiled` mode.

torch.library.triton_op registers a Python function whose kernel launches go through
torch.library.wrap_triton. torch.compile can then trace through the op, see the Triton kernels
and schedule them in its graph (fullgraph=True works: no graph break), where a plain call to
`kernels.matmul` would be opaque. Each op reuses the kernels' own private implementation with
`launch=wrap_triton`; nothing here duplicates kernel code.

Ops (namespace `kbench`): matmul, linear_fwd / linear_bwd, softmax_fwd / softmax_bwd,
conv2d / conv2d_bwd. Each gets autograd through torch.library.register_autograd, whose backward
calls the backward op (matmul's: matmul itself), so fwd_bwd also compiles into one graph.

Compiled, a user-defined Triton kernel goes through Triton's Python launcher unless Inductor's
`static_launch_user_defined_triton_kernels` option is set; with it, the kernels get the static
CUDA launcher Inductor's own kernels use (docs/kernels/host_path.md; the triton-compiled mode
sets it, experiments/modes.py): `torch.compile(model, options={
"static_launch_user_defined_triton_kernels": True})`.

In Triton's CPU interpreter wrap_triton cannot trace kernels (it would run them on fake tensors),
so there the ops are opaque torch.library.custom_ops instead: still no graph break, but Inductor
cannot see inside. Their fake (shape) implementation is the same function with a launcher that
launches nothing, so output allocation is written once.
"""

import functools
import inspect

import torch
from torch import Tensor
from torch.library import triton_op, wrap_triton
from triton.runtime.autotuner import Autotuner, Heuristics

from kernels._common import TORCH_ACTIVATIONS, activation_id, as_rows, direct, is_interpreter
from kernels._launch import python_function
from kernels.conv import conv2d_forward
from kernels.conv.backward import conv2d_backward_upcast, save_mode
from kernels.conv.dispatch import (
    add_residual,
    check_groups_type,
    check_residual_call,
    check_trainable,
    resolve_padding,
)
from kernels.linear import check_linear_args, linear_backward, linear_forward
from kernels.matmul import matmul_impl
from kernels.matmul.dispatch import matmul_batched, matmul_grads, matmul_nd
from kernels.softmax import softmax_backward, softmax_forward
from kernels.softmax.dispatch import cast_input, check_scale

_INTERPRETED = is_interpreter()
_register = torch.library.custom_op if _INTERPRETED else triton_op


@functools.cache
def _unnamed_defaults(kernel) -> tuple[list[str], dict]:
    """The kernel's parameter names, and the defaulted parameters that neither its autotuner's
    configs nor its heuristics set: a launch that names none of those leaves them to defaults."""
    fixed, fn = set(), kernel
    while isinstance(fn, (Autotuner, Heuristics)):
        if isinstance(fn, Autotuner):
            fixed.update(*(config.all_kwargs() for config in fn.configs))
        else:
            fixed.update(fn.values)
        fn = fn.fn
    params = inspect.signature(python_function(fn)).parameters.values()
    defaults = {p.name: p.default for p in params
                if p.default is not p.empty and p.name not in fixed}  # fmt: skip
    return [p.name for p in params], defaults


class _Named:
    """A traced launcher whose launches name every parameter of the kernel.

    Inductor reads which tensors a user-defined Triton kernel writes from TTIR it builds from
    the traced launch's arguments. A parameter left to its default fails that analysis
    ("Incorrect number of arguments passed to kernel"), and Inductor then takes every tensor
    argument as written: inputs cloned and copied back on every call, and in training a copy
    back into a leaf that requires grad fails the compile (the 1x1 conv's backward on an H100).
    So each launch passes the defaults it leaves out by name (tests/test_traced_launches.py).
    """

    def __init__(self, launcher, kernel):
        self.launcher = launcher
        self.names, self.defaults = _unnamed_defaults(kernel)

    def __getitem__(self, grid):
        run = self.launcher[grid]

        def launch(*args, **kwargs):
            given = set(self.names[: len(args)]).union(kwargs)
            unnamed = {k: v for k, v in self.defaults.items() if k not in given}
            return run(*args, **kwargs, **unnamed)

        return launch


def naming(launcher):
    """`launcher` (wrap_triton, or a test's recorder) with every launch's defaults named."""
    return lambda kernel: _Named(launcher(kernel), kernel)


_active_launch = [direct if _INTERPRETED else naming(wrap_triton)]


def _launch(kernel):
    return _active_launch[0](kernel)


class _NoLaunch:
    """Stands in for a kernel launch while computing output shapes on fake tensors."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _fake_of(op_fn):
    def fake(*args):
        _active_launch[0] = lambda kernel: _NoLaunch()
        try:
            return op_fn(*args)
        finally:
            _active_launch[0] = direct

    return fake


def _define(name: str):
    """Register the decorated function as op `name` (triton_op, or custom_op when interpreted)."""

    def register(op_fn):
        op = _register(name, op_fn, mutates_args=())
        if _INTERPRETED:
            op.register_fake(_fake_of(op_fn))
        return op

    return register


def _or_empty(t: Tensor | None, like: Tensor) -> Tensor:
    """Custom ops cannot return None: an empty tensor stands for 'not computed'."""
    return t if t is not None else like.new_empty(0)


@_define("kbench::matmul")
def matmul_op(a: Tensor, b: Tensor) -> Tensor:
    if b.dim() > 2:  # a batched b: one launch over the broadcast batch
        return matmul_batched(a, b, launch=_launch)
    return matmul_impl(a, b, launch=_launch)


def _matmul_setup(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _matmul_backward(ctx, dc):
    a, b = ctx.saved_tensors
    return matmul_grads(a, b, dc, torch.ops.kbench.matmul, *ctx.needs_input_grad[:2])


torch.library.register_autograd("kbench::matmul", _matmul_backward, setup_context=_matmul_setup)


@_define("kbench::linear_fwd")
def linear_fwd_op(
    x2d: Tensor, weight: Tensor, bias: Tensor | None, act_id: int, save_preact: bool
) -> tuple[Tensor, Tensor]:
    y, z = linear_forward(x2d, weight, bias, act_id, save_preact, launch=_launch)
    return y, _or_empty(z, y)


@_define("kbench::linear_bwd")
def linear_bwd_op(
    dy: Tensor,
    x2d: Tensor,
    weight: Tensor,
    z: Tensor,
    act_id: int,
    need_dx: bool,
    need_dw: bool,
    need_db: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = linear_backward(
        dy, x2d, weight, z if z.numel() else None, act_id, need_dx, need_dw, need_db, launch=_launch
    )
    return _or_empty(dx, dy), _or_empty(dw, dy), _or_empty(db, dy)


def _linear_setup(ctx, inputs, output):
    x2d, weight, bias, act_id, _ = inputs
    ctx.save_for_backward(x2d, weight, output[1])
    ctx.act_id, ctx.has_bias = act_id, bias is not None


def _linear_backward(ctx, dy, _dz):
    x2d, weight, z = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx, dw, db = torch.ops.kbench.linear_bwd(
        dy, x2d, weight, z, ctx.act_id, need_dx, need_dw, need_db and ctx.has_bias
    )
    return (
        dx if need_dx else None,
        dw if need_dw else None,
        db if need_db and ctx.has_bias else None,
        None,
        None,
    )


torch.library.register_autograd("kbench::linear_fwd", _linear_backward, setup_context=_linear_setup)


@_define("kbench::softmax_fwd")
def softmax_fwd_op(x: Tensor, dim: int, scale: float = 1.0) -> Tensor:
    return softmax_forward(x, dim, scale=scale, launch=_launch)


@_define("kbench::softmax_bwd")
def softmax_bwd_op(y: Tensor, dy: Tensor, dim: int, scale: float = 1.0) -> Tensor:
    return softmax_backward(y, dy, dim, scale=scale, launch=_launch)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.dim, ctx.scale = inputs[1], inputs[2]  # defaults included: (x, dim, scale)


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return torch.ops.kbench.softmax_bwd(y, dy, ctx.dim, ctx.scale), None, None


torch.library.register_autograd(
    "kbench::softmax_fwd", _softmax_backward, setup_context=_softmax_setup
)


@_define("kbench::conv2d")
def conv2d_op(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    activation: str,
    groups: int,
) -> Tensor:
    return conv2d_forward(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation),
                          activation, groups, launch=_launch)  # fmt: skip


@_define("kbench::conv2d_bwd")
def conv2d_bwd_op(
    dy: Tensor,
    x: Tensor,
    weight: Tensor,
    saved: Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    act_id: int,
    need_dx: bool,
    need_dw: bool,
    need_db: bool,
    groups: int,
) -> tuple[Tensor, Tensor, Tensor]:
    dx, dw, db = conv2d_backward_upcast(
        dy, x, weight, saved if saved.numel() else None, act_id, tuple(stride),
        tuple(padding[:2]), tuple(dilation), need_dx, need_dw, need_db, launch=_launch,
        groups=groups,
    )  # fmt: skip
    return _or_empty(dx, dy), _or_empty(dw, dy), _or_empty(db, dy)


def _conv2d_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, activation, groups = inputs
    act_id = activation_id(activation)
    # relu's derivative reads the output ([y > 0]); kernels/ops.conv2d runs the other
    # activations outside the op when training, so the op's own activation is relu or none
    ctx.save_for_backward(x, weight, output if act_id else output.new_empty(0))
    ctx.geometry = (stride, padding, dilation)
    ctx.act_id, ctx.has_bias, ctx.groups = act_id, bias is not None, groups


def _conv2d_backward(ctx, dy):
    x, weight, saved = ctx.saved_tensors
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx, dw, db = torch.ops.kbench.conv2d_bwd(
        dy, x, weight, saved, *ctx.geometry, ctx.act_id, need_dx, need_dw,
        need_db and ctx.has_bias, ctx.groups,
    )  # fmt: skip
    return (dx if need_dx else None, dw if need_dw else None,
            db if need_db and ctx.has_bias else None, None, None, None, None, None)  # fmt: skip


torch.library.register_autograd("kbench::conv2d", _conv2d_backward, setup_context=_conv2d_setup)


# ---------------------------------------------------------------------------------------------
# The public signatures (as in kernels/__init__.py), routed through the ops above; these are
# what mode=triton-compiled calls for each op (experiments/registry.py names them)
# ---------------------------------------------------------------------------------------------
def linear(x, weight, bias=None, activation=None):
    check_linear_args(x, weight, bias)
    act_id = activation_id(activation)
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias)
    )
    save_preact = needs_grad and act_id != activation_id("none")
    x2d = as_rows(x)  # any leading dims, none included
    y2d, _ = torch.ops.kbench.linear_fwd(x2d, weight, bias, act_id, save_preact)
    return y2d.view(*x.shape[:-1], weight.shape[0])


def _pair(value) -> list[int]:
    return list(value) if isinstance(value, tuple | list) else [value, value]


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, activation=None,
           residual=None):  # fmt: skip
    check_groups_type(groups)  # before the op's schema, whose own message names no argument
    if residual is not None:  # the op without its activation; the sum and activation are torch's
        check_residual_call(x, weight, bias, stride, padding, dilation, groups, residual)
        return add_residual(conv2d(x, weight, bias, stride, padding, dilation, groups), residual,
                            activation)  # fmt: skip
    if isinstance(padding, str) and isinstance(weight, Tensor):
        # the op's schema takes ints: 'same' / 'valid' as (top, left, bottom, right)
        lo, hi = resolve_padding(padding, tuple(weight.shape[2:]), tuple(_pair(stride)),
                              tuple(_pair(dilation)))  # fmt: skip
        padding = [*lo, *hi]
    act = activation or "none"
    trains = torch.is_grad_enabled() and any(
        getattr(t, "requires_grad", False) for t in (x, weight, bias)
    )
    if trains:
        check_trainable(groups, x.shape[-3] if isinstance(x, Tensor) and x.dim() >= 3 else None)
    if trains and save_mode(activation_id(act)) == "preact":  # its derivative reads z: unfused
        z = torch.ops.kbench.conv2d(x, weight, bias, _pair(stride), _pair(padding),
                                    _pair(dilation), "none", groups)  # fmt: skip
        return TORCH_ACTIVATIONS[act](z)
    return torch.ops.kbench.conv2d(x, weight, bias, _pair(stride), _pair(padding),
                                   _pair(dilation), act, groups)  # fmt: skip


def matmul(a, b):
    tensors = isinstance(a, Tensor) and isinstance(b, Tensor)
    if tensors and b.dim() <= 2 and (a.dim() != 2 or b.dim() != 2):
        return matmul_nd(a, b, torch.ops.kbench.matmul)  # 1-D and batched-a operands
    if tensors and a.dim() == 1 and b.dim() > 2:  # one row of a matrix, as torch.matmul treats it
        return torch.ops.kbench.matmul(a.unsqueeze(0), b).squeeze(-2)
    return torch.ops.kbench.matmul(a, b)  # 2-D, or a batched b (the op's one launch)


def softmax(x, dim=-1, dtype=None, *, scale=None):
    scale = check_scale(scale)  # softmax(x * scale), fused as kernels.softmax's
    if dtype is not None:  # torch.softmax's dtype=: x cast first (checked as kernels.softmax does)
        x = cast_input(x, dtype)
    return torch.ops.kbench.softmax_fwd(x, dim, scale)


# Attention defines its ops (kbench::attention_fwd / attention_bwd) with the machinery above.
from kernels.attention.ops import register as _register_attention  # noqa: E402

attention, sdpa = _register_attention(_define, _launch)
