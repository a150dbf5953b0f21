"""Attention's backward, FlashAttention-2 style: dQ, dK, dV from dO, recomputing P per block.

With S = Q K^T · scale, P = softmax(S), O = P V and dO given:

    dV = P^T dO        dP = dO V^T        dS = P ⊙ (dP - Δ),  Δ_i = Σ_j P_ij dP_ij = dO_i · O_i
    dQ = dS K · scale  dK = dS^T Q · scale

P is never stored: each block rebuilds it from Q, K and the forward's log-sum-exp,
P = exp2(q·k·qk_scale - lse) (forward.py's log2 convention). Three launches:

    attention_bwd_delta_kernel  Δ = rowsum(dO ⊙ O), fp32, one value per query row.
    attention_bwd_dkdv_kernel   one program per key block of one kv head: K and V stay on chip
                                while it walks the query blocks of every q head of its GQA
                                group, accumulating dK and dV in registers; stored once, no
                                atomics (the group's heads are summed inside the program).
    attention_bwd_dq_kernel     one program per query block: walks its key blocks as the
                                forward does, accumulating dQ.

The split recomputes Q K^T and dO V^T a second time (in the dq pass) where FlashAttention-2's
CUDA kernel adds dQ with fp32 atomics from the dkdv pass instead: atomics make dQ's rounding
order vary from run to run and need a zeroed fp32 buffer and a cast afterwards, while the dq
pass keeps its dQ block in registers for its whole key loop and stores it once. Causal
programs skip the blocks every row of which is masked, and mask only the diagonal and ragged
blocks.
"""

import triton
import triton.language as tl

from kernels._common import is_interpreter
from kernels.attention.forward import (
    TUNE_KEY,
    fp32_dot,
    key_block,
    key_ranges,
    load_block,
    make_config,
    query_block,
    visible,
)


def hopper_dkdv_configs(head_dim: int) -> list[triton.Config]:
    """16-bit tiles for sm_90 that compile without spills (triton 3.6, offline for sm_90:
    docs/kernels/attention.md, "Tiles"): key blocks of 128 on 8 warps, with a query step of
    32-64 rows at head dim 64 but only 16 at 128, where dK, dV (64 fp32 registers a thread
    each) and the on-chip K and V leave no room for a longer step."""
    if head_dim > 64:
        return [make_config(16, 128, 8, 3), make_config(32, 128, 8, 1), make_config(16, 64, 8, 3)]
    return [make_config(32, 128, 8, 3), make_config(64, 128, 8, 2), make_config(32, 64, 4, 3)]


def hopper_dq_configs(head_dim: int) -> list[triton.Config]:
    """Query blocks of 128 or 64 rows, a key step of 32-64 keys (none spills at 64 or 128)."""
    return [make_config(128, 32, 8, 3), make_config(128, 64, 8, 2), make_config(64, 64, 4, 3)]


# fp32 (FMA dots from registers): the largest tiles that compile without spills at head dim 128
FP32_DKDV_CONFIG = make_config(16, 32, 4, 2)
FP32_DQ_CONFIG = make_config(16, 32, 4, 2)
# The interpreter's tiles: the dkdv pass steps 16 query rows over 32-key blocks, the dq pass 16
# keys over 32-row blocks, so the tests' short sequences cross every loop part's edges.
INTERPRETER_DKDV_CONFIG = make_config(16, 32, 4, 1)
INTERPRETER_DQ_CONFIG = make_config(32, 16, 4, 1)


def _declared(hopper_configs, interpreter_config) -> list[triton.Config]:
    """An autotuner's declared list; in the interpreter its one config (nothing benchmarked)."""
    return [interpreter_config] if is_interpreter() else hopper_configs(128)


def _prune(hopper_configs, fp32_config):
    """The configs a launch may take, by dtype and head dim (a constexpr of the launch)."""

    def prune(configs, named_args, **kwargs):
        if named_args["q_ptr"].dtype.itemsize == 4:
            return [fp32_config]
        return hopper_configs(kwargs["HEAD_DIM"])

    return prune


# ---------------------------------------------------------------------------------------------
# Δ = rowsum(dO ⊙ O)
# ---------------------------------------------------------------------------------------------
DELTA_BLOCK_M = 64


@triton.jit
def attention_bwd_delta_kernel(
    # pointers: the forward's output, its gradient (any strides), Δ (B, Hq, Sq) fp32
    o_ptr, do_ptr, delta_ptr,
    # sizes
    heads_q, seq_q,
    # strides: (batch, head, seq) of O (head dim contiguous), (batch, head, seq, head dim) of dO
    stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom, stride_dod,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    start_m, b, h = query_block(tl.program_id(0), seq_q, heads_q, BLOCK_M, False)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o_ptrs = o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    do_ptrs = (do_ptr + b * stride_dob + h * stride_doh + offs_m[:, None] * stride_dom
               + offs_d[None, :] * stride_dod)  # fmt: skip
    o = load_block(o_ptrs, offs_m, seq_q, offs_d, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    do = load_block(do_ptrs, offs_m, seq_q, offs_d, HEAD_DIM, BLOCK_D, True).to(tl.float32)
    delta_ptrs = delta_ptr + (b * heads_q + h) * seq_q + offs_m
    tl.store(delta_ptrs, tl.sum(o * do, 1), mask=offs_m < seq_q)


# ---------------------------------------------------------------------------------------------
# dK, dV: one program per key block
# ---------------------------------------------------------------------------------------------
@triton.jit
def _query_ranges(start_n, seq_q, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):  # fmt: skip
    """(band_lo, band_end, full_end) for the keys [start_n, start_n + BLOCK_N), walked in query
    blocks of BLOCK_M: [band_lo, band_end) masked (causal: the blocks the diagonal crosses; the
    rows before band_lo see none of these keys), [band_end, full_end) whole (every row sees
    every key), [full_end, seq_q) masked (the ragged last block)."""
    band_lo = 0
    band_end = 0
    if CAUSAL:
        band_lo = (start_n // BLOCK_M) * BLOCK_M
        band_end = min(tl.cdiv(start_n + BLOCK_N, BLOCK_M) * BLOCK_M, seq_q)
    full_end = max(band_end, (seq_q // BLOCK_M) * BLOCK_M)
    return band_lo, band_end, full_end


@triton.jit
def _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_qd,
                stride_dom, stride_dod, offs_n, offs_d, lo, hi, seq_q, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                MASKED: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
                PRECISION: tl.constexpr):  # fmt: skip
    """Query blocks [lo, hi) of one q head into dK, dV; the scores are transposed (a row per
    key), so P^T dO and dS^T Q need no transposed operand."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        q = load_block(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                       offs_m, seq_q, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # fmt: skip
        do = load_block(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                        offs_m, seq_q, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # fmt: skip
        if MASKED:
            lse = tl.load(lse_base + offs_m, mask=offs_m < seq_q, other=0.0)
            delta = tl.load(delta_base + offs_m, mask=offs_m < seq_q, other=0.0)
        else:
            lse = tl.load(lse_base + offs_m)
            delta = tl.load(delta_base + offs_m)
        qk_t = fp32_dot(k, tl.trans(q), None, UPCAST, PRECISION) * qk_scale
        p_t = tl.math.exp2(qk_t - lse[None, :])
        if MASKED:
            keep = offs_m[None, :] < seq_q
            if CAUSAL:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            p_t = tl.where(keep, p_t, 0.0)
        dv = fp32_dot(p_t.to(do.dtype), do, dv, UPCAST, PRECISION)
        dp_t = fp32_dot(v, tl.trans(do), None, UPCAST, PRECISION)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = fp32_dot(ds_t.to(q.dtype), q, dk, UPCAST, PRECISION)
    return dk, dv


@triton.autotune(
    configs=_declared(hopper_dkdv_configs, INTERPRETER_DKDV_CONFIG), key=TUNE_KEY,
    prune_configs_by={"early_config_prune": _prune(hopper_dkdv_configs, FP32_DKDV_CONFIG)},
)  # fmt: skip
@triton.jit
def attention_bwd_dkdv_kernel(
    # pointers: inputs and dO (any strides), the forward's lse and Δ (B, Hq, Sq) fp32, outputs
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr,
    # sizes: q heads, q heads per kv head, sequence lengths, the tuner's key
    heads_q, group, seq_q, seq_k, seq_q_pow2, seq_k_pow2,
    # strides in elements: (batch, head, seq, head dim) of q, k, v, dO; (batch, head, seq) of
    # dK and dV (head dim contiguous)
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    # the softmax scale (dK's factor) and scale·log2(e) (the exponent's)
    scale, qk_scale,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # ---- program-id mapping: key blocks fastest; causal's first blocks are the longest ----
    pid = tl.program_id(0)
    blocks = tl.cdiv(seq_k, BLOCK_N)
    start_n = (pid % blocks) * BLOCK_N
    heads_kv = heads_q // group
    b = (pid // blocks // heads_kv).to(tl.int64)
    hk = (pid // blocks) % heads_kv

    # ---- pointer setup: this block's K and V stay on chip ----
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh
    k = load_block(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, offs_n,
                   seq_k, offs_d, HEAD_DIM, BLOCK_D, True)  # fmt: skip
    v = load_block(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, offs_n,
                   seq_k, offs_d, HEAD_DIM, BLOCK_D, True)  # fmt: skip

    # ---- main loop: each q head of the group over its three query ranges ----
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    band_lo, band_end, full_end = _query_ranges(start_n, seq_q, BLOCK_M, BLOCK_N, CAUSAL)
    for g in range(group):
        h = hk * group + g
        q_base = q_ptr + b * stride_qb + h * stride_qh
        do_base = do_ptr + b * stride_dob + h * stride_doh
        lse_base = lse_ptr + (b * heads_q + h) * seq_q
        delta_base = delta_ptr + (b * heads_q + h) * seq_q
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm,
                             stride_qd, stride_dom, stride_dod, offs_n, offs_d, band_lo,
                             band_end, seq_q, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_D, True,
                             CAUSAL, UPCAST, PRECISION)  # fmt: skip
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm,
                             stride_qd, stride_dom, stride_dod, offs_n, offs_d, band_end,
                             full_end, seq_q, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_D, False,
                             CAUSAL, UPCAST, PRECISION)  # fmt: skip
        dk, dv = _dkdv_steps(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm,
                             stride_qd, stride_dom, stride_dod, offs_n, offs_d, full_end,
                             seq_q, seq_q, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_D, True,
                             CAUSAL, UPCAST, PRECISION)  # fmt: skip

    # ---- write-back: the rows past seq_k (zero-loaded keys, garbage sums) are dropped ----
    ok = (offs_n[:, None] < seq_k) & (offs_d[None, :] < HEAD_DIM)
    rows = offs_n[:, None]
    dk_ptrs = dk_ptr + b * stride_dkb + hk * stride_dkh + rows * stride_dkn + offs_d[None, :]
    dv_ptrs = dv_ptr + b * stride_dvb + hk * stride_dvh + rows * stride_dvn + offs_d[None, :]
    tl.store(dk_ptrs, (dk * scale).to(dk_ptr.dtype.element_ty), mask=ok)
    tl.store(dv_ptrs, dv.to(dv_ptr.dtype.element_ty), mask=ok)


# ---------------------------------------------------------------------------------------------
# dQ: one program per query block
# ---------------------------------------------------------------------------------------------
@triton.jit
def _dq_steps(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn,
              stride_vd, offs_m, offs_d, lo, hi, seq_k, qk_scale, HEAD_DIM: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
              CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
              PRECISION: tl.constexpr):  # fmt: skip
    """Key blocks [lo, hi) into dQ, walked as the forward walks them."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k, v, qk = key_block(q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                             offs_n, offs_d, seq_k, qk_scale, HEAD_DIM, BLOCK_D, MASKED, UPCAST,
                             PRECISION)  # fmt: skip
        p = tl.math.exp2(qk - lse[:, None])
        if MASKED:
            p = tl.where(visible(offs_m, offs_n, seq_k, CAUSAL), p, 0.0)
        dp = fp32_dot(do, tl.trans(v), None, UPCAST, PRECISION)
        ds = p * (dp - delta[:, None])
        dq = fp32_dot(ds.to(k.dtype), k, dq, UPCAST, PRECISION)
    return dq


@triton.autotune(
    configs=_declared(hopper_dq_configs, INTERPRETER_DQ_CONFIG), key=TUNE_KEY,
    prune_configs_by={"early_config_prune": _prune(hopper_dq_configs, FP32_DQ_CONFIG)},
)  # fmt: skip
@triton.jit
def attention_bwd_dq_kernel(
    # pointers: inputs and dO (any strides), lse and Δ, the output dQ
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr,
    # sizes, as attention_bwd_dkdv_kernel's
    heads_q, group, seq_q, seq_k, seq_q_pow2, seq_k_pow2,
    # strides: (batch, head, seq, head dim) of q, k, v, dO; (batch, head, seq) of dQ
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm,
    # the softmax scale (dQ's factor) and scale·log2(e)
    scale, qk_scale,
    # meta-parameters
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # ---- program-id mapping (the forward's) ----
    start_m, b, h = query_block(tl.program_id(0), seq_q, heads_q, BLOCK_M, CAUSAL)
    hk = h // group

    # ---- pointer setup: this block's q, dO, lse and Δ stay on chip ----
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    do_base = do_ptr + b * stride_dob + h * stride_doh
    q = load_block(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, offs_m,
                   seq_q, offs_d, HEAD_DIM, BLOCK_D, True)  # fmt: skip
    do = load_block(do_base + offs_m[:, None] * stride_dom + offs_d[None, :] * stride_dod,
                    offs_m, seq_q, offs_d, HEAD_DIM, BLOCK_D, True)  # fmt: skip
    row = (b * heads_q + h) * seq_q + offs_m
    lse = tl.load(lse_ptr + row, mask=offs_m < seq_q, other=0.0)
    delta = tl.load(delta_ptr + row, mask=offs_m < seq_q, other=0.0)
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh

    # ---- main loop: whole key blocks, then the masked ones ----
    dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    full_end, end = key_ranges(start_m, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    dq = _dq_steps(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn,
                   stride_vd, offs_m, offs_d, 0, full_end, seq_k, qk_scale, HEAD_DIM, BLOCK_N,
                   BLOCK_D, False, CAUSAL, UPCAST, PRECISION)  # fmt: skip
    dq = _dq_steps(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_kd, stride_vn,
                   stride_vd, offs_m, offs_d, full_end, end, seq_k, qk_scale, HEAD_DIM, BLOCK_N,
                   BLOCK_D, True, CAUSAL, UPCAST, PRECISION)  # fmt: skip

    # ---- write-back ----
    ok = (offs_m[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    dq_base = dq_ptr + b * stride_dqb + h * stride_dqh
    dq_ptrs = dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :]
    tl.store(dq_ptrs, (dq * scale).to(dq_ptr.dtype.element_ty), mask=ok)
