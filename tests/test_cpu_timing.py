"""CPU timings: a pinned thread count, torch.utils.benchmark's blocked_autorange on the thread's
CPU clock, and noisy rows left out of geomeans and figures by default (and counted)."""

import pandas as pd
import torch

from analysis.load import drop_noisy
from analysis.summary import report_text
from experiments import timing
from experiments.run import summarize


def test_cpu_timer_pins_threads_and_uses_blocked_autorange():
    x = torch.randn(64, 64)
    before = torch.get_num_threads()
    result = timing.cpu_time_ms(lambda: x @ x, warmup_ms=1, rep_ms=20, threads=1)
    assert result["threads"] == 1 and result["timer"] == "cpu-thread-time"
    assert result["samples"] >= 1 and result["calls"] >= result["samples"]
    assert 0 < result["p20"] <= result["p50"] <= result["p80"]
    assert torch.get_num_threads() == before  # the Timer restores the job's setting


def _row(noisy, speedup, status="ok"):
    return {"kernel": "conv", "dtype": "bf16", "pass": "fwd", "activations": "inputs",
            "mode": "eager", "shape_label": f"s{speedup}", "status": status, "reason": None,
            "noisy": noisy, "speedup_vs_eager": speedup, "latency_speedup_vs_eager": speedup}


def test_noisy_rows_leave_the_job_geomean_and_are_counted():
    summary = summarize([_row(False, 1.0), _row(True, 16.0), _row(False, 4.0)])
    assert summary["noisy_left_out"] == 1 and summary["ok"] == 3
    assert abs(summary["geomean_speedup_vs_eager"] - 2.0) < 1e-9


def test_noisy_rows_leave_the_summary_table_unless_asked():
    frame = pd.DataFrame([_row(False, 1.0), _row(True, 271.0), _row(None, 1.0, "failed")])
    kept, left_out = drop_noisy(frame)
    assert left_out == 1 and len(kept) == 2
    text = report_text(frame)
    assert "1 noisy rows left out" in text and "271" not in text.split("rows not ok")[0]
    assert "noisy rows left out" not in report_text(frame, include_noisy=True)
