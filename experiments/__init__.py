"""The experiment harness: configs in, correctness-checked timings out (results.jsonl, W&B).

Without a GPU the Triton kernels can only run in Triton's interpreter, which must be switched on
before `triton.jit` decorates them, that is, before anything imports `kernels`.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
