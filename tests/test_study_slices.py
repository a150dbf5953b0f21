"""`make study ARGS="study.budget_s=540"`: the study on one GPU in slices (experiments/
study_slices.py). The groups and their order; done-ness read from the folder; a slice that stops
before its budget, a job stopped mid-way rerun whole, and no job run twice (with a stand-in for
the jobs); the real CLI on the CPU in slices."""

import functools
import json
import subprocess
import sys

import pytest

from experiments import study, study_slices
from tests.conftest import REPO_ROOT

SMOKE_GROUPS = [
    ("1_inputs-matmul-fp32-fwd", ["triton", "reduce-overhead", "liger"]),
    ("1_inputs-softmax-fp32-fwd", ["triton", "reduce-overhead", "liger"]),
    ("2_inputs-tf32-matmul-fp32-fwd", ["triton", "reduce-overhead", "liger"]),
    ("3_static-matmul-fp32-fwd", ["reduce-overhead"]),
    ("3_static-softmax-fp32-fwd", ["reduce-overhead"]),
    ("4_static-tf32-matmul-fp32-fwd", ["reduce-overhead"]),
]


@functools.cache
def smoke_parts():
    return study.plan(list(study.SMOKE))  # Hydra composes the study's config: once


def smoke_groups():
    return study_slices.groups(smoke_parts())


def test_the_groups_are_every_job_once_in_order():
    groups = smoke_groups()
    assert [(g.name, g.modes) for g in groups] == SMOKE_GROUPS
    jobs = {(g.view, g.tf32, g.kernel, m, g.dtype, g.pass_name) for g in groups for m in g.modes}
    assert len(jobs) == sum(p.jobs for p in smoke_parts()) == 12
    matmul = groups[0]
    assert "kernel=matmul" in matmul.overrides and not any(
        o.startswith("mode=") for o in matmul.overrides)  # fmt: skip


def test_the_first_dtype_s_groups_come_first():
    groups = study_slices.groups(study.plan(["kernel=softmax,linear", "dtype=bf16,fp32",
                                             "mode=triton,default"]))  # fmt: skip
    inputs = [g for g in groups if g.view == "inputs" and not g.tf32]
    dtypes = [g.dtype for g in inputs]
    assert dtypes == sorted(dtypes, key=["bf16", "fp32"].index) and dtypes[0] == "bf16"
    assert groups.index(inputs[-1]) < min(groups.index(g) for g in groups if g.tf32)


@pytest.mark.parametrize("overrides, error", [
    (["study.budget_s=0"], "positive"), (["study.budget_s=soon"], "positive"),
    (["study.budget_s=inf"], "positive"), (["study.deadline=3"], "unknown study option"),
])  # fmt: skip
def test_a_bad_budget_is_one_clear_error(overrides, error):
    with pytest.raises(ValueError, match=error):
        study_slices.budget_of(overrides)
    assert study_slices.budget_of(["study.budget_s=540", "dtype=bf16"]) == (540.0, ["dtype=bf16"])


def test_the_cli_refuses_a_bad_budget_before_any_work(tmp_path, capsys):
    assert study.main(["--dir", str(tmp_path / "s"), "study.budget_s=-5"]) == 2
    assert "study.budget_s='-5'" in capsys.readouterr().err and not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------------------------
# Slices with a stand-in for the jobs
# ---------------------------------------------------------------------------------------------
FAKE_JOBS = """
import json, sys, time
from pathlib import Path
folder, kernel, dtype, pass_name, stall = Path(sys.argv[1]), *sys.argv[2:6]
for num, mode in enumerate(sys.argv[6:]):
    job = folder / f"{num}_{kernel}-{mode}-{dtype}-{pass_name}"
    job.mkdir(parents=True, exist_ok=True)
    (job / "results.jsonl").write_text("{}\\n")
    if mode == stall:  # a job the deadline stops: no closing stamp
        (job / "env.json").write_text("{}")
        time.sleep(60)
    (job / "env.json").write_text(json.dumps({"wall_s": 4.0}))
"""


class FakeClock:
    """Simulated seconds: 4 per finished job (the stand-in's wall_s) and 0.05 s per look,
    so a slice's choices do not depend on how fast this machine starts the stand-ins."""

    def __init__(self, folder):
        self.folder, self.reads = folder, 0

    def __call__(self):
        self.reads += 1
        closed = sum("wall_s" in p.read_text() for p in self.folder.glob("*/*/env.json"))
        return 4.0 * closed + 0.05 * self.reads


@pytest.fixture
def fake_jobs(monkeypatch):
    stall = {"mode": "-"}

    def command(study_dir, group, modes, extra):
        return [sys.executable, "-c", FAKE_JOBS, str(study_dir / group.name), group.kernel,
                group.dtype, group.pass_name, stall["mode"], *modes]  # fmt: skip

    monkeypatch.setattr(study_slices, "_command", command)
    monkeypatch.setattr(study_slices, "MARGIN_S", 0.0)
    monkeypatch.setattr(study_slices, "POLL_S", 0.02)
    return stall


def _job_folders(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.glob("*/*") if p.is_dir())


def test_slices_stop_before_their_budget_and_never_run_a_job_twice(tmp_path, fake_jobs):
    groups = smoke_groups()
    modelled = lambda group, mode: 10.0  # noqa: E731 - each job not yet measured priced at 10 s
    # 25 s: two of the first group's jobs fit, the third would not; the slice stops there
    first = study_slices.run_slice(tmp_path, groups, 25.0, [], modelled, clock=FakeClock(tmp_path))
    assert first["jobs_done"] == 2 and first["groups_done"] == 0
    assert first["slices"][-1]["stopped"] == "budget: 1_inputs-matmul-fp32-fwd has 1 jobs left"
    # the next slice prices matmul's modes at the 4 s a job they took, and goes on from there
    second = study_slices.run_slice(tmp_path, groups, 200.0, [], modelled,
                                    clock=FakeClock(tmp_path))  # fmt: skip
    assert second["jobs_done"] == 12 and second["groups_done"] == 6
    assert len(second["slices"]) == 2 and len(second["slices"][1]["jobs"]) == 10
    third = study_slices.run_slice(tmp_path, groups, 200.0, [], modelled,
                                   clock=FakeClock(tmp_path))  # fmt: skip
    assert third["slices"][-1]["jobs"] == [] and third["jobs_done"] == 12
    folders = _job_folders(tmp_path)
    assert len(folders) == 12 and len(set(folders)) == 12
    saved = json.loads((tmp_path / study_slices.MANIFEST).read_text())
    assert saved["jobs_done"] == 12 and all(not g["modes_pending"] for g in saved["by_group"])


def test_a_job_the_deadline_stops_is_deleted_and_reruns_whole(tmp_path, fake_jobs):
    groups = smoke_groups()[:1]
    fake_jobs["mode"] = "reduce-overhead"  # the group's second job hangs past the deadline
    data = study_slices.run_slice(tmp_path, groups, 5.0, [], lambda g, m: 1.0,
                                  clock=FakeClock(tmp_path))  # fmt: skip
    assert data["by_group"][0]["modes_done"] == ["triton"]
    assert data["slices"][-1]["stopped"].startswith("deadline")
    assert _job_folders(tmp_path) == ["1_inputs-matmul-fp32-fwd/0_matmul-triton-fp32-fwd"]
    fake_jobs["mode"] = "-"
    data = study_slices.run_slice(tmp_path, groups, 100.0, [], lambda g, m: 1.0,
                                  clock=FakeClock(tmp_path))  # fmt: skip
    assert data["by_group"][0]["modes_done"] == ["liger", "reduce-overhead", "triton"]
    assert [j["mode"] for j in data["slices"][-1]["jobs"]] == ["reduce-overhead", "liger"]


def test_a_promoted_copy_goes_on_from_its_records(tmp_path, fake_jobs):
    """Only records and env.json travel with a promoted study: done-ness is read from them."""
    groups = smoke_groups()
    study_slices.run_slice(tmp_path / "run", groups, 25.0, [], lambda g, m: 10.0,
                           clock=FakeClock(tmp_path / "run"))  # fmt: skip
    copy = tmp_path / "promoted"
    for env in (tmp_path / "run").glob("*/*/env.json"):
        dest = copy / env.parent.relative_to(tmp_path / "run")
        dest.mkdir(parents=True)
        for name in ("env.json", "results.jsonl"):
            (dest / name).write_text((env.parent / name).read_text())
    data = study_slices.run_slice(copy, groups, 200.0, [], lambda g, m: 10.0,
                                  clock=FakeClock(copy))  # fmt: skip
    assert data["jobs_done"] == 12 and len(data["slices"]) == 1  # no manifest came along
    assert len(data["slices"][0]["jobs"]) == 10


# ---------------------------------------------------------------------------------------------
# The real CLI
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.integration
def test_make_study_in_slices_on_the_cpu(tmp_path):
    """A slice too short for any job runs none and says so; the next runs all 12 jobs of the
    smoke study, each once; a third has nothing left."""
    folder = tmp_path / "study"

    def make(budget):
        result = subprocess.run(
            ["make", "--no-print-directory", "study", f"PY={sys.executable}", f"STUDY={folder}",
             f"ARGS=--smoke study.budget_s={budget}"], cwd=REPO_ROOT, capture_output=True,
            text=True, timeout=900)  # fmt: skip
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        return json.loads((folder / study_slices.MANIFEST).read_text()), result.stdout

    data, out = make(study_slices.MARGIN_S + 1)
    assert data["jobs_done"] == 0 and "12 jobs to go" in out
    data, out = make(1200)
    assert data["jobs_done"] == 12 and "study finished" in out
    assert len(_job_folders(folder)) == 12 and (folder / "study_summary.csv").is_file()
    data, _ = make(1200)
    assert data["slices"][-1]["jobs"] == [] and len(_job_folders(folder)) == 12
