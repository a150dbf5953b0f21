"""analysis.figures: each figure shows the numbers it claims, and the committed files reproduce."""

import json
import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from analysis import figures
from analysis.load import load_results
from experiments.records import Record
from tests.conftest import REPO_ROOT

H100 = REPO_ROOT / "results" / "current" / "h100" / "all_modes_first_kernels"
COMMITTED = H100 / "figures"
ENV = {"gpu_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "triton": "3.6.0",
       "git_sha": "775ac0e" + "0" * 33, "peaks": {"copy_gbps": 3000.0, "bf16_matmul_tflops": 760.0}}
CAPTION = "NVIDIA H100 80GB HBM3 · torch 2.11.0+cu130 · triton 3.6.0 · records @ 775ac0e"
# (kernel, shape, flops, min_bytes): softmax shapes move the same bytes, as the real ones do
SHAPES = [("matmul", "64x64x64", 1e9, 1e7), ("matmul", "128x128x128", 8e9, 4e7),
          ("softmax", "7x1823", 2e6, 5e6), ("softmax", "1823x7", 2e6, 5e6)]
SPEEDUPS = {  # (kernel, mode) -> speedup per shape, in SHAPES order
    ("matmul", "eager"): [1.0, 1.0], ("matmul", "default"): [2.0, 8.0],
    ("matmul", "triton"): [0.5, 0.5], ("softmax", "eager"): [1.0, 1.0],
    ("softmax", "triton"): [1.5, 3.0],
}
BASE_MS = {"64x64x64": 0.01, "128x128x128": 0.4, "7x1823": 0.02, "1823x7": 0.03}


def record(kernel, mode, label, flops, min_bytes, speedup, **extra):
    time_ms = BASE_MS[label]
    fields = dict(
        time_ms_p50=time_ms, eager_time_ms_p50=speedup and time_ms * speedup,
        speedup_vs_eager=speedup, static_inputs=[],
        max_rel_err=1e-3, flops=flops, min_bytes=min_bytes, tflops=flops / (time_ms * 1e9),
        gbps=min_bytes / (time_ms * 1e6), call_latency_us_p50=40.0 + 1e3 * time_ms,
        compile_cold_s=None if mode == "eager" else 2.0)
    fields.update(extra)
    return Record(kernel=kernel, mode=mode, shape={}, shape_label=label, shape_set="default",
                  dtype="bf16", pass_="fwd", tf32=False, device="cuda", run_name=f"{kernel}-{mode}",
                  job_id="sweep/0", **fields).to_json()


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records") / "job"
    folder.mkdir()
    rows = []
    for (kernel, mode), speedups in SPEEDUPS.items():
        shapes = [s for s in SHAPES if s[0] == kernel]
        rows += [record(kernel, mode, label, flops, nbytes, speedup)
                 for (_, label, flops, nbytes), speedup in zip(shapes, speedups, strict=True)]
    # neither of these belongs to the default view
    rows.append(record("matmul", "reduce-overhead", "64x64x64", 1e9, 1e7, 9.0,
                       static_inputs=["a", "b"]))
    rows.append(record("matmul", "max-autotune", "64x64x64", 1e9, 1e7, None, status="failed",
                       reason="OOM", time_ms_p50=None, speedup_vs_eager=None))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "env.json").write_text(json.dumps(ENV))
    results = load_results(folder.parent)
    assert results.problems == []
    return results.frame


def by_gid(ax, gid):
    return [a for a in ax.get_children() if a.get_gid() == gid]


def has_caption(fig):
    return [t.get_text() for t in fig.texts if t.get_gid() == "caption"] == [CAPTION]


def test_speedup_by_mode_bars_are_geomeans_on_a_log_axis(frame):
    fig = figures.speedup_by_mode(frame)
    matmul, softmax = fig.axes[:2]
    assert (matmul.get_title(), softmax.get_title()) == ("matmul (2 shapes)", "softmax (2 shapes)")
    assert [t.get_text() for t in matmul.get_xticklabels()] == ["eager", "default", "triton"]
    expected = {"eager": 1.0, "default": 4.0, "triton": 0.5}  # sqrt(2*8), sqrt(.5*.5)
    for mode, geomean in expected.items():
        (bar,) = by_gid(matmul, mode)
        assert bar.get_y() == 1.0  # bars grow from parity, up when faster, down when slower
        assert bar.get_y() + bar.get_height() == pytest.approx(geomean)
    (bar,) = by_gid(softmax, "triton")
    assert bar.get_y() + bar.get_height() == pytest.approx(math.sqrt(4.5))
    for ax in (matmul, softmax):
        assert ax.get_yscale() == "log"
        (parity,) = by_gid(ax, "parity")
        assert list(parity.get_ydata()) == [1.0, 1.0]
        assert ax.get_ylim()[0] < 0.5 and ax.get_ylim()[1] > 8.0  # the whiskers fit
    assert "min–max" in matmul.get_ylabel() and "geomean" in matmul.get_ylabel()
    assert has_caption(fig)
    plt.close(fig)


def test_speedup_heatmap_cells_and_annotations(frame):
    fig = figures.speedup_heatmap(frame, "matmul")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["eager", "default", "triton"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["64x64x64", "128x128x128"]
    cells = [1.0, 1.0, 2.0, 8.0, 0.5, 0.5]
    assert [t.get_text() for t in ax.texts] == [f"{c:.2f}" for c in cells]
    np.testing.assert_allclose(ax.collections[0].get_array().ravel(), np.log2(cells))
    assert has_caption(fig)
    plt.close(fig)


def test_roofline_ceilings_come_from_the_measured_peaks(frame):
    fig = figures.roofline(frame)
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    (roof,) = by_gid(ax, "roof")
    xs, ys = np.asarray(roof.get_xdata()), np.asarray(roof.get_ydata())
    np.testing.assert_allclose(ys, np.minimum(760.0, xs * 3000.0 / 1e3))
    (ridge,) = by_gid(ax, "ridge")
    assert ridge.get_xdata()[0] == pytest.approx(760.0 * 1e3 / 3000.0)
    (points,) = by_gid(ax, "matmul:default")
    np.testing.assert_allclose(points.get_offsets(), [[100.0, 100.0], [200.0, 20.0]])
    assert "TFLOP/s" in ax.get_ylabel() and "intensity" in ax.get_xlabel()
    assert has_caption(fig)
    plt.close(fig)


def test_scaling_is_throughput_against_size_per_mode(frame):
    fig = figures.scaling(frame, "matmul")
    ax = fig.axes[0]
    (line,) = by_gid(ax, "default")
    assert list(line.get_xdata()) == [1e9, 8e9] and ax.get_xscale() == "log"
    np.testing.assert_allclose(line.get_ydata(), [100.0, 20.0])
    assert ax.get_ylabel() == "achieved TFLOP/s"
    (peak,) = by_gid(ax, "peak")
    assert peak.get_ydata()[0] == 760.0
    plt.close(fig)
    fig = figures.scaling(frame, "softmax")  # equal sizes: the shapes become the x axis
    ax = fig.axes[0]
    (line,) = by_gid(ax, "triton")
    assert list(line.get_xdata()) == [0, 1]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1823x7", "7x1823"]
    np.testing.assert_allclose(line.get_ydata(), [5e6 / 0.03e6, 5e6 / 0.02e6])
    assert ax.get_ylabel() == "achieved GB/s"
    assert has_caption(fig)
    plt.close(fig)


def test_compile_break_even_known_value_and_never(frame):
    calls = figures.break_even_calls(frame).set_index(["kernel", "mode", "shape_label"])
    # 2 s of compile / (0.02 ms - 0.01 ms saved per call) = 200,000 calls
    assert calls.loc[("matmul", "default", "64x64x64"), "break_even_calls"] == pytest.approx(2e5)
    assert calls.loc[("matmul", "triton", "64x64x64"), "break_even_calls"] == math.inf
    assert "eager" not in calls.index.get_level_values("mode")
    fig = figures.compile_break_even(frame)
    matmul = fig.axes[0]
    finite = np.concatenate([c.get_offsets()[:, 1] for c in by_gid(matmul, "break_even")])
    np.testing.assert_allclose(sorted(finite), [2.0 / (0.4e-3 * 7), 2e5])
    nevers = [c for c in by_gid(matmul, "never") if len(c.get_offsets())]
    assert len(nevers) == 1 and len(nevers[0].get_offsets()) == 2  # triton, both shapes
    never_y = nevers[0].get_offsets()[0, 1]
    assert never_y > 2e5 and matmul.get_yscale() == "log"
    fig.canvas.draw()
    labels = {t.get_text(): t.get_position()[1] for t in matmul.get_yticklabels()}
    assert labels["never"] == never_y
    assert has_caption(fig)
    plt.close(fig)


def test_latency_vs_gpu_time_small_shapes_with_identity_line(frame):
    fig = figures.latency_vs_gpu_time(frame)
    ax = fig.axes[0]
    (identity,) = by_gid(ax, "identity")
    assert list(identity.get_xdata()) == list(identity.get_ydata())
    (points,) = by_gid(ax, "matmul:default")  # only 64x64x64: 128^3 takes 0.4 ms
    np.testing.assert_allclose(points.get_offsets(), [[10.0, 50.0]])
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert "GPU time" in ax.get_xlabel() and "call latency" in ax.get_ylabel()
    assert has_caption(fig)
    plt.close(fig)


def test_cli_without_records_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no results.jsonl under"):
        figures.main([str(tmp_path), str(tmp_path / "out")])


@pytest.mark.slow  # draws every figure of the committed records
@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed figures")
def test_save_all_reproduces_the_committed_figures_byte_for_byte(tmp_path):
    written = figures.save_all(load_results(H100).frame, tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted(p.name for p in COMMITTED.iterdir() if p.suffix in (".png", ".svg"))
    assert {"speedup_by_mode.png", "speedup_by_mode.svg", "speedup_heatmap_matmul.png"} <= set(
        names)
    for name in names:
        assert (tmp_path / name).read_bytes() == (COMMITTED / name).read_bytes(), name
