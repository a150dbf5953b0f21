"""On a CUDA machine: every timer, the custom ops under torch.compile, and env stamping."""

import pytest
import torch
from omegaconf import OmegaConf

from experiments import run
from experiments.records import validate
from experiments.registry import OPS, names
from tests.conftest import CONF_DIR

pytestmark = pytest.mark.gpu


def _small(overrides) -> str:
    """The job's launch-bound shapes: the op's `small` set, a block's `cpu` set (blocks have no
    small set; the CPU's shapes are small on a GPU too)."""
    kernel = next(o.split("=", 1)[1] for o in overrides if o.startswith("kernel="))
    sets = OmegaConf.load(CONF_DIR / "kernel" / f"{kernel}.yaml").shape_sets
    return "shapes=small" if "small" in sets else "shapes=cpu"


def run_job(compose_job, *overrides):
    cfg = compose_job(["bench=quick", "wandb.mode=disabled", _small(overrides), *overrides])
    rows = run.run(cfg)
    assert rows and all(validate(r) == [] for r in rows)
    assert all(r["status"] == "ok" for r in rows), [r["reason"] for r in rows]
    return rows


@pytest.mark.parametrize("kernel", names("op", "block"))  # models: test_models.py
def test_triton_compiled_has_no_graph_break(compose_job, kernel):
    rows = run_job(compose_job, f"kernel={kernel}", "mode=triton-compiled")
    assert all(r["graph_breaks"] == 0 for r in rows)


@pytest.mark.parametrize("kernel", [n for n in names("op", "block") if "fwd_bwd" in OPS[n].passes])
def test_triton_compiled_fwd_bwd(compose_job, kernel):
    run_job(compose_job, f"kernel={kernel}", "mode=triton-compiled", "pass=fwd_bwd")


def test_cuda_graph_mode_records_every_timer(compose_job):
    rows = run_job(compose_job, "kernel=matmul", "mode=reduce-overhead")
    for row in rows:
        assert row["timer"] == "cuda-events-l2flush"
        assert row["do_bench_ms_p50"] > 0 and row["call_latency_us_p50"] > 0
        assert row["eager_do_bench_ms_p50"] > 0
        assert row["cudagraph_ms"] is None  # already a CUDA graph
        assert row["eager_cudagraph_ms"] > 0
        assert row["peak_mem_mb"] is not None and row["pct_peak_flops"] > 0
        assert row["recompiles_during_timing"] == 0


def test_static_inputs_are_recorded(compose_job):
    rows = run_job(compose_job, "kernel=linear", "mode=reduce-overhead", "bench.static_inputs=true")
    assert all(r["static_inputs"] == ["weight", "bias", "x"] for r in rows)


def test_env_is_stamped_with_the_gpu(compose_job):
    run_job(compose_job, "kernel=softmax", "mode=eager")
    import json

    env = json.loads((run.job_identity()[0] / "env.json").read_text())
    assert env["gpu_name"] == torch.cuda.get_device_name()
    assert env["sm_count"] > 0 and env["cuda"] and env["peaks"]["copy_gbps"] > 0
    assert "sm_clock_mhz" in env["gpu_state_before"] or "nvml" in env["gpu_state_before"]


def test_a_real_illegal_address_costs_one_row(tmp_path):
    """A Triton kernel writes out of bounds at shape 0; the isolated job still measures the rest."""
    import subprocess
    import sys

    from experiments.records import read_jsonl
    from tests.conftest import REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-m", "experiments.run", "kernel=softmax", "mode=eager", "shapes=small",
         "bench=quick", "wandb.mode=disabled", "fault.kind=illegal_address", "fault.shape=0",
         "isolate=true", f"hydra.run.dir={tmp_path}"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_jsonl(tmp_path / "results.jsonl")
    assert rows[0]["status"] == "failed" and "illegal memory access" in rows[0]["reason"]
    assert [r["status"] for r in rows[1:]] == ["ok"] * (len(rows) - 1) and len(rows) == 3


def test_gpu_timer_raises_a_lead_the_cpu_path_outlasts():
    """A call whose CPU path (2 ms) outlasts a 10 us lead: the timer retakes its samples with a
    longer lead, so the idle GPU is not charged as the tiny kernel's time."""
    import time

    from experiments.timing import GpuTimer

    x = torch.randn(1024, device="cuda")

    def slow_host_call():
        time.sleep(0.002)
        x.mul_(1.0)

    result = GpuTimer(torch.device("cuda"), flush_l2=False).measure(
        slow_host_call, warmup_ms=1, rep_ms=20, lead_us=10
    )
    assert result["lead_retries"] >= 1
    assert result["lead_us"] > 2000
    assert result["p50"] < 1.0  # without the retake every sample would read about 2 ms
