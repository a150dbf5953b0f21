"""The whole-model answer (analysis.models_report): README's block and each models/README.md are
what the committed model records say, and --check fails when they differ."""

import dataclasses
import json

from analysis import models_report, report
from experiments.records import Record
from tests.conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()


def _row(model, mode, pass_name, speedup, status="ok", **fields):
    record = Record(kernel=model, mode=mode, shape={"batch": 32, "image": 224, "variant": "full"},
                    shape_label="32x224-full", shape_set="default", dtype="bf16",
                    pass_=pass_name, tf32=False, device="cuda:0", static_inputs=[],
                    run_name="r", job_id="j", status=status)  # fmt: skip
    if status == "ok":
        record.time_ms_p50, record.eager_time_ms_p50 = 10.0 / speedup, 10.0
        record.speedup_vs_eager, record.max_rel_err = speedup, 0.01
        record.latency_speedup_vs_eager, record.peak_mem_ratio = speedup, 0.9
        record.accuracy_ratio, record.accuracy_pass = 1.02, True
    else:
        record.reason = fields.pop("reason")
    for key, value in fields.items():
        setattr(record, key, value)
    return record.to_json()


def _records(tmp_path):
    folder = tmp_path / "current" / "h100" / "models" / "job"
    folder.mkdir(parents=True)
    rows = [
        _row("resnet50", "eager", "fwd", 1.0),
        _row("resnet50", "triton", "fwd", 1.12, fallbacks={"conv2d": {"ours": 53}}),
        _row("resnet50", "triton-compiled", "fwd", 1.40,
             fallbacks={"conv2d": {"ours": 52, "dtype float64": 1}}),
        _row("resnet50", "default", "fwd", 1.85, compile_cold_s=40.0, compile_warm_s=5.0,
             graphs_compiled=1, graph_breaks=0),
        _row("resnet50", "max-autotune", "fwd", 1.0, status="failed", reason="OOM"),
        _row("resnet50", "liger", "fwd", 1.0, status="skipped", reason="unsupported: liger"),
        _row("llama", "triton", "fwd_bwd", 0.95),
        _row("llama", "liger", "fwd_bwd", 1.2),
    ]  # fmt: skip
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "env.json").write_text(json.dumps({"gpu_name": "NVIDIA H100 80GB HBM3"}))
    return tmp_path / "current"


def test_the_table_takes_the_best_of_each_family_and_counts_the_cells(tmp_path):
    current = _records(tmp_path)
    text = models_report.readme_text(current)
    assert "`results/current/h100/models`" in text
    lines = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines()
             if line.startswith("| ")}  # fmt: skip
    resnet = lines["| ResNet-50"]  # model, GPU, inference, training, peers, ok / run
    assert resnet[1:4] == ["H100", "triton-compiled 1.40x; default 1.85x", "not run"]
    assert resnet[-1] == "4 / 5 (1 skipped) |"  # eager, triton x2, default; MA failed
    llama = lines["| Llama decoder"]
    assert llama[2:5] == ["not run", "triton 0.95x; -", "-; liger 1.20x"]


def test_the_folder_readme_lists_every_row_with_its_reason(tmp_path):
    current = _records(tmp_path)
    text = models_report.folder_readme(models_report.model_frame(current), "h100")
    assert "| ResNet-50 | inference | max-autotune | failed: OOM |" in text
    assert "| ResNet-50 | inference | default | ok | 5.41 (1.85x) |" in text
    assert "40.0 / 5.0 | 1, 0 |" in text
    assert "dtype float64 x1" in text and text.count("| none |") == 1


def test_the_written_files_pass_the_check_and_a_change_fails_it(tmp_path, monkeypatch):
    current = _records(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{models_report.START}\nold\n{models_report.END}\ny\n")
    monkeypatch.setattr(models_report, "README", readme)
    assert models_report.main(["--current", str(current), "--check"]) == 1
    assert models_report.main(["--current", str(current), "--write"]) == 0
    assert models_report.main(["--current", str(current), "--check"]) == 0
    assert (current / "h100" / "models" / "README.md").is_file()
    readme.write_text(readme.read_text().replace("1.85x", "1.86x"))
    assert models_report.main(["--current", str(current), "--check"]) == 1


def test_the_figure_and_the_report_show_the_models(tmp_path):
    current = _records(tmp_path)
    paths = models_report.save_figure(models_report.model_frame(current), tmp_path / "fig")
    assert [p.name for p in paths] == ["model_speedups.png", "model_speedups.svg"]
    svg = paths[1].read_text()
    assert 'id="resnet50:triton-compiled"' in svg and 'id="llama:liger"' in svg
    page = report.build(current / "h100" / "models", tmp_path / "report").read_text()
    assert "<h3>model_speedups</h3>" in page


def test_readme_holds_the_committed_model_records():
    """README.md's whole-model block and every results/current/<gpu>/models/README.md are what
    the records make (regenerate: `python -m analysis.models_report --write`)."""
    for path, text in models_report.outputs(README).items():
        assert path.read_text() == text, path


def test_a_record_with_every_model_field_round_trips():
    fields = {f.name for f in dataclasses.fields(Record)}
    assert {"accuracy_ratio", "accuracy_pass", "fallbacks", "fallback_share", "peak_mem_ratio",
            "eager_peak_mem_mb", "graphs_compiled", "eager_max_rel_err"} <= fields  # fmt: skip
