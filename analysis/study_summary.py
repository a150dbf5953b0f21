"""The study in one table: per op, dtype and pass, the best Triton and the best compile mode
against eager, from a study folder's records (`make study`, docs/study.md).

    python -m analysis.study_summary multirun/study/<time>   # print it, write study_summary.csv
    python -m analysis.study_summary results/current/h100/study   # after `make promote`
    python -m analysis.study_summary results/current/h100/study --check   # exit 1 if it differs

One row per op (or block), dtype (`fp32+tf32` for the TF32 pass) and pass; README.md's study
table (analysis.headline), the notebooks and the report read the CSV. The comparison uses the ok
rows of the default view (activations as inputs); every figure is a geomean over the group's
shapes of the row's own ratio to eager, measured in the same job. A mode is a candidate for
"best" only with an ok row on every shape of its group (a failed shape is counted, not hidden),
and the best is the one with the best GPU time; GPU times within 1% of it are a tie (TIE), which
the better call latency breaks. Noisy rows are kept, as in the headline.

Columns:
    gpu, op, dtype, pass, shapes             where, what, and how many shapes the group ran
    ours_mode, ours_speedup, ours_latency_speedup, ours_compile_cold_s
                                             the best of our modes (triton, triton-compiled):
                                             GPU time and call latency x eager, and its first
                                             call's seconds per shape (JIT, autotune, compile)
    peer_mode, peer_speedup, peer_latency_speedup
                                             the best peer library (flaggems, liger, quack)
    compile_mode, compile_speedup, compile_latency_speedup, compile_cold_s, compile_warm_s,
    compile_fused_attention                  the best torch.compile mode, its compile seconds per
                                             shape (first call; again after a reset: medians)
                                             and how many of its rows Inductor rewrote into one
                                             fused attention call
    fastest                                  eager, ours, peer or compile: the best GPU time
    static_view_gain_<mode>, static_view_latency_gain_<mode>
                                             the CUDA-graph modes (reduce-overhead,
                                             max-autotune): speedup with static activations over
                                             speedup with activations as inputs, shape by shape
                                             (above 1: the input copies cost that much)
    rows_ok, rows_failed, rows_skipped, rows_noisy
                                             every row of the group: all modes, both views
"""

import argparse
import math
import sys
from pathlib import Path

import pandas as pd

from analysis.load import load_results
from experiments import registry
from experiments.peers import PEERS
from experiments.records import geomean

CSV = "study_summary.csv"
OURS = ("triton", "triton-compiled")
PEER_MODES = tuple(PEERS)  # the libraries' APIs; their -direct launches are not in the study
COMPILE = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
CUDAGRAPH = ("reduce-overhead", "max-autotune")  # run as CUDA-graph trees: two views
DTYPES = ("bf16", "fp16", "fp32", "fp32+tf32")
PASSES = ("fwd", "fwd_bwd")
GAINS = [f"static_view{kind}_gain_{mode.replace('-', '_')}"
         for mode in CUDAGRAPH for kind in ("", "_latency")]  # fmt: skip
COLUMNS = [
    "gpu", "op", "dtype", "pass", "shapes",
    "ours_mode", "ours_speedup", "ours_latency_speedup", "ours_compile_cold_s",
    "peer_mode", "peer_speedup", "peer_latency_speedup",
    "compile_mode", "compile_speedup", "compile_latency_speedup", "compile_cold_s",
    "compile_warm_s", "compile_fused_attention",
    "fastest", *GAINS, "rows_ok", "rows_failed", "rows_skipped", "rows_noisy",
]  # fmt: skip
COUNTS = ["shapes", "compile_fused_attention", "rows_ok", "rows_failed", "rows_skipped",
          "rows_noisy"]  # fmt: skip


def _geomean(values) -> float:
    result = geomean([v for v in values if v is not None and not math.isnan(v)])
    return math.nan if result is None else result


def _median(values: pd.Series) -> float:
    values = values.dropna()
    return float(values.median()) if len(values) else math.nan


# GPU-time geomeans within this factor of the best are a tie, broken by call latency: a lead under
# 1% is inside the timer's spread, while two modes of one family can differ several-fold in what
# a caller waits (our softmax training on an H200: triton 1.877x eager's GPU time and 1.22x its
# call latency, triton-compiled 1.894x and 0.26x)
TIE = 1.01


def _best(ok: pd.DataFrame, modes, shapes: set) -> tuple[str, pd.DataFrame] | None:
    """The mode with the best GPU-time geomean among those with an ok row on every shape; of
    those within TIE of it, the one with the best call-latency geomean."""
    candidates = []
    for mode in modes:
        rows = ok[ok["mode"] == mode]
        if set(rows["shape_label"]) != shapes:
            continue
        latency = _geomean(rows["latency_speedup_vs_eager"])
        candidates.append((_geomean(rows["speedup_vs_eager"]),
                           -math.inf if math.isnan(latency) else latency, mode, rows))  # fmt: skip
    if not candidates:
        return None
    top = max(speedup for speedup, *_ in candidates)
    tied = [c for c in candidates if c[0] * TIE >= top]
    _, _, mode, rows = max(tied, key=lambda c: (c[1], c[0]))
    return mode, rows


def _figures(best, prefix: str) -> dict:
    if best is None:
        return {f"{prefix}_mode": None, f"{prefix}_speedup": math.nan,
                f"{prefix}_latency_speedup": math.nan}  # fmt: skip
    mode, rows = best
    return {f"{prefix}_mode": mode, f"{prefix}_speedup": _geomean(rows["speedup_vs_eager"]),
            f"{prefix}_latency_speedup": _geomean(rows["latency_speedup_vs_eager"])}  # fmt: skip


def _static_gains(group: pd.DataFrame) -> dict:
    ok = group[group["status"] == "ok"]
    gains = {}
    for mode in CUDAGRAPH:
        rows = ok[ok["mode"] == mode]
        views = {view: rows[rows["activations"] == view].set_index("shape_label")
                 for view in ("inputs", "static")}  # fmt: skip
        shapes = sorted(set(views["inputs"].index) & set(views["static"].index))
        name = mode.replace("-", "_")
        for kind, column in (("", "speedup_vs_eager"), ("_latency", "latency_speedup_vs_eager")):
            ratios = [views["static"].at[s, column] / views["inputs"].at[s, column]
                      for s in shapes]  # fmt: skip
            gains[f"static_view{kind}_gain_{name}"] = _geomean(ratios)
    return gains


def summary_row(group: pd.DataFrame) -> dict:
    """One (op, dtype, pass) group's figures."""
    shapes = set(group["shape_label"])
    ok = group[(group["status"] == "ok") & (group["activations"] == "inputs")]
    ours, peer, compiled = (_best(ok, modes, shapes) for modes in (OURS, PEER_MODES, COMPILE))
    row = {**_figures(ours, "ours"), **_figures(peer, "peer"), **_figures(compiled, "compile")}
    row["ours_compile_cold_s"] = _median(ours[1]["compile_cold_s"]) if ours else math.nan
    row["compile_cold_s"] = _median(compiled[1]["compile_cold_s"]) if compiled else math.nan
    row["compile_warm_s"] = _median(compiled[1]["compile_warm_s"]) if compiled else math.nan
    row["compile_fused_attention"] = (
        int(compiled[1]["fused_attention"].fillna(False).astype(bool).sum()) if compiled else None
    )
    contenders = {"eager": 1.0, "ours": row["ours_speedup"], "peer": row["peer_speedup"],
                  "compile": row["compile_speedup"]}  # fmt: skip
    row["fastest"] = max((v, k) for k, v in contenders.items() if not math.isnan(v))[1]
    status = group["status"]
    return {
        "shapes": len(shapes), **row, **_static_gains(group),
        "rows_ok": int((status == "ok").sum()), "rows_failed": int((status == "failed").sum()),
        "rows_skipped": int((status == "skipped").sum()),
        "rows_noisy": int(((status == "ok") & group["noisy"].fillna(False).astype(bool)).sum()),
    }  # fmt: skip


def _order(values, known) -> dict:
    return {v: (known.index(v) if v in known else len(known), str(v)) for v in values}


def build(folder) -> pd.DataFrame:
    """The summary of every record under `folder` (a study, or its promoted copy)."""
    frame = load_results(folder).frame
    tf32 = frame["tf32"].fillna(False).astype(bool)
    frame["dtype"] = frame["dtype"].where(~(tf32 & (frame["dtype"] == "fp32")), "fp32+tf32")
    frame["gpu"] = frame["gpu_name"].fillna("cpu")
    rows = []
    for (op, dtype, pass_name), group in frame.groupby(["kernel", "dtype", "pass"]):
        gpus = group["gpu"].value_counts()
        rows.append({"gpu": gpus.index[0], "op": op, "dtype": dtype, "pass": pass_name,
                     **summary_row(group)})  # fmt: skip
    table = pd.DataFrame(rows, columns=COLUMNS)
    known = {"op": list(registry.OPS), "dtype": list(DTYPES), "pass": list(PASSES)}
    ranks = {column: _order(table[column], values) for column, values in known.items()}
    table = table.sort_values(list(known), key=lambda col: col.map(ranks[col.name]))
    table = table.reset_index(drop=True)
    for column in COUNTS:
        table[column] = table[column].astype("Int64")
    return table


def _significant(value: float, digits: int = 4) -> float:
    return value if math.isnan(value) else float(f"{value:.{digits}g}")


def csv_text(table: pd.DataFrame) -> str:
    """The table as study_summary.csv holds it: every figure to 4 significant digits."""
    rounded = table.copy()
    for column in rounded.columns:
        if rounded[column].dtype == float:
            rounded[column] = rounded[column].map(_significant)
    return rounded.to_csv(index=False, lineterminator="\n")


def read(path) -> pd.DataFrame:
    """A study_summary.csv (a file, or the folder holding it) as a DataFrame."""
    path = Path(path)
    table = pd.read_csv(path / CSV if path.is_dir() else path)
    for column in COUNTS:
        table[column] = table[column].astype("Int64")
    return table


def write(folder, out=None) -> Path:
    """Build the summary of `folder`; write it to `out` (default: <folder>/study_summary.csv)."""
    path = Path(out) if out else Path(folder) / CSV
    path.write_text(csv_text(build(folder)), encoding="utf-8")
    return path


def _cell(mode, speedup, latency) -> str:
    return "-" if not isinstance(mode, str) else f"{mode} {speedup:.3g}x/{latency:.3g}x"


def text(table: pd.DataFrame) -> str:
    """The table for a terminal: per group, each best mode's GPU time/call latency x eager."""
    view = pd.DataFrame({
        "op": table["op"], "dtype": table["dtype"], "pass": table["pass"],
        **{who: [_cell(*cells) for cells in zip(table[f"{who}_mode"], table[f"{who}_speedup"],
                                                 table[f"{who}_latency_speedup"], strict=True)]
           for who in ("ours", "peer", "compile")},
        "compile_cold_s": table["compile_cold_s"].round(1), "fastest": table["fastest"],
        "ok/failed/skipped": [f"{o}/{f}/{s}" for o, f, s in
                              zip(table["rows_ok"], table["rows_failed"], table["rows_skipped"],
                                  strict=True)],
    })  # fmt: skip
    return view.to_string(index=False)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a study folder (or its promoted copy)")
    parser.add_argument("--out", type=Path, help=f"where to write it (default: <folder>/{CSV})")
    parser.add_argument("--check", action="store_true",
                        help=f"exit 1 if <folder>/{CSV} differs from the records")  # fmt: skip
    args = parser.parse_args(argv)
    path = args.out or args.folder / CSV
    try:
        table = build(args.folder)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if not path.exists() or path.read_text(encoding="utf-8") != csv_text(table):
            print(
                f"{path} differs from the records under {args.folder}: run "
                f"`python -m analysis.study_summary {args.folder}`",
                file=sys.stderr,
            )
            return 1
        return 0
    path.write_text(csv_text(table), encoding="utf-8")
    print(text(table), f"written: {path}", sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
