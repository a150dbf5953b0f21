"""analysis.targets reads the speed targets off records: ratios, worst shapes, derived rates."""

import json
import math
import os

import pytest
from omegaconf import OmegaConf

from analysis.load import epilogue, records_frame
from analysis.targets import (
    conv_report,
    load_paired,
    main,
    matmul_report,
    model_shapes_report,
    paired_check,
    render,
    softmax_report,
    vs_best_compile,
)
from experiments.records import Record
from tests.conftest import CONF_DIR


def row(kernel, mode, label, **fields):
    base = {
        "kernel": kernel, "mode": mode, "shape_label": label, "shape": fields.pop("shape", {}),
        "shape_set": "default", "dtype": "bf16", "pass": "fwd", "status": "ok",
        "static_inputs": [], "gpu_name": "TestGPU", "noisy": False,
    }
    return {**base, **fields}


def square_llm(speedups: dict, tflops_8192=760.0):
    rows = []
    for label, speedup in speedups.items():
        tflops = tflops_8192 if label == "8192x8192x8192" else 100.0
        rows.append(row("matmul", "triton", label, shape_set="square", speedup_vs_eager=speedup,
                        tflops=tflops, flops=2e12, eager_time_ms_p50=10.0))
    return records_frame(rows)


def test_matmul_targets_name_the_geomean_the_worst_shape_and_the_big_rate():
    frame = square_llm({"1024x1024x1024": 1.2, "8192x8192x8192": 1.05, "16x4096x4096": 0.8})
    checks = {c.target: c for c in matmul_report(frame).checks}
    geo = checks["matmul bf16 triton vs eager, geomean over square+llm"]
    assert geo.value == pytest.approx((1.2 * 1.05 * 0.8) ** (1 / 3)) and geo.passed
    worst = checks["matmul bf16 triton vs eager, worst shape"]
    assert worst.value == pytest.approx(0.8) and not worst.passed and "16x4096x4096" in worst.detail
    assert checks["matmul bf16 8192^3 TFLOP/s"].passed


def test_failed_and_static_rows_do_not_count():
    frame = records_frame([
        row("matmul", "triton", "a", shape_set="square", speedup_vs_eager=2.0),
        row("matmul", "triton", "b", shape_set="square", speedup_vs_eager=0.1, status="failed"),
        row("matmul", "triton", "c", shape_set="square", speedup_vs_eager=0.1,
            static_inputs=["a", "b"]),
    ])
    checks = {c.target: c for c in matmul_report(frame).checks}
    assert checks["matmul bf16 triton vs eager, worst shape"].value == pytest.approx(2.0)


def test_vs_best_compile_divides_by_the_fastest_compile_mode_per_shape():
    frame = records_frame([
        row("linear", "triton", "s1", speedup_vs_eager=1.2),
        row("linear", "default", "s1", speedup_vs_eager=1.0),
        row("linear", "max-autotune-no-cudagraphs", "s1", speedup_vs_eager=1.5),
        row("linear", "triton", "s2", speedup_vs_eager=0.9),
        row("linear", "default", "s2", speedup_vs_eager=0.6),
        row("linear", "eager", "s2", speedup_vs_eager=3.0),  # eager is no compile mode
    ])
    table = vs_best_compile(frame, kernel="linear")
    assert table.loc["s1", "ratio"] == pytest.approx(0.8)
    assert table.loc["s1", "best_mode"] == "max-autotune-no-cudagraphs"
    assert table.loc["s2", "ratio"] == pytest.approx(1.5)


def test_softmax_backward_rate_is_derived_from_fwd_bwd_less_fwd():
    gb = 1e9
    common = {"shape_set": "rows", "shape": {"m": 8, "n": 128}, "peak_copy_gbps": 1000.0}
    frame = records_frame([
        row("softmax", "triton", "8x128", time_ms_p50=1.0, gbps=900.0, pct_peak_bw=90.0,
            speedup_vs_eager=1.4, min_bytes=2 * gb, **common),
        row("softmax", "default", "8x128", time_ms_p50=1.1, speedup_vs_eager=1.3, **common),
        row("softmax", "triton", "8x128", time_ms_p50=2.5, min_bytes=5 * gb,
            **{"pass": "fwd_bwd"}, **common),
    ])
    checks = {c.target: c for c in softmax_report(frame).checks}
    # backward: 3 GB (y, dy, dx) in 1.5 ms = 2000 GB/s, twice the measured copy rate
    assert checks["softmax bf16 bwd (fwd_bwd - fwd time): % of copy, every N"].value == \
        pytest.approx(200.0)
    assert checks["softmax bf16 fwd: triton % of copy bandwidth, every N"].passed  # 90 >= 90
    assert checks["softmax bf16 fwd: triton vs best compile mode, every N"].value == \
        pytest.approx(1.4 / 1.3)


PAIRED = "softmax bf16 fwd: triton vs best compile mode, paired, every N"


def paired_record(n, ratios, dtype="bf16", gpu="TestGPU"):
    return {"kernel": "softmax", "pass": "fwd", "dtype": dtype, "m": 8,
            "n": n, "rounds": len(ratios), "ratios": ratios,
            "median_ratio": sorted(ratios)[len(ratios) // 2], "gpu_name": gpu}  # fmt: skip


def test_softmax_paired_reading_is_the_worst_median_on_the_sweeps_gpu(tmp_path):
    """--paired (experiments.paired --jsonl records): per dtype, the worst N's median ratio over
    its rounds, from records of the sweep's own GPU only; n/a (a miss) where there are none;
    no paired line without --paired."""
    frame = records_frame([
        row("softmax", "triton", "8x128", shape={"m": 8, "n": 128}, shape_set="rows",
            pct_peak_bw=95.0, peak_copy_gbps=3000.0, speedup_vs_eager=1.0, time_ms_p50=1.0),
    ])  # fmt: skip
    paired = [
        paired_record(128, [1.001, 1.003, 1.002]),
        paired_record(4096, [0.999, 0.997, 0.998]),
        paired_record(512, [0.9, 0.9, 0.9], gpu="OtherGPU"),  # another GPU's run
        paired_record(128, [0.5, 0.5, 0.5], dtype="fp32"),
        # triton-compiled's latency pairing (--metric latency) is the host-path target's
        {**paired_record(1024, [0.5, 0.5, 0.5]), "metric": "call_latency"},
    ]
    path = tmp_path / "paired.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in paired) + "\n")
    assert load_paired([path]) == paired
    assert load_paired([tmp_path / "missing.jsonl", path]) == paired  # warned, read as none
    checks = {c.target: c for c in softmax_report(frame, paired).checks}
    check = checks[PAIRED]
    assert check.value == pytest.approx(0.998) and not check.passed
    assert "N=4096" in check.detail and "median 0.9980, rounds 0.9970-0.9990" in check.detail
    assert not any("paired" in c.target for c in softmax_report(frame).checks)
    none = paired_check(paired, "bf16", ["NoSuchGPU"])
    assert none.value is None and not none.passed and "NoSuchGPU" in none.detail
    win = paired_check([paired_record(128, [1.001, 1.002, 1.003])], "bf16", ["TestGPU"])
    assert win.passed


def test_no_rows_is_a_miss_and_strict_exits_1(tmp_path, capsys):
    frame = square_llm({"1024x1024x1024": 1.2})
    text, passed = render(frame, ["conv"])
    assert "MISS" in text and not passed
    text, _ = render(frame, ["matmul"])
    assert "n/a" in text  # no 8192^3 row
    record = Record(kernel="matmul", mode="triton", shape={"m": 8, "n": 8, "k": 8},
                    shape_label="8x8x8", shape_set="square", dtype="bf16", pass_="fwd", tf32=False,
                    device="cuda", static_inputs=[], run_name="r", job_id="j",
                    time_ms_p50=0.01, max_rel_err=1e-3, speedup_vs_eager=1.3)
    (tmp_path / "results.jsonl").write_text(json.dumps(record.to_json()) + "\n")
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path), "--kernel", "matmul", "--strict"])
    assert exc.value.code == 1
    out = capsys.readouterr().out
    assert "PASS  matmul bf16 triton vs eager, geomean over square+llm: 1.300" in out
    assert "MISS  matmul bf16 8192^3 TFLOP/s: n/a" in out


def test_epilogue_names_what_a_job_fused():
    assert epilogue({"bias": True, "activation": "gelu"}) == "bias+gelu"
    assert epilogue({"bias": False, "activation": "relu"}) == "relu"
    assert epilogue({"bias": False, "activation": "none"}) == "none"
    assert math.isnan(epilogue({"name": "matmul"}))


@pytest.mark.slow
@pytest.mark.integration
def test_make_bench_runs_the_grid_and_prints_the_targets(tmp_path):
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    def make(*args):
        return subprocess.run(["make", "bench", f"PY={sys.executable}", *args], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "TRITON_INTERPRET": "1"})

    result = make()
    assert result.returncode == 2 and "make bench needs kernel=" in result.stderr
    result = make("kernel=matmul", f"BENCH_DIR={tmp_path}",
                  "ARGS=shapes=cpu dtype=fp32 bench=quick wandb.mode=disabled")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "bench matmul [1]: kernel=matmul mode=triton" in result.stdout
    assert "matmul targets:" in (tmp_path / "targets.txt").read_text()
    cpu_set = OmegaConf.load(CONF_DIR / "kernel" / "matmul.yaml").shape_sets.cpu
    assert len((tmp_path / "1" / "sweep_results.jsonl").read_text().splitlines()) == len(cpu_set)


def test_conv_targets_keep_conv_with_bias_apart_from_conv_alone():
    one, three = {"r": 1, "s": 1}, {"r": 3, "s": 3}
    common = {"shape_set": "resnet50", "memory_format": "nhwc"}
    frame = records_frame([
        row("conv", "triton", "a", shape=one, epilogue="bias", speedup_vs_eager=1.5, **common),
        row("conv", "triton", "b", shape=three, epilogue="bias", speedup_vs_eager=1.2, **common),
        row("conv", "triton", "a", shape=one, epilogue="none", speedup_vs_eager=0.8, **common),
        row("conv", "triton", "b", shape=three, epilogue="none", speedup_vs_eager=1.0, **common),
        row("conv", "triton", "a", shape=one, epilogue="bias", speedup_vs_eager=0.1,
            **{**common, "memory_format": "nchw"}),
    ])
    checks = {c.target: c for c in conv_report(frame).checks}
    assert checks["conv bf16 resnet50 bias: triton vs eager (geomean)"].value == \
        pytest.approx((1.5 * 1.2) ** 0.5)
    assert checks["conv bf16 resnet50 bias: triton vs eager, worst 1x1 layer"].value == 1.5
    alone = checks["conv bf16 resnet50 none: triton vs eager, worst 1x1 layer"]
    assert alone.value == 0.8 and not alone.passed


def test_rows_with_tables_but_no_target_are_not_a_miss():
    """A `small`-only softmax run prints its latency table; no target reads it, which is not a
    miss (a run with no rows at all still is: test_no_rows_is_a_miss_and_strict_exits_1)."""
    common = {"shape_set": "small", "shape": {"m": 64, "n": 128}}
    frame = records_frame([
        row("softmax", mode, "64x128", time_ms_p50=t, call_latency_us_p50=c, **common)
        for mode, t, c in (("eager", 0.0056, 14.0), ("triton", 0.0049, 60.0))
    ])
    text, passed = render(frame, ["softmax"])
    assert "small (launch-bound)" in text and "60.000" in text
    assert "none  no softmax target reads these rows" in text and "MISS" not in text
    assert passed


def test_softmax_bandwidth_target_reads_percent_as_the_records_store_it():
    common = {"shape_set": "rows", "peak_copy_gbps": 3000.0, "speedup_vs_eager": 1.0}
    frame = records_frame([
        row("softmax", "triton", "8x128", shape={"m": 8, "n": 128}, pct_peak_bw=95.0, **common),
        row("softmax", "triton", "2x512", shape={"m": 2, "n": 512}, pct_peak_bw=51.6, **common),
    ])
    check = {c.target: c for c in softmax_report(frame).checks}[
        "softmax bf16 fwd: triton % of copy bandwidth, every N"]
    assert check.value == pytest.approx(51.6) and not check.passed and "2x512" in check.detail


def test_host_path_targets_read_latency_do_bench_and_triton_compiled():
    from analysis.targets import host_path_report

    def lat(mode, label, ours_us, eager_us, gpu_ms=None, do_bench_ms=None, **fields):
        return row("linear", mode, label, call_latency_us_p50=ours_us,
                   eager_call_latency_us_p50=eager_us, latency_speedup_vs_eager=eager_us / ours_us,
                   time_ms_p50=gpu_ms, do_bench_ms_p50=do_bench_ms, **fields)

    frame = records_frame([
        lat("triton", "small", 12.0, 10.0, 0.005, 0.012),  # launch-bound: do_bench not judged
        lat("triton", "big", 100.0, 120.0, 0.100, 0.104),
        lat("triton", "mid", 40.0, 50.0, 0.030, 0.036),  # do_bench 20% over the GPU time
        lat("triton-compiled", "small", 20.0, 10.0),
        lat("triton-compiled", "big", 100.0, 120.0),
        lat("triton-compiled", "mid", 50.0, 50.0, status="failed", reason="ValueError: boom"),
        lat("default", "small", 25.0, 10.0),
        lat("default", "big", 90.0, 120.0),
        # a training step whose host path outlasts its GPU time, eager's too: a table, no target
        lat("triton", "big", 300.0, 310.0, 0.060, 0.290, eager_do_bench_ms_p50=0.300,
            eager_time_ms_p50=0.070, **{"pass": "fwd_bwd"}),
    ])
    report = host_path_report(frame, "linear")
    checks = {c.target: c for c in report.checks}
    assert "linear bf16 fwd_bwd call latency, eager / triton (geomean)" in checks
    assert not any("fwd_bwd GPU time / plain do_bench" in target for target in checks)
    training = dict(report.tables)["linear bf16 fwd_bwd host path: call latency (us) and plain "
                                   "do_bench (ms)"]
    assert training.loc["big", "eager do_bench ms"] == pytest.approx(0.300)
    assert training.loc["big", "do_bench ms"] == pytest.approx(0.290)
    geo = checks["linear bf16 fwd call latency, eager / triton (geomean)"]
    assert geo.value == pytest.approx((10 / 12 * 1.2 * 1.25) ** (1 / 3)) and geo.passed
    worst = checks["linear bf16 fwd call latency, eager / triton, worst shape "
                   "(1.5x eager's at most)"]
    assert worst.value == pytest.approx(10 / 12) and worst.passed and "small" in worst.detail
    do_bench = checks["linear bf16 fwd GPU time / plain do_bench, worst shape from 20 us "
                      "(do_bench 5% over at most)"]
    assert do_bench.value == pytest.approx(0.030 / 0.036) and not do_bench.passed
    assert "mid" in do_bench.detail and "(2 rows)" in do_bench.detail
    ok = checks["linear bf16 triton-compiled: rows ok"]
    assert ok.value == pytest.approx(2 / 3) and not ok.passed and "ValueError: boom" in ok.detail
    vs_default = checks["linear bf16 triton-compiled call latency: default's / ours (geomean)"]
    assert vs_default.value == pytest.approx((25 / 20 * 90 / 100) ** 0.5)
    assert "worst 0.900 at big" in vs_default.detail

    # experiments.paired --metric latency records of this op, dtype and GPU replace the reading
    # of the separate jobs; softmax's GPU-time pairing, another GPU's and another op's do not
    def pairing(label, ratios, **fields):
        return {"kernel": "linear", "dtype": "bf16", "shape_label": label, "ratios": ratios,
                "median_ratio": sorted(ratios)[len(ratios) // 2], "gpu_name": "TestGPU",
                "metric": "call_latency", **fields}  # fmt: skip

    paired = [pairing("small", [1.1, 1.2, 1.0]), pairing("big", [0.9, 0.95, 0.8]),
              pairing("big", [0.1], gpu_name="OtherGPU"), pairing("big", [0.1], kernel="conv"),
              pairing("big", [0.1], metric="gpu_time"), pairing("big", [0.1], dtype="fp16")]
    checks = {c.target: c for c in host_path_report(frame, "linear", paired).checks}
    assert "linear bf16 triton-compiled call latency: default's / ours (geomean)" not in checks
    vs_default = checks["linear bf16 triton-compiled call latency: default's / ours, paired "
                        "(geomean)"]
    assert vs_default.value == pytest.approx((1.1 * 0.9) ** 0.5) and not vs_default.passed
    assert "worst 0.900 at big (rounds 0.800-0.950; 2 shapes)" in vs_default.detail
    assert checks["linear bf16 triton-compiled: rows ok"].value == pytest.approx(2 / 3)


def test_depthwise_targets_read_eager_compile_and_bandwidth():
    from analysis.targets import conv_report

    def dw(mode, label, speedup, pct=None, shape_set="mobilenet_v2_dw"):
        same = None if pct is None else pct + 10  # a layer's own-size copy is slower than 1 GiB's
        return row("conv", mode, label, shape_set=shape_set, memory_format="nhwc",
                   speedup_vs_eager=speedup, pct_peak_bw=pct, pct_copy_same_bytes=same,
                   shape={"n": 32, "c": 144, "h": 56, "w": 56, "k": 144, "r": 3, "s": 3})

    frame = records_frame([
        dw("triton", "a", 1.4, 85.0), dw("triton", "b", 1.1, 68.0),
        dw("default", "a", 1.2), dw("default", "b", 1.2),
        dw("max-autotune-no-cudagraphs", "a", 1.3), dw("max-autotune-no-cudagraphs", "b", 1.0),
    ])
    checks = {c.target: c for c in conv_report(frame).checks}
    tag = "conv bf16 mobilenet_v2_dw (depthwise)"
    assert checks[f"{tag}: triton vs eager (geomean)"].value == pytest.approx((1.4 * 1.1) ** 0.5)
    best = checks[f"{tag}: triton vs best compile mode (geomean)"]
    assert best.value == pytest.approx((1.4 / 1.3 * 1.1 / 1.2) ** 0.5)
    bandwidth = checks[f"{tag}: triton % of a same-bytes copy, every layer"]
    assert bandwidth.value == pytest.approx(78.0) and not bandwidth.passed
    assert "at b" in bandwidth.detail
    assert not any("convnext_dw" in target for target in checks)  # no rows, no checks
    # records from before the same-bytes copy: the bar reads n/a, never a pass
    old = records_frame([dw("triton", "a", 1.4, 85.0) | {"pct_copy_same_bytes": None}])
    check = {c.target: c for c in conv_report(old).checks}[
        f"{tag}: triton % of a same-bytes copy, every layer"]
    assert math.isnan(check.value) and not check.passed and "n/a" in check.line()


def test_batched_matmul_target_reads_the_attention_set():
    frame = records_frame([
        row("matmul", "triton", label, shape_set="attention", speedup_vs_eager=speedup,
            tflops=100.0, flops=2e12, eager_time_ms_p50=1.0)
        for label, speedup in (("32x(1024x1024x128)", 0.97), ("8x(8192x128x8192)", 0.91))
    ])
    checks = {c.target: c for c in matmul_report(frame).checks}
    check = checks["matmul bf16 attention (batched): triton vs eager (geomean)"]
    assert check.value == pytest.approx((0.97 * 0.91) ** 0.5) and not check.passed
    assert "worst 0.910 at 8x(8192x128x8192)" in check.detail


@pytest.mark.slow
def test_paired_latency_times_ours_and_the_compile_modes_in_one_process():
    """experiments.paired --metric latency: ours and the compile modes built in one process and
    checked as a row is (output and gradients against float64), then their call latencies taken
    round by round; the record's ratio is the best compile mode's / ours. (On the CPU: the
    interpreter's opaque custom ops and Inductor's CPU backend, so the figures are no speed
    reading.)"""
    import statistics

    import torch

    from experiments.paired import main, run_latency_shape
    from experiments.registry import make_workload
    from experiments.workloads import resolve_shapes

    kernel_cfg = OmegaConf.load(CONF_DIR / "kernel" / "softmax.yaml")
    workload = make_workload(kernel_cfg)
    _, shapes = resolve_shapes(workload, kernel_cfg, "cpu", on_gpu=False)
    cpu = torch.device("cpu")
    line, record = run_latency_shape(workload, shapes[0], "fp32", 2, device=cpu)
    assert record is not None, line
    assert record["metric"] == "call_latency" and record["rounds"] == 2
    assert record["ours"] == "triton-compiled" and record["pass"] == "fwd"
    latency = record["latency_us_p50"]
    assert list(latency) == ["triton-compiled", "default"] and min(latency.values()) > 0
    assert len(record["ratios"]) == 2 and min(record["ratios"]) > 0
    assert record["median_ratio"] == statistics.median(record["ratios"])
    assert 10 <= min(record["calls_per_sample"].values()) <= 200
    # a training step of the kernels called directly (a block's latency target)
    line, record = run_latency_shape(workload, shapes[0], "fp32", 1, "triton", ("default",),
                                     "fwd_bwd", device=cpu)  # fmt: skip
    assert record is not None, line
    assert record["pass"] == "fwd_bwd" and list(record["latency_us_p50"]) == ["triton", "default"]
    for bad in (["--metric", "cycles"], ["--dtypes", "bf16,fp8"], ["--shapes", "nosuchset"],
                ["--only-n", "x"], ["--only-n", "7"], ["--rounds", "0"], ["--ours", "triton"],
                ["--metric", "latency", "--compile-modes", "default,fastest"]):
        with pytest.raises(SystemExit) as exc:  # one clear line, before any work
            main(["--kernel", "softmax", *bad])
        assert exc.value.code == 2, bad


def test_block_latency_reads_the_paired_records_where_a_run_has_them():
    from analysis.composed_targets import block_report

    def lat(mode, label, us, **fields):
        return row("mlp", mode, label, call_latency_us_p50=us, speedup_vs_eager=1.0, **fields)

    frame = records_frame([lat("triton", "a", 100.0), lat("default", "a", 50.0),
                           lat("triton", "b", 100.0), lat("default", "b", 200.0)])
    name = "mlp bf16 fwd: call latency, best compile mode's / triton's"
    separate = {c.target: c for c in block_report(frame, "mlp").checks}[f"{name} (geomean)"]
    assert separate.value == pytest.approx(1.0)

    def pairing(label, ratios, **fields):
        return {"kernel": "mlp", "dtype": "bf16", "pass": "fwd", "shape_label": label,
                "ratios": ratios, "median_ratio": sorted(ratios)[len(ratios) // 2],
                "gpu_name": "TestGPU", "metric": "call_latency", "ours": "triton",
                "compile_modes": ["default", "max-autotune-no-cudagraphs"], **fields}  # fmt: skip

    paired = [pairing("a", [1.2, 1.1, 1.3]), pairing("b", [1.0, 0.9, 1.05]),
              pairing("b", [0.1], ours="triton-compiled"), pairing("b", [0.1], dtype="fp16"),
              pairing("b", [0.1], **{"pass": "fwd_bwd"}), pairing("b", [0.1], gpu_name="Other")]
    checks = {c.target: c for c in block_report(frame, "mlp", paired).checks}
    assert f"{name} (geomean)" not in checks
    check = checks[f"{name}, paired (geomean)"]
    assert check.value == pytest.approx((1.2 * 1.0) ** 0.5) and check.passed
    assert "worst 1.000 at b (default, max-autotune-no-cudagraphs; 2 shapes)" in check.detail


def test_bench_grids_runs_only_the_numbered_grids(tmp_path, monkeypatch, capsys):
    """`make bench kernel=conv ARGS="--grids 6,7"`: those grids alone, each into its own
    number's folder, no paired runs unless named; a bad list is one line and exit 2, before
    any run."""
    import subprocess

    from experiments import bench, registry

    commands = []

    class Done:
        returncode, stdout = 0, "conv targets:\n"

    monkeypatch.setattr(subprocess, "run", lambda command, **kw: commands.append(command) or Done)
    grids = registry.OPS["conv"].bench
    assert bench.main(["conv", "--dir", str(tmp_path), "--grids", "6,7", "dtype=bf16"]) == 0
    runs = [c for c in commands if "experiments.run" in c]
    assert [c[-2] for c in runs] == [f"hydra.sweep.dir={tmp_path}/{i}" for i in (6, 7)]
    assert all(c[-1] == "dtype=bf16" for c in runs)
    assert "pass=fwd_bwd" in " ".join(runs[0]) and grids[5].split()[0] in runs[0]
    assert not [c for c in commands if "experiments.paired" in c]
    last = len(grids)
    for bad in ("0", str(last + 1), "6,x", ""):
        commands.clear()
        assert bench.main(["conv", "--grids", bad]) == 2
        assert not commands and f"--grids takes grid numbers 1-{last}" in capsys.readouterr().err


def test_conv_training_full_set_reads_the_core_sets_compile_rows():
    """fwd_bwd: the resnet50 triton rows against the compile modes' resnet50_core rows, layer by
    layer where both ran; a layer only one set has does not count."""

    def train(mode, label, speedup, shape_set):
        return row("conv", mode, label, shape_set=shape_set, memory_format="nhwc",
                   epilogue="none", speedup_vs_eager=speedup, **{"pass": "fwd_bwd"})

    frame = records_frame([
        train("triton", "a", 0.9, "resnet50"), train("triton", "b", 0.6, "resnet50"),
        train("triton", "c", 1.2, "resnet50"),
        train("default", "a", 1.0, "resnet50_core"), train("default", "b", 1.0, "resnet50_core"),
        train("max-autotune-no-cudagraphs", "b", 1.2, "resnet50_core"),
    ])
    checks = {c.target: c for c in conv_report(frame).checks}
    tag = "conv bf16 resnet50 fwd_bwd"
    assert checks[f"{tag}: triton vs eager (geomean)"].value == pytest.approx(
        (0.9 * 0.6 * 1.2) ** (1 / 3))
    best = checks[f"{tag}: triton vs best compile mode (geomean) "
                  "[the resnet50_core layers' compile rows]"]
    assert best.value == pytest.approx((0.9 / 1.0 * 0.6 / 1.2) ** 0.5)
    assert not best.passed and "at b" in best.detail and "(2 layers)" in best.detail


def test_model_shape_sets_read_each_models_set_and_pass_apart():
    """Per recorded model set and pass: the geomean of triton against eager and the worst shape
    (named), a rerun's row of a shape replacing the first; other sets and modes do not count."""
    def linear(label, speedup, shape_set="convnext_tiny", pass_name="fwd", mode="triton"):
        return row("linear", mode, label, shape_set=shape_set, speedup_vs_eager=speedup,
                   flops=1e9, tflops=100.0, eager_time_ms_p50=0.01,
                   time_ms_p50=0.010 if label == "32x1000x768" else 0.10,
                   do_bench_ms_p50=0.104 if label == "6272x1536x384" else 0.101,
                   **{"pass": pass_name})

    frame = records_frame([
        linear("1568x768x3072", 0.80), linear("1568x768x3072", 0.97),  # rerun: the last counts
        linear("32x1000x768", 1.0, shape_set="llama"),  # under 20 us: not in the do_bench check
        linear("6272x1536x384", 1.10), linear("6272x1536x384", 0.5, mode="default"),
        linear("6272x1536x384", 0.90, pass_name="fwd_bwd"),
        linear("4096x2048x2048", 1.02, shape_set="llama"),
        linear("16x4096x4096", 0.1, shape_set="default"),
    ])
    checks = {c.target: c for c in model_shapes_report(frame, "linear").checks}
    tag = "linear bf16 shapes=convnext_tiny fwd: triton vs eager"
    assert checks[f"{tag} (geomean)"].value == pytest.approx((0.97 * 1.10) ** 0.5)
    assert checks[f"{tag} (geomean)"].passed and checks[f"{tag}, worst shape"].passed
    assert "1568x768x3072" in checks[f"{tag}, worst shape"].detail
    bwd = checks["linear bf16 shapes=convnext_tiny fwd_bwd: triton vs eager, worst shape"]
    assert bwd.value == pytest.approx(0.90) and not bwd.passed
    assert checks["linear bf16 shapes=llama fwd: triton vs eager (geomean)"].passed
    llama = checks["linear bf16 shapes=llama fwd: do_bench agrees with the harness (1 - largest "
                   "gap)"]
    assert llama.value == pytest.approx(0.99) and "4096x2048x2048" in llama.detail
    agree = checks["linear bf16 shapes=convnext_tiny fwd: do_bench agrees with the harness "
                   "(1 - largest gap)"]
    assert agree.value == pytest.approx(0.96) and agree.passed and "6272x1536x384" in agree.detail
    assert not any("default" in name for name in checks) and len(checks) == 9
