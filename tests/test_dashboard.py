"""The W&B dashboard spec, offline: its panels must read the keys the experiment jobs log.

The key names are taken from the real writers (Tracker.log_row, Tracker.finish, summarize) fed a
fake run, so renaming a logged key without updating analysis/dashboard.py fails here.
"""

import json
import re
import types

import pytest
import wandb
import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces import expr

from analysis import dashboard
from experiments.registry import OPS
from experiments.run import summarize
from experiments.tracking import Tracker

SECTIONS = [
    "Speedup vs eager by kernel and mode",
    "Per-shape results",
    "Compile cost",
    "Call latency vs GPU time",
    "Run health",
]


class FakeRun:
    """Collects what Tracker sends to wandb."""

    def __init__(self):
        self.logged, self.summary = {}, {}

    def log(self, metrics, step=None):
        self.logged.update(metrics)

    def finish(self):
        pass


def logged_keys() -> tuple[set[str], set[str]]:
    """(history keys, summary keys) of one job with two ok shapes, through the real writers."""
    rows = [
        {
            "shape_label": label,
            "status": "ok",
            "speedup_vs_eager": 1.3,
            "latency_speedup_vs_eager": 0.9,
            "time_ms_p50": 0.21,
            "eager_time_ms_p50": 0.27,
            "call_latency_us_p50": 41.0,
            "eager_call_latency_us_p50": 37.0,
            "compile_cold_s": 12.5,
            "compile_warm_s": 1.7,
        }
        for label in ("4096x4096x4096", "16x4096x4096")
    ]
    tracker = Tracker.__new__(Tracker)  # skips wandb.init; the run is the fake
    tracker.run = FakeRun()
    tracker._wandb = types.SimpleNamespace(
        Table=lambda columns: types.SimpleNamespace(add_data=lambda *cells: None)
    )
    for step, row in enumerate(rows):
        tracker.log_row(row, step)
    run = tracker.run
    tracker.finish(rows, summarize(rows), code_dir=None)
    return set(run.logged), set(run.summary)


@pytest.fixture(scope="module")
def workspace():
    return dashboard.build_workspace("my-team", "triton-vs-compile")


@pytest.fixture(scope="module")
def report():
    return dashboard.build_report("my-team", "triton-vs-compile")


def panels(workspace):
    return [p for s in workspace.sections for p in s.panels]


def test_workspace_sections_and_project(workspace):
    assert [s.name for s in workspace.sections] == SECTIONS
    assert (workspace.entity, workspace.project) == ("my-team", "triton-vs-compile")
    assert all(s.panels for s in workspace.sections)


def test_summary_panels_read_keys_the_job_writes(workspace):
    _, summary_keys = logged_keys()
    wire = [p._to_model().config for p in panels(workspace) if isinstance(p, wr.BarPlot)]
    read = {m.removeprefix("summary_metrics.") for config in wire for m in config.metrics}
    assert all(m.startswith("summary_metrics.") for config in wire for m in config.metrics)
    assert {dashboard.SPEEDUP, dashboard.LATENCY_SPEEDUP, "ok", "failed", "skipped"} == read
    assert read <= summary_keys


def test_per_shape_plots_match_exactly_their_field(workspace):
    history_keys, _ = logged_keys()
    plots = [p for p in panels(workspace) if isinstance(p, wr.LinePlot)]
    plotted = {p.metric_regex for p in plots}
    for field in ("speedup_vs_eager", "compile_cold_s", "time_ms_p50", "call_latency_us_p50"):
        regex = dashboard.per_shape_regex(field)
        assert regex in plotted
        matched = {k for k in history_keys if re.search(regex, k)}
        # one key per shape, and never the eager_ or latency_ twin that shares the suffix
        assert matched == {"4096x4096x4096/" + field, "16x4096x4096/" + field}
    assert all(p._to_model().config.use_metric_regex for p in plots)


def test_rows_table_panel_reads_the_logged_table(workspace):
    history_keys, _ = logged_keys()
    tables = [p for p in panels(workspace) if isinstance(p, wr.WeavePanelSummaryTable)]
    assert [t.table_name for t in tables] == [dashboard.ROWS_TABLE]
    assert dashboard.ROWS_TABLE in history_keys


def test_workspace_groups_runs_by_kernel_then_mode(workspace):
    run_set = workspace._to_model().spec.section.run_sets[0]
    # nested Hydra config is stored as {"kernel": {"value": {"name": ...}}} on the server
    assert [(k.section, k.name) for k in run_set.grouping] == [
        ("config", "kernel.value.name"),
        ("config", "mode.value.name"),
    ]


def test_report_has_one_filtered_speedup_grid_per_kernel(report):
    assert dashboard.kernel_names() == sorted(OPS)
    grids = [b for b in report.blocks if isinstance(b, wr.PanelGrid)]
    headings = [b.text for b in report.blocks if isinstance(b, wr.H2)]
    assert headings == [f"Speedup: {k}" for k in sorted(OPS)]
    for kernel, grid in zip(sorted(OPS), grids, strict=True):
        (run_set,) = grid.runsets
        v2 = expr.filters_tree_to_v2(expr.expr_to_filters(run_set.filters))
        assert [(f["key"], f["op"], f["value"]) for f in v2["filters"]] == [
            ({"section": "config", "name": "kernel.name"}, "=", kernel)
        ]
        assert expr.groupby_str_to_key(run_set.groupby[0]).name == "mode.value.name"
        (speedup,) = [
            p
            for p in grid.panels
            if isinstance(p, wr.BarPlot) and p.metrics == [wr.SummaryMetric(dashboard.SPEEDUP)]
        ]
        assert speedup._to_model().config.group_by == "mode.value.name"
        assert kernel in speedup.title


@pytest.fixture
def offline(monkeypatch):
    """No key, and any attempt to reach W&B fails the test."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)

    def no_network(*args, **kwargs):
        pytest.fail("the dashboard tried to reach W&B")

    monkeypatch.setattr(ws.Workspace, "save", no_network)
    monkeypatch.setattr(wr.Report, "save", no_network)
    monkeypatch.setattr(wandb, "Api", no_network)


def test_dry_run_prints_the_spec_without_network(offline, capsys):
    assert dashboard.main(["--entity", "my-team", "--project", "my-bench", "--dry-run"]) == 0
    spec = json.loads(capsys.readouterr().out)
    assert spec["workspace"]["project"] == "my-bench"
    assert spec["report"]["project"] == "my-bench"
    assert spec["workspace"]["displayName"] == "Triton vs torch.compile"


def test_missing_key_is_one_error_line_and_exit_2(offline, capsys):
    assert dashboard.main(["--entity", "my-team"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and "WANDB_API_KEY" in err


def test_save_failure_never_prints_the_key(monkeypatch, capsys):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)

    def refused(self):
        raise RuntimeError("permission denied")

    monkeypatch.setattr(ws.Workspace, "save", refused)
    monkeypatch.setattr(wr.Report, "save", refused)
    assert dashboard.main(["--entity", "my-team"]) == 1
    out, err = capsys.readouterr()
    assert "permission denied" in err and "k" * 40 not in out + err
