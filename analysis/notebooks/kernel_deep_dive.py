# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # One kernel in depth
#
# Per-shape speedups, scaling and the three timers for one kernel. Parameters: `results_dir`
# and `kernel` (matmul, linear, softmax, conv, ...; None: the first kernel in the records).

# %% tags=["parameters"]
results_dir = "results/current/h100/study"
kernel = None

# %%
from matplotlib_inline.backend_inline import set_matplotlib_formats

from analysis import figures
from analysis.load import caption, load_results

set_matplotlib_formats("png")  # figures draws with Agg: a returned Figure is shown as a PNG

frame = load_results(results_dir).frame
if kernel is None:
    kernel = sorted(frame.loc[frame["status"] == "ok", "kernel"].unique())[0]
rows = frame[(frame["kernel"] == kernel) & (frame["status"] == "ok")]
assert len(rows), f"no ok records for kernel={kernel} under {results_dir}"
print(f"kernel: {kernel}")
print(caption(rows))
if figures.measured_on_cpu(rows):
    print(f"{figures.CPU_MARK}: timed on a CPU; the figures carry the same mark")

# %% [markdown]
# ## Speedup per shape and mode

# %%
figures.draw("speedup_heatmap", frame, kernel)

# %% [markdown]
# ## Throughput against problem size

# %%
figures.draw("scaling", frame, kernel)

# %% [markdown]
# ## The three timers side by side
# `time_ms_p50`: GPU time with the CPU path kept off the clock. `do_bench_ms_p50`: plain
# `triton.testing.do_bench`, which also counts a CPU path longer than its L2 flush.
# `call_latency_us_p50`: wall-clock per back-to-back call.

# %%
timers = rows[["mode", "activations", "shape_label", "time_ms_p50", "do_bench_ms_p50",
               "cudagraph_ms", "call_latency_us_p50", "speedup_vs_eager", "noisy"]]
timers.sort_values(["shape_label", "mode"])

# %% [markdown]
# ## Rows that are not ok

# %%
frame[(frame["kernel"] == kernel) & (frame["status"] != "ok")][
    ["mode", "shape_label", "status", "stage", "reason"]]
