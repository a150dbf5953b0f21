"""The op registry: every op is declared once and found everywhere; a new op needs only its own
files; a mode that lacks an op gives skipped rows.

test_a_new_op_runs_through_the_harness adds a real op the way README.md's "Extending" section
says: a Triton kernel, a registry entry (module, workload, OpSpec), a conf/kernel YAML and this
test file. Nothing else in the repo changes, and the real harness measures it.
"""

import pytest
import torch
import triton
import triton.language as tl
from torch import nn

from experiments import registry
from experiments.workloads import Workload
from tests.conftest import CONF_DIR, REPO_ROOT

# the composed blocks (experiments/blocks.py) have no kernel package: tests/test_blocks.py; the
# whole models (experiments/models.py) neither: tests/test_models.py
SINGLE_OPS = registry.names("op")


# ---------------------------------------------------------------------------------------------
# Every registered op has its package, config and tests, and the harness sees all of them
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SINGLE_OPS)
def test_each_op_has_its_files(name):
    spec = registry.OPS[name]
    assert (CONF_DIR / "kernel" / f"{name}.yaml").is_file()
    assert spec.triton.partition(":")[0] == "kernels", "reached through the public kernels API"
    # The op's package is where its public function lives (sdpa is kernels/attention's).
    root, package = registry.resolve(spec.triton).__module__.split(".")[:2]
    assert root == "kernels" and (REPO_ROOT / "kernels" / package / "__init__.py").is_file()
    assert (REPO_ROOT / "tests" / f"test_kernels_{package}.py").is_file()
    assert callable(registry.resolve(spec.triton))
    assert callable(registry.resolve(spec.triton_compiled))
    assert spec.workload.name == name and spec.bench, "every op declares its bench grids"


def test_namespaces_hold_every_op():
    for impl in ("eager", "triton", "triton_compiled"):
        ns = registry.namespace(impl)
        assert set(vars(ns)) == {registry.OPS[name].function for name in SINGLE_OPS}


def test_memory_bound_ops_are_declared_not_guessed():
    assert registry.is_memory_bound("softmax") and not registry.is_memory_bound("matmul")
    assert not registry.is_memory_bound("an-op-since-removed")


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="bound"):
        registry.OpSpec("x", "x", Workload, torch.neg, None, None, bound="io")
    with pytest.raises(ValueError, match="passes"):
        registry.OpSpec("x", "x", Workload, torch.neg, None, None, bound="memory", passes=("bwd",))


# ---------------------------------------------------------------------------------------------
# A new op through the new path: kernel, registry entry, conf YAML, test
# ---------------------------------------------------------------------------------------------
@triton.jit
def square_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * x, mask=mask)


def square(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    square_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y


class Square(nn.Module):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def forward(self, x):
        return self.ops.square(x)


class SquareWorkload(Workload):
    name = "square"
    shape_keys = ("n",)

    def make_module(self, shape, ops):
        return Square(ops)

    def input_sizes(self, shape):
        return [(shape["n"],)]

    def flops(self, shape, pass_name):
        return float(shape["n"])

    def min_bytes(self, shape, pass_name, itemsize):
        return 2.0 * shape["n"] * itemsize


SQUARE_YAML = """\
name: square
default_shapes: cpu
shape_sets:
  cpu: [{n: 1000}, {n: 4097}]
"""


@pytest.fixture
def square_op(tmp_path):
    registry.register(registry.OpSpec(
        name="square", function="square", workload=SquareWorkload, eager=torch.square,
        triton="tests.test_registry:square", triton_compiled=None, bound="memory",
        bench=("kernel=square mode=triton",),
    ))  # fmt: skip
    (tmp_path / "conf" / "kernel").mkdir(parents=True)
    (tmp_path / "conf" / "kernel" / "square.yaml").write_text(SQUARE_YAML)
    yield f"hydra.searchpath=[file://{tmp_path / 'conf'}]"
    registry.unregister("square")


def _run(compose_job, *overrides):
    from experiments.run import run

    cfg = compose_job(["bench=quick", "wandb.mode=disabled", "dtype=fp32", *overrides])
    return run(cfg)


def test_a_new_op_runs_through_the_harness(compose_job, square_op):
    rows = _run(compose_job, square_op, "kernel=square", "mode=triton")
    assert [r["shape_label"] for r in rows] == ["1000", "4097"]
    for row in rows:
        assert row["status"] == "ok", row["reason"]
        assert row["kernel"] == "square" and row["max_rel_err"] <= row["tolerance"]


def test_a_mode_without_the_op_gives_skipped_rows(compose_job, square_op):
    rows = _run(compose_job, square_op, "kernel=square", "mode=triton-compiled")
    assert [r["status"] for r in rows] == ["skipped", "skipped"]
    assert all(r["reason"].startswith("unsupported") for r in rows)


def test_a_mode_declares_its_ops(compose_job):
    rows = _run(compose_job, "kernel=softmax", "mode=eager", "mode.ops=[matmul]")
    assert {r["status"] for r in rows} == {"skipped"}
    assert all("does not implement softmax" in r["reason"] for r in rows)
