"""analysis.figures: each figure shows the numbers it claims, and the committed files reproduce."""

import json
import math
import shutil

import matplotlib.pyplot as plt
import numpy as np
import pytest

from analysis import figures
from analysis.load import load_results
from experiments.records import Record
from tests.conftest import REPO_ROOT

H100 = REPO_ROOT / "results" / "current" / "h100" / "study"
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


def latency_us(time_ms):
    return 40.0 + 1e3 * time_ms  # a fixed 40 µs of host path on top of the GPU time


def record(kernel, mode, label, flops, min_bytes, speedup, dtype="bf16", device="cuda", **extra):
    time_ms = BASE_MS[label]
    eager_latency = speedup and latency_us(time_ms * speedup)
    fields = dict(
        time_ms_p50=time_ms, eager_time_ms_p50=speedup and time_ms * speedup,
        speedup_vs_eager=speedup, static_inputs=[],
        max_rel_err=1e-3, flops=flops, min_bytes=min_bytes, tflops=flops / (time_ms * 1e9),
        gbps=min_bytes / (time_ms * 1e6), call_latency_us_p50=latency_us(time_ms),
        eager_call_latency_us_p50=eager_latency,
        latency_speedup_vs_eager=speedup and eager_latency / latency_us(time_ms),
        compile_cold_s=None if mode == "eager" else 2.0)
    fields.update(extra)
    return Record(kernel=kernel, mode=mode, shape={}, shape_label=label, shape_set="default",
                  dtype=dtype, pass_="fwd", tf32=False, device=device, run_name=f"{kernel}-{mode}",
                  job_id="sweep/0", **fields).to_json()


def write_job(folder, rows, env):
    """One job's results.jsonl and env.json, as a run leaves them."""
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "env.json").write_text(json.dumps(env))
    return folder


def load(root):
    results = load_results(root)
    assert results.problems == []
    return results.frame


def fixture_rows():
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
    return rows


@pytest.fixture(scope="module")
def frame(tmp_path_factory):
    return load(write_job(tmp_path_factory.mktemp("records") / "job", fixture_rows(), ENV).parent)


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    """The fixture's H100 rows, and an H200 job that measured two of its cells and one more."""
    root = tmp_path_factory.mktemp("two_gpus")
    write_job(root / "h100", fixture_rows(), ENV)
    h200 = {**ENV, "gpu_name": "NVIDIA H200", "peaks": {"copy_gbps": 4000.0,
                                                        "bf16_matmul_tflops": 800.0}}
    write_job(root / "h200", [
        record("matmul", "default", "64x64x64", 1e9, 1e7, 3.0, time_ms_p50=0.008),
        record("softmax", "triton", "7x1823", 2e6, 5e6, 1.2, time_ms_p50=0.015),
        record("softmax", "eager", "1823x7", 2e6, 5e6, 1.0, dtype="fp32"),  # not on the H100
    ], h200)
    return load(root)


@pytest.fixture(scope="module")
def on_cpu(tmp_path_factory):
    """Rows a CPU run writes: device cpu, a cpu-thread-time timer, no GPU and no peaks."""
    env = {"device": "cpu", "gpu_name": None, "torch": "2.11.0+cpu", "triton": "3.6.0",
           "git_sha": "775ac0e" + "0" * 33}
    rows = [{**row, "device": "cpu", "timer": "cpu-thread-time"} for row in fixture_rows()]
    return load(write_job(tmp_path_factory.mktemp("cpu") / "job", rows, env).parent)


def by_gid(ax, gid):
    return [a for a in ax.get_children() if a.get_gid() == gid]


def has_caption(fig):
    return [t.get_text() for t in fig.texts if t.get_gid() == "caption"] == [CAPTION]


def test_speedup_by_mode_bars_are_geomeans_on_a_log_axis(frame):
    fig = figures.speedup_by_mode(frame)
    matmul, softmax = fig.axes[:2]
    assert (matmul.get_title(), softmax.get_title()) == ("matmul (2 shapes)", "softmax (2 shapes)")
    # the columns share their modes; the tick labels sit under the bottom row
    assert [t.get_text() for t in fig.axes[2].get_xticklabels()] == ["eager", "default", "triton"]
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
    assert "GPU time" in matmul.get_ylabel()
    # the bottom row: the same bars for call latency (latency_speedup_vs_eager)
    latency_matmul, latency_softmax = fig.axes[2:]
    assert "call latency" in latency_matmul.get_ylabel()
    ratios = [latency_us(ms * s) / latency_us(ms) for ms, s in ((0.01, 2.0), (0.4, 8.0))]
    (bar,) = by_gid(latency_matmul, "default")
    assert bar.get_y() + bar.get_height() == pytest.approx(math.sqrt(ratios[0] * ratios[1]))
    (bar,) = by_gid(latency_softmax, "triton")
    ratios = [latency_us(ms * s) / latency_us(ms) for ms, s in ((0.02, 1.5), (0.03, 3.0))]
    assert bar.get_y() + bar.get_height() == pytest.approx(math.sqrt(ratios[0] * ratios[1]))
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


def test_mode_families():
    assert [figures.mode_family(m) for m in ("eager", "triton", "triton-compiled", "liger",
                                             "quack-direct", "flaggems", "default",
                                             "max-autotune", "torchscript")] == [
        "eager", "ours", "ours", "peer", "peer", "peer", "compiler", "compiler", "compiler"]
    # peers are coloured apart from the compilers and from ours
    peers = {figures.mode_color(m) for m in ("flaggems", "liger", "quack")}
    others = {figures.mode_color(m) for m in figures.MODES}
    assert len(peers) == 3 and not peers & others


@pytest.fixture(scope="module")
def contested(tmp_path_factory):
    """The fixture's rows, a peer that beats triton on one softmax shape, and an fp16 matmul
    cell that no mode wins."""
    rows = fixture_rows() + [
        record("softmax", "liger", "1823x7", 2e6, 5e6, 5.0),
        record("matmul", "triton", "64x64x64", 1e9, 1e7, 0.5, dtype="fp16"),
    ]
    return load(write_job(tmp_path_factory.mktemp("contested") / "job", rows, ENV).parent)


def test_winners_per_cell(contested):
    table = figures.winners(contested).set_index(["kernel", "dtype", "shape_label"])
    expected = {  # cell -> (winner, family, best mode, its speedup, modes compared with eager)
        ("matmul", "bf16", "64x64x64"): ("default", "compiler", "default", 2.0, 3),
        ("matmul", "bf16", "128x128x128"): ("default", "compiler", "default", 8.0, 3),
        ("matmul", "fp16", "64x64x64"): ("eager", "eager", "triton", 0.5, 2),
        ("softmax", "bf16", "7x1823"): ("triton", "ours", "triton", 1.5, 2),
        ("softmax", "bf16", "1823x7"): ("liger", "peer", "liger", 5.0, 3),
    }
    assert len(table) == len(expected)
    for cell, (winner, family, best, speedup, compared) in expected.items():
        row = table.loc[cell]
        assert (row["winner"], row["family"], row["best_mode"]) == (winner, family, best), cell
        assert row["speedup"] == pytest.approx(speedup)
        assert row["modes_compared"] == compared


def test_who_wins_colours_cells_by_family(contested):
    fig = figures.who_wins(contested)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["bf16 fwd", "fp16 fwd"]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "matmul · 64x64x64", "matmul · 128x128x128", "softmax · 1823x7", "softmax · 7x1823"]
    (cells,) = by_gid(ax, "cells")
    families = list(figures.FAMILIES)
    codes = np.ma.filled(cells.get_array().reshape(4, 2).astype(float), np.nan)
    expected = [["compiler", "eager"], ["compiler", None], ["peer", None], ["ours", None]]
    for i, row in enumerate(expected):
        for j, family in enumerate(row):
            if family is None:
                assert np.isnan(codes[i, j])
            else:
                assert codes[i, j] == families.index(family)
    texts = {t.get_gid(): t.get_text() for t in ax.texts}
    assert texts["softmax:1823x7:0"] == "liger 5.00× (3)"
    assert texts["matmul:64x64x64:1"] == "eager (next triton 0.50×) (2)"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        label for label, _ in figures.FAMILIES.values()]
    assert has_caption(fig)
    plt.close(fig)


def test_gpu_comparison_needs_two_gpus(frame, capsys):
    assert figures.gpu_comparison(frame) is None
    assert figures.draw("gpu_comparison", frame) is None
    assert "skipped gpu_comparison" in capsys.readouterr().err


def test_gpu_comparison_pairs_the_same_cells(two_gpus):
    gpus, both = figures.gpu_pairs(two_gpus)
    assert gpus == ("NVIDIA H100 80GB HBM3", "NVIDIA H200")
    both = both.set_index(["kernel", "mode", "shape_label"])
    assert len(both) == 2  # the fp32 softmax row has no H100 twin
    assert both.loc[("matmul", "default", "64x64x64"), ["time_ms_1", "time_ms_2"]].tolist() == [
        0.01, 0.008]
    fig = figures.gpu_comparison(two_gpus)
    times, speedups = fig.axes[:2]
    (points,) = by_gid(times, "matmul:default")
    np.testing.assert_allclose(points.get_offsets(), [[0.01, 0.008]])
    (points,) = by_gid(speedups, "softmax:triton")
    np.testing.assert_allclose(points.get_offsets(), [[1.5, 1.2]])
    (ratio,) = by_gid(times, "bandwidth_ratio")
    np.testing.assert_allclose(np.asarray(ratio.get_ydata()) / np.asarray(ratio.get_xdata()),
                               3000.0 / 4000.0)
    for ax in (times, speedups):
        (identity,) = by_gid(ax, "identity")
        assert list(identity.get_xdata()) == list(identity.get_ydata())
    assert "H100" in times.get_xlabel() and "H200" in times.get_ylabel()
    plt.close(fig)


def test_roofline_draws_each_gpu_under_its_own_peaks(two_gpus):
    fig = figures.roofline(two_gpus)
    h100, h200 = fig.axes[:2]
    assert (h100.get_title(), h200.get_title()) == ("H100 80GB HBM3", "H200")
    for ax, copy, tflops in ((h100, 3000.0, 760.0), (h200, 4000.0, 800.0)):
        (roof,) = by_gid(ax, "roof")
        xs, ys = np.asarray(roof.get_xdata()), np.asarray(roof.get_ydata())
        np.testing.assert_allclose(ys, np.minimum(tflops, xs * copy / 1e3))
    plt.close(fig)


def drawn_figures(frame):
    """(name, figure) of every figure the rows can give, per-kernel ones for each kernel."""
    for name, (_, needs_kernel) in figures.FIGURES.items():
        for kernel in sorted(frame["kernel"].unique()) if needs_kernel else [None]:
            fig = figures.draw(name, frame, kernel)
            if fig is not None:
                yield f"{name}:{kernel}" if kernel else name, fig


def outside_the_canvas(fig) -> list[str]:
    """The titles, caption and marks whose rendered extent leaves the canvas."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    texts = [fig._suptitle, *fig.texts]
    texts += [t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
    clipped = []
    for text in texts:
        if text is None or not text.get_text() or not text.get_visible():
            continue
        box = text.get_window_extent(renderer)
        if box.x0 < 0 or box.y0 < 0 or box.x1 > fig.bbox.width or box.y1 > fig.bbox.height:
            clipped.append(text.get_text())
    return clipped


@pytest.mark.slow
def test_no_title_is_cut_off(frame, two_gpus):
    drawn = [*drawn_figures(frame), ("gpu_comparison", figures.gpu_comparison(two_gpus))]
    for name, fig in drawn:
        assert outside_the_canvas(fig) == [], name
        assert overlapping_tick_labels(fig) == [], name
        assert [t for t in fig.texts if t.get_gid() == "cpu_mark"] == [], name  # GPU records
        plt.close(fig)
    assert set(figures.FIGURES) == {name.split(":")[0] for name, _ in drawn}


def test_a_long_title_on_a_narrow_figure_wraps(frame):
    fig = figures.speedup_heatmap(frame, "matmul")  # two shapes: 6 inches wide
    title = fig._suptitle.get_text()
    assert "\n" in title  # one line would be wider than the figure
    assert " ".join(title.split()) == (
        "matmul: speedup vs eager per shape (GPU time, bf16 fwd, activations as inputs; "
        "red = slower, blue = faster)")
    assert outside_the_canvas(fig) == []
    plt.close(fig)


def test_figures_from_cpu_records_carry_the_mark(on_cpu, frame):
    assert figures.measured_on_cpu(on_cpu) and not figures.measured_on_cpu(frame)
    names = []
    for name, fig in drawn_figures(on_cpu):
        marks = [t for t in fig.texts if t.get_gid() == "cpu_mark"]
        assert [t.get_text() for t in marks] == [figures.CPU_MARK], name
        assert marks[0].get_fontsize() >= 12, name  # large enough to be seen
        assert outside_the_canvas(fig) == [], name
        names.append(name)
        plt.close(fig)
    assert "speedup_by_mode" in names and "who_wins" in names


def test_cli_without_records_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no results.jsonl under"):
        figures.main([str(tmp_path), str(tmp_path / "out")])


@pytest.mark.slow  # draws every figure of the committed records
@pytest.mark.skipif(not COMMITTED.exists(), reason="no committed figures")
def test_save_all_reproduces_the_committed_figures_byte_for_byte(tmp_path):
    written = figures.save_all(load_results(H100).frame, tmp_path)
    names = sorted(p.name for p in written)
    assert names == sorted(p.name for p in COMMITTED.iterdir() if p.suffix in (".png", ".svg"))
    assert {"speedup_by_mode.png", "speedup_by_mode.svg", "speedup_heatmap_matmul.png",
            "who_wins.png"} <= set(names)
    for name in names:
        assert (tmp_path / name).read_bytes() == (COMMITTED / name).read_bytes(), name


def overlapping_tick_labels(fig) -> list[str]:
    """Pairs of level tick labels of one axis whose rendered boxes overlap (unreadable), as text
    (a rotated label's box is no measure of its ink)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    clashes = []
    for ax in fig.axes:
        for axis, side in ((ax.xaxis, 0), (ax.yaxis, 1)):
            low, high = sorted(ax.get_xlim() if side == 0 else ax.get_ylim())
            ticks = [*axis.get_major_ticks(), *axis.get_minor_ticks()]
            shown = [tick.label1 for tick in ticks
                     if tick.label1.get_visible() and tick.label1.get_text()
                     and tick.label1.get_rotation() == 0 and low <= tick.get_loc() <= high]
            boxes = sorted(((t.get_window_extent(renderer), t.get_text()) for t in shown),
                           key=lambda pair: pair[0].bounds[side])  # fmt: skip
            for (first, a), (second, b) in zip(boxes, boxes[1:], strict=False):
                end = first.x1 if side == 0 else first.y1
                start = second.x0 if side == 0 else second.y0
                if end > start + 1:  # a pixel of slack for antialiasing
                    clashes.append(f"{a} / {b}")
    return clashes


def test_the_committed_h100_h200_comparison_has_readable_axes(tmp_path):
    """The two committed studies, drawn as one H100 against H200 figure: every title on the
    canvas and no tick label over another (the GPU-time axes span over a decade, where
    matplotlib's own log labels collided)."""
    for gpu in ("h100", "h200"):
        shutil.copytree(REPO_ROOT / "results" / "current" / gpu / "study", tmp_path / gpu)
    fig = figures.gpu_comparison(load(tmp_path))
    assert fig is not None
    assert outside_the_canvas(fig) == [] and overlapping_tick_labels(fig) == []
    plt.close(fig)
