"""kernels.attention against float64 math attention: forward and dQ, dK, dV, causal (top-left,
as SDPA's is_causal, for any Sq and Sk) and not, GQA, odd sequence lengths, head dims, every
dtype, non-contiguous inputs (transposed views, slices of a fused QKV projection, a strided head
dim, an expanded batch); the TMA variant (emulated in the interpreter) and the default choice;
bad inputs; the SDPA adapter and the router's question (unsupported_sdpa_call); the custom ops
under torch.compile(fullgraph=True); the launches the traced path makes; and, marked gpu, larger
shapes and every variant on a GPU.

The interpreter is slow: the fast tests use sequences of a few dozen positions (still several
blocks of the interpreter's 16-32-row tiles, both loop parts and ragged edges); breadth is
marked slow.
"""

import math

import pytest
import torch
import torch.nn.functional as F

import kernels
from experiments.correctness import TOLERANCES, allowed_error, relative_error
from kernels.attention import (
    VARIANTS,
    attention,
    attention_backward,
    attention_forward,
    attention_reference,
    dispatch,
    sdpa,
    tma_unusable,
    unsupported_sdpa_call,
)
from tests.conftest import DEVICE

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def _ieee_fp32(monkeypatch):
    """fp32 is held to fp32's tolerance: TF32 off (the kernels follow torch's switch)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


# ---------------------------------------------------------------------------------------------
# Inputs and the reference
# ---------------------------------------------------------------------------------------------
def make_qkv(batch, heads_q, heads_kv, seq_q, seq_k, head_dim, dtype, layout="bhsd",
             device=DEVICE, seed=0):  # fmt: skip
    """Fresh random q, k, v (batch, heads, seq, head_dim) in one of these layouts:
    bhsd: contiguous; bshd: transposed views of (batch, seq, heads, head_dim) buffers;
    fused: q, k and v sliced out of one (batch, seq, 3·heads·head_dim) projection (equal heads
    and lengths); strided_d: a head dim of stride 2; expanded: k and v one batch entry
    expanded (batch stride 0)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    if layout == "fused":
        assert heads_q == heads_kv and seq_q == seq_k
        x = rand(batch, seq_q, 3 * heads_q * head_dim)
        qkv = x.view(batch, seq_q, 3, heads_q, head_dim).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]
    if layout == "bshd":
        return (rand(batch, seq_q, heads_q, head_dim).transpose(1, 2),
                rand(batch, seq_k, heads_kv, head_dim).transpose(1, 2),
                rand(batch, seq_k, heads_kv, head_dim).transpose(1, 2))  # fmt: skip
    if layout == "strided_d":
        return (rand(batch, heads_q, seq_q, 2 * head_dim)[..., ::2],
                rand(batch, heads_kv, seq_k, 2 * head_dim)[..., 1::2],
                rand(batch, heads_kv, seq_k, 2 * head_dim)[..., ::2])  # fmt: skip
    if layout == "expanded":
        return (rand(batch, heads_q, seq_q, head_dim),
                rand(1, heads_kv, seq_k, head_dim).expand(batch, -1, -1, -1),
                rand(1, heads_kv, seq_k, head_dim).expand(batch, -1, -1, -1))  # fmt: skip
    assert layout == "bhsd", layout
    return (rand(batch, heads_q, seq_q, head_dim), rand(batch, heads_kv, seq_k, head_dim),
            rand(batch, heads_kv, seq_k, head_dim))  # fmt: skip


def _leaves(tensors, dtype=None):
    return [t.detach().to(dtype or t.dtype).requires_grad_() for t in tensors]


def _run(fn, inputs, do):
    out = fn(*inputs)
    out.backward(do)
    return [out, *(t.grad for t in inputs)]


def check_against_float64(q, k, v, causal, dtype_name, scale=None, variant=None):
    """Output and the three gradients of kernels.attention against float64 math attention on
    the same values, each within the dtype's tolerance (or twice eager SDPA's own error in the
    dtype, where that is larger: experiments.correctness.allowed_error)."""
    # seeded: the global generator's state depends on which tests ran before in the process
    g = torch.Generator(device=q.device).manual_seed(sum(q.shape) + sum(k.shape))
    do = torch.randn(q.shape, generator=g, device=q.device).to(q.dtype)
    ours = _run(
        lambda a, b, c: attention(a, b, c, causal, scale, variant=variant), _leaves((q, k, v)), do
    )
    exact = _run(
        lambda a, b, c: attention_reference(a, b, c, causal, scale),
        _leaves((q, k, v), torch.float64),
        do.double(),
    )
    eager = _run(
        lambda a, b, c: F.scaled_dot_product_attention(
            a, b, c, is_causal=causal, scale=scale, enable_gqa=True
        ),
        _leaves((q, k, v)),
        do,
    )
    assert ours[0].dtype == q.dtype and ours[0].shape == q.shape
    for name, got, ref, theirs in zip(("o", "dq", "dk", "dv"), ours, exact, eager, strict=True):
        assert got.shape == ref.shape, name
        if not ref.any():  # dQ, dK of one key: softmax over one score has no gradient
            error = (
                torch.linalg.vector_norm(got.double()) / torch.linalg.vector_norm(do.double())
            ).item()
            assert error < TOLERANCES[dtype_name], f"{name}: {error:.2e} where exactly 0"
            continue
        limit = allowed_error(TOLERANCES[dtype_name], relative_error(theirs, ref))
        error = relative_error(got, ref)
        assert error < limit, f"{name}: relative error {error:.2e} >= {limit:.2e}"


# ---------------------------------------------------------------------------------------------
# Correctness (the interpreter on the CPU, or the GPU)
# ---------------------------------------------------------------------------------------------
FAST_CASES = {
    # (batch, heads_q, heads_kv, seq_q, seq_k, head_dim), dtype, causal, layout
    "bf16-causal-gqa": ((1, 4, 2, 37, 37, 64), "bf16", True, "bhsd"),
    "fp16-kv-longer-bshd": ((1, 2, 2, 20, 45, 64), "fp16", False, "bshd"),
    "fp32-causal-q-longer": ((1, 2, 1, 45, 20, 64), "fp32", True, "bhsd"),
    "bf16-causal-fused-qkv-d128": ((2, 2, 2, 29, 29, 128), "bf16", True, "fused"),
}


@pytest.mark.parametrize("case", list(FAST_CASES))
def test_matches_float64(case):
    sizes, dtype_name, causal, layout = FAST_CASES[case]
    q, k, v = make_qkv(*sizes, DTYPES[dtype_name], layout)
    check_against_float64(q, k, v, causal, dtype_name)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_the_tma_variant_matches_float64(causal):
    """The TMA kernel (descriptors emulated by the interpreter), forward and the backward from
    its log-sum-exp."""
    q, k, v = make_qkv(1, 2, 1, 33, 40, 64, torch.float32)
    check_against_float64(q, k, v, causal, "fp32", variant="tma")


def test_long_16_bit_calls_take_tma_where_it_can_read_them(monkeypatch):
    """The default variant: TMA from TMA_MIN_SEQ keys on, in 16 bits, where TMA can read the
    tensors; the pointer kernel otherwise (the interpreter keeps it, to keep the tests short)."""
    monkeypatch.setattr(dispatch, "_INTERPRETED", False)
    monkeypatch.setattr(dispatch, "tma_unusable", lambda q, k, v: None)
    meta = torch.device("meta")
    short, long = (torch.empty(1, 2, n, 64, dtype=torch.bfloat16, device=meta)
                   for n in (dispatch.TMA_MIN_SEQ - 1, dispatch.TMA_MIN_SEQ))  # fmt: skip
    assert dispatch.resolve_variant(None, short, short, short) == "plain"
    assert dispatch.resolve_variant(None, short, long, long) == "tma"
    assert dispatch.resolve_variant(None, long.float(), long.float(), long.float()) == "plain"
    monkeypatch.setattr(dispatch, "tma_unusable", lambda q, k, v: "strided")
    assert dispatch.resolve_variant(None, long, long, long) == "plain"


def test_scale_and_top_left_causal_mask():
    """An explicit scale, and causal with Sq < Sk: query i sees keys 0..i only (SDPA's
    top-left alignment), not the last Sq keys."""
    q, k, v = make_qkv(1, 2, 2, 12, 40, 64, torch.float32, seed=3)
    check_against_float64(q, k, v, True, "fp32", scale=0.3)
    o = attention(q, k, v, causal=True)
    assert torch.allclose(o[:, :, 0], v[:, :, 0], atol=1e-6)  # row 0 sees key 0 alone


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sizes, layout", [
    ((2, 6, 2, 50, 50, 32), "bhsd"),
    ((1, 3, 3, 33, 70, 80), "bshd"),
    ((2, 2, 1, 70, 33, 96), "strided_d"),
    ((2, 4, 4, 47, 47, 128), "fused"),
    ((3, 4, 2, 17, 31, 64), "expanded"),
    ((1, 2, 2, 1, 1, 16), "bhsd"),
    ((1, 8, 1, 64, 64, 64), "bshd"),
])  # fmt: skip
def test_breadth(sizes, layout, causal, dtype_name):
    q, k, v = make_qkv(*sizes, DTYPES[dtype_name], layout, seed=sum(sizes))
    check_against_float64(q, k, v, causal, dtype_name)


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["tma"])
@pytest.mark.parametrize("dtype_name", ["bf16", "fp16"])
def test_hopper_variants_breadth(variant, dtype_name):
    q, k, v = make_qkv(2, 4, 2, 47, 47, 128, DTYPES[dtype_name], "bshd")
    check_against_float64(q, k, v, True, dtype_name, variant=variant)
    q, k, v = make_qkv(1, 2, 2, 40, 21, 64, DTYPES[dtype_name])
    check_against_float64(q, k, v, False, dtype_name, variant=variant)


@pytest.mark.slow
def test_non_contiguous_output_gradient():
    """dO as autograd hands it over from .sum() (expanded, every stride 0) and as a transposed
    view."""
    q, k, v = make_qkv(1, 2, 1, 21, 26, 64, torch.float32)
    leaves = _leaves((q, k, v))
    attention(*leaves, causal=True).sum().backward()
    exact = _leaves((q, k, v), torch.float64)
    attention_reference(*exact, causal=True).sum().backward()
    for got, ref in zip(leaves, exact, strict=True):
        assert relative_error(got.grad, ref.grad) < TOLERANCES["fp32"]
    o, lse = attention_forward(q, k, v, False)
    do = torch.randn(1, 21, 2, 64).transpose(1, 2)
    grads = attention_backward(do, q, k, v, o, lse, False, 64**-0.5)
    exact = _leaves((q, k, v), torch.float64)
    attention_reference(*exact).backward(do.double())
    for got, ref in zip(grads, exact, strict=True):
        assert relative_error(got, ref.grad) < TOLERANCES["fp32"]


@pytest.mark.slow
def test_random_shapes_fuzzed():
    """Derandomized hypothesis cases: any sizes, dtype, causality, layout, GQA group."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=24, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(batch=st.integers(1, 2), heads_kv=st.integers(1, 2), group=st.integers(1, 3),
           seq_q=st.integers(1, 70), seq_k=st.integers(1, 70),
           head_dim=st.sampled_from([16, 24, 64, 72, 128]),
           dtype_name=st.sampled_from(list(DTYPES)),
           causal=st.booleans(), layout=st.sampled_from(["bhsd", "bshd", "strided_d"]),
           variant=st.sampled_from(VARIANTS))  # fmt: skip
    def check(batch, heads_kv, group, seq_q, seq_k, head_dim, dtype_name, causal, layout,
              variant):  # fmt: skip
        q, k, v = make_qkv(batch, heads_kv * group, heads_kv, seq_q, seq_k, head_dim,
                           DTYPES[dtype_name], layout)  # fmt: skip
        chosen = None if tma_unusable(q, k, v) else variant
        check_against_float64(q, k, v, causal, dtype_name, variant=chosen)

    check()


# ---------------------------------------------------------------------------------------------
# Layouts, empty inputs, plans
# ---------------------------------------------------------------------------------------------
def test_output_layout_follows_the_query():
    q, k, v = make_qkv(2, 3, 3, 9, 9, 16, torch.float32)
    assert attention(q, k, v).is_contiguous()
    q, k, v = make_qkv(2, 3, 3, 9, 9, 16, torch.float32, "bshd")
    out = attention(q, k, v)
    assert out.transpose(1, 2).is_contiguous()  # (B, S, H, D) memory: the reshape is a view
    q.requires_grad_()
    attention(q, k, v).sum().backward()
    assert q.grad.transpose(1, 2).is_contiguous()


def test_empty_inputs_launch_nothing():
    q, k, v = make_qkv(1, 2, 2, 0, 5, 16, torch.float32)
    k.requires_grad_()
    out = attention(q, k, v)
    assert out.shape == (1, 2, 0, 16)
    out.sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k))  # no query read any key
    q, k, v = make_qkv(0, 2, 2, 4, 5, 16, torch.float32)
    assert attention(q, k, v).shape == (0, 2, 4, 16)


def test_a_planned_call_skips_the_checks(monkeypatch):
    monkeypatch.setattr(dispatch, "_FORWARD", dispatch.PlanCache())
    q, k, v = make_qkv(1, 2, 2, 10, 10, 16, torch.float32)
    first = attention(q, k, v, causal=True)
    calls = []
    monkeypatch.setattr(
        dispatch,
        "check_attention_args",
        lambda *a: calls.append(a) or dispatch.resolve_scale(None, 16),
    )
    assert torch.equal(attention(q.clone(), k.clone(), v.clone(), causal=True), first)
    assert not calls  # the planned key
    attention(q.transpose(2, 3).contiguous().transpose(2, 3), k, v, causal=True)
    assert len(calls) == 1  # other strides: another key, checked


# ---------------------------------------------------------------------------------------------
# Bad inputs: one clear error before anything is launched
# ---------------------------------------------------------------------------------------------
def _t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


Q = _t(1, 4, 8, 64)
BAD_CALLS = [
    ((Q.numpy(), Q, Q), {}, TypeError, "torch.Tensor"),
    ((Q.double(), Q.double(), Q.double()), {}, TypeError, "float64"),
    ((Q, Q.half(), Q), {}, TypeError, "dtype"),
    ((Q[0], Q[0], Q[0]), {}, ValueError, "4-D"),
    ((Q, _t(2, 4, 8, 64), _t(2, 4, 8, 64)), {}, ValueError, "batch size"),
    ((Q, _t(1, 4, 8, 64), _t(1, 4, 9, 64)), {}, ValueError, "same heads and seq_len"),
    ((Q, _t(1, 4, 8, 32), _t(1, 4, 8, 32)), {}, ValueError, "head_dim 32 but q has 64"),
    ((Q, Q, _t(1, 4, 8, 32)), {}, NotImplementedError, "v's head_dim"),
    ((Q, _t(1, 3, 8, 64), _t(1, 3, 8, 64)), {}, ValueError, "multiple"),
    ((_t(1, 2, 8, 256), _t(1, 2, 8, 256), _t(1, 2, 8, 256)), {}, NotImplementedError, "256"),
    ((_t(1, 2, 8, 36), _t(1, 2, 8, 36), _t(1, 2, 8, 36)), {}, NotImplementedError, "36"),
    ((Q, _t(1, 4, 0, 64), _t(1, 4, 0, 64)), {}, NotImplementedError, "seq_len 0"),
    ((Q, Q, Q), {"causal": 1}, TypeError, "causal"),
    ((Q, Q, Q), {"scale": "0.1"}, TypeError, "scale"),
    ((Q, Q, Q), {"scale": float("nan")}, ValueError, "finite"),
    ((Q, Q, Q), {"variant": "fast"}, ValueError, "unknown attention variant"),
    ((Q[..., ::2], Q[..., ::2], Q[..., ::2]), {"variant": "tma"}, NotImplementedError, "strided"),
    ((_t(1, 2, 8, 80),) * 3, {"variant": "tma"}, NotImplementedError, "power-of-2"),
]


@pytest.mark.parametrize("args, kwargs, error, match", BAD_CALLS)
def test_bad_input(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        attention(*args, **kwargs)


def test_bad_grad_output():
    o, lse = attention_forward(Q, Q, Q)
    with pytest.raises(ValueError, match="grad_output has shape"):
        attention_backward(Q[:, :, :4], Q, Q, Q, o, lse, False, 0.125)
    with pytest.raises(TypeError, match="dtype"):
        attention_backward(Q.half(), Q, Q, Q, o, lse, False, 0.125)


def test_tma_layout_rules():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 64, torch.bfloat16, "fused")
    assert tma_unusable(q, k, v) is None  # rows of 3·H·D: 16-byte aligned
    q, k, v = make_qkv(1, 2, 2, 8, 8, 64, torch.bfloat16, "expanded")
    assert tma_unusable(q, k, v) is None  # a batch stride of 0 moves no descriptor base
    odd = torch.randn(9 * 64 + 2)[2:].view(1, 1, 9, 64)  # starts 8 bytes in
    assert "starts" in tma_unusable(odd, odd, odd)
    d80 = torch.randn(1, 2, 8, 80)
    assert "power-of-2" in tma_unusable(d80, d80, d80)
    assert dispatch.resolve_variant(None, odd, odd, odd) == "plain"  # the default never raises


# ---------------------------------------------------------------------------------------------
# The SDPA adapter and the router's question
# ---------------------------------------------------------------------------------------------
def test_sdpa_adapter_matches_scaled_dot_product_attention():
    q, k, v = make_qkv(1, 4, 2, 19, 23, 32, torch.float32)
    for kwargs in ({"is_causal": True, "enable_gqa": True}, {"scale": 0.2, "enable_gqa": True}):
        expected = F.scaled_dot_product_attention(q, k, v, **kwargs)
        assert relative_error(sdpa(q, k, v, **kwargs), expected) < TOLERANCES["fp32"]
        assert unsupported_sdpa_call((q, k, v), kwargs) is None
    assert kernels.attention.sdpa is sdpa  # kernels.attention is the function; these hang off it
    assert kernels.attention.unsupported_sdpa_call is unsupported_sdpa_call
    with pytest.raises(NotImplementedError, match="attn_mask"):
        sdpa(q, k, v, torch.ones(19, 23, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(q, k, v, None, 0.1)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, k, v)


QS = _t(2, 4, 8, 64)
KS = _t(2, 2, 8, 64)
SDPA_CALLS = [
    ((QS, QS, QS), {}, None),
    ((QS, KS, KS), {"enable_gqa": True, "is_causal": True, "scale": 0.5}, None),
    ((QS.bfloat16(), QS.bfloat16(), QS.bfloat16(), None, 0.0, True), {}, None),
    ((QS[..., ::2],) * 3, {}, None),  # strided head dim: read in place
    ((QS, QS, QS, torch.ones(8, 8, dtype=torch.bool)), {}, "attn_mask"),
    ((QS, QS, QS), {"dropout_p": 0.1}, "dropout_p"),
    ((QS, KS, KS), {}, "unequal head counts without enable_gqa"),
    ((QS, _t(2, 3, 8, 64), _t(2, 3, 8, 64)), {"enable_gqa": True}, "not a multiple"),
    ((QS[0], QS[0], QS[0]), {}, "3-D inputs"),
    ((QS.double(),) * 3, {}, "dtype float64"),
    ((QS, QS.half(), QS), {}, "dtype"),
    ((QS, QS.half(), QS.half()), {}, "mixed dtypes"),
    ((QS, QS[:1], QS[:1]), {}, "batch sizes differ"),
    ((QS, QS, _t(2, 4, 8, 32)), {}, "value head_dim"),
    ((_t(1, 2, 4, 256),) * 3, {}, "head_dim 256"),
    ((QS, _t(2, 4, 0, 64), _t(2, 4, 0, 64)), {}, "empty key sequence"),
    ((QS, QS, QS), {"scale": float("inf")}, "scale"),
    ((QS, QS, QS), {"is_causal": None}, "is_causal"),
    ((QS, QS), {}, "missing value"),
    ((QS, QS, QS), {"query": QS}, "query given twice"),
    ((QS, QS, QS), {"mask": None}, "unknown argument mask"),
    ((QS,) * 7, {}, "too many positional"),
    ((QS.tolist(), QS, QS), {}, "query is not a tensor"),
]


@pytest.mark.parametrize("args, kwargs, reason", SDPA_CALLS)
def test_unsupported_sdpa_call(args, kwargs, reason):
    got = unsupported_sdpa_call(args, kwargs)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got, got


@pytest.mark.slow
def test_every_supported_sdpa_call_runs():
    """What unsupported_sdpa_call lets through, the adapter computes as SDPA does."""
    for args, kwargs, reason in SDPA_CALLS:
        if reason is None:
            expected = F.scaled_dot_product_attention(*args, **kwargs)
            got = sdpa(*args, **kwargs)
            name = "bf16" if got.dtype == torch.bfloat16 else "fp32"
            assert relative_error(got, expected) < TOLERANCES[name]


# ---------------------------------------------------------------------------------------------
# The custom ops (triton-compiled mode)
# ---------------------------------------------------------------------------------------------
def test_traced_launches_name_every_parameter_and_share_no_memory(monkeypatch):
    """The ops' launches through the traced launcher (recorded, then run in the interpreter):
    each names every kernel parameter (Inductor's write analysis needs it) and no launch passes
    two tensors over one memory (tests/test_traced_launches.py says why both matter)."""
    from kernels import ops
    from tests.test_traced_launches import _missing, _Recorder

    monkeypatch.setattr(ops, "_active_launch", [ops.naming(_Recorder)])
    monkeypatch.setattr(_Recorder, "launches", [])
    q, k, v = _leaves(make_qkv(1, 2, 1, 17, 17, 16, torch.float32, seed=5))
    ops.attention(q, k, v, causal=True).square().sum().backward()
    names = [getattr(kernel, "fn", kernel).__name__ for kernel, _, _ in _Recorder.launches]
    assert sorted(names) == sorted(
        [
            "attention_fwd_kernel",
            "attention_bwd_delta_kernel",
            "attention_bwd_dkdv_kernel",
            "attention_bwd_dq_kernel",
        ]
    )
    for kernel, args, kwargs in _Recorder.launches:
        assert not _missing(kernel, args, kwargs)
        tensors = [t for t in [*args, *kwargs.values()] if isinstance(t, torch.Tensor)]
        storages = [t.untyped_storage().data_ptr() for t in tensors]
        assert len(set(storages)) == len(storages)
    exact = _leaves((q, k, v), torch.float64)
    attention_reference(*exact, causal=True).square().sum().backward()
    assert relative_error(q.grad, exact[0].grad) < TOLERANCES["fp32"]


@pytest.mark.slow
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
def test_compiles_fullgraph_forward_and_backward(dtype_name):
    """torch.compile(fullgraph=True) over the ops (Inductor's CPU backend here, the ops opaque;
    on a GPU, triton_op + wrap_triton), forward and backward against float64."""
    from kernels import ops

    torch._dynamo.reset()
    q, k, v = make_qkv(1, 4, 2, 20, 24, 64, DTYPES[dtype_name], "bshd", seed=7)
    do = torch.randn(q.shape).to(q.dtype)

    def step(a, b, c):
        return ops.sdpa(a * 1.5, b, c, is_causal=True, enable_gqa=True)

    compiled = torch.compile(step, fullgraph=True)
    ours = _run(compiled, _leaves((q, k, v)), do)
    exact = _run(lambda a, b, c: attention_reference(a * 1.5, b, c, True),
                 _leaves((q, k, v), torch.float64), do.double())  # fmt: skip
    for got, ref in zip(ours, exact, strict=True):
        assert relative_error(got, ref) < TOLERANCES[dtype_name]


# ---------------------------------------------------------------------------------------------
# What a GPU compiles (no GPU needed) and runs
# ---------------------------------------------------------------------------------------------
OFFLINE = """
import json, os, triton
from experiments.resources import OfflineCompiler
from kernels._common import pretend_gpu
from kernels.attention import attention_backward, attention_forward
import torch
seen, compile_ = [], triton.compile
def record(*args, **kwargs):
    kernel = compile_(*args, **kwargs)
    seen.append(kernel.name)
    return kernel
triton.compile = record
compiler = OfflineCompiler(90)
with pretend_gpu((9, 0), 132), compiler.active():
    q = torch.randn(1, 4, 512, 128).bfloat16(); k = torch.randn(1, 2, 512, 128).bfloat16()
    for variant in ("plain", "tma"):
        attention_forward(q, k, k, True, None, variant=variant)
    attention_backward(q, q, k, k, q, torch.zeros(1, 4, 512), True, 0.1)
spills = [(r.kernel, r.constexprs, r.spill_stores) for r in compiler.compiled.values()
          if r.spill_stores]
print(json.dumps({"seen": seen, "spills": spills}))
"""


@pytest.mark.slow
def test_every_config_compiles_for_hopper_without_spills():
    """Every tuning candidate an H100 could launch for a bf16 head_dim-128 causal GQA call,
    compiled offline for sm_90 (the installed Triton; the GPUs run 3.6): no failure, no
    spill."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    result = subprocess.run([sys.executable, "-c", OFFLINE], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["spills"], report["spills"]
    assert report["seen"].count("attention_fwd_tma_kernel") == 3, report["seen"]


@pytest.mark.slow
def test_inductor_reads_what_each_traced_launch_writes():
    """torch's TTIR analysis reads every kernel an H100 would trace for attention's ops, so
    Inductor clones no input (tests/test_traced_launches.py)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    code = """
import logging, torch, triton
from torch._higher_order_ops import triton_kernel_wrap as wrap
from kernels import ops
from kernels._common import pretend_gpu
from tests.test_traced_launches import _Recorder, _Target, _ttir_kwargs
analyze = getattr(wrap, "identify_accessed_tensors", None) or wrap.identify_mutated_tensors
ops._active_launch[0] = ops.naming(_Recorder)
_Recorder.run = False
seen = []
class Said(logging.LoggerAdapter):
    def warning(self, message, *args, **kwargs):
        seen.append(str(message))
wrap.log = Said(wrap.log, {})
triton.runtime.driver.set_active(_Target())
with pretend_gpu((9, 0), 132):
    q = torch.randn(1, 4, 64, 128, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 2, 64, 128, dtype=torch.bfloat16, requires_grad=True)
    out = ops.sdpa(q, k, k, is_causal=True, enable_gqa=True)
    torch.ops.kbench.attention_bwd(out, q, k, k, out, torch.zeros(1, 4, 64), True, 0.1,
                                   True, True)
names = []
for kernel, args, kwargs in _Recorder.launches:
    fn, named = _ttir_kwargs(kernel, args, kwargs)
    analyze(fn, named, {})
    names.append(fn.__name__)
print(len(names), sum("assuming every input is mutated" in m for m in seen))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    launches, unread = map(int, result.stdout.strip().splitlines()[-1].split())
    assert launches == 4 and unread == 0, result.stdout


# ---------------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------------
GPU_CASES = {
    # (batch, heads_q, heads_kv, seq_q, seq_k, head_dim), dtype, causal, layout
    "llm-causal-gqa-d128": ((2, 8, 2, 1041, 1041, 128), "bf16", True, "bhsd"),
    "llm-fused-qkv": ((2, 4, 4, 777, 777, 128), "bf16", True, "fused"),
    "vit-d64": ((8, 12, 12, 197, 197, 64), "fp16", False, "bshd"),
    "kv-longer-causal": ((1, 4, 1, 300, 1200, 64), "bf16", True, "bhsd"),
    "fp32-ieee": ((1, 4, 2, 333, 333, 64), "fp32", True, "bhsd"),
    "d80-expanded": ((2, 4, 2, 257, 300, 80), "fp16", False, "expanded"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_variants_match_float64(case, variant):
    sizes, dtype_name, causal, layout = GPU_CASES[case]
    q, k, v = make_qkv(*sizes, DTYPES[dtype_name], layout, device="cuda")
    if variant != "plain" and tma_unusable(q, k, v):
        pytest.skip(tma_unusable(q, k, v))
    check_against_float64(q, k, v, causal, dtype_name, variant=variant)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_planned_calls_take_the_armed_launch(variant, monkeypatch):
    """A repeated call launches through its plan's armed Step (the C launcher, no JIT
    binding), device-side descriptors included."""
    monkeypatch.setattr(dispatch, "_FORWARD", dispatch.PlanCache())
    q, k, v = make_qkv(2, 8, 2, 512, 512, 128, torch.bfloat16, "bshd", device="cuda")
    first = attention(q, k, v, causal=True, variant=variant)
    again = attention(q, k, v, causal=True, variant=variant)
    torch.cuda.synchronize()
    assert torch.equal(first, again)
    ((step, _, _),) = dispatch._FORWARD.values()
    assert step.fast is not None


@pytest.mark.gpu
def test_gpu_compiled_ops_match_float64():
    """triton_op + wrap_triton under torch.compile(fullgraph=True), forward and backward."""
    from kernels import ops

    torch._dynamo.reset()
    q, k, v = make_qkv(2, 8, 2, 600, 600, 128, torch.bfloat16, "bshd", device="cuda")
    do = torch.randn(q.shape, device="cuda").to(q.dtype)
    compiled = torch.compile(lambda a, b, c: ops.sdpa(a, b, c, is_causal=True, enable_gqa=True),
                             fullgraph=True)  # fmt: skip
    ours = _run(compiled, _leaves((q, k, v)), do)
    exact = _run(lambda a, b, c: attention_reference(a, b, c, True),
                 _leaves((q, k, v), torch.float64), do.double())  # fmt: skip
    for got, ref in zip(ours, exact, strict=True):
        assert relative_error(got, ref) < TOLERANCES["bf16"]


def test_benchmark_flop_convention():
    """scripts/attention_bench.py counts FlashAttention's way: 4·B·H·Sq·Sk·D forward, half of
    it causal, fwd_bwd 3.5x; and without a GPU it says so and exits 2."""
    import importlib.util

    from tests.conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "attention_bench", REPO_ROOT / "scripts" / "attention_bench.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    attention_flops = bench.attention_flops

    full = attention_flops(2, 4, 128, 128, 64, causal=False, backward=False)
    assert full == 4 * 2 * 4 * 128 * 128 * 64
    assert attention_flops(2, 4, 128, 128, 64, causal=True, backward=False) == full / 2
    assert math.isclose(attention_flops(2, 4, 128, 128, 64, causal=False, backward=True),
                        3.5 * full)  # fmt: skip
    if not torch.cuda.is_available():
        assert bench.main([]) == 2


# ---------------------------------------------------------------------------------------------
# The registry's op (kernel=sdpa): its float64 reference past the math path's reach
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_blocked_float64_reference_is_sdpa_exactly(monkeypatch, causal):
    """Above REFERENCE_SCORES the sdpa op's reference runs a block of queries at a time (the
    math path's scores of a 16k-token shape are 275 GB in float64): the same values and
    gradients as one call, with blocks that do not divide the sequence."""
    from experiments import single_ops as registry

    monkeypatch.setattr(registry, "REFERENCE_SCORES", 0)
    monkeypatch.setattr(registry, "REFERENCE_ROWS", 7)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 23, 16, generator=g, dtype=torch.float64, requires_grad=True)
               for h in (4, 2, 2))  # fmt: skip
    got = registry.torch_sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    dy = torch.randn(got.shape, generator=g, dtype=torch.float64)
    got_grads = torch.autograd.grad(got, (q, k, v), dy)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    want_grads = torch.autograd.grad(want, (q, k, v), dy)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b)
