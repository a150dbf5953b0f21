"""The coop protocol's pieces shared by the Triton split kernels (split.py) and the Gluon smem
kernels (smem.py): a chunk's partial packed into one 64-bit word, published with one atomic
exchange; the back-off between polls of the partials; and the zeroed workspaces the partials
are published in. Gluon kernels call these @triton.jit helpers as they are.

Functions:
    _pack, _unpack     two fp32 tensors <-> one int64 each (a partial: one atomic to publish)
    _nanosleep         PTX nanosleep between polls
    coop_workspace     [buffer 0, buffer 1, index of the zeroed one] for a launch (host)
    Alternate          a launch just made on one of the pair, as a plan's piece (host)
"""

from typing import NamedTuple

import torch
import triton
import triton.language as tl

# the back-off between polls of a row's partials, in ns
SLEEP_NS = 200


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


# Workspaces, two a (device, stream, size), taken in turn: each launch zeroes the other one for
# the next launch (the kernels' CLEAR), which saves a memset kernel a call.
_COOP_WORKSPACES: dict[tuple, list] = {}
# Sizes kept at once; the oldest is dropped past it (its memory goes back to torch's caching
# allocator, which reuses it in stream order, so a launch still reading it is safe).
COOP_WORKSPACE_SIZES = 64


def coop_workspace(n_ws: int, device: torch.device) -> list | None:
    """[buffer 0, buffer 1, index of the zeroed one] for a coop launch of n_ws words; the caller
    flips the index once the launch is made. None where a launch must zero its own: under CUDA
    graph capture (each replay would find the buffer the capture used, not zeroed again).

    Stream order keeps the two apart: launch k zeroes the buffer that launch k - 1 used and
    that launch k + 1 will use. Two host threads launching on one stream at once could take
    the same buffer; the kernels' callers do not do that.
    """
    if device.type == "cuda":
        if torch._C._cuda_isCurrentStreamCapturing():
            return None
        index = device.index if device.index is not None else torch._C._cuda_getDevice()
        key = (index, torch._C._cuda_getCurrentRawStream(index), n_ws)
    else:  # experiments.resources compiles the GPU's launches from CPU tensors: same kernels
        key = (str(device), 0, n_ws)
    pair = _COOP_WORKSPACES.get(key)
    if pair is None:
        while len(_COOP_WORKSPACES) >= COOP_WORKSPACE_SIZES:
            del _COOP_WORKSPACES[next(iter(_COOP_WORKSPACES))]
        zeros = [torch.zeros(n_ws, device=device, dtype=torch.int64) for _ in range(2)]
        pair = _COOP_WORKSPACES[key] = [*zeros, 0]
    return pair


class Alternate(NamedTuple):
    """A direct coop or smem launch just made on workspace `parity` of `pair` (coop_workspace),
    as a kernels._launch.Step: its lead is (*tensors, ws) with next_ws fixed in the step (coop:
    a keyword), or (*tensors, ws, next_ws) where with_next (smem)."""

    pair: list
    parity: int
    step: object
    with_next: bool


class AlternatingPlan:
    """The plan of a coop or smem launch: the Step launched with each buffer of a workspace pair,
    taken in turn as the kernels zero the other one. It keeps the pair alive (a pair the cache
    dropped stays this plan's own), launches only on the stream the pair belongs to and never
    under CUDA-graph capture (a replay would find a used buffer); a call it cannot launch
    returns False, and the caller takes the unplanned path."""

    __slots__ = ("pair", "steps", "with_next", "device", "stream")

    def __init__(self, made: Alternate, device: int):
        self.pair, self.with_next, self.device = made.pair, made.with_next, device
        self.stream = torch._C._cuda_getCurrentRawStream(device)
        self.steps = [None, None]
        self.steps[made.parity] = made.step

    def __call__(self, *tensors):
        pair = self.pair
        parity = pair[2]
        step = self.steps[parity]
        if (step is None or torch._C._cuda_isCurrentStreamCapturing()
                or torch._C._cuda_getCurrentRawStream(self.device) != self.stream):  # fmt: skip
            return False
        if self.with_next:
            step(*tensors, pair[parity], pair[1 - parity])
        else:
            step(*tensors, pair[parity])
        pair[2] = parity ^ 1
        return True
