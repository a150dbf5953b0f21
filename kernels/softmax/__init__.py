"""Softmax over any dim, forward and backward: one file per design (tile, online, split, smem;
coop holds the protocol pieces split and smem share) and dispatch (the pick, the first call's
choice, the public wrappers). docs/kernels/softmax.md has the measurements behind the pick."""

from kernels.softmax.dispatch import (
    Config,
    softmax,
    softmax_backward,
    softmax_forward,
    softmax_reference,
)

__all__ = ["Config", "softmax", "softmax_backward", "softmax_forward", "softmax_reference"]
