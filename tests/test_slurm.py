"""Sweeps through `launcher=slurm` on a real one-node SLURM cluster (scripts/slurm/cluster.sh).

The cluster runs on this machine (slurmctld, slurmd, slurmdbd, munged, as root): the tasks use this
checkout and this Python, as a cluster's nodes would through a shared filesystem. The session
fixture starts the cluster when it can (root; apt-get where the packages are missing) and stops it
at the end; otherwise the cluster tests are skipped with the reason, or fail where
KBENCH_SLURM_REQUIRED=1 (CI). A cluster already up (`cluster.sh start` before pytest) is used and
left running. The first two tests need no cluster: they pin resume's handling of SLURM sweeps.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from experiments import resume
from experiments.records import read_jsonl, validate
from tests.conftest import CONF_DIR, REPO_ROOT

CLUSTER = REPO_ROOT / "scripts" / "slurm" / "cluster.sh"
STATE_DIR = Path(os.environ.get("KBENCH_SLURM_DIR", "/tmp/kbench-slurm"))
PARTITION = os.environ.get("KBENCH_SLURM_PARTITION", "debug")
# The defaults ask for a GPU node (gpus_per_node=1, 8 CPUs, 64 GB): one core and 1 GB per task
# here, so the two cores run two array tasks at a time.
LAUNCHER = [
    "launcher=slurm",
    f"hydra.launcher.partition={PARTITION}",
    "hydra.launcher.gpus_per_node=null",
    "hydra.launcher.cpus_per_task=1",
    "hydra.launcher.mem_gb=1",
    "hydra.launcher.timeout_min=10",
]
COMMON = ["dtype=fp32", "bench=quick", "wandb.mode=disabled"]
# A fast shape, then one the Triton interpreter takes seconds over: the window to cancel a task
# that has recorded some of its shapes and not all.
SLOW_SET = ["+kernel.shape_sets.slow=[{m: 37, n: 100}, {m: 48, n: 4097}]", "shapes=slow"]
SWEEP_TIMEOUT_S = 300


# --- resume's handling of SLURM sweeps: no cluster needed ----------------------------------------


def write_multirun_yaml(sweep_dir: Path, hydra_overrides, task_overrides):
    sweep_dir.mkdir(parents=True, exist_ok=True)
    saved = {"hydra": {"overrides": {"hydra": hydra_overrides, "task": task_overrides}}}
    (sweep_dir / "multirun.yaml").write_text(json.dumps(saved))  # JSON is YAML


def test_resume_relaunches_with_the_launcher_overrides(tmp_path):
    """A resumed SLURM sweep must go to the same partition with the same resources and setup."""
    write_multirun_yaml(
        tmp_path,
        [
            "hydra.sweep.dir=/elsewhere",
            "hydra.mode=MULTIRUN",
            "hydra.launcher.partition=debug",
            "hydra.launcher.setup=[set -e, module load cuda]",
        ],
        ["launcher=slurm", "kernel=softmax", "mode=eager,triton", "resume=true"],
    )
    command = resume.resume_command(tmp_path, ["fault.kind=null"])
    assert command[:4] == [sys.executable, "-m", "experiments.run", "--multirun"]
    args = command[4:]
    assert "hydra.launcher.partition=debug" in args
    assert "hydra.launcher.setup=[set -e, module load cuda]" in args
    assert [a for a in args if a.startswith("hydra.sweep.dir=")] == [f"hydra.sweep.dir={tmp_path}"]
    assert not any(a.startswith("hydra.mode=") for a in args)  # --multirun says it
    assert args.count("resume=true") == 1
    assert args[-1] == "fault.kind=null"


def test_resume_refuses_while_the_sweeps_tasks_still_run(tmp_path, monkeypatch, capsys):
    write_multirun_yaml(tmp_path / "sweep", ["hydra.mode=MULTIRUN"], ["launcher=slurm"])
    for name in ("41", "41_0", "41_1"):  # submitit's folders: the array job, then each task
        (tmp_path / "sweep" / ".submitit" / name).mkdir(parents=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"  # %F %i %T: array job id, task id, state
    squeue.write_text("#!/bin/sh\necho '41 41_1 RUNNING'\necho '7 7_0 RUNNING'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    real_run = subprocess.run

    def only_squeue(command, *args, **kwargs):
        assert command[0] == "squeue", f"resume ran {command} beside live tasks"
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(resume.subprocess, "run", only_squeue)
    assert resume.main([str(tmp_path / "sweep")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "41_1 (RUNNING)" in err[0], err
    assert "7_0" not in err[0]  # another sweep's task


# --- the cluster ----------------------------------------------------------------------------------


def cluster_command(action: str, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CLUSTER), action], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def slurm_env():
    """The environment a SLURM client needs; starts the cluster if it is not up, stops it after."""
    # Without the outer make's flags: under `make test-all ARGS=...` they would hand that ARGS
    # to the `make resume` these tests run (which also sets ARGS= on its command line).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["SLURM_CONF"] = str(STATE_DIR / "slurm.conf")
    required = os.environ.get("KBENCH_SLURM_REQUIRED") == "1"
    if sys.platform != "linux":
        pytest.skip("the test cluster runs on Linux only")
    already_up = cluster_command("status", 30).returncode == 0
    if not already_up:
        if os.geteuid() != 0 and not required:
            pytest.skip(
                "no SLURM cluster up and not root: run `sudo bash scripts/slurm/cluster.sh start`"
            )
        started = cluster_command("start", 900)  # 900: a first start installs the packages
        if started.returncode != 0:
            reason = (
                f"the test cluster did not start:\n{started.stdout[-2000:]}{started.stderr[-2000:]}"
            )
            if required:
                pytest.fail(reason)
            pytest.skip(reason)
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]  # for resume's squeue, called in this process
    yield env
    if not already_up:
        stopped = cluster_command("stop", 120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


@pytest.fixture
def sweep_dir(slurm_env, tmp_path):
    """A sweep folder whose SLURM tasks are cancelled at the end, should a test stop early."""
    folder = tmp_path / "sweep"
    yield folder
    if (folder / ".submitit").is_dir():
        for array in array_ids(folder):
            subprocess.run(["scancel", array], env=slurm_env, capture_output=True)


def start_sweep(sweep_dir: Path, env: dict, *overrides: str) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "experiments.run", "--multirun",
        *LAUNCHER, *COMMON, f"hydra.sweep.dir={sweep_dir}", *overrides,
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    output, _ = process.communicate(timeout=SWEEP_TIMEOUT_S)
    return process.returncode, output


def job_dirs(sweep_dir: Path) -> list[Path]:
    return sorted(p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def array_ids(sweep_dir: Path) -> list[str]:
    """The SLURM array jobs a sweep submitted, from submitit's folder names (<array>_<task>)."""
    names = (p.name.split("_") for p in (sweep_dir / ".submitit").iterdir())
    return sorted({parts[0] for parts in names if len(parts) == 2 and parts[0].isdigit()}, key=int)


UNSETTLED = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED", "RESIZING")


def sacct_states(array_id: str, env: dict, timeout_s: float = 60) -> dict[str, tuple[str, str]]:
    """{task id: (state, exit code)} of every task of an array job, as the accounting has them once
    every task has settled. submitit reads a task's result file, which the task writes before its
    process exits, so the sweep can return while slurmctld still lists the last task as RUNNING."""
    wait_until_gone(array_id, env)
    deadline = time.monotonic() + timeout_s
    while True:
        listed = subprocess.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", array_id],
            capture_output=True, text=True, env=env, check=True,
        )  # fmt: skip
        rows = (line.split("|") for line in listed.stdout.splitlines() if line)
        states = {task: (state, code) for task, state, code in rows}
        if not any(state.startswith(UNSETTLED) for state, _ in states.values()):
            return states
        if time.monotonic() > deadline:
            return states  # the caller's assertion shows which task never settled
        time.sleep(0.5)


def wait_until_gone(array_id: str, env: dict, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["squeue", "-h", "-o", "%F", "-j", array_id], capture_output=True, text=True, env=env
        )
        if listed.returncode != 0 or not listed.stdout.strip():
            return
        time.sleep(0.5)
    pytest.fail(f"array job {array_id} still in squeue after {timeout_s}s")


def keys_of(rows: list[dict]) -> list[tuple[str, str]]:
    return [(r["config_hash"], r["shape_label"]) for r in rows]


def cpu_shapes(job: str) -> int:
    """The shapes of the cpu set of the op a job name ("matmul-eager-fp32-fwd") starts with."""
    op = job.split("-")[0]
    return len(OmegaConf.load(CONF_DIR / "kernel" / f"{op}.yaml").shape_sets.cpu)


def check_records(job_dir: Path, expected_shapes: int) -> list[dict]:
    rows = read_jsonl(job_dir / "results.jsonl")
    assert len(rows) == expected_shapes, (job_dir.name, keys_of(rows))
    for row in rows:
        assert validate(row) == [], (job_dir.name, row["shape_label"], validate(row))
        assert row["status"] == "ok", (job_dir.name, row["shape_label"], row.get("reason"))
    env_json = json.loads((job_dir / "env.json").read_text())
    assert env_json["config"]["launcher"]["name"] == "slurm"
    assert env_json["env_vars"].get("TRITON_INTERPRET") == "1"  # no GPU on the node
    return rows


@pytest.mark.integration
@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.xdist_group("slurm")  # with --dist loadgroup: one worker, one cluster session
def test_sweep_runs_as_slurm_array_tasks(slurm_env, sweep_dir):
    process = start_sweep(sweep_dir, slurm_env, "kernel=matmul,softmax", "mode=eager,triton")
    code, output = finish(process)
    assert code == 0, output[-4000:]

    (array,) = array_ids(sweep_dir)
    states = sacct_states(array, slurm_env)
    assert states == {f"{array}_{i}": ("COMPLETED", "0:0") for i in range(4)}, states
    submission = (sweep_dir / ".submitit" / array / f"{array}_submission.sh").read_text()
    assert f"{sys.executable} -u -m submitit.core._submit" in submission  # this checkout's Python

    dirs = job_dirs(sweep_dir)
    assert [d.name.split("_", 1)[1] for d in dirs] == [
        f"{k}-{m}-fp32-fwd" for k in ("matmul", "softmax") for m in ("eager", "triton")
    ]
    rows = [row for d in dirs
            for row in check_records(d, expected_shapes=cpu_shapes(d.name.split("_")[1]))]
    total = 2 * (cpu_shapes("matmul-") + cpu_shapes("softmax-"))  # eager and triton each
    merged = read_jsonl(sweep_dir / "sweep_results.jsonl")
    assert sorted(keys_of(merged)) == sorted(keys_of(rows))
    assert len(set(keys_of(merged))) == len(merged) == total
    assert f"sweep: {total} rows in {sweep_dir / 'sweep_results.jsonl'}" in output


@pytest.mark.integration
@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.xdist_group("slurm")  # with --dist loadgroup: one worker, one cluster session
def test_cancelled_task_resumes_without_loss_or_duplicates(slurm_env, sweep_dir):
    process = start_sweep(sweep_dir, slurm_env, "kernel=softmax", "mode=eager,triton", *SLOW_SET)
    victim = sweep_dir / "1_softmax-triton-fp32-fwd" / "results.jsonl"
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while not (victim.exists() and victim.read_text().count("\n") >= 1):
        assert process.poll() is None, "the sweep ended before its triton task recorded a shape"
        assert time.monotonic() < deadline, "no shape recorded by the triton task"
        time.sleep(0.2)
    (array,) = array_ids(sweep_dir)
    subprocess.run(["scancel", f"{array}_1"], env=slurm_env, check=True)
    code, output = finish(process)
    assert code != 0, "a sweep with a cancelled task exited 0"
    assert f"{array}_1" in output and "CANCELLED" in output, output[-3000:]
    wait_until_gone(array, slurm_env)  # the eager task may still be finishing
    assert sacct_states(array, slurm_env)[f"{array}_1"][0].startswith("CANCELLED")

    before = {d.name: read_jsonl(d / "results.jsonl") for d in job_dirs(sweep_dir)}
    # Cancelled mid-task: one of its two shapes recorded.
    assert len(before["1_softmax-triton-fp32-fwd"]) == 1

    resumed = subprocess.run(
        ["make", "resume", f"SWEEP={sweep_dir}", f"PY={sys.executable}", "ARGS="],
        cwd=REPO_ROOT, env=slurm_env, capture_output=True, text=True, timeout=SWEEP_TIMEOUT_S,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    assert "hydra.launcher.partition=" in resumed.stdout  # relaunched on the same launcher settings

    first, second = array_ids(sweep_dir)
    assert sacct_states(second, slurm_env) == {
        f"{second}_{i}": ("COMPLETED", "0:0") for i in range(2)
    }
    for d in job_dirs(sweep_dir):
        rows = check_records(d, expected_shapes=2)
        assert len(set(keys_of(rows))) == 2, keys_of(rows)  # every shape once
        assert rows[: len(before[d.name])] == before[d.name]  # finished rows kept, untouched
    merged = read_jsonl(sweep_dir / "sweep_results.jsonl")
    assert len(merged) == len(set(keys_of(merged))) == 4


@pytest.mark.integration
@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.xdist_group("slurm")  # with --dist loadgroup: one worker, one cluster session
def test_a_failing_setup_line_fails_the_sweep_clearly(slurm_env, sweep_dir):
    """Setup lines run in the sbatch script before Python: with `set -e` a missing command ends the
    task there (without it, bash would carry on and the job would run without its setup)."""
    setup = "hydra.launcher.setup=[set -e, no-such-setup-command --load cuda]"
    process = start_sweep(sweep_dir, slurm_env, "kernel=softmax", "mode=eager,triton", setup)
    code, output = finish(process)
    assert code != 0, "a sweep whose task failed at startup exited 0"

    (array,) = array_ids(sweep_dir)
    wait_until_gone(array, slurm_env)
    states = sacct_states(array, slurm_env)
    assert states == {f"{array}_{i}": ("FAILED", "127:0") for i in range(2)}, states
    assert f"Job {array}_0" in output and "(state: FAILED)" in output, output[-3000:]
    # the sweep's summary: every task waited for, one line per failed task with its state
    assert "2 of 2 SLURM tasks failed:" in output, output[-3000:]
    for i, mode in enumerate(("eager", "triton")):
        line = next(x for x in output.splitlines() if f"task #{i} (SLURM job {array}_{i}" in x)
        assert "state FAILED" in line and f"mode={mode}" in line, line
    log = sweep_dir / ".submitit" / f"{array}_0" / f"{array}_0_0_log.err"
    assert "no-such-setup-command: command not found" in log.read_text()
    assert not (sweep_dir / "sweep_results.jsonl").exists()  # no summary that claims success
    assert not any((d / "results.jsonl").exists() for d in job_dirs(sweep_dir))
