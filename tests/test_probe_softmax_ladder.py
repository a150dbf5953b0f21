"""experiments.probe_softmax_ladder: the rungs' shapes and expected outputs (CPU), and every
rung's output on a GPU."""

import importlib

import pytest
import torch

ladder = importlib.import_module("experiments.probe_softmax_ladder")


@pytest.mark.parametrize("itemsize", [2, 4])
def test_every_rung_splits_its_chunk_into_tma_boxes(itemsize):
    chunk = ladder.chunk_for(itemsize)
    assert chunk * itemsize == ladder.CHUNK_BYTES
    threads_bytes = 32 * ladder.warps_for(itemsize) * 16  # one 16-byte vector a thread
    for name, rung in ladder.RUNGS.items():
        splits = ladder.splits_for(rung, itemsize)
        rows = chunk // ladder.COLS // splits
        assert rows * splits * ladder.COLS == chunk, name
        assert 1 <= rows <= 256, name  # a TMA box side
        assert rows * ladder.COLS * itemsize % threads_bytes == 0, name  # the layout tiles it
        assert rung.work in (0, 1, 2, 3, 4) and rung.load in (0, 1) and rung.store in (0, 1, 2)
        assert rung.store < 2 or rung.work == 2, name  # split-by-split TMA stores: row rungs
        assert rung.load == 0 or rung.work == 0, name  # TMA only under the copy rungs


def test_tma_is_offered_under_the_copy_rungs_only():
    with pytest.raises(ValueError, match="TMA copies under the copy rungs only"):
        ladder.Ladder(ladder.Rung(0, 2, 1, 0), torch.empty(2, 16384), torch.empty(2, 16384))


def test_a_cluster_holds_a_row_of_at_most_16_chunks():
    x = torch.empty(1, 32 * ladder.chunk_for(4))
    with pytest.raises(ValueError, match="a cluster holds 2-16 programs, not 32"):
        ladder.Ladder(ladder.RUNGS["row_cl"], x, x)()
    x = torch.empty(1, 3 * ladder.chunk_for(4))  # the pushes reach every rank below 4
    with pytest.raises(ValueError, match="a cluster holds 2-16 programs, not 3 .a power of 2"):
        ladder.Ladder(ladder.RUNGS["row_cl"], x, x)()


def test_a_tail_takes_the_last_rows_in_smaller_chunks():
    """Round 26's tail rungs: the last tail_pct % of the rows (at least one) in chunks `tail`
    times smaller, their slots after the first rows'; refused where `tail` does not divide the
    chunk's splits, and on the TMA or cluster rungs."""
    x = torch.empty(20, 2 * ladder.chunk_for(2), dtype=torch.bfloat16)
    run = ladder.Ladder(ladder.RUNGS["row_cp_s4_10"], x, x)
    assert run.tail_pid == 18 * 2 and run.slots == 18 * 2 + 2 * 2 * 4
    assert run.ws[0].numel() == run.slots + 1
    assert ladder.Ladder(ladder.RUNGS["row_cp_s2_10"], x[:3], x[:3]).tail_pid == 2 * 2  # 1 row
    x32 = torch.empty(4, 2 * ladder.chunk_for(4))  # fp32: 4 splits a chunk
    with pytest.raises(ValueError, match="a tail takes"):
        ladder.Ladder(ladder.RUNGS["row_cp_s8_10"], x32, x32)
    with pytest.raises(ValueError, match="a tail takes"):
        ladder.Ladder(ladder.Rung(0, 4, 0, 0, 0, 2, 10), x, x)


def test_an_order_of_splits_takes_the_plain_copy_or_row_rungs():
    """Round 28's interleaved and rotated splits (Rung.order): a permutation of the chunk's
    splits within its row, on the cp.async copy and row rungs only (reads and writes in
    different orders on the row rungs only)."""
    x = torch.empty(2, 2 * ladder.chunk_for(2), dtype=torch.bfloat16)
    for name in ("copy_cp_il", "copy_cp_rot", "row_cp_il", "row_cp_rot", "copy_cp_il2",
                 "row_cp_il2", "row_cp_rotr", "row_cp_rotw"):  # fmt: skip
        assert ladder.Ladder(ladder.RUNGS[name], x, x).rung.order in (1, 2, 3, 4, 5)
    for rung in (ladder.Rung(0, 1, 0, 0, order=1), ladder.Rung(0, 0, 1, 1, order=2),
                 ladder.Rung(0, 2, 0, 0, 0, 2, 10, order=1),
                 ladder.Rung(0, 0, 0, 0, order=4)):  # rotated reads alone: the row rungs only
        with pytest.raises(ValueError, match="an order of splits takes"):
            ladder.Ladder(rung, x, x)


def test_rows_must_be_whole_chunks():
    ladder.check_shape(65536, 2)
    with pytest.raises(ValueError, match="multiple of 16384 columns"):
        ladder.check_shape(65536 + 8, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_expected_outputs_of_local_and_row_rungs(dtype):
    chunk = ladder.chunk_for(torch.empty(0, dtype=dtype).element_size())
    x = torch.randn(3, 2 * chunk, dtype=dtype) * 4
    local = ladder.expected(ladder.RUNGS["local_cp"], x).double()
    row = ladder.expected(ladder.RUNGS["row_cp_t"], x).double()
    tol = dict(atol=0.02, rtol=0) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=0)
    # each chunk sums to 1 in the local rung, each row in the row rungs
    torch.testing.assert_close(local.view(-1, chunk).sum(-1), torch.ones(6, dtype=torch.float64),
                               **tol)  # fmt: skip
    torch.testing.assert_close(row.sum(-1), torch.ones(3, dtype=torch.float64), **tol)
    ref = torch.softmax(x.double(), dim=-1)
    ladder.check(ladder.RUNGS["row_cp_t"], x, ref.to(dtype))
    with pytest.raises(AssertionError):  # the check tells a chunk's softmax from a row's
        ladder.check(ladder.RUNGS["row_cp_t"], x, local.to(dtype))
    ladder.check(ladder.RUNGS["copy_cp"], x, x.clone())
    with pytest.raises(AssertionError):
        ladder.check(ladder.RUNGS["copy_cp"], x, x * 1.25)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype_name", ["bf16", "fp32", "fp16"])
def test_every_rung_on_gpu(dtype_name):
    """Each rung twice on 3 rows of 4 chunks (the second launch on the workspace the first
    zeroed), with extreme values in one row."""
    if ladder.gluon is None:
        pytest.skip("needs a Triton with Gluon's Hopper modules")
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("TMA needs sm_90")
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dtype_name]
    chunk = ladder.chunk_for(torch.empty(0, dtype=dtype).element_size())
    x = torch.randn(3, 4 * chunk, device="cuda", dtype=dtype) * 3
    x[1, 5] = 1e4 if dtype != torch.float16 else 6e4
    x[1, chunk + 7] = -1e4 if dtype != torch.float16 else -6e4
    y = torch.empty_like(x)
    for name, rung in ladder.RUNGS.items():
        if rung.tail and ladder.splits_for(rung, x.element_size()) % rung.tail:
            with pytest.raises(ValueError, match="a tail takes"):
                ladder.Ladder(rung, x, y)
            continue
        run = ladder.Ladder(rung, x, y)
        for _ in range(2):
            y.fill_(float("nan"))
            run()
            try:
                ladder.check(rung, x, y)
            except AssertionError as exc:
                raise AssertionError(f"rung {name}: {exc}") from exc
