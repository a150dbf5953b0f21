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


def test_variants_of_the_online_pick_and_of_a_tuned_tile():
    """Every pick beside its round 22 form (no Config.lean; the online loop also with masks and
    int64 offsets). Where the pick is the online row loop (fp32 N = 4096 on 132 SMs): the
    stores' default policy, other warps, two rows a program, the one-pass tile. Where it is a
    tile the first call tunes (N = 128): the tuner's other candidates, all one 16-byte access
    a thread. Nothing else for a tile it does not tune (bf16 N = 2048)."""
    from kernels._common import pretend_gpu
    from kernels.softmax import _pick_config

    def pick(m, n, itemsize):
        return _pick_config(n, m, False, False, torch.device("cuda"), itemsize)

    with pretend_gpu((9, 0), 132):
        online = ab.variants(32768, 4096, 4)
        assert {online.pop(name).design for name in ("triton_tile", "triton_tile_ef")} == {"tile"}
        assert online["triton_2r"].block_rows == 2
        assert all(c.design == "online" for c in online.values())
        assert online.pop("triton_r22") == pick(32768, 4096, 4)._replace(
            lean=False, even=False, int32=False
        )  # fmt: skip
        assert online["triton_st"].store_default
        assert online["triton_lanes4_st"] == pick(32768, 4096, 4)._replace(
            lanes=4, store_default=True
        )  # fmt: skip
        tiles = ab.variants(1048576, 128, 4)
        assert tiles.pop("triton_r22") == pick(1048576, 128, 4)._replace(lean=False)
        assert tiles and pick(1048576, 128, 4) not in tiles.values()
        assert {c.design for c in tiles.values()} == {"tile", "online"}  # round 24: both
        for name, config in tiles.items():
            assert config.block_cols == 128 and config.lean
            assert config.block_rows * 128 * 4 == 16 * 32 * config.num_warps
            assert ("_online_" in name) == (config.design == "online")
        assert list(ab.variants(65536, 2048, 2)) == ["triton_r22"]


INDUCTOR_LOOPED = """def triton_red_fused_0(in_ptr0, out_ptr2, xnumel, r0_numel, XBLOCK, R0_BLOCK):
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        tmp4 = tl.load(in_ptr0 + (r0_1 + 4096*x0), r0_mask, eviction_policy='evict_first')
        tmp5 = tmp4 - tmp2
        tmp6 = libdevice.exp(tmp5)
        tmp7 = (tmp6 / tmp3)
        tl.store(out_ptr2 + (r0_1 + 4096*x0), tmp7, r0_mask)
"""


def test_source_edits_of_inductors_kernel():
    """Round 24's edits of Inductor's looped kernel toward ours: each applies where its
    pattern occurs, in turn; an edit whose pattern is missing gives None (not timed)."""
    assert ab._edited_source(INDUCTOR_LOOPED, None) == INDUCTOR_LOOPED
    ours = ab._edited_source(INDUCTOR_LOOPED, "fexp_mul_stef")
    assert "tmp6 = tl_math.exp(tmp5)" in ours and "libdevice" not in ours
    assert "tmp7 = (tmp6 * (1.0 / tmp3))" in ours
    assert ("tl.store(out_ptr2 + (r0_1 + 4096*x0), tmp7, r0_mask, "
            "eviction_policy='evict_first')") in ours  # fmt: skip
    assert ours.count("evict_first") == 2  # the load's own policy is left alone
    assert ab._edited_source(INDUCTOR_LOOPED, "mul").count("libdevice.exp") == 1
    persistent = INDUCTOR_LOOPED.replace("libdevice.exp", "tl_math.exp")
    assert ab._edited_source(persistent, "fexp") is None
    assert ab._edited_source(persistent, "stef") is not None


def test_kept_variants():
    assert ab.kept("triton_lanes2", None) and ab.kept("ind_src_mac_fexp", "lanes|ind_src")
    assert not ab.kept("triton_w8", "lanes|ind_src")
    assert all(ab.kept(name, "nothing") for name in ("triton", *ab.MODES))
    assert all(ab.kept(name, "none") for name in ("triton", *ab.MODES))
    assert not ab.kept("triton_st", ab.NO_VARIANTS) and not ab.kept("ind_src_mac", "none")


def test_inductor_shaped_configs():
    """Our tile in a persistent reduction's XBLOCK and warps; our loop in a looped kernel's
    R0_BLOCK and warps (one row a program only); the pick itself and mismatches left out."""
    from kernels.softmax import Config

    tile = Config("tile", 8, 128, 4, even=True, int32=True)
    found = [
        {"kwargs": {"XBLOCK": 32}, "num_warps": 8},
        {"kwargs": {"XBLOCK": 8}, "num_warps": 4},  # the pick's own shape
        {"kwargs": {"XBLOCK": 1, "R0_BLOCK": 128}, "num_warps": 2},  # looped: not a tile's
    ]
    shaped = ab.inductor_shaped(found, 128, tile)
    assert list(shaped.values()) == [Config("tile", 32, 128, 8, even=True, int32=True)]
    loop = Config("online", 1, 4096, 16, evict=True, exp2=1)
    found = [
        {"kwargs": {"XBLOCK": 1, "R0_BLOCK": 2048}, "num_warps": 8},
        {"kwargs": {"XBLOCK": 2, "R0_BLOCK": 2048}, "num_warps": 8},  # two rows: not our loop's
        {"kwargs": {"XBLOCK": 32}, "num_warps": 8},  # persistent: not a loop's
    ]
    shaped = ab.inductor_shaped(found, 4096, loop)
    assert list(shaped.values()) == [loop._replace(block_cols=2048, num_warps=8)]


def test_paired_record_is_what_analysis_targets_reads():
    """--jsonl's record: the rounds' ratios, their median and each side's median GPU time; with
    the GPU's name added (main does) analysis.targets.paired_check takes it."""
    from analysis.targets import paired_check

    times = {"triton": [1.0, 2.0, 4.0], "default": [1.1, 1.8, 4.4],
             "max-autotune-no-cudagraphs": [1.2, 1.9, 3.6]}  # fmt: skip
    record = ab.paired_record("bf16", 8, 128, times)
    assert record["ratios"] == pytest.approx([1.1, 0.9, 0.9])
    assert record["median_ratio"] == pytest.approx(0.9)
    assert record["time_ms_p50"] == {"triton": 2.0, "default": 1.8,
                                     "max-autotune-no-cudagraphs": 1.9}  # fmt: skip
    check = paired_check([{**record, "gpu_name": "G"}], "bf16", ["G"])
    assert check.value == pytest.approx(0.9) and not check.passed and "N=128" in check.detail
