"""The shape sets recorded from the models (experiments/model_shapes.py): the committed files are
a fresh recording, each call becomes the op workload's shape it is, Hydra and the scripts that
load one op's config see the same sets, and the harness runs a recorded set like any other."""

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments import model_shapes, registry
from experiments.workloads import kernel_config, resolve_shapes
from kernels import routing
from tests.conftest import CONF_DIR


def _committed(op: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(model_shapes.RECORDED_DIR / f"{op}.yaml"))


@pytest.mark.parametrize("name, model, overrides", model_shapes.RECORDINGS,
                         ids=[r[0] for r in model_shapes.RECORDINGS])  # fmt: skip
def test_the_tiny_sets_are_a_fresh_recording(name, model, overrides):
    """Each model's tiny variant recorded now gives its committed `<model>_tiny` sets, op by op
    (the full models: test_the_files_are_a_fresh_recording)."""
    sets, _ = model_shapes.shape_sets(model_shapes.record_calls(model, True, overrides))
    assert sets, f"{name}: no call recorded"
    for op in model_shapes.OPS:
        committed = _committed(op).get(f"{name}_tiny")
        assert committed == (sets[op].shapes if op in sets else None), (op, name)


@pytest.mark.slow
def test_the_files_are_a_fresh_recording():
    """Every model at its full size too (2-3 s: every model and variant recorded again)."""
    assert model_shapes.main(["--check"]) == 0


def test_the_full_resnet50_is_recorded_as_its_layers():
    """ResNet-50 at batch 32: 53 convs of 23 distinct shapes, the stem first, and its fc; the
    counts come with them (the committed file, written by the recording)."""
    conv = _committed("conv")["resnet50"]
    assert len(conv) == 23 and conv[0] == {"n": 32, "c": 3, "h": 224, "w": 224, "k": 64, "r": 7,
                                           "s": 7, "stride": 2, "padding": 3}  # fmt: skip
    assert _committed("linear")["resnet50"] == [{"m": 32, "n": 1000, "k": 2048}]
    text = (model_shapes.RECORDED_DIR / "conv.yaml").read_text()
    assert "resnet50:  # 53 calls, 23 distinct" in text


# ---------------------------------------------------------------------------------------------
# A call as a shape
# ---------------------------------------------------------------------------------------------
def test_each_call_becomes_the_op_workload_s_shape():
    conv = {"x": [8, 16, 9, 9], "weight": [32, 4, 3, 3], "stride": (2, 2), "padding": (1, 1),
            "dilation": (1, 1), "groups": 4}  # fmt: skip
    assert model_shapes._conv(conv) == {"n": 8, "c": 16, "h": 9, "w": 9, "k": 32, "r": 3,
                                        "s": 3, "stride": 2, "padding": 1, "groups": 4}  # fmt: skip
    with pytest.raises(ValueError, match="differs per side"):
        model_shapes._conv({**conv, "stride": (1, 2)})
    with pytest.raises(ValueError, match="same"):
        model_shapes._conv({**conv, "padding": "same"})
    assert model_shapes._linear({"x": [4, 7, 64], "weight": [96, 64]}) == {"m": 28, "n": 96,
                                                                           "k": 64}  # fmt: skip
    assert model_shapes._addmm({"a": [5, 8], "b": [8, 3]}) == {"m": 5, "n": 3, "k": 8}
    assert model_shapes._matmul({"a": [2, 3, 5, 8], "b": [2, 3, 8, 4]}) == {
        "batch": 6, "m": 5, "n": 4, "k": 8}  # fmt: skip
    assert model_shapes._matmul({"a": [2, 5, 8], "b": [8, 4]}) == {"m": 10, "n": 4, "k": 8}
    with pytest.raises(ValueError, match="broadcast"):
        model_shapes._matmul({"a": [2, 5, 8], "b": [1, 8, 4]})
    assert model_shapes._softmax({"x": [3, 4, 10], "dim": -1}) == {"m": 12, "n": 10}
    with pytest.raises(ValueError, match="dim 1"):
        model_shapes._softmax({"x": [3, 4, 10], "dim": 1})
    sdpa = {"q": [2, 8, 33, 64], "k": [2, 2, 33, 64], "causal": True, "mask": False,
            "dropout_p": 0.0}  # fmt: skip
    assert model_shapes._sdpa(sdpa) == {"batch": 2, "heads": 8, "kv_heads": 2, "seq": 33,
                                        "head_dim": 64, "causal": 1}  # fmt: skip
    with pytest.raises(ValueError, match="keys"):
        model_shapes._sdpa({**sdpa, "k": [2, 2, 40, 64]})


def test_a_set_counts_repeats_in_first_call_order():
    shape_set = model_shapes.ShapeSet()
    for shape in ({"m": 2}, {"m": 1}, {"m": 2}, {"m": 2}):
        shape_set.add(shape)
    assert shape_set.shapes == [{"m": 2}, {"m": 1}] and shape_set.counts == [3, 1]


def test_torch_s_own_calls_inside_a_routed_call_are_not_the_model_s():
    """On the meta device F.linear runs as a Python decomposition that calls torch.mm, which is
    routed too: only the model's call, linear, is counted and recorded."""
    calls = []
    x, w = (torch.empty(4, 8, device="meta"), torch.empty(3, 8, device="meta"))
    routing.reset_counts()
    with routing.enabled(record=calls):
        F.linear(x, w)
    assert [c["op"] for c in calls] == ["linear"] and calls[0]["reason"] == "meta tensor"
    assert set(routing.counts()) == {"linear"}


# ---------------------------------------------------------------------------------------------
# The sets in the configs and the harness
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", model_shapes.OPS)
def test_hydra_and_kernel_config_see_the_same_sets(op):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        composed = compose("config", overrides=[f"kernel={op}"]).kernel
    direct = kernel_config(op)
    assert OmegaConf.to_container(composed.shape_sets) == OmegaConf.to_container(
        direct.shape_sets)  # fmt: skip
    assert set(_committed(op)) <= set(composed.shape_sets) and "cpu" in composed.shape_sets
    assert "defaults" not in composed and "defaults" not in direct


def test_a_recorded_set_runs_like_any_set():
    cfg = kernel_config("conv")
    workload = registry.make_workload(cfg)
    name, shapes = resolve_shapes(workload, cfg, "mobilenet_v2", on_gpu=True)
    assert name == "mobilenet_v2" and len(shapes) == len(_committed("conv")["mobilenet_v2"])
    depthwise = [s for s in shapes if s["groups"] == s["c"] > 1]
    assert depthwise and all(s["k"] == s["c"] for s in depthwise)
