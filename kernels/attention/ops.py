"""Attention as torch.library custom ops (namespace kbench), for the triton-compiled mode.

    kbench::attention_fwd(q, k, v, causal, scale) -> (o, lse)
    kbench::attention_bwd(do, q, k, v, o, lse, causal, scale, need_dq, need_dkdv)
        -> (dq, dk, dv)        (an empty tensor for a gradient not asked for)

attention_fwd's autograd calls attention_bwd, so a compiled fwd_bwd is one graph too. The ops
run kernels/attention/dispatch.py's own functions with the launcher kernels/ops.py gives them
(torch.library.wrap_triton on a GPU, so Inductor sees each launch; direct in the interpreter,
where the ops are opaque custom_ops), always on the default variant: what a traced launch takes
is what the direct path takes by default.

kernels/ops.py owns the registration machinery (triton_op or custom_op, the fake kernels, the
launcher switch) and calls register() once, from its last lines; register() returns the public
wrappers it exports: attention(q, k, v, causal=False, scale=None) and sdpa (SDPA's signature).
"""

import torch
from torch import Tensor

from kernels.attention.dispatch import attention_backward, attention_forward, check_attention_args
from kernels.attention.sdpa import make_sdpa


def register(define, launch):
    """Define the two ops with kernels/ops.py's `define` (a decorator taking the op's name) and
    `launch` (its launcher); returns (attention, sdpa) over them."""

    @define("kbench::attention_fwd")
    def attention_fwd_op(q: Tensor, k: Tensor, v: Tensor, causal: bool,
                         scale: float) -> tuple[Tensor, Tensor]:  # fmt: skip
        return attention_forward(q, k, v, causal, scale, launch=launch)

    @define("kbench::attention_bwd")
    def attention_bwd_op(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor,
                         causal: bool, scale: float, need_dq: bool,
                         need_dkdv: bool) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        dq, dk, dv = attention_backward(do, q, k, v, o, lse, causal, scale, need_dq=need_dq,
                                        need_dkdv=need_dkdv, launch=launch)  # fmt: skip
        empty = do.new_empty(0)  # custom ops cannot return None
        return (empty if dq is None else dq, empty if dk is None else dk,
                empty if dv is None else dv)  # fmt: skip

    def setup_context(ctx, inputs, output):
        q, k, v, causal, scale = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.causal, ctx.scale = causal, scale

    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        dq, dk, dv = torch.ops.kbench.attention_bwd(do, q, k, v, o, lse, ctx.causal, ctx.scale,
                                                    need_q, need_k or need_v)  # fmt: skip
        return (dq if need_q else None, dk if need_k else None, dv if need_v else None, None,
                None)  # fmt: skip

    torch.library.register_autograd("kbench::attention_fwd", backward,
                                    setup_context=setup_context)  # fmt: skip

    def attention(q, k, v, causal=False, scale=None):
        """kernels.attention through the custom op (no variant: the traced launch's)."""
        scale = check_attention_args(q, k, v, causal, scale)  # clear errors before the schema's
        return torch.ops.kbench.attention_fwd(q, k, v, causal, scale)[0]

    return attention, make_sdpa(attention)
