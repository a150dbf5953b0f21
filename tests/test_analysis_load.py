"""analysis.load: records from results.jsonl folders and from W&B into one frame, with a caption."""

import json
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.load import caption, load_results, load_wandb
from experiments.records import Record
from tests.conftest import REPO_ROOT

H100 = REPO_ROOT / "results" / "current" / "h100" / "study"
SHA = "775ac0e8bab87144f19ac3a159a1795b286191fa"
ENV = {"gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "triton": "3.6.0",
       "git_sha": SHA, "peaks": {"copy_gbps": 3000.0, "bf16_matmul_tflops": 760.0}}


def record(mode="triton", kernel="softmax", label="7x1823", speedup=1.5, static=(), **extra):
    return Record(kernel=kernel, mode=mode, shape={"m": 7, "n": 1823}, shape_label=label,
                  shape_set="default", dtype="bf16", pass_="fwd", tf32=False, device="cuda",
                  static_inputs=list(static), run_name=f"{kernel}-{mode}", job_id="sweep/0",
                  time_ms_p50=0.02, eager_time_ms_p50=0.02 * speedup, speedup_vs_eager=speedup,
                  max_rel_err=1e-3, **extra).to_json()


def write_job(folder, rows, env=ENV, tail=""):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    if env is not None:
        (folder / "env.json").write_text(json.dumps(env))


def test_bad_lines_are_reported_by_file_and_line_and_the_rest_load(tmp_path):
    invalid = record(mode="default")
    del invalid["shape_label"]
    write_job(tmp_path / "a", [record(), invalid, record(mode="eager")],
              tail='{"kernel": "softmax", "mode": "tri')  # killed mid-write
    write_job(tmp_path / "b", [record(kernel="matmul", static=["a", "b"])])
    results = load_results(tmp_path)
    path_a = tmp_path / "a" / "results.jsonl"
    assert len(results.problems) == 2
    assert results.problems[0].startswith(f"{path_a}:2: ")
    assert "missing field 'shape_label'" in results.problems[0]
    assert results.problems[1].startswith(f"{path_a}:4: not valid JSON")
    frame = results.frame
    assert list(frame["mode"]) == ["triton", "eager", "triton"]
    assert list(frame["activations"]) == ["inputs", "inputs", "static"]
    assert frame["git_short_sha"].tolist() == ["775ac0e"] * 3
    assert frame["peak_copy_gbps"].tolist() == [3000.0] * 3
    assert frame["peak_bf16_tflops"].tolist() == [760.0] * 3
    assert frame["job_dir"].tolist() == [str(tmp_path / "a")] * 2 + [str(tmp_path / "b")]
    assert "pass" in frame and frame["cudagraph_ms"].isna().all()  # every schema field is there


def test_missing_env_json_leaves_nan_and_a_problem(tmp_path):
    write_job(tmp_path / "job", [record()], env=None)
    results = load_results(tmp_path)
    assert len(results.problems) == 1 and "env.json" in results.problems[0]
    assert results.frame[["gpu_name", "torch", "peak_copy_gbps"]].isna().all().all()
    assert caption(results.frame) == "? · torch ? · triton ? · records @ ?"


def test_no_records_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no results.jsonl under {tmp_path}"):
        load_results(tmp_path)


def test_caption_names_every_gpu_version_and_sha(tmp_path):
    write_job(tmp_path / "a", [record()])
    write_job(tmp_path / "b", [record()], env={**ENV, "git_sha": "f8374d0" + "0" * 33})
    assert caption(load_results(tmp_path).frame) == (
        "NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130 · triton 3.6.0 · records @ 775ac0e, f8374d0")


@pytest.mark.skipif(not H100.exists(), reason="no committed H100 records")
def test_committed_h100_records_load_cleanly():
    results = load_results(H100)
    assert results.problems == []
    frame = results.frame
    assert {"matmul", "linear", "softmax", "conv"} <= set(frame["kernel"])
    assert frame["gpu_name"].eq("NVIDIA H100 80GB HBM3").all()
    assert set(frame["git_short_sha"]) == {"b123d32"}
    assert frame["peak_bf16_tflops"].notna().all()
    static = frame[frame["activations"] == "static"]
    assert set(static["mode"]) == {"reduce-overhead", "max-autotune"} and len(static) == 56


# --- W&B, through a fake public API (no network) ---------------------------------------------
def fake_run(run_id, rows, env=ENV):
    """A run as the public API returns it; its rows as experiments.tracking logs them."""
    columns = sorted({k for row in rows for k in row})
    cells = [[str(r.get(c)) if isinstance(r.get(c), list | dict) else r.get(c) for c in columns]
             for r in rows]
    table = SimpleNamespace(columns=columns, data=cells)
    artifacts = [
        SimpleNamespace(type="code", name=f"inductor-code-{run_id}:v0", get=lambda name: None),
        SimpleNamespace(type="run_table", name=f"run-{run_id}-rows:v0",
                        get=lambda name: table if name == "rows" else None),
    ]
    return SimpleNamespace(id=run_id, config={"env": env}, logged_artifacts=lambda: artifacts)


class FakeApi:
    def __init__(self, runs):
        self._runs, self.paths = runs, []

    def runs(self, path):
        self.paths.append(path)
        return self._runs


def test_load_wandb_reads_rows_tables_into_the_same_frame(tmp_path):
    rows = [record(), record(mode="reduce-overhead", static=["x"], cudagraph_ms=None)]
    crashed = SimpleNamespace(id="dead", config={}, logged_artifacts=lambda: [])
    api = FakeApi([fake_run("r1", rows), crashed])
    frame = load_wandb("kbench", entity="me", api=api)
    assert api.paths == ["me/kbench"]
    assert frame.attrs["problems"] == ["wandb:me/kbench/dead: no rows table"]
    assert list(frame["mode"]) == ["triton", "reduce-overhead"]
    assert list(frame["activations"]) == ["inputs", "static"]
    assert frame["shape"][0] == {"m": 7, "n": 1823} and frame["static_inputs"][1] == ["x"]
    assert frame["job_dir"][0] == "wandb:me/kbench/r1"
    assert caption(frame) == caption(_offline(tmp_path, rows))
    assert list(frame.columns) == list(_offline(tmp_path, rows).columns)
    assert pd.isna(frame["cudagraph_ms"][1])


def _offline(tmp_path, rows) -> pd.DataFrame:
    write_job(tmp_path / "offline", rows)
    return load_results(tmp_path / "offline").frame


COMMITTED = ["current/h100/study", "current/h100/matmul", "current/h100/linear",
             "current/h100/conv", "current/h100/softmax", "current/h200/matmul",
             "current/h200/linear", "current/h200/conv", "current/h200/softmax"]  # fmt: skip


@pytest.mark.parametrize("folder", COMMITTED)
def test_every_committed_results_folder_loads_without_problems(folder):
    results = load_results(REPO_ROOT / "results" / folder)
    assert results.problems == [] and len(results.frame) > 0
    assert results.frame["gpu_name"].notna().all()  # every row stamped with its GPU from env.json
