"""Attention's forward, FlashAttention-2 style: softmax(Q K^T · scale) V without the N×N matrix.

Eager attention (and SDPA's math backend) writes the (Sq, Sk) scores and probabilities of every
head to memory and reads them back: 4·Sq·Sk bytes per head in fp16, more than Q, K, V and O
together from Sq = Sk = 2·D on. This kernel keeps them on chip: a program owns BLOCK_M query
rows of one head, walks that head's keys BLOCK_N at a time and keeps a running row max m, row
sum l and the unnormalised output acc (online softmax), so it reads Q once, K and V once per
query block, and writes O and one log-sum-exp per row (what the backward rebuilds P from). The
target is SDPA's fused backends (FlashAttention-2, cuDNN).

    attention_fwd_kernel      pointer loads through any strides (every layout, every GPU, the
                              interpreter); the default.
    attention_fwd_tma_kernel  Hopper (sm_90+): Q, K, V and O through device-side TMA
                              descriptors (tl.make_tensor_descriptor), one 2-D [seq, head_dim]
                              descriptor per (batch, head) slice, so TMA clips every block at
                              that head's own sequence end.

Conventions shared with the backward (backward.py):
- scores are taken in log2 units: qk_scale = scale·log2(e), p = exp2(q·k·qk_scale - m), so the
  stored log-sum-exp is log2(Σ_j exp(s_j)); the backward rebuilds P = exp2(q·k·qk_scale - lse).
- causal is SDPA's is_causal: top-left aligned, query i sees keys j <= i for any Sq, Sk (every
  row sees key 0, so no row is ever empty and no -inf row max reaches exp2).
- GQA: query head h reads key/value head h // group (group = q heads / kv heads).
- the key loop has two parts: blocks every row of the program sees whole (no mask), then the
  blocks that need one (the causal diagonal, the ragged last block); causal programs never
  visit the blocks above the diagonal.
"""

import torch
import triton
import triton.language as tl

from kernels._common import is_interpreter

LOG2E = 1.4426950408889634


def attention_reference(q, k, v, causal: bool = False, scale: float | None = None):
    # FLOPs: 4·B·Hq·Sq·Sk·D (two products), half of that causal; the scores and probabilities it
    # writes and reads back are B·Hq·Sq·Sk elements each, which the kernels never store.
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = (q @ k.transpose(-2, -1)) * scale
    if causal:
        rows, cols = scores.shape[-2:]
        visible = torch.ones(rows, cols, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


# ---------------------------------------------------------------------------------------------
# Autotuning configs
# ---------------------------------------------------------------------------------------------
def make_config(block_m, block_n, warps, stages) -> triton.Config:
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps,
                         num_stages=stages)  # fmt: skip


def hopper_forward_configs(head_dim: int, tma: bool) -> list[triton.Config]:
    """A handful of 16-bit tiles for sm_90 (each compiles without spills under triton 3.6's
    ptxas, offline for sm_90: docs/kernels/attention.md, "Tiles"): 128-row query blocks on 8
    warps (two wgmma warpgroups; at head dim 128 on 4 warps the accumulator alone takes 128
    registers a thread and it spills) or 4 (head dims up to 64), and 64-row blocks, which short
    sequences keep (prune_forward) so that their few query blocks spread over more SMs. The
    pointer kernel's 128x128 tile at head dim 128 takes 2 stages: with 3 it spills 12 bytes
    (its address registers; the TMA kernel has none)."""
    if head_dim > 64:
        wide = make_config(128, 128, 8, 3 if tma else 2)
        return [wide, make_config(128, 64, 8, 3), make_config(64, 64, 4, 3)]
    return [make_config(128, 128, 8, 3), make_config(128, 64, 4, 3), make_config(64, 64, 4, 3)]


# fp32: its ieee dots run on FMA units from registers, and at head dim 128 every larger tile
# spills (hundreds to thousands of bytes, offline for sm_90); fp32 is for exactness, not speed
FP32_FORWARD_CONFIG = make_config(16, 16, 4, 2)
# One small tile in the interpreter: an autotuner of one config neither prunes nor benchmarks,
# and the tests' short sequences still cross several key blocks (both loop parts, ragged edges).
INTERPRETER_FORWARD_CONFIG = make_config(32, 16, 4, 1)
SHORT_SEQ = 256  # up to this many query rows (rounded up to a power of 2): 64-row blocks only


def forward_configs() -> list[triton.Config]:
    """The autotuners' declared list: what prune_forward chooses from is known per launch."""
    return [INTERPRETER_FORWARD_CONFIG] if is_interpreter() else hopper_forward_configs(128, True)


def prune_forward(tma: bool):
    """The configs a launch of the pointer (or TMA) kernel may take; the autotuner's own list is
    unused (HEAD_DIM is a constexpr of the launch)."""

    def prune(configs, named_args, **kwargs):
        if named_args["q_ptr"].dtype.itemsize == 4:
            return [FP32_FORWARD_CONFIG]
        configs = hopper_forward_configs(kwargs["HEAD_DIM"], tma)
        if named_args["seq_q_pow2"] <= SHORT_SEQ:
            return [c for c in configs if c.kwargs["BLOCK_M"] == 64] or configs
        return configs

    return prune


# Every attention kernel's tuning key: each sequence length rounded up to a power of 2 (so 1000
# and 1024 share a choice; the kernels never read these two), the head dim and causality; the
# autotuner adds the tensors' dtypes.
TUNE_KEY = ["seq_q_pow2", "seq_k_pow2", "HEAD_DIM", "CAUSAL"]


# ---------------------------------------------------------------------------------------------
# @triton.jit pieces shared with the backward
# ---------------------------------------------------------------------------------------------
@triton.jit
def fp32_dot(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """acc + a @ b in fp32 (a @ b where acc is None). UPCAST (the interpreter with 16-bit
    operands): its dot multiplies bf16 as raw bits, so the operands go to fp32 first, which
    keeps their values."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def load_block(ptrs, rows, n_rows, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               MASK_ROWS: tl.constexpr):  # fmt: skip
    """A (rows, BLOCK_D) block, zero past n_rows (MASK_ROWS) and past HEAD_DIM: each mask only
    where it can cut something, so whole blocks of a power-of-2 head dim load unmasked."""
    if MASK_ROWS:
        block = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM),
                        other=0.0)  # fmt: skip
    elif BLOCK_D != HEAD_DIM:
        block = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        block = tl.load(ptrs)
    return block


@triton.jit
def key_ranges(start_m, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               CAUSAL: tl.constexpr):  # fmt: skip
    """(full_end, end) for the query rows [start_m, start_m + BLOCK_M): the key blocks of
    [0, full_end) are inside seq_k and visible to every row (no mask); those of [full_end, end)
    need _visible (the diagonal, the ragged last block); keys from `end` on are never visible."""
    full_end = (seq_k // BLOCK_N) * BLOCK_N
    end = seq_k
    if CAUSAL:
        # a block is whole for every row when its last key is <= the first row (start_m)
        full_end = min(full_end, ((start_m + 1) // BLOCK_N) * BLOCK_N)
        end = min(seq_k, start_m + BLOCK_M)
    return full_end, end


@triton.jit
def visible(offs_m, offs_n, seq_k, CAUSAL: tl.constexpr):
    """The (row, key) pairs a masked block keeps: keys inside seq_k, and j <= i when causal."""
    keep = offs_n[None, :] < seq_k
    if CAUSAL:
        keep = keep & (offs_n[None, :] <= offs_m[:, None])
    return keep


@triton.jit
def query_block(pid, seq_q, heads_q, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """(start_m, batch, head) of program `pid` on a 1-D grid, query blocks fastest: a head's
    blocks run together (its K and V stay in L2), and so do the heads of one GQA group. Causal
    programs take the last (longest) query blocks first, so the short ones fill the tail."""
    blocks = tl.cdiv(seq_q, BLOCK_M)
    block = pid % blocks
    if CAUSAL:
        block = blocks - 1 - block
    bh = pid // blocks
    return block * BLOCK_M, (bh // heads_q).to(tl.int64), bh % heads_q


@triton.jit
def _softmax_step(acc, l_i, m_i, qk, v, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of the online softmax: qk is the block's scores in log2 units (masked
    entries -inf), v its values. A new row max rescales what was summed so far."""
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.math.exp2(qk - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)  # 0 on a row's first block (m_i = -inf)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = fp32_dot(p.to(v.dtype), v, acc * alpha[:, None], UPCAST, PRECISION)
    return acc, l_i, m_new


# ---------------------------------------------------------------------------------------------
# The pointer kernel
# ---------------------------------------------------------------------------------------------
@triton.jit
def key_block(q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd, offs_n, offs_d,
              seq_k, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASKED: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """(k, v, q·k^T·qk_scale) of the keys offs_n through pointers (zero past seq_k when MASKED),
    for a program that holds its query block q: the forward's and the dq pass's step."""
    k = load_block(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, offs_n,
                   seq_k, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # fmt: skip
    v = load_block(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, offs_n,
                   seq_k, offs_d, HEAD_DIM, BLOCK_D, MASKED)  # fmt: skip
    return k, v, fp32_dot(q, tl.trans(k), None, UPCAST, PRECISION) * qk_scale


@triton.jit
def _attend_pointers(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd, stride_vn,
                     stride_vd, offs_m, offs_d, lo, hi, seq_k, qk_scale, HEAD_DIM: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
                     CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
                     PRECISION: tl.constexpr):  # fmt: skip
    """Key blocks [lo, hi) through pointers; MASKED: the blocks that need `visible`."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        k, v, qk = key_block(q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                             offs_n, offs_d, seq_k, qk_scale, HEAD_DIM, BLOCK_D, MASKED, UPCAST,
                             PRECISION)  # fmt: skip
        if MASKED:
            qk = tl.where(visible(offs_m, offs_n, seq_k, CAUSAL), qk, float("-inf"))
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, qk, v, UPCAST, PRECISION)
    return acc, l_i, m_i


@triton.autotune(configs=forward_configs(), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune_forward(tma=False)})  # fmt: skip
@triton.jit
def attention_fwd_kernel(
    # pointers: inputs (B, H, S, D) of any strides, output, log-sum-exp (B, Hq, Sq) fp32 (log2)
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    # sizes: q heads, q heads per kv head (GQA), sequence lengths, the tuner's key
    heads_q, group, seq_q, seq_k, seq_q_pow2, seq_k_pow2,
    # strides in elements: (batch, head, seq, head dim) of q, k, v (Triton specializes a stride
    # of 1); (batch, head, seq) of the output, whose head dim is contiguous
    stride_qb, stride_qh, stride_qm, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om,
    # scale·log2(e)
    qk_scale,
    # meta-parameters: head dim and its power-of-2 block, the mask, the interpreter's dot
    # upcast, dot precision, tile
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # ---- program-id mapping ----
    start_m, b, h = query_block(tl.program_id(0), seq_q, heads_q, BLOCK_M, CAUSAL)
    hk = h // group

    # ---- pointer setup: this block's q stays on chip ----
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = q_ptr + b * stride_qb + h * stride_qh
    k_base = k_ptr + b * stride_kb + hk * stride_kh
    v_base = v_ptr + b * stride_vb + hk * stride_vh
    q = load_block(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd, offs_m,
                   seq_q, offs_d, HEAD_DIM, BLOCK_D, True)  # fmt: skip

    # ---- main loop: the whole key blocks, then the masked ones ----
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    full_end, end = key_ranges(start_m, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    acc, l_i, m_i = _attend_pointers(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                     stride_vn, stride_vd, offs_m, offs_d, 0, full_end, seq_k,
                                     qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, False, CAUSAL, UPCAST,
                                     PRECISION)  # fmt: skip
    acc, l_i, m_i = _attend_pointers(acc, l_i, m_i, q, k_base, v_base, stride_kn, stride_kd,
                                     stride_vn, stride_vd, offs_m, offs_d, full_end, end, seq_k,
                                     qk_scale, HEAD_DIM, BLOCK_N, BLOCK_D, True, CAUSAL, UPCAST,
                                     PRECISION)  # fmt: skip

    # ---- write-back: O = acc / l, lse = m + log2(l) ----
    ok = (offs_m[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    o_ptrs = o_ptr + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :]
    tl.store(o_ptrs, (acc / l_i[:, None]).to(o_ptr.dtype.element_ty), mask=ok)
    lse_ptrs = lse_ptr + (b * heads_q + h) * seq_q + offs_m
    tl.store(lse_ptrs, m_i + tl.math.log2(l_i), mask=offs_m < seq_q)


# ---------------------------------------------------------------------------------------------
# The TMA kernel (Hopper)
# ---------------------------------------------------------------------------------------------
@triton.jit
def _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, lo, hi, seq_k, qk_scale,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                UPCAST: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """Key blocks [lo, hi) through descriptors (TMA zero-fills the rows past seq_k)."""
    for start_n in range(lo, hi, BLOCK_N):
        k = k_desc.load([start_n, 0])
        v = v_desc.load([start_n, 0])
        qk = fp32_dot(q, tl.trans(k), None, UPCAST, PRECISION) * qk_scale
        if MASKED:
            offs_n = start_n + tl.arange(0, BLOCK_N)
            qk = tl.where(visible(offs_m, offs_n, seq_k, CAUSAL), qk, float("-inf"))
        acc, l_i, m_i = _softmax_step(acc, l_i, m_i, qk, v, UPCAST, PRECISION)
    return acc, l_i, m_i


@triton.jit
def _head_desc(base, rows, stride, BLOCK_ROWS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """One head's (rows, HEAD_DIM) slice as a TMA descriptor of (BLOCK_ROWS, HEAD_DIM) blocks."""
    return tl.make_tensor_descriptor(base, shape=[rows, HEAD_DIM], strides=[stride, 1],
                                     block_shape=[BLOCK_ROWS, HEAD_DIM])  # fmt: skip


@triton.autotune(configs=forward_configs(), key=TUNE_KEY,
                 prune_configs_by={"early_config_prune": prune_forward(tma=True)})  # fmt: skip
@triton.jit
def attention_fwd_tma_kernel(
    # pointers and sizes as attention_fwd_kernel's
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    heads_q, group, seq_q, seq_k, seq_q_pow2, seq_k_pow2,
    # strides (batch, head, seq) of q, k, v, o: each head dim contiguous, these strides and the
    # bases 16-byte aligned (TMA's rules; the wrapper checks them)
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    qk_scale,
    # meta-parameters: as attention_fwd_kernel's (HEAD_DIM a power of 2, so no BLOCK_D)
    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # ---- program-id mapping ----
    start_m, b, h = query_block(tl.program_id(0), seq_q, heads_q, BLOCK_M, CAUSAL)
    hk = h // group

    # ---- descriptors: one per (batch, head) slice, clipped at its sequence end ----
    q_desc = _head_desc(q_ptr + b * stride_qb + h * stride_qh, seq_q, stride_qm, BLOCK_M,
                        HEAD_DIM)  # fmt: skip
    k_desc = _head_desc(k_ptr + b * stride_kb + hk * stride_kh, seq_k, stride_kn, BLOCK_N,
                        HEAD_DIM)  # fmt: skip
    v_desc = _head_desc(v_ptr + b * stride_vb + hk * stride_vh, seq_k, stride_vn, BLOCK_N,
                        HEAD_DIM)  # fmt: skip
    o_desc = _head_desc(o_ptr + b * stride_ob + h * stride_oh, seq_q, stride_om, BLOCK_M,
                        HEAD_DIM)  # fmt: skip
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = q_desc.load([start_m, 0])

    # ---- main loop ----
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, HEAD_DIM), tl.float32)
    full_end, end = key_ranges(start_m, seq_k, BLOCK_M, BLOCK_N, CAUSAL)
    # the whole key blocks, then the masked ones
    acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, 0, full_end, seq_k,
                                qk_scale, BLOCK_N, False, CAUSAL, UPCAST, PRECISION)  # fmt: skip
    acc, l_i, m_i = _attend_tma(acc, l_i, m_i, q, k_desc, v_desc, offs_m, full_end, end, seq_k,
                                qk_scale, BLOCK_N, True, CAUSAL, UPCAST, PRECISION)  # fmt: skip

    # ---- write-back: TMA clips the rows past seq_q ----
    o_desc.store([start_m, 0], (acc / l_i[:, None]).to(o_ptr.dtype.element_ty))
    lse_ptrs = lse_ptr + (b * heads_q + h) * seq_q + offs_m
    tl.store(lse_ptrs, m_i + tl.math.log2(l_i), mask=offs_m < seq_q)
