"""Targets beyond our single ops: ours against the peer Triton libraries, and the composed blocks
(mlp, attention, bottleneck) against the compile modes. analysis.targets prints them beside the
ops' own (docs/targets.md). This module imports the shared checks (analysis.target_checks),
never analysis.targets.

Every ratio reads speedup_vs_eager, the GPU time of a job's mode over eager's measured beside it
in the same job, so rows of separate jobs compare through the eager each was paired with.

Functions:
    peer_report(frame, kernel)  ours >= every peer library by GPU time (geomean over the shapes)
    block_report(frame, kernel) a block in mode=triton against the best compile mode
"""

import pandas as pd

from analysis.target_checks import (
    COMPILE_MODES,
    Check,
    Report,
    _dtypes,
    _gm,
    _mode_table,
    _ok,
    _worst,
    _worst_note,
    paired_records,
    vs_best_compile,
)

PEER_MODES = ("flaggems", "liger", "quack")  # the libraries as their docs call them (GPU time)
PEER_AT_LEAST = 1.0  # ours / peer, geomean of speedup_vs_eager over the shapes both ran
BLOCK_AT_LEAST = {("mlp", "fwd"): 1.0, ("mlp", "fwd_bwd"): 1.0, ("bottleneck", "fwd"): 1.0}
LATENCY_AT_LEAST = 1.0  # best compile mode's call latency / ours, geomean


def peer_report(frame: pd.DataFrame, kernel: str) -> Report:
    """Per dtype and pass: ours over each peer that ran the op, with the per-shape table that
    says where a peer wins."""
    checks, tables = [], []
    rows = _ok(frame, kernel=kernel)
    for dtype in _dtypes(rows):
        for pass_name in dict.fromkeys(rows["pass"]):
            part = _ok(rows, dtype=dtype, **{"pass": pass_name})
            ours = part[part["mode"] == "triton"].drop_duplicates("shape_label")
            ours = ours.set_index("shape_label")["speedup_vs_eager"]
            columns = {"triton x eager": ours}
            for peer in PEER_MODES:
                theirs = part[part["mode"] == peer].drop_duplicates("shape_label")
                theirs = theirs.set_index("shape_label")["speedup_vs_eager"]
                ratio = (ours / theirs).dropna()
                if ratio.empty:
                    continue
                columns[f"{peer} x eager"] = theirs
                columns[f"triton / {peer}"] = ratio
                worst, where = _worst(ratio.rename("r").reset_index(), "r")
                detail = _worst_note(worst, where) + f" ({len(ratio)} shapes)"
                name = f"{kernel} {dtype} {pass_name}: triton vs {peer}, GPU time (geomean)"
                checks.append(Check(name, _gm(ratio), PEER_AT_LEAST, detail))
            if len(columns) > 1:
                table = pd.DataFrame(columns).reindex(list(dict.fromkeys(part["shape_label"])))
                tables.append(
                    (
                        f"{kernel} {dtype} {pass_name}: ours and the peer libraries "
                        "(speedup_vs_eager; triton / peer > 1: ours faster)",
                        table,
                    )
                )
    return Report(checks, tables)


def block_report(frame: pd.DataFrame, kernel: str, paired: list[dict] | None = None) -> Report:
    """mode=triton against the best compile mode by GPU time (targets for mlp fwd and fwd_bwd and
    bottleneck fwd; attention and bottleneck fwd_bwd are reported), and by call latency: from
    paired records (experiments.paired --metric latency --ours triton, one process) where the run
    has them for this block, dtype, pass and GPU, else from the modes' separate jobs."""
    checks, tables = [], []
    rows = _ok(frame, kernel=kernel)
    for dtype in _dtypes(rows):
        for pass_name in dict.fromkeys(rows["pass"]):
            where = dict(kernel=kernel, dtype=dtype, **{"pass": pass_name})
            part = _ok(frame, **where)
            tag = f"{kernel} {dtype} {pass_name}"
            best = vs_best_compile(frame, **where)
            if not best.empty:
                worst, at = _worst(best.reset_index(), "ratio")
                threshold = BLOCK_AT_LEAST.get((kernel, pass_name))
                value = _gm(best["ratio"])
                detail = _worst_note(worst, at) + f" ({len(best)} shapes)"
                name = f"{tag}: triton vs best compile mode, GPU time (geomean)"
                if threshold is None:  # reported, not a target (docs/targets.md)
                    tables.append((f"{name}: {value:.3f}{detail}", best))
                else:
                    checks.append(Check(name, value, threshold, detail))
            mine = paired_records(paired, set(part["gpu_name"].dropna()), metric="call_latency",
                                  ours="triton", pass_name=pass_name, kernel=kernel, dtype=dtype)
            if mine:
                worst = min(mine, key=lambda r: r["median_ratio"])
                checks.append(Check(
                    f"{tag}: call latency, best compile mode's / triton's, paired (geomean)",
                    _gm(pd.Series([r["median_ratio"] for r in mine])), LATENCY_AT_LEAST,
                    f"; worst {worst['median_ratio']:.3f} at {worst['shape_label']} ("
                    f"{', '.join(worst['compile_modes'])}; {len(mine)} shapes)"))
                latency = pd.DataFrame()
            else:
                latency = _latency_vs_best_compile(part)
            if not latency.empty:
                worst, at = _worst(latency.reset_index(), "ratio")
                checks.append(Check(f"{tag}: call latency, best compile mode's / triton's "
                                    "(geomean)", _gm(latency["ratio"]), LATENCY_AT_LEAST,
                                    _worst_note(worst, at)))  # fmt: skip
            if not part.empty:
                tables.append(
                    (f"{tag}: speedup_vs_eager by mode", _mode_table(part, "speedup_vs_eager"))
                )
            fused = part[part["mode"].isin(COMPILE_MODES)]
            if "fused_attention" in fused and fused["fused_attention"].notna().any():
                tables.append(
                    (
                        f"{tag}: did Inductor fuse the attention pattern?",
                        _mode_table(fused, "fused_attention"),
                    )
                )
    return Report(checks, tables)


def _latency_vs_best_compile(part: pd.DataFrame) -> pd.DataFrame:
    """Per shape: the lowest call latency among the compile modes over triton's (> 1: ours is
    lighter)."""
    ours = part[part["mode"] == "triton"].set_index("shape_label")["call_latency_us_p50"]
    compiled = part[part["mode"].isin(COMPILE_MODES)]
    if compiled.empty or ours.empty:
        return pd.DataFrame(columns=["ratio"])
    best = compiled.groupby("shape_label")["call_latency_us_p50"].min()
    return pd.DataFrame({"ratio": (best / ours).dropna()})
