"""The kernel issues' speed targets, checked against the records of a benchmark sweep.

    make bench kernel=matmul                            # runs the op's grids, then prints this
    python -m analysis.targets multirun/bench-matmul/2026-11-22_10-00-00 --kernel matmul

Every figure is a ratio measured in the same run or a rate against the device's own measured
peaks (env.json), never a number typed in:
- speedup_vs_eager pairs each mode's calls with eager's calls in the same job (GPU time);
- "vs best compile" divides Triton's speedup_vs_eager by the best compile mode's, shape by shape,
  so each side is normalised by the eager run of its own job;
- % of copy is the row's bandwidth (minimum bytes: read once, write once) over the copy bandwidth
  measured on that device (a 1 GiB copy); % of a same-bytes copy, over a copy of the row's own
  minimum bytes timed in the same job (pct_copy_same_bytes: the depthwise conv's bar).

Where Triton and the best compile mode both run at the copy's rate, jobs of their own differ by
more than the kernels do (0.3-0.7% for one kernel between runs, docs/kernels/softmax.md).
--paired FILE adds softmax's paired reading: the JSONL of `python -m experiments.paired --jsonl
FILE`, which times ours and both compile modes in one process, interleaved, round by round; the
check takes each N's median ratio over the rounds, from the records of the sweep's own GPU. Its
`--metric latency` records (triton-compiled's call latency against compile default's, paired the
same way) replace the separate-jobs reading of that host-path target.

A target prints its value, its threshold and PASS or MISS; one with no rows prints "n/a" and counts
as a miss. These are benchmarks: the exit status is 0 unless --strict is given.

This module holds the single ops' targets and the CLI; the Check, the Report and the readings
they share are analysis.target_checks', the peers' and the blocks' targets
analysis.composed_targets' (each imports target_checks, neither this module).
"""

import argparse
import json
import math
import sys
from functools import partial
from pathlib import Path

import pandas as pd

from analysis.composed_targets import block_report, peer_report
from analysis.summary import load_rows
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
from experiments import registry


def _paired_table(triton: pd.DataFrame) -> pd.DataFrame:
    """Per shape, Triton's rate and the eager rate measured beside it, from the Triton rows."""
    rows = triton.set_index("shape_label")
    return pd.DataFrame({
        "eager TFLOP/s": rows["flops"] / (rows["eager_time_ms_p50"] * 1e-3) / 1e12,
        "triton TFLOP/s": rows["tflops"],
        "speedup": rows["speedup_vs_eager"],
        "noisy": rows["noisy"],
    })


def matmul_report(frame: pd.DataFrame) -> Report:
    checks, tables = [], []
    rows = _ok(frame, kernel="matmul", **{"pass": "fwd"})
    for dtype in _dtypes(rows):
        sets = _ok(rows, dtype=dtype, shape_set=["square", "llm"])
        triton = sets[sets["mode"] == "triton"].drop_duplicates("shape_label")
        tag = f"matmul {dtype} triton vs eager"
        if dtype in ("bf16", "fp16"):
            checks.append(Check(f"{tag}, geomean over square+llm", _gm(triton["speedup_vs_eager"]),
                                1.00, f" ({len(triton)} shapes)"))
            worst, where = _worst(triton, "speedup_vs_eager")
            checks.append(Check(f"{tag}, worst shape", worst, 0.85, where))
        big = triton[triton["shape_label"] == "8192x8192x8192"]
        if dtype == "bf16":
            checks.append(Check("matmul bf16 8192^3 TFLOP/s", float(big["tflops"].iloc[0])
                                if len(big) else math.nan, 750))
        tables.append((f"matmul {dtype} (square, llm): triton against eager in the same job",
                       _paired_table(triton)))
    # batched products (attention's q @ k^T and p @ v) against cuBLAS's batched GEMM
    attention = _ok(rows, shape_set="attention", mode="triton")
    for dtype in _dtypes(attention):
        part = attention[attention["dtype"] == dtype]
        worst, where = _worst(part, "speedup_vs_eager")
        checks.append(Check(f"matmul {dtype} attention (batched): triton vs eager (geomean)",
                            _gm(part["speedup_vs_eager"]), 0.95,
                            f" ({len(part)} shapes)" + _worst_note(worst, where)))
        tables.append((f"matmul {dtype} attention (batched): triton against eager",
                       _paired_table(part)))
    return Report(checks, tables)


def linear_report(frame: pd.DataFrame) -> Report:
    checks, tables = [], []
    rows = _ok(frame, kernel="linear", epilogue="bias+gelu")
    for dtype in _dtypes(rows):
        fwd = _ok(rows, dtype=dtype, **{"pass": "fwd"})
        triton = fwd[fwd["mode"] == "triton"]
        checks.append(Check(f"linear {dtype} bias+gelu fwd: triton vs eager (geomean)",
                            _gm(triton["speedup_vs_eager"]), 1.15, f" ({len(triton)} shapes)"))
        best = vs_best_compile(frame, kernel="linear", epilogue="bias+gelu", dtype=dtype,
                               **{"pass": "fwd"})
        worst, where = _worst(best.reset_index(), "ratio")
        checks.append(Check(f"linear {dtype} bias+gelu fwd: triton vs best compile mode (geomean)",
                            _gm(best["ratio"]), 1.0, _worst_note(worst, where)))
        both = _ok(rows, dtype=dtype, mode="triton", **{"pass": "fwd_bwd"})
        checks.append(Check(f"linear {dtype} bias+gelu fwd_bwd: triton vs eager (geomean)",
                            _gm(both["speedup_vs_eager"]), 1.05, f" ({len(both)} shapes)"))
        for pass_name in ("fwd", "fwd_bwd"):
            part = _ok(rows, dtype=dtype, **{"pass": pass_name})
            if not part.empty:
                tables.append((f"linear {dtype} {pass_name}: speedup_vs_eager by mode",
                               _mode_table(part, "speedup_vs_eager")))
    return Report(checks, tables)


def _row_length(frame: pd.DataFrame) -> pd.Series:
    return frame["shape"].map(lambda shape: shape["n"])


def load_paired(paths: list[Path]) -> list[dict]:
    """The records of experiments.paired --jsonl files (one JSON object a line). A missing file
    (the paired run did not run, e.g. `make bench` without a GPU) is said on stderr and reads as no
    records, so its targets read n/a."""
    records = []
    for path in paths:
        if not path.exists():
            print(f"warning: no paired records: {path} does not exist", file=sys.stderr)
            continue
        for line in path.read_text().splitlines():
            if line.strip():
                records.append(json.loads(line))
    return records


def paired_check(paired: list[dict], dtype: str, gpus: list[str]) -> Check:
    """softmax's "vs best compile mode" from paired records (load_paired) of this dtype on the
    sweep's GPU: the worst N's median ratio over its rounds (n/a where there are none)."""
    mine = paired_records(paired, gpus, metric="gpu_time", kernel="softmax", dtype=dtype)
    target = f"softmax {dtype} fwd: triton vs best compile mode, paired, every N"
    if not mine:
        return Check(target, None, 1.0, f" (no paired records of {', '.join(gpus) or '?'})")
    worst = min(mine, key=lambda r: r["median_ratio"])
    detail = (f" at N={worst['n']} (median {worst['median_ratio']:.4f}, rounds "
              f"{min(worst['ratios']):.4f}-{max(worst['ratios']):.4f}; {len(mine)} shapes)")
    return Check(target, worst["median_ratio"], 1.0, detail)


def softmax_report(frame: pd.DataFrame, paired: list[dict] | None = None) -> Report:
    """softmax's targets; with paired records (load_paired) also the paired "vs best compile
    mode" check, per dtype."""
    checks, tables = [], []
    rows = _ok(frame, kernel="softmax", shape_set="rows")
    for dtype in _dtypes(rows):
        fwd = _ok(rows, dtype=dtype, **{"pass": "fwd"})
        triton = fwd[fwd["mode"] == "triton"].set_index("shape_label")
        worst, where = _worst(triton.reset_index(), "pct_peak_bw")
        checks.append(Check(f"softmax {dtype} fwd: triton % of copy bandwidth, every N",
                            worst, 90, where))
        if dtype == "bf16":
            checks.append(Check("softmax bf16 fwd: triton vs eager (geomean over rows)",
                                _gm(triton["speedup_vs_eager"]), 1.3))
        best = vs_best_compile(frame, kernel="softmax", shape_set="rows", dtype=dtype,
                               **{"pass": "fwd"})
        worst_ratio, where = _worst(best.reset_index(), "ratio")
        checks.append(Check(f"softmax {dtype} fwd: triton vs best compile mode, every N",
                            worst_ratio, 1.0, where))
        if paired is not None:
            gpus = sorted(fwd["gpu_name"].dropna().unique())
            checks.append(paired_check(paired, dtype, gpus))
        # The backward alone: the fwd_bwd call's time less the forward's, over y + dy + dx bytes.
        both = _ok(rows, dtype=dtype, mode="triton", **{"pass": "fwd_bwd"})
        both = both.set_index("shape_label")
        bwd_ms = both["time_ms_p50"] - triton["time_ms_p50"].reindex(both.index)
        bwd_bytes = both["min_bytes"] * 3 / 5
        bwd_pct = 100 * (bwd_bytes / (bwd_ms * 1e-3) / 1e9) / both["peak_copy_gbps"]
        table = pd.DataFrame({
            "N": _row_length(triton.reset_index()).values,
            "triton GB/s": triton["gbps"],
            "% of copy": triton["pct_peak_bw"],  # the records hold percent
        }, index=triton.index)
        for mode, speed in _mode_table(fwd, "speedup_vs_eager").items():
            table[f"{mode} x eager"] = speed
        table["bwd % of copy"] = bwd_pct
        worst_bwd = bwd_pct.min() if len(bwd_pct.dropna()) else math.nan
        where = f" at {bwd_pct.idxmin()}" if len(bwd_pct.dropna()) else ""
        checks.append(Check(f"softmax {dtype} bwd (fwd_bwd - fwd time): % of copy, every N",
                            worst_bwd, 85, where))
        tables.append((f"softmax {dtype} rows: forward bandwidth and speedup_vs_eager by mode",
                       table))
    small = _ok(frame, kernel="softmax", shape_set="small", **{"pass": "fwd"})
    for dtype in _dtypes(small):
        part = small[small["dtype"] == dtype]
        table = _mode_table(part, "time_ms_p50").mul(1000).add_suffix(" GPU us")
        latency = _mode_table(part, "call_latency_us_p50").add_suffix(" call us")
        tables.append((f"softmax {dtype} small (launch-bound): GPU time and call latency, us",
                       table.join(latency)))
    return Report(checks, tables)


def _is_1x1(shape: dict) -> bool:
    return shape.get("r") == 1 and shape.get("s") == 1


def conv_report(frame: pd.DataFrame) -> Report:
    checks, tables = [], []
    rows = _ok(frame, kernel="conv", memory_format="nhwc", **{"pass": "fwd"})
    # With bias, eager runs the bias add as a second pass over the output; without it, the
    # comparison is kernel against kernel. Both are reported; the targets read the same thresholds.
    for shape_set in ("resnet50", "resnet50_b128"):
        for fused_ops in ("bias", "none"):
            layers = _ok(rows, shape_set=shape_set, epilogue=fused_ops)
            for dtype in _dtypes(layers):
                part = layers[layers["dtype"] == dtype]
                triton = part[part["mode"] == "triton"]
                tag = f"conv {dtype} {shape_set} {fused_ops}: triton vs eager"
                bf16 = dtype == "bf16"
                checks.append(Check(f"{tag} (geomean)", _gm(triton["speedup_vs_eager"]),
                                    0.90 if bf16 else 0.0, f" ({len(triton)} layers)"))
                ones = triton[triton["shape"].map(_is_1x1)]
                worst, where = _worst(ones, "speedup_vs_eager")
                checks.append(Check(f"{tag}, worst 1x1 layer", worst, 0.95 if bf16 else 0.0,
                                    where))
                if fused_ops == "none" and shape_set == "resnet50" and bf16:
                    # kernel against kernel (bias-free): the training issue's forward bar
                    worst, where = _worst(triton, "speedup_vs_eager")
                    checks.append(Check(f"{tag}, kernel vs kernel (geomean)",
                                        _gm(triton["speedup_vs_eager"]), CONV_FWD_GEOMEAN))
                    checks.append(Check(f"{tag}, kernel vs kernel, every layer", worst,
                                        CONV_FWD_WORST, where))
                tables.append((f"conv {dtype} {shape_set} ({fused_ops}): triton against eager",
                               _paired_table(triton)))
    _conv_training(frame, checks, tables)
    # Depthwise (memory-bound): against eager and the best compile mode, and the rate the
    # minimum bytes (x, w, y once) move at against a copy of the same bytes timed in the same
    # run (the 1 GiB copy's share in the table: out of reach for layers of a few MB)
    for shape_set in ("mobilenet_v2_dw", "convnext_dw"):
        layers = _ok(rows, shape_set=shape_set)
        for dtype in _dtypes(layers):
            part = layers[layers["dtype"] == dtype]
            triton = part[part["mode"] == "triton"]
            tag = f"conv {dtype} {shape_set} (depthwise)"
            checks.append(Check(f"{tag}: triton vs eager (geomean)",
                                _gm(triton["speedup_vs_eager"]), 1.0, f" ({len(triton)} layers)"))
            best = vs_best_compile(frame, kernel="conv", memory_format="nhwc",
                                   shape_set=shape_set, dtype=dtype, **{"pass": "fwd"})  # fmt: skip
            worst, where = _worst(best.reset_index(), "ratio")
            checks.append(Check(f"{tag}: triton vs best compile mode (geomean)", _gm(best["ratio"]),
                                1.0, _worst_note(worst, where)))
            # the bar: a copy of the same bytes, timed in the same run (records that predate it
            # read n/a); the 1 GiB copy's rate is reported beside it, out of reach at a few MB
            worst, where = _worst(triton, "pct_copy_same_bytes")
            checks.append(Check(f"{tag}: triton % of a same-bytes copy, every layer", worst, 80,
                                where))
            table = _mode_table(part, "speedup_vs_eager").add_suffix(" x eager")
            by_layer = triton.set_index("shape_label")
            table["triton % of copy"] = by_layer["pct_peak_bw"]
            table["triton % of same-bytes copy"] = by_layer["pct_copy_same_bytes"]
            tables.append((f"{tag}: speedup_vs_eager by mode, triton bandwidth", table))
    # Grouped 3x3s (ResNeXt-50 32x4d, 32 groups): against eager (cuDNN's grouped kernels), the
    # compile modes beside it in the table
    layers = _ok(rows, shape_set="resnext50")
    for dtype in _dtypes(layers):
        part = layers[layers["dtype"] == dtype]
        triton = part[part["mode"] == "triton"]
        tag = f"conv {dtype} resnext50 (grouped 3x3)"
        worst, where = _worst(triton, "speedup_vs_eager")
        checks.append(Check(f"{tag}: triton vs eager (geomean)", _gm(triton["speedup_vs_eager"]),
                            0.9, f" ({len(triton)} layers){_worst_note(worst, where)}"))
        tables.append((f"{tag}: speedup_vs_eager by mode",
                       _mode_table(part, "speedup_vs_eager")))
    fused = _ok(rows, epilogue="bias+relu")
    for dtype in _dtypes(fused):
        best = vs_best_compile(frame, kernel="conv", memory_format="nhwc", epilogue="bias+relu",
                               dtype=dtype, **{"pass": "fwd"})
        worst, where = _worst(best.reset_index(), "ratio")
        checks.append(Check(f"conv {dtype} bias+relu: triton vs best compile mode (geomean)",
                            _gm(best["ratio"]), 1.0, _worst_note(worst, where)))
        tables.append((f"conv {dtype} bias+relu: speedup_vs_eager by mode",
                       _mode_table(fused[fused["dtype"] == dtype], "speedup_vs_eager")))
    return Report(checks, tables)


# conv training (bias-free, channels_last, ResNet-50 at batch 32, bf16): the forward kernel
# against cuDNN's, and fwd_bwd against eager and the best compile mode
CONV_FWD_GEOMEAN, CONV_FWD_WORST = 0.95, 0.80
CONV_TRAIN_GEOMEAN, CONV_TRAIN_WORST, CONV_TRAIN_VS_COMPILE = 0.90, 0.70, 1.0


def _conv_training(frame, checks, tables) -> None:
    where = dict(kernel="conv", memory_format="nhwc", epilogue="none", **{"pass": "fwd_bwd"})
    rows = _ok(frame, **where)
    for shape_set in ("resnet50", "resnet50_core"):
        layers = _ok(rows, shape_set=shape_set)
        for dtype in _dtypes(layers):
            part = layers[layers["dtype"] == dtype]
            triton = part[part["mode"] == "triton"]
            if triton.empty:
                continue
            tag = f"conv {dtype} {shape_set} fwd_bwd"
            bf16 = dtype == "bf16"
            worst, at = _worst(triton, "speedup_vs_eager")
            checks.append(Check(f"{tag}: triton vs eager (geomean)",
                                _gm(triton["speedup_vs_eager"]),
                                CONV_TRAIN_GEOMEAN if bf16 else 0.0, f" ({len(triton)} layers)"))
            checks.append(Check(f"{tag}: triton vs eager, every layer", worst,
                                CONV_TRAIN_WORST if bf16 else 0.0, at))
            best = vs_best_compile(frame, shape_set=shape_set, dtype=dtype, **where)
            suffix = ""
            if best.empty and shape_set == "resnet50":
                # the compile modes train the core layers only (minutes of compile a layer):
                # the full set's triton rows against them, layer by layer, where both ran
                core = _ok(rows, shape_set="resnet50_core", dtype=dtype,
                           mode=list(COMPILE_MODES))  # fmt: skip
                best = vs_best_compile(pd.concat([triton, core]))
                suffix = " [the resnet50_core layers' compile rows]"
            if not best.empty:
                worst, at = _worst(best.reset_index(), "ratio")
                checks.append(Check(f"{tag}: triton vs best compile mode (geomean){suffix}",
                                    _gm(best["ratio"]), CONV_TRAIN_VS_COMPILE if bf16 else 0.0,
                                    _worst_note(worst, at) + f" ({len(best)} layers)"))
            tables.append((f"{tag}: speedup_vs_eager by mode",
                           _mode_table(part, "speedup_vs_eager")))


# The host path (issue: kernels fast as they are called), for every op and pass: call latency
# (back-to-back calls, one sync) against eager's in the same job, as eager / ours; and for the
# forward, plain triton.testing.do_bench of the public function against the harness's GPU time.
# A fwd_bwd row's do_bench times a training step, whose autograd host path outlasts the GPU time
# at small sizes for eager as much as for ours: its table gives both readings, with no target.
LATENCY_GEOMEAN = 1.0  # ours at most eager's latency, geomean
LATENCY_WORST = 1 / 1.5  # no shape above 1.5x eager's
DO_BENCH_FROM_MS = 0.020  # do_bench within 5% of the GPU time from 20 us of GPU time
DO_BENCH_WITHIN = 1 / 1.05


def host_path_report(frame: pd.DataFrame, kernel: str,
                     paired: list[dict] | None = None) -> Report:  # fmt: skip
    checks, tables = [], []
    rows = _ok(frame, kernel=kernel)
    for dtype in _dtypes(rows):
        for pass_name in dict.fromkeys(rows["pass"]):
            part = _ok(rows, dtype=dtype, mode="triton", **{"pass": pass_name})
            part = part[part["latency_speedup_vs_eager"].notna()]
            if part.empty:
                continue
            tag = f"{kernel} {dtype} {pass_name} call latency, eager / triton"
            checks.append(Check(f"{tag} (geomean)", _gm(part["latency_speedup_vs_eager"]),
                                LATENCY_GEOMEAN, f" ({len(part)} rows)"))
            worst, where = _worst(part, "latency_speedup_vs_eager")
            checks.append(Check(f"{tag}, worst shape (1.5x eager's at most)", worst,
                                LATENCY_WORST, where))
            if pass_name == "fwd":
                long_enough = part["time_ms_p50"] >= DO_BENCH_FROM_MS
                timed = part[long_enough & part["do_bench_ms_p50"].notna()]
                timed = timed.assign(
                    gpu_over_do_bench=timed["time_ms_p50"] / timed["do_bench_ms_p50"])
                worst, where = _worst(timed, "gpu_over_do_bench")
                checks.append(Check(f"{kernel} {dtype} fwd GPU time / plain do_bench, worst "
                                    f"shape from 20 us (do_bench 5% over at most)", worst,
                                    DO_BENCH_WITHIN, where + f" ({len(timed)} rows)"))
            table = part.set_index("shape_label")
            columns = {
                "triton us": table["call_latency_us_p50"],
                "eager us": table["eager_call_latency_us_p50"],
                "eager/triton": table["latency_speedup_vs_eager"],
                "gpu ms": table["time_ms_p50"],
                "do_bench ms": table["do_bench_ms_p50"],
            }
            if "eager_do_bench_ms_p50" in table:  # records from before it was kept lack it
                columns["eager gpu ms"] = table["eager_time_ms_p50"]
                columns["eager do_bench ms"] = table["eager_do_bench_ms_p50"]
            tables.append((f"{kernel} {dtype} {pass_name} host path: call latency (us) and "
                           "plain do_bench (ms)", pd.DataFrame(columns)))
        checks += _compiled_checks(frame, kernel, dtype, paired)
    return Report(checks, tables)


def _compiled_checks(frame: pd.DataFrame, kernel: str, dtype: str,
                     paired: list[dict] | None = None) -> list[Check]:  # fmt: skip
    """triton-compiled: every row ok, and call latency no worse than compile `default`'s: from
    paired records (experiments.paired --metric latency, one process) where the run has them for
    this op, dtype and GPU, each shape's median ratio over its rounds; else from the rows of the
    two modes' separate jobs (shape, pass, epilogue), which a compiled call's process-to-process
    spread makes a weak reading (docs/targets.md)."""
    ours = frame[(frame["kernel"] == kernel) & (frame["dtype"] == dtype)
                 & (frame["mode"] == "triton-compiled") & (frame["activations"] == "inputs")]
    if ours.empty:
        return []
    tag = f"{kernel} {dtype} triton-compiled"
    ok = ours[ours["status"] == "ok"]
    failed = ours[ours["status"] != "ok"]
    note = f" ({len(ok)} of {len(ours)})"
    if not failed.empty:
        note += f"; first not ok: {failed.iloc[0]['shape_label']}: {failed.iloc[0].get('reason')}"
    checks = [Check(f"{tag}: rows ok", len(ok) / len(ours), 1.0, note)]
    mine = paired_records(paired, set(ours["gpu_name"].dropna()), metric="call_latency",
                          ours="triton-compiled", pass_name="fwd", kernel=kernel, dtype=dtype)
    if mine:
        medians = pd.Series([r["median_ratio"] for r in mine])
        worst = min(mine, key=lambda r: r["median_ratio"])
        note = (f"; worst {worst['median_ratio']:.3f} at {worst['shape_label']} (rounds "
                f"{min(worst['ratios']):.3f}-{max(worst['ratios']):.3f}; {len(mine)} shapes)")
        checks.append(Check(f"{tag} call latency: default's / ours, paired (geomean)",
                            _gm(medians), 1.0, note))
        return checks
    default = _ok(frame, kernel=kernel, dtype=dtype, mode="default")
    keys = ["shape_label", "pass", "epilogue"]
    both = ok.merge(default, on=keys, suffixes=("", "_default"))
    ratio = both["call_latency_us_p50_default"] / both["call_latency_us_p50"]
    both = both.assign(ratio=ratio)
    worst, where = _worst(both, "ratio")
    checks.append(Check(f"{tag} call latency: default's / ours (geomean)", _gm(ratio), 1.0,
                        _worst_note(worst, where) + f" ({len(both)} rows)"))
    return checks


# The model-shapes issue's bars: on each shape set recorded from a model (conf/kernel/recorded/,
# `shapes=<model>`), forward and fwd_bwd, ours against eager's GPU time in geomean and on the
# worst shape (16-bit; fp32 rows are reported, not held to them)
MODEL_SHAPES_GEOMEAN = 1.00
MODEL_SHAPES_WORST = 0.95
MODEL_SHAPES_DO_BENCH = 0.95


def model_shapes_report(frame: pd.DataFrame, kernel: str) -> Report:
    """Per recorded model shape set of `kernel`, pass and dtype: triton against eager, its
    geomean and worst shape (MODEL_SHAPES_*), and the per-shape table."""
    checks, tables = [], []
    rows = _ok(frame, kernel=kernel, mode="triton", shape_set=registry.names("model"))
    for (shape_set, pass_name, dtype), part in rows.groupby(["shape_set", "pass", "dtype"]):
        part = part.drop_duplicates("shape_label", keep="last")
        tag = f"{kernel} {dtype} shapes={shape_set} {pass_name}: triton vs eager"
        held = dtype in ("bf16", "fp16")
        worst, where = _worst(part, "speedup_vs_eager")
        checks.append(Check(f"{tag} (geomean)", _gm(part["speedup_vs_eager"]),
                            MODEL_SHAPES_GEOMEAN if held else 0.0, f" ({len(part)} shapes)"))
        checks.append(Check(f"{tag}, worst shape", worst, MODEL_SHAPES_WORST if held else 0.0,
                            where))
        # as a caller sees it: plain do_bench on the public function against the harness's GPU
        # time of the same calls, within 5% (the value is 1 - the largest relative gap), from
        # 20 us (below, do_bench times the host path, as the host-path targets say)
        timed = part.dropna(subset=["do_bench_ms_p50", "time_ms_p50"])
        timed = timed[timed["time_ms_p50"] >= 0.02]
        gap = (timed["do_bench_ms_p50"] / timed["time_ms_p50"] - 1).abs()
        worst_gap, where = _worst(timed.assign(agree=1 - gap), "agree")
        checks.append(Check(f"{kernel} {dtype} shapes={shape_set} {pass_name}: do_bench agrees "
                            "with the harness (1 - largest gap)", worst_gap,
                            MODEL_SHAPES_DO_BENCH if held else 0.0, where))  # fmt: skip
        table = _paired_table(part)
        table["do_bench / GPU time"] = (part["do_bench_ms_p50"] / part["time_ms_p50"]).values
        tables.append((f"{tag}, by shape", table))
    return Report(checks, tables)


BLOCKS = ("mlp", "attention", "bottleneck")  # analysis/composed_targets.py's block_report
REPORTS = {
    "matmul": matmul_report,
    "linear": linear_report,
    "softmax": softmax_report,
    "conv": conv_report,
}


def render(frame: pd.DataFrame, kernels: list[str],
           paired: list[dict] | None = None) -> tuple[str, bool]:  # fmt: skip
    """The tables and the target lines for `kernels`; True when every target passed. paired:
    experiments.paired's records (load_paired), if any: softmax's GPU-time pairing and the
    ops' triton-compiled latency pairing."""
    reports = {**REPORTS, **{name: partial(block_report, kernel=name) for name in BLOCKS}}
    out, all_passed = [], True
    with pd.option_context("display.width", 200, "display.max_columns", 30,
                           "display.float_format", "{:.3f}".format):
        for kernel in kernels:
            if kernel not in reports:  # a registered op whose targets nobody has set yet
                out.append(f"\n{kernel} targets:\n  none  no targets are declared for {kernel}")
                continue
            if kernel == "softmax":
                report = softmax_report(frame, paired)
            elif kernel in BLOCKS:
                report = block_report(frame, kernel, paired)
            else:
                report = reports[kernel](frame)
            peers = peer_report(frame, kernel)
            shapes = model_shapes_report(frame, kernel)
            report = Report(report.checks + peers.checks + shapes.checks,
                            report.tables + peers.tables + shapes.tables)
            for title, table in report.tables:
                if not table.empty:
                    out += [f"\n{title}", table.to_string()]
            out.append(f"\n{kernel} targets:")
            if not report.checks:
                if any(not table.empty for _, table in report.tables):
                    # e.g. a `small`-only softmax run: tables, but no target reads them
                    out.append(f"  none  no {kernel} target reads these rows (tables only)")
                else:
                    out.append(f"  MISS  no {kernel} rows that the targets read")
                    all_passed = False
            for check in report.checks:
                out.append(check.line())
                all_passed &= check.passed
        for kernel in kernels:
            host = host_path_report(frame, kernel, paired)
            for title, table in host.tables:
                out += [f"\n{title}", table.to_string()]
            if host.checks:
                out.append(f"\n{kernel} host-path targets:")
            for check in host.checks:
                out.append(check.line())
                all_passed &= check.passed
    gpus = sorted(frame["gpu_name"].dropna().unique())
    out.insert(0, f"records: {len(frame)} rows; GPU: {', '.join(gpus) or 'unknown'}")
    return "\n".join(out), all_passed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a sweep or results folder")
    parser.add_argument("--kernel", action="append", choices=sorted(registry.OPS),
                        help="which kernel's targets (repeatable; default: those with rows)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    parser.add_argument("--paired", type=Path, action="append", default=None,
                        help="an experiments.paired --jsonl file (repeatable): softmax's paired "
                        "vs-best-compile reading, triton-compiled's paired call latency")
    args = parser.parse_args(argv)
    frame = load_rows(args.results)
    kernels = args.kernel or [k for k in registry.OPS if k in set(frame["kernel"])]
    paired = load_paired(args.paired) if args.paired else None
    text, passed = render(frame, kernels, paired)
    print(text)
    if args.strict and not passed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
