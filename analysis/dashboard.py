"""The project's standard W&B views, built in code so every project gets the same panels.

    python -m analysis.dashboard --entity my-team --project triton-vs-compile --dry-run
    WANDB_API_KEY=... python -m analysis.dashboard --entity my-team   # saves both views

Two views, because they can do different things:
- a workspace (the project page): every run at once, grouped kernel -> mode in the run list.
  A workspace has one run set for all its panels, so it cannot show one kernel per section;
- a report with one panel grid per kernel: each grid has its own run set filtered on
  config kernel.name, and its bars are grouped by config mode.name.

The keys are the ones experiments/tracking.py and experiments/run.py log: per-shape metrics as
f"{shape_label}/{field}" with fields from experiments/records.py, and the job's geomeans, counts
and the "rows" table in the run summary.
"""

import argparse
import dataclasses
import json
import os
import sys

import wandb_workspaces.reports.v2 as wr
import wandb_workspaces.workspaces as ws
from wandb_workspaces import expr

from experiments import registry
from experiments.records import FIELDS

DEFAULT_PROJECT = "triton-vs-compile"  # conf/wandb/default.yaml

# Config keys: the run config is the resolved Hydra config, so groups are nested dicts.
KERNEL_KEY = "kernel.name"
MODE_KEY = "mode.name"

# Run-summary keys written by experiments.run.summarize and Tracker.finish.
SPEEDUP = "geomean_speedup_vs_eager"
LATENCY_SPEEDUP = "geomean_latency_speedup_vs_eager"
ROW_COUNTS = ("ok", "failed", "skipped")
ROWS_TABLE = "rows"

# Record fields logged per shape (as "<shape_label>/<field>") that the panels plot.
PER_SHAPE_FIELDS = (
    "speedup_vs_eager",
    "latency_speedup_vs_eager",
    "time_ms_p50",
    "call_latency_us_p50",
    "compile_cold_s",
    "compile_warm_s",
)
assert set(PER_SHAPE_FIELDS) <= set(FIELDS), "a panel names a field records.py no longer has"

# Up to this many run groups per chart: 4 kernels x 8 modes, with room for new ones.
MAX_GROUPS = 64


def kernel_names() -> list[str]:
    """The kernels Hydra can run: the registry's ops."""
    return sorted(registry.OPS)


def per_shape_regex(field: str) -> str:
    """Matches every shape's copy of one field; the '/' keeps time_ms_p50 off eager_time_ms_p50."""
    return f"^.*/{field}$"


def kernel_filter(kernel: str) -> str:
    return f"Config('{KERNEL_KEY}') = '{kernel}'"


def _per_shape_plot(field: str, title: str, **kwargs) -> wr.LinePlot:
    # The x axis is the step, i.e. the shape's position in its shape set: one point per shape.
    return wr.LinePlot(title=title, metric_regex=per_shape_regex(field), plot_type="line", **kwargs)


def _summary_bars(title: str, *keys: str, **kwargs) -> wr.BarPlot:
    # Geomeans exist only in the summary; a bare name would be read as a history key.
    return wr.BarPlot(
        title=title,
        metrics=[wr.SummaryMetric(k) for k in keys],
        max_runs_to_show=MAX_GROUPS,
        max_bars_to_show=MAX_GROUPS,
        **kwargs,
    )


# --- workspace sections -----------------------------------------------------------------------


def speedup_section() -> ws.Section:
    return ws.Section(
        name="Speedup vs eager by kernel and mode",
        is_open=True,
        panels=[
            _summary_bars("geomean GPU-time speedup vs eager (>1: faster)", SPEEDUP),
            _summary_bars("geomean call-latency speedup vs eager", LATENCY_SPEEDUP),
        ],
    )


def per_shape_section() -> ws.Section:
    return ws.Section(
        name="Per-shape results",
        is_open=True,
        panels=[
            # The table every job logs: one row per shape with every record field.
            wr.WeavePanelSummaryTable(table_name=ROWS_TABLE, layout=wr.Layout(w=24, h=12)),
            _per_shape_plot("speedup_vs_eager", "speedup_vs_eager per shape"),
        ],
    )


def compile_cost_section() -> ws.Section:
    return ws.Section(
        name="Compile cost",
        panels=[
            _per_shape_plot("compile_cold_s", "first call, empty cache (s)"),
            _per_shape_plot("compile_warm_s", "first call after reset, warm cache (s)"),
        ],
    )


def latency_section() -> ws.Section:
    return ws.Section(
        name="Call latency vs GPU time",
        panels=[
            _per_shape_plot("time_ms_p50", "GPU time per call, p50 (ms)"),
            _per_shape_plot("call_latency_us_p50", "wall-clock latency per call, p50 (us)"),
            # Below the diagonal, CPU-side overhead eats what the GPU gained.
            wr.ScatterPlot(
                title="latency speedup vs GPU-time speedup (geomeans)",
                x=wr.SummaryMetric(SPEEDUP),
                y=wr.SummaryMetric(LATENCY_SPEEDUP),
            ),
        ],
    )


def health_section() -> ws.Section:
    return ws.Section(
        name="Run health",
        panels=[_summary_bars("rows per status", *ROW_COUNTS)],
    )


def build_workspace(entity: str, project: str) -> ws.Workspace:
    """The project workspace. Pure: nothing here touches the network."""
    return ws.Workspace(
        entity=entity,
        project=project,
        name="Triton vs torch.compile",
        sections=[
            speedup_section(),
            per_shape_section(),
            compile_cost_section(),
            latency_section(),
            health_section(),
        ],
        settings=ws.WorkspaceSettings(max_runs=MAX_GROUPS),
        # One run set serves every panel, so grouping is the only way to split kernels here;
        # groups average over dtype and pass (the report below keeps kernels apart exactly).
        runset_settings=ws.RunsetSettings(
            groupby=[expr.Config(KERNEL_KEY), expr.Config(MODE_KEY)],
            pinned_columns=[f"summary:{SPEEDUP}", f"summary:{LATENCY_SPEEDUP}"],
        ),
    )


# --- report: one filtered grid per kernel -----------------------------------------------------


def kernel_grid(entity: str, project: str, kernel: str) -> wr.PanelGrid:
    by_mode = {"groupby": wr.Config(MODE_KEY), "groupby_aggfunc": "mean"}
    return wr.PanelGrid(
        runsets=[
            wr.Runset(
                entity=entity,
                project=project,
                name=kernel,
                filters=kernel_filter(kernel),
                groupby=[f"config.{MODE_KEY}"],
            )
        ],
        panels=[
            _summary_bars(f"{kernel}: geomean speedup vs eager by mode", SPEEDUP, **by_mode),
            _summary_bars(f"{kernel}: geomean latency speedup by mode", LATENCY_SPEEDUP, **by_mode),
            _per_shape_plot("compile_cold_s", f"{kernel}: compile cold (s)", **by_mode),
            wr.WeavePanelSummaryTable(table_name=ROWS_TABLE, layout=wr.Layout(w=24, h=10)),
        ],
    )


def build_report(entity: str, project: str) -> wr.Report:
    """A report with a section per kernel. Pure, as long as entity is given."""
    blocks = [
        wr.P(
            "Speedup of each mode over eager PyTorch, one section per kernel. Bars are the "
            "mean over dtype and pass of each run's geomean; the table has every shape."
        )
    ]
    for kernel in kernel_names():
        blocks += [wr.H2(f"Speedup: {kernel}"), kernel_grid(entity, project, kernel)]
    return wr.Report(
        entity=entity,
        project=project,
        title="Triton vs torch.compile: speedup by kernel",
        blocks=blocks,
        width="fluid",
    )


def describe(obj):
    """A plain-data view of SDK objects, each tagged with its class name, hidden fields left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        shown = {
            k: describe(v) for k, v in fields.items() if not k.startswith("_") and v is not None
        }
        return {"type": type(obj).__name__, **shown}
    if isinstance(obj, list | tuple):
        return [describe(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): describe(v) for k, v in obj.items()}
    return obj


def spec(workspace: ws.Workspace, report: wr.Report) -> dict:
    """What save() would send for the workspace, and the report as built.

    The report's wire form needs the project's internal id, which wr.Runset looks up on the
    server while serializing, so offline it is shown as the SDK objects instead.
    """
    wire = workspace._to_model().model_dump(by_alias=True, exclude_none=True, mode="json")
    return {"workspace": wire, "report": describe(report)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.dashboard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--entity", required=True, help="W&B team or user that owns the project")
    parser.add_argument("--project", default=DEFAULT_PROJECT)
    parser.add_argument("--dry-run", action="store_true", help="print the spec, send nothing")
    args = parser.parse_args(argv)

    workspace = build_workspace(args.entity, args.project)
    report = build_report(args.entity, args.project)
    if args.dry_run:
        print(json.dumps(spec(workspace, report), indent=2))
        return 0

    if not os.environ.get("WANDB_API_KEY"):
        print(
            "error: WANDB_API_KEY is not set; export it to save, or pass --dry-run",
            file=sys.stderr,
        )
        return 2
    try:
        workspace.save()
        report.save()
    except Exception as exc:  # one readable line instead of a GraphQL traceback
        print(f"error: saving to W&B failed ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    print(f"workspace: {workspace.url}")
    print(f"report:    {report.url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
