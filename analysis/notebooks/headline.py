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
# # Headline: Triton vs torch.compile vs eager
#
# Every number here is read from records (`results.jsonl` and `env.json`); rerun with another
# folder by changing `results_dir` (papermill: `-p results_dir multirun/...`). Each figure cell
# returns the figure (`figures.draw`), stored in the executed notebook as a PNG; a figure with
# nothing to plot in these records says so instead.

# %% tags=["parameters"]
results_dir = "results/current/h100/study"
models_dir = "results/current"  # every <gpu>/models folder below it (the whole-model section)

# %%
from matplotlib_inline.backend_inline import set_matplotlib_formats

from analysis import figures
from analysis.load import caption, load_results
from analysis.summary import geomean_table

set_matplotlib_formats("png")  # figures draws with Agg: a returned Figure is shown as a PNG

results = load_results(results_dir)
frame = results.frame
print(caption(frame))
if figures.measured_on_cpu(frame):
    print(f"{figures.CPU_MARK}: timed on a CPU; the figures carry the same mark")
print(f"{len(frame)} records, {len(results.problems)} problems")
for problem in results.problems:
    print("  ", problem)

# %% [markdown]
# ## Who wins where
# Per kernel, shape, dtype and pass: the fastest mode by GPU time, coloured by its family (ours,
# a peer library, a compiler, or eager when nothing beat it).

# %%
figures.draw("who_wins", frame)

# %% [markdown]
# ## Geomean speedup against eager, per kernel and mode
# GPU time (`speedup_vs_eager`) and call latency (`latency_speedup_vs_eager`), geomean over the
# shapes of each kernel's set. `activations=static` rows were measured with static activations.

# %%
table = geomean_table(frame)
table

# %%
figures.draw("speedup_by_mode", frame)

# %% [markdown]
# ## Where launch overhead matters
# On small shapes the call latency (what Python waits) is far above the GPU time for compiled
# modes; CUDA graphs remove launches but add input copies unless the activations are static.

# %%
figures.draw("latency_vs_gpu_time", frame)

# %% [markdown]
# ## What compiling costs
# Calls needed before a mode's compile time is paid back by its per-call gain over eager.

# %%
figures.draw("compile_break_even", frame)

# %% [markdown]
# ## Against the measured ceilings
# Achieved TFLOP/s under the copy-bandwidth and bf16-matmul roofs measured on the same GPU.
# Records of two GPUs also give `figures.draw("gpu_comparison", frame)` (`make figures`).

# %%
figures.draw("roofline", frame)

# %% [markdown]
# ## Whole models
# Each model's best mode of ours, of the compile modes and of the peers, against eager in the same
# job, from every `results/current/<gpu>/models` folder (`models_dir`); then GPU time per step by
# model and mode. Every row, with compile time, memory and accuracy, is in the folder's README.

# %%
from pathlib import Path

from IPython.display import Markdown

from analysis import models_report

models = models_report.model_frame(Path(models_dir))
Markdown(models_report.table(models) if not models.empty else "No whole-model records here.")

# %%
models_report.model_speedups(models) if not models.empty else print("no model rows to plot")
