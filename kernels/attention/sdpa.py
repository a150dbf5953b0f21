"""torch.nn.functional.scaled_dot_product_attention's signature over kernels.attention, and the
question a router asks before it sends an SDPA call here.

    unsupported_sdpa_call(args, kwargs) -> str | None
        None when `scaled_dot_product_attention(*args, **kwargs)` is a call the kernels take as
        SDPA would compute it, else a short reason (a router falls back to torch and counts it).
        Never raises: a call torch itself would reject gets a reason too, and torch's error.
    make_sdpa(attention) -> sdpa
        An adapter with SDPA's exact signature, (query, key, value, attn_mask=None,
        dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False), that calls
        `attention(q, k, v, causal, scale)` and raises (NotImplementedError, or the checks'
        TypeError / ValueError) where unsupported_sdpa_call would give a reason.
    sdpa
        make_sdpa(kernels.attention): direct launches, autograd through its Function.

What SDPA takes and the kernels do not: attn_mask, dropout_p > 0, inputs that are not 4-D
(SDPA takes any batch dims, or none), batch dims SDPA would broadcast, a value head_dim unlike
the query's, head dims outside 16-128 in steps of 8, float64, nested tensors, an empty key
sequence. Grouped-query attention needs enable_gqa=True, as in SDPA (without it, SDPA rejects
unequal head counts).
"""

import torch

from kernels._common import SUPPORTED_DTYPES
from kernels.attention.dispatch import attention, device_unsupported, head_dim_unsupported

_POSITIONAL = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_DEFAULTS = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None,
             "enable_gqa": False}  # fmt: skip


def _bind(args, kwargs) -> dict | str:
    """SDPA's arguments by name, or why they do not bind to its signature."""
    if len(args) > len(_POSITIONAL):
        return "too many positional arguments"
    bound = dict(zip(_POSITIONAL, args, strict=False))
    for name, value in kwargs.items():
        if name not in _DEFAULTS and name not in _POSITIONAL:
            return f"unknown argument {name}"
        if name in bound:
            return f"{name} given twice"
        bound[name] = value
    for name in _POSITIONAL[:3]:
        if name not in bound:
            return f"missing {name}"
    return {**_DEFAULTS, **bound}


def _tensor_reason(q, k, v) -> str | None:
    tensors = (("query", q), ("key", k), ("value", v))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            return f"{name} is not a tensor"
        if t.is_nested:
            return "nested tensors"
        if t.dtype not in SUPPORTED_DTYPES:
            return f"dtype {str(t.dtype).removeprefix('torch.')}"
        if t.dim() != 4:
            return f"{t.dim()}-D inputs (the kernels take batch, heads, seq, head_dim)"
    if not q.dtype == k.dtype == v.dtype:
        return "mixed dtypes"
    if not q.device == k.device == v.device:
        return "mixed devices"
    return device_unsupported(q.device)


def _call_reason(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> str | None:
    """The reason the kernels do not take this SDPA call (unsupported_sdpa_call's answer)."""
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p != 0.0:
        return "dropout_p"
    if not isinstance(is_causal, bool):
        return "is_causal is not a bool"
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or scale != scale or abs(scale) == float("inf")):  # fmt: skip
        return "scale is not a finite number"
    reason = _tensor_reason(q, k, v)
    if reason:
        return reason
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        return "batch sizes differ (SDPA would broadcast)"
    if k.shape[1:3] != v.shape[1:3]:
        return "key and value shapes differ"
    if k.shape[3] != q.shape[3]:
        return "key head_dim differs from query's"
    if v.shape[3] != q.shape[3]:
        return "value head_dim differs from query's"
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q != heads_kv:
        if not enable_gqa:
            return "unequal head counts without enable_gqa"
        if heads_kv == 0 or heads_q % heads_kv:
            return "query heads not a multiple of key/value heads"
    reason = head_dim_unsupported(q.shape[3])
    if reason:
        return f"head_dim {q.shape[3]}"
    if k.shape[2] == 0 and q.shape[2] > 0:
        return "empty key sequence"
    return None


def unsupported_sdpa_call(args, kwargs) -> str | None:
    """None if the kernels take scaled_dot_product_attention(*args, **kwargs), else why not."""
    bound = _bind(tuple(args), dict(kwargs))
    if isinstance(bound, str):
        return bound
    return _call_reason(bound["query"], bound["key"], bound["value"], bound["attn_mask"],
                        bound["dropout_p"], bound["is_causal"], bound["scale"],
                        bound["enable_gqa"])  # fmt: skip


def make_sdpa(attention_fn):
    """scaled_dot_product_attention's signature over attention_fn(q, k, v, causal, scale)."""

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
             enable_gqa=False):  # fmt: skip
        if attn_mask is not None:
            raise NotImplementedError("attn_mask is not supported by the attention kernels")
        if dropout_p != 0.0:
            raise NotImplementedError(f"dropout_p={dropout_p}: the attention kernels have no "
                                      "dropout")  # fmt: skip
        shapes = all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (query, key, value))
        if shapes and query.shape[1] != key.shape[1] and not enable_gqa:
            raise ValueError(
                f"query has {query.shape[1]} heads and key {key.shape[1]}: "
                "grouped-query attention needs enable_gqa=True, as in SDPA"
            )
        return attention_fn(query, key, value, is_causal, scale)

    sdpa.__doc__ = ("torch.nn.functional.scaled_dot_product_attention's signature over "
                    f"{attention_fn.__module__}.{attention_fn.__name__}: no attn_mask, no "
                    "dropout; kernels/attention/sdpa.py")  # fmt: skip
    return sdpa


sdpa = make_sdpa(attention)
