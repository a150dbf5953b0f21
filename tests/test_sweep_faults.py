"""Sweeps survive faults: each failure is a recorded row, and resume finishes exactly the rest."""

import json
import subprocess
import sys

import pytest

from experiments.records import read_jsonl, validate
from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.integration]  # sweeps through the CLI

CPU = ["kernel=softmax", "mode=eager", "dtype=fp32", "bench=quick", "wandb.mode=disabled"]


def cli(*args, check=True):
    result = subprocess.run([sys.executable, "-m", *args], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=600)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def job_rows(sweep):
    return {d.name: read_jsonl(d / "results.jsonl")
            for d in sorted(sweep.iterdir()) if (d / "results.jsonl").exists()}


def test_each_fault_is_one_failed_row_and_the_sweep_goes_on(tmp_path):
    result = cli("experiments.run", "--multirun", *CPU, "fault.kind=raise,nan_output,oom,kill,exit",
                 "fault.shape=0", f"hydra.sweep.dir={tmp_path}")
    jobs = job_rows(tmp_path)
    assert len(jobs) == 5
    reasons = []
    for rows in jobs.values():
        assert [r["shape_label"] for r in rows] == ["37x100", "5x4097"]  # both shapes, in order
        assert rows[0]["status"] == "failed" and rows[1]["status"] == "ok"
        assert all(validate(r) == [] for r in rows)
        reasons.append(rows[0]["reason"])
    assert "injected fault (fault.kind=raise)" in reasons[0]
    assert "NaN" in reasons[1]
    assert reasons[2].startswith("OutOfMemoryError")
    assert "worker process died (killed by SIGKILL)" in reasons[3]
    assert reasons[3].endswith("of its set")  # SIGKILL leaves no last words
    # an error that passes every shape's handler: the row carries what the worker said last
    assert "worker process died (exit code 1)" in reasons[4]
    assert reasons[4].endswith("its last error: SystemExit: injected fault (fault.kind=exit)")
    merged = read_jsonl(tmp_path / "sweep_results.jsonl")  # the multirun-end callback
    assert len(merged) == 10 and "5 rows not ok" in result.stdout


def test_resume_completes_exactly_the_missing_work(tmp_path):
    # Without isolation a kill takes the whole sweep down: job 1 dies at its second shape.
    killed = cli("experiments.run", "--multirun", *CPU, "mode=eager,triton,default",
                 "fault.kind=kill", "fault.shape=1", "isolate=false",
                 f"hydra.sweep.dir={tmp_path}", check=False)
    assert killed.returncode != 0
    before = job_rows(tmp_path)
    assert [len(rows) for rows in before.values()] == [1]  # job 0 died at shape 1, after shape 0
    assert not (tmp_path / "sweep_results.jsonl").exists()

    cli("experiments.resume", str(tmp_path), "fault.kind=null")
    after = job_rows(tmp_path)
    assert len(after) == 3
    for name, rows in after.items():
        labels = [r["shape_label"] for r in rows]
        assert labels == ["37x100", "5x4097"], (name, labels)  # nothing redone or duplicated
        assert all(r["status"] == "ok" for r in rows)
    first_job = next(iter(after))
    assert after[first_job][0] == before[first_job][0]  # the finished row is untouched
    assert len({r["config_hash"] for r in after[first_job]}) == 1
    assert len(read_jsonl(tmp_path / "sweep_results.jsonl")) == 6
    env_files = sorted(p.name for p in (tmp_path / next(iter(after))).glob("env*.json"))
    assert env_files[0].startswith("env.before-") and "env.json" in env_files
    assert json.loads((tmp_path / first_job / "env.json").read_text())["config"]["resume"]


def test_a_lost_cuda_context_stops_the_process_and_a_new_one_goes_on(tmp_path):
    # On a CPU the illegal-address error is raised rather than caused; the handling is the same.
    alone = cli("experiments.run", *CPU, "fault.kind=illegal_address", "fault.shape=0",
                f"hydra.run.dir={tmp_path / 'alone'}", check=False)
    assert alone.returncode == 3, alone.stderr[-2000:]
    rows = read_jsonl(tmp_path / "alone" / "results.jsonl")
    assert len(rows) == 1 and "illegal memory access" in rows[0]["reason"]

    cli("experiments.run", *CPU, "fault.kind=illegal_address", "fault.shape=0", "isolate=true",
        f"hydra.run.dir={tmp_path / 'isolated'}")
    rows = read_jsonl(tmp_path / "isolated" / "results.jsonl")
    assert [r["status"] for r in rows] == ["failed", "ok"]
    assert "illegal memory access" in rows[0]["reason"]
