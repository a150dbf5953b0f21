"""The GEMM's dispatch and public wrappers: which kernel a call takes, and the launch.

    Hopper (capability 9.x and up), operands TMA can read (tma.tma_layout):
        16-bit, direct -> matmul_tma_host_desc_kernel on heuristic_tile's tile; past SKINNY_M
                  rows split_plan's tile and K decomposition (split-K or stream-K where the
                  tiles leave SMs idle; the shared tiles summed in the same launch)
        16-bit, traced by torch.compile (kernels/ops.py passes launch=torch.library.wrap_triton,
                  whose tracing cannot carry a host descriptor)
               -> matmul_tma_device_desc_kernel on the same tile, not autotuned; a host-bound
                  GEMM (more than SKINNY_M rows, under TRACED_TMA_FLOPS, no K split) takes the
                  pointer kernel, which Inductor's static launcher can launch
        fp32, direct -> matmul_tma_device_desc_kernel, autotuned; with TF32 a wrong-way operand
                  is copied K-major first (wgmma takes tf32 operands K-major only), and skinny
                  TF32 shapes take the pointer kernel instead
    everything else -> matmul_kernel (pointer loads), split over K for skinny shapes
                  (splitk.auto_split_k) with splitk_reduce_kernel adding the slices: other GPUs,
                  the interpreter, operands TMA cannot read, K = 0, and traced fp32 launches
Evidence for each choice: docs/kernels/matmul.md, "Shipped design".

A batched b (torch.matmul's broadcast batch, direct calls only) is one launch over every matrix
of the (batch, M, K) and (batch, K, N) views kernels/matmul/batched.py makes:
    Hopper, 16-bit, each matrix TMA-readable and batch strides 0 or 16-byte aligned
        -> matmul_tma_host_desc_kernel, batched (tiles x batch in its persistent loop; 3-D
           descriptors, a broadcast operand's 2-D); heuristic_tile counts every matrix's tiles
    everything else -> matmul_kernel, batched (grid axis 0 is batch x tiles), never split over
                  K: fp32 too (the device-descriptor kernel stays 2-D), other GPUs, the
                  interpreter, unaligned batch strides, K = 0
A b whose batch dims are all 1 is a 2-D b (a's batch folds into M, as matmul_nd does), and so
is a batch of one matrix. kernels/ops.py's custom op takes a batched b through matmul_batched
with its launcher (the pointer kernel, traced); matmul_nd refuses a batched b for any
matmul_2d but matmul_impl.

Functions:
    matmul_reference(a, b) -> c
        torch's a @ b, for tests and benchmarks.
    check_matmul_args(a, b)
        The TypeError/ValueError checks matmul_impl runs.
    device_info(device) -> (has TMA, SM count)
    plan(a, b, launch=direct) -> Plan(kernel, split_k, tile)
        The choice above, by capability, layout, dtype and shape (never the GPU's name).
    planned(a, b, bias, act_id, save_preact) -> the plan fused_matmul made for that key, or None
    launch_constexprs(dtype, has_bias, act_id, save_preact) -> dict
        The epilogue and precision constexprs of a GEMM launch.
    run_plan(p, a, b, bias, save_preact, layout) -> (c, z | None): a plan on tensors at its
        pointers (copies_operands(p) false)
    fused_matmul(a, b, bias=None, act_id=0, save_preact=False, *, launch=direct) -> (c, z | None)
        c = act(a @ b + bias) and, when save_preact, the pre-activation z (linear's backward
        needs it); no input checks. Used by matmul, kernels.linear and kernels.conv.
    activation_pass(M, act_id, save_preact, split_k) -> bool
        Whether the GEMM stores z alone and act(z) runs as a pass of its own (training calls
        of at least ACTIVATION_PASS_MIN_M rows with an activation other than relu).
    matmul_impl(a, b, *, launch=direct) -> c
        Checks the inputs, then fused_matmul; what kernels/ops.py's custom op calls.
    batched_plan(a, b) -> Plan(kernel, 1, tile)
        The batched choice above for (batch, M, K) and (batch, K, N) operands.
    matmul_batched(a, b) -> c
        torch.matmul with b of 3+ dims, broadcasting the batch dims; one launch, a plan per key.
    matmul(a, b) -> c
        Public: torch.matmul of any operands of 1+ dims, broadcasting batch dims. fp16/bf16/fp32
        in, same dtype out, fp32 accumulation.
    matmul_nd(a, b, matmul_2d) -> c
        The 1-D and batched-a cases through a 2-D matmul_2d (kernels/ops.py's custom op).
"""

import math
from typing import NamedTuple

import torch

from kernels._common import (
    ACTIVATIONS,
    as_rows,
    cdiv,
    check_same,
    check_tensor,
    direct,
    dot_precision,
    gpu_info,
    is_interpreter,
    tile_counters,
)
from kernels._launch import PlanCache, Step
from kernels.matmul.batched import batched_views, check_batched_args
from kernels.matmul.epilogue import activation_pass_kernel
from kernels.matmul.pointer import SKINNY_M, matmul_kernel
from kernels.matmul.splitk import auto_split_k, splitk_reduce_step
from kernels.matmul.tma import (
    Tile,
    device_desc_step,
    heuristic_tile,
    host_desc_step,
    set_scratch_allocator,
    split_k_scratch,
    split_plan,
    tma_batch_layout,
    tma_layout,
)

# Where no GPU says otherwise (pre-Hopper GPUs, the interpreter), split-K sizes its slices for
# this many SMs (an H100's).
DEFAULT_SMS = 132


def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # 2·M·N·K FLOPs; reads (M·K + K·N)·bytes and writes M·N·bytes, so it is compute-bound
    # once M, N and K are all more than a few hundred.
    return a @ b


def check_matmul_args(a, b) -> None:
    check_tensor("a", a, ndim=2)
    check_tensor("b", b, ndim=2)
    check_same({"a": a, "b": b})
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"inner dims differ: a has shape {tuple(a.shape)} and b has shape {tuple(b.shape)}; "
            "need a (M, K) and b (K, N)"
        )


def device_info(device: torch.device) -> tuple[bool, int]:
    """(has TMA, SM count): capability >= 9.0 (kernels._common.gpu_info), never the GPU's name;
    (False, 1) where no GPU runs the kernels."""
    info = gpu_info(device)
    if info is None:
        return False, 1
    return info.capability >= (9, 0), info.sms


class Plan(NamedTuple):
    kernel: str  # "tma_host_desc", "tma_device_desc" or "pointer"
    split_k: int  # K slices of the pointer or host-descriptor kernel (1: none; tma.STREAM_K)
    tile: Tile | None  # the host-descriptor kernel's tile


def plan(a: torch.Tensor, b: torch.Tensor, launch=direct) -> Plan:
    """The kernel, K split and tile for a @ b (see the module docstring)."""
    has_tma, num_sms = device_info(a.device)
    M, K = a.shape
    N = b.shape[1]
    if K == 0:  # an empty sum, the epilogue of zeros; TMA cannot describe an empty operand
        return Plan("pointer", 1, None)
    tf32 = dot_precision(a.dtype, torch.backends.cuda.matmul.allow_tf32) == "tf32"
    if has_tma and tma_layout(a) and tma_layout(b) and not (tf32 and M <= SKINNY_M):
        if a.dtype in (torch.float16, torch.bfloat16):
            if launch is direct:
                if M > SKINNY_M:  # split-K or stream-K where it pays (tma.split_plan)
                    tile, split_k = split_plan(M, N, K, num_sms)
                    return Plan("tma_host_desc", split_k, tile)
                return Plan("tma_host_desc", 1, heuristic_tile(M, N, K, num_sms))
            tile = heuristic_tile(M, N, K, num_sms)
            if M > SKINNY_M and 2 * M * N * K < TRACED_TMA_FLOPS:
                split_k = auto_split_k(M, N, K, num_sms)
                if split_k == 1:  # host-bound: one launch through Inductor's static launcher
                    return Plan("pointer", 1, None)
            # traced (kernels/ops.py): a host descriptor cannot pass through torch.library's
            # tracing, so the same tile builds its descriptors on the device
            return Plan("tma_device_desc", 1, tile)
        if launch is not direct:
            return Plan("pointer", auto_split_k(M, N, K, num_sms), None)
        return Plan("tma_device_desc", 1, None)
    return Plan("pointer", auto_split_k(M, N, K, num_sms if has_tma else DEFAULT_SMS), None)


# Traced 16-bit launches (kernels/ops.py) build their TMA descriptors on the device, which needs
# a global scratch buffer that Inductor's static launcher cannot give: Triton's Python launcher
# takes them, about 14 us more a call on an H100 (docs/kernels/host_path.md). Below this many
# FLOPs a GEMM of more than SKINNY_M rows is host-bound, and the pointer kernel, in one launch
# through the static launcher, is the faster call.
TRACED_TMA_FLOPS = 2**35


class _Launches(NamedTuple):
    """A direct call's plan (_PLANS): what fused_matmul decided for its key, as Steps."""

    kernel: str
    split_k: int
    steps: tuple  # kernels._launch.Step, in launch order
    shape: tuple  # the output's (M, N), row-major
    strides: tuple
    copy_b: bool  # tf32 device-descriptor: B copied K-major first
    copy_a: bool  # ... and A made row-major
    act_pass: bool = False  # the GEMM stores z alone; the last step is act(z) (activation_pass)
    scratch: tuple = (0, 0)  # a split host-descriptor launch's (workspace numel, counters)


# Direct calls' plans by _plan_key; see kernels/_launch.py
_PLANS = PlanCache()
# torch.backends.cuda.matmul.allow_tf32, read without the module's __getattr__ (a tenth of the time)
_cublas_tf32 = torch._C._get_cublas_allow_tf32


def _plan_key(a, b, bias, act_id, save_preact) -> tuple:
    """Everything a direct call's launches (and its argument checks) depend on but the tensors'
    pointers: shapes, strides, dtypes, devices (kernels._common.pretend_gpu empties the plans,
    so the GPU dispatch sees is a function of the device), the start alignments (TMA's and
    Triton's pointer specialization), the epilogue flags and torch's TF32 switch. Raises
    AttributeError or TypeError where a or b is no tensor."""
    return (
        a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.device, b.device,
        a.data_ptr() % 16, b.data_ptr() % 16,
        (a.storage_offset() * a.element_size()) % 16, (b.storage_offset() * b.element_size()) % 16,
        None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device,
                                   bias.data_ptr() % 16),
        act_id, save_preact, _cublas_tf32(),
    )  # fmt: skip


def _cached(a, b, bias, act_id, save_preact) -> _Launches | None:
    """The plan of a direct call whose key was planned before, or None. A planned key passed
    every argument check (each is a function of the key), so a hit needs none."""
    if torch.compiler.is_compiling():
        return None
    try:
        key = _plan_key(a, b, bias, act_id, save_preact)
    except (AttributeError, TypeError):
        return None  # not tensors: the checks say what is wrong
    return _PLANS.get(key)


# A training GEMM that keeps z = a @ b + bias for linear's backward (save_preact) and has an
# activation other than relu, with at least ACTIVATION_PASS_MIN_M rows, stores z alone and runs
# act(z) as a pass of its own (epilogue.activation_pass_kernel). The fused epilogue stores two
# outputs and evaluates the activation with the tensor cores idle (the persistent kernel has no
# warp specialization to hide it): on an H100, Llama-3-8B's up projection at 2048 tokens took
# 382 us fused against 310 + 43 unfused, where cuBLAS with compile's gelu pass took 306 + 47
# (docs/kernels/matmul.md, "The activation pass"). Below the threshold the GEMM is bound by the
# weight's bytes and the fused epilogue costs little; relu costs nothing to fuse.
ACTIVATION_PASS_MIN_M = 1024
ACTIVATION_PASS_BLOCK = 4096  # elements a program: 8 KB of 16-bit z, 16-byte vectors a thread


def activation_pass(M: int, act_id: int, save_preact: bool, split_k: int) -> bool:
    """Whether a GEMM with these rows and epilogue runs its activation as a pass of its own
    (see ACTIVATION_PASS_MIN_M); never under a K split, whose reduce kernel runs the epilogue."""
    return (save_preact and split_k == 1 and M >= ACTIVATION_PASS_MIN_M
            and act_id not in (ACTIVATIONS["none"], ACTIVATIONS["relu"]))  # fmt: skip


def _activation_step(M: int, N: int, act_id: int, launch) -> Step:
    """c = act(z) over the M·N row-major elements, launched on (z, c)."""
    grid = (cdiv(M * N, ACTIVATION_PASS_BLOCK),)
    return Step(launch(activation_pass_kernel), grid, (M * N,),
                dict(ACTIVATION=act_id, BLOCK=ACTIVATION_PASS_BLOCK, num_warps=4))  # fmt: skip


def launch_constexprs(dtype, has_bias: bool, act_id: int, save_preact: bool) -> dict:
    """The epilogue and precision constexprs every GEMM kernel takes, for operands of `dtype`
    under torch's TF32 switch (the interpreter's bf16 dots upcast to fp32 first)."""
    return dict(
        HAS_BIAS=has_bias,
        ACTIVATION=act_id,
        STORE_PREACT=save_preact,
        INPUT_PRECISION=dot_precision(dtype, torch.backends.cuda.matmul.allow_tf32),
        UPCAST_TO_FP32=is_interpreter() and dtype == torch.bfloat16,
    )


def _build(a, b, c, bias, preact, act_id, save_preact, launch) -> _Launches:
    """The launches of c = act(a @ b + bias) (see the module docstring), as Steps."""
    M, K = a.shape
    N = b.shape[1]
    kernel, split_k, tile = plan(a, b, launch)
    if activation_pass(M, act_id, save_preact, split_k):
        gemm = _build(a, b, preact, bias, None, ACTIVATIONS["none"], False, launch)
        steps = (*gemm.steps, _activation_step(M, N, act_id, launch))
        return gemm._replace(steps=steps, act_pass=True)
    common = launch_constexprs(a.dtype, bias is not None, act_id, save_preact)
    sms = device_info(a.device)[1]
    if kernel == "tma_host_desc":
        step = host_desc_step(a, b, c, bias, preact, tile, common, sms, split_k)
        return _Launches(kernel, split_k, (step,), (M, N), (N, 1), False, False,
                         scratch=split_k_scratch(M, N, K, tile, split_k, sms))  # fmt: skip
    if kernel == "tma_device_desc":
        copy_b = copy_a = False
        if common["INPUT_PRECISION"] == "tf32":
            # wgmma takes tf32 operands K-major only: a row-major B or column-major A would run
            # on a slow fallback (docs/kernels/matmul.md, "Design"), so copy it the right way.
            copy_b = not tma_layout(b)[0]
            copy_a = bool(tma_layout(a)[0])
            a, b = _k_major(a, b, copy_a, copy_b)
        if tma_layout(a) is not None and tma_layout(b) is not None:
            step = device_desc_step(a, b, c, bias, preact, common, sms, tile, launch)
            return _Launches(kernel, 1, (step,), (M, N), (N, 1), copy_b, copy_a)
        # the K-major copy's rows are not 16-byte aligned: the pointer kernel, unsplit
        kernel = "pointer"
    grid = lambda META: (cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"]), split_k)
    steps = [Step(
        launch(matmul_kernel), grid,
        (M, N, K, split_k,
         a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
         bias.stride(0) if bias is not None else 0),
        dict(SPLIT=split_k > 1, **common),
    )]  # fmt: skip
    if split_k > 1:
        steps.append(splitk_reduce_step(split_k, M, N, bias, preact, act_id, launch))
    return _Launches(kernel, split_k, tuple(steps), (M, N), (N, 1), False, False)


def _k_major(a, b, copy_a: bool, copy_b: bool):
    if copy_b:
        b = b.t().contiguous().t()
    if copy_a:
        a = a.contiguous()
    return a, b


def _run(p: _Launches, a, b, c, bias, preact) -> None:
    """Launch a plan's steps on this call's tensors."""
    if p.act_pass:  # the GEMM writes z into preact, then c = act(z)
        _run_gemm(p, a, b, preact, bias, None)
        p.steps[-1](preact, c)
    else:
        _run_gemm(p, a, b, c, bias, preact)


def _run_gemm(p: _Launches, a, b, c, bias, preact) -> None:
    if p.kernel == "tma_host_desc":
        if p.split_k != 1:  # split-K or stream-K
            workspace = torch.empty(p.scratch[0], device=a.device, dtype=torch.float32)
            p.steps[0](a, b, c, bias, preact, workspace, tile_counters(a.device, p.scratch[1]))
        else:
            p.steps[0](a, b, c, bias, preact)
        return
    if p.kernel == "tma_device_desc":
        a, b = _k_major(a, b, p.copy_a, p.copy_b)
        set_scratch_allocator()
        p.steps[0](a, b, c, bias, preact)
        return
    partial = None
    if p.split_k > 1:
        partial = torch.empty((p.split_k, *p.shape), device=a.device, dtype=torch.float32)
    p.steps[0](a, b, c, bias, preact, partial)
    if p.split_k > 1:
        p.steps[1](partial, c, bias, preact)


def fused_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None = None,
    act_id: int = ACTIVATIONS["none"],
    save_preact: bool = False,
    *,
    launch=direct,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """c = act(a @ b + bias) as a new contiguous (M, N) tensor of a's dtype (or into `out`, a
    contiguous (M, N) tensor of a's dtype and device), plus the pre-activation z when
    save_preact. Callers check the inputs (check_matmul_args). Direct calls keep their plan per
    _plan_key (kernels/_launch.py); traced ones (launch=wrap_triton) plan every call, so
    torch.compile sees each kernel[grid] launch."""
    p = _cached(a, b, bias, act_id, save_preact) if launch is direct else None
    if p is not None:
        c = a.new_empty_strided(p.shape, p.strides) if out is None else out
        preact = a.new_empty_strided(p.shape, p.strides) if save_preact else None
        _run(p, a, b, c, bias, preact)
        return c, preact
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=a.dtype) if out is None else out
    preact = torch.empty_like(c) if save_preact else None
    if c.numel() == 0:  # an empty grid is an error on some launch paths; nothing to write anyway
        return c, preact
    p = _build(a, b, c, bias, preact, act_id, save_preact, launch)
    if launch is direct and not torch.compiler.is_compiling():
        _PLANS.put(_plan_key(a, b, bias, act_id, save_preact), p)
    _run(p, a, b, c, bias, preact)
    return c, preact


def planned(a, b, bias=None, act_id: int = ACTIVATIONS["none"], save_preact: bool = False):
    """The plan a direct fused_matmul(a, b, bias, act_id, save_preact) made for this key, or
    None: for wrappers (kernels.linear) that keep it under a key of their own."""
    return _cached(a, b, bias, act_id, save_preact)


def copies_operands(p: _Launches) -> bool:
    """Whether plan p copies an operand before its launch (tf32 K-major copies): run_plan then
    needs the operands themselves, not tensors at their pointers."""
    return p.copy_a or p.copy_b


def run_plan(p: _Launches, a, b, bias, save_preact: bool, layout: tuple | None = None, out=None):
    """(c, preact | None) of plan p, where a and b may be any tensors at the planned operands'
    data pointers (a view's base, say): the launches read pointers only, the plan holding the
    strides. `layout` (shape, strides): c allocated so, as long as it is the row-major (M, N)
    memory (say (B, T, N) for M = B·T). out: c's memory, allocated by the caller in that
    layout (a graphed backward allocates its outputs before its launches). Callers check
    `copies_operands` first."""
    c = a.new_empty_strided(*(layout or (p.shape, p.strides))) if out is None else out
    preact = a.new_empty_strided(p.shape, p.strides) if save_preact else None
    _run(p, a, b, c, bias, preact)
    return c, preact


def matmul_impl(a: torch.Tensor, b: torch.Tensor, *, launch=direct) -> torch.Tensor:
    """matmul with the launcher kernels/ops.py passes (torch.library.wrap_triton). A direct
    call with a planned key launches its plan at once (_cached): no checks, no planning."""
    p = _cached(a, b, None, 0, False) if launch is direct else None
    if p is not None:
        c = a.new_empty_strided(p.shape, p.strides)
        _run(p, a, b, c, None, None)
        return c
    check_matmul_args(a, b)
    return fused_matmul(a, b, launch=launch)[0]


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch.matmul(a, b) of one dtype (fp16, bf16 or fp32), any strides: 2-D a (M, K) and b
    (K, N); 1-D operands as torch treats them (a vector product); a batched a (..., M, K) with a
    2-D b, its rows folded into one GEMM (read in place where the batch dims merge with M); a
    batched b (..., K, N), the batch dims broadcast as torch does, in one launch
    (matmul_batched). Differentiable: both gradients are this matmul (matmul_grads)."""
    if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (a, b)):
        return _trainable(a, b)
    return _matmul_any(a, b)


def _matmul_any(a, b):
    tensors = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    if tensors and b.dim() > 2:
        return matmul_batched(a, b)
    if tensors and (a.dim() != 2 or b.dim() != 2):
        return matmul_nd(a, b, matmul_impl)
    return matmul_impl(a, b)


def matmul_grads(a, b, dc, mm, need_a: bool, need_b: bool):
    """(dA, dB) of c = a @ b for operands of 2+ dims (batch dims broadcast as torch.matmul's),
    each through `mm` (a matmul taking what torch.matmul takes, or kernels/ops.py's op), None
    unless asked for. dA = dC @ B^T and dB = A^T @ dC, summed over the batch dims an operand was
    broadcast along; a 2-D b's dB is one GEMM over every batch row of a (no sum afterwards)."""
    da = db = None
    if need_a:
        da = mm(dc, b.transpose(-2, -1))
        da = da if da.shape == a.shape else da.sum_to_size(a.shape)
    if need_b:
        if b.dim() == 2:
            db = mm(as_rows(a).t(), as_rows(dc))
        else:
            db = mm(a.transpose(-2, -1), dc)
            db = db if db.shape == b.shape else db.sum_to_size(b.shape)
    return da, db


class _MatmulFunction(torch.autograd.Function):
    """Autograd for operands of 2+ dims; `matmul` routes here when one needs a gradient."""

    @staticmethod
    def forward(ctx, a, b):
        need_a, need_b = ctx.needs_input_grad[:2]
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return _matmul_any(a, b)

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        return matmul_grads(a, b, dc, _matmul_any, *ctx.needs_input_grad[:2])


def _trainable(a, b):
    """matmul through _MatmulFunction; a 1-D operand is a one-row (one-column) matrix whose
    added dim leaves the result, as in torch.matmul."""
    check_tensor("a", a)
    check_tensor("b", b)
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(f"matmul needs operands of at least 1 dim, got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")  # fmt: skip
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(1) if b.dim() == 1 else b
    c = _MatmulFunction.apply(a2, b2)
    if b.dim() == 1:
        c = c.squeeze(-1)
    if a.dim() == 1:
        c = c.squeeze(-2 if b.dim() > 1 else -1)
    return c


def matmul_nd(a: torch.Tensor, b: torch.Tensor, matmul_2d) -> torch.Tensor:
    """torch.matmul's 1-D and batched-a cases through a 2-D matmul_2d (kernels/ops.py passes
    its custom op): a 1-D a is one row, a 1-D b one column (both dropped from the result), a
    batched a's leading dims fold into M. A batched b has no single GEMM to fold into: with
    matmul_impl it takes matmul_batched's one launch; any other matmul_2d (the custom op is
    2-D) refuses it with one error naming it."""
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(f"matmul needs operands of at least 1 dim, got shapes {tuple(a.shape)} "
                         f"and {tuple(b.shape)}")  # fmt: skip
    if b.dim() > 2:
        if matmul_2d is matmul_impl:
            return matmul_batched(a, b)
        raise ValueError(f"b has shape {tuple(b.shape)}: a batched b is not supported; b must be "
                         "1-D (K,) or 2-D (K, N)")  # fmt: skip
    if a.shape[-1] != b.shape[0]:
        raise ValueError(f"inner dims differ: a has shape {tuple(a.shape)} and b has shape "
                         f"{tuple(b.shape)}")  # fmt: skip
    a2 = as_rows(a)  # a view where the batch dims merge with M; 1-D: one row
    b2 = b if b.dim() == 2 else b.unsqueeze(1)
    c = matmul_2d(a2, b2)
    return c.reshape((*a.shape[:-1], *b.shape[1:]))  # () for a dot: a 0-d result


# ---------------------------------------------------------------------------------------------
# Batched b: one launch over the broadcast batch
# ---------------------------------------------------------------------------------------------
def batched_plan(a: torch.Tensor, b: torch.Tensor, launch=direct) -> Plan:
    """The kernel and tile for (batch, M, K) @ (batch, K, N) views (see the module docstring):
    the host-descriptor kernel where plan() would take it for one matrix (16-bit, a direct
    launch) and TMA can read every matrix, else the pointer kernel, unsplit."""
    if launch is not direct:  # traced (kernels/ops.py): the pointer kernel, as plan() takes
        return Plan("pointer", 1, None)
    has_tma, num_sms = device_info(a.device)
    batch, M, K = a.shape
    N = b.shape[2]
    tma = has_tma and K > 0 and tma_batch_layout(a) and tma_batch_layout(b)
    if tma and a.dtype in (torch.float16, torch.bfloat16):
        return Plan("tma_host_desc", 1, heuristic_tile(M, N, K, num_sms, batch))
    return Plan("pointer", 1, None)


class _BatchedLaunches(NamedTuple):
    """A batched call's plan (_PLANS): the launches over its views, c's shape, and whether the
    views copy an operand (then they are made again each call; else the launches read the
    operands' own pointers, which the views share)."""

    launches: _Launches
    shape: tuple  # torch.matmul's result shape, contiguous
    copied: bool


def _build_batched(a, b, c, launch=direct) -> _Launches:
    """The one launch of c = a @ b over (batch, M, K), (batch, K, N) and a contiguous
    (batch, M, N) c, as a Step."""
    batch, M, K = a.shape
    N = b.shape[2]
    kernel, _, tile = batched_plan(a, b, launch)
    common = launch_constexprs(a.dtype, False, ACTIVATIONS["none"], False)
    if kernel == "tma_host_desc":
        step = host_desc_step(a, b, c, None, None, tile, common, device_info(a.device)[1])
    else:
        grid = lambda META: (cdiv(M, META["BLOCK_M"]) * cdiv(N, META["BLOCK_N"]) * batch, 1)
        step = Step(
            launch(matmul_kernel), grid,
            (M, N, K, 1,
             a.stride(1), a.stride(2), b.stride(1), b.stride(2), c.stride(1), c.stride(2), 0),
            dict(SPLIT=False, **common, batch=batch, stride_ab=a.stride(0),
                 stride_bb=b.stride(0), stride_cb=c.stride(0), BATCHED=True),
        )  # fmt: skip
    return _Launches(kernel, 1, (step,), tuple(c.shape), tuple(c.stride()), False, False)


def matmul_batched(a: torch.Tensor, b: torch.Tensor, *, launch=direct) -> torch.Tensor:
    """torch.matmul(a, b) for b of 3+ dims and a of 1+ (see the module docstring): one launch
    over the broadcast batch. A direct call keeps its plan per call key (_plan_key: every shape
    and stride), so a repeated call checks and plans nothing; a traced one (kernels/ops.py's
    custom op, launch=wrap_triton) plans every call and runs the pointer kernel."""
    key = None
    if launch is direct and not torch.compiler.is_compiling():
        try:
            key = ("batched", *_plan_key(a, b, None, ACTIVATIONS["none"], False))
        except (AttributeError, TypeError):
            pass  # not tensors: the checks say what is wrong
    p = None if key is None else _PLANS.get(key)
    if p is not None:
        if p.copied:
            views = batched_views(a, b)
            a, b = views.a, views.b
        c = torch.empty(p.shape, device=a.device, dtype=a.dtype)
        _run(p.launches, a, b, c, None, None)
        return c
    check_batched_args(a, b)
    if math.prod(b.shape[:-2]) == 1:  # one matrix of b: a 2-D b, in torch's result shape
        batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        c = matmul_nd(a, b.reshape(b.shape[-2:]), lambda x, y: matmul_impl(x, y, launch=launch))
        return c.reshape(*batch, *a.shape[-2:-1], b.shape[-1])  # a 1-D a has no M
    views = batched_views(a, b)
    c = torch.empty(views.shape, device=a.device, dtype=a.dtype)
    if c.numel() == 0:
        return c
    c3 = c.view(views.a.shape[0], views.a.shape[1], views.b.shape[2])
    p = _BatchedLaunches(_build_batched(views.a, views.b, c3, launch), views.shape,
                         views.copied)  # fmt: skip
    if key is not None:
        _PLANS.put(key, p)
    _run(p.launches, views.a, views.b, c3, None, None)
    return c
