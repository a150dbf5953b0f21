"""Turn a mode config into the callable that is measured: one builder per kind of mode.

Every builder starts from the same eager module, so the parameters, inputs and forward code are
shared and only the execution strategy differs.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

from experiments.errors import ConfigError
from experiments.registry import custom_ops, triton_ops
from experiments.schema import MODE_KINDS as KINDS
from experiments.workloads import with_ops


@dataclass
class Impl:
    module: nn.Module | torch.jit.ScriptModule
    compiled: bool = False  # goes through torch.compile (compile time and Inductor code apply)
    cudagraphs: bool = False  # runs as CUDA-graph trees (reduce-overhead, max-autotune)
    options: dict = field(default_factory=dict)  # resolved Inductor options, for the record


def check_mode(mode_cfg) -> None:
    if mode_cfg.kind not in KINDS:
        raise ConfigError(
            f"mode {mode_cfg.name!r} has unknown kind {mode_cfg.kind!r}; one of {KINDS}"
        )
    if mode_cfg.kind in ("peer", "peer_direct"):
        from experiments import peers

        peers.check(mode_cfg)


# Inductor launches the kernels it generates through its static CUDA launcher (one C call), but a
# user-defined Triton kernel, such as ours in triton-compiled, through Triton's Python launcher
# (several Python frames per launch, docs/kernels/host_path.md) unless this is set. Setting it
# gives our kernels the launcher the compile modes' own kernels get; a kernel the static launcher
# cannot take falls back to Triton's.
USER_KERNEL_OPTIONS = {"static_launch_user_defined_triton_kernels": True}


def kind_options(mode_cfg) -> dict:
    """The Inductor options a kind of mode adds to its compile mode's."""
    return USER_KERNEL_OPTIONS if mode_cfg.kind == "triton_compiled" else {}


def resolved_options(compile_mode: str, user_options: dict, kind_extra=None) -> dict:
    """The Inductor options a mode runs with: the compile mode's own, the mode kind's extra ones
    (kind_options), then the user's on top."""
    mode_options = torch._inductor.list_mode_options(compile_mode)
    return {**mode_options, **(kind_extra or {}), **user_options}


def compile_module(module, compile_mode, compile_cfg, fullgraph, kind_extra=None) -> Impl:
    user_options = dict(compile_cfg.options or {})
    options = resolved_options(compile_mode, user_options, kind_extra)
    # torch.compile takes a mode or an options dict, not both: with options of our own, pass the
    # merge.
    how = {"options": options} if user_options or kind_extra else {"mode": compile_mode}
    compiled = torch.compile(module, fullgraph=fullgraph, dynamic=compile_cfg.dynamic, **how)
    return Impl(
        compiled, compiled=True, cudagraphs=bool(options.get("triton.cudagraphs")), options=options
    )


def build(mode_cfg, compile_cfg, eager_module: nn.Module, example_inputs: tuple) -> Impl:
    kind = mode_cfg.kind
    if kind == "eager":
        return Impl(eager_module)
    if kind == "triton":
        return Impl(with_ops(eager_module, triton_ops()))
    if kind == "compile":
        return compile_module(eager_module, mode_cfg.compile_mode, compile_cfg,
                              compile_cfg.fullgraph)
    if kind == "triton_compiled":
        # fullgraph=True is the point of this mode: a graph break would be an error, not a count.
        return compile_module(with_ops(eager_module, custom_ops()), mode_cfg.compile_mode,
                              compile_cfg, fullgraph=True,
                              kind_extra=kind_options(mode_cfg))  # fmt: skip
    if kind in ("peer", "peer_direct"):  # experiments/peers.py: the library imports here
        from experiments import peers

        return Impl(with_ops(eager_module, peers.namespace(mode_cfg)))
    if kind == "torchscript":
        traced = torch.jit.trace(eager_module, example_inputs, check_trace=False)
        return Impl(traced)
    raise ConfigError(f"unknown mode kind {kind!r}")
