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
# folder by changing `results_dir` (papermill: `-p results_dir multirun/...`).

# %% tags=["parameters"]
results_dir = "results/current/h100/all_modes_first_kernels"

# %%
import matplotlib

matplotlib.use("Agg")

from analysis import figures
from analysis.load import caption, load_results
from analysis.summary import geomean_table

results = load_results(results_dir)
frame = results.frame
print(caption(frame))
print(f"{len(frame)} records, {len(results.problems)} problems")
for problem in results.problems:
    print("  ", problem)

# %% [markdown]
# ## Geomean speedup against eager, per kernel and mode
# GPU time (`speedup_vs_eager`) and call latency (`latency_speedup_vs_eager`), geomean over the
# shapes of each kernel's set. `activations=static` rows were measured with static activations.

# %%
table = geomean_table(frame)
table

# %%
figures.speedup_by_mode(frame)

# %% [markdown]
# ## Where launch overhead matters
# On small shapes the call latency (what Python waits) is far above the GPU time for compiled
# modes; CUDA graphs remove launches but add input copies unless the activations are static.

# %%
figures.latency_vs_gpu_time(frame)

# %% [markdown]
# ## What compiling costs
# Calls needed before a mode's compile time is paid back by its per-call gain over eager.

# %%
figures.compile_break_even(frame)

# %%
figures.roofline(frame)
