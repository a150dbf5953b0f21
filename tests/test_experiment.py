"""End to end on the CPU: the real CLI writes schema-valid records and env.json for every kernel.

`make test` keeps one run through `make experiment` (FAST_RUN); every other op and mode, the
fwd_bwd sweeps and the remaining modes are `slow` and `integration` (`make test-all`).
"""

import json
import subprocess
import sys
from functools import partial

import pytest
from omegaconf import OmegaConf

from experiments.records import read_jsonl, validate
from experiments.registry import OPS, names
from tests.conftest import CONF_DIR, REPO_ROOT

ENV_KEYS = {
    "torch",
    "triton",
    "python",
    "git_sha",
    "git_dirty",
    "hostname",
    "config",
    "seed",
    "env_vars",
    "graphed_backward",
    "gpu_state_before",
    "gpu_state_after",
    "device",
    "inductor_options",
}
SLOW_CLI = (pytest.mark.slow, pytest.mark.integration)
# The fast suite's one run through the CLI: the mlp block through our kernels (one small shape),
# so that the make target, the records and env.json are checked; every other op and mode through
# the CLI, Inductor's saved code included, is in make test-all.
FAST_RUN = ("mlp", "triton")


def make(target, tmp_path, *overrides, env=None):
    args = " ".join(
        [
            *overrides,
            "bench=quick",
            "wandb.mode=disabled",
            f"hydra.run.dir={tmp_path}/run",
            f"hydra.sweep.dir={tmp_path}/sweep",
        ]
    )
    result = subprocess.run(
        ["make", "--no-print-directory", target, f"PY={sys.executable}", f"ARGS={args}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def sweep_jobs(tmp_path):
    return sorted(p for p in (tmp_path / "sweep").iterdir() if p.is_dir())


def check_job_dir(job_dir, kernel, mode, pass_name="fwd", skipped=lambda row: None):
    """skipped(row): the reason a row must be a skipped row with, or None where it must be ok."""
    rows = read_jsonl(job_dir / "results.jsonl")
    cpu_set = OmegaConf.load(CONF_DIR / "kernel" / f"{kernel}.yaml").shape_sets.cpu
    assert len(rows) == len(cpu_set)  # every shape of the cpu set
    for row in rows:
        assert validate(row) == [], (row, validate(row))
        assert (row["kernel"], row["mode"], row["pass"]) == (kernel, mode, pass_name)
        if skipped(row):
            assert row["status"] == "skipped" and skipped(row) in row["reason"], row
            continue
        assert row["status"] == "ok", row["reason"]
        assert row["max_rel_err"] <= row["tolerance"]
        assert row["speedup_vs_eager"] > 0 and row["timer"] in ("cpu-thread-time", "cpu-wall")
        assert row["call_latency_us_p50"] > 0 and row["seeds_checked"] == 2
        assert row["flops"] > 0 and row["min_bytes"] > 0
    env = json.loads((job_dir / "env.json").read_text())
    assert ENV_KEYS <= env.keys()
    assert env["config"]["kernel"]["name"] == kernel and env["device"] == "cpu"
    return rows


def experiment_params():
    for mode in ("eager", "default", "triton"):
        for kernel in names("op", "block"):  # the models': tests/test_models.py
            fast = (kernel, mode) == FAST_RUN
            yield pytest.param(kernel, mode, marks=() if fast else SLOW_CLI, id=f"{mode}-{kernel}")


@pytest.mark.parametrize("kernel, mode", experiment_params())
def test_make_experiment(tmp_path, kernel, mode):
    result = make("experiment", tmp_path, f"kernel={kernel}", f"mode={mode}", "dtype=fp32")
    rows = check_job_dir(tmp_path / "run", kernel, mode)
    assert "timings are NOT representative" in result.stdout  # the CPU banner
    assert "speedup_vs_eager" in result.stdout and "results.jsonl" in result.stdout
    if mode == "default":
        assert all(row["compile_cold_s"] > 0 and row["compile_warm_s"] > 0 for row in rows)
        assert list((tmp_path / "run" / "inductor_code").glob("*.py")), "no Inductor code saved"


@pytest.mark.parametrize("kernel", [n for n in names("op", "block") if "fwd_bwd" in OPS[n].passes])
@pytest.mark.slow
@pytest.mark.integration
def test_fwd_bwd(tmp_path, kernel):
    make("sweep", tmp_path, f"kernel={kernel}", "mode=triton,default", "pass=fwd_bwd", "dtype=fp32")
    for job_dir, mode in zip(sweep_jobs(tmp_path), ["triton", "default"], strict=True):
        check_job_dir(job_dir, kernel, mode, "fwd_bwd", skipped=partial(no_backward, mode))


def no_backward(mode, row):
    """Our conv trains for groups = 1 and depthwise: another grouped shape's triton row is
    skipped, saying so. Labels read n x c x h x w-...-g<groups>."""
    label = row["shape_label"]
    if row["kernel"] != "conv" or "-g" not in label or not mode.startswith("triton"):
        return None
    channels, groups = int(label.split("x")[1]), int(label.split("-g")[1].split("-")[0])
    return "has no Triton backward" if groups != channels else None


@pytest.mark.slow
@pytest.mark.integration
def test_two_job_sweep_through_the_cli(tmp_path):
    """Also covers the modes the other tests leave out, in bf16 (upcast in the interpreter)."""
    make("sweep", tmp_path, "kernel=softmax", "mode=triton-compiled,torchscript")
    job_dirs = sweep_jobs(tmp_path)
    assert [d.name for d in job_dirs] == [
        "0_softmax-triton-compiled-bf16-fwd",
        "1_softmax-torchscript-bf16-fwd",
    ]
    for job_dir, mode in zip(job_dirs, ["triton-compiled", "torchscript"], strict=True):
        rows = check_job_dir(job_dir, "softmax", mode)
        assert all(row["graph_breaks"] in (0, None) for row in rows)
        env = json.loads((job_dir / "env.json").read_text())
        assert env["job_id"].endswith(job_dir.name.split("_")[0])
    # our kernels get the static launcher Inductor gives its own (experiments/modes.py)
    compiled_env = json.loads((job_dirs[0] / "env.json").read_text())
    assert compiled_env["inductor_options"]["static_launch_user_defined_triton_kernels"] is True


@pytest.mark.slow
@pytest.mark.integration
def test_cuda_graph_modes_run_on_cpu(tmp_path):
    make(
        "sweep",
        tmp_path,
        "kernel=matmul",
        "mode=reduce-overhead,max-autotune-no-cudagraphs",
        "dtype=fp32",
    )
    job_dirs = sweep_jobs(tmp_path)
    for job_dir, mode in zip(
        job_dirs, ["reduce-overhead", "max-autotune-no-cudagraphs"], strict=True
    ):
        check_job_dir(job_dir, "matmul", mode)
    env = json.loads((job_dirs[0] / "env.json").read_text())
    assert env["inductor_options"]["triton.cudagraphs"] is True


def test_git_stamp_takes_kbench_git_sha_over_the_checkout(monkeypatch):
    """A tree synced to a GPU host may carry a stale .git: KBENCH_GIT_SHA, where set, names
    the commit (dirty unknown); unset, the checkout's own HEAD is read."""
    from experiments.env import git_state

    monkeypatch.delenv("KBENCH_GIT_SHA", raising=False)
    own = git_state()
    assert own["git_sha"] != "0123abc" and own["git_dirty"] in (True, False, None)
    monkeypatch.setenv("KBENCH_GIT_SHA", "0123abc")
    assert git_state() == {"git_sha": "0123abc", "git_dirty": None}


def test_same_bytes_copy_is_timed_once_a_size_by_the_jobs_timer(monkeypatch):
    """A GPU row's bandwidth roofline at its own size: a copy reading min_bytes / 2 and writing
    as many, through the job's timer with a copy's lead, measured once per size and device."""
    from types import SimpleNamespace

    import torch

    from experiments import measure

    calls = []

    class Timer:
        def measure(self, fn, warmup_ms, rep_ms, lead_us):
            out = fn()  # the copy: dst.copy_(src) returns dst
            calls.append((out.numel(), out.dtype, warmup_ms, rep_ms, lead_us))
            return {"p50": 0.004}

    monkeypatch.setattr(measure, "_COPY_MS", {})
    job = SimpleNamespace(device=torch.device("cpu"), timer=Timer(),
                          bench=SimpleNamespace(warmup_ms=3.0, rep_ms=7.0))  # fmt: skip
    assert measure.same_bytes_copy_ms(job, 6.4e6) == 0.004
    assert measure.same_bytes_copy_ms(job, 6.4e6 + 8) == 0.004  # the same 16-byte size: cached
    assert calls == [(3_200_000, torch.uint8, 3.0, 7.0, measure.COPY_LEAD_US)]
    measure.same_bytes_copy_ms(job, 100.0)
    assert calls[-1][0] == 48 and len(calls) == 2  # 50 bytes each way, to a 16-byte multiple
