"""torch.matmul's broadcast batch dims as one batch index: the (batch, M, K) and (batch, K, N)
views the batched kernels read, each with one batch stride (0 where that operand is broadcast).

torch.matmul broadcasts the batch dims (all but the last two) of a (..., M, K) and b (..., K, N)
against each other (torch.broadcast_shapes); a 1-D a is one row, dropped from the result. Each
operand is expanded to the broadcast batch shape (stride 0 on broadcast dims) and its batch dims
are merged into one where one stride walks them all, by torch's view rule (size-1 dims aside,
each dim's stride is the next one's size times its stride; all-stride-0 merges to stride 0).
An operand whose dims do not merge (say (B, 1, M, K) against (1, H, K, N): stride 0 between two
strided dims) is materialized by .contiguous() on its expanded view: a copy of that operand
alone, with its broadcast repeated. The kernels then need one batch stride per operand, not one
per batch dim.

Functions:
    check_batched_args(a, b)
        The TypeError/ValueError checks of a batched call: dtypes, devices, inner dims, and batch
        dims that broadcast (one ValueError naming both shapes).
    merged_stride(sizes, strides) -> int | None
        The one stride that walks dims of these sizes and strides in row-major order, or None.
    batched_views(a, b) -> BatchedViews(a, b, shape, copied)
        The (batch, M, K) and (batch, K, N) views and torch.matmul's result shape.
"""

import math
from typing import NamedTuple

import torch

from kernels._common import check_same, check_tensor


class BatchedViews(NamedTuple):
    a: torch.Tensor  # (batch, M, K), batch stride 0 where a is broadcast
    b: torch.Tensor  # (batch, K, N), likewise
    shape: tuple  # torch.matmul's result: (*batch dims, M, N), without M for a 1-D a
    copied: bool  # an operand's batch dims did not merge: it is a new contiguous tensor


def check_batched_args(a, b) -> None:
    check_tensor("a", a, min_ndim=1)
    check_tensor("b", b, min_ndim=2)
    check_same({"a": a, "b": b})
    shapes = f"a has shape {tuple(a.shape)} and b has shape {tuple(b.shape)}"
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"inner dims differ: {shapes}; need a (..., M, K) and b (..., K, N)")
    try:
        torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except RuntimeError:
        raise ValueError(f"batch dims do not broadcast: {shapes}; the dims before the last two "
                         "must be equal or 1 where both have them") from None  # fmt: skip


def merged_stride(sizes, strides) -> int | None:
    """The stride of dims `sizes` (with `strides`) merged into one, as torch's view merges
    them: size-1 dims carry no step; each other dim's stride must be the next one's size times
    its stride. None where they do not merge; 0 where every dim is broadcast (or of size 1)."""
    kept = [(size, stride) for size, stride in zip(sizes, strides, strict=True) if size != 1]
    if not kept:
        return 0
    for (_, outer), (size, inner) in zip(kept[:-1], kept[1:], strict=True):
        if outer != size * inner:
            return None
    return kept[-1][1]


def _batch_view(t: torch.Tensor, batch: tuple, count: int) -> tuple[torch.Tensor, bool]:
    """t expanded to the batch shape as (count, rows, cols): a view where its batch dims merge,
    else a contiguous copy; and whether it copied."""
    rows, cols = t.shape[-2:]
    expanded = t.expand(*batch, rows, cols)
    stride = merged_stride(expanded.shape[:-2], expanded.stride()[:-2])
    if stride is None:
        return expanded.contiguous().view(count, rows, cols), True
    return expanded.as_strided((count, rows, cols), (stride, *expanded.stride()[-2:])), False


def batched_views(a: torch.Tensor, b: torch.Tensor) -> BatchedViews:
    """The batched kernels' operands for torch.matmul(a, b), b of at least 3 dims and a of at
    least 1 (check_batched_args passed)."""
    a_vector = a.dim() == 1
    if a_vector:
        a = a.unsqueeze(0)
    batch = tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    count = math.prod(batch)
    a3, a_copied = _batch_view(a, batch, count)
    b3, b_copied = _batch_view(b, batch, count)
    M, N = a.shape[-2], b.shape[-1]
    shape = (*batch, N) if a_vector else (*batch, M, N)
    return BatchedViews(a3, b3, shape, a_copied or b_copied)
