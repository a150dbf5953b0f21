"""The committed results tree: results/current holds only records, env stamps, targets and READMEs;
results/INDEX.md is what analysis.results_index writes; analysis.promote copies only those files."""

import json
import subprocess

import pytest

from analysis import promote as promote_mod
from analysis import results_index
from analysis.load import load_results
from experiments.records import Record
from tests.conftest import REPO_ROOT

RESULTS = REPO_ROOT / "results"
CURRENT = RESULTS / "current"
GPUS = ("h100", "h200")
BUDGET_BYTES = 15 * 1024 * 1024
INTERNALS = {"wandb", ".hydra", ".hydra-worker", "inductor_code"}


def _record_folders():
    return sorted(
        folder for gpu in GPUS if (CURRENT / gpu).is_dir()
        for folder in (CURRENT / gpu).iterdir()
        if folder.is_dir() and any(folder.rglob("results.jsonl"))
    )  # fmt: skip


def test_results_tree_is_under_budget():
    total = sum(p.stat().st_size for p in RESULTS.rglob("*") if p.is_file())
    assert total < BUDGET_BYTES, f"results/ holds {total / 2**20:.1f} MB (budget 15 MB)"


def test_only_results_current_and_the_index_are_committed_under_results():
    assert {p.name for p in RESULTS.iterdir()} <= {"current", "INDEX.md"}


def test_no_run_internals_under_results_current():
    bad = [p for p in CURRENT.rglob("*") if INTERNALS & set(p.relative_to(CURRENT).parts)]
    assert bad == []


def test_every_current_folder_has_a_readme():
    assert (CURRENT / "README.md").is_file()
    folders = [p for p in CURRENT.iterdir() if p.is_dir() and p.name not in GPUS]
    for gpu in GPUS:
        folders += [p for p in (CURRENT / gpu).iterdir() if p.is_dir()]
    assert len(folders) >= 8
    missing = [str(p.relative_to(REPO_ROOT)) for p in folders if not (p / "README.md").is_file()]
    assert missing == []


def test_current_readme_lists_every_records_folder_once():
    """results/current/README.md's table has one row per records folder, `<gpu>/<name>` in its
    folder column, and no row for a folder that is gone."""
    listed = []
    for line in (CURRENT / "README.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and cells[1].startswith("`"):
            listed.append(cells[1].strip("`"))
    folders = [f"{p.parent.name}/{p.name}" for p in _record_folders()]
    assert sorted(listed) == sorted(folders)


def test_each_gpu_has_every_kernel():
    for gpu in GPUS:
        names = {p.name for p in (CURRENT / gpu).iterdir() if p.is_dir()}
        assert {"matmul", "linear", "softmax", "conv"} <= names, gpu


@pytest.mark.parametrize("folder", _record_folders(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_current_records_folder_loads_without_problems(folder):
    results = load_results(folder)
    assert results.problems == [] and len(results.frame) > 0
    frame = results.frame
    assert frame["gpu_name"].notna().all()  # every job has its env.json beside its records
    gpu = folder.parent.name.upper()
    assert frame["gpu_name"].str.contains(gpu).all(), f"records of another GPU in {folder}"
    if folder.name.split("_")[0] in {"matmul", "linear", "softmax", "conv"}:
        assert set(frame["kernel"]) == {folder.name.split("_")[0]}


def _has_history() -> bool:
    try:
        out = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return False
    return out.stdout.strip() == "false"


@pytest.mark.skipif(not _has_history(), reason="needs the repo's full git history")
def test_index_is_what_results_index_writes():
    expected = results_index.render(REPO_ROOT)
    assert (RESULTS / "INDEX.md").read_text(encoding="utf-8") == expected, (
        "results/INDEX.md is out of date: run python -m analysis.results_index"
    )
    for name, commit in results_index.archived_folders(REPO_ROOT):
        assert f"`git checkout {commit} -- results/{name}`" in expected


# ---------------------------------------------------------------------------------------------
# analysis.promote
# ---------------------------------------------------------------------------------------------
ENV = {"gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "triton": "3.6.0",
       "git_sha": "abc1234", "git_dirty": None, "peaks": {"copy_gbps": 3000.0},
       "config": {"kernel": {"name": "linear", "bias": True, "activation": "gelu"}}}


def _row(mode: str, dtype: str) -> str:
    return Record(kernel="linear", mode=mode, shape={"m": 16, "n": 32, "k": 64},
                  shape_label="16x32x64", shape_set="llm", dtype=dtype, pass_="fwd", tf32=False,
                  device="cuda", static_inputs=[], run_name=f"linear-{mode}", job_id="s/0",
                  time_ms_p50=0.02, eager_time_ms_p50=0.03, speedup_vs_eager=1.5,
                  max_rel_err=1e-3).to_json()  # fmt: skip


def _fake_bench(root):
    """A finished `make bench` folder: two sweeps, their jobs with every file a job leaves."""
    for sweep, jobs in {"1": ["0_linear-triton-bf16-fwd", "1_linear-default-bf16-fwd"],
                        "2": ["0_linear-triton-fp16-fwd"]}.items():  # fmt: skip
        sweep_dir = root / sweep
        sweep_dir.mkdir(parents=True)
        (sweep_dir / "multirun.yaml").write_text(
            "hydra:\n  overrides:\n    task:\n    - kernel=linear\n    - mode=triton,default\n")
        (sweep_dir / "sweep_results.jsonl").write_text("{}\n")
        for job in jobs:
            _, mode, dtype = job.split("_", 1)[1].split("-")[:3]
            job_dir = sweep_dir / job
            for sub in (".hydra", ".hydra-worker", "wandb/offline-run-1/files", "inductor_code"):
                (job_dir / sub).mkdir(parents=True)
            (job_dir / ".hydra" / "config.yaml").write_text("kernel: linear\n")
            (job_dir / ".hydra-worker" / "overrides.yaml").write_text("[]\n")
            (job_dir / "wandb" / "offline-run-1" / "run-1.wandb").write_bytes(b"\0" * 64)
            (job_dir / "wandb" / "offline-run-1" / "files" / "results.jsonl").write_text("{}\n")
            (job_dir / "inductor_code" / "16x32x64_0.py").write_text("# generated\n")
            (job_dir / "run.log").write_text("log\n")
            (job_dir / "results.jsonl").write_text(json.dumps(_row(mode, dtype)) + "\n")
            (job_dir / "env.json").write_text(json.dumps(ENV))
    (root / "targets.txt").write_text("records: 3 rows\n")
    (root / "paired_ab.jsonl").write_text("{}\n")
    (root / "paired_ab.txt").write_text("paired\n")
    (root / "1" / "2_linear-max-autotune-bf16-fwd" / ".hydra").mkdir(parents=True)  # unfinished


def test_promote_copies_only_records_env_targets_and_a_readme(tmp_path, capsys):
    run = tmp_path / "multirun" / "bench-linear" / "2026-11-25_10-00-00"
    _fake_bench(run)
    dest = promote_mod.promote(run, "h100", "linear", root=tmp_path / "current")
    assert dest == tmp_path / "current" / "h100" / "linear"
    copied = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert copied == [
        "1/0_linear-triton-bf16-fwd/env.json", "1/0_linear-triton-bf16-fwd/results.jsonl",
        "1/1_linear-default-bf16-fwd/env.json", "1/1_linear-default-bf16-fwd/results.jsonl",
        "2/0_linear-triton-fp16-fwd/env.json", "2/0_linear-triton-fp16-fwd/results.jsonl",
        "README.md", "paired_ab.jsonl", "targets.txt",
    ]  # fmt: skip
    assert "2_linear-max-autotune-bf16-fwd has no results.jsonl" in capsys.readouterr().err
    results = load_results(dest)
    assert results.problems == [] and len(results.frame) == 3
    assert set(results.frame["epilogue"]) == {"bias+gelu"}  # each job's env.json came along
    readme = (dest / "README.md").read_text()
    for fact in (str(run), "NVIDIA H100 80GB HBM3", "abc1234", "python -m analysis.promote",
                 "1: kernel=linear mode=triton,default"):  # fmt: skip
        assert fact in readme


def test_promote_refuses_an_existing_folder_unless_forced(tmp_path):
    run = tmp_path / "run"
    _fake_bench(run)
    root = tmp_path / "current"
    promote_mod.promote(run, "h200", "linear", root=root)
    (root / "h200" / "linear" / "stale.txt").write_text("old\n")
    with pytest.raises(SystemExit, match="exists"):
        promote_mod.promote(run, "h200", "linear", root=root)
    promote_mod.promote(run, "h200", "linear", root=root, force=True)
    assert not (root / "h200" / "linear" / "stale.txt").exists()


def test_promote_merges_another_run_into_a_folder_without_overwriting(tmp_path):
    """A study in pieces (another dtype's jobs later): --merge adds the new jobs' files, says so
    in the README, and refuses, copying nothing, when any file is there already."""
    root = tmp_path / "current"
    first, second = tmp_path / "first", tmp_path / "second"
    _fake_bench(first)
    _fake_bench(second)
    for path in sorted(second.rglob("*-bf16-*"), reverse=True):  # the second run: fp32 jobs
        if path.is_dir() and path.parent.name in ("1", "2"):
            path.rename(path.with_name(path.name.replace("-bf16-", "-fp32-")))
    (second / "2" / "0_linear-triton-fp16-fwd").rename(second / "2" / "0_linear-triton-fp32-fwd")
    for name in ("targets.txt", "paired_ab.jsonl"):
        (second / name).unlink()
    dest = promote_mod.promote(first, "h100", "study", root=root)
    with pytest.raises(SystemExit, match="exists .* --merge"):
        promote_mod.promote(second, "h100", "study", root=root)
    with pytest.raises(SystemExit, match="pass one"):
        promote_mod.promote(second, "h100", "study", root=root, force=True, merge=True)
    promote_mod.promote(second, "h100", "study", root=root, merge=True)
    jobs = sorted(p.parent.name for p in dest.rglob("results.jsonl"))
    assert jobs == ["0_linear-triton-bf16-fwd", "0_linear-triton-fp16-fwd",
                    "0_linear-triton-fp32-fwd", "0_linear-triton-fp32-fwd",
                    "1_linear-default-bf16-fwd", "1_linear-default-fp32-fwd"]  # fmt: skip
    readme = (dest / "README.md").read_text()
    assert "TODO" in readme and "Merged" in readme and f"`{second}`" in readme
    before = sorted(p for p in dest.rglob("*") if p.is_file())
    with pytest.raises(SystemExit, match="would overwrite 6 file"):
        promote_mod.promote(second, "h100", "study", root=root, merge=True)
    assert sorted(p for p in dest.rglob("*") if p.is_file()) == before
    with pytest.raises(SystemExit, match="does not exist"):
        promote_mod.promote(second, "h200", "study", root=root, merge=True)


def test_promote_refuses_a_folder_without_records(tmp_path):
    (tmp_path / "run" / "1" / "0_job" / ".hydra").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no results.jsonl"):
        promote_mod.promote(tmp_path / "run", "h100", "x", root=tmp_path / "current")
