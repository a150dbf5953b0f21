"""`make wheelhouse` then `make install-offline` gives a working environment with no index.

GPU clusters often have no internet on compute nodes: the wheelhouse carries every dependency
but torch and triton, which such clusters provide. Here a fresh venv gets torch and triton from
requirements-cpu.txt, then everything else from the wheelhouse with the index disabled.
"""

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def sh(*command, **kwargs):
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=1200, **kwargs)
    assert result.returncode == 0, " ".join(command) + "\n" + result.stdout[-2000:] + \
        result.stderr[-3000:]
    return result


def test_wheelhouse_installs_offline_and_the_cli_runs(tmp_path):
    wheelhouse, venv = tmp_path / "wheelhouse", tmp_path / "venv"
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    sh("make", "--no-print-directory", "wheelhouse", f"WHEELHOUSE={wheelhouse}",
       f"PYTHON_VERSION={version}")
    assert any(p.name.startswith("antlr4_python3_runtime-4.9.3") for p in wheelhouse.iterdir())
    assert not any(p.name.startswith(("torch-", "triton-")) for p in wheelhouse.iterdir())

    sh(sys.executable, "-m", "venv", str(venv))
    python = venv / "bin" / "python"
    sh(str(python), "-m", "pip", "install", "-q", "-r", "requirements-cpu.txt")
    env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PATH": "/usr/bin:/bin"}
    sh("make", "--no-print-directory", "install-offline", f"PY={python}",
       f"WHEELHOUSE={wheelhouse}", env=env)

    run = sh(str(python), "-m", "experiments.run", "kernel=softmax", "mode=eager", "dtype=fp32",
             "bench=quick", "wandb.mode=offline", f"hydra.run.dir={tmp_path / 'run'}")
    assert "2 ok, 0 failed" in run.stdout
    assert (tmp_path / "run" / "results.jsonl").exists()
