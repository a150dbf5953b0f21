"""The public kernel API of every registered op, fuzzed with hypothesis against float64
(experiments/fuzz.py): random sizes 1 to 300, every dtype, transposed, sliced, offset, split and
channels_last inputs, bias, activations, stride, padding, dilation, dim, and gradients where the
op trains. 80 derandomized cases an op (320 for the four ops), so a CI run is reproducible; a
failure prints the one-line reproducer (`python -m experiments.fuzz --case '...'`).

The GPU run is `make fuzz` (python -m experiments.fuzz: 1000 cases, a share of them autotuned).
"""

import warnings

import pytest
from hypothesis import HealthCheck, given, settings

from experiments import fuzz
from tests.conftest import DEVICE

EXAMPLES_PER_OP = 80


def test_every_registered_op_has_a_case_strategy():
    assert set(fuzz.fuzzed_ops()) <= set(fuzz.CASES), "add the op's strategy to fuzz.CASES"
    assert not set(fuzz.fuzzed_ops()) & {"mlp", "attention", "bottleneck"}  # their ops are fuzzed


@pytest.mark.slow
@pytest.mark.parametrize("op", fuzz.fuzzed_ops())
def test_random_calls_match_float64(op):
    @settings(max_examples=EXAMPLES_PER_OP, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=fuzz.cases(ops=[op], high=300, budget=200_000))
    def check(case):
        with warnings.catch_warnings():
            # the interpreter's numpy exp overflows to inf inside gelu/silu: the result is right
            warnings.simplefilter("ignore", RuntimeWarning)
            problem = fuzz.run_case(case, DEVICE)
        assert problem is None, f"{problem}: {case.reproducer()}"

    check()


def test_a_printed_case_reruns_from_its_line(capsys):
    case = fuzz.Case("linear", "bf16", [["x", [2, 3, 5], "transposed"], ["weight", [4, 5], "split"],
                                         ["bias", [4], "offset"]], {"activation": "gelu"}, True, 7)
    line = case.reproducer()
    assert "\n" not in line and line.startswith("python -m experiments.fuzz --case '")
    payload = line.split("--case '", 1)[1].split("'  # ", 1)[0]
    assert fuzz.main(["--case", payload, "--device", DEVICE]) == 0
    assert capsys.readouterr().out.startswith("ok: kernels.linear(x[2x3x5 transposed]")


def test_views_hold_the_values_they_claim():
    import torch

    gen = torch.Generator().manual_seed(0)
    for view in (*fuzz.VIEWS, "channels_last"):
        t = fuzz.make_tensor([2, 3, 4, 5], view, torch.float32, "cpu", gen)
        assert list(t.shape) == [2, 3, 4, 5] and t.abs().sum() > 0
        assert t.is_contiguous() == (view in ("contiguous", "offset")), view
        assert t.storage_offset() == (view == "offset"), view


def test_heuristic_configs_picks_one_config_and_restores():
    from triton.runtime import autotuner

    before = autotuner.Autotuner.prune_configs
    with fuzz.heuristic_configs():
        assert autotuner.Autotuner.prune_configs is not before
    assert autotuner.Autotuner.prune_configs is before
