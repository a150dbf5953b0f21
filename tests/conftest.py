"""Shared test setup.

Without a GPU every Triton kernel runs in the interpreter, which must be switched on before
`triton.jit` decorates anything, so it is set here, before any test module imports `kernels`.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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


REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
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
