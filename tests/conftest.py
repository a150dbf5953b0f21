"""Shared test setup.

Without a GPU every Triton kernel runs in the interpreter, which must be switched on before
`triton.jit` decorates anything, so it is set here, before any test module imports `kernels`.

Each pytest process (each pytest-xdist worker: `make test` runs two) gets its own Triton and
Inductor caches, W&B and matplotlib folders, set in the environment so that the CLI subprocesses
the tests start use them too: two workers never write one cache entry at the same time, and a
test run never reads what another session (or an older checkout) left there. (A benchmark job
also points Inductor at a fresh folder of its own, compile.fresh_cache; these folders serve the
tests' own torch.compile calls and the offline compiles of experiments.resources.)
"""

import os
import shutil
import tempfile
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CACHE_DIRS = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "WANDB_CACHE_DIR": "wandb-cache",
    "WANDB_CONFIG_DIR": "wandb-config",
    "WANDB_DATA_DIR": "wandb-data",
    "MPLCONFIGDIR": "matplotlib",
}
_cache_root = None  # this process's, removed at the end unless kept (KBENCH_TEST_CACHE)


def pytest_configure(config):
    """The caches of this process (an xdist worker, or the only one), before any test runs.

    A hook rather than module code: test modules import this file again as tests.conftest.
    Per session and worker under the system temp folder; KBENCH_TEST_CACHE names a folder to
    keep between sessions instead (warm Inductor and Triton caches: a rerun compiles less).
    """
    global _cache_root
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    kept = os.environ.get("KBENCH_TEST_CACHE")
    root = Path(kept) / worker if kept else Path(tempfile.mkdtemp(prefix=f"kbench-test-{worker}-"))
    for var, sub in CACHE_DIRS.items():
        (root / sub).mkdir(parents=True, exist_ok=True)
        os.environ[var] = str(root / sub)
    _cache_root = None if kept else root


def pytest_unconfigure(config):
    if _cache_root is not None:
        shutil.rmtree(_cache_root, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def device():
    return DEVICE


def fast_subset(values, keep=1, *, unpack=False):
    """`values` for pytest.mark.parametrize with all but the kept ones marked `slow`: `make test`
    runs the kept ones, `make test-all` (CI) every one, so the breadth of shapes, dtypes and cases
    stays in CI while the fast suite checks a few of each. keep: how many of the first values, or
    the values themselves; unpack: each value is a tuple of the test's arguments. A value given
    as pytest.param keeps its id and marks."""
    values = list(values)
    kept = range(keep) if isinstance(keep, int) else [values.index(v) for v in keep]
    params = []
    for index, value in enumerate(values):
        if isinstance(value, type(pytest.param(None))):
            args, marks, id_ = value.values, list(value.marks), value.id
        else:
            args, marks, id_ = (tuple(value) if unpack else (value,)), [], None
        if index not in kept:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(*args, marks=marks, id=id_))
    return params


REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf"


@pytest.fixture
def compose_job(tmp_path):
    """Compose the real config as `python -m experiments.run` would, for in-process runs.

    Returns a function of Hydra overrides giving the job config, with HydraConfig set so that
    experiments.run.run() finds its output directory (tmp_path/job).
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    def make(overrides):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
        output_dir = tmp_path / "job"
        output_dir.mkdir(exist_ok=True)
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(output_dir)
            cfg.hydra.job.num = 0
            HydraConfig.instance().set_config(cfg)
            del cfg["hydra"]
        return cfg

    yield make
    GlobalHydra.instance().clear()
