"""experiments.tile_probe: each forced config runs alone and is checked against torch before it
is timed; a config that fails is a row with its error; bad arguments are one line and exit 2.
On CPU the kernels run in the interpreter (no times)."""

import math

import pytest
import torch

from experiments import tile_probe

DEPTHWISE = {"n": 1, "c": 8, "h": 7, "w": 7, "k": 8, "r": 3, "s": 3, "stride": 1, "padding": 1,
             "dilation": 1, "groups": 8}  # fmt: skip
DENSE = {"n": 1, "c": 16, "h": 5, "w": 6, "k": 24, "r": 3, "s": 3, "stride": 2, "padding": 1,
         "dilation": 1, "groups": 1}  # fmt: skip


@pytest.mark.slow
def test_depthwise_forces_each_tile_and_records_a_failing_one():
    lines = []
    # (7, 7, 1): the 7-wide tile of SLIDING_TILES; 3 warps: not a power of 2, Triton refuses it
    rows = tile_probe.probe_depthwise([DEPTHWISE, DENSE], torch.float32, torch.device("cpu"),
                                      [(7, 7, 1), (2, 7, 3)], out=lines.append)  # fmt: skip
    assert len(rows) == 1 and rows[0]["layer"] == "1x8x7x7-k8-3x3"  # the dense conv is skipped
    tiles = rows[0]["tiles"]
    assert isinstance(tiles[(7, 7, 1)], float) and math.isnan(tiles[(7, 7, 1)])  # checked, untimed
    assert isinstance(tiles[(2, 7, 3)], str)  # the failure, recorded with its reason
    assert "failed (2, 7, 3)" in lines[-1]


def test_implicit_runs_its_tile_on_a_strided_layer():
    rows = tile_probe.probe_implicit([DENSE, DEPTHWISE], torch.float32, torch.device("cpu"),
                                     out=lambda line: None)  # fmt: skip
    assert [row["layer"] for row in rows] == ["1x16x5x6-k24-3x3-s2"]
    assert rows[0]["plan"].startswith("implicit")
    assert all(isinstance(us, float) for us in rows[0]["tiles"].values()), rows[0]["tiles"]


def test_gemm_runs_its_tile_on_a_one_by_one_layer():
    one = {**DENSE, "r": 1, "s": 1, "stride": 1, "padding": 0}
    rows = tile_probe.probe_gemm([DENSE, one], torch.float32, torch.device("cpu"),
                                 out=lambda line: None)  # fmt: skip
    assert [row["layer"] for row in rows] == ["1x16x5x6-k24-1x1"]
    assert all(isinstance(us, float) for us in rows[0]["tiles"].values()), rows[0]["tiles"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["depthwise", "--shapes", "nope"], "unknown shape set 'nope' for kernel=conv"),
        (["implicit", "--tile", "1,2"], "expected 5 comma-separated ints"),
        (["gemm", "--tile", "1,2,3,4,5"], "expected 6 comma-separated ints"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, message, capsys):
    assert tile_probe.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_config_that_writes_nothing_fails_even_where_its_output_already_held_the_answer():
    """The caching allocator can hand a config's output the memory of an earlier config's correct
    one; the probe clears it first, so a launch that skips tiles cannot pass the check."""

    class Idle:  # a launch that writes nothing
        def once(self, *tensors):
            pass

        def __call__(self, *tensors):
            pass

    ref = torch.randn(1, 4, 3, 3)
    stale = ref.clone()  # what the reused memory held
    outcome = tile_probe.timed_config(tile_probe.implicit_gemm.conv_implicit_kernel,
                                      tile_probe.conv_config(32, 32, 16, 1, 4),
                                      lambda: (Idle(), (), stale), ref, torch.float32)  # fmt: skip
    assert isinstance(outcome, str) and "AssertionError" in outcome


@pytest.mark.slow
def test_gemm_probe_checks_every_forced_decomposition(tmp_path):
    """experiments.gemm_probe off a GPU: each (tile, split or stream-K) of the TMA GEMM forced on
    a --gemm shape in the interpreter (under pretend_gpu) and checked against torch, untimed;
    every launch passes (exit 0) and the CSV holds cuBLAS, the dispatched plan and each one."""
    import csv

    from experiments import gemm_probe

    out = tmp_path / "probe.csv"
    assert gemm_probe.main(["--gemm", "200,96,512", "--splits", "1,2", "--csv", str(out)]) == 0
    variants = [row["variant"] for row in csv.DictReader(out.open())]
    assert variants[:2] == ["cublas", "dispatched 64x64/1"]
    assert {"128x128/2", "128x128/sk", "64x64/1"} <= set(variants)
    with pytest.raises(SystemExit):  # a bad --gemm is argparse's one-line error
        gemm_probe.main(["--gemm", "0,1,2"])
