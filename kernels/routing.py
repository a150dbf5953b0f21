"""Route any nn.Module's torch calls to our kernels: `kernels.enable()`, `disable()`, `enabled()`.

    import kernels
    kernels.enable()                  # every model in this process, until kernels.disable()
    with kernels.enabled():           # or scoped: the previous state comes back on exit
        loss = model(x).sum(); loss.backward()
    kernels.routing.counts()          # {op: {"ours": n, "<reason>": m}}: what took which path

Routed: F.conv2d (groups and depthwise included), F.linear, torch.addmm (as a linear with a
bias), torch.matmul / mm / bmm and their Tensor methods (`a @ b`), softmax in its three
spellings, and F.scaled_dot_product_attention (the fused attention, kernels/attention).

Mechanism: function patching, as Liger-Kernel's monkey patches do, not torch.library
implementations of aten ops below autograd, as FlagGems' enable() does (docs/kernels/routing.md
says why in full). In short: our kernels are autograd Functions whose backward reuses the
forward's plan (the conv's and linear's graphed backwards), which an aten-level kernel of
aten::convolution and aten::convolution_backward would split apart; a patched Python function is
what Dynamo traces, so with `custom_ops=True` a torch.compile of the model sees our
torch.library custom ops (kernels/ops.py) and fuses the code around them (mode=triton-compiled);
and a call our kernels cannot take falls back to the very torch function it replaced, with the
reason counted, where an aten override has nothing to fall back to but redispatching.

ROUTES is the one table: each entry names the torch attribute it replaces, the op it counts as,
the check that says why our kernel cannot take a call (None: it can) and the adapter from torch's
signature to ours. A call is routed when its tensors are on a GPU, or on the CPU under Triton's
interpreter (TRITON_INTERPRET=1), so CPU tests run the same path as a GPU.

`record=` (a list) gets one entry per routed-or-not call: op, shapes, dtype, layout and the
arguments that pick a kernel, the raw material of the model shape sets.
"""

import contextlib
import dataclasses
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from kernels._common import SUPPORTED_DTYPES, is_interpreter

OURS = "ours"  # the counts' key of the calls our kernels took
# Read once, as triton.jit reads it; a constant, not a cached call, under Dynamo's trace
_CPU_KERNELS = is_interpreter()


@dataclasses.dataclass(frozen=True)
class Route:
    op: str  # what the call counts as: conv2d, linear, addmm, matmul, mm, bmm, softmax, sdpa
    owner: object  # the module or class whose attribute is replaced
    attribute: str
    refuse: Callable[..., str | None]  # torch's arguments -> why ours cannot take them, or None
    call: Callable[..., torch.Tensor]  # (our namespace, *torch's arguments) -> the result
    describe: Callable[..., dict]  # torch's arguments -> the recorded call (shapes, args)


# ---------------------------------------------------------------------------------------------
# What a call's tensors must be for any of our kernels
# ---------------------------------------------------------------------------------------------
def _tensors_refused(named: dict) -> str | None:
    """Why these tensors (None entries skipped) cannot reach a Triton kernel, or None."""
    first = None
    for name, t in named.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            return f"{name} is a {type(t).__name__}, not a tensor"
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {str(t.dtype).removeprefix('torch.')}"
        if t.device.type != "cuda" and not (t.device.type == "cpu" and _CPU_KERNELS):
            return f"{t.device.type} tensor"
        if first is None:
            first = t
        elif t.dtype != first.dtype:
            return "mixed dtypes"
        elif t.device != first.device:
            return "mixed devices"
    return None


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


def _layout(t: torch.Tensor) -> str:
    if t.is_contiguous():
        return "contiguous"
    if t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last):
        return "channels_last"
    return f"strides{tuple(t.stride())}"


def _shape_of(t) -> list | None:
    return list(t.shape) if isinstance(t, torch.Tensor) else None


def _dtype_of(*tensors) -> str | None:
    for t in tensors:
        if isinstance(t, torch.Tensor):
            return str(t.dtype).removeprefix("torch.")
    return None


# ---------------------------------------------------------------------------------------------
# conv2d: F.conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)
# ---------------------------------------------------------------------------------------------
def _conv2d_refuse(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    reason = _tensors_refused({"input": input, "weight": weight, "bias": bias})
    if reason:
        return reason
    if input.dim() not in (3, 4) or weight.dim() != 4:
        return f"{input.dim()}-D input"
    channels = input.shape[-3]
    if groups not in (1, channels) and _needs_grad(input, weight, bias):
        return "grouped conv (1 < groups < C) in training: no Triton backward"
    return None


def _conv2d_call(ns, input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return ns.conv2d(input, weight, bias, stride, padding, dilation, groups)


def _conv2d_describe(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return {
        "x": _shape_of(input), "weight": _shape_of(weight), "bias": bias is not None,
        "stride": stride, "padding": padding, "dilation": dilation, "groups": groups,
        "layout": _layout(input) if isinstance(input, torch.Tensor) else None,
    }  # fmt: skip


# ---------------------------------------------------------------------------------------------
# linear: F.linear(input, weight, bias=None); addmm(input, mat1, mat2) as linear with a bias
# ---------------------------------------------------------------------------------------------
def _linear_refuse(input, weight, bias=None):
    reason = _tensors_refused({"input": input, "weight": weight, "bias": bias})
    if reason:
        return reason
    if weight.dim() != 2 or input.dim() < 1 or (bias is not None and bias.dim() != 1):
        return "weight not 2-D or bias not 1-D"
    return None


def _linear_call(ns, input, weight, bias=None):
    return ns.linear(input, weight, bias)


def _linear_describe(input, weight, bias=None):
    return {"x": _shape_of(input), "weight": _shape_of(weight), "bias": bias is not None,
            "layout": _layout(input) if isinstance(input, torch.Tensor) else None}  # fmt: skip


def _addmm_refuse(input, mat1, mat2, *, beta=1, alpha=1):
    reason = _tensors_refused({"input": input, "mat1": mat1, "mat2": mat2})
    if reason:
        return reason
    if beta != 1 or alpha != 1:
        return "addmm with beta or alpha != 1"
    if mat1.dim() != 2 or mat2.dim() != 2 or input.dim() != 1 or input.shape[0] != mat2.shape[1]:
        return "addmm whose input is not a bias row"
    return None


def _addmm_call(ns, input, mat1, mat2, *, beta=1, alpha=1):
    return ns.linear(mat1, mat2.t(), input)  # input + mat1 @ mat2, the bias in the epilogue


def _addmm_describe(input, mat1, mat2, *, beta=1, alpha=1):
    return {"bias": _shape_of(input), "a": _shape_of(mat1), "b": _shape_of(mat2)}


# ---------------------------------------------------------------------------------------------
# matmul, mm, bmm (functions and Tensor methods; `a @ b` is Tensor.__matmul__)
# ---------------------------------------------------------------------------------------------
def _matmul_refuse(input, other):
    reason = _tensors_refused({"a": input, "b": other})
    if reason:
        return reason
    if input.dim() == 0 or other.dim() == 0:
        return "0-D operand"
    return None


def _mm_refuse(input, mat2):
    return _matmul_refuse(input, mat2) or (
        None if input.dim() == 2 and mat2.dim() == 2 else "mm of operands not 2-D"
    )


def _bmm_refuse(input, mat2):
    return _matmul_refuse(input, mat2) or (
        None if input.dim() == 3 and mat2.dim() == 3 and input.shape[0] == mat2.shape[0]
        else "bmm of operands not 3-D of one batch"
    )  # fmt: skip


def _matmul_call(ns, input, other):
    return ns.matmul(input, other)


def _matmul_describe(input, other):
    return {"a": _shape_of(input), "b": _shape_of(other),
            "layout": [_layout(t) for t in (input, other) if isinstance(t, torch.Tensor)]}


# ---------------------------------------------------------------------------------------------
# softmax: F.softmax(input, dim=None, _stacklevel=3, dtype=None), torch.softmax(input, dim,
# dtype=None) and Tensor.softmax(dim, dtype=None)
# ---------------------------------------------------------------------------------------------
def _softmax_refuse(input, dim=None, _stacklevel=3, dtype=None):
    reason = _tensors_refused({"input": input})
    if reason:
        return reason
    if not isinstance(dim, int):
        return "softmax with an implicit dim"
    if dtype is not None and dtype not in SUPPORTED_DTYPES:
        return f"softmax to dtype {str(dtype).removeprefix('torch.')}"
    if input.dim() == 0:
        return "0-D input"
    return None


def _softmax_call(ns, input, dim=None, _stacklevel=3, dtype=None):
    return ns.softmax(input, dim, dtype)


def _softmax_describe(input, dim=None, _stacklevel=3, dtype=None):
    return {"x": _shape_of(input), "dim": dim,
            "dtype_to": None if dtype is None else str(dtype).removeprefix("torch."),
            "layout": _layout(input) if isinstance(input, torch.Tensor) else None}  # fmt: skip


def _tensor_softmax_refuse(self, dim, dtype=None):
    return _softmax_refuse(self, dim, dtype=dtype)


def _tensor_softmax_call(ns, self, dim, dtype=None):
    return ns.softmax(self, dim, dtype)


def _tensor_softmax_describe(self, dim, dtype=None):
    return _softmax_describe(self, dim, dtype=dtype)


def _torch_softmax_refuse(input, dim, dtype=None):
    return _softmax_refuse(input, dim, dtype=dtype)


def _torch_softmax_describe(input, dim, dtype=None):
    return _softmax_describe(input, dim, dtype=dtype)


# ---------------------------------------------------------------------------------------------
# sdpa: F.scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
# is_causal=False, *, scale=None, enable_gqa=False) to the fused attention (kernels/attention)
# ---------------------------------------------------------------------------------------------
def _sdpa_refuse(*args, **kwargs):
    from kernels.attention import unsupported_sdpa_call

    return unsupported_sdpa_call(args, kwargs)


def _sdpa_call(ns, *args, **kwargs):
    return ns.sdpa(*args, **kwargs)


def _sdpa_describe(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                   scale=None, enable_gqa=False):  # fmt: skip
    return {"q": _shape_of(query), "k": _shape_of(key), "v": _shape_of(value),
            "causal": bool(is_causal), "mask": attn_mask is not None, "dropout_p": dropout_p,
            "enable_gqa": enable_gqa,
            "layout": [_layout(t) for t in (query, key, value) if isinstance(t, torch.Tensor)]}


ROUTES: tuple[Route, ...] = (
    Route("conv2d", F, "conv2d", _conv2d_refuse, _conv2d_call, _conv2d_describe),
    Route("linear", F, "linear", _linear_refuse, _linear_call, _linear_describe),
    Route("addmm", torch, "addmm", _addmm_refuse, _addmm_call, _addmm_describe),
    Route("matmul", torch, "matmul", _matmul_refuse, _matmul_call, _matmul_describe),
    Route("matmul", torch.Tensor, "matmul", _matmul_refuse, _matmul_call, _matmul_describe),
    Route("matmul", torch.Tensor, "__matmul__", _matmul_refuse, _matmul_call, _matmul_describe),
    Route("mm", torch, "mm", _mm_refuse, _matmul_call, _matmul_describe),
    Route("mm", torch.Tensor, "mm", _mm_refuse, _matmul_call, _matmul_describe),
    Route("bmm", torch, "bmm", _bmm_refuse, _matmul_call, _matmul_describe),
    Route("bmm", torch.Tensor, "bmm", _bmm_refuse, _matmul_call, _matmul_describe),
    Route("softmax", F, "softmax", _softmax_refuse, _softmax_call, _softmax_describe),
    Route("softmax", torch, "softmax", _torch_softmax_refuse, _softmax_call,
          _torch_softmax_describe),
    Route("softmax", torch.Tensor, "softmax", _tensor_softmax_refuse, _tensor_softmax_call,
          _tensor_softmax_describe),
    Route("sdpa", F, "scaled_dot_product_attention", _sdpa_refuse, _sdpa_call, _sdpa_describe),
)  # fmt: skip
OPS = tuple(dict.fromkeys(route.op for route in ROUTES))


# ---------------------------------------------------------------------------------------------
# The switch: patches installed and removed under one lock, counts and records beside them
# ---------------------------------------------------------------------------------------------
_MISSING = object()
_LOCK = threading.RLock()
_COUNTS: defaultdict[str, Counter] = defaultdict(Counter)
_STATE: dict = {"stack": [], "record": None}  # stack: the installed settings, innermost last


@dataclasses.dataclass(frozen=True)
class _Setting:
    custom_ops: bool
    ops: frozenset
    originals: tuple  # (route, the attribute's value in owner.__dict__ before, or _MISSING)


def _namespace(custom_ops: bool):
    """The functions a route calls: the public kernels, or their custom ops (kernels/ops.py);
    from the op packages, not the kernels package that imports this module."""
    if custom_ops:
        from kernels import ops

        return ops
    from kernels.attention import sdpa
    from kernels.conv import conv2d
    from kernels.linear import linear
    from kernels.matmul import matmul
    from kernels.softmax import softmax

    return SimpleNamespace(conv2d=conv2d, linear=linear, matmul=matmul, softmax=softmax, sdpa=sdpa)


# Set while a routed call runs in this thread: a patched function called from inside it is
# torch's own doing (a Python decomposition, as the meta device runs F.linear through torch.mm),
# not the model's, so it goes to torch uncounted and unrecorded.
_INSIDE = threading.local()


def _routed(route: Route, original: Callable, ns) -> Callable:
    refuse, call, counts = route.refuse, route.call, _COUNTS[route.op]

    def routed(*args, **kwargs):
        if torch.compiler.is_compiling():  # a trace is not a call: count calls only
            reason = refuse(*args, **kwargs)
            return call(ns, *args, **kwargs) if reason is None else original(*args, **kwargs)
        if getattr(_INSIDE, "active", False):
            return original(*args, **kwargs)
        reason = refuse(*args, **kwargs)
        counts[reason or OURS] += 1
        record = _STATE["record"]
        if record is not None:
            record.append({"op": route.op, "dtype": _dtype_of(*args),
                           **route.describe(*args, **kwargs), "routed": reason is None,
                           "reason": reason, "grad": torch.is_grad_enabled()})  # fmt: skip
        _INSIDE.active = True
        try:
            if reason is None:
                return call(ns, *args, **kwargs)
            return original(*args, **kwargs)
        finally:
            _INSIDE.active = False

    routed.__name__ = routed.__qualname__ = f"routed_{route.attribute}"
    routed.__wrapped__ = original
    return routed


def _install(custom_ops: bool, ops: frozenset) -> _Setting:
    ns = _namespace(custom_ops)
    originals = []
    for route in ROUTES:
        before = route.owner.__dict__.get(route.attribute, _MISSING)
        originals.append((route, before))
        if route.op not in ops:
            continue
        torch_fn = getattr(route.owner, route.attribute)
        torch_fn = getattr(torch_fn, "__wrapped__", torch_fn)  # an outer setting's original
        setattr(route.owner, route.attribute, _routed(route, torch_fn, ns))
    return _Setting(custom_ops, ops, tuple(originals))


def _uninstall(setting: _Setting) -> None:
    for route, before in reversed(setting.originals):
        if before is _MISSING:
            if route.attribute in route.owner.__dict__:
                delattr(route.owner, route.attribute)  # a Tensor method back to TensorBase's
        else:
            setattr(route.owner, route.attribute, before)


def _ops(ops: Iterable[str] | None, exclude: Iterable[str]) -> frozenset:
    chosen = set(OPS if ops is None else ops)
    unknown = (chosen | set(exclude)) - set(OPS)
    if unknown:
        raise ValueError(f"unknown ops {sorted(unknown)}; routable ops are {list(OPS)}")
    return frozenset(chosen - set(exclude))


def enable(*, custom_ops: bool = False, ops: Iterable[str] | None = None,
           exclude: Iterable[str] = (), record: list | None = None) -> None:  # fmt: skip
    """Route conv2d, linear, addmm, matmul/mm/bmm, softmax and scaled_dot_product_attention calls
    to our kernels, in every module, until disable().

    custom_ops: route to the torch.library custom ops (kernels/ops.py) instead of the direct
        kernels, so a torch.compile of the model traces through them (mode=triton-compiled).
    ops, exclude: the ops to route (default: all of OPS), and ops to leave to torch.
    record: a list that gets one dict per call (op, shapes, dtype, layout, arguments).
    A second enable() replaces the first's settings; disable() removes them all.
    """
    chosen = _ops(ops, exclude)
    with _LOCK:
        _pop_all()
        _STATE["stack"].append(_install(custom_ops, chosen))
        _STATE["record"] = record


def disable() -> None:
    """Give every routed function back to torch (a no-op when nothing is routed)."""
    with _LOCK:
        _pop_all()
        _STATE["record"] = None


def _pop_all() -> None:
    while _STATE["stack"]:
        _uninstall(_STATE["stack"].pop())


@contextlib.contextmanager
def enabled(*, custom_ops: bool = False, ops: Iterable[str] | None = None,
            exclude: Iterable[str] = (), record: list | None = None):  # fmt: skip
    """enable() for the block's duration; on exit the routing before it is back."""
    chosen = _ops(ops, exclude)
    with _LOCK:
        record_before = _STATE["record"]
        setting = _install(custom_ops, chosen)
        _STATE["stack"].append(setting)
        _STATE["record"] = record if record is not None else record_before
    try:
        yield
    finally:
        with _LOCK:
            if setting in _STATE["stack"]:  # a disable() inside the block already removed it
                while _STATE["stack"][-1] is not setting:
                    _uninstall(_STATE["stack"].pop())
                _uninstall(_STATE["stack"].pop())
            _STATE["record"] = record_before


def is_enabled() -> bool:
    return bool(_STATE["stack"])


def counts() -> dict[str, dict[str, int]]:
    """Calls per op since the last reset_counts(): {op: {"ours": n, reason: m, ...}}."""
    return {op: dict(c) for op, c in _COUNTS.items() if c}


def reset_counts() -> None:
    for c in _COUNTS.values():
        c.clear()


def fallback_share(per_op: dict[str, dict[str, int]]) -> float:
    """The share of the counted calls that fell back to torch."""
    total = sum(sum(c.values()) for c in per_op.values())
    taken = sum(c.get(OURS, 0) for c in per_op.values())
    return 0.0 if total == 0 else 1.0 - taken / total
