"""The op registry: every workload the harness can run, declared once, complete on import.

An entry (`OpSpec`, experiments/op_table.py) names the op as `kernel=<name>` selects it, the
function its module calls on the ops namespace, its Workload (shapes, inputs, float64 reference,
costs), its eager function, our Triton function and the custom op that `mode=triton-compiled`
compiles, whether it is memory- or compute-bound, the passes it supports and the grids behind
`make bench`. The harness (experiments.run, experiments.bench, experiments.resources), the
analysis (figures, targets) and the parametrised tests read this module; nothing else lists the
ops.

The imports run one way: experiments.op_table holds the data type and the table; the entry
modules in ENTRY_MODULES import it and experiments.workloads (and the entries they are built on:
blocks imports single_ops), never this module, and register their ops when imported; this module
imports them all, in that order, and adds what reads the whole table. So once
`experiments.registry` has loaded, every entry is in OPS.

Adding an op (README.md, "Extend: add an op"): a kernel package under kernels/, an entry (its
nn.Module, Workload and `register(OpSpec(...))`) in an entry module, conf/kernel/<name>.yaml
with its shape sets, and tests/test_kernels_<name>.py; a new entry module is one more line of
ENTRY_MODULES. Blocks of several ops (a transformer MLP, attention, a ResNet bottleneck) are
entries too, with `composed` naming their ops (docs/blocks.md).

    python -m experiments.registry            # the ops, one line each
"""

import importlib
import sys
from collections.abc import Callable
from types import SimpleNamespace

from experiments import peers
from experiments.errors import ConfigError
from experiments.op_table import BOUNDS, OPS, PASSES, OpSpec, latency_pairing, register, unregister
from experiments.workloads import Workload

__all__ = [
    "BOUNDS", "ENTRY_MODULES", "OPS", "PASSES", "OpSpec", "check_pass", "custom_ops",
    "eager_ops", "get", "is_memory_bound", "latency_pairing", "make_workload", "names",
    "namespace", "register", "resolve", "triton_ops", "unregister", "unsupported",
]

# The modules that register entries, imported in this order: a block's entry names the single
# ops it is composed of, so they come first. Each imports experiments.op_table, never this one;
# a new entry module is one more line here.
ENTRY_MODULES = (
    "experiments.single_ops",  # matmul, linear, softmax, conv
    "experiments.blocks",  # mlp, attention, bottleneck: composed of the single ops
    "experiments.models",  # resnet50, mobilenet_v2, convnext_tiny, vit_b_16, llama: whole models
)
for _module in ENTRY_MODULES:
    importlib.import_module(_module)


def names(*kinds: str) -> list[str]:
    """The registered names of these kinds ("op", "block", "model"), in registration order."""
    return [name for name, spec in OPS.items() if spec.kind in kinds]


def get(name: str) -> OpSpec:
    if name not in OPS:
        raise KeyError(f"unknown kernel {name!r}; choose one of {sorted(OPS)}")
    return OPS[name]


def resolve(target: str) -> Callable:
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)


def namespace(impl: str) -> SimpleNamespace:
    """The ops namespace of one implementation ("eager", "triton" or "triton_compiled"): each
    registered op's function under its `function` name."""
    single = [s for s in OPS.values() if s.function]  # what blocks call; blocks and models add none
    if impl == "eager":
        return SimpleNamespace(**{s.function: s.eager for s in single})
    return SimpleNamespace(
        **{s.function: resolve(getattr(s, impl)) for s in single if getattr(s, impl)}
    )


def unsupported(mode_cfg, name: str) -> str | None:
    """Why `mode_cfg` cannot run op `name` (a skipped row's reason), or None when it can."""
    spec = OPS.get(name)
    if spec is not None and spec.model_modes is not None:
        return spec.model_modes(mode_cfg, name)
    listed = mode_cfg.get("ops", "all")
    if listed != "all" and name not in listed:
        return f"unsupported: mode {mode_cfg.name} does not implement {name}"
    impl = mode_cfg.kind  # the mode kinds named after an OpSpec field: triton, triton_compiled
    if impl in ("triton", "triton_compiled") and name in OPS and getattr(OPS[name], impl) is None:
        return f"unsupported: {name} has no {impl} implementation"
    if impl in ("peer", "peer_direct"):  # another library: its table says (experiments/peers.py)
        return peers.unsupported(mode_cfg, name)
    return None


def is_memory_bound(name: str) -> bool:
    """Unknown kernels (records of an op since removed) count as compute-bound."""
    spec = OPS.get(name)
    return spec is not None and spec.bound == "memory"


def eager_ops() -> SimpleNamespace:
    return namespace("eager")


def triton_ops() -> SimpleNamespace:
    return namespace("triton")


def custom_ops() -> SimpleNamespace:
    """The Triton kernels registered as torch.library custom ops (the triton-compiled mode)."""
    return namespace("triton_compiled")


def make_workload(kernel_cfg) -> Workload:
    """The Workload of the entry `kernel_cfg.name` names, built on that kernel config."""
    if kernel_cfg.name not in OPS:
        raise ConfigError(f"unknown kernel {kernel_cfg.name!r}; choose one of {sorted(OPS)}")
    return OPS[kernel_cfg.name].workload(kernel_cfg)


def check_pass(name: str, pass_name: str) -> None:
    """A ConfigError unless op `name`'s entry lists `pass_name` among its passes."""
    passes = get(name).passes
    if pass_name not in passes:
        raise ConfigError(f"pass={pass_name} is not supported for kernel={name}; "
                          f"choose one of {list(passes)}")  # fmt: skip


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["names"]:  # for scripts: the op names, space-separated
        print(" ".join(OPS))
        return 0
    for spec in OPS.values():
        print(f"{spec.name:<10} {spec.bound:<8} passes={','.join(spec.passes):<12} "
              f"triton={spec.triton} bench grids={len(spec.bench)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
