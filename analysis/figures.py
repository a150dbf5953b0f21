"""The figures of the results, one function per figure, each `fn(frame[, kernel]) -> Figure`.

    python -m analysis.figures results/current/h100/study out/figures  # PNG + SVG

`frame` is analysis.load.load_results(...).frame (or load_wandb(...)). Unless a figure says
otherwise it shows the default view: ok rows whose activations are ordinary inputs, so CUDA-graph
modes pay their input copies. Every figure carries the caption line of analysis.load.caption, its
titles wrapped to fit the canvas, and, when any row was timed on a CPU, the mark "CPU: not
representative". Output is byte-identical across reruns (fixed SVG hash salt, no dates, fixed dpi).

Functions (FIGURES lists them for save_all; `draw(name, frame[, kernel])` gives one or None):
    who_wins              the winning mode and its family per kernel x shape x dtype x pass
    speedup_by_mode       geomean speedup over eager per mode, by GPU time and by call latency
    speedup_heatmap       mode x shape speedups of one kernel
    roofline              achieved TFLOP/s under the measured copy and matmul roofs, per GPU
    scaling               throughput against problem size of one kernel
    compile_break_even    calls needed to repay the cold compile
    latency_vs_gpu_time   call latency against GPU time on small shapes
    gpu_comparison        the same cells on two GPUs (None with one GPU)
"""

import argparse
import math
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator  # noqa: E402

from analysis.load import caption, drop_noisy, geomean, load_results  # noqa: E402
from experiments import registry  # noqa: E402
from experiments.peers import DIRECT_SUFFIX, PEERS  # noqa: E402

matplotlib.rcParams["svg.hashsalt"] = "triton-vs-compile"  # SVG ids stay the same across reruns


def _bundled_fonts_only() -> None:
    """Draw with matplotlib's own font files, never a system copy of the same family.

    Which file `findfont` picks for "DejaVu Sans" depends on the order of the machine's font
    cache: a cache that lists /usr/share/fonts' DejaVu Sans (another version) gives other SVG
    glyph ids and PNG bytes, which broke the byte-for-byte test on a machine whose cache had
    been rebuilt without matplotlib's fonts. Registering the bundled files and dropping system
    fonts of the same families makes the figures the same on any machine.
    """
    from matplotlib import font_manager

    bundled = Path(matplotlib.get_data_path(), "fonts", "ttf")
    manager = font_manager.fontManager
    known = {Path(f.fname) for f in manager.ttflist}
    for path in sorted(bundled.glob("*.ttf")):
        if path not in known:
            manager.addfont(str(path))
    families = {f.name for f in manager.ttflist if Path(f.fname).parent == bundled}
    manager.ttflist = [
        f for f in manager.ttflist if f.name not in families or Path(f.fname).parent == bundled
    ]
    manager._findfont_cached.cache_clear()  # findfont remembers earlier answers


_bundled_fonts_only()
DPI = 150
PNG_METADATA = {"Software": None}
SVG_METADATA = {"Date": None, "Creator": None}
STYLE = {**sns.axes_style("whitegrid"), **sns.plotting_context("notebook", font_scale=0.8)}

MODES = [  # plot order: the baseline, the compilers, then the hand-written kernels
    "eager",
    "torchscript",
    "default",
    "reduce-overhead",
    "max-autotune-no-cudagraphs",
    "max-autotune",
    "triton",
    "triton-compiled",
]
_TAB10 = sns.color_palette("tab10").as_hex()
MODE_COLORS = dict(zip(MODES, [_TAB10[i] for i in (7, 5, 0, 1, 2, 4, 3, 6)], strict=True))
# The peer libraries (experiments/peers.py), apart from the compilers: tab10's two unused hues and
# near-black; each `-direct` row (the bare kernel launch) in a light tint of its library's hue.
MODE_COLORS |= {"flaggems": _TAB10[8], "flaggems-direct": "#dbdb8d",
                "liger": _TAB10[9], "liger-direct": "#9edae5",
                "quack": "#1a1a1a", "quack-direct": "#636363"}  # fmt: skip
SMALL_MS = 0.1  # latency_vs_gpu_time: calls shorter than this are where launch overhead shows
SPEEDUP_TICKS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2,
                 3, 5, 7, 10, 20, 50]  # down to 0.001: a CPU run's interpreted Triton
# who_wins colours each cell by the winner's family: ours, a peer library, a compiler, or eager
FAMILIES = {  # family -> (legend label, colour)
    "ours": ("ours: triton, triton-compiled", MODE_COLORS["triton"]),
    "peer": ("peer library: flaggems, liger, quack", MODE_COLORS["flaggems"]),
    "compiler": ("compiler: torch.compile modes, torchscript", MODE_COLORS["default"]),
    "eager": ("eager: no mode beat it", MODE_COLORS["eager"]),
}
SHORT_MODES = {"max-autotune-no-cudagraphs": "max-autotune-no-cg"}  # who_wins cells are narrow
CPU_MARK = "CPU: not representative"
CPU_MARK_COLOR = "#c0392b"


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _marker(kernel: str) -> str:
    spec = registry.OPS.get(kernel)
    return spec.markers.get("marker", "o") if spec else "o"


def default_view(frame: pd.DataFrame) -> pd.DataFrame:
    """ok rows measured with the activations as ordinary inputs."""
    return frame[(frame["status"] == "ok") & (frame["activations"] == "inputs")]


def ordered_modes(modes) -> list[str]:
    present = set(modes)
    return [m for m in MODES if m in present] + sorted(present - set(MODES))


def mode_color(mode: str) -> str:
    return MODE_COLORS.get(mode, "#555555")


def mode_family(mode: str) -> str:
    """A mode's family: eager, ours (the hand-written kernels), peer (a peer library) or
    compiler (torch.compile's modes, TorchScript)."""
    if mode == "eager":
        return "eager"
    if mode.startswith("triton"):
        return "ours"
    if mode.removesuffix(DIRECT_SUFFIX) in PEERS:
        return "peer"
    return "compiler"


def measured_on_cpu(frame: pd.DataFrame) -> bool:
    """Whether any row was timed on a CPU (device cpu, or a cpu-* timer): its times say nothing
    about a GPU, so every figure and the report made from it carry CPU_MARK."""
    device = frame["device"].astype("string").fillna("")
    timer = frame["timer"].astype("string").fillna("")
    return bool((device.str.startswith("cpu") | timer.str.startswith("cpu")).any())


def short_gpu(name) -> str:
    return str(name).removeprefix("NVIDIA ") if isinstance(name, str) else "?"


def ordered_shapes(rows: pd.DataFrame) -> list[str]:
    """Shape labels from the smallest problem to the largest (FLOPs, then bytes, then label)."""
    sizes = rows.groupby("shape_label")[["flops", "min_bytes"]].first().fillna(0).reset_index()
    return list(sizes.sort_values(["flops", "min_bytes", "shape_label"])["shape_label"])


def _figure(nrows=1, ncols=1, figsize=(8, 5), **kwargs):
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(nrows, ncols, figsize=figsize, squeeze=False, **kwargs)
    fig.set_layout_engine("constrained", rect=(0, 0.04, 1, 0.96))  # _finish fits the caption
    return fig, axes


def _wrap_to_width(text, width_px: float, renderer) -> None:
    """Re-wrap a title's lines until the rendered text is at most `width_px` wide.

    The text's width does not depend on where the layout puts it, so this runs before the
    layout; tests/test_figures.py checks the rendered extents against the canvas.
    """
    original = text.get_text()
    if not original or text.get_window_extent(renderer).width <= width_px:
        return
    lines = original.splitlines()
    chars = int(max(map(len, lines)) * width_px / text.get_window_extent(renderer).width) + 1
    while chars > 8:
        text.set_text("\n".join(textwrap.fill(line, chars, break_on_hyphens=False)
                                for line in lines))
        if text.get_window_extent(renderer).width <= width_px:
            return
        chars -= 1


def _mark_cpu(fig, renderer) -> None:
    """CPU_MARK across the middle of the figure, as large as fits the canvas."""
    mark = fig.text(0.5, 0.5, CPU_MARK, ha="center", va="center", rotation=20, fontsize=40,
                    weight="bold", color=CPU_MARK_COLOR, alpha=0.35, zorder=10, gid="cpu_mark")
    box = mark.get_window_extent(renderer)
    scale = min(1.0, 0.85 * fig.bbox.width / box.width, 0.85 * fig.bbox.height / box.height)
    mark.set_fontsize(40 * scale)


def _finish(fig, frame: pd.DataFrame, title: str):
    """Suptitle and caption, wrapped to the canvas (axes titles to their column), and the CPU
    mark when the records were timed on a CPU."""
    renderer = fig.canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    _wrap_to_width(fig.suptitle(title), 0.97 * width, renderer)
    note = fig.text(0.5, 0.01, caption(frame), ha="center", va="bottom", fontsize=7,
                    color="0.35", gid="caption")
    _wrap_to_width(note, 0.97 * width, renderer)
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if spec is None:  # a colorbar
            continue
        columns = spec.get_gridspec().ncols
        span = spec.colspan.stop - spec.colspan.start
        _wrap_to_width(ax.title, 0.9 * width * span / columns, renderer)
    # the layout (left, bottom, width, height) keeps clear of the caption, however many lines
    bottom = (0.01 * height + note.get_window_extent(renderer).height + 4) / height
    fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))
    if measured_on_cpu(frame):
        _mark_cpu(fig, renderer)
    return fig


def _require(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    if rows.empty:
        raise ValueError(f"no rows to plot for {what}")
    return rows


def _describe(rows: pd.DataFrame) -> str:
    dtypes = ", ".join(sorted(rows["dtype"].dropna().unique()))
    passes = ", ".join(sorted(rows["pass"].dropna().unique()))
    return f"{dtypes} {passes}"


def _ratio_text(value: float) -> str:
    """A speedup as a label: two decimals, or one significant digit below 0.01 (a CPU run)."""
    return f"{value:.2f}" if value >= 0.01 else f"{value:.1g}"


def _speedup_axis(ax, low: float, high: float) -> None:
    ax.set_yscale("log")
    low, high = min(low, 1.0) / 1.25, max(high, 1.0) * 1.25
    ax.set_ylim(low, high)
    ax.yaxis.set_major_locator(FixedLocator([t for t in SPEEDUP_TICKS if low <= t <= high]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.yaxis.set_minor_locator(NullLocator())


# ---------------------------------------------------------------------------------------------
# 1. Speedup by mode
# ---------------------------------------------------------------------------------------------
SPEEDUP_METRICS = [  # (column, what it measures): speedup_by_mode's rows
    ("speedup_vs_eager", "GPU time"),
    ("latency_speedup_vs_eager", "call latency"),
]


def speedup_by_mode(frame: pd.DataFrame):
    """Geomean speedup over eager per kernel and mode: by GPU time (top row) and by call latency
    (bottom row, where the records carry it); whiskers span min..max over the shapes."""
    view = default_view(frame)
    rows = _require(view.dropna(subset=["speedup_vs_eager"]), "speedup_by_mode")
    metrics = [(column, what) for column, what in SPEEDUP_METRICS if rows[column].notna().any()]
    kernels = sorted(rows["kernel"].unique())
    fig, axes = _figure(len(metrics), len(kernels), sharex="col", sharey="row",
                        figsize=(2.2 + 2.6 * len(kernels), 1.0 + 4.0 * len(metrics)))
    for row, (column, what) in enumerate(metrics):
        low, high = rows[column].min(), rows[column].max()
        for ax, kernel in zip(axes[row], kernels, strict=True):
            of_kernel = rows[rows["kernel"] == kernel]
            modes = ordered_modes(of_kernel["mode"])
            for x, mode in enumerate(modes):
                speedups = of_kernel.loc[of_kernel["mode"] == mode, column].dropna()
                if speedups.empty:
                    continue
                mean = geomean(list(speedups))
                ax.bar(x, mean - 1.0, bottom=1.0, width=0.7, color=mode_color(mode), gid=mode)
                whiskers = [[max(0.0, mean - speedups.min())], [max(0.0, speedups.max() - mean)]]
                ax.errorbar(x, mean, yerr=whiskers, fmt="none", ecolor="0.25", capsize=3, lw=1)
                ax.annotate(_ratio_text(mean),
                            (x, speedups.max() if mean >= 1 else speedups.min()),
                            xytext=(0, 3 if mean >= 1 else -3), textcoords="offset points",
                            ha="center", va="bottom" if mean >= 1 else "top", fontsize=7)
            ax.axhline(1.0, color="black", lw=1, ls="--", gid="parity")
            ax.set_xticks(range(len(modes)), modes, rotation=40, ha="right")
            if row == 0:
                ax.set_title(f"{kernel} ({of_kernel['shape_label'].nunique()} shapes)")
            ax.grid(axis="x", visible=False)
            _speedup_axis(ax, low, high)
        axes[row][0].set_ylabel(
            f"{what}: speedup vs eager (log)\nbar: geomean over shapes, whiskers: min–max")
    measured = " and ".join(what for _, what in metrics)
    return _finish(fig, frame, f"Speedup over eager by mode, {measured} ({_describe(rows)}, "
                               "activations as inputs; above 1 = faster than eager)")


# ---------------------------------------------------------------------------------------------
# 2. Speedup heatmap
# ---------------------------------------------------------------------------------------------
def speedup_table(frame: pd.DataFrame, kernel: str) -> pd.DataFrame:
    """mode x shape speedup_vs_eager of one kernel (geomean if a cell was measured twice)."""
    rows = default_view(frame)
    rows = _require(rows[rows["kernel"] == kernel].dropna(subset=["speedup_vs_eager"]),
                    f"speedup_heatmap of {kernel}")
    table = rows.groupby(["mode", "shape_label"])["speedup_vs_eager"].agg(
        lambda s: geomean(list(s))).unstack()
    return table.reindex(index=ordered_modes(rows["mode"]), columns=ordered_shapes(rows))


def speedup_heatmap(frame: pd.DataFrame, kernel: str):
    """Mode x shape heatmap of speedup_vs_eager, colored on a log2 scale centered on 1."""
    table = speedup_table(frame, kernel).astype(float)
    fig, axes = _figure(figsize=(3.5 + 1.25 * table.shape[1], 1.8 + 0.42 * table.shape[0]))
    ax = axes[0][0]
    log2 = np.log2(table)
    extent = max(1.0, float(np.nanmax(np.abs(log2.to_numpy()))))
    labels = table.map(lambda v: "" if math.isnan(v) else _ratio_text(v))
    sns.heatmap(log2, annot=labels, fmt="", cmap="RdBu", center=0, vmin=-extent, vmax=extent,
                linewidths=0.5, ax=ax, cbar_kws={"label": "speedup vs eager (log scale)"})
    if extent <= 4:  # up to 16×: powers of two
        ticks = [2.0**k for k in range(-math.floor(extent), math.floor(extent) + 1)]
    else:  # a CPU run's interpreted Triton: powers of ten
        decades = math.floor(extent * math.log10(2))
        ticks = [10.0**k for k in range(-decades, decades + 1)]
    colorbar = ax.collections[0].colorbar
    colorbar.set_ticks([math.log2(t) for t in ticks], labels=[f"{t:g}×" for t in ticks])
    ax.grid(False)  # the style's grid would show through the cells that were not measured
    ax.set_xlabel("shape (smallest problem first)")
    ax.set_ylabel("mode")
    ax.tick_params(axis="x", rotation=30)
    plt.setp(ax.get_xticklabels(), ha="right")
    rows = default_view(frame)
    return _finish(fig, frame, f"{kernel}: speedup vs eager per shape (GPU time, "
                               f"{_describe(rows[rows['kernel'] == kernel])}, activations as "
                               "inputs; red = slower, blue = faster)")


# ---------------------------------------------------------------------------------------------
# 3. Roofline
# ---------------------------------------------------------------------------------------------
def measured_peaks(frame: pd.DataFrame) -> tuple[float, float]:
    """(copy GB/s, bf16 matmul TFLOP/s): the median of the jobs' measured peaks (NaN if none)."""
    return float(frame["peak_copy_gbps"].median()), float(frame["peak_bf16_tflops"].median())


def _scatter_by_kernel_and_mode(ax, rows: pd.DataFrame, x: pd.Series, y: pd.Series) -> None:
    """One scatter per (kernel, mode): color = mode, marker = kernel."""
    for kernel in sorted(rows["kernel"].unique()):
        for mode in ordered_modes(rows["mode"]):
            pick = (rows["kernel"] == kernel) & (rows["mode"] == mode)
            if pick.any():
                ax.scatter(x[pick], y[pick], s=28, alpha=0.85, color=mode_color(mode),
                           marker=_marker(kernel), edgecolors="white",
                           linewidths=0.4, gid=f"{kernel}:{mode}")


def _mode_and_kernel_handles(rows: pd.DataFrame) -> list:
    """Legend entries matching _scatter_by_kernel_and_mode."""
    handles = [Line2D([], [], ls="", marker="o", color=mode_color(m), label=m)
               for m in ordered_modes(rows["mode"])]
    handles += [Line2D([], [], ls="", marker=_marker(k), color="0.4", label=k)
                for k in sorted(rows["kernel"].unique())]
    return handles


def roofline(frame: pd.DataFrame):
    """Achieved TFLOP/s against FLOP per minimum byte, under the measured copy and matmul roofs
    of the GPU the rows ran on (env.json's peaks); one panel per GPU."""
    rows = default_view(frame).dropna(subset=["flops", "min_bytes", "tflops"])
    rows = _require(rows[(rows["tflops"] > 0) & (rows["min_bytes"] > 0)], "roofline")
    gpus = sorted(rows["gpu_name"].fillna("?").unique())
    fig, axes = _figure(1, len(gpus), figsize=(9 + 5 * (len(gpus) - 1), 5.8), sharey=True)
    for ax, gpu in zip(axes[0], gpus, strict=True):
        of_gpu = rows[rows["gpu_name"].fillna("?") == gpu]
        intensity = of_gpu["flops"] / of_gpu["min_bytes"]
        _scatter_by_kernel_and_mode(ax, of_gpu, intensity, of_gpu["tflops"])
        copy_gbps, peak_tflops = measured_peaks(of_gpu)
        handles = []
        if math.isfinite(copy_gbps) and math.isfinite(peak_tflops):
            ridge = peak_tflops * 1e3 / copy_gbps  # FLOP/byte where the two roofs meet
            xs = np.geomspace(min(intensity.min(), ridge) / 3, max(intensity.max(), ridge) * 3,
                              256)
            xs = np.sort(np.append(xs, ridge))
            roof = np.minimum(peak_tflops, xs * copy_gbps / 1e3)
            ax.plot(xs, roof, color="black", lw=1.5, gid="roof")
            ax.axvline(ridge, color="0.4", lw=1, ls=":", gid="ridge")
            ax.annotate(f"ridge {ridge:.0f} FLOP/B", (ridge, peak_tflops), xytext=(-4, 4),
                        textcoords="offset points", ha="right", fontsize=7, color="0.3")
            handles.append(Line2D([], [], color="black", label=(
                f"measured roofs: {copy_gbps:.0f} GB/s copy,\n{peak_tflops:.0f} TFLOP/s bf16 "
                "matmul")))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / minimum bytes moved)")
        if len(gpus) > 1:
            ax.set_title(short_gpu(gpu))
        if ax is axes[0][-1]:  # the modes' and kernels' legend, outside the last panel
            ax.legend(handles=handles + _mode_and_kernel_handles(rows), loc="upper left",
                      bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
        elif handles:
            ax.legend(handles=handles, loc="lower right", fontsize=7, frameon=False)
    axes[0][0].set_ylabel("achieved TFLOP/s")
    return _finish(fig, frame, f"Roofline ({_describe(rows)}, activations as inputs; "
                               "color = mode, marker = kernel)")


# ---------------------------------------------------------------------------------------------
# 4. Scaling
# ---------------------------------------------------------------------------------------------
def scaling_axes(kernel: str) -> tuple[str, str, str, str]:
    """(size column, size label, throughput column, throughput label) for a kernel."""
    if registry.is_memory_bound(kernel):  # bytes moved and GB/s
        return "min_bytes", "minimum bytes moved", "gbps", "achieved GB/s"
    return "flops", "FLOPs per call", "tflops", "achieved TFLOP/s"


def scaling(frame: pd.DataFrame, kernel: str):
    """Throughput against problem size, one line per mode.

    When two shapes have the same size (conv, softmax) the x axis lists the shapes instead,
    smallest first, so their lines do not fold back on themselves.
    """
    size, size_label, metric, metric_label = scaling_axes(kernel)
    rows = default_view(frame)
    rows = _require(rows[rows["kernel"] == kernel].dropna(subset=[size, metric]),
                    f"scaling of {kernel}")
    shapes = ordered_shapes(rows)
    sizes = rows.groupby("shape_label")[size].first()
    numeric = sizes.nunique() == len(shapes)
    fig, axes = _figure(figsize=(8.5, 5))
    ax = axes[0][0]
    for mode in ordered_modes(rows["mode"]):
        of_mode = rows[rows["mode"] == mode].groupby("shape_label")[metric].mean()
        of_mode = of_mode.reindex([s for s in shapes if s in of_mode.index])
        xs = list(sizes[of_mode.index]) if numeric else [shapes.index(s) for s in of_mode.index]
        ax.plot(xs, list(of_mode), marker="o", ms=4, color=mode_color(mode), label=mode, gid=mode)
    copy_gbps, peak_tflops = measured_peaks(rows)
    peak = copy_gbps if metric == "gbps" else peak_tflops
    if math.isfinite(peak):
        ax.axhline(peak, color="black", lw=1, ls="--", gid="peak")
        ax.annotate(f"measured peak {peak:.0f}", (0, peak), xycoords=("axes fraction", "data"),
                    xytext=(4, -11), textcoords="offset points", fontsize=7)
    if numeric:
        ax.set_xscale("log")
        ax.set_xlabel(f"problem size ({size_label}, log scale)")
    else:
        ax.set_xticks(range(len(shapes)), shapes, rotation=30, ha="right")
        ax.set_xlabel(f"shape, by {size_label} (several shapes share a size)")
    ax.set_ylabel(metric_label)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    return _finish(fig, frame, f"{kernel}: {metric_label} against problem size "
                               f"({_describe(rows)}, activations as inputs)")


# ---------------------------------------------------------------------------------------------
# 5. Compile break-even
# ---------------------------------------------------------------------------------------------
def break_even_calls(frame: pd.DataFrame) -> pd.DataFrame:
    """Calls after which the cold compile has paid for itself; inf where the mode is not faster.

    break_even_calls = compile_cold_s / ((eager_time_ms_p50 - time_ms_p50) / 1e3), per row.
    """
    rows = default_view(frame)
    rows = rows[(rows["mode"] != "eager")].dropna(
        subset=["compile_cold_s", "time_ms_p50", "eager_time_ms_p50"]).copy()
    saved_s = (rows["eager_time_ms_p50"] - rows["time_ms_p50"]) / 1e3
    rows["break_even_calls"] = np.where(saved_s > 0, rows["compile_cold_s"] / saved_s.where(
        saved_s > 0, 1.0), math.inf)
    return rows


def compile_break_even(frame: pd.DataFrame):
    """Per kernel and mode, one point per shape: calls needed to repay the cold compile."""
    rows = _require(break_even_calls(frame), "compile_break_even")
    kernels = sorted(rows["kernel"].unique())
    finite = rows.loc[np.isfinite(rows["break_even_calls"]), "break_even_calls"]
    top = 10 ** math.ceil(math.log10(finite.max())) if len(finite) else 10
    bottom = 10 ** math.floor(math.log10(finite.min())) if len(finite) else 1
    never_y = top * 10  # the "never" band sits a decade above the largest finite value
    fig, axes = _figure(1, len(kernels), figsize=(2.2 + 2.6 * len(kernels), 4.8), sharey=True)
    for ax, kernel in zip(axes[0], kernels, strict=True):
        of_kernel = rows[rows["kernel"] == kernel]
        shapes = ordered_shapes(of_kernel)
        modes = ordered_modes(of_kernel["mode"])
        for x, mode in enumerate(modes):
            of_mode = of_kernel[of_kernel["mode"] == mode]
            offsets = {s: (i - (len(shapes) - 1) / 2) * 0.5 / len(shapes)
                       for i, s in enumerate(shapes)}
            xs = x + of_mode["shape_label"].map(offsets)
            calls = of_mode["break_even_calls"]
            never = ~np.isfinite(calls)
            ax.scatter(xs[~never], calls[~never], s=18, color=mode_color(mode), gid="break_even")
            ax.scatter(xs[never], [never_y] * int(never.sum()), s=30, marker="x",
                       color=mode_color(mode), gid="never")
        ax.axhline(math.sqrt(top * never_y), color="0.6", lw=0.8, gid="never_divider")
        ax.set_xticks(range(len(modes)), modes, rotation=40, ha="right")
        ax.set_title(kernel)
        ax.grid(axis="x", visible=False)
        ax.set_yscale("log")
        ax.set_ylim(bottom / 2, never_y * 3)
        decades = [10**k for k in range(round(math.log10(bottom)), round(math.log10(top)) + 1)]
        ax.yaxis.set_major_locator(FixedLocator(decades + [never_y]))
        ax.yaxis.set_major_formatter(FuncFormatter(
            lambda v, _: "never" if v == never_y else f"$10^{{{round(math.log10(v))}}}$"))
        ax.yaxis.set_minor_locator(NullLocator())
    axes[0][0].set_ylabel("calls to repay the cold compile (log)\n"
                          "= compile_cold_s / (eager − mode GPU time per call)")
    return _finish(fig, frame, "Compile break-even, one point per shape (× at \"never\": not "
                               "faster than eager, the compile never pays off)")


# ---------------------------------------------------------------------------------------------
# 6. Call latency against GPU time
# ---------------------------------------------------------------------------------------------
def latency_vs_gpu_time(frame: pd.DataFrame):
    """Small shapes: wall-clock call latency against GPU time; above y = x the CPU path rules."""
    rows = default_view(frame).dropna(subset=["time_ms_p50", "call_latency_us_p50"])
    rows = _require(rows[rows["time_ms_p50"] < SMALL_MS], "latency_vs_gpu_time")
    gpu_us = rows["time_ms_p50"] * 1e3
    fig, axes = _figure(figsize=(8.5, 6))
    ax = axes[0][0]
    _scatter_by_kernel_and_mode(ax, rows, gpu_us, rows["call_latency_us_p50"])
    low = min(gpu_us.min(), rows["call_latency_us_p50"].min()) / 1.5
    high = max(gpu_us.max(), rows["call_latency_us_p50"].max()) * 1.5
    ax.plot([low, high], [low, high], color="black", lw=1, ls="--", gid="identity")
    ax.annotate("latency = GPU time", (low * 2, low * 2), xytext=(6, -2),
                textcoords="offset points", ha="left", va="top", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_aspect("equal")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(FixedLocator([t for t in (2, 5, 10, 20, 50, 100, 200, 500, 1000)
                                             if low <= t <= high]))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_locator(NullLocator())
    ax.set_xlabel("GPU time per call (µs, CUDA events, p50)")
    ax.set_ylabel("call latency (µs, wall clock back-to-back, p50)")
    handles = _mode_and_kernel_handles(rows)
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7,
              frameon=False)
    return _finish(fig, frame, f"Call latency against GPU time, shapes under "
                               f"{SMALL_MS * 1e3:.0f} µs of GPU time\n(above the dashed line, "
                               "launch and CPU overhead set the pace)")


# ---------------------------------------------------------------------------------------------
# 7. Who wins where
# ---------------------------------------------------------------------------------------------
CELL = ["gpu_name", "kernel", "dtype", "pass", "shape_label"]


def winners(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (GPU, kernel, dtype, pass, shape): the fastest mode by speedup_vs_eager
    (geomean where a mode measured the cell twice) and its family, or eager where no mode beat
    1.0; `speedup` is the best mode's speedup over eager, `modes_compared` counts eager too."""
    rows = default_view(frame).dropna(subset=["speedup_vs_eager"])
    rows = rows[rows["mode"] != "eager"].assign(gpu_name=rows["gpu_name"].fillna("?"))
    if rows.empty:
        return pd.DataFrame(columns=[*CELL, "winner", "family", "best_mode", "speedup",
                                     "modes_compared"])
    per_mode = rows.groupby([*CELL, "mode"])["speedup_vs_eager"].agg(
        lambda s: geomean(list(s))).reset_index()
    order = {mode: i for i, mode in enumerate(ordered_modes(per_mode["mode"]))}
    per_mode["order"] = per_mode["mode"].map(order)  # ties go to the earlier mode in MODES
    per_mode = per_mode.sort_values([*CELL, "speedup_vs_eager", "order"],
                                    ascending=[True] * len(CELL) + [False, True])
    cells = per_mode.groupby(CELL, sort=True).agg(
        best_mode=("mode", "first"), speedup=("speedup_vs_eager", "first"),
        modes_compared=("mode", "size")).reset_index()
    cells["modes_compared"] += 1  # eager
    cells["winner"] = cells["best_mode"].where(cells["speedup"] > 1.0, "eager")
    cells["family"] = cells["winner"].map(mode_family)
    return cells[[*CELL, "winner", "family", "best_mode", "speedup", "modes_compared"]]


def _tint(color: str, amount: float = 0.55) -> str:
    """The colour mixed with white, light enough for black text on it."""
    return mcolors.to_hex(np.array(mcolors.to_rgb(color)) * (1 - amount) + amount)


def who_wins(frame: pd.DataFrame):
    """Per kernel x shape (rows) and dtype x pass (columns, per GPU where there are several):
    the fastest mode by GPU time, coloured by its family (ours, a peer library, a compiler,
    eager), with its speedup over eager and how many modes the cell compared."""
    cells = _require(winners(frame), "who_wins")
    several_gpus = cells["gpu_name"].nunique() > 1
    columns = sorted(set(zip(cells["gpu_name"], cells["dtype"], cells["pass"], strict=True)),
                     key=lambda c: (c[1], c[2], c[0]))  # the GPUs of a dtype and pass side by side
    view = default_view(frame)
    lines = []  # (kernel, shape) in plot order: kernels by name, shapes smallest first
    for kernel in sorted(cells["kernel"].unique()):
        measured = set(cells.loc[cells["kernel"] == kernel, "shape_label"])
        lines += [(kernel, shape) for shape in ordered_shapes(view[view["kernel"] == kernel])
                  if shape in measured]
    families = list(FAMILIES)
    codes = np.full((len(lines), len(columns)), np.nan)
    fig, axes = _figure(figsize=(5.2 + 2.3 * len(columns), 1.9 + 0.26 * len(lines)))
    ax = axes[0][0]
    for cell in cells.to_dict("records"):
        i = lines.index((cell["kernel"], cell["shape_label"]))
        j = columns.index((cell["gpu_name"], cell["dtype"], cell["pass"]))
        codes[i, j] = families.index(cell["family"])
        best = SHORT_MODES.get(cell["best_mode"], cell["best_mode"])
        speedup = _ratio_text(cell["speedup"])
        label = (f"{best} {speedup}×" if cell["winner"] != "eager"
                 else f"eager (next {best} {speedup}×)")
        ax.text(j + 0.5, i + 0.5, f"{label} ({cell['modes_compared']})", ha="center",
                va="center", fontsize=6.5, gid=f"{cell['kernel']}:{cell['shape_label']}:{j}")
    colormap = mcolors.ListedColormap([_tint(FAMILIES[f][1]) for f in families])
    ax.pcolormesh(np.ma.masked_invalid(codes), cmap=colormap, vmin=-0.5,
                  vmax=len(families) - 0.5, edgecolors="white", linewidth=1.5, gid="cells")
    for i in range(1, len(lines)):
        if lines[i][0] != lines[i - 1][0]:
            ax.axhline(i, color="0.2", lw=1.2, gid="kernel_divider")
    ax.set_xlim(0, len(columns))
    ax.set_ylim(len(lines), 0)  # the first row at the top
    ax.set_yticks(np.arange(len(lines)) + 0.5, [f"{k} · {s}" for k, s in lines], fontsize=7)
    ax.set_xticks(np.arange(len(columns)) + 0.5,
                  [f"{short_gpu(g)} · {d} {p}" if several_gpus else f"{d} {p}"
                   for g, d, p in columns])
    ax.tick_params(top=True, labeltop=True, bottom=False, labelbottom=False, length=0)
    ax.grid(False)
    ax.legend(handles=[Patch(color=_tint(FAMILIES[f][1]), label=FAMILIES[f][0])
                       for f in families], loc="upper left", bbox_to_anchor=(1.01, 1),
              fontsize=7, frameon=False, title="winner's family\n(cell: mode, speedup over "
              "eager,\n(modes compared, eager included))", title_fontsize=7,
              alignment="left")
    return _finish(fig, frame, f"Who wins where: the fastest mode per shape by GPU time "
                               f"({_describe(cells)}, activations as inputs)")


# ---------------------------------------------------------------------------------------------
# 8. One GPU against another
# ---------------------------------------------------------------------------------------------
SAME_CELL = ["kernel", "mode", "dtype", "pass", "shape_label", "epilogue", "memory_format"]


def gpu_pairs(frame: pd.DataFrame) -> tuple[tuple[str, str] | None, pd.DataFrame]:
    """((first GPU, second GPU), one row per cell both measured) with the GPU time (median) and
    speedup over eager (geomean) of each as time_ms_<n> and speedup_<n>, n = 1, 2; (None, empty)
    when the records hold fewer than two GPUs. The first two GPU names in sorted order."""
    rows = default_view(frame).dropna(subset=["gpu_name", "time_ms_p50", "speedup_vs_eager"])
    gpus = sorted(rows["gpu_name"].unique())
    if len(gpus) < 2:
        return None, pd.DataFrame()
    rows = rows.assign(epilogue=rows["epilogue"].fillna("-"),
                       memory_format=rows["memory_format"].fillna("-"))
    sides = []
    for n, gpu in enumerate(gpus[:2], start=1):
        of_gpu = rows[rows["gpu_name"] == gpu].groupby(SAME_CELL).agg(
            **{f"time_ms_{n}": ("time_ms_p50", "median"),
               f"speedup_{n}": ("speedup_vs_eager", lambda s: geomean(list(s)))})
        sides.append(of_gpu)
    both = sides[0].join(sides[1], how="inner").reset_index()
    return (gpus[0], gpus[1]), both


def gpu_comparison(frame: pd.DataFrame):
    """The cells measured on two GPUs: GPU time of one against the other (with the ratio of
    their measured copy bandwidths, what a memory-bound kernel would gain), and speedup over
    eager on each (off the diagonal, a mode's lead changed with the GPU). None when the records
    hold one GPU or the two share no cell."""
    gpus, both = gpu_pairs(frame)
    if gpus is None or both.empty:
        return None
    first, second = gpus
    view = default_view(frame)
    fig, axes = _figure(1, 2, figsize=(13, 6))
    times, speedups = axes[0]
    _scatter_by_kernel_and_mode(times, both, both["time_ms_1"], both["time_ms_2"])
    _scatter_by_kernel_and_mode(speedups, both, both["speedup_1"], both["speedup_2"])
    copy_1, _ = measured_peaks(view[view["gpu_name"] == first])
    copy_2, _ = measured_peaks(view[view["gpu_name"] == second])
    for ax, x, y in ((times, both["time_ms_1"], both["time_ms_2"]),
                     (speedups, both["speedup_1"], both["speedup_2"])):
        low, high = min(x.min(), y.min()) / 1.5, max(x.max(), y.max()) * 1.5
        ax.plot([low, high], [low, high], color="black", lw=1, ls="--", gid="identity")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        ax.set_aspect("equal")
    # GPU time in 1-2-5 steps of plain ms: on a log axis spanning under two decades matplotlib
    # labels the minor ticks too, and those labels overlap
    for axis in (times.xaxis, times.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_locator(NullLocator())
    for axis in (speedups.xaxis, speedups.yaxis):
        low, high = speedups.get_xlim()
        axis.set_major_locator(FixedLocator([t for t in SPEEDUP_TICKS if low <= t <= high]))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}×"))
        axis.set_minor_locator(NullLocator())
    if math.isfinite(copy_1) and math.isfinite(copy_2):
        ratio = copy_1 / copy_2
        low, high = times.get_xlim()
        times.plot([low, high], [low * ratio, high * ratio], color="0.45", lw=1, ls=":",
                   gid="bandwidth_ratio")
        anchor = high / 40  # the note sits under the dotted line, right of this point
        times.annotate(f"time × {ratio:.2f}: the ratio of the measured\n"
                       f"copy bandwidths ({copy_1:.0f} vs {copy_2:.0f} GB/s)",
                       (anchor, anchor * ratio), xytext=(6, -6), textcoords="offset points",
                       ha="left", va="top", fontsize=7, color="0.35")
    names = short_gpu(first), short_gpu(second)
    times.set_xlabel(f"GPU time per call on {names[0]} (ms, p50)")
    times.set_ylabel(f"GPU time per call on {names[1]} (ms, p50)")
    times.set_title("GPU time (below the dashed line: faster on the second)")
    speedups.set_xlabel(f"speedup vs eager on {names[0]}")
    speedups.set_ylabel(f"speedup vs eager on {names[1]}")
    speedups.set_title("speedup over eager on each GPU")
    speedups.legend(handles=_mode_and_kernel_handles(both), loc="upper left",
                    bbox_to_anchor=(1.01, 1), fontsize=7, frameon=False)
    return _finish(fig, frame, f"{names[0]} against {names[1]}: the {len(both)} cells measured "
                               f"on both ({_describe(view)}, activations as inputs)")


# ---------------------------------------------------------------------------------------------
# All of them
# ---------------------------------------------------------------------------------------------
FIGURES = {  # name -> (function, needs_kernel); save_all and the report keep this order
    "who_wins": (who_wins, False),
    "speedup_by_mode": (speedup_by_mode, False),
    "speedup_heatmap": (speedup_heatmap, True),
    "roofline": (roofline, False),
    "scaling": (scaling, True),
    "compile_break_even": (compile_break_even, False),
    "latency_vs_gpu_time": (latency_vs_gpu_time, False),
    "gpu_comparison": (gpu_comparison, False),
}


def draw(name: str, frame: pd.DataFrame, kernel: str | None = None):
    """The figure FIGURES[name] of the rows (of `kernel` for a per-kernel one), or None, with the
    reason on stderr, when the rows hold nothing it can plot (no compiled rows, one GPU)."""
    function, needs_kernel = FIGURES[name]
    stem = f"{name}_{kernel}" if needs_kernel else name
    try:
        fig = function(frame, kernel) if needs_kernel else function(frame)
    except ValueError as exc:
        print(f"skipped {stem}: {exc}", file=sys.stderr)
        return None
    if fig is None:
        print(f"skipped {stem}: nothing to plot in these records", file=sys.stderr)
    return fig


def save_all(frame: pd.DataFrame, out_dir, include_noisy: bool = False) -> list[Path]:
    """PNG and SVG of every figure (per-kernel ones once per kernel); returns the paths written.

    A figure with nothing to plot (no compiled rows, one GPU) is skipped with a note on stderr.
    Rows flagged noisy are left out unless `include_noisy`, and a note on stderr says how many.
    """
    if not include_noisy:
        frame, left_out = drop_noisy(frame)
        if left_out:
            print(f"left out {left_out} noisy rows (--include-noisy keeps them)", file=sys.stderr)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frame = frame.sort_values(["kernel", "mode", "activations", "shape_label", "job_dir"],
                              kind="stable").reset_index(drop=True)
    written = []
    for name, (_, needs_kernel) in FIGURES.items():
        for kernel in sorted(frame["kernel"].unique()) if needs_kernel else [None]:
            fig = draw(name, frame, kernel)
            if fig is None:
                continue
            stem = f"{name}_{kernel}" if needs_kernel else name
            for suffix, metadata in ((".png", PNG_METADATA), (".svg", SVG_METADATA)):
                path = out_dir / f"{stem}{suffix}"
                fig.savefig(path, dpi=DPI, metadata=metadata)
                written.append(path)
            plt.close(fig)
    return written


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path, help="folder searched for results.jsonl files")
    parser.add_argument("out_dir", type=Path, help="where the PNG and SVG files go")
    parser.add_argument("--include-noisy", action="store_true",
                        help="plot the rows flagged noisy too")
    args = parser.parse_args(argv)
    try:
        results = load_results(args.results_dir)
    except FileNotFoundError as exc:
        raise SystemExit(f"error: {exc}") from None
    for problem in results.problems:
        print(f"warning: skipped {problem}", file=sys.stderr)
    for path in save_all(results.frame, args.out_dir, include_noisy=args.include_noisy):
        print(path)


if __name__ == "__main__":
    main()
