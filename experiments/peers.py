"""Peer Triton libraries as modes: mode=flaggems, mode=liger, mode=quack (docs/peers.md).

Each library is one `Peer`: its package, and for each op function the workloads call (matmul,
linear, softmax, conv2d) whether it has a kernel, what it cannot take, and a builder of the
callable with the eager function's signature (experiments/single_ops.py). The harness runs the
same module over the same parameters with these callables in place of ours, as for every mode.

Two kinds of mode (experiments/modes.py):
    peer         the library as its docs call it: its functional API, with autograd
    peer_direct  its compiled kernel launched directly, fwd only, where its Python wrapper adds
                 cost: `mode=liger-direct` (conf/mode/liger-direct.yaml). Both rows carry
                 call latency and GPU time, so the wrapper's share of the host path is the
                 difference of the two call latencies.

An op a library lacks, an argument it cannot take, a package that is not installed or a
library that cannot run on this device gives `skipped` rows with the reason
(experiments.registry.unsupported asks `unsupported` here) and one log line, never a traceback.

Functions:
    unsupported(mode_cfg, op)  why this job's mode cannot run op, or None
    namespace(mode_cfg)        the ops namespace of a peer mode (imports the library)
    check(mode_cfg)            ConfigError for a peer mode whose name names no library
    availability(peer, device) None where the library runs, else why not

    python -m experiments.peers   # each library: installed, importable, what it runs here
"""

import dataclasses
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from experiments.errors import ConfigError
from experiments.op_table import OPS

log = logging.getLogger(__name__)
KINDS = ("peer", "peer_direct")
DIRECT_SUFFIX = "-direct"


class PeerUnsupported(NotImplementedError):
    """A call with arguments the library cannot take (normally declared before the job runs)."""


@dataclass(frozen=True)
class JobFacts:
    """What a library's limits depend on: the job's kernel config, pass, dtype and device."""

    kernel: dict = field(default_factory=dict)
    pass_name: str = "fwd"
    dtype: str = "bf16"
    device: str = "cpu"
    block: str | None = None  # a composed op (experiments/blocks.py): its ops' own arguments


@dataclass(frozen=True)
class Peer:
    name: str  # mode=<name>, the records' `mode`
    package: str  # the pip name, pinned in requirements-peers.txt
    version: str
    module: str  # imported to use it
    # op function -> why a job's arguments are beyond the library, or None
    limits: dict[str, Callable[[JobFacts], str | None]]
    build: Callable[[], dict[str, Callable]]  # imports the library: {function: callable}
    direct: Callable[[], dict[str, Callable]] | None = None  # the kernels launched directly
    direct_ops: tuple[str, ...] = ()
    gpu_only: str | None = None  # why it cannot run on a CPU job; None: it runs in the interpreter
    cpu_limits: Callable[[JobFacts], str | None] | None = None  # what the interpreter gets wrong


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _last_dim_only(job: JobFacts) -> str | None:
    dim = job.kernel.get("dim", -1)  # the inputs are (m, n): -1 and 1 are the last dim
    return None if dim in (-1, 1) else f"softmax over dim {dim}: it reduces the last dim only"


def _no_limits(job: JobFacts) -> None:
    return None


def _require_last_dim(x: torch.Tensor, dim: int, package: str) -> None:
    if dim not in (-1, x.dim() - 1):
        raise PeerUnsupported(f"unsupported by {package}: softmax over dim {dim} (last dim only)")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as the (rows, n) matrix a row-wise kernel takes (a view of a contiguous x)."""
    return x.reshape(-1, x.shape[-1])


def _batched(mm: Callable, bmm: Callable) -> Callable:
    """matmul over any equal leading dims (attention's (batch, heads)) from a 2-D and a 3-D one."""

    def matmul(a, b):
        if a.dim() == 2:
            return mm(a, b)
        out = bmm(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
        return out.reshape(*a.shape[:-2], *out.shape[-2:])

    return matmul


# ---------------------------------------------------------------------------------------------
# flag-gems: aten-level op functions (what `flag_gems.use_gems()` registers for aten::mm,
# aten::addmm, ...), called directly: a global use_gems would reroute the eager baseline timed
# in the same process too. Its op functions carry no autograd (aten's derivative formulas call
# them), so the backward is those formulas over its own kernels: mm, sum, *_backward.
# ---------------------------------------------------------------------------------------------
def _flaggems_ops() -> dict[str, Callable]:
    import flag_gems as fg

    # name -> (forward, backward(dy, z, y)) as aten's derivatives of each activation
    activations = {
        "none": (lambda z: z, lambda dy, z, y: dy),
        "relu": (fg.relu, lambda dy, z, y: fg.threshold_backward(dy, y, 0)),
        "gelu": (fg.gelu, lambda dy, z, y: fg.gelu_backward(dy, z)),
        "gelu_tanh": (lambda z: fg.gelu(z, approximate="tanh"),
                      lambda dy, z, y: fg.gelu_backward(dy, z, approximate="tanh")),
        "silu": (fg.silu, lambda dy, z, y: fg.silu_backward(dy, z)),
    }  # fmt: skip

    def affine(x, weight, bias):
        return fg.mm(x, weight.t()) if bias is None else fg.addmm(bias, x, weight.t())

    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias, activation):
            z = affine(x, weight, bias)
            y = activations[activation][0](z)
            ctx.activation = activation
            ctx.save_for_backward(x, weight, z, y)
            return y

        @staticmethod
        def backward(ctx, dy):
            x, weight, z, y = ctx.saved_tensors
            dz = activations[ctx.activation][1](dy, z, y)
            dx = fg.mm(dz, weight) if ctx.needs_input_grad[0] else None
            dweight = fg.mm(dz.t(), x) if ctx.needs_input_grad[1] else None
            dbias = fg.sum_dim(dz, [0]) if ctx.needs_input_grad[2] else None
            return dx, dweight, dbias, None

    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dim):
            y = fg.softmax(x, dim, False)
            ctx.dim, ctx.input_dtype = dim, x.dtype
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, dy):
            (y,) = ctx.saved_tensors
            return fg.softmax_backward(dy, y, ctx.dim, ctx.input_dtype), None

    def linear(x, weight, bias=None, activation=None):
        activation = activation or "none"
        rows = x.reshape(-1, x.shape[-1])
        if _needs_grad(x, weight, bias):
            y = Linear.apply(rows, weight, bias, activation)
        else:
            y = activations[activation][0](affine(rows, weight, bias))
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def softmax(x, dim):
        return Softmax.apply(x, dim) if _needs_grad(x) else fg.softmax(x, dim, False)

    def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
               activation=None, residual=None):  # fmt: skip
        y = fg.conv2d(x, weight, bias, stride, padding, dilation, groups)
        if residual is not None:  # a residual block's shortcut (torch: FlagGems has no fusion)
            y = y + residual
        return activations[activation or "none"][0](y)

    return {
        "matmul": _batched(fg.mm, fg.bmm),
        "linear": linear,
        "softmax": softmax,
        "conv2d": conv2d,
        "sdpa": fg.scaled_dot_product_attention,  # flag_gems.ops', with its autograd Function
    }


# ---------------------------------------------------------------------------------------------
# liger-kernel: softmax only (its linear layers come fused with a loss). Its functional API;
# the direct call launches its forward kernel with the settings its wrapper would choose.
# ---------------------------------------------------------------------------------------------
def _liger_ops() -> dict[str, Callable]:
    from liger_kernel.transformers.functional import liger_softmax

    def softmax(x, dim):
        _require_last_dim(x, dim, "liger-kernel")
        return liger_softmax(x)

    return {"softmax": softmax}


def _liger_direct() -> dict[str, Callable]:
    from liger_kernel.ops import softmax as liger
    from liger_kernel.ops.utils import calculate_settings

    launches = {}  # n_cols -> (kernel, BLOCK_SIZE, num_warps), as _softmax_forward picks them

    def softmax(x, dim):
        _require_last_dim(x, dim, "liger-kernel")
        rows = _rows(x.contiguous())  # as its wrapper does; a no-op on the harness's inputs
        n_rows, n_cols = rows.shape
        if n_cols not in launches:
            block, warps = calculate_settings(n_cols)
            kernel = (liger._softmax_single_block_forward_kernel if n_cols <= block
                      else liger._softmax_multi_block_forward_kernel)  # fmt: skip
            launches[n_cols] = (kernel, block, warps)
        kernel, block, warps = launches[n_cols]
        y = torch.empty_like(rows)
        kernel[(n_rows,)](y, y.stride(0), rows, rows.stride(0), n_cols, BLOCK_SIZE=block,
                          num_warps=warps)  # fmt: skip
        return y.view(x.shape)

    return {"softmax": softmax}


def _liger_cpu_limits(job: JobFacts) -> str | None:
    if job.dtype == "bf16" and job.pass_name == "fwd_bwd":  # its forward upcasts (tl.exp)
        return (
            "Triton's interpreter computes bf16 arithmetic on the raw bit patterns "
            "(triton-lang/triton#10945), and Liger's softmax backward multiplies in bf16"
        )
    return None


# ---------------------------------------------------------------------------------------------
# quack-kernels: CuTe DSL kernels (no Triton). softmax as `from quack import softmax`; its
# GEMM (quack.gemm_interface.gemm) and linear (quack.linear) with the activation in the epilogue.
# ---------------------------------------------------------------------------------------------
QUACK_ACTIVATIONS = {"relu": "relu", "gelu": "gelu_erf", "gelu_tanh": "gelu_tanh_approx",
                     "silu": "silu"}  # fmt: skip


def _quack_ops() -> dict[str, Callable]:
    import quack
    from quack.gemm_interface import gemm
    from quack.linear import linear_act_func, linear_func

    def linear(x, weight, bias=None, activation=None):
        if activation in (None, "none"):
            return linear_func(x, weight, bias)
        if _needs_grad(x, weight, bias):
            raise PeerUnsupported(
                "unsupported by quack-kernels: a fused activation's output "
                "is not differentiable (LinearActFunc's postact)"
            )
        return linear_act_func(x, weight, QUACK_ACTIVATIONS[activation], bias,
                               store_preact=False)[1]  # fmt: skip

    def softmax(x, dim):
        _require_last_dim(x, dim, "quack-kernels")
        return quack.softmax(_rows(x)).view(x.shape)  # it takes (M, N) only

    def matmul(a, b, *, alpha=1.0):  # alpha·(a @ b) in its epilogue: attention's scale
        product = functools.partial(gemm, alpha=alpha)
        return _batched(product, product)(a, b)

    return {"matmul": matmul, "linear": linear, "softmax": softmax}


def _quack_direct() -> dict[str, Callable]:
    from quack.cute_dsl_utils import torch2cute_dtype_map
    from quack.softmax import Softmax

    compiled = {}  # (dtype, n_cols) -> the compiled CuTe function, as quack's jit_cache holds it

    def softmax(x, dim):
        _require_last_dim(x, dim, "quack-kernels")
        key = (x.dtype, x.shape[-1])
        if key not in compiled:
            cute_dtype = torch2cute_dtype_map[x.dtype]
            compiled[key] = Softmax.compile(cute_dtype, cute_dtype, x.shape[-1])
        rows = _rows(x)
        y = torch.empty_like(rows)
        compiled[key](rows, y)
        return y.view(x.shape)

    return {"softmax": softmax}


def _quack_dtype_limits(job: JobFacts) -> str | None:
    return "fp32 operands: its GEMMs take fp16/bf16 (or fp8)" if job.dtype == "fp32" else None


def _quack_gemm_limits(job: JobFacts) -> str | None:
    if job.pass_name == "fwd_bwd":
        where = f" (in {job.block})" if job.block else ""
        return (f"matmul{where} with pass=fwd_bwd: its GEMM (quack.gemm_interface.gemm, the "
                "custom op quack::gemm) has no backward registered, so its output does not "
                "require grad")  # fmt: skip
    return _quack_dtype_limits(job)


def _quack_linear_limits(job: JobFacts) -> str | None:
    activation = job.kernel.get("activation") or "none"
    if job.block and job.pass_name == "fwd_bwd":  # mlp: its first linear carries gelu
        activation = f"activation (in {job.block})"
    if activation != "none" and job.pass_name == "fwd_bwd":
        return (
            f"linear+{activation} with pass=fwd_bwd: its fused activation's output is not "
            "differentiable (LinearActFunc's postact)"
        )
    return _quack_dtype_limits(job)


PEERS = {
    "flaggems": Peer(
        name="flaggems", package="flag-gems", version="5.0.2", module="flag_gems",
        limits={"matmul": _no_limits, "linear": _no_limits, "softmax": _no_limits,
                "conv2d": _no_limits, "sdpa": _no_limits},
        build=_flaggems_ops,
        gpu_only=("needs a CUDA GPU: importing it without one raises `RuntimeError: No device "
                  "were detected on your machine !`, and its LibEntry kernel wrappers need "
                  "compiled triton.jit kernels, not TRITON_INTERPRET=1"),
    ),
    "liger": Peer(
        name="liger", package="liger-kernel", version="0.8.5", module="liger_kernel",
        limits={"softmax": _last_dim_only}, build=_liger_ops,
        direct=_liger_direct, direct_ops=("softmax",), cpu_limits=_liger_cpu_limits,
    ),
    "quack": Peer(
        name="quack", package="quack-kernels", version="0.6.5", module="quack",
        limits={"matmul": _quack_gemm_limits, "linear": _quack_linear_limits,
                "softmax": _last_dim_only},
        build=_quack_ops, direct=_quack_direct, direct_ops=("softmax",),
        gpu_only=("needs a CUDA GPU (SM90+ for its GEMMs): its kernels are CuTe DSL, compiled "
                  "for the GPU with no CPU interpreter (on CPU tensors: `ValueError: Mismatched "
                  "Tensor ... expected device_type=cuda`)"),
    ),
}  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The harness's entry points
# ---------------------------------------------------------------------------------------------
def peer_of(mode_cfg) -> Peer:
    name, kind = mode_cfg.name, mode_cfg.kind
    library = name.removesuffix(DIRECT_SUFFIX) if kind == "peer_direct" else name
    if library not in PEERS or (kind == "peer_direct" and not name.endswith(DIRECT_SUFFIX)):
        names = [p + (DIRECT_SUFFIX if kind == "peer_direct" else "") for p in PEERS]
        raise ConfigError(f"mode.kind={kind} needs mode.name to name a library: one of {names} "
                          f"(got {name!r}; docs/peers.md)")  # fmt: skip
    return PEERS[library]


def check(mode_cfg) -> None:
    peer_of(mode_cfg)


def job_of(mode_cfg) -> JobFacts:
    """The job around a mode config (its parent in the composed config), or defaults."""
    root = mode_cfg._get_parent() if hasattr(mode_cfg, "_get_parent") else None
    device = root.get("device", "auto") if root is not None else "auto"
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if root is None:
        return JobFacts(device=device)
    kernel = root.get("kernel") or {}
    return JobFacts(
        kernel={k: kernel.get(k) for k in ("dim", "activation", "bias") if k in kernel},
        pass_name=(root.get("pass") or {}).get("name", "fwd"),
        dtype=(root.get("dtype") or {}).get("name", "bf16"),
        device=device,
    )


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None  # looks, imports nothing


@functools.cache
def import_error(module: str) -> str | None:
    """None once `module` imports; else why not, in one line."""
    if not installed(module):
        return "not installed"
    try:
        importlib.import_module(module)
    except Exception as exc:  # any failure of a third-party import is a reason to skip
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return None


def availability(peer: Peer, device: str, job: JobFacts | None = None) -> str | None:
    """None where `peer` can run `job` on `device`; else the reason its rows are skipped."""
    if not installed(peer.module):
        return f"unavailable: {peer.package} is not installed (`make peers`; docs/peers.md)"
    if device != "cuda" and peer.gpu_only:
        return f"unavailable on {device}: {peer.package} {peer.gpu_only}"
    why = peer.cpu_limits(job) if device != "cuda" and job and peer.cpu_limits else None
    if why:
        return f"unavailable on {device}: {why}"
    error = import_error(peer.module)
    return f"unavailable: {peer.package} cannot be imported: {error}" if error else None


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def unsupported(mode_cfg, op: str) -> str | None:
    """Why this job's peer mode cannot run `op` (a skipped row's reason), or None when it can."""
    peer = peer_of(mode_cfg)
    spec = OPS.get(op)
    # a block (experiments/blocks.py) runs where the library has every op it calls
    parts = [OPS[part] for part in spec.composed] if spec and spec.composed else [spec]
    functions = [part.function if part else op for part in parts]
    who = f"{peer.package} {peer.version}"
    job = job_of(mode_cfg)
    if spec and spec.composed:
        job = dataclasses.replace(job, block=op)
    for function in functions:
        if function not in peer.limits:
            return f"unsupported by {who}: it has no {function} kernel"
        if mode_cfg.kind == "peer_direct":
            if function not in peer.direct_ops:
                return (f"unsupported by {who} (direct): no direct kernel call for {function}; "
                        f"mode={peer.name} measures it through the library's API")  # fmt: skip
            if job.pass_name != "fwd":
                return f"unsupported by {who} (direct): the direct kernel call is forward only"
        why = peer.limits[function](job)
        if why:
            return f"unsupported by {who}: {why}"
    reason = availability(peer, job.device, job)
    if reason:
        _warn_once(f"mode={mode_cfg.name}: {reason}; its rows are skipped")
    return reason


@functools.cache
def _ops(library: str, direct: bool) -> dict[str, Callable]:
    peer = PEERS[library]
    return peer.direct() if direct else peer.build()


def namespace(mode_cfg) -> SimpleNamespace:
    """The callables of a peer mode under the workloads' function names (imports the library)."""
    peer = peer_of(mode_cfg)
    error = import_error(peer.module)
    if error:
        raise RuntimeError(f"{peer.package} cannot be imported: {error}")
    return SimpleNamespace(**_ops(peer.name, mode_cfg.kind == "peer_direct"))


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for peer in PEERS.values():
        try:
            installed = importlib.metadata.version(peer.package)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        pin = "" if installed in (None, peer.version) else f" (pinned {peer.version})"
        reason = availability(peer, device)
        status = f"runs on {device}" if reason is None else reason
        direct = f"; direct: {', '.join(peer.direct_ops)}" if peer.direct_ops else ""
        print(f"mode={peer.name:<9} {peer.package}=={installed or '-'}{pin}: {status}; "
              f"ops: {', '.join(peer.limits)}{direct}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
