"""The op table: the entry data type (OpSpec) and the table (OPS) that entries register into.

The base of the registry. An entry module (experiments/single_ops.py, experiments/blocks.py)
imports this module and experiments.workloads' Workload, and nothing else of the harness; it
calls `register(OpSpec(...))` once per op when imported. experiments.registry imports every
entry module, in the order its ENTRY_MODULES lists them, and holds what reads the complete table
(get, namespace, unsupported, make_workload); code that reads the table imports that, not this.

Functions:
    OpSpec           one op: its functions, Workload, bound, passes, bench grids
    register         add an entry (a second of the same name replaces the first)
    unregister       drop one (a test's op)
    latency_pairing  an entry's `experiments.paired --metric latency` arguments
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from experiments.workloads import Workload

BOUNDS = ("compute", "memory")
PASSES = ("fwd", "fwd_bwd")


@dataclass(frozen=True)
class OpSpec:
    """One op. `triton` and `triton_compiled` are "module:attribute" strings, imported on first
    use, so that reading the registry compiles and imports no kernel."""

    name: str  # kernel=<name>; the records' `kernel` column
    function: str | None  # what the workload's module calls: self.ops.<function>(...)
    workload: type[Workload]
    eager: Callable | None  # the baseline: torch ops only
    triton: str | None  # our kernel, called directly (mode=triton); None: not written yet
    triton_compiled: str | None  # our kernel as a torch.library custom op (triton-compiled)
    bound: str  # "memory" (judged by bytes moved) or "compute" (by FLOP/s)
    passes: tuple[str, ...] = ("fwd",)
    # `make bench kernel=<name>`: Hydra multirun grids, each one quoted set of overrides
    bench: tuple[str, ...] = ()
    # `python -m experiments.paired` runs after the grids: the extra arguments of each
    paired: tuple[str, ...] = ()
    markers: dict = field(default_factory=dict)  # plot styling: {"marker": "o"}
    # A block of several ops (experiments/blocks.py): the ops its module calls. It adds no
    # function to the namespaces (function and eager are None); its triton and triton_compiled
    # are set here from those ops' own, joined by "+", or None where one of them lacks it.
    composed: tuple[str, ...] = ()
    # A whole model (experiments/models.py): why a mode does not apply to it, or None; the
    # models route their own calls, so they add no function to the namespaces either
    model_modes: Callable | None = None

    @property
    def kind(self) -> str:
        """"op" (a kernel of its own), "block" (composed of ops) or "model" (a whole model)."""
        return "model" if self.model_modes is not None else "block" if self.composed else "op"

    def __post_init__(self):
        if self.bound not in BOUNDS:
            raise ValueError(f"op {self.name}: bound must be one of {BOUNDS}")
        if not set(self.passes) <= set(PASSES):
            raise ValueError(f"op {self.name}: passes must be among {PASSES}")
        if self.composed:
            parts = [OPS.get(op) for op in self.composed]
            if any(part is None or part.composed for part in parts):
                raise ValueError(f"op {self.name}: composed of registered single ops only, "
                                 f"not {list(self.composed)}")  # fmt: skip
            for impl in ("triton", "triton_compiled"):
                targets = [getattr(part, impl) for part in parts]
                joined = None if None in targets else "+".join(targets)
                object.__setattr__(self, impl, joined)  # frozen: set once, here


# name -> entry, filled by the entry modules that experiments.registry imports
OPS: dict[str, OpSpec] = {}


def latency_pairing(op: str, ours: str = "triton-compiled", compile_modes: str = "default",
                    passes=("fwd",)) -> tuple[str, ...]:  # fmt: skip
    """`experiments.paired --metric latency` runs, one a pass: ours against the compile modes in
    one process on the op's default shapes, the reading of a latency target against the compiler
    (an op's triton-compiled against default; a block's triton against the modes its grids run)."""
    return tuple(f"--kernel {op} --shapes auto --metric latency --ours {ours} --compile-modes "
                 f"{compile_modes} --pass {p} --rounds 5" for p in passes)  # fmt: skip


def register(spec: OpSpec) -> OpSpec:
    """Add an op (a second op of the same name replaces the first, as a test's op may)."""
    OPS[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    OPS.pop(name, None)
