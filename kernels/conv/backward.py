"""conv2d's backward: dX through the forward's own implicit GEMM (dgrad), dW by wgrad.py's
split reduction, dZ = dY * act'(Z) and db by linear's backward kernels; autograd.py's
Conv2dFunction calls it, so kernels.conv2d trains.

dgrad. dX[h] = sum over (r, p) with p·stride + r·dil - pad = h of dZ[p] W[r]. At stride 1 that is
a forward conv of dZ with the weight flipped and transposed (C outputs, K inputs), padding
dil·(R-1) - pad (negative padding reads past the start; the kernels' bounds masks make that
legal) and dX's size as the output size. At stride s > 1 the zero-inserted dZ would waste
(s² - 1)/s² of the work, so dX is split into s_h·s_w phases (h mod s_h, w mod s_w): within a phase
only the taps r with (phase + pad - r·dil) divisible by s contribute, and they form a stride-1,
dilation dil/gcd(dil, s) conv of dZ with that subset of the weight, written straight into the
phase's strided view of dX (the implicit GEMM stores by strides). A phase no tap reaches is zero.
No flipped or transposed copy of the weight is made: the window and implicit kernels read each
sub-conv's taps in place, as boxes of the forward's (K, R·S·C) weight matrix whose rows are the
sub-conv's reduction channels (common.FlippedTaps; a weight that is not channels_last is copied
to that matrix, as its forward does).

Depthwise convs (groups = C) train through depthwise.py's stencils: dX is the same phase split
of depthwise convs with flipped taps, dW a per-channel reduction. Other groupings do not train.

1x1, stride-1, unpadded convs between NHWC tensors are GEMMs both ways: dX = dZ W by
kernels.matmul's fused_matmul, and dW = dZ^T X by wgrad.py, which on Hopper takes
wgrad_gemm.py's TMA GEMM for them (its pixel split fills the GPU where one GEMM's few output
tiles would not).

Every launch of a direct call goes through a kernels._launch.Step kept per call geometry, so a
training step's backward after the first pays the forward's thin host path, not the JIT's; and a
training call key keeps its whole backward (Backward), so a later step builds no plan key. A kept
backward replays its launches as one CUDA graph once a step's pointers come back
(kernels/_graphs.py).

Functions:
    dgrad_convs      the stride-1 convs (weight taps, padding, dilation, output view) of a dgrad
    conv2d_backward  (dX, dW, db) of a conv2d with a fused activation, each only when asked for
    Backward         a training key's planned backward, run with no key
    save_mode        what a training forward keeps for act'(Z)
"""

import math
from typing import NamedTuple

import torch

from kernels._common import (
    ACTIVATIONS,
    direct,
    dot_precision,
    is_interpreter,
)
from kernels._graphs import CAPTURE, Graphed
from kernels._launch import PlanCache
from kernels.conv import depthwise
from kernels.conv.common import Conv, FlippedTaps, as_matrix
from kernels.conv.depthwise import depthwise_step
from kernels.conv.dispatch import (
    _channels_last_output,
    _new_output,
    _weight_matrix,
    design_step,
)
from kernels.conv.wgrad import planned_wgrad
from kernels.conv.wgrad import run as run_wgrad
from kernels.linear.backward import column_sum, planned_activation_backward
from kernels.matmul.dispatch import fused_matmul
from kernels.matmul.dispatch import planned as planned_matmul

RELU = ACTIVATIONS["relu"]
NONE = ACTIVATIONS["none"]


class TapConv(NamedTuple):
    """One stride-1 conv of a dgrad: dX[:, :, h0::s_h, w0::s_w] = conv(dZ, weight taps)."""

    rows: tuple[int, ...]  # the weight's r indices, in the sub-conv's tap order
    cols: tuple[int, ...]  # its s indices
    padding: tuple[int, int]  # top/left padding of the sub-conv (may be negative)
    dilation: tuple[int, int]
    start: tuple[int, int]  # (h0, w0): the phase's first row and column of dX
    size: tuple[int, int]  # the phase's rows and columns


def _phase_taps(phase, pad, dil, stride, taps):
    """(tap indices in sub-conv order, sub-conv padding, dilation) of one axis's phase, or None
    where no tap reaches it."""
    hit = [r for r in range(taps) if (phase + pad - r * dil) % stride == 0]
    if not hit:
        return None
    g = math.gcd(dil, stride)
    # dZ row of tap r for dX row phase + stride·i: i + (phase + pad - r·dil) / stride; the last
    # tap has the smallest offset, so it leads the flipped order and sets the padding.
    offset_last = (phase + pad - hit[-1] * dil) // stride
    return tuple(reversed(hit)), -offset_last, dil // g


def dgrad_convs(hw, rs, stride, padding, dilation) -> tuple[list[TapConv], bool]:
    """The stride-1 convs whose outputs tile dX (H, W) exactly, and whether some phase is left
    with no tap (dX must then start zeroed). See the module docstring."""
    convs, gaps = [], False
    for h0 in range(stride[0]):
        for w0 in range(stride[1]):
            size = (-(-(hw[0] - h0) // stride[0]), -(-(hw[1] - w0) // stride[1]))
            if min(size) <= 0:
                continue
            th = _phase_taps(h0, padding[0], dilation[0], stride[0], rs[0])
            tw = _phase_taps(w0, padding[1], dilation[1], stride[1], rs[1])
            if th is None or tw is None:
                gaps = True
                continue
            convs.append(TapConv(th[0], tw[0], (th[1], tw[1]), (th[2], tw[2]), (h0, w0), size))
    return convs, gaps


def _flipped(tc: TapConv, S: int, C: int) -> FlippedTaps:
    """Where sub-conv tap (i, j) lies in the forward's (K, R·S·C) weight matrix: the forward's
    tap (rows[i], cols[j]), whose rows and columns step down by a constant (the stride over its
    gcd with the dilation: _phase_taps keeps every such tap of the phase)."""
    dr = tc.rows[0] - tc.rows[1] if len(tc.rows) > 1 else 0
    ds = tc.cols[0] - tc.cols[1] if len(tc.cols) > 1 else 0
    return FlippedTaps((tc.rows[0] * S + tc.cols[0]) * C, -dr * S * C, -ds * C)


def _nhwc(t: torch.Tensor) -> torch.Tensor:
    return t if as_matrix(t) else t.contiguous(memory_format=torch.channels_last)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """An NHWC (N, K, P, Q) tensor as its (N·P·Q, K) matrix."""
    N, K, P, Q = t.shape
    return t.as_strided((N * P * Q, K), (t.stride(3), 1))


class _Dgrad(NamedTuple):
    """A direct call's dgrad launches (_DGRAD), with each view a call takes fixed: a later
    call builds them by as_strided, with no indexing."""

    gaps: bool  # some phase has no tap: dX starts zeroed
    copy_w: bool  # the weight is not channels_last: its (K, R·S·C) matrix is a copy per call
    # per sub-conv: (Step, scratch, its phase of dX), the view None where it is all of dX (a
    # stride-1 dgrad's one sub-conv)
    phases: tuple


# dgrad launches of direct calls, per geometry
_DGRAD = PlanCache()


def _view_of(view: torch.Tensor, base: torch.Tensor):
    """view as (size, stride, offset from base's), or None where it is all of base."""
    if view.shape == base.shape and view.stride() == base.stride():
        return None
    return tuple(view.shape), view.stride(), view.storage_offset() - base.storage_offset()


def _as_view(base: torch.Tensor, view) -> torch.Tensor:
    if view is None:
        return base
    size, stride, offset = view
    return base.as_strided(size, stride, base.storage_offset() + offset)


# A planned backward on a GPU runs its independent launches on side streams: dW beside dX, and
# a strided dgrad's phases beside each other. On the small-spatial layers each fills only part
# of an H100 (a 7x7 phase of a 512-channel dX is 52 tiles of 128x128 for 132 SMs); together
# they share it. Traced calls (one stream in a graph) and a caller's captures run in order, and
# so do a dgrad's phases on its first call, which tunes them; a graphed backward's own capture
# (kernels._graphs) keeps the side streams as branches of its graph.
# dW's stream has the higher priority: dW is the step's longest launch, and when its blocks and
# the dgrad's wait for SMs together, dW's should go first (docs/kernels/conv.md, "The dgrad's
# weight in place").
CONCURRENT = True
SIDE_STREAMS = 4  # the dgrad's phases take the first three, dW the last
_SIDE: dict = {}


class _Side:
    """A device's side streams, an event each to join on, and one to fork from. Events are
    reused (a wait takes the event's latest record) and streams switched by id: the host path
    of a training step already costs more than eager's, so a fork adds a few C calls."""

    def __init__(self, device: torch.device):
        self.streams = [torch.cuda.Stream(device, priority=-1 if i == SIDE_STREAMS - 1 else 0)
                        for i in range(SIDE_STREAMS)]  # fmt: skip
        self.done = [torch.cuda.Event() for _ in self.streams]
        self.forked = torch.cuda.Event()
        self.device, self.main = device, None

    def fork(self, first: int, count: int) -> None:
        """Streams first .. first + count - 1 wait for what the current stream has queued."""
        self.main = torch.cuda.current_stream(self.device)
        self.forked.record(self.main)
        for stream in self.streams[first : first + count]:
            stream.wait_event(self.forked)

    def use(self, i: int | None) -> None:
        """Make side stream i (None: the main one) the current stream."""
        stream = self.main if i is None else self.streams[i]
        torch._C._cuda_setStream(stream_id=stream.stream_id, device_index=stream.device_index,
                                 device_type=stream.device_type)  # fmt: skip

    def join(self, first: int, count: int) -> None:
        """The main stream (current again) waits for what those streams queued."""
        self.use(None)
        for i in range(first, first + count):
            self.done[i].record(self.streams[i])
            self.main.wait_event(self.done[i])


def _concurrent(t: torch.Tensor) -> bool:
    """Whether launches on t's device may go to side streams: CONCURRENT, a CUDA tensor, and no
    CUDA-graph capture under way but the graphed backward's own (kernels._graphs), whose graph
    then holds the side streams' launches as parallel branches. A caller's capture runs the
    backward in order: side streams joined into it are tested only through our own capture."""
    return CONCURRENT and t.is_cuda and (CAPTURE.active
                                         or not torch.cuda.is_current_stream_capturing())


def _side(device: torch.device) -> _Side:
    side = _SIDE.get(device)
    if side is None:
        side = _SIDE[device] = _Side(device)
    return side


def _dgrad_key(dz, weight, dx, stride, padding, dilation, beside) -> tuple:
    return (dz.shape, dz.stride(), dx.shape, dx.stride(), weight.shape, weight.stride(),
            dz.dtype, dz.device, dz.data_ptr() % 16, dx.data_ptr() % 16, stride, padding,
            dilation, torch._C._get_cudnn_allow_tf32(), beside)  # fmt: skip


def _dgrad(dz, weight, dx, stride, padding, dilation, launch, beside=False) -> _Dgrad | None:
    """Fill dx (N, C, H, W, allocated) with the dgrad of dz (N, K, P, Q); return the plan this
    geometry's direct calls run (None for traced launches). beside: dW runs beside it on a side
    stream, so a one-phase dgrad of few tiles splits its reduction (dispatch.split_k_rule)."""
    N, C, H, W = dx.shape
    K, _, R, S = weight.shape
    planned = launch is direct and not torch.compiler.is_compiling()
    key = None
    if planned:
        key = _dgrad_key(dz, weight, dx, stride, padding, dilation, beside)
        plan = _DGRAD.get(key)
        if plan is not None:
            _run_dgrad(plan, dz, weight, dx)
            return plan
    convs, gaps = dgrad_convs((H, W), (R, S), stride, padding, dilation)
    if gaps:
        dx.zero_()
    precision = dot_precision(dz.dtype, torch.backends.cudnn.allow_tf32)
    constexprs = dict(HAS_BIAS=False, ACTIVATION=NONE, DOT_PRECISION=precision)
    phased = stride != (1, 1)
    phases = []
    w2d = _weight_matrix(weight)  # each sub-conv reads its taps in place (common.FlippedTaps)
    for tc in convs:
        view = dx[:, :, tc.start[0] :: stride[0], tc.start[1] :: stride[1]]
        # A traced launch writes a phase into a tensor of its own, copied into place after:
        # Inductor stages a user kernel's output that is a strided view with a storage offset
        # through a buffer that loses the offset, and its copy back read past the end on an
        # H100 (an illegal address; docs/kernels/conv.md, "Backward (training)").
        y = view if planned or not phased else _new_output(view, *view.shape[1:])
        conv = Conv(dz, w2d, None, y, N, K, dz.shape[2], dz.shape[3], C, *tc.size,
                    len(tc.rows), len(tc.cols), (1, 1), tc.padding, tc.dilation, constexprs,
                    _flipped(tc, S, C))  # fmt: skip
        # The window design only for the one stride-1 sub-conv: on an H100 one stride-2 phase
        # (taps 2x1) through it came back partly wrong, in some images, once in four runs;
        # the implicit GEMM takes the phases until that is understood.
        step, scratch = design_step(conv, launch, window=not phased and min(tc.padding) >= 0,
                                    beside=beside and len(convs) == 1)  # fmt: skip
        step(dz, w2d, None, y, *(() if scratch is None else scratch(dz.device)))
        phases.append((step, scratch, _view_of(view, dx)))
        if y is not view:
            view.copy_(y)
    if key is None:
        return None
    copy_w = w2d.data_ptr() != weight.data_ptr()
    return _DGRAD.put(key, _Dgrad(gaps, copy_w, tuple(phases)))


def _run_dgrad(plan: _Dgrad, dz, weight, dx, workspaces=None) -> None:
    """plan's launches; workspaces: each split phase's split-K workspace, in phase order (new
    per call where None)."""
    if plan.gaps:
        dx.zero_()
    w2d = _weight_matrix(weight) if plan.copy_w else weight  # the same pointer as its matrix
    phases = plan.phases
    side, count = None, min(len(phases) - 1, SIDE_STREAMS - 1)
    if count > 0 and _concurrent(dz):
        side = _side(dz.device)
        side.fork(0, count)
    given = iter(workspaces or ())
    try:
        for i, (step, scratch, view) in enumerate(phases):
            if side is not None:
                side.use(None if i == 0 else (i - 1) % count)
            # the counters are the phase's stream's (tile_counters), so taken on that stream
            workspace = next(given, None) if _ws(scratch) else None
            extra = () if scratch is None else scratch(dz.device, workspace)
            step(dz, w2d, None, _as_view(dx, view), *extra)
    finally:
        if side is not None:  # what the phases read and wrote is the main stream's again
            side.join(0, count)


def _ws(scratch) -> int:
    """fp32 elements of a dgrad phase's split-K workspace (common.split_scratch; 0 unsplit)."""
    return getattr(scratch, "numel", 0)


# depthwise dgrad launches of direct calls, per geometry (DepthwiseDgrad)
_DEPTHWISE_DGRAD = PlanCache()


class DepthwiseDgrad(NamedTuple):
    """A depthwise dgrad's launches: whether some pixels of dX no phase reaches (zeroed
    first), the device index of every phase's taps in one gather, and per phase its TapConv
    and one step a channel of the multiplier (None until its first launch)."""

    gaps: bool
    index: torch.Tensor
    phases: list


def _depthwise_dgrad(dz, weight, dx, stride, padding, dilation, launch) -> DepthwiseDgrad | None:
    """Fill dx with the dgrad of a depthwise conv: per stride phase, depthwise convs of dZ with
    the phase's taps flipped (depthwise.py's stencil, writing the phase's view of dx); with a
    channel multiplier m, output channel j of each group's m is its own conv, summed. One gather
    takes every phase's taps at once, each phase's weight a view of it (the stencil reads the
    weight by its strides); direct calls keep the gather index on the device and their steps
    per geometry, as _dgrad does, and get that plan back (None otherwise)."""
    N, C, H, W = dx.shape
    K, _, R, S = weight.shape
    planned = launch is direct and not torch.compiler.is_compiling()
    key = plan = None
    if planned:
        key = (dz.shape, dz.stride(), dx.shape, dx.stride(), weight.shape, weight.stride(),
               dz.dtype, dz.device, dz.data_ptr() % 16, dx.data_ptr() % 16, stride, padding,
               dilation)  # fmt: skip
        plan = _DEPTHWISE_DGRAD.get(key)
    if plan is None:
        convs, gaps = dgrad_convs((H, W), (R, S), stride, padding, dilation)
        taps = [r * S + s for tc in convs for r in tc.rows for s in tc.cols]
        index = torch.tensor(taps, dtype=torch.int64, device=dz.device)
        plan = DepthwiseDgrad(gaps, index, [(tc, [None] * (K // C)) for tc in convs])
    _run_depthwise_dgrad(plan, dz, weight, dx, stride, launch, armed=planned)
    if planned:
        _DEPTHWISE_DGRAD.put(key, plan)
        return plan
    return None


def _run_depthwise_dgrad(plan: DepthwiseDgrad, dz, weight, dx, stride, launch=direct,
                         armed=True) -> None:  # fmt: skip
    """A depthwise dgrad's launches into dx, building each phase's steps on first use; armed:
    through their armed launches (a kept plan), else once through the JIT."""
    K, _, R, S = weight.shape
    m = K // dx.shape[1]
    if plan.gaps:
        dx.zero_()
    gathered = weight.reshape(K, R * S).index_select(1, plan.index)
    start = 0
    for tc, steps in plan.phases:
        rows, cols = len(tc.rows), len(tc.cols)
        taps = gathered[:, start : start + rows * cols].unflatten(1, (1, rows, cols))
        start += rows * cols
        y = dx[:, :, tc.start[0] :: stride[0], tc.start[1] :: stride[1]]
        for j in range(m):
            z_j, w_j = dz[:, j::m], taps[j::m]
            out = y if j == 0 else torch.empty_like(y)
            step = steps[j]
            if step is None:
                step = depthwise_step(z_j, w_j, None, out, (1, 1), tc.padding, tc.dilation, NONE,
                                      launch=launch)  # fmt: skip
                steps[j] = step  # kept with the plan on planned calls
            if armed:
                step(z_j, w_j, None, out)
            else:  # built for this call alone: not worth arming
                step.once(z_j, w_j, None, out)
            if j:
                y.add_(out)


def _dz(dy, saved, act_id: int, need_db: bool, launch, plan=None, out=(None, None)):
    """dZ = dY·act'(Z) for an NHWC dy, as an NHWC (N, K, P, Q) tensor, db where asked for, and
    the activation backward's DzPlan (None without an activation, or unplanned). plan: that
    DzPlan from an earlier call of this key, run instead of a keyed call; out: with a plan, the
    (dZ as an (N·P·Q, K) matrix, db) to write, either None to allocate it."""
    if act_id == NONE:
        return dy, (column_sum(_rows(dy), launch, out[1]) if need_db else None), None
    if plan is None:
        dz2d, db, plan = planned_activation_backward(_rows(dy), _rows(_nhwc(saved)), act_id,
                                                     need_db, launch)  # fmt: skip
    else:
        dz2d, db = plan(_rows(dy), _rows(_nhwc(saved)), out)
    N, K, P, Q = dy.shape
    return dz2d.view(N, P, Q, K).permute(0, 3, 1, 2), db, plan


def _dx_dw(dz, weight, need_dx, need_dw, gemm_dx, overlap, dgrad, wgrad, new_dx, new_dw, launch,
           gemm_out=False):  # fmt: skip
    """dX and dW of a groups = 1 conv, each None unless asked for: new_dx() filled by the 1x1
    GEMM where gemm_dx (by a GEMM that allocates it, unless gemm_out), else by dgrad(dx,
    beside) (beside: dW runs on a side stream beside it);
    dW = wgrad(new_dw()), on a side stream beside dX where `overlap` (and the stream allows:
    _concurrent), else after it."""
    dx = dw = None
    side = None
    if overlap and _concurrent(dz):  # dW on a side stream beside dX (see CONCURRENT)
        dw = new_dw()  # allocated here, on the main stream, which reads and frees it after the join
        side = _side(dz.device)
        side.fork(SIDE_STREAMS - 1, 1)
        side.use(SIDE_STREAMS - 1)
        try:
            wgrad(dw)
        finally:
            side.use(None)
    if need_dx:
        if gemm_dx:  # dX (N·H·W, C) = dZ (N·H·W, K) @ W (K, C)
            K, C = weight.shape[:2]
            N, _, H, W = dz.shape
            if gemm_out:  # dX (channels_last) is the GEMM's (N·H·W, C) output
                dx = new_dx()
                fused_matmul(_rows(dz), weight.reshape(K, C), launch=launch, out=_rows(dx))
            else:
                dx2d = fused_matmul(_rows(dz), weight.reshape(K, C), launch=launch)[0]
                dx = dx2d.view(N, H, W, C).permute(0, 3, 1, 2)
        else:
            dx = new_dx()
            dgrad(dx, side is not None)
    if side is not None:
        side.join(SIDE_STREAMS - 1, 1)
    elif need_dw:
        # the 1x1 too: as one GEMM its reduction over N·H·W would run on a few output tiles,
        # while the wgrad kernel splits the pixels over the SMs
        dw = new_dw()
        wgrad(dw)
    return dx, dw


def _overlaps(need_dx: bool, need_dw: bool, gemm_dx: bool) -> bool:
    # not beside the dX GEMM: it fills the GPU, and on an H100 dW beside it cost GPU time
    # (32x2048x7x7 -> 512: 42.3 us a step in order, 47.7 overlapped)
    return need_dx and need_dw and not gemm_dx


def conv2d_backward(dy, x, weight, saved, act_id, stride, padding, dilation, need_dx, need_dw,
                    need_db, *, launch=direct, groups=1):  # fmt: skip
    """(dX, dW, db) of y = act(conv2d(x, weight) + bias), each None unless asked for.

    saved: the forward's output y for relu (relu'(z) = [y > 0]) or its pre-activation z for the
    other activations, None without one. stride, padding (top/left), dilation: resolved pairs.
    dX comes back in x's layout, dW channels_last (its (K, R·S·C) matrix), db in dy's dtype.
    """
    return _backward(dy, x, weight, saved, act_id, stride, padding, dilation,
                     (need_dx, need_dw, need_db), launch, groups)[0][:3]  # fmt: skip


def _depthwise_backward(dz, db, dz_plan, dy, x, weight, act_id, stride, padding, dilation, needs,
                        nhwc_dy, launch):  # fmt: skip
    """_backward of a depthwise conv, from its dZ (and db): ((dX, dW, db, dZ), and for a direct
    call whose launches all planned, the DepthwiseBackward that repeats it, else None)."""
    need_dx, need_dw, _ = needs
    dx = dw = dgrad = wgrad = None
    if need_dx:
        dx = _new_output(x, *x.shape[1:])  # in x's layout
        dgrad = _depthwise_dgrad(dz, weight, dx, stride, padding, dilation, launch)
    if need_dw:
        wgrad, kept = depthwise.wgrad_plan(dz, x, weight.shape[2:], stride, padding, dilation,
                                           launch)  # fmt: skip
        dw = torch.empty(weight.shape, device=x.device, dtype=x.dtype)
        depthwise.run_wgrad(wgrad, dz, x, dw, depthwise.wgrad_workspace(wgrad, dw), kept)
        wgrad = wgrad if kept else None
    plans = [dgrad] * need_dx + [wgrad] * need_dw + [dz_plan] * (act_id != NONE)
    plan = None
    if (need_dx or need_dw) and None not in plans:
        plan = DepthwiseBackward(dy.stride(), nhwc_dy, needs, act_id, dz_plan, stride, dgrad, wgrad,
                                 None if dx is None else _layout(dx), Graphed())  # fmt: skip
    return (dx, dw, db, dz), plan


def _backward(dy, x, weight, saved, act_id, stride, padding, dilation, needs, launch, groups):
    """conv2d_backward's (dX, dW, db) and dZ = dY·act'(Z) (a residual's gradient), and for a
    direct call whose launches all planned, the plan that repeats it with no key (Backward, or
    DepthwiseBackward for groups = C), else None."""
    need_dx, need_dw, need_db = needs
    nhwc_dy = as_matrix(dy)
    dz, db, dz_plan = _dz(dy if nhwc_dy else _nhwc(dy), saved, act_id, need_db, launch)
    if groups != 1:  # depthwise (the only grouping that trains): depthwise.py's stencils
        return _depthwise_backward(dz, db, dz_plan, dy, x, weight, act_id, stride, padding,
                                   dilation, needs, nhwc_dy, launch)  # fmt: skip
    K, C, R, S = weight.shape
    unit = (R, S) == (1, 1) and stride == (1, 1) and padding == (0, 0)
    gemm_dx = unit and _channels_last_output(x)
    planned = launch is direct and not torch.compiler.is_compiling()
    made = {}

    def dgrad(dx, beside):
        made["dgrad"] = _dgrad(dz, weight, dx, stride, padding, dilation, launch, beside)

    def wgrad(dw):
        made["wgrad"] = planned_wgrad(dz, x, (R, S), stride, padding, dilation, launch=launch,
                                      out=dw)[1]  # fmt: skip

    def new_dw():
        return torch.empty((K, C, R, S), device=x.device, dtype=x.dtype,
                           memory_format=torch.channels_last)  # fmt: skip

    overlap = planned and _overlaps(need_dx, need_dw, gemm_dx)
    dx, dw = _dx_dw(dz, weight, need_dx, need_dw, gemm_dx, overlap, dgrad, wgrad,
                    lambda: _new_output(x, *x.shape[1:]), new_dw, launch)  # fmt: skip
    plan = None
    if planned and made.get("dgrad", True) is not None and made.get("wgrad", True) is not None:
        plan = Backward(dy.stride(), nhwc_dy, needs, act_id, dz_plan, gemm_dx, overlap,
                        made.get("dgrad"), made.get("wgrad"), None if dx is None else _layout(dx),
                        None if dw is None else _layout(dw), Graphed())  # fmt: skip
    return (dx, dw, db, dz), plan


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride()


class Backward(NamedTuple):
    """A training call key's backward, once a direct call has planned every launch of it
    (groups = 1): those plans held here, so a later backward with dY in the same layout runs
    them with no key and no slicing (Conv2dFunction keeps it in the key's Training entry).
    dY's strides are part of what it was made for: autograd hands a layer the layout its
    consumer produced, the same each step.

    With every output allocated first (dX, dW, db, dZ with an activation, and the split-K
    workspaces), its launches are a sequence of fixed pointers: kernels._graphs captures them
    as one CUDA graph once the same pointers come back, and replays that graph from then on."""

    dy_strides: tuple  # dY's strides it was made for
    nhwc_dy: bool  # that dY is an (N·P·Q, K) matrix (else an NHWC copy is taken)
    needs: tuple  # (need_dx, need_dw, need_db)
    act_id: int
    dz_plan: object  # the activation backward's DzPlan, or None
    gemm_dx: bool  # dX by the 1x1 GEMM (which keeps its own plan)
    overlap: bool  # dW beside dX on a side stream, where the stream allows
    dgrad: _Dgrad | None
    wgrad: object  # wgrad's plan, or None
    dx_layout: tuple | None  # dX's (shape, strides)
    dw_layout: tuple | None
    graphed: Graphed  # this backward's CUDA graphs

    def fits(self, dy, needs) -> bool:
        return (needs == self.needs and dy.stride() == self.dy_strides
                and not torch.compiler.is_compiling())  # fmt: skip

    def __call__(self, dy, x, weight, saved, need_dz=True):
        """(dX, dW, db, dZ); dZ may be None where not need_dz. Every output is allocated before
        the launches, which a graph replays where kernels._graphs allows, else run one by one."""
        if not self.nhwc_dy:
            dy = dy.contiguous(memory_format=torch.channels_last)
        out = self.outputs(dy)

        def launches():
            self.launch(dy, x, weight, saved, out)

        self.graphed.run(dy, (dy, x, weight, saved, *out[:4], *out[4]), launches,
                         lambda: self.kept(dy, weight))  # fmt: skip
        return _kept_gradients(*out[:4], dy, self.act_id, need_dz)

    @property
    def splits_dw(self) -> bool:
        """dW's reduction splits, so its workspace leads outputs()'s."""
        return self.needs[1] and self.wgrad.reduce is not None

    def outputs(self, dy) -> tuple:
        """(dX, dW, db, dZ as an (N·P·Q, K) matrix, the split-K workspaces), each output None
        where the step does not make it (dZ: without an activation it is dY); the workspaces:
        (dW's, if its reduction splits, then each split dgrad phase's). dZ and the workspaces
        are allocated here even where nothing outside the step reads them: the launches then
        allocate nothing, so a step's allocations are the same whether its graph replays or its
        launches run, and the pointers come back (docs/kernels/conv.md, "Backward (training)")."""
        need_dx, need_dw, need_db = self.needs
        N, K, P, Q = dy.shape
        sizes = []
        if self.splits_dw:
            sizes.append(self.wgrad.workspace)
        if need_dx and self.dgrad is not None:
            sizes += [_ws(s) for _, s, _ in self.dgrad.phases if _ws(s)]
        return (dy.new_empty_strided(*self.dx_layout) if need_dx else None,
                dy.new_empty_strided(*self.dw_layout) if need_dw else None,
                dy.new_empty_strided((K,), (1,)) if need_db else None,
                dy.new_empty_strided((N * P * Q, K), (K, 1)) if self.act_id != NONE else None,
                tuple(dy.new_empty((n,), dtype=torch.float32) for n in sizes))  # fmt: skip

    def launch(self, dy, x, weight, saved, out) -> None:
        """The step's launches into `out` (outputs(): allocated by the caller)."""
        need_dx, need_dw, need_db = self.needs
        dx, dw, db, dz2d, ws = out
        dz = _dz(dy, saved, self.act_id, need_db, direct, self.dz_plan, (dz2d, db))[0]
        dgrad, wgrad = self.dgrad, self.wgrad
        dw_ws, dx_ws = (ws[0], ws[1:]) if self.splits_dw else (None, ws)
        _dx_dw(dz, weight, need_dx, need_dw, self.gemm_dx, self.overlap,
               lambda out, _beside: _run_dgrad(dgrad, dz, weight, out, dx_ws),
               lambda out: run_wgrad(wgrad, dz, x, out, dw_ws), lambda: dx, lambda: dw, direct,
               gemm_out=True)  # fmt: skip

    def kept(self, dy, weight) -> tuple:
        """What a graph of this backward keeps alive beside its own: the plans it launches (the
        1x1 dX GEMM's lives in kernels.matmul's plan cache)."""
        gemm = None
        if self.gemm_dx and self.needs[0]:
            K, C = weight.shape[:2]
            gemm = planned_matmul(_rows(dy), weight.reshape(K, C), None, NONE, False)
        return (self.dz_plan, self.dgrad, self.wgrad, gemm)


class DepthwiseBackward(NamedTuple):
    """A depthwise training key's backward (Backward's counterpart for groups = C): its
    dgrad's and wgrad's plans, run with no key into outputs allocated first, so that the
    launches (a gather, a stencil a phase, the wgrad's partial sums and their sum) replay as
    one CUDA graph once a step's pointers come back."""

    dy_strides: tuple
    nhwc_dy: bool
    needs: tuple  # (need_dx, need_dw, need_db)
    act_id: int
    dz_plan: object  # the activation backward's DzPlan, or None
    stride: tuple
    dgrad: DepthwiseDgrad | None
    wgrad: object  # depthwise.WgradPlan, or None
    dx_layout: tuple | None
    graphed: Graphed

    fits = Backward.fits

    def __call__(self, dy, x, weight, saved, need_dz=True):
        need_dx, need_dw, need_db = self.needs
        if not self.nhwc_dy:
            dy = dy.contiguous(memory_format=torch.channels_last)
        N, K, P, Q = dy.shape
        dx = dy.new_empty_strided(*self.dx_layout) if need_dx else None
        dw = dy.new_empty(weight.shape) if need_dw else None
        db = dy.new_empty((K,)) if need_db else None
        dz2d = dy.new_empty((N * P * Q, K)) if self.act_id != NONE else None
        ws = depthwise.wgrad_workspace(self.wgrad, dw) if need_dw else None

        def launches():
            dz = _dz(dy, saved, self.act_id, need_db, direct, self.dz_plan, (dz2d, db))[0]
            if need_dx:
                _run_depthwise_dgrad(self.dgrad, dz, weight, dx, self.stride)
            if need_dw:
                depthwise.run_wgrad(self.wgrad, dz, x, dw, ws)

        self.graphed.run(dy, (dy, x, weight, saved, dx, dw, db, dz2d, ws), launches,
                         lambda: (self.dz_plan, self.dgrad, self.wgrad))  # fmt: skip
        return _kept_gradients(dx, dw, db, dz2d, dy, self.act_id, need_dz)


def _kept_gradients(dx, dw, db, dz2d, dy, act_id: int, need_dz: bool) -> tuple:
    """A kept backward's (dX, dW, db, dZ): dZ is dY without an activation, else the (N·P·Q, K)
    dZ matrix as an NHWC (N, K, P, Q) view, or None where not need_dz."""
    if act_id == NONE:
        return dx, dw, db, dy
    if not need_dz:
        return dx, dw, db, None
    N, K, P, Q = dy.shape
    return dx, dw, db, dz2d.view(N, P, Q, K).permute(0, 3, 1, 2)


def _upcast(backward, dy, x, weight, saved, *args, **kwargs):
    """backward's gradients; in the CPU interpreter, bf16 operands run as fp32 copies (its tl.dot
    multiplies bf16 as raw bits, as dispatch.conv2d_forward notes) and the results round once."""
    if not (is_interpreter() and dy.dtype == torch.bfloat16):
        return backward(dy, x, weight, saved, *args, **kwargs)
    up = [None if t is None else t.float() for t in (dy, x, weight, saved)]
    grads = backward(*up, *args, **kwargs)
    return tuple(None if g is None else g.to(torch.bfloat16) for g in grads)


def conv2d_backward_upcast(dy, x, weight, saved, *args, launch=direct, groups=1):
    """conv2d_backward, bf16 upcast in the CPU interpreter (_upcast)."""
    return _upcast(conv2d_backward, dy, x, weight, saved, *args, launch=launch, groups=groups)


def save_mode(act_id: int) -> str:
    """What the forward keeps for act'(Z): "none", "output" (relu: [y > 0] = [z > 0]) or
    "preact" (the other activations: the forward runs unfused and applies the activation)."""
    if act_id == NONE:
        return "none"
    return "output" if act_id == RELU else "preact"
