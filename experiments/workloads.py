"""The four workloads as nn.Modules, with their shapes, inputs, float64 references and costs.

Each workload is one module class whose forward calls `self.ops`, a namespace of four functions
(matmul, linear, softmax, conv2d). Eager PyTorch, the Triton kernels and the Triton custom ops are
three such namespaces, so every mode runs the same module code over the same parameters: only the
ops differ. Weights are nn.Parameters (CUDA-graph trees treat them as static); activations are
the forward's arguments.
"""

import copy
import math
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from experiments.errors import ConfigError
from kernels._common import TORCH_ACTIVATIONS


def _torch_linear(x, weight, bias=None, activation=None):
    return TORCH_ACTIVATIONS[activation or "none"](F.linear(x, weight, bias))


def _torch_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, activation=None):
    y = F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation)
    return TORCH_ACTIVATIONS[activation or "none"](y)


TORCH_OPS = SimpleNamespace(
    matmul=torch.matmul, linear=_torch_linear, softmax=torch.softmax, conv2d=_torch_conv2d
)


def triton_ops():
    import kernels

    return SimpleNamespace(
        matmul=kernels.matmul, linear=kernels.linear, softmax=kernels.softmax, conv2d=kernels.conv2d
    )


def custom_ops():
    """The Triton kernels registered as torch.library custom ops (the triton-compiled mode)."""
    from kernels import ops

    return ops.namespace()


def with_ops(module: nn.Module, ops) -> nn.Module:
    """A copy of `module` that shares its parameters but calls other ops."""
    clone = copy.copy(module)
    clone.ops = ops
    return clone


# ---------------------------------------------------------------------------------------------
# Modules
# ---------------------------------------------------------------------------------------------
class Matmul(nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, a, b):
        return self.ops.matmul(a, b)


class Linear(nn.Module):
    def __init__(self, ops, in_features, out_features, bias, activation):
        super().__init__()
        self.ops = ops
        self.activation = activation
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x):
        return self.ops.linear(x, self.weight, self.bias, self.activation)


class Softmax(nn.Module):
    def __init__(self, ops, dim):
        super().__init__()
        self.ops = ops
        self.dim = dim

    def forward(self, x):
        return self.ops.softmax(x, self.dim)


class Conv2d(nn.Module):
    def __init__(self, ops, shape, bias, activation, channels_last):
        super().__init__()
        self.ops = ops
        self.stride, self.padding, self.dilation = (
            shape["stride"],
            shape["padding"],
            shape["dilation"],
        )
        self.activation = activation
        weight = torch.empty(shape["k"], shape["c"], shape["r"], shape["s"])
        if channels_last:
            weight = weight.to(memory_format=torch.channels_last)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(torch.empty(shape["k"])) if bias else None

    def forward(self, x):
        return self.ops.conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.activation
        )


# ---------------------------------------------------------------------------------------------
# Workloads: shapes, inputs and analytic costs
# ---------------------------------------------------------------------------------------------
class Workload:
    """One kernel's experiment definition; subclasses fill in the shape keys and formulas."""

    name: str
    shape_keys: tuple[str, ...]
    shape_defaults: dict = {}
    input_names: tuple[str, ...] = ("x",)

    def __init__(self, kernel_cfg):
        self.cfg = kernel_cfg

    def parse_shape(self, raw) -> dict:
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{self.name} shape {raw!r} must be a mapping with keys {self.shape_keys}"
            )
        unknown = set(raw.keys()) - set(self.shape_keys) - set(self.shape_defaults)
        missing = set(self.shape_keys) - set(raw.keys())
        if unknown or missing:
            raise ConfigError(
                f"{self.name} shape {dict(raw)} has unknown keys {sorted(unknown)} and lacks "
                f"{sorted(missing)}; expected {list(self.shape_keys)} "
                f"(optional: {list(self.shape_defaults)})"
            )
        shape = {**self.shape_defaults, **raw}
        for key, value in shape.items():
            lowest = 0 if key == "padding" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < lowest:
                raise ConfigError(
                    f"{self.name} shape {dict(raw)}: {key} must be an int >= {lowest}"
                )
        return shape

    def label(self, shape: dict) -> str:
        return "x".join(str(shape[k]) for k in self.shape_keys)

    def init_parameters(self, module: nn.Module, generator: torch.Generator) -> None:
        """Fresh random weights (scaled so outputs keep unit variance), written in place."""
        with torch.no_grad():
            for name, p in module.named_parameters():
                fan_in = p[0].numel() if name == "weight" else 1
                values = torch.randn(p.shape, generator=generator, device=p.device)
                p.copy_(values / math.sqrt(fan_in))

    def make_inputs(self, shape, dtype, device, generator) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.randn(size, generator=generator, device=device).to(dtype)
            for size in self.input_sizes(shape)
        )

    def check_pass(self, pass_name: str) -> None:
        if pass_name not in self.cfg.passes:
            raise ConfigError(
                f"pass={pass_name} is not supported for kernel={self.name}; "
                f"choose one of {list(self.cfg.passes)}"
            )


class MatmulWorkload(Workload):
    name = "matmul"
    shape_keys = ("m", "n", "k")
    input_names = ("a", "b")

    def make_module(self, shape, ops):
        return Matmul(ops)

    def input_sizes(self, shape):
        return [(shape["m"], shape["k"]), (shape["k"], shape["n"])]

    def flops(self, shape, pass_name):
        return 2.0 * shape["m"] * shape["n"] * shape["k"]

    def min_bytes(self, shape, pass_name, itemsize):
        m, n, k = shape["m"], shape["n"], shape["k"]
        return float(m * k + k * n + m * n) * itemsize  # read A and B once, write C once


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


class ConvWorkload(Workload):
    name = "conv"
    shape_keys = ("n", "c", "h", "w", "k", "r", "s")
    shape_defaults = {"stride": 1, "padding": 0, "dilation": 1}

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
        return shape

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
            for key in ("stride", "padding", "dilation")
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
        return 2.0 * shape["n"] * shape["k"] * p * q * shape["c"] * shape["r"] * shape["s"]

    def min_bytes(self, shape, pass_name, itemsize):
        p, q = self.output_hw(shape)
        x = shape["n"] * shape["c"] * shape["h"] * shape["w"]
        w = shape["k"] * shape["c"] * shape["r"] * shape["s"]
        y = shape["n"] * shape["k"] * p * q
        return float(x + w + y + (shape["k"] if self.cfg.bias else 0)) * itemsize


WORKLOADS = {w.name: w for w in (MatmulWorkload, LinearWorkload, SoftmaxWorkload, ConvWorkload)}


def make_workload(kernel_cfg) -> Workload:
    if kernel_cfg.name not in WORKLOADS:
        raise ConfigError(f"unknown kernel {kernel_cfg.name!r}; choose one of {sorted(WORKLOADS)}")
    return WORKLOADS[kernel_cfg.name](kernel_cfg)


def resolve_shapes(
    workload: Workload, kernel_cfg, shapes_key: str, on_gpu: bool
) -> tuple[str, list]:
    """The shape set to run: its name and its parsed shapes."""
    name = shapes_key
    if name == "auto":
        name = kernel_cfg.default_shapes if on_gpu else "cpu"
    sets = kernel_cfg.shape_sets
    if name not in sets:
        raise ConfigError(
            f"unknown shape set {name!r} for kernel={workload.name}; choose one of {sorted(sets)}"
        )
    raw = list(sets[name])
    if not raw:
        raise ConfigError(f"shape set {name!r} for kernel={workload.name} is empty")
    return name, [
        workload.parse_shape(OmegaConf.to_container(s) if OmegaConf.is_config(s) else s)
        for s in raw
    ]
