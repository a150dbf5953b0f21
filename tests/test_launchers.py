"""The launcher group: `launcher=local|gpus|slurm` picks how a sweep's jobs are run.

Each option must compose to the intended Hydra launcher with one GPU per job; the slurm option
must render an sbatch script asking for that; and `launcher=gpus` must run a real sweep through
submitit_local, each job on its own GPU (faked with CUDA_VISIBLE_DEVICES; the jobs run on the CPU).
"""

import json
import os
import re
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from tests.conftest import CONF_DIR, REPO_ROOT

SUBMITIT = "hydra_plugins.hydra_submitit_launcher.submitit_launcher"
EXPECTED_LAUNCHER = {
    "local": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "gpus": f"{SUBMITIT}.LocalLauncher",
    "gpus_pool": "hydra_plugins.kbench_launchers.pool.PooledLocalLauncher",
    "slurm": "hydra_plugins.kbench_launchers.slurm.SlurmLauncher",
}


def compose_with_hydra(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_local_is_the_default():
    cfg = compose_with_hydra([])
    assert cfg.hydra.runtime.choices["launcher"] == "local"
    assert cfg.hydra.launcher._target_ == EXPECTED_LAUNCHER["local"]


@pytest.mark.parametrize("option", sorted(EXPECTED_LAUNCHER))
def test_each_launcher_composes(option):
    cfg = compose_with_hydra([f"launcher={option}", "hydra.sweep.dir=/sweeps/one"])
    assert cfg.hydra.launcher._target_ == EXPECTED_LAUNCHER[option]
    assert cfg.launcher.name == option
    if option != "local":
        launcher = cfg.hydra.launcher
        assert launcher.gpus_per_node == 1 and launcher.tasks_per_node == 1
        assert launcher.submitit_folder == "/sweeps/one/.submitit/%j"  # beside the job folders


def test_slurm_settings_and_overrides():
    cfg = compose_with_hydra(
        ["launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.array_parallelism=4"]
    )
    launcher = cfg.hydra.launcher
    assert launcher.partition == "gpu" and launcher.array_parallelism == 4
    for key in ("account", "timeout_min", "cpus_per_task", "mem_gb"):
        assert key in launcher


def test_slurm_sbatch_asks_for_one_gpu_per_job(tmp_path, monkeypatch):
    """Run the launcher's own parameter mapping up to the sbatch script, without a cluster."""
    import submitit
    from submitit.slurm.slurm import SlurmExecutor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # "srun exists"
    captured = {}

    def fake_map_array(executor, fn, *iterables):
        captured["sbatch"] = executor._executor._make_submission_file_text("COMMAND", "uid")
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", fake_map_array)
    cfg = compose_with_hydra(
        [
            "launcher=slurm",
            "hydra.launcher.partition=gpu",
            "hydra.launcher.account=myproj",
            f"hydra.sweep.dir={tmp_path}",
        ]
    )
    launcher = instantiate(cfg.hydra.launcher)
    launcher.config = cfg
    launcher.launch([["mode=eager"], ["mode=triton"]], initial_job_idx=0)
    sbatch = captured["sbatch"]
    for flag in (
        "--gpus-per-node=1",
        "--ntasks-per-node=1",
        "--nodes=1",
        "--partition=gpu",
        "--account=myproj",
        "--cpus-per-task=8",
        "--mem=64GB",
        "--time=120",
    ):
        assert f"#SBATCH {flag}\n" in sbatch, flag
    assert f"{tmp_path}/.submitit/" in sbatch


def job_window(job_dir):
    """(start, end) of a job: Hydra writes .hydra/ as it starts; the records last."""
    start = (job_dir / ".hydra" / "config.yaml").stat().st_mtime
    end = max(p.stat().st_mtime for p in job_dir.iterdir() if p.is_file())
    return start, end


@pytest.mark.parametrize("fake_gpus", ["0,1", "0"])
@pytest.mark.slow
@pytest.mark.integration
def test_gpus_sweep_runs_one_job_per_gpu(tmp_path, fake_gpus):
    sweep_dir = tmp_path / "sweep"
    lock_dir = tmp_path / "tmp"  # the per-GPU locks, away from any real sweep's
    lock_dir.mkdir()
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": fake_gpus,
        "TMPDIR": str(lock_dir),
        "TRITON_INTERPRET": "1",
    }
    command = [
        sys.executable,
        "-m",
        "experiments.run",
        "--multirun",
        "launcher=gpus",
        "kernel=softmax",
        "mode=eager,triton",
        "dtype=fp32",
        "bench=quick",
        "device=cpu",  # the GPUs are fake: measure on the CPU even where a real one exists
        "wandb.mode=disabled",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    job_dirs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [p.name for p in job_dirs] == ["0_softmax-eager-fp32-fwd", "1_softmax-triton-fp32-fwd"]
    for job_dir in job_dirs:
        lines = (job_dir / "results.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert len(rows) == 2 and all(r["status"] == "ok" for r in rows), rows

    picked = re.findall(r"launcher=gpus: job \d+ on GPU (\S+)", result.stdout)
    if fake_gpus == "0,1":
        assert sorted(picked) == ["0", "1"], result.stdout  # concurrent, never the same GPU
    else:
        assert picked == ["0", "0"], result.stdout
        first, second = sorted(job_window(d) for d in job_dirs)
        assert second[0] >= first[1], "two jobs ran on the one GPU at the same time"


def _claims(counter, count):
    from hydra_plugins.kbench_launchers.pool import claim

    return [claim(counter) for _ in range(count)]


def test_pool_tasks_claim_each_job_once(tmp_path):
    """gpus_pool's counter: processes claiming at once get every index exactly once."""
    from concurrent.futures import ProcessPoolExecutor

    counter = tmp_path / "next-0"
    counter.write_text("0")
    with ProcessPoolExecutor(4) as pool:
        claimed = [i for part in pool.map(_claims, [counter] * 4, [25] * 4) for i in part]
    assert sorted(claimed) == list(range(100))


@pytest.mark.slow
@pytest.mark.integration
def test_gpus_pool_runs_each_gpus_jobs_one_after_another_in_one_task(tmp_path):
    """launcher=gpus_pool on two (fake) GPUs: two tasks, each picking its GPU once, run the four
    jobs between them, no two at once on one GPU, every job's records as launcher=gpus leaves
    them."""
    sweep_dir, lock_dir = tmp_path / "sweep", tmp_path / "tmp"
    lock_dir.mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "TMPDIR": str(lock_dir),
           "TRITON_INTERPRET": "1"}  # fmt: skip
    command = [sys.executable, "-m", "experiments.run", "--multirun", "launcher=gpus_pool",
               "kernel=softmax,matmul", "mode=eager", "dtype=fp32,bf16", "bench=quick",
               "device=cpu", "wandb.mode=disabled", f"hydra.sweep.dir={sweep_dir}"]  # fmt: skip
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "launcher=gpus_pool: 4 jobs on 2 pool tasks" in result.stdout + result.stderr
    picked = re.findall(r"launcher=gpus: job \d+ on GPU (\S+)", result.stdout)
    assert sorted(picked) == ["0", "1"], result.stdout  # one pick a task, not one a job
    job_dirs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(job_dirs) == 4
    by_gpu = {}
    for job_dir in job_dirs:
        rows = [json.loads(line) for line in (job_dir / "results.jsonl").read_text().splitlines()]
        assert rows and all(r["status"] == "ok" for r in rows), rows
        gpu = json.loads((job_dir / "env.json").read_text())["env_vars"]["CUDA_VISIBLE_DEVICES"]
        by_gpu.setdefault(gpu, []).append(job_window(job_dir))
    assert sorted(by_gpu) == ["0", "1"]
    for windows in by_gpu.values():
        windows.sort()
        assert all(b[0] >= a[1] for a, b in zip(windows, windows[1:], strict=False))
