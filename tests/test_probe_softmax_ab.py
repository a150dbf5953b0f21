"""experiments.probe_softmax_ab's pieces that need no GPU."""

import pytest
import torch

from experiments import probe_softmax_ab as ab


def test_rows_shapes_are_the_benchmarks():
    shapes = ab.rows_shapes()
    assert [n for _, n in shapes] == [128, 512, 1024, 4096, 16384, 65536, 262144]
    assert all(m * n == 2**27 for m, n in shapes)


def test_ratio_is_the_best_compile_mode_over_ours_per_round():
    times = {"triton": [1.0, 2.0, 4.0], "default": [1.1, 1.8, 4.4],
             "max-autotune-no-cudagraphs": [1.2, 1.9, 3.6]}  # fmt: skip
    assert ab.ratios(times) == pytest.approx([1.1, 0.9, 0.9])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU path")
def test_needs_a_gpu(capsys):
    assert ab.main(["--rounds", "1"]) == 1
    assert "no CUDA device" in capsys.readouterr().out


def test_variants_are_of_the_online_pick_only():
    """Variants where our pick is the online row loop (fp32 N = 4096 on 132 SMs): the stores'
    default policy and other warps; none for the tile's rows."""
    from kernels._common import pretend_gpu

    with pretend_gpu((9, 0), 132):
        online = ab.variants(32768, 4096, 4)
        assert online and all(c.design == "online" for c in online.values())
        assert online["triton_st"].store_default
        assert not ab.variants(1048576, 128, 4)
