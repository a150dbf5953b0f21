"""conv2d's forward dispatch: which design runs a call, with which operands by TMA and how many
reduction splits, the argument checks and the planned launch of a call key.

The designs (one module each) and when the dispatch takes them (docs/kernels/conv.md, "Shipped
design"):

    gemm.py            1x1, stride 1, unpadded, NHWC in and out: x is an (N·H·W, C) matrix and the
                       conv one GEMM. Direct calls run the persistent kernel (TMA on Hopper);
                       traced launches (launch=wrap_triton) the one-tile pointer kernel.
    flat_reduction.py  few input channels (C < 16, the C = 3 stem): the reduction is the flat
                       (r, s, c) index, padded only to BLOCK_K.
    window.py          Hopper, direct launches, stride-1 filters (not 1x1) on images of 14x14 and
                       up (P·Q >= 196) with C % 64 == 0, 16-bit NHWC input: the input tile is one
                       4-D TMA box (on 7x7 images its ragged 8x8 boxes lose to the implicit GEMM).
    implicit_gemm.py   everything else: per-pixel gathers of channel runs, one flat loop over
                       (r, s, c-block) steps; the weight by TMA on Hopper.
    grouped.py         1 < groups < C (ResNeXt): an implicit GEMM with the groups on the grid,
                       each tile reducing over its groups' channels only (one or several whole
                       groups a tile, the flat (r, s, c) index in power-of-two channel runs).
    depthwise.py       groups = C (depthwise, any channel multiplier): a memory-bound stencil,
                       no tensor cores.

Window and implicit-GEMM direct launches split their reduction in the same launch where the
output tiles are too few to fill the GPU (split_k_rule). On Hopper every direct design writes an
NHWC output by TMA stores. An NCHW input is read in place by strided loads (measured faster than
converting it to NHWC first); the output follows the input's layout.

The base of the package's one-way chain: backward.py imports this module (its dgrad runs these
designs), and autograd.py imports both (the public conv2d and its autograd Function); this module
imports neither.

Functions:
    split_k_rule    reduction splits for an implicit / window conv with few output tiles
    Plan, plan      the design, TMA use and split a call takes
    prepare         validate a call and allocate its output: the Conv record the designs launch
    conv2d_forward  conv2d's forward with the launcher explicit (kernels/ops.py passes
                    wrap_triton; autograd.conv2d calls it)
"""

from typing import NamedTuple

import torch

from kernels._common import (
    TORCH_ACTIVATIONS,
    Launcher,
    activation_id,
    cdiv,
    check_same,
    check_tensor,
    direct,
    dot_precision,
    gpu_info,
    is_interpreter,
)
from kernels._launch import PlanCache
from kernels.conv.common import Conv, TensorDescriptor
from kernels.conv.depthwise import depthwise_step
from kernels.conv.flat_reduction import flat_step
from kernels.conv.gemm import conv_gemm, gemm_persistent_step, is_gemm
from kernels.conv.grouped import conv_groups, grouped_step
from kernels.conv.implicit_gemm import implicit_step
from kernels.conv.window import window_ok, window_step


def split_k_rule(M, K, C, R, S, sms, beside: bool = False) -> int:
    """Reduction splits for an implicit / window conv of M rows, K output channels and a C·R·S
    reduction on `sms` SMs: double the split while the split launch of 64x128 tiles still fits
    one wave and each split keeps at least 18 steps of 64 channels, up to 2 (split 4 spilled
    and lost everywhere). A split that spills into a second wave lost to an unsplit launch of
    the 128-channel-step tile: on an H200 the two 100-tile ResNet-50 layers (512-channel 3x3s
    to 7x7) ran 30.0 / 30.4 us unsplit against 31.9 / 32.0 split in two. ResNet-50 at batch 32
    on 132 SMs: 1 everywhere; 2 where a layer has at most 66 tiles (smaller batches, narrow
    outputs). docs/kernels/conv.md, "Shipped design".

    beside: the conv shares the GPU with another launch (a dgrad beside its dW). Then a launch
    of fewer tiles than SMs splits up to 4 ways, spilling past the wave: its programs, each a
    whole launch long unsplit, shorten, and the other launch's programs fill the SMs around
    them (docs/kernels/conv.md, "A split dgrad beside dW")."""
    tiles = cdiv(M, 64) * cdiv(K, 128)
    steps = R * S * cdiv(C, 64)
    most, wave = (4, 4 * sms) if beside and tiles < sms else (2, sms)
    split = 1
    while split * 2 <= most and tiles * split * 2 <= wave and steps // (split * 2) >= 18:
        split *= 2
    return split


class Plan(NamedTuple):
    design: str  # "gemm_persistent", "gemm", "flat", "window", "implicit" or "grouped"
    tma: bool  # Hopper TMA loads / stores where the operands allow them
    split_k: int  # reduction splits (window and implicit only)


def plan(conv: Conv, launch: Launcher = direct, beside: bool = False) -> Plan:
    """The design, TMA use and reduction split for `conv` (see the module docstring; beside: as
    split_k_rule's). Traced launches take the hook-free pointer kernels, unsplit. A grouped
    conv (its weight matrix has fewer than C channels a tap) takes grouped.py, whatever else
    holds (conv2d_forward sends depthwise convs to their stencil before planning). A dgrad's
    sub-conv (conv.flip) takes the window or implicit design, the two that read a flipped
    weight in place."""
    info = gpu_info(conv.x.device)
    is_direct = launch is direct
    hopper = TensorDescriptor is not None and info is not None and info.capability >= (9, 0)
    tma = hopper and is_direct
    if conv.flip is None:  # a dgrad's sub-conv skips these: only the per-tap designs read it
        if conv_groups(conv) != 1:
            return Plan("grouped", False, 1)
        if is_gemm(conv):
            return Plan("gemm_persistent" if is_direct else "gemm", tma, 1)
        if conv.C < 16:
            return Plan("flat", tma, 1)
    big_enough = conv.P * conv.Q >= 196 and (conv.R, conv.S) != (1, 1) and conv.C % 64 == 0
    window = tma and big_enough and window_ok(conv.x, conv.stride)
    split = 1
    if is_direct and info is not None:
        split = split_k_rule(conv.M, conv.K, conv.C, conv.R, conv.S, info.sms, beside)
    return Plan("window" if window else "implicit", tma, split)


def _design_step(conv: Conv, chosen: Plan, launch: Launcher):
    """(Step, scratch) of the chosen design (scratch: None where the kernel takes no split
    buffers, else a function of the device giving them), or None for the traced one-tile gemm,
    which launches at once."""
    if chosen.design == "gemm_persistent":
        return gemm_persistent_step(conv, tma=chosen.tma)
    if chosen.design == "gemm":
        conv_gemm(conv, launch=launch)
        return None
    if chosen.design == "flat":
        return flat_step(conv, launch=launch, tma=chosen.tma)
    if chosen.design == "window":
        return window_step(conv, tma=chosen.tma, split_k=chosen.split_k)
    if chosen.design == "grouped":
        return grouped_step(conv, launch=launch)
    return implicit_step(conv, launch=launch, tma=chosen.tma, split_k=chosen.split_k)


def design_step(conv: Conv, launch: Launcher = direct, *, window: bool = True,
                beside: bool = False):  # fmt: skip
    """_design_step of plan(conv, launch, beside); window=False keeps the window design out (the
    dgrad's negative paddings would start its TMA boxes past the image, which its tiling
    assumes not)."""
    chosen = plan(conv, launch, beside)
    if chosen.design == "window" and not window:
        chosen = chosen._replace(design="implicit")
    return _design_step(conv, chosen, launch)


class _Launch(NamedTuple):
    """A direct call's plan (_PLANS): the design's Step and what a call allocates for it."""

    step: object  # kernels._launch.Step over (x, w2d, bias, y[, workspace, counters])
    scratch: object  # None, or device -> (workspace, counters)
    shape: tuple  # y's (N, K, P, Q)
    strides: tuple  # y's: NHWC when x is, else NCHW
    copy_w: bool  # the weight is not channels_last: its (K, R·S·C) matrix is a copy per call
    residual: bool = False  # the step adds a residual in its epilogue (its fifth tensor)


# Direct 4-D calls' plans by _plan_key; see kernels/_launch.py. _UNFUSED: a residual call whose
# sum torch adds after the conv (the conv's own plan is kept under its key without residual)
_PLANS = PlanCache()
_UNFUSED = object()


def _plan_key(x, weight, bias, stride, padding, dilation, activation, groups,
              residual=None) -> tuple:  # fmt: skip
    """Everything a direct call's launch (and its argument checks) depend on but the tensors'
    pointers; raises AttributeError or TypeError for arguments no plan can have (not tensors,
    unhashable lists)."""
    key = (
        x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, weight.dtype, x.device,
        weight.device, x.data_ptr() % 16, weight.data_ptr() % 16,
        None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device,
                                   bias.data_ptr() % 16),
        stride, padding, dilation, activation, groups, torch._C._get_cudnn_allow_tf32(),
        None if residual is None else (residual.shape, residual.stride(), residual.dtype,
                                       residual.device),
    )  # fmt: skip
    hash(key)
    return key


def _launch_planned(p: _Launch, x, weight, bias, residual=None) -> torch.Tensor:
    y = x.new_empty_strided(p.shape, p.strides)
    w2d = _weight_matrix(weight) if p.copy_w else weight  # the same pointer as its matrix view
    if p.residual:
        p.step(x, w2d, bias, y, residual)
    elif p.scratch is None:
        p.step(x, w2d, bias, y)
    else:
        p.step(x, w2d, bias, y, *p.scratch(x.device))
    return y


# ---------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------
def _pair(name: str, value, minimum: int) -> tuple[int, int]:
    if isinstance(value, str):
        raise ValueError(f"{name}={value!r} is not supported; pass an int or a pair of ints")
    pair = (value, value) if isinstance(value, int) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise TypeError(f"{name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value!r}")
    return pair


def resolve_padding(padding, kernel_rs, stride_hw, dilation_hw):
    """((top, left), (bottom, right)) of F.conv2d's padding: an int or a pair (the same on both
    sides), 'valid' (none) or 'same' (stride 1 only, as in torch: the output keeps the input's
    size; an even kernel's extra row and column go to the bottom and right, as torch pads), or
    (top, left, bottom, right), the form kernels/ops.py resolves 'same' into. The kernels take
    the top/left padding as their offset; the bottom/right one is the output size alone."""
    if padding == "valid":
        return (0, 0), (0, 0)
    if padding == "same":
        if stride_hw != (1, 1):
            raise ValueError(f"padding='same' needs stride 1, got stride={stride_hw} (as in torch)")
        totals = [d * (k - 1) for d, k in zip(dilation_hw, kernel_rs, strict=True)]
        lo = tuple(t // 2 for t in totals)
        return lo, tuple(t - low for t, low in zip(totals, lo, strict=True))
    if isinstance(padding, str):
        raise ValueError(f"padding={padding!r} is not supported; pass 'same', 'valid', an int "
                         "or a pair of ints")  # fmt: skip
    if isinstance(padding, tuple | list) and len(padding) == 4:
        lo, hi = _pair("padding", padding[:2], 0), _pair("padding", padding[2:], 0)
        return lo, hi
    pair = _pair("padding", padding, 0)
    return pair, pair


def check_groups_type(groups) -> None:
    """TypeError unless groups is an int >= 1; a string there is most likely an activation
    passed in the order that had it seventh (F.conv2d's order has groups there)."""
    if not isinstance(groups, int) or isinstance(groups, bool) or groups < 1:
        hint = " (activation is keyword-only: conv2d(..., groups, activation=...))" \
            if isinstance(groups, str) else ""  # fmt: skip
        raise TypeError(f"groups must be an int >= 1, got {groups!r}{hint}")


def _groups(groups, C: int, K: int, C_w: int, x_shape, w_shape) -> int:
    """groups as F.conv2d takes it: an int >= 1 dividing C and K, with C / groups the weight's
    channels; every such value is supported (1, grouped, depthwise with any multiplier)."""
    check_groups_type(groups)
    if C % groups or K % groups or C // groups != C_w:
        per_group = "" if C % groups else f" = {C // groups}"
        raise ValueError(
            f"x has {C} channels (shape {tuple(x_shape)}) and weight has shape "
            f"{tuple(w_shape)}: groups={groups} must divide C = {C} and K = {K}, and the "
            f"weight's dim 1 must be C / groups{per_group}"
        )
    return groups


def _check(x, weight, bias, stride, padding, dilation, activation, groups=1):
    """Every check of conv2d's arguments; returns the (stride, padding, dilation) pairs, the
    output size (P, Q) and the activation id."""
    check_tensor("x", x)
    if x.dim() not in (3, 4):
        raise ValueError(f"x must be 3-D (C, H, W) or 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    check_tensor("weight", weight, ndim=4)
    if bias is not None:
        check_tensor("bias", bias, ndim=1)
    check_same({"x": x, "weight": weight, "bias": bias})
    stride_hw = _pair("stride", stride, 1)
    dilation_hw = _pair("dilation", dilation, 1)
    act = activation_id(activation)
    C, H, W = x.shape[-3:]
    K, C_w, R, S = weight.shape
    if K == 0:
        raise ValueError(f"weight has shape {tuple(weight.shape)}: no output channels (torch "
                         "refuses it too)")  # fmt: skip
    padding_hw, padding_hi = resolve_padding(padding, (R, S), stride_hw, dilation_hw)
    if groups == 1 and C_w != C:
        raise ValueError(
            f"x has {C} channels (shape {tuple(x.shape)}) but weight expects {C_w} "
            f"(shape {tuple(weight.shape)})"
        )
    _groups(groups, C, K, C_w, x.shape, weight.shape)
    if bias is not None and bias.shape[0] != K:
        raise ValueError(f"bias has shape {tuple(bias.shape)} but weight has {K} output channels")
    window_h = dilation_hw[0] * (R - 1) + 1
    window_w = dilation_hw[1] * (S - 1) + 1
    padded_h, padded_w = H + padding_hw[0] + padding_hi[0], W + padding_hw[1] + padding_hi[1]
    if window_h > padded_h or window_w > padded_w:
        raise ValueError(
            f"kernel {R}x{S} with dilation {dilation_hw} spans {window_h}x{window_w}, larger than "
            f"the padded input {padded_h}x{padded_w} (x shape {tuple(x.shape)})"
        )
    P = (padded_h - window_h) // stride_hw[0] + 1
    Q = (padded_w - window_w) // stride_hw[1] + 1
    return stride_hw, padding_hw, dilation_hw, (P, Q), act


def _channels_last_output(x: torch.Tensor) -> bool:
    """Follow the input's layout: channels innermost (channels_last, or a channel slice of it).

    When both layouts describe x (C == 1 or H == W == 1), is_contiguous() wins and the output is
    plain NCHW, which torch also prefers.
    """
    return not x.is_contiguous() and x.stride(1) == 1 and x.shape[1] > 1


def _new_output(x: torch.Tensor, K: int, P: int, Q: int) -> torch.Tensor:
    """y (N, K, P, Q), uninitialised, in x's layout (_channels_last_output)."""
    fmt = torch.channels_last if _channels_last_output(x) else torch.contiguous_format
    return torch.empty((x.shape[0], K, P, Q), device=x.device, dtype=x.dtype, memory_format=fmt)


def _weight_matrix(weight: torch.Tensor) -> torch.Tensor:
    """(K, R·S·C) row-major view of a channels_last weight (a copy, per call, otherwise)."""
    K, C, R, S = weight.shape
    w2d = weight.permute(0, 2, 3, 1).reshape(K, R * S * C)
    if w2d.stride(1) != 1 or w2d.stride(0) < R * S * C:
        w2d = w2d.contiguous()
    return w2d


def _conv(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act) -> Conv:
    N, C, H, W = x.shape
    K, _, R, S = weight.shape
    P, Q = pq
    y = _new_output(x, K, P, Q)
    precision = dot_precision(x.dtype, torch.backends.cudnn.allow_tf32)
    constexprs = dict(HAS_BIAS=bias is not None, ACTIVATION=act, DOT_PRECISION=precision)
    return Conv(x, _weight_matrix(weight), bias, y, N, C, H, W, K, P, Q, R, S,
                stride_hw, padding_hw, dilation_hw, constexprs)  # fmt: skip


def prepare(x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None,
            groups=1) -> Conv:  # fmt: skip
    """Validate a conv2d call of a 4-D x and allocate its output (uninitialised); groups other
    than 1 give the grouped record (plan: "grouped"), depthwise included."""
    stride_hw, padding_hw, dilation_hw, pq, act = _check(
        x, weight, bias, stride, padding, dilation, activation, groups
    )
    return _conv(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act)


# ---------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------
def conv2d_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    stride=1,
    padding=0,
    dilation=1,
    activation: str | None = None,
    groups: int = 1,
    *,
    launch: Launcher = direct,
    key: tuple | None = None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """conv2d with the launcher made explicit, for kernels/ops.py; see conv2d. A direct call
    with a planned key launches its plan at once: a planned key passed every check. key: this
    call's _plan_key where the caller built it already (the training entry)."""
    if launch is direct and not torch.compiler.is_compiling() and key is None:
        try:
            key = _plan_key(x, weight, bias, stride, padding, dilation, activation, groups,
                            residual)  # fmt: skip
        except (AttributeError, TypeError):
            key = None  # the checks below say what is wrong, or the call goes unplanned
    if key is not None:
        p = _PLANS.get(key)
        if p is _UNFUSED:
            return add_residual(conv2d_forward(x, weight, bias, stride, padding, dilation, None,
                                               groups), residual, activation)  # fmt: skip
        if p is not None:
            return _launch_planned(p, x, weight, bias, residual)
    stride_hw, padding_hw, dilation_hw, pq, act = _check(
        x, weight, bias, stride, padding, dilation, activation, groups
    )
    if x.shape[-3] == 0:
        return _empty_reduction(x, weight, bias, pq, activation, residual)
    fused = None  # the Conv whose 1x1 GEMM epilogue adds the residual
    if residual is not None:
        check_residual(residual, x, weight.shape[0], pq)
        fused = _residual_conv(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act,
                               groups, residual, launch)  # fmt: skip
        if fused is None:  # added by torch after the conv
            if key is not None:
                _PLANS.put(key, _UNFUSED)
            y = conv2d_forward(x, weight, bias, stride, padding, dilation, None, groups,
                               launch=launch)  # fmt: skip
            return add_residual(y, residual, activation)
    unbatched = x.dim() == 3  # as F.conv2d allows
    if unbatched:
        x = x.unsqueeze(0)
    if groups != 1 and groups == x.shape[1]:
        y = _depthwise(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act, launch,
                       None if unbatched else key)  # fmt: skip
        return y.squeeze(0) if unbatched else y
    dtype = x.dtype
    upcast = is_interpreter() and dtype == torch.bfloat16
    if upcast:
        # The triton 3.8 interpreter multiplies bf16 tl.dot operands as their raw uint16 bits, so
        # run the fp32 kernel on upcast copies; the products are exact in fp32 either way, and the
        # result is rounded to bf16 once, as on the GPU.
        x, weight = x.float(), weight.float()
        bias = None if bias is None else bias.float()
    conv = fused or _conv(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act)
    if conv.y.numel():  # grouped convs too: plan() takes grouped.py for them
        chosen = plan(conv, launch)
        if fused is not None:  # 4-D, groups = 1, no upcast (_residual_conv)
            made = gemm_persistent_step(conv, tma=chosen.tma, residual=True)
        else:
            made = _design_step(conv, chosen, launch)
        if made is not None:
            step, scratch = made
            if fused is not None:
                extra = (residual,)
            else:
                extra = () if scratch is None else scratch(x.device)
            step(conv.x, conv.w2d, conv.bias, conv.y, *extra)
            if key is not None and not (unbatched or upcast):
                copy_w = conv.w2d.data_ptr() != weight.data_ptr()
                _PLANS.put(key, _Launch(step, scratch, tuple(conv.y.shape),
                                        tuple(conv.y.stride()), copy_w,
                                        fused is not None))  # fmt: skip
    y = conv.y if conv.y.dtype == dtype else conv.y.to(dtype)
    return y.squeeze(0) if unbatched else y


def _empty_reduction(x, weight, bias, pq, activation, residual):
    """A conv of zero input channels, as torch computes it: every output is the bias (0 without
    one), plus the residual, activated. Built from torch ops with x and weight joined in by an
    empty sum, so autograd gives them (empty) gradients as torch does; there is nothing to
    launch."""
    K = weight.shape[0]
    y = x.new_zeros((*x.shape[:-3], K, *pq))
    if _channels_last_output(x) and y.dim() == 4:
        y = y.contiguous(memory_format=torch.channels_last)
    y = y + (x.sum() + weight.sum()) * 0
    if bias is not None:
        y = y + bias.view(K, 1, 1)
    if residual is not None:
        y = y + residual
    return TORCH_ACTIVATIONS[activation or "none"](y)


def _depthwise(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act, launch, key):
    """groups = C, checked: depthwise.py's stencil on the 4-D x, its launch kept under `key` (a
    4-D direct call's, or None) as the other designs' are."""
    y = _new_output(x, weight.shape[0], *pq)
    if y.numel():
        step = depthwise_step(x, weight, bias, y, stride_hw, padding_hw, dilation_hw, act,
                              launch=launch)  # fmt: skip
        step(x, weight, bias, y)
        if key is not None:
            _PLANS.put(key, _Launch(step, None, tuple(y.shape), tuple(y.stride()), False))
    return y


def check_residual(residual, x, K: int, pq) -> None:
    """One clear error for a residual conv2d cannot add: not a tensor, or not the output's
    shape, dtype and device."""
    check_tensor("residual", residual)
    shape = (*x.shape[:-3], K, *pq)
    if tuple(residual.shape) != shape:
        raise ValueError(f"residual has shape {tuple(residual.shape)} but the conv's output "
                         f"is {shape}")  # fmt: skip
    check_same({"x": x, "residual": residual})


def _residual_conv(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act, groups,
                   residual, launch) -> Conv | None:  # fmt: skip
    """The Conv whose 1x1 GEMM epilogue adds the residual, or None where none does: a direct
    4-D groups = 1 call that plan() sends to the persistent GEMM, the residual in the output's
    layout."""
    if launch is not direct or x.dim() != 4 or groups != 1 or torch.compiler.is_compiling():
        return None
    if is_interpreter() and x.dtype == torch.bfloat16:
        return None  # the interpreter's bf16 runs on fp32 copies (conv2d_forward)
    conv = _conv(x, weight, bias, stride_hw, padding_hw, dilation_hw, pq, act)
    if plan(conv, launch).design != "gemm_persistent" or residual.stride() != conv.y.stride():
        return None
    return conv


def check_residual_call(x, weight, bias, stride, padding, dilation, groups, residual) -> None:
    """The whole call's checks, the residual's included, before any work (for the paths that
    add the residual after the conv, which would otherwise find a bad one only after it)."""
    _, _, _, pq, _ = _check(x, weight, bias, stride, padding, dilation, None, groups)
    check_residual(residual, x, weight.shape[0], pq)


def add_residual(y: torch.Tensor, residual: torch.Tensor, activation: str | None):
    """act(y + residual) by torch's ops (autograd's where a gradient is needed)."""
    y = y + residual
    return y if activation is None else TORCH_ACTIVATIONS[activation](y)


def check_trainable(groups: int, channels: int | None) -> None:
    """NotImplementedError for a grouping with no backward (both training entries, autograd.py's
    and kernels/ops.py's, call it before any work, after checking groups' type)."""
    if groups not in (1, channels):
        raise NotImplementedError(
            f"conv2d with groups={groups} has no backward: groups=1 and depthwise (groups=C) "
            "train, other grouped convs are forward only; call it under torch.no_grad() or with "
            "inputs that need no gradient"
        )
