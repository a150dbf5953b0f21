"""Attention's checks, variant choice, launch plans, autograd Function and the public wrapper.

Inputs are laid out as torch.nn.functional.scaled_dot_product_attention takes them, (batch,
heads, seq, head_dim), with any strides: a transposed view of a (batch, seq, heads, head_dim)
projection, or q, k and v sliced out of one fused QKV projection, is read in place. Outputs
(O, and dQ, dK, dV in the backward) take the dim order of the input they belong to, as SDPA's
cuDNN backend allocates its output: (batch, seq, heads, head_dim) in memory for an input whose
heads dim lies inside its seq dim (the usual projected view, so O.transpose(1, 2).reshape(B, S,
H·D) stays a view), else contiguous (batch, heads, seq, head_dim).

Variants (the forward; the backward has one design): "plain" (pointer loads) and "tma"
(device-side TMA descriptors, sm_90+). A call without variant= takes "tma" from TMA_MIN_SEQ
keys on, in 16 bits, where TMA can read the tensors, else "plain" (the crossover measured on an
H100: docs/kernels/attention.md, "Measured"). A variant asked for by name where it cannot run
raises; the default never does. The interpreter runs both (its descriptors are emulated), so
the CPU tests cover their arithmetic.

Functions:
    check_attention_args(q, k, v, causal, scale) -> scale
        The TypeError / ValueError / NotImplementedError checks; the scale resolved.
    tma_unusable(q, k, v) -> str | None
        Why the TMA variants cannot read these tensors (or None).
    attention_forward(q, k, v, causal, scale, *, variant=None, launch=direct) -> (o, lse)
    attention_backward(do, q, k, v, o, lse, causal, scale, *, need_dq=True, need_dkdv=True,
                       launch=direct) -> (dq | None, dk | None, dv | None)
        Unchecked-scale pieces (scale a float) that kernels/attention/ops.py composes into the
        custom ops; the forward checks its inputs, the backward its dO.
    attention(q, k, v, causal=False, scale=None, *, variant=None) -> o
        Public, autograd-aware.

`launch` is kernels._common.direct or the traced launcher of kernels/ops.py; direct calls keep
a plan per call key (shapes, strides, dtypes, devices, pointer alignment, flags), so a repeated
call runs no checks and launches through the plan's armed Steps (docs/kernels/host_path.md).
"""

import math

import torch

from kernels._common import (
    Launcher,
    cdiv,
    check_same,
    check_tensor,
    direct,
    dot_precision,
    gpu_info,
    is_interpreter,
    next_power_of_2,
)
from kernels._launch import PlanCache, Step
from kernels.attention.backward import (
    DELTA_BLOCK_M,
    attention_bwd_delta_kernel,
    attention_bwd_dkdv_kernel,
    attention_bwd_dq_kernel,
)
from kernels.attention.forward import LOG2E, attention_fwd_kernel, attention_fwd_tma_kernel
from kernels.matmul.tma import set_scratch_allocator

VARIANTS = ("plain", "tma")
# From this many keys on, a call without variant= takes "tma": on an H100 (bf16, causal GQA,
# head dim 128) it ran 0.87x and 0.95x the pointer kernel at 1024 and 2048 keys, 1.07x and 1.08x
# at 4096 and 8192 (docs/kernels/attention.md, "Measured").
TMA_MIN_SEQ = 4096
MIN_HEAD_DIM, MAX_HEAD_DIM, HEAD_DIM_STEP = 16, 128, 8
TMA_MIN_CAPABILITY = 9  # Hopper: the first with TMA
# Read once at import: torch.compile traces the checks, and Dynamo warns at a cached function
_INTERPRETED = is_interpreter()


# ---------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------
def resolve_scale(scale, head_dim: int) -> float:
    """SDPA's scale=: None is 1/sqrt(head_dim); else a finite real number."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return float(scale)


def head_dim_unsupported(head_dim: int) -> str | None:
    if head_dim % HEAD_DIM_STEP or not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        return (f"head_dim {head_dim} is not supported: the kernels take multiples of "
                f"{HEAD_DIM_STEP} from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}")  # fmt: skip
    return None


def device_unsupported(device: torch.device) -> str | None:
    if device.type == "cuda" or (_INTERPRETED and device.type == "cpu") or (
            gpu_info(device) is not None):  # fmt: skip
        return None
    return (f"tensors on {device}: the Triton kernels run on CUDA tensors (CPU ones under "
            "TRITON_INTERPRET=1)")  # fmt: skip


def check_attention_args(q, k, v, causal, scale) -> float:
    """The checks attention_forward runs before anything is launched; returns the scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, t, ndim=4)
    check_same({"q": q, "k": k, "v": v})
    reason = device_unsupported(q.device)
    if reason:
        raise ValueError(reason)
    batch, heads_q, _, head_dim = q.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError(f"q, k and v must share the batch size: q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")  # fmt: skip
    if k.shape[1:3] != v.shape[1:3]:
        raise ValueError(f"k and v must have the same heads and seq_len: k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")  # fmt: skip
    if k.shape[3] != head_dim:
        raise ValueError(f"k has head_dim {k.shape[3]} but q has {head_dim}")
    if v.shape[3] != head_dim:
        raise NotImplementedError(f"v's head_dim {v.shape[3]} differs from q's {head_dim}: "
                                  "the kernels take one head_dim")  # fmt: skip
    heads_kv = k.shape[1]
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q's {heads_q} heads are not a multiple of k's and v's {heads_kv} "
                         "(grouped-query attention needs whole groups)")  # fmt: skip
    reason = head_dim_unsupported(head_dim)
    if reason:
        raise NotImplementedError(reason)
    if k.shape[2] == 0 and q.shape[2] > 0:
        raise NotImplementedError("k and v have seq_len 0: no key for any query to attend to")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return resolve_scale(scale, head_dim)


def tma_unusable(q, k, v) -> str | None:
    """Why the TMA variants cannot read q, k and v as stored (None when they can): a GPU before
    Hopper, a head dim that is not a power of 2, or a layout TMA cannot describe (the head dim
    strided, a stride or start not 16-byte aligned). The interpreter emulates TMA."""
    info = gpu_info(q.device)
    if not _INTERPRETED and (info is None or info.capability[0] < TMA_MIN_CAPABILITY):
        return "TMA needs a GPU of compute capability 9.0 or later"
    head_dim = q.shape[-1]
    if head_dim & (head_dim - 1):
        return f"TMA blocks need a power-of-2 head_dim, not {head_dim}"
    size = q.element_size()
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(3) != 1:
            return f"{name}'s head dim is strided ({t.stride(3)}): TMA reads contiguous rows"
        # the seq stride is the descriptor's own; batch and head strides move its base
        strides = [t.stride(2)] + [t.stride(d) for d in (0, 1) if t.shape[d] > 1]
        if any(s * size % 16 for s in strides) or t.stride(2) < head_dim:
            return f"{name}'s strides {t.stride()} are not 16-byte aligned rows"
        if t.storage_offset() * size % 16:
            return f"{name} starts {t.storage_offset()} elements into its storage: not aligned"
    return None


def resolve_variant(variant, q, k, v) -> str:
    if variant is None:
        long = k.shape[2] >= TMA_MIN_SEQ and q.element_size() == 2  # measured in 16 bits only
        variant = "tma" if long and not _INTERPRETED else "plain"
        named = False
    else:
        named = True
        if variant not in VARIANTS:
            raise ValueError(f"unknown attention variant {variant!r}; choose one of {VARIANTS}")
    if variant == "plain":
        return variant
    reason = tma_unusable(q, k, v)
    if reason is None:
        return variant
    if named:
        raise NotImplementedError(f"attention variant {variant!r}: {reason}")
    return "plain"


# ---------------------------------------------------------------------------------------------
# Layouts and launches
# ---------------------------------------------------------------------------------------------
def output_strides(like: torch.Tensor) -> tuple[int, ...]:
    """Contiguous strides for like's shape in like's dim order: (batch, seq, heads, head_dim) in
    memory where like's heads dim lies inside its seq dim, else (batch, heads, seq, head_dim)."""
    batch, heads, seq, dim = like.shape
    if like.stride(1) < like.stride(2) and heads > 1 and seq > 1:
        return (seq * heads * dim, dim, heads * dim, 1)
    return (heads * seq * dim, seq * dim, dim, 1)


def _tune_size(n: int) -> int:
    return max(16, next_power_of_2(n))


def _common_meta(q: torch.Tensor, causal: bool) -> dict:
    head_dim = q.shape[-1]
    return dict(
        HEAD_DIM=head_dim,
        CAUSAL=causal,
        # the interpreter's dot is wrong on bf16 and coarse on fp16 operands (forward.fp32_dot)
        UPCAST=_INTERPRETED and q.element_size() == 2,
        PRECISION=dot_precision(q.dtype, torch.backends.cuda.matmul.allow_tf32),
    )


def _block_d(head_dim: int) -> int:
    return max(16, next_power_of_2(head_dim))


class _Grid:
    """A 1-D grid of `programs` per block of `rows` rows: the block size comes from the tuned
    config (BLOCK_M or BLOCK_N). Holds sizes only, so a plan keeps no call's tensors alive."""

    __slots__ = ("rows", "programs", "block")

    def __init__(self, rows: int, programs: int, block: str):
        self.rows, self.programs, self.block = rows, programs, block

    def __call__(self, meta):
        return (cdiv(self.rows, meta[self.block]) * self.programs,)


def _sizes(q, k) -> tuple:
    heads_q, seq_q, seq_k = q.shape[1], q.shape[2], k.shape[2]
    return (heads_q, heads_q // k.shape[1], seq_q, seq_k, _tune_size(seq_q), _tune_size(seq_k))


def forward_step(q, k, v, o_strides, causal: bool, scale: float, variant: str,
                 launch: Launcher = direct) -> Step:  # fmt: skip
    """The forward's launch over the tensors (q, k, v, o, lse), O of strides o_strides."""
    grid = _Grid(q.shape[2], q.shape[0] * q.shape[1], "BLOCK_M")
    meta = _common_meta(q, causal)
    if variant == "plain":
        args = (*_sizes(q, k), *q.stride(), *k.stride(), *v.stride(), *o_strides[:3],
                scale * LOG2E)  # fmt: skip
        return Step(launch(attention_fwd_kernel), grid, args,
                    dict(meta, BLOCK_D=_block_d(q.shape[-1])))  # fmt: skip
    args = (*_sizes(q, k), *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o_strides[:3],
            scale * LOG2E)  # fmt: skip
    return Step(launch(attention_fwd_tma_kernel), grid, args, meta)


def backward_steps(do, q, k, v, o, layouts, causal: bool, scale: float, need_dq: bool,
                   need_dkdv: bool, launch: Launcher = direct) -> tuple:  # fmt: skip
    """(Δ, dK/dV, dQ) launches over (o, do, delta), (q, k, v, do, lse, delta, dk, dv) and
    (q, k, v, do, lse, delta, dq), the gradients of strides layouts = (dq's, dk's, dv's); None
    for a pass not asked for."""
    batch, heads_q, seq_q, head_dim = q.shape
    dq_strides, dk_strides, dv_strides = layouts
    block_d = _block_d(head_dim)
    delta = Step(launch(attention_bwd_delta_kernel),
                 (cdiv(seq_q, DELTA_BLOCK_M) * batch * heads_q,),
                 (heads_q, seq_q, *o.stride()[:3], *do.stride()),
                 dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=DELTA_BLOCK_M))  # fmt: skip
    meta = dict(_common_meta(q, causal), BLOCK_D=block_d)
    inputs = (*_sizes(q, k), *q.stride(), *k.stride(), *v.stride(), *do.stride())
    dkdv = dq = None
    if need_dkdv:
        grid = _Grid(k.shape[2], batch * k.shape[1], "BLOCK_N")
        dkdv = Step(launch(attention_bwd_dkdv_kernel), grid,
                    (*inputs, *dk_strides[:3], *dv_strides[:3], scale, scale * LOG2E),
                    meta)  # fmt: skip
    if need_dq:
        grid = _Grid(seq_q, batch * heads_q, "BLOCK_M")
        dq = Step(launch(attention_bwd_dq_kernel), grid,
                  (*inputs, *dq_strides[:3], scale, scale * LOG2E), meta)  # fmt: skip
    return delta, dkdv, dq


# ---------------------------------------------------------------------------------------------
# Forward and backward
# ---------------------------------------------------------------------------------------------
# Direct calls' plans: (forward Step or None for an empty call, O's strides) by _forward_key;
# (the three Steps or None, each gradient's strides) by _backward_key.
_FORWARD = PlanCache()
_BACKWARD = PlanCache()


def _tensor_key(t) -> tuple:
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16)


def _forward_key(q, k, v, causal, scale, variant) -> tuple | None:
    if torch.compiler.is_compiling():
        return None
    try:
        return (_tensor_key(q), _tensor_key(k), _tensor_key(v), causal, scale, variant,
                torch.backends.cuda.matmul.allow_tf32)  # fmt: skip
    except AttributeError:
        return None  # not tensors: the checks say so


def _new_lse(q: torch.Tensor) -> torch.Tensor:
    return q.new_empty(q.shape[:3], dtype=torch.float32)


def attention_forward(q, k, v, causal: bool = False, scale: float | None = None, *,
                      variant: str | None = None,
                      launch: Launcher = direct) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(O, lse): O = softmax(q k^T · scale, causal) v in q's dtype, lse the fp32 log2-sum-exp of
    each query row (B, Hq, Sq) that attention_backward reads. No autograd."""
    key = _forward_key(q, k, v, causal, scale, variant) if launch is direct else None
    plan = _FORWARD.get(key) if key is not None else None
    if plan is None:
        scale = check_attention_args(q, k, v, causal, scale)
        chosen = resolve_variant(variant, q, k, v)
        strides = output_strides(q)
        step = forward_step(q, k, v, strides, causal, scale, chosen, launch) if q.numel() else None
        plan = (step, strides, chosen != "plain")
        if key is not None:
            _FORWARD.put(key, plan)
    step, strides, descriptors = plan
    o = q.new_empty_strided(q.shape, strides)
    lse = _new_lse(q)
    if step is not None:
        if descriptors:
            set_scratch_allocator()  # device-side descriptors live in a global scratch buffer
        step(q, k, v, o, lse)
    return o, lse


def _backward_key(do, q, k, v, o, causal, scale, need_dq, need_dkdv) -> tuple | None:
    if torch.compiler.is_compiling():
        return None
    try:
        return (_tensor_key(do), _tensor_key(q), _tensor_key(k), _tensor_key(v), _tensor_key(o),
                causal, scale, need_dq, need_dkdv,
                torch.backends.cuda.matmul.allow_tf32)  # fmt: skip
    except AttributeError:
        return None


def check_grad_output(do, o) -> None:
    check_tensor("grad_output", do, ndim=4)
    check_same({"o": o, "grad_output": do})
    if do.shape != o.shape:
        raise ValueError(f"grad_output has shape {tuple(do.shape)} but the output has "
                         f"{tuple(o.shape)}")  # fmt: skip


def _plan_backward(do, q, k, v, o, causal, scale, need_dq, need_dkdv, launch):
    check_grad_output(do, o)
    layouts = (output_strides(q), output_strides(k), output_strides(v))
    if not (q.numel() and k.numel()):
        return None, layouts  # nothing to launch (attention_backward fills what it must)
    steps = backward_steps(do, q, k, v, o, layouts, causal, scale, need_dq, need_dkdv, launch)
    return steps, layouts


def attention_backward(do, q, k, v, o, lse, causal: bool, scale: float, *, need_dq: bool = True,
                       need_dkdv: bool = True, launch: Launcher = direct):  # fmt: skip
    """(dQ, dK, dV) of attention_forward's (o, lse) for the output gradient do; a gradient not
    asked for is None. scale is the float the forward used."""
    key = None
    if launch is direct:
        key = _backward_key(do, q, k, v, o, causal, scale, need_dq, need_dkdv)
    plan = _BACKWARD.get(key) if key is not None else None
    if plan is None:
        plan = _plan_backward(do, q, k, v, o, causal, scale, need_dq, need_dkdv, launch)
        if key is not None:
            _BACKWARD.put(key, plan)
    steps, (dq_strides, dk_strides, dv_strides) = plan
    dq = q.new_empty_strided(q.shape, dq_strides) if need_dq else None
    dk = k.new_empty_strided(k.shape, dk_strides) if need_dkdv else None
    dv = v.new_empty_strided(v.shape, dv_strides) if need_dkdv else None
    if steps is None:  # no query rows or no keys: dK and dV of keys nobody read are zeros
        for grad in (dk, dv):
            if grad is not None:
                grad.zero_()
        return dq, dk, dv
    delta_step, dkdv_step, dq_step = steps
    delta = _new_lse(q)
    delta_step(o, do, delta)
    if dkdv_step is not None:
        dkdv_step(q, k, v, do, lse, delta, dk, dv)
    if dq_step is not None:
        dq_step(q, k, v, do, lse, delta, dq)
    return dq, dk, dv


# ---------------------------------------------------------------------------------------------
# The public function
# ---------------------------------------------------------------------------------------------
class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, variant):
        o, lse = attention_forward(q, k, v, causal, scale, variant=variant)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale = causal, resolve_scale(scale, q.shape[-1])
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq, dk, dv = attention_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale,
                                        need_dq=need_q, need_dkdv=need_k or need_v)  # fmt: skip
        return dq, dk if need_k else None, dv if need_v else None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              scale: float | None = None, *,
              variant: str | None = None) -> torch.Tensor:  # fmt: skip
    """softmax(q k^T · scale) v, FlashAttention-2 style, differentiable once.

    q (batch, heads_q, seq_q, head_dim), k and v (batch, heads_kv, seq_k, head_dim) with
    heads_q a multiple of heads_kv (grouped-query attention: query head h reads kv head
    h // (heads_q // heads_kv)); any strides; fp16, bf16 or fp32 (fp32 dots follow torch's
    TF32 switch, torch.backends.cuda.matmul.allow_tf32). head_dim a multiple of 8 from 16 to
    128. causal: SDPA's is_causal (top-left aligned: query i sees keys j <= i, whatever seq_q
    and seq_k). scale: None for 1/sqrt(head_dim). variant: "plain" or "tma" (module
    docstring), None for the measured choice. The output's dim order follows q's (module docstring).
    """
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v)):
        return _Attention.apply(q, k, v, causal, scale, variant)
    return attention_forward(q, k, v, causal, scale, variant=variant)[0]
