"""The single ops' entries: matmul, linear, softmax, conv and sdpa, each its nn.Module, its Workload
(shape keys, inputs, FLOP and byte formulas) and its `register(OpSpec(...))`.

An entry module: of the harness it imports only the op table (experiments.op_table), the Workload
base class and ConfigError. experiments.registry imports it first, before the blocks composed of
these ops (experiments/blocks.py, which imports it too). Each module calls `self.ops.<function>`:
eager's, ours or the custom ops', whichever namespace the mode swaps in. Reading the entries
imports no kernel: `triton` and `triton_compiled` name them as "module:attribute".
"""

import torch
import torch.nn.functional as F
from torch import nn

from experiments.errors import ConfigError
from experiments.op_table import OpSpec, latency_pairing, register
from experiments.workloads import Workload


# ---------------------------------------------------------------------------------------------
# matmul: C = A @ B, both operands inputs
# ---------------------------------------------------------------------------------------------
class Matmul(nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, a, b):
        return self.ops.matmul(a, b)


class MatmulWorkload(Workload):
    name = "matmul"
    shape_keys = ("m", "n", "k")
    # batch > 1: (batch, m, k) @ (batch, k, n), attention's batched products
    shape_defaults = {"batch": 1}
    input_names = ("a", "b")

    def make_module(self, shape, ops):
        return Matmul(ops)

    def label(self, shape):
        base = super().label(shape)
        return base if shape["batch"] == 1 else f"{shape['batch']}x({base})"

    def input_sizes(self, shape):
        batch = (shape["batch"],) if shape["batch"] > 1 else ()
        return [(*batch, shape["m"], shape["k"]), (*batch, shape["k"], shape["n"])]

    def flops(self, shape, pass_name):
        fwd = 2.0 * shape["batch"] * shape["m"] * shape["n"] * shape["k"]
        return fwd * (3 if pass_name == "fwd_bwd" else 1)  # backward: dA and dB, two more GEMMs

    def min_bytes(self, shape, pass_name, itemsize):
        m, n, k = shape["m"], shape["n"], shape["k"]
        fwd = m * k + k * n + m * n  # read A and B once, write C once
        bwd = m * n + m * k + k * n + m * k + k * n  # read dC, A, B; write dA, dB
        return float(shape["batch"] * (fwd + (bwd if pass_name == "fwd_bwd" else 0))) * itemsize


register(OpSpec(
    name="matmul", function="matmul", workload=MatmulWorkload, eager=torch.matmul,
    triton="kernels:matmul", triton_compiled="kernels.ops:matmul", bound="compute",
    # fwd_bwd runs (both gradients are this matmul); linear's grids measure the training GEMMs
    passes=("fwd", "fwd_bwd"),
    bench=("kernel=matmul mode=triton dtype=bf16,fp16 shapes=square,llm",
           "kernel=matmul mode=triton,triton-compiled,default dtype=bf16 shapes=default",
           "kernel=matmul mode=triton,triton-compiled,default,max-autotune-no-cudagraphs "
           "dtype=bf16 shapes=attention",
           # the shape set recorded from the Llama decoder (analysis.targets, "model shapes")
           "kernel=matmul mode=triton pass=fwd,fwd_bwd dtype=bf16 shapes=llama"),
    paired=latency_pairing("matmul"),
    markers={"marker": "o"},
))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# linear: y = act(x W^T + b), W and b parameters
# ---------------------------------------------------------------------------------------------
def _activation(name):
    # imported on use, so that reading the registry imports no kernel
    from kernels._common import TORCH_ACTIVATIONS

    return TORCH_ACTIVATIONS[name or "none"]


def torch_linear(x, weight, bias=None, activation=None):
    return _activation(activation)(F.linear(x, weight, bias))


class Linear(nn.Module):
    def __init__(self, ops, in_features, out_features, bias, activation):
        super().__init__()
        self.ops = ops
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x):
        return self.ops.linear(x, self.weight, self.bias, self.activation)


class LinearWorkload(Workload):
    name = "linear"
    shape_keys = ("m", "n", "k")

    def make_module(self, shape, ops):
        return Linear(ops, shape["k"], shape["n"], self.cfg.bias, self.cfg.activation)

    def input_sizes(self, shape):
        return [(shape["m"], shape["k"])]

    def flops(self, shape, pass_name):
        fwd = 2.0 * shape["m"] * shape["n"] * shape["k"]
        return fwd * (3 if pass_name == "fwd_bwd" else 1)  # backward is dX and dW: two more GEMMs

    def min_bytes(self, shape, pass_name, itemsize):
        m, n, k = shape["m"], shape["n"], shape["k"]
        bias = n if self.cfg.bias else 0
        fwd = m * k + n * k + bias + m * n  # read x, W, b; write y
        bwd = m * n + m * k + n * k + m * k + n * k + bias  # read dy, x, W; write dx, dW, db
        return float(fwd + (bwd if pass_name == "fwd_bwd" else 0)) * itemsize


register(OpSpec(
    name="linear", function="linear", workload=LinearWorkload, eager=torch_linear,
    triton="kernels:linear", triton_compiled="kernels.ops:linear", bound="compute",
    passes=("fwd", "fwd_bwd"),
    bench=("kernel=linear mode=triton,triton-compiled,default,max-autotune-no-cudagraphs pass=fwd "
           "dtype=bf16,fp16",
           "kernel=linear mode=triton pass=fwd_bwd dtype=bf16,fp16",
           # the sets recorded from the models, as they call it: bias, no fused activation
           "kernel=linear mode=triton kernel.activation=none pass=fwd,fwd_bwd dtype=bf16 "
           "shapes=resnet50,mobilenet_v2,convnext_tiny,vit_b_16,llama"),
    paired=latency_pairing("linear"),
    markers={"marker": "s"},
))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# softmax over kernel.dim of an (m, n) input
# ---------------------------------------------------------------------------------------------
class Softmax(nn.Module):
    def __init__(self, ops, dim):
        super().__init__()
        self.ops = ops
        self.dim = dim

    def forward(self, x):
        return self.ops.softmax(x, self.dim)


class SoftmaxWorkload(Workload):
    name = "softmax"
    shape_keys = ("m", "n")

    def make_module(self, shape, ops):
        return Softmax(ops, self.cfg.dim)

    def input_sizes(self, shape):
        return [(shape["m"], shape["n"])]

    def flops(self, shape, pass_name):
        # max, subtract, exp, sum, divide per element; backward: multiply, sum, subtract, multiply
        return float(shape["m"] * shape["n"]) * (9 if pass_name == "fwd_bwd" else 5)

    def min_bytes(self, shape, pass_name, itemsize):
        elems = shape["m"] * shape["n"]
        # forward reads x and writes y; backward reads y and dy and writes dx
        return float(elems * (5 if pass_name == "fwd_bwd" else 2)) * itemsize


register(OpSpec(
    name="softmax", function="softmax", workload=SoftmaxWorkload, eager=torch.softmax,
    triton="kernels:softmax", triton_compiled="kernels.ops:softmax", bound="memory",
    passes=("fwd", "fwd_bwd"),
    bench=("kernel=softmax mode=triton,triton-compiled,default,max-autotune-no-cudagraphs "
           "dtype=bf16,fp32 shapes=rows",
           "kernel=softmax mode=triton pass=fwd_bwd dtype=bf16,fp32 shapes=rows",
           "kernel=softmax mode=eager,triton,triton-compiled,default,reduce-overhead shapes=small"),
    # ours and both compile modes timed in one process, interleaved round by round: where both
    # run at the copy's rate, separate jobs differ by more than the kernels do
    paired=("--kernel softmax --shapes rows --only-n 128,512,1024,4096,16384 --rounds 7 "
            "--dtypes bf16,fp32",
            *latency_pairing("softmax")),
    markers={"marker": "^"},
))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# conv: conv2d (+ bias, + activation) over an NCHW or channels-last input
# ---------------------------------------------------------------------------------------------
def torch_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *,
                 activation=None, residual=None):  # fmt: skip
    y = F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation,
                 groups=groups)  # fmt: skip
    if residual is not None:  # a residual block's shortcut, added before the activation
        y = y + residual
    return _activation(activation)(y)


class Conv2d(nn.Module):
    def __init__(self, ops, shape, bias, activation, channels_last):
        super().__init__()
        self.ops = ops
        self.stride, self.padding, self.dilation = (
            shape["stride"],
            shape["padding"],
            shape["dilation"],
        )
        self.groups = shape["groups"]
        self.activation = activation
        weight = torch.empty(shape["k"], shape["c"] // self.groups, shape["r"], shape["s"])
        if channels_last:
            weight = weight.to(memory_format=torch.channels_last)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.empty(shape["k"])) if bias else None

    def forward(self, x):
        # F.conv2d's positional order in every mode's namespace; the activation by keyword
        return self.ops.conv2d(x, self.weight, self.bias, self.stride, self.padding,
                               self.dilation, self.groups, activation=self.activation)


class ConvWorkload(Workload):
    name = "conv"
    shape_keys = ("n", "c", "h", "w", "k", "r", "s")
    shape_defaults = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}

    def __init__(self, kernel_cfg):
        super().__init__(kernel_cfg)
        if kernel_cfg.memory_format not in ("nchw", "nhwc"):
            raise ConfigError(
                f"kernel.memory_format={kernel_cfg.memory_format!r}; choose nchw or nhwc"
            )
        self.channels_last = kernel_cfg.memory_format == "nhwc"

    def parse_shape(self, raw):
        shape = super().parse_shape(raw)
        p, q = self.output_hw(shape)
        if p < 1 or q < 1:
            raise ConfigError(f"conv shape {dict(raw)} has an empty output ({p}x{q})")
        if shape["c"] % shape["groups"] or shape["k"] % shape["groups"]:
            raise ConfigError(f"conv shape {dict(raw)}: groups must divide c and k")
        return shape

    def unsupported_shape(self, shape, pass_name, mode_cfg):
        ours = mode_cfg.kind in ("triton", "triton_compiled")
        if ours and pass_name == "fwd_bwd" and shape["groups"] not in (1, shape["c"]):
            return (f"unsupported: conv groups={shape['groups']} has no Triton backward "
                    "(groups=1 and depthwise train)")  # fmt: skip
        return None

    @staticmethod
    def output_hw(shape):
        def out(size, kernel):
            span = shape["dilation"] * (kernel - 1) + 1
            return (size + 2 * shape["padding"] - span) // shape["stride"] + 1

        return out(shape["h"], shape["r"]), out(shape["w"], shape["s"])

    def label(self, shape):
        n, c, h, w, k, r, s = (shape[key] for key in self.shape_keys)
        base = f"{n}x{c}x{h}x{w}-k{k}-{r}x{s}"
        extras = [
            f"{key[0]}{shape[key]}"
            for key in ("stride", "padding", "dilation", "groups")
            if shape[key] != self.shape_defaults[key]
        ]
        return "-".join([base, *extras])

    def make_module(self, shape, ops):
        return Conv2d(ops, shape, self.cfg.bias, self.cfg.activation, self.channels_last)

    def input_sizes(self, shape):
        return [(shape["n"], shape["c"], shape["h"], shape["w"])]

    def make_inputs(self, shape, dtype, device, generator):
        (x,) = super().make_inputs(shape, dtype, device, generator)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return (x,)

    def flops(self, shape, pass_name):
        p, q = self.output_hw(shape)
        c_per_group = shape["c"] // shape["groups"]
        fwd = 2.0 * shape["n"] * shape["k"] * p * q * c_per_group * shape["r"] * shape["s"]
        return fwd * (3 if pass_name == "fwd_bwd" else 1)  # backward: dgrad and wgrad, each a fwd

    def min_bytes(self, shape, pass_name, itemsize):
        p, q = self.output_hw(shape)
        x = shape["n"] * shape["c"] * shape["h"] * shape["w"]
        w = shape["k"] * (shape["c"] // shape["groups"]) * shape["r"] * shape["s"]
        y = shape["n"] * shape["k"] * p * q
        bias = shape["k"] if self.cfg.bias else 0
        fwd = x + w + bias + y  # read x, W, b; write y
        bwd = y + x + w + x + w + bias  # read dy, x, W; write dx, dW, db
        return float(fwd + (bwd if pass_name == "fwd_bwd" else 0)) * itemsize


register(OpSpec(
    name="conv", function="conv2d", workload=ConvWorkload, eager=torch_conv2d,
    triton="kernels:conv2d", triton_compiled="kernels.ops:conv2d", bound="compute",
    passes=("fwd", "fwd_bwd"),
    bench=("kernel=conv mode=triton kernel.bias=true,false shapes=resnet50",
           "kernel=conv mode=triton shapes=resnet50_b128",
           "kernel=conv kernel.activation=relu "
           "mode=triton,triton-compiled,default,max-autotune-no-cudagraphs shapes=resnet50_core",
           "kernel=conv mode=triton,triton-compiled,default,max-autotune-no-cudagraphs "
           "shapes=mobilenet_v2_dw,convnext_dw",
           "kernel=conv mode=triton,triton-compiled,default,max-autotune-no-cudagraphs "
           "shapes=resnext50",
           # training, bias-free (kernel against kernel): every layer against eager, and the
           # core layers against the compile modes (their compile time per layer is minutes)
           "kernel=conv kernel.bias=false pass=fwd_bwd mode=triton shapes=resnet50",
           "kernel=conv kernel.bias=false pass=fwd_bwd "
           "mode=triton,triton-compiled,default,max-autotune-no-cudagraphs shapes=resnet50_core",
           # the sets recorded from the CNNs (analysis.targets, "model shapes"), bias-free
           "kernel=conv mode=triton kernel.bias=false pass=fwd,fwd_bwd dtype=bf16 "
           "shapes=mobilenet_v2,convnext_tiny"),
    paired=latency_pairing("conv"),
    markers={"marker": "D"},
))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# sdpa: F.scaled_dot_product_attention(q, k, v, is_causal, enable_gqa) over (batch, heads, seq,
# head_dim); ours is the fused attention (kernels/attention)
# ---------------------------------------------------------------------------------------------
SDPA_BACKENDS = ("default", "flash", "efficient", "cudnn", "math")
# Past this many scores (batch·heads·seq_q·seq_k) the float64 reference runs a block of queries
# at a time, each block recomputed in the backward: the math path's whole score matrix of a
# 16k-token Llama shape would be 275 GB in float64.
REFERENCE_SCORES = 2**28
REFERENCE_ROWS = 256


def torch_sdpa(q, k, v, is_causal=False, enable_gqa=False):
    if q.dtype == torch.float64 and q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2] > (
            REFERENCE_SCORES):  # fmt: skip
        return _blocked_sdpa(q, k, v, is_causal, enable_gqa)
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=enable_gqa)


def _blocked_sdpa(q, k, v, is_causal, enable_gqa):
    """The exact SDPA (math backend), REFERENCE_ROWS queries at a time; causal blocks see the
    keys up to their last query, with the mask shifted to their offset (top-left aligned, as
    is_causal). Each block is checkpointed, so its scores live only while it runs."""
    from torch.utils.checkpoint import checkpoint

    def block(qb, start):
        stop = start + qb.shape[-2]
        keys = stop if is_causal else k.shape[-2]
        mask = None
        if is_causal:
            rows = torch.arange(start, stop, device=q.device)[:, None]
            mask = torch.arange(keys, device=q.device)[None, :] <= rows
        return F.scaled_dot_product_attention(qb, k[..., :keys, :], v[..., :keys, :],
                                              attn_mask=mask, enable_gqa=enable_gqa)  # fmt: skip

    outs = [checkpoint(block, q[..., i:i + REFERENCE_ROWS, :], i, use_reentrant=False)
            for i in range(0, q.shape[-2], REFERENCE_ROWS)]  # fmt: skip
    return torch.cat(outs, dim=-2)


def _sdpa_backend(name: str):
    """The context that makes torch's SDPA take one backend (`default`: torch's own pick)."""
    import contextlib

    if name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([{"flash": SDPBackend.FLASH_ATTENTION,
                         "efficient": SDPBackend.EFFICIENT_ATTENTION,
                         "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]])


class SDPA(nn.Module):
    def __init__(self, ops, causal: bool, gqa: bool, backend: str):
        super().__init__()
        self.ops = ops
        self.causal, self.gqa, self.backend = causal, gqa, backend

    def forward(self, q, k, v):
        # the backend binds torch's SDPA (eager's and the compile modes'); ours ignores it
        with _sdpa_backend(self.backend):
            return self.ops.sdpa(q, k, v, is_causal=self.causal, enable_gqa=self.gqa)


class SDPAWorkload(Workload):
    name = "sdpa"
    shape_keys = ("batch", "heads", "kv_heads", "seq", "head_dim")  # and causal: 0 (default) or 1
    input_names = ("q", "k", "v")

    def __init__(self, kernel_cfg):
        super().__init__(kernel_cfg)
        if kernel_cfg.backend not in SDPA_BACKENDS:
            raise ConfigError(f"kernel.backend={kernel_cfg.backend!r}; choose one of "
                              f"{list(SDPA_BACKENDS)}")  # fmt: skip

    def parse_shape(self, raw):
        raw = dict(raw)
        causal = raw.pop("causal", 0)
        if causal not in (0, 1, False, True):
            raise ConfigError(f"sdpa shape {raw}: causal must be 0 or 1, got {causal!r}")
        shape = {**super().parse_shape(raw), "causal": int(causal)}
        if shape["heads"] % shape["kv_heads"]:
            raise ConfigError(f"sdpa shape {raw}: kv_heads must divide heads")
        return shape

    def label(self, shape):
        heads = f"{shape['heads']}/{shape['kv_heads']}" if shape["kv_heads"] != shape["heads"] \
            else str(shape["heads"])
        base = f"{shape['batch']}x{heads}x{shape['seq']}x{shape['head_dim']}"
        return base + ("-causal" if shape["causal"] else "")

    def make_module(self, shape, ops):
        return SDPA(ops, bool(shape["causal"]), shape["kv_heads"] != shape["heads"],
                    self.cfg.backend)  # fmt: skip

    def input_sizes(self, shape):
        b, s, d = shape["batch"], shape["seq"], shape["head_dim"]
        kv = (b, shape["kv_heads"], s, d)
        return [(b, shape["heads"], s, d), kv, kv]

    def flops(self, shape, pass_name):
        # FlashAttention's count: two products of 2·seq²·head_dim a head, half of it causal; the
        # backward's five products (one recomputes the scores) make fwd_bwd 3.5x the forward
        fwd = 4.0 * shape["batch"] * shape["heads"] * shape["seq"] ** 2 * shape["head_dim"]
        fwd *= 0.5 if shape["causal"] else 1.0
        return fwd * (3.5 if pass_name == "fwd_bwd" else 1.0)

    def min_bytes(self, shape, pass_name, itemsize):
        q = shape["batch"] * shape["heads"] * shape["seq"] * shape["head_dim"]
        kv = 2 * q * shape["kv_heads"] // shape["heads"]
        fwd = 2 * q + kv  # read q, k, v; write out
        bwd = 4 * q + 2 * kv  # read q, k, v, out, d_out; write dq, dk, dv
        return float(fwd + (bwd if pass_name == "fwd_bwd" else 0)) * itemsize


register(OpSpec(
    name="sdpa", function="sdpa", workload=SDPAWorkload, eager=torch_sdpa,
    triton="kernels:sdpa", triton_compiled="kernels.ops:sdpa", bound="compute",
    passes=("fwd", "fwd_bwd"),
    bench=("kernel=sdpa mode=triton,triton-compiled,default,max-autotune-no-cudagraphs,flaggems "
           "pass=fwd,fwd_bwd dtype=bf16 shapes=llama,vit",
           # ours against each of torch's backends as the job's eager baseline
           "kernel=sdpa mode=triton kernel.backend=flash,efficient,cudnn pass=fwd,fwd_bwd "
           "dtype=bf16 shapes=llama,vit"),
    paired=latency_pairing("sdpa"),
    markers={"marker": "v"},
))  # fmt: skip
