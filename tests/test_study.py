"""`make study`: the grid it plans, the launcher's pinning, the summary it makes, and a small study
through the real CLI on the CPU (its records, its summary, the README block made from them,
resume)."""

import dataclasses
import itertools
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis import headline, promote, study_summary
from analysis.load import load_results
from experiments import registry, study
from experiments.records import Record, read_jsonl, validate
from tests.conftest import CONF_DIR, REPO_ROOT


def grid_of(part: study.Part) -> dict[str, list[str]]:
    axes, _ = study.split_overrides(part.overrides)
    return axes


def jobs_of(parts) -> list[tuple]:
    """(kernel, mode, dtype, pass, tf32, static) of every job the parts launch."""
    jobs = []
    for part in parts:
        grid = grid_of(part)
        tf32, static = "dtype.tf32=true" in part.overrides, any(
            o == "bench.static_inputs=true" for o in part.overrides)  # fmt: skip
        for values in itertools.product(*(grid[k] for k in study.AXES)):
            jobs.append((*values, tf32, static))
    return jobs


# ---------------------------------------------------------------------------------------------
# The grid
# ---------------------------------------------------------------------------------------------
def test_the_study_file_covers_every_op_mode_and_dtype():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["+experiment=study"], return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    # every op and block (the whole models join the study with its one-GPU slices)
    assert params.kernel.split(",") == registry.names("op", "block")
    modes = {p.stem for p in (CONF_DIR / "mode").glob("*.yaml")
             if OmegaConf.load(p).kind != "peer_direct"}  # fmt: skip
    assert set(params.mode.split(",")) == modes
    assert params.dtype.split(",") == ["bf16", "fp16", "fp32"]
    assert cfg.launcher.name == "gpus_pool" and cfg.shapes == "study"
    assert cfg.compile.fresh_cache is False and cfg.wandb.mode == "offline"  # a W&B run a job
    for op in registry.names("op", "block"):  # a study set per op, two shapes that parse
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            kernel = compose("config", overrides=[f"kernel={op}"]).kernel
        workload = registry.OPS[op].workload(kernel)
        shapes = [workload.parse_shape(OmegaConf.to_container(s)) for s in kernel.shape_sets.study]
        assert len(shapes) == 2, op


def test_the_plan_is_every_allowed_job_once():
    parts = study.plan([])
    jobs = jobs_of(parts)
    assert len(jobs) == len(set(jobs)) == sum(p.jobs for p in parts)
    modes = [m for m in grid_of(parts[0])["mode"]]
    graphs = set(study.cudagraph_modes(modes))
    assert graphs == {"reduce-overhead", "max-autotune"}
    expected = set()
    for op in registry.names("op", "block"):
        spec = registry.OPS[op]
        for mode, pass_name in itertools.product(modes, spec.passes):
            expected |= {(op, mode, dtype, pass_name, False, False)
                         for dtype in ("bf16", "fp16", "fp32")}  # fmt: skip
            if spec.bound == "compute":  # the TF32 pass: matmul-class ops only
                expected.add((op, mode, "fp32", pass_name, True, False))
            if mode in graphs:  # the second view, in bf16
                expected.add((op, mode, "bf16", pass_name, False, True))
    assert set(jobs) == expected
    for part in parts:
        assert part.overrides[:2] == ["+experiment=study", "hydra.sweeper.params=null"]


def test_an_op_without_fwd_bwd_gets_parts_of_its_own(monkeypatch):
    spec = registry.OPS["matmul"]
    monkeypatch.setitem(registry.OPS, "matmul", dataclasses.replace(spec, passes=("fwd",)))
    parts = study.plan([])
    assert [p.name for p in parts] == [
        "1_inputs-fwd", "2_inputs-fwd-fwd_bwd", "3_inputs-tf32-fwd", "4_inputs-tf32-fwd-fwd_bwd",
        "5_static-fwd", "6_static-fwd-fwd_bwd",
    ]  # fmt: skip
    assert all(job[0] != "matmul" or job[3] == "fwd" for job in jobs_of(parts))
    assert {job[0] for job in jobs_of(parts[:1])} == {"matmul"}


def test_an_axis_narrows_from_the_command_line_and_other_overrides_reach_every_job():
    parts = study.plan(["kernel=softmax,linear", "dtype=bf16", "bench.rep_ms=100"])
    assert [p.name for p in parts] == ["1_inputs-fwd-fwd_bwd", "2_static-fwd-fwd_bwd"]  # no fp32
    assert all("bench.rep_ms=100" in p.overrides for p in parts)
    assert {job[0] for job in jobs_of(parts)} == {"softmax", "linear"}


def test_every_part_logs_to_the_study_s_wandb_group(tmp_path):
    folder = tmp_path / "2026-11-26_10-00-00"
    part = study.plan(["kernel=softmax", "dtype=bf16"])[0]
    assert "wandb.group=study-2026-11-26_10-00-00" in study.command(folder, part, [])
    named = study.command(folder, part, ["wandb.group=mine"])  # the caller's own group wins
    assert "wandb.group=mine" in named and not any("study-" in o for o in named)


def test_the_estimate_reproduces_the_measured_bf16_study(monkeypatch):
    """docs/study.md: the bf16 slice took 26.1 minutes cold on 4 H100s at 21.5 s a job (launcher=
    gpus, before the children cached their bytecode); the estimate with that overhead must stay
    near it, and the whole grid's must exceed it."""
    monkeypatch.setitem(study.JOB_OVERHEAD_S, "gpus", 21.5)
    measured = "kernel=matmul,linear,softmax,conv,mlp,attention,bottleneck"  # sdpa came later
    bf16 = study.plan([measured, "dtype=bf16", "launcher=gpus"])
    cold_minutes = sum(p.cold_s for p in bf16) / 60 / 4
    assert 26.1 * 0.9 <= cold_minutes <= 26.1 * 1.1, study.describe(bf16, 4)
    parts = study.plan(["launcher=gpus"])
    assert sum(p.cold_s for p in parts) > sum(p.estimate_s for p in parts) > sum(
        p.cold_s for p in bf16)
    # every job of a peer without a kernel for it costs its start only, as it writes skipped rows
    assert study.peer_lacks("liger", "matmul", "bf16", "fwd")
    assert study.peer_lacks("quack", "linear", "fp32", "fwd")
    assert not study.peer_lacks("flaggems", "bottleneck", "fp32", "fwd_bwd")


# ---------------------------------------------------------------------------------------------
# The gpus launcher: a queue, one GPU a job, its share of the cores
# ---------------------------------------------------------------------------------------------
TOOLS = ("tr", "flock", "sleep", "nproc", "taskset", "grep")  # what the setup line runs


@pytest.mark.skipif(not all(shutil.which(t) for t in TOOLS),
                    reason="needs flock, taskset (util-linux) and coreutils")  # fmt: skip
@pytest.mark.slow
def test_each_gpus_job_takes_a_gpu_and_is_pinned_to_its_cores(tmp_path, monkeypatch):
    """Two fake GPUs, three jobs: nvidia-smi is kept off the PATH (a real one would number the
    host's own GPUs), so the cores split by position in CUDA_VISIBLE_DEVICES."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in TOOLS:
        (tools / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        setup = compose("config", overrides=["launcher=gpus"],
                        return_hydra_config=True).hydra.launcher.setup  # fmt: skip
    report = ("grep Cpus_allowed_list /proc/self/status; sleep 1; "
              "echo threads=$TORCHINDUCTOR_COMPILE_THREADS gpu=$CUDA_VISIBLE_DEVICES")  # fmt: skip
    shell = shutil.which("sh", path=os.defpath) or "/bin/sh"
    jobs = [subprocess.Popen([shell, "-c", " && ".join([*setup, report])],
                             stdout=subprocess.PIPE, text=True) for _ in range(3)]  # fmt: skip
    outputs = [job.communicate(timeout=60)[0] for job in jobs]
    assert all(job.returncode == 0 for job in jobs), outputs
    gpus = [out.split("gpu=")[1].split()[0] for out in outputs]
    assert sorted(gpus) in (["0", "0", "1"], ["0", "1", "1"])  # the third waited for one
    cores = os.cpu_count() if not hasattr(os, "sched_getaffinity") else len(os.sched_getaffinity(0))
    share = max(cores // 2, 1)
    for out, gpu in zip(outputs, gpus, strict=True):
        assert f"threads={share}" in out
        if cores >= 2:  # GPU i: cores i*share .. (i+1)*share-1
            low = int(gpu) * share
            allowed = f"{low}-{low + share - 1}" if share > 1 else str(low)
            assert f"Cpus_allowed_list:\t{allowed}" in out, out
            assert f"on GPU {gpu} (CPU cores {low}-{low + share - 1})" in out


# ---------------------------------------------------------------------------------------------
# The summary
# ---------------------------------------------------------------------------------------------
ENV = {"gpu_name": "NVIDIA H100 80GB HBM3", "peaks": {}, "config": {"kernel": {"name": "x"}}}


def record(mode, shape, speedup, latency=None, status="ok", dtype="bf16", tf32=False,
           static=False, kernel="softmax", **extra):  # fmt: skip
    row = Record(kernel=kernel, mode=mode, shape={"m": shape, "n": 8}, shape_label=f"{shape}x8",
                 shape_set="study", dtype=dtype, pass_="fwd", tf32=tf32, device="cuda",
                 static_inputs=["x"] if static else [], run_name=mode, job_id="s/0",
                 status=status, reason=None if status == "ok" else "why",
                 time_ms_p50=1.0 if status == "ok" else None,
                 max_rel_err=1e-3 if status == "ok" else None,
                 speedup_vs_eager=speedup if status == "ok" else None,
                 latency_speedup_vs_eager=(latency or speedup) if status == "ok" else None,
                 **extra).to_json()  # fmt: skip
    return row


def write_study(folder, rows):
    for i, row in enumerate(rows):
        job = folder / "1_part" / f"{i}_job"
        job.mkdir(parents=True)
        (job / "results.jsonl").write_text(json.dumps(row) + "\n")
        (job / "env.json").write_text(json.dumps(ENV))


def test_the_summary_takes_the_best_mode_that_covers_every_shape(tmp_path):
    rows = [record("eager", s, 1.0) for s in (1, 2)]
    rows += [record("triton", 1, 2.0, 1.5), record("triton", 2, 8.0, 1.5)]  # geomean 4, 1.5
    rows += [record("triton-compiled", 1, 9.0), record("triton-compiled", 2, 9.0, status="failed")]
    rows += [record("liger", s, 1.1) for s in (1, 2)]
    rows += [record("default", 1, 1.5, compile_cold_s=2.0, compile_warm_s=1.0),
             record("default", 2, 1.5, compile_cold_s=4.0, compile_warm_s=1.0)]  # fmt: skip
    rows += [record("reduce-overhead", s, 1.0) for s in (1, 2)]
    rows += [record("reduce-overhead", s, 2.0, 4.0, static=True) for s in (1, 2)]
    rows += [record("quack", s, None, status="skipped") for s in (1, 2)]
    rows += [record("triton", 1, 0.5, dtype="fp32", tf32=True)]
    write_study(tmp_path, rows)
    table = study_summary.build(tmp_path)
    assert list(table.columns) == study_summary.COLUMNS
    assert list(table["dtype"]) == ["bf16", "fp32+tf32"]
    row = table.iloc[0]
    assert row["gpu"] == "NVIDIA H100 80GB HBM3" and row["shapes"] == 2
    # triton-compiled failed a shape: not a candidate, however fast its other one
    assert row["ours_mode"] == "triton" and row["ours_speedup"] == pytest.approx(4.0)
    assert row["ours_latency_speedup"] == pytest.approx(1.5)
    assert row["peer_mode"] == "liger" and row["peer_speedup"] == pytest.approx(1.1)
    assert row["compile_mode"] == "default" and row["compile_cold_s"] == pytest.approx(3.0)
    assert row["compile_warm_s"] == pytest.approx(1.0) and row["fastest"] == "ours"
    assert row["static_view_gain_reduce_overhead"] == pytest.approx(2.0)
    assert row["static_view_latency_gain_reduce_overhead"] == pytest.approx(4.0)
    assert (row["rows_ok"], row["rows_failed"], row["rows_skipped"]) == (13, 1, 2)
    assert table.iloc[1]["fastest"] == "eager"  # ours at 0.5x and nothing else

    path = study_summary.write(tmp_path)
    assert study_summary.csv_text(study_summary.read(path)) == path.read_text()  # round trip
    assert study_summary.main([str(tmp_path), "--check"]) == 0
    path.write_text(path.read_text().replace("triton", "trit0n"))
    assert study_summary.main([str(tmp_path), "--check"]) == 1


def test_within_one_percent_of_gpu_time_the_better_call_latency_is_the_best(tmp_path):
    rows = [record("eager", s, 1.0) for s in (1, 2)]
    rows += [record("triton", s, 1.877, 1.215) for s in (1, 2)]  # softmax training on an H200
    rows += [record("triton-compiled", s, 1.894, 0.258) for s in (1, 2)]
    rows += [record("default", s, 1.60, 0.9) for s in (1, 2)]
    rows += [record("max-autotune-no-cudagraphs", s, 1.66, 0.4) for s in (1, 2)]  # 3.75% ahead
    write_study(tmp_path, rows)
    row = study_summary.build(tmp_path).iloc[0]
    assert row["ours_mode"] == "triton" and row["ours_latency_speedup"] == pytest.approx(1.215)
    assert row["compile_mode"] == "max-autotune-no-cudagraphs"  # beyond the tie: GPU time rules


@pytest.mark.parametrize("folder", sorted((REPO_ROOT / "results" / "current").glob("*/study")),
                         ids=lambda p: p.parent.name)  # fmt: skip
def test_a_committed_summary_is_its_records(folder):
    """results/current/<gpu>/study/study_summary.csv is what analysis.study_summary makes of the
    records beside it (rerun `python -m analysis.study_summary <folder>` after a promote)."""
    assert study_summary.main([str(folder), "--check"]) == 0


# ---------------------------------------------------------------------------------------------
# A small study through the real CLI, on the CPU
# ---------------------------------------------------------------------------------------------
def make_study(study_dir, *args, env=None, check=True):
    result = subprocess.run(
        ["make", "--no-print-directory", "study", f"PY={sys.executable}", f"STUDY={study_dir}",
         f"ARGS={' '.join(args)}"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
        env=env)  # fmt: skip
    if check:
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def study_rows(study_dir):
    return {path: read_jsonl(path) for path in sorted(study_dir.glob("*/*/results.jsonl"))}


@pytest.mark.slow
@pytest.mark.integration
def test_make_study_smoke_its_summary_the_readme_block_and_resume(tmp_path):
    study_dir = tmp_path / "study"
    result = make_study(study_dir, "--smoke")
    state = json.loads((study_dir / study.STATE).read_text())
    names = [p["name"] for p in state["parts"]]
    assert names == ["1_inputs-fwd", "2_inputs-tf32-fwd", "3_static-fwd", "4_static-tf32-fwd"]
    assert all(p["status"] == "done" for p in state["parts"])
    assert "12 jobs" in result.stdout and "study finished" in result.stdout

    rows = [row for job in study_rows(study_dir).values() for row in job]
    assert len(study_rows(study_dir)) == 12 and all(validate(r) == [] for r in rows)
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped and all(r["mode"] == "liger" and r["kernel"] == "matmul" for r in skipped)
    assert all("unsupported by liger-kernel" in r["reason"] for r in skipped)
    assert all(r["status"] == "ok" for r in rows if r["status"] != "skipped")
    frame = load_results(study_dir).frame
    static = frame[frame["activations"] == "static"]
    assert set(static["mode"]) == {"reduce-overhead"} and set(static["kernel"]) == {
        "matmul", "softmax"}  # fmt: skip
    assert set(frame[frame["tf32"]]["kernel"]) == {"matmul"}  # compute-bound only

    table = study_summary.build(study_dir)
    assert (study_dir / study_summary.CSV).read_text() == study_summary.csv_text(table)
    assert list(zip(table["op"], table["dtype"], strict=True)) == [
        ("matmul", "fp32"), ("matmul", "fp32+tf32"), ("softmax", "fp32")]  # fmt: skip
    assert set(table["ours_mode"]) == {"triton"} and set(table["compile_mode"]) == {
        "reduce-overhead"}  # fmt: skip
    assert table["static_view_gain_reduce_overhead"].notna().all()
    assert table.set_index("op").loc["softmax", "peer_mode"] == "liger"

    # published as a GPU folder would be, then README's blocks made from it
    current = tmp_path / "current"
    dest = promote.promote(study_dir, "cpu", "study", root=current)
    study_summary.write(dest)
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{headline.START}\nold\n{headline.END}\n"
                      f"{headline.STUDY_START}\n{headline.STUDY_END}\n")  # fmt: skip
    assert headline.main(["--check", "--readme", str(readme), "--current", str(current)]) == 1
    assert headline.main(["--write", "--readme", str(readme), "--current", str(current)]) == 0
    assert headline.main(["--check", "--readme", str(readme), "--current", str(current)]) == 0
    text = readme.read_text()
    assert "| matmul | fwd | CPU | triton |" in text and "| softmax | fwd | CPU | triton |" in text
    assert "replaces the per-op bench table" in text and "old" not in text
    assert "of 3 op/dtype/pass rows" in text
    # which row comes closest is the CPU's timing of that run (interpreted Triton against eager
    # reads 0.00x on both ops): the sentence names one of the study's rows, whichever it is
    rows = r"(matmul fp32\+tf32|matmul fp32|softmax fp32)"
    closest = rf"closest to the best compile mode on {rows} fwd \("
    assert re.search(closest.replace(" ", r"\s+"), text), text  # the text wraps at any space

    # resume: a part marked unfinished, one of its job's rows lost; the others are not rerun
    state["parts"][3]["status"] = "pending"
    (study_dir / study.STATE).write_text(json.dumps(state))
    job = next((study_dir / "4_static-tf32-fwd").glob("*/results.jsonl"))
    before = {path: path.stat().st_mtime for path in study_rows(study_dir)}
    lines = job.read_text().splitlines()
    job.write_text(lines[0] + "\n")
    resumed = make_study(study_dir)
    assert "experiments.resume" in (study_dir / "logs" / "4_static-tf32-fwd.log").read_text()
    assert [json.loads(line)["shape_label"] for line in job.read_text().splitlines()] == [
        json.loads(line)["shape_label"] for line in lines]  # fmt: skip
    assert all(path.stat().st_mtime == mtime for path, mtime in before.items() if path != job)
    assert "study finished" in resumed.stdout


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("launcher", ["gpus_pool", "gpus"])
def test_on_the_gpu_launchers_the_parts_run_at_once_one_job_a_gpu(tmp_path, launcher):
    """Two fake GPUs (the jobs measure on the CPU): the study's own launcher (the pool: a task a
    GPU) and launcher=gpus (a process a job), the parts started together, each job on its GPU's
    share of the cores with its compile threads recorded."""
    (tmp_path / "locks").mkdir()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0,1", "TMPDIR": str(tmp_path / "locks")}
    study_dir = tmp_path / "study"
    chosen = [] if launcher == "gpus_pool" else [f"launcher={launcher}"]
    result = make_study(study_dir, "kernel=softmax", "mode=eager,reduce-overhead", "dtype=fp32",
                        "pass=fwd", "shapes=cpu", "device=cpu", "bench=quick", *chosen,
                        env=env)  # fmt: skip
    assert "3 jobs" in result.stdout
    logs = "".join(p.read_text() for p in (study_dir / "logs").glob("*.log"))
    consoles = "".join(p.read_text(errors="replace")
                       for p in study_dir.glob("*/.submitit/*/*.out"))  # fmt: skip
    if launcher == "gpus":
        assert logs.count("launcher=gpus: job") == 3 and "CPU cores" in logs
    else:  # each part's jobs went to its pool's tasks, each pinned once
        assert logs.count("launcher=gpus_pool:") == 2, logs
        assert "launcher=gpus: job" in logs + consoles and "CPU cores" in logs + consoles
    envs = list(study_dir.glob("*/*/env.json"))
    assert len(envs) == 3
    for env_json in envs:
        stamp = json.loads(env_json.read_text())
        assert stamp["env_vars"]["CUDA_VISIBLE_DEVICES"] in ("0", "1")
        assert int(stamp["env_vars"]["TORCHINDUCTOR_COMPILE_THREADS"]) >= 1
    assert (study_dir / study_summary.CSV).exists()


def test_the_estimate_prices_each_launcher_s_per_job_overhead():
    """The pool saves a process start a job, so the same plan costs less on it; the study's own
    launcher is the pool, and an unknown launcher is priced as a process per job."""
    pool_plan = study.plan(["kernel=softmax", "dtype=bf16"])
    jobs = sum(p.jobs for p in pool_plan)
    pooled = sum(p.estimate_s for p in pool_plan)
    per_job = sum(p.estimate_s for p in study.plan(["kernel=softmax", "dtype=bf16",
                                                    "launcher=gpus"]))  # fmt: skip
    saved = jobs * (study.JOB_OVERHEAD_S["gpus"] - study.JOB_OVERHEAD_S["gpus_pool"])
    assert per_job - pooled == pytest.approx(saved)
    assert study.job_overhead("slurm") == study.JOB_OVERHEAD_S["gpus"]


def test_launcher_gpus_without_a_gpu_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(study, "visible_gpus", lambda: 0)
    assert study.main(["--dir", str(tmp_path / "s"), "kernel=softmax", "mode=eager"]) == 2
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------------------------
# Child processes: Python's bytecode cached where the host forbids writing it beside the sources
# ---------------------------------------------------------------------------------------------
def test_children_cache_bytecode_under_a_prefix_where_the_host_forbids_writing_it(monkeypatch):
    from experiments import processes

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    env = processes.child_env({"KBENCH_JOB_ID": "s/3"})
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["KBENCH_JOB_ID"] == "s/3"
    assert env["PYTHONPYCACHEPREFIX"] == str(processes.BYTECODE_CACHE)
    probe = [sys.executable, "-c", "import sys; print(sys.dont_write_bytecode, sys.pycache_prefix)"]
    out = subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", str(processes.BYTECODE_CACHE)]

    monkeypatch.setenv("PYTHONPYCACHEPREFIX", "/elsewhere")  # a prefix of the caller's is kept
    assert processes.child_env()["PYTHONPYCACHEPREFIX"] == "/elsewhere"
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    assert "PYTHONPYCACHEPREFIX" not in processes.child_env()  # nothing to change


@pytest.mark.slow
def test_the_study_and_the_isolated_worker_start_their_children_with_child_env(
    tmp_path, monkeypatch
):
    """The driver's multiruns (and through them every job) and an isolated job's worker get
    processes.child_env: under PYTHONDONTWRITEBYTECODE, a bytecode prefix instead."""
    import types

    from experiments import worker

    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    seen = []

    class Finished:
        returncode = 0

        def __init__(self, argv, env=None, **_):
            seen.append(env)

        def poll(self):
            return 0

    monkeypatch.setattr(study.subprocess, "Popen", Finished)
    part = study.Part("1_inputs-fwd", ["kernel=softmax"], 1, 1.0, 1.0)
    study.run_parts(tmp_path, {"parts": [part]}, [], concurrent=False)
    assert part.status == "done" and "PYTHONDONTWRITEBYTECODE" not in seen[0]
    assert seen[0]["PYTHONPYCACHEPREFIX"]

    def fake_worker(command, env):  # the worker measures its one shape
        seen.append(env)
        row = {"config_hash": "h", "shape_label": "x", "status": "ok"}
        (tmp_path / "results.jsonl").write_text(json.dumps(row) + "\n")
        return 0, None

    monkeypatch.setattr(worker, "run_worker", fake_worker)
    cfg = OmegaConf.create({"wandb": {"group": None}, "name": None})
    plan = types.SimpleNamespace(cfg=cfg, output_dir=tmp_path, job_id="s/0", sweep_name="s",
                                 shapes=[{}], config_hash="h",
                                 workload=types.SimpleNamespace(label=lambda shape: "x"))
    worker.run_isolated(plan)
    assert seen[1]["KBENCH_JOB_ID"] == "s/0" and "PYTHONDONTWRITEBYTECODE" not in seen[1]
