"""What every workload shares: the Workload base class, the namespace swap and shape sets.

The base of the entry modules: it imports nothing of the registry. Each op's own module and
Workload live in its entry (experiments/single_ops.py, experiments/blocks.py). A workload's
module calls `self.ops.<function>`, and eager PyTorch, our Triton kernels and their custom ops
are three namespaces of those functions (experiments.registry.namespace), so every mode runs the
same module code over the same parameters: only the ops differ. Weights are nn.Parameters
(CUDA-graph trees treat them as static); activations are the forward's arguments.
"""

import copy
import math
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch import nn

from experiments.errors import ConfigError


def with_ops(module: nn.Module, ops) -> nn.Module:
    """A copy of `module` that shares its parameters but calls other ops."""
    clone = copy.copy(module)
    clone.ops = ops
    return clone


class Workload:
    """One op's experiment definition; each registry entry fills in the shape keys, its module
    and the cost formulas."""

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

    def unsupported_shape(self, shape: dict, pass_name: str, mode_cfg) -> str | None:
        """Why `mode_cfg` cannot run this one shape in this pass (a skipped row's reason), or
        None; the mode-wide reasons are experiments.registry.unsupported's, the passes its
        check_pass's."""
        return None


KERNEL_CONF = Path(__file__).resolve().parent.parent / "conf" / "kernel"


def kernel_config(name: str):
    """conf/kernel/<name>.yaml as Hydra composes it, for scripts that load one op's config
    without Hydra: its shape sets with the sets recorded from the models
    (conf/kernel/recorded/<name>.yaml, which its defaults list merges first) beneath them."""
    cfg = OmegaConf.load(KERNEL_CONF / f"{name}.yaml")
    recorded = KERNEL_CONF / "recorded" / f"{name}.yaml"
    if "defaults" in cfg:
        cfg.pop("defaults")
        if recorded.is_file():
            cfg.shape_sets = OmegaConf.merge(OmegaConf.load(recorded), cfg.shape_sets)
    return cfg


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
