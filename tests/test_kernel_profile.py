"""scripts/kernel_profile.py: bad arguments and a missing GPU are one line and exit 2, before any
work; the per-step kernel table groups a profile's launches by position and takes medians."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "kernel_profile.py"


def _module():
    spec = importlib.util.spec_from_file_location("kernel_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv, message",
    [(["--kernel", "nope"], "unknown kernel 'nope'"),
     (["--modes", "triton,fast"], "unknown mode(s) in ['triton', 'fast']"),
     (["--dtype", "fp8"], "unknown dtype 'fp8'"),
     (["--kernel", "mlp", "--pass", "bwd"], "--pass bwd: mlp runs fwd, fwd_bwd"),
     (["--kernel", "mlp", "--shape", "1x2x3"], "--shape 1x2x3: not in mlp's shape sets"),
     (["--steps", "1"], "--steps 1: need at least 2")],
)  # fmt: skip
@pytest.mark.slow
def test_bad_arguments_are_one_line_and_exit_2(argv, message):
    run = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernel_profile: ") and message in lines[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
@pytest.mark.slow
def test_without_a_gpu_it_says_so():
    argv = [sys.executable, str(SCRIPT), "--kernel", "mlp", "--shape", "2048x4096x14336"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stderr.strip() == "kernel_profile: needs a CUDA GPU"


def test_launches_group_by_position_with_medians():
    kp = _module()
    # three steps of (gemm, gelu), out of order, the gelu's time varying by step
    events = [("gemm", 0, 10.0), ("gelu", 11, 2.0), ("gemm", 20, 12.0), ("gelu", 33, 9.0),
              ("gemm", 40, 11.0), ("gelu", 52, 3.0)][::-1]  # fmt: skip
    assert kp.per_launch(events, 3) == [("gemm", 11.0), ("gelu", 3.0)]
    with pytest.raises(ValueError, match="5 kernels over 3 steps"):
        kp.per_launch(events[:5], 3)
    swapped = [("gemm", 0, 1.0), ("gelu", 1, 1.0), ("gelu", 2, 1.0), ("gemm", 3, 1.0)]
    with pytest.raises(ValueError, match="step 1 launched"):
        kp.per_launch(swapped, 2)
    table = kp.side_by_side({"triton": [("gemm", 11.0), ("gelu", 3.0)], "default": [("k", 9.5)]})
    assert table.splitlines()[0].split() == ["triton:", "14.0", "us", "default:", "9.5", "us"]
    assert "11.0  gemm" in table and "9.5  k" in table and "3.0  gelu" in table
