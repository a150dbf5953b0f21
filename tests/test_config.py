"""Every option of every config group composes, and bad choices fail with one clear message."""

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from experiments.errors import ConfigError
from experiments.registry import OPS, make_workload, names
from experiments.workloads import resolve_shapes
from tests.conftest import CONF_DIR, REPO_ROOT

GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))]


def test_groups_are_the_documented_ones():
    assert GROUPS == ["bench", "compile", "dtype", "experiment", "kernel", "launcher", "mode",
                      "pass", "wandb"]
    assert {o for g, o in OPTIONS if g == "mode"} == {
        "eager",
        "triton",
        "default",
        "reduce-overhead",
        "max-autotune",
        "max-autotune-no-cudagraphs",
        "triton-compiled",
        "torchscript",
        "flaggems",  # the peer libraries (experiments/peers.py)
        "liger",
        "quack",
        "liger-direct",  # their bare kernels (mode kind peer_direct)
        "quack-direct",
    }


NAMED_GROUPS = ("kernel", "mode", "dtype", "pass", "launcher")  # their options carry a `name`


@pytest.mark.parametrize("group,option", OPTIONS)
def test_every_option_composes(group, option):
    prefix = "+" if group == "experiment" else ""  # experiments are not in the defaults list
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"{prefix}{group}={option}"],
                      return_hydra_config=True)
    assert cfg.hydra.runtime.choices[group] == option
    resolved = OmegaConf.to_container(cfg, resolve=False)
    del resolved["hydra"]
    resolved = OmegaConf.to_container(OmegaConf.create(resolved), resolve=True)
    if group in NAMED_GROUPS:
        assert resolved[group]["name"] == option
    assert resolved["name"] == "-".join(
        [resolved["kernel"]["name"], resolved["mode"]["name"], resolved["dtype"]["name"],
         resolved["pass"]["name"]])


@pytest.mark.parametrize("kernel", list(OPS))
def test_every_shape_set_parses(kernel):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"kernel={kernel}"])
    workload = make_workload(cfg.kernel)
    for name in cfg.kernel.shape_sets:
        resolved_name, shapes = resolve_shapes(workload, cfg.kernel, name, on_gpu=True)
        assert resolved_name == name and shapes
        assert len({workload.label(s) for s in shapes}) == len(shapes), f"duplicate in {name}"
    assert resolve_shapes(workload, cfg.kernel, "auto", on_gpu=False)[0] == "cpu"
    assert resolve_shapes(workload, cfg.kernel, "auto", on_gpu=True)[0] == cfg.kernel.default_shapes


def test_malformed_shapes_are_config_errors():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["kernel=conv"])
    workload = make_workload(cfg.kernel)
    for bad in (
        {"n": 1, "c": 3, "h": 4, "w": 4, "k": 2, "r": 3},  # missing s
        {"n": 1, "c": 3, "h": 4, "w": 4, "k": 2, "r": 3, "s": 0},  # zero
        {"n": 1, "c": 3, "h": 2, "w": 2, "k": 2, "r": 5, "s": 5},  # empty output
        {"n": 1, "c": 3, "h": 4, "w": 4, "k": 2, "r": 3, "s": 3, "pad": 1},
    ):  # typo
        with pytest.raises(ConfigError):
            workload.parse_shape(bad)


def run_cli(*overrides, cwd=REPO_ROOT):
    return subprocess.run(
        [sys.executable, "-m", "experiments.run", *overrides, "wandb.mode=disabled"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_unknown_mode_lists_the_valid_options(tmp_path):
    result = run_cli("mode=fastest", f"hydra.run.dir={tmp_path}")
    assert result.returncode != 0
    assert "Could not find 'mode/fastest'" in result.stderr
    assert "max-autotune" in result.stderr and "triton-compiled" in result.stderr


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["kernel=conv", "pass.name=bwd"], "pass.name=bwd: expected one of fwd, fwd_bwd"),
        (["kernel=matmul", "shapes=nope"], "unknown shape set 'nope'"),
        (
            ["kernel=matmul", "+kernel.shape_sets.bad=[{m: 0, n: 4, k: 4}]", "shapes=bad"],
            "m must be an int >= 1",
        ),
        (["kernel=softmax", "+kernel.shape_sets.bad=[[4, 4]]", "shapes=bad"], "must be a mapping"),
        (["kernel=conv", "kernel.memory_format=nwhc"], "choose nchw or nhwc"),
    ],
)
@pytest.mark.slow
def test_bad_combinations_exit_with_one_line(tmp_path, overrides, message):
    result = run_cli(*overrides, f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_key_in_the_config_is_refused_and_not_written(tmp_path):
    secret = "sk-test-0123456789abcdef"
    result = run_cli(f"+wandb.api_key={secret}", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert "WANDB_API_KEY" in result.stderr
    assert secret not in result.stdout + result.stderr
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret not in path.read_text(errors="ignore"), path


def test_the_h100_experiment_sweeps_every_kernel_and_mode():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=h100_bf16"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    # the grid of results/h100: every single op (the composed blocks have their own bench grids)
    assert params.kernel.split(",") == names("op")
    # every mode but the peer libraries', optional installs (docs/peers.md)
    modes = {o for g, o in OPTIONS
             if g == "mode"
             and OmegaConf.load(CONF_DIR / g / f"{o}.yaml").kind not in ("peer", "peer_direct")}
    assert set(params.mode.split(",")) == modes
    assert (cfg.dtype.name, cfg.dtype.torch_dtype, cfg.bench.rep_ms) == ("bf16", "bfloat16", 50)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        fp32 = compose("config", overrides=["+experiment=h100_bf16", "dtype=fp32"])
    assert (fp32.dtype.name, fp32.dtype.torch_dtype) == ("fp32", "float32")  # a choice, not a name
