"""Pieces of the coop protocol shared by the Triton (kernels/softmax.py) and Gluon
(kernels/softmax_smem.py) softmax kernels: a chunk's partial packed into the one 64-bit word
that is published with one atomic exchange, and the back-off between polls of the partials.
Gluon kernels call these @triton.jit helpers as they are."""

import triton
import triton.language as tl


@triton.jit
def _pack(lo, hi):
    """Two fp32 tensors -> one int64 each, so a partial is published with one atomic."""
    lo_bits = lo.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    hi_bits = hi.to(tl.int32, bitcast=True).to(tl.int64)
    return (hi_bits << 32) | lo_bits


@triton.jit
def _unpack(packed):
    lo = (packed & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    hi = (packed >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    return lo, hi


@triton.jit
def _nanosleep(value, SLEEP_NS: tl.constexpr):
    """Sleep about SLEEP_NS ns (PTX nanosleep, sm_70+; 0: no sleep), then return value."""
    if SLEEP_NS > 0:
        value = tl.inline_asm_elementwise(
            "nanosleep.u32 $2; mov.b32 $0, $1;",
            "=r,r,r",
            [value, value * 0 + SLEEP_NS],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    return value
