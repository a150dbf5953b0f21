"""Composed blocks: workloads of several ops, where a compiler can fuse across op boundaries and
our single-op kernels pay a launch and a round trip through memory for each op.

Each block is an nn.Module that calls the registered ops on `self.ops` (experiments/single_ops.py)
plus plain torch for what no op covers (attention's scale, where neither the namespace's softmax
takes `scale=` (ours) nor its matmul `alpha=` (quack's); the bottleneck's shortcut is conv2d's
`residual`, added before the last relu: the 1x1 GEMM's epilogue in mode=triton, torch elsewhere),
so every mode runs the same forward with only the namespace swapped: eager, torchscript and the
compile modes see torch ops (Inductor may fuse them, or rewrite attention into one
scaled_dot_product_attention call: records' `fused_attention`), mode=triton our kernels and
mode=triton-compiled their custom ops. An entry's `composed` names the ops it calls; the
table derives its triton/triton_compiled from theirs when the entry is made, so this module
imports experiments.single_ops, the entries it is composed of: they register first however this
module is imported, as experiments.registry's ENTRY_MODULES order also has it. docs/blocks.md
has the shapes and the reasoning.

Blocks:
    mlp         linear+bias+gelu (d -> ffn), linear+bias (ffn -> d): Llama-3-8B, fwd and fwd_bwd
    attention   softmax((q @ k^T) * scale) @ v, written out (no SDPA call): fwd and fwd_bwd;
                kernel.form=fused: ours as one fused attention kernel (kernels.sdpa)
    bottleneck  ResNet-50 bottleneck, channels-last: conv1x1+relu, conv3x3+relu, conv1x1, + x,
                relu; fwd and fwd_bwd (the shortcut's gradient is the last conv's dZ)
"""

import inspect
import math

import torch
from torch import nn

from experiments import single_ops  # noqa: F401 (registers the ops the blocks are composed of)
from experiments.errors import ConfigError
from experiments.op_table import OpSpec, latency_pairing, register
from experiments.single_ops import torch_sdpa
from experiments.workloads import Workload


class BlockWorkload(Workload):
    """A block's parameters are named `<layer>_weight` / `<layer>_bias`: the base class scales
    only a parameter named exactly "weight" by its fan-in."""

    def init_parameters(self, module: nn.Module, generator: torch.Generator) -> None:
        """Fresh random weights, each scaled by 1/sqrt(fan-in) so outputs keep unit variance."""
        with torch.no_grad():
            for name, p in module.named_parameters():
                fan_in = p[0].numel() if name.endswith("weight") else 1
                values = torch.randn(p.shape, generator=generator, device=p.device)
                p.copy_(values / math.sqrt(fan_in))


# ---------------------------------------------------------------------------------------------
# mlp: y = gelu(x W1^T + b1) W2^T + b2
# ---------------------------------------------------------------------------------------------
class MLP(nn.Module):
    def __init__(self, ops, d, ffn):
        super().__init__()
        self.ops = ops
        self.up_weight = nn.Parameter(torch.empty(ffn, d))
        self.up_bias = nn.Parameter(torch.empty(ffn))
        self.down_weight = nn.Parameter(torch.empty(d, ffn))
        self.down_bias = nn.Parameter(torch.empty(d))

    def forward(self, x):
        hidden = self.ops.linear(x, self.up_weight, self.up_bias, "gelu")  # gelu in the epilogue
        return self.ops.linear(hidden, self.down_weight, self.down_bias)


class MLPWorkload(BlockWorkload):
    name = "mlp"
    shape_keys = ("m", "d", "ffn")  # m: tokens (a key named "tokens" is refused as a credential)

    def make_module(self, shape, ops):
        return MLP(ops, shape["d"], shape["ffn"])

    def input_sizes(self, shape):
        return [(shape["m"], shape["d"])]

    def flops(self, shape, pass_name):
        fwd = 4.0 * shape["m"] * shape["d"] * shape["ffn"]  # two GEMMs of 2·m·d·ffn
        return fwd * (3 if pass_name == "fwd_bwd" else 1)  # each GEMM's dX and dW: two more

    def min_bytes(self, shape, pass_name, itemsize):
        # what any implementation reads and writes; the (m, ffn) hidden is not in it: it is
        # what a fused MLP keeps on chip and ours writes and reads back
        m, d, f = shape["m"], shape["d"], shape["ffn"]
        params = 2 * d * f + f + d
        fwd = m * d + params + m * d  # read x, W1, b1, W2, b2; write y
        bwd = 3 * m * d + 2 * params  # read dy, x and the weights; write dx and every gradient
        return float(fwd + (bwd if pass_name == "fwd_bwd" else 0)) * itemsize


register(OpSpec(
    name="mlp", function=None, workload=MLPWorkload, eager=None, triton=None,
    triton_compiled=None, bound="compute", passes=("fwd", "fwd_bwd"), composed=("linear",),
    bench=("kernel=mlp mode=triton,triton-compiled,default,max-autotune-no-cudagraphs "
           "pass=fwd,fwd_bwd dtype=bf16",),
    paired=latency_pairing("mlp", "triton", "default,max-autotune-no-cudagraphs",
                           ("fwd", "fwd_bwd")),
    markers={"marker": "P"},
))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# attention: softmax((q @ k^T) * scale) @ v over (batch, heads, seq, head_dim)
# ---------------------------------------------------------------------------------------------
def takes(function, keyword: str) -> bool:
    """Whether `function` has a parameter named `keyword` (False for a builtin with no
    signature, as torch.softmax)."""
    try:
        return keyword in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


ATTENTION_FORMS = ("written", "fused")


class Attention(nn.Module):
    """form="fused": a namespace with a hand-written fused attention (ours, kernels.sdpa; a
    peer's) computes the block in that one kernel; eager and the compile modes still run it
    written out, as a user writes it (Inductor may rewrite it into torch's SDPA)."""

    def __init__(self, ops, head_dim, form="written"):
        super().__init__()
        self.form = form
        self.ops = ops
        self.scale = head_dim**-0.5

    @property
    def ops(self):
        return self._ops

    @ops.setter
    def ops(self, ops):
        # Where the scale goes, with no pass over the scores of its own where a kernel takes
        # it: our softmax's load (scale=), or a peer GEMM's epilogue (quack's alpha=); else a
        # multiply, the pattern Inductor's attention rewrite looks for. Decided where the
        # namespace is set (workloads.with_ops swaps it on a copy), not in a timed call or
        # under a compiler's trace.
        self._ops = ops
        self.scale_in = ("softmax" if takes(ops.softmax, "scale")
                         else "matmul" if takes(ops.matmul, "alpha") else None)  # fmt: skip
        self.fused = self.form == "fused" and getattr(ops, "sdpa", torch_sdpa) is not torch_sdpa

    def forward(self, q, k, v):
        ops, kt = self.ops, k.transpose(-2, -1)
        if self.fused:
            return ops.sdpa(q, k, v, scale=self.scale)
        if self.scale_in == "softmax":
            return ops.matmul(ops.softmax(ops.matmul(q, kt), -1, scale=self.scale), v)
        if self.scale_in == "matmul":
            return ops.matmul(ops.softmax(ops.matmul(q, kt, alpha=self.scale), -1), v)
        # as fx_passes/fuse_attention.py matches it
        return ops.matmul(ops.softmax(ops.matmul(q, kt) * self.scale, -1), v)


class AttentionWorkload(BlockWorkload):
    name = "attention"
    shape_keys = ("batch", "heads", "seq", "head_dim")
    input_names = ("q", "k", "v")

    def __init__(self, kernel_cfg):
        super().__init__(kernel_cfg)
        self.form = kernel_cfg.get("form", "written")
        if self.form not in ATTENTION_FORMS:
            raise ConfigError(f"kernel.form={self.form!r}; choose one of {list(ATTENTION_FORMS)}")

    def make_module(self, shape, ops):
        return Attention(ops, shape["head_dim"], self.form)

    def input_sizes(self, shape):
        return [(shape["batch"], shape["heads"], shape["seq"], shape["head_dim"])] * 3

    def flops(self, shape, pass_name):
        # the two products, 2·seq²·head_dim each per head; the backward's four double it
        fwd = 4.0 * shape["batch"] * shape["heads"] * shape["seq"] ** 2 * shape["head_dim"]
        return fwd * (3 if pass_name == "fwd_bwd" else 1)

    def min_bytes(self, shape, pass_name, itemsize):
        # q, k, v and the output only, as a fused (flash) kernel moves them; the heads·seq²
        # scores that ours writes and reads back between ops are not in it
        qkv = shape["batch"] * shape["heads"] * shape["seq"] * shape["head_dim"]
        fwd = 4 * qkv  # read q, k, v; write out
        bwd = 8 * qkv  # read q, k, v, out, d_out; write dq, dk, dv
        return float(fwd + (bwd if pass_name == "fwd_bwd" else 0)) * itemsize


def fused_attention_rewrites() -> int:
    """How many matmul-scale-softmax-matmul patterns Inductor replaced with one
    scaled_dot_product_attention call since torch._dynamo's counters were last cleared (the
    harness clears them per shape): Inductor's own count (torch/_inductor/fx_passes/
    fuse_attention.py). A compiled row's fused-attention flag is this > 0 after its compile."""
    return torch._dynamo.utils.counters["inductor"]["fuse_attention"]


register(OpSpec(
    name="attention", function=None, workload=AttentionWorkload, eager=None, triton=None,
    triton_compiled=None, bound="compute", passes=("fwd", "fwd_bwd"),
    composed=("matmul", "softmax"),
    bench=("kernel=attention mode=triton,triton-compiled,default,max-autotune-no-cudagraphs "
           "pass=fwd,fwd_bwd dtype=bf16",
           "kernel=attention kernel.form=fused mode=triton,triton-compiled,default,"
           "max-autotune-no-cudagraphs pass=fwd,fwd_bwd dtype=bf16"),
    paired=latency_pairing("attention", "triton", "default,max-autotune-no-cudagraphs",
                           ("fwd", "fwd_bwd")),
    markers={"marker": "X"},
))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# bottleneck: relu(x + conv1x1(relu(conv3x3(relu(conv1x1(x)))))), channels-last
# ---------------------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    """Each conv carries a bias: batch norm folded in, as at inference."""

    def __init__(self, ops, c, width):
        super().__init__()
        self.ops = ops
        for layer, (k, c_in, r) in {"reduce": (width, c, 1), "conv": (width, width, 3),
                                    "expand": (c, width, 1)}.items():  # fmt: skip
            weight = torch.empty(k, c_in, r, r).to(memory_format=torch.channels_last)
            setattr(self, f"{layer}_weight", nn.Parameter(weight))
            setattr(self, f"{layer}_bias", nn.Parameter(torch.empty(k)))

    def forward(self, x):
        # conv2d(x, weight, bias, stride, padding, dilation, groups, activation=...)
        h = self.ops.conv2d(x, self.reduce_weight, self.reduce_bias, 1, 0, 1, activation="relu")
        h = self.ops.conv2d(h, self.conv_weight, self.conv_bias, 1, 1, 1, activation="relu")
        # the shortcut and the last relu: fused into the 1x1 GEMM's epilogue by mode=triton,
        # torch ops elsewhere (the compile modes may fuse them with each other)
        return self.ops.conv2d(h, self.expand_weight, self.expand_bias, 1, 0, 1,
                               activation="relu", residual=x)  # fmt: skip


class BottleneckWorkload(BlockWorkload):
    name = "bottleneck"
    shape_keys = ("n", "c", "h", "w", "width")

    def label(self, shape):
        return f"{shape['n']}x{shape['c']}x{shape['h']}x{shape['w']}-w{shape['width']}"

    def make_module(self, shape, ops):
        return Bottleneck(ops, shape["c"], shape["width"])

    def input_sizes(self, shape):
        return [(shape["n"], shape["c"], shape["h"], shape["w"])]

    def make_inputs(self, shape, dtype, device, generator):
        (x,) = super().make_inputs(shape, dtype, device, generator)
        return (x.contiguous(memory_format=torch.channels_last),)

    def flops(self, shape, pass_name):
        c, width = shape["c"], shape["width"]
        # the three convs' 2·MACs: c -> width (1x1), width -> width (3x3), width -> c (1x1)
        fwd = 2.0 * shape["n"] * shape["h"] * shape["w"] * (2 * c * width + 9 * width * width)
        return fwd * (3 if pass_name == "fwd_bwd" else 1)  # each conv's dgrad and wgrad

    def min_bytes(self, shape, pass_name, itemsize):
        # x read and y written once, and the weights: the two width-channel activations between
        # the convs and the pre-residual sum are what fusion could keep off memory
        c, width = shape["c"], shape["width"]
        pixels = shape["n"] * shape["h"] * shape["w"]
        params = 2 * c * width + 9 * width * width + 2 * width + c
        fwd = 2 * pixels * c + params  # read x and the weights; write y
        bwd = 2 * pixels * c + 2 * params  # read dy (and x, kept), the weights; write dx, grads
        return float(fwd + (bwd if pass_name == "fwd_bwd" else 0)) * itemsize


register(OpSpec(
    name="bottleneck", function=None, workload=BottleneckWorkload, eager=None, triton=None,
    triton_compiled=None, bound="compute", composed=("conv",), passes=("fwd", "fwd_bwd"),
    bench=("kernel=bottleneck mode=triton,triton-compiled,default,max-autotune-no-cudagraphs "
           "pass=fwd,fwd_bwd dtype=bf16",),
    paired=latency_pairing("bottleneck", "triton", "default,max-autotune-no-cudagraphs",
                           ("fwd", "fwd_bwd")),
    markers={"marker": "h"},
))  # fmt: skip
