"""How each mode runs a whole model (experiments/models.py lists the models and which modes
apply): the module a step calls and the context the whole step runs in.

    build_mode(mode_cfg, compile_cfg, eager, example) -> ModelMode
"""

import contextlib
import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from experiments import modes
from experiments.errors import ConfigError
from experiments.models import MODELS, ModelSpec, ModelUnderTest


@dataclass
class ModelMode:
    """A mode on a model: the module its step calls and the context the whole step runs in
    (forward, loss, backward and optimizer step)."""

    module: nn.Module
    context: Callable[[], contextlib.AbstractContextManager]
    compiled: bool = False
    cudagraphs: bool = False
    options: dict | None = None
    routed: str | None = None  # "triton" or "custom": kernels.enable()'s calls are counted


def build_mode(mode_cfg, compile_cfg, eager: ModelUnderTest, example) -> ModelMode:
    from kernels import routing

    kind = mode_cfg.kind
    if kind == "eager":
        return ModelMode(eager, contextlib.nullcontext)
    if kind == "triton":
        return ModelMode(eager, routing.enabled, routed="triton")
    if kind in ("compile", "triton_compiled"):
        extra = modes.kind_options(mode_cfg)
        impl = modes.compile_module(eager, mode_cfg.compile_mode, compile_cfg,
                                    compile_cfg.fullgraph, extra)  # fmt: skip
        context = (lambda: routing.enabled(custom_ops=True)) if kind == "triton_compiled" else (
            contextlib.nullcontext)
        return ModelMode(impl.module, context, True, impl.cudagraphs, impl.options,
                         routed="custom" if kind == "triton_compiled" else None)  # fmt: skip
    if kind == "torchscript":
        traced = torch.jit.trace(eager, example, check_trace=False, strict=False)
        return ModelMode(traced, contextlib.nullcontext)
    if kind == "peer" and mode_cfg.name == "flaggems":
        import flag_gems

        return ModelMode(eager, flag_gems.use_gems)
    if kind == "peer" and mode_cfg.name == "liger":
        return _liger(eager, MODELS[eager.name])
    raise ConfigError(f"mode {mode_cfg.name!r} does not apply to a whole model")


def _liger(eager: ModelUnderTest, spec: ModelSpec) -> ModelMode:
    """Liger's patch on a copy of the model: its apply function rebinds the instance's modules
    and swaps functions in the family's transformers module. Those module attributes are put
    back at once and swapped in only while a liger step runs, so the eager model timed beside it
    in this process keeps transformers' own code."""
    family = importlib.import_module(type(eager.net).__module__)
    patched = copy.deepcopy(eager)
    before = dict(vars(family))
    liger = importlib.import_module("liger_kernel.transformers")
    getattr(liger, spec.liger)(model=patched.net)
    swapped = {k: v for k, v in vars(family).items() if before.get(k, _ABSENT) is not v}
    for key in swapped:
        if key in before:
            setattr(family, key, before[key])
        else:
            delattr(family, key)
    return ModelMode(patched, lambda: _attributes(family, swapped))


_ABSENT = object()


@contextlib.contextmanager
def _attributes(owner, values: dict):
    saved = {k: getattr(owner, k, _ABSENT) for k in values}
    for key, value in values.items():
        setattr(owner, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is _ABSENT:
                delattr(owner, key)
            else:
                setattr(owner, key, value)
