"""Geomean speedup tables from the records under a folder.

    python -m analysis.summary multirun/2026-11-22/10-00-00   # or outputs/, or results/current/h100

Reads every results.jsonl below the folder and prints, per kernel and mode, the geomean of
speedup_vs_eager over the ok rows that are not flagged noisy (GPU time), the same for call
latency, and the row counts (`--include-noisy` keeps the noisy rows).
Rows measured with static activations (bench.static_inputs=true) are kept apart from the default
view, in which CUDA-graph modes copy their inputs on every call.
"""

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from analysis.load import drop_noisy, load_results
from experiments.records import geomean

GROUP = ["kernel", "dtype", "pass", "activations", "mode"]


def load_rows(root: Path) -> pd.DataFrame:
    """analysis.load.load_results(root).frame; unreadable lines are reported on stderr."""
    try:
        results = load_results(root)
    except FileNotFoundError as exc:
        raise SystemExit(f"error: {exc}") from None
    for problem in results.problems:
        print(f"warning: skipped {problem}", file=sys.stderr)
    return results.frame


def _geomean(values: pd.Series) -> float:
    result = geomean(values.dropna().tolist())
    return math.nan if result is None else result


def geomean_table(frame: pd.DataFrame) -> pd.DataFrame:
    ok = frame[frame["status"] == "ok"]
    table = ok.groupby(GROUP).agg(
        speedup_vs_eager=("speedup_vs_eager", _geomean),
        latency_speedup_vs_eager=("latency_speedup_vs_eager", _geomean),
        shapes_ok=("status", "size"),
    )
    failed = frame[frame["status"] != "ok"].groupby(GROUP).size()
    table["not_ok"] = failed.reindex(table.index).fillna(0).astype(int)
    return table.round(3)


def report_text(frame: pd.DataFrame, include_noisy: bool = False) -> str:
    """The geomean table over the ok rows (without the noisy ones unless `include_noisy`), how
    many noisy rows it left out, then every row that is not ok."""
    lines = []
    kept, left_out = (frame, 0) if include_noisy else drop_noisy(frame)
    if (kept["status"] == "ok").any():
        lines.append(geomean_table(kept).to_string())
    if left_out:
        lines.append(f"{left_out} noisy rows left out (repeat spread above bench.noisy_threshold;"
                     " --include-noisy keeps them)")
    failed = frame[frame["status"] != "ok"]
    if len(failed):
        lines.append(f"\n{len(failed)} rows not ok:")
        lines.append(
            failed[["kernel", "mode", "shape_label", "status", "reason"]].to_string(index=False)
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder searched for results.jsonl files")
    parser.add_argument("--include-noisy", action="store_true",
                        help="keep the rows flagged noisy in the geomeans")
    args = parser.parse_args(argv)
    frame = load_rows(args.root)
    with pd.option_context("display.width", 200, "display.max_rows", 500):
        print(report_text(frame, include_noisy=args.include_noisy))


if __name__ == "__main__":
    main()
