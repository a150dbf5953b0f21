"""Whole models (experiments/models.py): each library's tiny variant in every mode on the CPU,
checked against float64 by the dashboard's rule, with kernels.enable()'s routed calls counted;
which modes apply to which model; and a model job through the real CLI.

The fast suite checks our kernels under every model's own calls (mode=triton, inference) and one
training step; the slow marker holds the grid of every mode and pass on every tiny model.
"""

import importlib
import json
import math
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from experiments import model_measure, models, registry
from experiments.correctness import tolerance
from experiments.errors import ConfigError
from experiments.registry import make_workload
from kernels import routing
from tests.conftest import CONF_DIR, DEVICE, REPO_ROOT

MODELS = list(models.MODELS)
# the modes that apply to every model (the peers: test_the_peer_modes_say_where_they_apply)
MODES = ["eager", "triton", "triton-compiled", "default", "reduce-overhead", "max-autotune",
         "max-autotune-no-cudagraphs", "torchscript"]  # fmt: skip


def _conf(group: str, name: str):
    return OmegaConf.load(CONF_DIR / group / f"{name}.yaml")


def _row(model: str, mode: str, train: bool, dtype=torch.float32, **options) -> model_measure.Row:
    kernel = OmegaConf.merge(_conf("kernel", model), options)
    workload = make_workload(kernel)
    (shape,) = [workload.with_variant(workload.parse_shape(OmegaConf.to_container(s)),
                                      torch.device(DEVICE)) for s in kernel.shape_sets.cpu]
    return model_measure.prepare(workload, shape, _conf("mode", mode), _conf("compile", "default"),
                                 dtype, torch.device(DEVICE), train, seed=0)  # fmt: skip


def _checked(model, mode, train, dtype=torch.float32, dtype_name="fp32", **options):
    torch.compiler.reset()
    row = _row(model, mode, train, dtype, **options)
    row.first_step()  # the first call: a compile mode compiles here
    return row, model_measure.check(row, tolerance(dtype_name, tf32=False), seed=1)


def _all_ours(fallbacks: dict) -> bool:
    return all(set(counts) == {routing.OURS} for counts in fallbacks.values())


# ---------------------------------------------------------------------------------------------
# Registered like ops, with configs, tiny variants and clear errors
# ---------------------------------------------------------------------------------------------
def test_every_model_is_a_registry_entry_with_its_config():
    assert registry.names("model") == MODELS
    for name in MODELS:
        spec, kernel = registry.OPS[name], _conf("kernel", name)
        assert spec.kind == "model" and spec.passes == ("fwd", "fwd_bwd") and spec.bench
        assert kernel.name == name and set(kernel.shape_sets) >= {"default", "cpu"}
        workload = make_workload(kernel)
        shape = workload.with_variant({"batch": 2, workload.shape_keys[1]: 16}, torch.device("cpu"))
        assert workload.label(shape) == "2x16-tiny"
        assert workload.with_variant({}, torch.device("cuda"))["variant"] == "full"


def test_an_unknown_model_or_variant_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown kernel 'resnet5'.*resnet50"):
        make_workload(OmegaConf.create({"name": "resnet5"}))
    with pytest.raises(ConfigError, match=r"kernel.variant='small'; choose one of"):
        make_workload(OmegaConf.create({**_conf("kernel", "resnet50"), "variant": "small"}))


def test_the_cli_refuses_an_unknown_model_in_one_line():
    result = subprocess.run([sys.executable, "-m", "experiments.run", "kernel=resnet5"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "resnet50" in lines[0] and "llama" in lines[0], result.stderr


def test_the_peer_modes_say_where_they_apply(monkeypatch):
    def reason(mode, model):
        return models.unsupported(_conf("mode", mode), model)

    assert "no model-level patch" in reason("quack", "resnet50")
    assert "patches transformers model families" in reason("liger", "resnet50")
    assert "launches one op's kernel directly" in reason("liger-direct", "llama")
    for mode in MODES:
        assert reason(mode, "llama") is None
    if DEVICE != "cuda":
        assert reason("liger", "llama") == models.LIGER_ON_CPU
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "timm" else real(name, *a))  # fmt: skip
    assert reason("eager", "vit_b_16") == ("unavailable: timm is not installed (requirements.txt; "
                                           "`make setup` installs it)")  # fmt: skip


def test_accuracy_follows_the_dashboard_rule():
    g = torch.Generator().manual_seed(0)
    want = [torch.randn(50, generator=g, dtype=torch.float64) for _ in range(3)]
    base = [w + 1e-3 * torch.randn(50, generator=g, dtype=torch.float64) for w in want]
    close = [w + 1.5e-3 * torch.randn(50, generator=g, dtype=torch.float64) for w in want]
    checked = model_measure.accuracy(close, base, want, dtype_tolerance=1e-4)
    assert checked["pass"] and 1.0 < checked["ratio"] < 2.0 and not checked["failing"]
    off = [*close[:2], want[2] + 1e-2 * torch.randn(50, generator=g, dtype=torch.float64)]
    checked = model_measure.accuracy(off, base, want, dtype_tolerance=1e-4)
    assert not checked["pass"] and checked["failing"] == [2]
    exact = model_measure.accuracy(want, want, want, dtype_tolerance=1e-4)
    assert exact["pass"] and exact["ratio"] == 0.0 and exact["worst"] == 0.0
    assert model_measure.accuracy(base, want, want, 1e-4)["ratio"] == math.inf


def test_accuracy_allows_16_bit_floats_three_times_eager_s_error_or_eager_s_own_result():
    g = torch.Generator().manual_seed(1)
    want = [torch.randn(4000, generator=g, dtype=torch.float64)]
    noise = torch.randn(4000, generator=g, dtype=torch.float64)
    base, ours = [want[0] + 1e-3 * noise], [want[0] + 2.5e-3 * noise]  # 2.5x eager's error
    tol = 1e-5  # below both differences: only the error rule can pass them
    assert not model_measure.accuracy(ours, base, want, tol)["pass"]  # fp64: at most 2x
    half = model_measure.accuracy([ours[0].bfloat16()], [base[0].bfloat16()], want, 1e-5)
    assert half["pass"] == (half["worst"] <= 3 * half["eager_worst"] + tol / 10)
    # 6x eager's error, yet allclose to eager's own result at the dtype's tolerance: passes
    far = [want[0] + 6e-3 * noise]
    assert model_measure.accuracy(far, base, want, 3e-2)["pass"]
    assert not model_measure.accuracy(far, base, want, 1e-4)["pass"]


# ---------------------------------------------------------------------------------------------
# Our kernels under each model's own calls
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow  # 2-8 s a model in the interpreter; the fast suite's routing: test_routing
@pytest.mark.parametrize("model", MODELS)
def test_our_kernels_take_every_call_of_each_model(model):
    """mode=triton, inference: every conv2d, linear, matmul and softmax call of the library's
    module goes to our kernels, and the logits pass the float64 check."""
    _, checked = _checked(model, "triton", train=False)
    assert checked["finite"] and checked["pass"], checked
    assert checked["fallbacks"] and _all_ours(checked["fallbacks"]), checked["fallbacks"]


@pytest.mark.slow
def test_llama_with_sdpa_attention_takes_the_fused_attention():
    """kernel.attention=sdpa: transformers' SDPA attention calls F.scaled_dot_product_attention
    once a layer, and kernels.enable() sends each to the fused attention."""
    _, checked = _checked("llama", "triton", train=False, attention="sdpa")
    assert checked["finite"] and checked["pass"], checked
    layers = _conf("kernel", "llama").tiny.layers
    assert checked["fallbacks"]["sdpa"] == {routing.OURS: layers} and "softmax" not in checked[
        "fallbacks"]  # fmt: skip


@pytest.mark.slow
def test_a_training_step_routes_forward_and_backward():
    row, checked = _checked("convnext_tiny", "triton", train=True)
    assert checked["finite"] and checked["pass"], checked
    assert _all_ours(checked["fallbacks"])
    assert {"conv2d", "linear"} <= set(checked["fallbacks"])
    before = [p.detach().clone() for p in row.eager.parameters()]
    row.step()  # the timed step also takes the SGD update
    assert any(not torch.equal(b, p) for b, p in zip(before, row.eager.parameters(), strict=True))


# ---------------------------------------------------------------------------------------------
# The grid: every mode and pass on every tiny model
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True], ids=["fwd", "fwd_bwd"])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_every_mode_on_every_tiny_model(model, mode, train):
    _, checked = _checked(model, mode, train)
    assert checked["finite"] and checked["pass"], checked
    if mode.startswith("triton"):
        assert _all_ours(checked["fallbacks"]), checked["fallbacks"]
    else:
        assert checked["fallbacks"] is None


@pytest.mark.slow
@pytest.mark.parametrize("train", [False, True], ids=["fwd", "fwd_bwd"])
def test_liger_patches_a_copy_and_leaves_transformers_as_it_was(train):
    pytest.importorskip("liger_kernel")
    from transformers.models.llama import modeling_llama

    before = dict(vars(modeling_llama))
    row = _row("llama", "liger", train)  # the patch, on a copy of the model
    assert dict(vars(modeling_llama)) == before  # eager, beside it, runs transformers' own code
    assert row.mode.module is not row.eager
    with row.mode.context():
        assert modeling_llama.apply_rotary_pos_emb is not before["apply_rotary_pos_emb"]
    assert dict(vars(modeling_llama)) == before
    if DEVICE == "cuda":  # its kernels do not run in the interpreter (models.LIGER_ON_CPU)
        row.first_step()
        checked = model_measure.check(row, tolerance("fp32", tf32=False), seed=1)
        assert checked["finite"] and checked["pass"], checked
        assert dict(vars(modeling_llama)) == before


@pytest.mark.slow
@pytest.mark.integration
def test_a_model_sweep_through_the_cli(tmp_path):
    """`make sweep kernel=llama mode=eager,triton pass=fwd_bwd`: the harness's model rows, with
    the dashboard's figures, and flaggems' row skipped on a CPU with its reason."""
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", "--multirun", "kernel=llama",
         "mode=triton,flaggems", "pass=fwd_bwd", "dtype=fp32", "bench=quick",
         "wandb.mode=disabled", f"hydra.sweep.dir={tmp_path}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for path in sorted(tmp_path.glob("*/results.jsonl"))
            for line in path.read_text().splitlines()]  # fmt: skip
    ours, peer = rows
    assert ours["status"] == "ok" and ours["kernel"] == "llama"
    assert ours["shape"]["variant"] == "tiny"
    assert ours["accuracy_pass"] and ours["accuracy_ratio"] is not None
    assert ours["fallbacks"]["linear"] == {"ours": ours["fallbacks"]["linear"]["ours"]}
    assert ours["fallback_share"] == 0.0 and ours["flops"] > 0
    assert ours["eager_max_rel_err"] > 0 and ours["compile_cold_s"] > 0
    assert peer["status"] == "skipped" and "flag-gems" in peer["reason"]
