"""The op shape sets of the models, recorded, not typed in: every conv2d, linear, matmul and
softmax call (and SDPA call, for the Llama decoder with SDPA attention) that kernels.enable() sees
in one inference and one training step of each model, as the op workloads' shapes.

    python -m experiments.model_shapes --write   # record every model, write conf/kernel/recorded/
    python -m experiments.model_shapes --check   # exit 1 where a file is not a fresh recording

conf/kernel/recorded/<op>.yaml holds one set per model (`shapes=<model>`, at the model's default
size, and `shapes=<model>_tiny`, its tiny CPU variant); conf/kernel/<op>.yaml merges it into its
shape_sets through its defaults list, so `make experiment kernel=conv shapes=resnet50`, `make
bench` and the study run them like any set. A set lists each distinct call once, in the order the
model first makes it, with how many times a step makes it; the training step's forward makes the
same calls as inference (its backward runs our backward kernels at the forward's shapes, so
pass=fwd_bwd of the same set is the training step's work).

Recording runs each model on the meta device: tensors with shapes and no data, so even the full
models record on a CPU in about a second, with the CPU's pinned library versions (the file header
names them; a library that changes how a model calls torch changes the sets). Routing refuses
every meta tensor, so each call goes to torch and is recorded as the model made it. One
transformers helper (masking_utils.find_packed_sequence_indices) reads a tensor's value, which
the meta device has not: it is patched, while recording, to its answer for these inputs (no
packed sequences: position ids 0..seq-1 in every row).
"""

import argparse
import contextlib
import importlib.metadata
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import OmegaConf

from experiments import models, registry
from experiments.workloads import kernel_config

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
RECORDED_DIR = CONF_DIR / "kernel" / "recorded"
OPS = ("conv", "linear", "matmul", "softmax", "sdpa")  # the registry ops a call can become
LIBRARIES = ("torch", "torchvision", "timm", "transformers")
# (set name, model, kernel config overrides): Llama twice, its attention written out (matmul,
# softmax) and through SDPA
RECORDINGS = tuple(
    [(name, name, {}) for name in models.MODELS if name != "llama"]
    + [("llama", "llama", {"attention": "eager"}), ("llama_sdpa", "llama", {"attention": "sdpa"})]
)


# ---------------------------------------------------------------------------------------------
# A routed call as an op workload's shape
# ---------------------------------------------------------------------------------------------
def _single(value, name: str):
    """An int from a conv argument given as an int or a pair of equal ints."""
    if isinstance(value, int):
        return value
    if isinstance(value, (tuple, list)) and len(set(value)) == 1:
        return int(value[0])
    raise ValueError(f"{name}={value!r} differs per side")


def _conv(call: dict) -> dict:
    x, w = call["x"], call["weight"]
    n, c, h, wd = x if len(x) == 4 else [1, *x]
    if isinstance(call["padding"], str):
        raise ValueError(f"padding={call['padding']!r}")
    shape = {"n": n, "c": c, "h": h, "w": wd, "k": w[0], "r": w[2], "s": w[3]}
    extras = {"stride": _single(call["stride"], "stride"),
              "padding": _single(call["padding"], "padding"),
              "dilation": _single(call["dilation"], "dilation"), "groups": call["groups"]}
    defaults = registry.OPS["conv"].workload.shape_defaults
    return {**shape, **{k: v for k, v in extras.items() if v != defaults[k]}}


def _linear(call: dict) -> dict:
    x, w = call["x"], call["weight"]
    return {"m": math.prod(x[:-1]), "n": w[0], "k": w[1]}


def _addmm(call: dict) -> dict:
    a, b = call["a"], call["b"]
    return {"m": a[0], "n": b[1], "k": a[1]}


def _matmul(call: dict) -> dict:
    a, b = call["a"], call["b"]
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"a 1-D operand ({a} @ {b})")
    if len(b) == 2:  # a batched a against one matrix: one GEMM of every row
        return {"m": math.prod(a[:-1]), "n": b[1], "k": a[-1]}
    if a[:-2] != b[:-2]:
        raise ValueError(f"broadcast batch dims ({a} @ {b})")
    batch = math.prod(a[:-2])
    shape = {"m": a[-2], "n": b[-1], "k": a[-1]}
    return {"batch": batch, **shape} if batch > 1 else shape


def _softmax(call: dict) -> dict:
    x, dim = call["x"], call["dim"]
    if dim not in (-1, len(x) - 1):
        raise ValueError(f"softmax over dim {dim} of {len(x)}")
    return {"m": math.prod(x[:-1]), "n": x[-1]}


def _sdpa(call: dict) -> dict:
    q, k = call["q"], call["k"]
    if call["mask"] or call["dropout_p"]:
        raise ValueError("an attn_mask or dropout")
    if q[2] != k[2]:
        raise ValueError(f"{q[2]} queries over {k[2]} keys")
    shape = {"batch": q[0], "heads": q[1], "kv_heads": k[1], "seq": q[2], "head_dim": q[3]}
    return {**shape, "causal": 1} if call["causal"] else shape


# routing's op name -> (registry op, the converter of its recorded call)
CONVERTERS = {"conv2d": ("conv", _conv), "linear": ("linear", _linear),
              "addmm": ("linear", _addmm), "matmul": ("matmul", _matmul),
              "mm": ("matmul", _matmul), "bmm": ("matmul", _matmul),
              "softmax": ("softmax", _softmax), "sdpa": ("sdpa", _sdpa)}  # fmt: skip


@dataclass
class ShapeSet:
    """One model's distinct calls of one op, in first-call order, with their counts."""

    shapes: list[dict] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def add(self, shape: dict) -> None:
        if shape in self.shapes:
            self.counts[self.shapes.index(shape)] += 1
        else:
            self.shapes.append(shape)
            self.counts.append(1)


# ---------------------------------------------------------------------------------------------
# Recording
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _meta_safe_transformers():
    try:
        import transformers.masking_utils as masking
    except ImportError:
        yield
        return
    original = masking.find_packed_sequence_indices
    masking.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking.find_packed_sequence_indices = original


def _meta_inputs(workload, shape, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    (size,) = workload.input_sizes(shape)
    meta = torch.device("meta")
    if workload.spec.inputs == "tokens":
        x = torch.zeros(size, dtype=torch.long, device=meta)
        labels = torch.zeros(size, dtype=torch.long, device=meta)
    else:
        x = torch.empty(size, dtype=dtype, device=meta)
        if workload.spec.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        labels = torch.zeros(size[0], dtype=torch.long, device=meta)
    return x, labels


def record_calls(model: str, tiny: bool, overrides: dict | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> list[dict]:  # fmt: skip
    """kernels.enable()'s record of one inference and one training forward of `model` (its
    default shape, or its tiny variant's cpu shape) on the meta device."""
    from kernels import routing

    cfg = OmegaConf.merge(kernel_config(model), overrides or {})
    workload = registry.make_workload(cfg)
    raw = cfg.shape_sets["cpu" if tiny else cfg.default_shapes][0]
    shape = {**workload.parse_shape(OmegaConf.to_container(raw)),
             "variant": "tiny" if tiny else "full"}  # fmt: skip
    with torch.device("meta"):
        module = workload.build(shape, seed=0)
    module = module.to(dtype=dtype)
    if workload.spec.channels_last:
        module = module.to(memory_format=torch.channels_last)
    x, labels = _meta_inputs(workload, shape, dtype)
    calls: list[dict] = []
    with _meta_safe_transformers(), routing.enabled(record=calls):
        module.eval()
        with torch.no_grad():
            module(x)
        module.train()
        module(x, labels)  # the training step's forward: its calls, with grad enabled
    return calls


def shape_sets(calls: list[dict], train_only: bool = False) -> tuple[dict[str, ShapeSet], list]:
    """{registry op: ShapeSet} of one model's recorded calls (its inference calls: the training
    forward repeats them), and the calls no op workload can express, with why."""
    sets: dict[str, ShapeSet] = {}
    left: list[tuple[dict, str]] = []
    for call in calls:
        if call["grad"] != train_only:
            continue
        op, convert = CONVERTERS[call["op"]]
        try:
            shape = convert(call)
        except ValueError as why:
            left.append((call, str(why)))
            continue
        sets.setdefault(op, ShapeSet()).add(shape)
    return sets, left


def recorded() -> tuple[dict[str, dict[str, ShapeSet]], dict[str, list[str]]]:
    """{op: {set name: ShapeSet}} of every model and its tiny variant, and {op: notes}: every
    call left out and why, and any model whose training forward calls differ from inference's."""
    by_op: dict[str, dict[str, ShapeSet]] = {op: {} for op in OPS}
    notes: dict[str, list[str]] = {op: [] for op in OPS}
    for name, model, overrides in RECORDINGS:
        for tiny in (False, True):
            set_name = f"{name}_tiny" if tiny else name
            calls = record_calls(model, tiny, overrides)
            sets, left = shape_sets(calls)
            train, _ = shape_sets(calls, train_only=True)
            for op in OPS:
                if op in sets:
                    by_op[op][set_name] = sets[op]
                if (train[op].shapes if op in train else None) != (
                        sets[op].shapes if op in sets else None):  # fmt: skip
                    notes[op].append(f"{set_name}: the training forward's calls differ from "
                                     "inference's (the set is inference's)")  # fmt: skip
            for call, why in left:
                op = CONVERTERS[call["op"]][0]
                notes[op].append(f"{set_name}: a {call['op']} call with {why}")
    return by_op, notes


# ---------------------------------------------------------------------------------------------
# The files
# ---------------------------------------------------------------------------------------------
def _versions() -> str:
    found = []
    for lib in LIBRARIES:
        try:
            found.append(f"{lib} {importlib.metadata.version(lib)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{lib} absent")
    return ", ".join(found)


def _flow(shape: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in shape.items()) + "}"


def file_text(op: str, sets: dict[str, ShapeSet], notes: list[str]) -> str:
    lines = [
        f"# {op}: the calls of each model, recorded by `python -m experiments.model_shapes "
        "--write`; do not edit.",
        f"# Recorded on the meta device with {_versions()}.",
        "# shapes=<model>: one inference step at the model's default size (a training step's "
        "forward makes",
        "# the same calls); <model>_tiny: its tiny CPU variant. `# xN`: calls per step.",
    ]
    lines += [f"# left out: {note}" for note in notes]
    for name, shape_set in sets.items():
        total = sum(shape_set.counts)
        lines.append(f"{name}:  # {total} calls, {len(shape_set.shapes)} distinct")
        lines += [f"  - {_flow(s)}  # x{n}" for s, n in zip(shape_set.shapes, shape_set.counts,
                                                          strict=True)]  # fmt: skip
    return "\n".join(lines) + "\n"


def outputs() -> dict[Path, str]:
    """Each conf/kernel/recorded/<op>.yaml and its text from a fresh recording."""
    by_op, notes = recorded()
    return {RECORDED_DIR / f"{op}.yaml": file_text(op, by_op[op], notes[op]) for op in OPS}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="record and write the files")
    action.add_argument("--check", action="store_true", help="exit 1 where a file differs")
    args = parser.parse_args(argv)
    made = outputs()
    stale = [path for path, text in made.items()
             if not path.is_file() or path.read_text() != text]  # fmt: skip
    if args.check:
        for path in stale:
            print(f"{path.relative_to(CONF_DIR.parent)} is not a fresh recording: run "
                  "`python -m experiments.model_shapes --write`", file=sys.stderr)  # fmt: skip
        return 1 if stale else 0
    RECORDED_DIR.mkdir(parents=True, exist_ok=True)
    for path in stale:
        path.write_text(made[path])
        print(f"wrote {path.relative_to(CONF_DIR.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
