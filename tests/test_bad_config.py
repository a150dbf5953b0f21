# ruff: noqa: E501  (the table of bad values reads best one case a line)
"""Every config key's bad values: one `error:` line naming the key, the value and what is allowed,
exit 2, before anything is written or measured (experiments/schema.py; docs/configuration.md).

BAD is the table: the overrides and the text the error line must hold. The fast tests run it
through `schema.preflight` in this process; the integration tests run it through the real CLI.
"""

import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from experiments import schema
from experiments.errors import ConfigError
from experiments.run import refuse_secrets
from tests.conftest import CONF_DIR, REPO_ROOT, fast_subset

SLURM = ("launcher=slurm",)
GPUS = ("launcher=gpus",)

# (overrides, text the one error line must contain)
BAD = [
    # bench
    (["bench.warmup_ms=-1"], "bench.warmup_ms=-1: expected a number >= 0"),
    (["bench.warmup_ms=abc"], "bench.warmup_ms=abc: expected a number >= 0"),
    (["bench.rep_ms=-1"], "bench.rep_ms=-1: expected a number > 0"),
    (["bench.rep_ms=0"], "bench.rep_ms=0: expected a number > 0"),
    (["bench.rep_ms=abc"], "bench.rep_ms=abc: expected a number > 0"),
    (["bench.rep_ms=1e9"], "bench.rep_ms=1000000000.0: expected a number > 0 and <= 600000"),
    (["bench.min_warmup_calls=-1"], "bench.min_warmup_calls=-1: expected an integer >= 0"),
    (["bench.min_warmup_calls=2.5"], "bench.min_warmup_calls=2.5: expected an integer >= 0"),
    (["bench.repeats=0"], "bench.repeats=0: expected an integer >= 1"),
    (["bench.repeats=abc"], "bench.repeats=abc: expected an integer >= 1"),
    (["bench.noisy_threshold=0"], "bench.noisy_threshold=0: expected a number > 0"),
    (["bench.noisy_threshold=-0.1"], "bench.noisy_threshold=-0.1: expected a number > 0"),
    (["bench.latency_calls=0"], "bench.latency_calls=0: expected an integer >= 1"),
    (["bench.correctness_seeds=0"], "bench.correctness_seeds=0: expected an integer >= 1"),
    (["bench.flush_l2=maybe"], "bench.flush_l2=maybe: expected true or false"),
    (["bench.cudagraph_replay=2"], "bench.cudagraph_replay=2: expected true or false"),
    (["bench.static_inputs=often"], "bench.static_inputs=often: expected true or false"),
    (["bench.cpu_threads=0"], "bench.cpu_threads=0: expected an integer >= 1"),
    (["bench.cpu_threads=all"], "bench.cpu_threads=all: expected an integer >= 1"),
    (["+bench.rep=5"], "bench.rep=5: unknown key; bench.* takes warmup_ms, rep_ms"),
    # wandb
    (["wandb.mode=bogus"], "wandb.mode=bogus: expected one of offline, online, disabled"),
    (["wandb.mode=online"], "wandb.mode=online: no W&B key"),
    (["wandb.project=''"], "wandb.project='': expected a non-empty string"),
    (["wandb.entity=''"], "wandb.entity='': expected a non-empty string or null"),
    (["wandb.group=''"], "wandb.group='': expected a non-empty string or null"),
    (["wandb.tags=fast"], "wandb.tags=fast: expected a list of strings"),
    (["+wandb.dir=x"], "wandb.dir=x: unknown key"),
    # compile
    (["compile.fullgraph=maybe"], "compile.fullgraph=maybe: expected true or false"),
    (["compile.dynamic=sometimes"], "compile.dynamic=sometimes: expected true or false or null"),
    (["compile.options=3"], "compile.options=3: expected a mapping"),
    (["compile.fresh_cache=x"], "compile.fresh_cache=x: expected true or false"),
    (["compile.save_code=x"], "compile.save_code=x: expected true or false"),
    # launcher: our key, and the hydra.launcher keys our launcher files set
    (["launcher.name=k8s"], "launcher.name=k8s: expected one of local, gpus, gpus_pool, slurm"),
    ([*GPUS, "hydra.launcher.timeout_min=0"], "hydra.launcher.timeout_min=0: expected an integer >= 1"),
    ([*GPUS, "hydra.launcher.timeout_min=abc"], "hydra.launcher.timeout_min=abc: expected an integer"),
    ([*GPUS, "hydra.launcher.gpus_per_node=-1"], "hydra.launcher.gpus_per_node=-1: expected an integer >= 0"),
    ([*GPUS, "hydra.launcher.tasks_per_node=2"], "hydra.launcher.tasks_per_node=2: expected an integer = 1"),
    ([*GPUS, "hydra.launcher.setup=3"], "hydra.launcher.setup=3: expected a list of strings"),
    ([*GPUS, "+hydra.launcher.partition=gpu"], "hydra.launcher.partition=gpu: unknown key"),
    ([*SLURM, "hydra.launcher.timeout_min=0"], "hydra.launcher.timeout_min=0: expected an integer >= 1"),
    ([*SLURM, "hydra.launcher.timeout_min=abc"], "hydra.launcher.timeout_min=abc; Value 'abc' of type 'str' could not be converted to Integer"),
    ([*SLURM, "hydra.launcher.array_parallelism=0"], "hydra.launcher.array_parallelism=0: expected an integer >= 1"),
    ([*SLURM, "hydra.launcher.mem_gb=0"], "hydra.launcher.mem_gb=0: expected an integer >= 1"),
    ([*SLURM, "hydra.launcher.cpus_per_task=0"], "hydra.launcher.cpus_per_task=0: expected an integer >= 1"),
    ([*SLURM, "hydra.launcher.nodes=2"], "hydra.launcher.nodes=2: expected an integer = 1"),
    # the top level, mode, dtype, pass and fault
    (["device=tpu"], "device=tpu: expected one of auto, cuda, cpu"),
    (["seed=-1"], "seed=-1: expected an integer >= 0"),
    (["seed=abc"], "seed=abc: expected an integer >= 0"),
    (["resume=maybe"], "resume=maybe: expected true or false"),
    (["isolate=maybe"], "isolate=maybe: expected one of auto, true, false"),
    (["shapes=''"], "shapes='': expected a non-empty string"),
    (["+foo=1"], "foo=1: unknown key"),
    (["mode.kind=jit"], "mode.kind=jit: expected one of eager, triton, compile"),
    (["mode=default", "mode.compile_mode=fast"], "mode.compile_mode=fast: expected one of default"),
    (["mode.ops=3"], "mode.ops=3: expected all or a list of op names"),
    (["dtype.torch_dtype=float64"], "dtype.torch_dtype=float64: expected one of bfloat16"),
    (["dtype.tf32=maybe"], "dtype.tf32=maybe: expected true or false"),
    (["pass.name=bwd"], "pass.name=bwd: expected one of fwd, fwd_bwd"),
    (["fault.kind=boom"], "fault.kind=boom: expected one of raise, nan_output, oom, kill"),
    (["fault.shape=-1"], "fault.shape=-1: expected an integer >= 0"),
    # Hydra's own errors, one line too
    (["mode=fastest"], "Could not find 'mode/fastest'; Available options in 'mode': default, eager"),
    (["bench.rep=5"], "Could not override 'bench.rep'. To append to your config use +bench.rep=5"),
    (["kernel=matmul,softmax"], "Ambiguous value for argument 'kernel=matmul,softmax'"),
    (["--multirun", "kernel=matmul,softmax", "bench.repeats=3,0"], "bench.repeats=0: expected an integer >= 1"),
]  # fmt: skip

IDS = [" ".join(overrides) for overrides, _ in BAD]
# the fast suite: a bad value of each section and each kind of check (range, type, choice, unknown
# key, a launcher's keys, Hydra's own errors, a sweep's values); every one in make test-all
FAST_BAD = [BAD[IDS.index(i)] for i in (
    "bench.warmup_ms=-1", "bench.repeats=abc", "+bench.rep=5", "wandb.mode=bogus",
    "wandb.mode=online", "compile.options=3", "launcher.name=k8s",
    "launcher=gpus hydra.launcher.timeout_min=0", "launcher=slurm hydra.launcher.nodes=2",
    "device=tpu", "+foo=1", "mode.ops=3", "pass.name=bwd", "mode=fastest", "bench.rep=5",
    "--multirun kernel=matmul,softmax bench.repeats=3,0")]


@pytest.fixture
def no_wandb_key(monkeypatch, tmp_path):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc from `wandb login` either


@pytest.mark.parametrize("overrides, message", fast_subset(BAD, FAST_BAD, unpack=True), ids=IDS)
def test_bad_value_is_one_config_error(overrides, message, no_wandb_key):
    with pytest.raises(ConfigError) as info:
        schema.preflight(overrides, CONF_DIR, check_secrets=refuse_secrets)
    text = str(info.value)
    assert message in text and "\n" not in text, text


GROUPS = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
OPTIONS = [(g, f.stem) for g in GROUPS for f in sorted((CONF_DIR / g).glob("*.yaml"))]


# every option in make test-all; the fast suite validates one of each group (and
# tests/test_config.py composes every option)
@pytest.mark.parametrize("group, option", fast_subset(
    OPTIONS, [next(o for o in OPTIONS if o[0] == g) for g in GROUPS], unpack=True))
def test_every_shipped_option_is_valid(group, option):
    prefix = "+" if group == "experiment" else ""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"{prefix}{group}={option}"], return_hydra_config=True)
    schema.validate(cfg, cfg.hydra.launcher)


@pytest.mark.slow
def test_a_sweep_checks_every_value_and_the_experiment_grid(no_wandb_key):
    schema.preflight(["--multirun", "+experiment=h100_bf16"], CONF_DIR)
    schema.preflight(["--multirun", "kernel=matmul,conv", "bench=default,quick",
                      "bench.rep_ms=5,50", "launcher=gpus"], CONF_DIR)


def test_online_mode_with_a_key_is_valid(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    schema.preflight(["wandb.mode=online"], CONF_DIR)


def test_validation_leaves_the_config_as_composed():
    """An int stays an int (the schema says float): the config hash of a good run is unchanged."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config")
    schema.validate(cfg)
    assert cfg.bench.rep_ms == 100 and isinstance(cfg.bench.rep_ms, int)


def test_every_schema_key_is_documented():
    text = (REPO_ROOT / "docs" / "configuration.md").read_text()
    for name, node in [("bench", schema.BenchConfig), ("wandb", schema.WandbConfig),
                       ("compile", schema.CompileConfig), ("launcher", schema.LauncherConfig),
                       ("mode", schema.ModeConfig), ("dtype", schema.DtypeConfig),
                       ("fault", schema.FaultConfig)]:
        for key in schema.dataclasses.fields(node):
            assert f"`{name}.{key.name}`" in text, f"{name}.{key.name} missing"


@pytest.mark.integration
@pytest.mark.parametrize("overrides, message", BAD, ids=IDS)
def test_bad_value_through_the_cli(overrides, message, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env["HOME"] = str(tmp_path)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", *overrides, f"hydra.run.dir={run_dir}",
         f"hydra.sweep.dir={run_dir}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert result.stdout == ""
    assert not run_dir.exists()  # stopped before Hydra made the job's folder
