"""Fused attention, FlashAttention-2 style, forward and backward: kernels.attention(q, k, v,
causal, scale) and an adapter with scaled_dot_product_attention's signature.

Modules:
    forward.py   the forward kernels (pointer loads; Hopper TMA, optionally warp-specialized),
                 the jit pieces the backward shares, the float reference
    backward.py  Δ = rowsum(dO ⊙ O), the dK/dV pass over key blocks, the dQ pass
    dispatch.py  checks, variant choice, launch plans, the autograd Function, `attention`
    sdpa.py      `sdpa` (SDPA's signature) and `unsupported_sdpa_call` (what a router asks)
    ops.py       the torch.library custom ops of the triton-compiled mode (registered by
                 kernels/ops.py)
Design and measurements: docs/kernels/attention.md.
"""

from kernels.attention.dispatch import (
    TMA_MIN_SEQ,
    VARIANTS,
    attention,
    attention_backward,
    attention_forward,
    check_attention_args,
    tma_unusable,
)
from kernels.attention.forward import attention_reference
from kernels.attention.sdpa import sdpa, unsupported_sdpa_call

# Once kernels/__init__.py imports it, `kernels.attention` is this function (the package's name
# is shadowed, as kernels.softmax's is), so the adapter and the router's question hang off it:
# kernels.attention.sdpa(...), kernels.attention.unsupported_sdpa_call(args, kwargs).
attention.sdpa = sdpa
attention.unsupported_sdpa_call = unsupported_sdpa_call

__all__ = [
    "TMA_MIN_SEQ",
    "VARIANTS",
    "attention",
    "attention_backward",
    "attention_forward",
    "attention_reference",
    "check_attention_args",
    "sdpa",
    "tma_unusable",
    "unsupported_sdpa_call",
]
