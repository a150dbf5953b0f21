"""Whole models as workloads: torchvision's ResNet-50, MobileNetV2 and ConvNeXt-T, timm's
ViT-B/16 and a Llama-style decoder from transformers, each built by its own library with random
weights, measured in every mode as PyTorch's compiler dashboard measures its suites.

A model is a registry entry like an op (`kernel=resnet50`, conf/kernel/<name>.yaml), listed here
as data (MODELS). Nothing of a model is copied: the library's own module runs, and the modes
differ in how its calls execute:

    eager                 the library's module as it is
    triton                the same module under kernels.enable(): its conv2d, linear, matmul and
                          softmax calls go to our kernels (kernels/routing.py), forward and backward
    default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs
                          torch.compile of the unmodified module
    triton-compiled       torch.compile of the module with the calls routed to our custom ops
                          (enabled(custom_ops=True) while Dynamo traces), so Inductor fuses the
                          normalization and pointwise code around them
    torchscript           torch.jit.trace of the module
    flaggems              the whole step under flag_gems.use_gems() (its aten implementations)
    liger                 Liger-Kernel's patch of the model family (Llama: RMSNorm, RoPE, SwiGLU,
                          fused linear cross-entropy), on a copy of the module
Any other mode is a `skipped` row with its reason (`unsupported`).

Inference is an eval forward under no_grad; training a step: forward, cross-entropy on random
labels, backward and an SGD step (experiments/model_measure.py). Each model has a `tiny` variant
(a few layers, small inputs) for the CPU tests: `kernel.variant=auto` takes it without a GPU.
Training randomness (dropout, stochastic depth) is off, so every mode does the same arithmetic
and the float64 check is exact in intent.
"""

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from experiments.errors import ConfigError
from experiments.op_table import OpSpec, register
from experiments.workloads import Workload

VARIANTS = ("auto", "full", "tiny")


@dataclass(frozen=True)
class ModelSpec:
    name: str  # kernel=<name>; the records' `kernel`
    package: str  # the library that builds it (its import name)
    title: str  # as tables print it
    build: Callable[[dict, bool], nn.Module]  # (kernel config, tiny) -> the module, random weights
    inputs: str  # "image": (batch, 3, image, image) floats; "tokens": (batch, seq) token ids
    channels_last: bool = False  # convnets run channels_last, as they train on GPUs
    liger: str | None = None  # liger_kernel.transformers' patch for this family


# ---------------------------------------------------------------------------------------------
# Builders: each model from its own library, as that library's users build it
# ---------------------------------------------------------------------------------------------
def _resnet50(cfg, tiny):
    from torchvision.models import resnet

    if tiny:
        return _narrow_resnet(resnet, cfg["classes"])
    return resnet.resnet50(weights=None, num_classes=cfg["classes"])


def _narrow_resnet(resnet, classes: int, narrowing: int = 8):
    """torchvision's ResNet with one Bottleneck per stage, each stage an eighth as wide: every
    layer kind of ResNet-50 (the 7x7 stem, 1x1 and strided 3x3 convs, the downsampling 1x1s,
    the fc) at a width Triton's CPU interpreter runs in seconds (it takes ~30 s for one
    512-channel 3x3 conv of ResNet-50's last stage, whatever the image size)."""

    class NarrowResNet(resnet.ResNet):
        def _make_layer(self, block, planes, blocks, stride=1, dilate=False):
            return super()._make_layer(block, planes // narrowing, blocks, stride, dilate)

    net = NarrowResNet(resnet.Bottleneck, [1, 1, 1, 1], num_classes=classes)
    net.fc = type(net.fc)(net.inplanes, classes)  # the last stage's width, not ResNet-50's 2048
    return net


def _mobilenet_v2(cfg, tiny):
    from torchvision.models import mobilenet_v2

    if tiny:  # (expansion t, channels c, blocks n, stride s) of three of its seven stages
        setting = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 1, 2]]
        return mobilenet_v2(weights=None, num_classes=cfg["classes"], width_mult=0.25,
                            inverted_residual_setting=setting, dropout=0.0)  # fmt: skip
    return mobilenet_v2(weights=None, num_classes=cfg["classes"], dropout=0.0)


def _convnext_tiny(cfg, tiny):
    from torchvision.models import convnext

    if tiny:
        blocks = [convnext.CNBlockConfig(16, 32, 1), convnext.CNBlockConfig(32, None, 1)]
        return convnext.ConvNeXt(blocks, stochastic_depth_prob=0.0, num_classes=cfg["classes"])
    return convnext.convnext_tiny(weights=None, stochastic_depth_prob=0.0,
                                  num_classes=cfg["classes"])  # fmt: skip


def _vit_b_16(cfg, tiny):
    import timm

    if tiny:
        from timm.models.vision_transformer import VisionTransformer

        return VisionTransformer(img_size=32, patch_size=8, embed_dim=128, depth=2, num_heads=2,
                                 num_classes=cfg["classes"])  # fmt: skip
    return timm.create_model("vit_base_patch16_224", pretrained=False,
                             num_classes=cfg["classes"])  # fmt: skip


def _llama(cfg, tiny):
    from transformers import LlamaConfig, LlamaForCausalLM

    size = cfg["tiny"] if tiny else cfg["full"]
    config = LlamaConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"],
        intermediate_size=size["intermediate"], num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
        max_position_embeddings=size["max_seq"], tie_word_embeddings=False,
        attn_implementation=cfg["attention"], use_cache=False,
    )  # fmt: skip
    return LlamaForCausalLM(config)


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet50", "torchvision", "ResNet-50", _resnet50, "image", channels_last=True),
        ModelSpec("mobilenet_v2", "torchvision", "MobileNetV2", _mobilenet_v2, "image",
                  channels_last=True),
        ModelSpec("convnext_tiny", "torchvision", "ConvNeXt-T", _convnext_tiny, "image",
                  channels_last=True),
        ModelSpec("vit_b_16", "timm", "ViT-B/16", _vit_b_16, "image"),
        ModelSpec("llama", "transformers", "Llama decoder", _llama, "tokens",
                  liger="apply_liger_kernel_to_llama"),
    )
}  # fmt: skip


def missing_library(spec: ModelSpec) -> str | None:
    """A skipped row's reason where the model's library is not installed, else None."""
    if importlib.util.find_spec(spec.package) is None:
        return (f"unavailable: {spec.package} is not installed (requirements.txt; `make setup` "
                "installs it)")  # fmt: skip
    return None


# ---------------------------------------------------------------------------------------------
# The module every mode runs: the library's model, its loss inside (so a compile mode compiles
# the loss too, as the dashboard's training runs do)
# ---------------------------------------------------------------------------------------------
class ModelUnderTest(nn.Module):
    def __init__(self, net: nn.Module, spec: ModelSpec):
        super().__init__()
        self.net = net
        self.name = spec.name
        self.tokens = spec.inputs == "tokens"

    def forward(self, x, labels=None):
        """Logits; with labels, the training loss: cross-entropy over the classes (images), or
        the model's own next-token loss (a causal LM shifts the labels itself)."""
        if self.tokens:
            out = self.net(input_ids=x, labels=labels)
            return out.logits if labels is None else out.loss
        logits = self.net(x)
        return logits if labels is None else F.cross_entropy(logits, labels)


class ModelWorkload(Workload):
    """One model's experiment definition; `spec` is set per model (make_workload_class)."""

    spec: ModelSpec
    is_model = True

    def __init__(self, kernel_cfg):
        super().__init__(kernel_cfg)
        variant = kernel_cfg.get("variant", "auto")
        if variant not in VARIANTS:
            raise ConfigError(f"kernel.variant={variant!r}; choose one of {list(VARIANTS)}")
        self.variant = variant

    def tiny(self, device: torch.device) -> bool:
        return self.variant == "tiny" or (self.variant == "auto" and device.type != "cuda")

    def variant_name(self, device: torch.device) -> str:
        return "tiny" if self.tiny(device) else "full"

    def label(self, shape):
        return f"{super().label(shape)}-{shape['variant']}" if "variant" in shape else (
            super().label(shape))

    def with_variant(self, shape: dict, device: torch.device) -> dict:
        return {**shape, "variant": self.variant_name(device)}

    def parse_shape(self, raw):
        raw = dict(raw)
        variant = raw.pop("variant", None)
        shape = super().parse_shape(raw)
        return shape if variant is None else {**shape, "variant": variant}

    def build(self, shape: dict, seed: int) -> ModelUnderTest:
        """The library's model with its own random initialization, seeded: every mode and the
        float64 reference start from the same weights."""
        tiny = shape.get("variant") == "tiny"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = self.spec.build(self._cfg_dict(), tiny)
        return ModelUnderTest(net, self.spec)

    def _cfg_dict(self) -> dict:
        from omegaconf import OmegaConf

        cfg = self.cfg
        return OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)

    def make_module(self, shape, ops):  # the op workloads' entry point: the eager model
        return self.build(shape, 0)

    def parameter_names(self, shape) -> list[str]:
        return ["all parameters"]  # CUDA-graph trees treat every nn.Parameter as static

    def input_sizes(self, shape):
        if self.spec.inputs == "tokens":
            return [(shape["batch"], shape["seq"])]
        return [(shape["batch"], 3, shape["image"], shape["image"])]

    def classes(self, module: ModelUnderTest) -> int:
        if self.spec.inputs == "tokens":
            return module.net.config.vocab_size
        return int(self._cfg_dict()["classes"])

    def make_inputs(self, shape, dtype, device, generator):
        (size,) = self.input_sizes(shape)
        if self.spec.inputs == "tokens":
            vocab = self.vocab(shape)
            return (torch.randint(vocab, size, generator=generator, device=device),)
        x = torch.randn(size, generator=generator, device=device).to(dtype)
        if self.spec.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return (x,)

    def vocab(self, shape) -> int:
        cfg = self._cfg_dict()
        return cfg["tiny" if shape.get("variant") == "tiny" else "full"]["vocab"]

    def make_labels(self, shape, classes: int, device, generator) -> torch.Tensor:
        size = (shape["batch"], shape["seq"]) if self.spec.inputs == "tokens" else (shape["batch"],)
        return torch.randint(classes, size, generator=generator, device=device)

    def refill(self, inputs, labels, shape, classes: int, generator) -> None:
        """New random inputs and labels, written in place (compiled graphs and CUDA graphs
        keep their buffers)."""
        fresh = self.make_inputs(shape, inputs[0].dtype, inputs[0].device, generator)
        with torch.no_grad():
            inputs[0].copy_(fresh[0])
            labels.copy_(self.make_labels(shape, classes, labels.device, generator))

    def flops(self, shape, pass_name):
        return None  # counted per row by FlopCounterMode (experiments/model_measure.py)

    def min_bytes(self, shape, pass_name, itemsize):
        return None


def make_workload_class(spec: ModelSpec, shape_keys: tuple[str, ...]) -> type[ModelWorkload]:
    return type(f"{spec.title.replace('-', '').replace('/', '').replace(' ', '')}Workload",
                (ModelWorkload,), {"name": spec.name, "spec": spec, "shape_keys": shape_keys})


# ---------------------------------------------------------------------------------------------
# Which modes apply (experiments/model_modes.py builds them)
# ---------------------------------------------------------------------------------------------
# Liger's model patch swaps in its RMSNorm, SwiGLU and fused linear-cross-entropy kernels, and
# (liger-kernel 0.8.5) they call .to() on scalar arguments such as eps, which Triton's CPU
# interpreter passes as Python floats: its softmax runs there (kernel=softmax mode=liger), its
# model patch does not
LIGER_ON_CPU = ("unavailable on cpu: liger-kernel's model patch launches kernels that call .to() "
                "on scalar arguments, which Triton's interpreter passes as Python floats "
                "(AttributeError: 'float' object has no attribute 'to'); it runs on a GPU")


def unsupported(mode_cfg, name: str) -> str | None:
    """Why mode_cfg does not apply to model `name` (a skipped row's reason), or None."""
    spec = MODELS[name]
    missing = missing_library(spec)
    if missing:
        return missing
    kind = mode_cfg.kind
    if kind == "peer_direct":
        return (f"unsupported: mode {mode_cfg.name} launches one op's kernel directly; a whole "
                "model runs a library through its own patching (mode=flaggems, mode=liger)")
    if kind == "peer":
        from experiments import peers

        peer = peers.peer_of(mode_cfg)
        if peer.name == "quack":
            return ("unsupported: quack-kernels has no model-level patch (its GEMM and softmax "
                    "are called op by op: kernel=matmul|linear|softmax mode=quack)")
        if peer.name == "liger" and spec.liger is None:
            return (f"unsupported: liger-kernel patches transformers model families; "
                    f"{spec.title} is a {spec.package} model")
        job = peers.job_of(mode_cfg)
        if peer.name == "liger" and job.device != "cuda":
            return LIGER_ON_CPU
        return peers.availability(peer, job.device, job)
    return None


# ---------------------------------------------------------------------------------------------
# The registry entries: one a model, read by the harness like any op's
# ---------------------------------------------------------------------------------------------
IMAGE_SHAPE = ("batch", "image")
TOKEN_SHAPE = ("batch", "seq")

for _spec in MODELS.values():
    _keys = TOKEN_SHAPE if _spec.inputs == "tokens" else IMAGE_SHAPE
    register(OpSpec(
        name=_spec.name, function=None, workload=make_workload_class(_spec, _keys),
        eager=None, triton="kernels.routing:enabled", triton_compiled="kernels.routing:enabled",
        bound="compute", passes=("fwd", "fwd_bwd"), model_modes=unsupported,
        bench=(f"kernel={_spec.name} mode=eager,triton,triton-compiled,default,reduce-overhead,"
               "max-autotune,max-autotune-no-cudagraphs,flaggems,liger pass=fwd,fwd_bwd "
               "dtype=bf16",),
        markers={"marker": "*"},
    ))  # fmt: skip
