"""What every speed-target report shares: a Check (value, threshold, PASS or MISS), a Report,
and the readings of the records that the targets take.

The base of the target modules: analysis.targets (the single ops' targets and the CLI) and
analysis.composed_targets (the peers and the blocks) both import this module; it imports
neither. Every figure is a ratio measured in the same run (docs/targets.md).

Functions:
    Check, Report     one target line; a kernel's target lines and its tables
    _ok               the ok rows of the default view (activations as inputs), filtered
    _gm, _worst       geomean over the rows; the worst row and where it is
    vs_best_compile   per shape, Triton's speedup_vs_eager over the best compile mode's
    _mode_table       shape x mode of one column
    paired_records    experiments.paired's records of the sweep's GPUs with these fields
"""

import math
from dataclasses import dataclass

import pandas as pd

from experiments.records import geomean

# The torch.compile modes a Triton kernel is held against: whichever of them the sweep measured.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass
class Check:
    target: str
    value: float | None
    threshold: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        value = self.value
        return value is not None and not math.isnan(value) and value >= self.threshold

    def line(self) -> str:
        shown = "n/a" if self.value is None or math.isnan(self.value) else f"{self.value:.3f}"
        verdict = "PASS" if self.passed else "MISS"
        return f"  {verdict}  {self.target}: {shown} (target >= {self.threshold:g}){self.detail}"


@dataclass
class Report:
    checks: list[Check]
    tables: list[tuple[str, pd.DataFrame]]


def _ok(frame: pd.DataFrame, **where) -> pd.DataFrame:
    rows = frame[(frame["status"] == "ok") & (frame["activations"] == "inputs")]
    for column, value in where.items():
        allowed = value if isinstance(value, list | tuple | set) else [value]
        rows = rows[rows[column].isin(allowed)]
    return rows


def _gm(values) -> float:
    result = geomean([v for v in values if v is not None and not pd.isna(v)])
    return math.nan if result is None else result


def _worst(rows: pd.DataFrame, column: str) -> tuple[float, str]:
    if rows.empty or rows[column].isna().all():
        return math.nan, ""
    index = rows[column].idxmin()
    return float(rows.loc[index, column]), f" at {rows.loc[index, 'shape_label']}"


def vs_best_compile(frame: pd.DataFrame, **where) -> pd.DataFrame:
    """Per shape: Triton's speedup_vs_eager over the best compile mode's (> 1: Triton is faster)."""
    triton = _ok(frame, mode="triton", **where).set_index("shape_label")["speedup_vs_eager"]
    compiled = _ok(frame, mode=list(COMPILE_MODES), **where)
    if compiled.empty or triton.empty:
        return pd.DataFrame(columns=["triton", "best_compile", "best_mode", "ratio"])
    best = compiled.loc[compiled.groupby("shape_label")["speedup_vs_eager"].idxmax()]
    best = best.set_index("shape_label")
    table = pd.DataFrame({
        "triton": triton,
        "best_compile": best["speedup_vs_eager"],
        "best_mode": best["mode"],
    }).dropna(subset=["triton", "best_compile"])
    table["ratio"] = table["triton"] / table["best_compile"]
    return table


def _mode_table(rows: pd.DataFrame, value: str) -> pd.DataFrame:
    """shape_label x mode of one column, shapes in the order they were measured."""
    order = list(dict.fromkeys(rows["shape_label"]))
    table = rows.pivot_table(index="shape_label", columns="mode", values=value, aggfunc="first")
    return table.reindex(order)


def _worst_note(worst: float, where: str) -> str:
    return f"; worst {worst:.3f}{where}" if where else ""


def _dtypes(rows: pd.DataFrame) -> list[str]:
    return sorted(rows["dtype"].dropna().unique())


# What an experiments.paired record holds where it predates the field
PAIRED_DEFAULTS = {"metric": "gpu_time", "ours": "triton-compiled", "pass": "fwd"}


def paired_records(paired, gpus, **fields) -> list[dict]:
    """The records (load_paired) of the sweep's GPUs whose fields have these values (`pass_name`
    for "pass"), a missing metric, ours or pass reading as PAIRED_DEFAULTS."""
    if "pass_name" in fields:
        fields["pass"] = fields.pop("pass_name")
    return [r for r in paired or () if r.get("gpu_name") in gpus
            and all(r.get(k, PAIRED_DEFAULTS.get(k)) == v for k, v in fields.items())]
