"""The analysis notebooks execute against the committed records, and the static report builds."""

import json

import pytest

from analysis.report import build
from analysis.run_notebooks import NOTEBOOKS, execute
from tests.conftest import REPO_ROOT

H100 = REPO_ROOT / "results" / "current" / "h100" / "all_modes_first_kernels"
pytestmark = pytest.mark.skipif(not H100.exists(), reason="no committed H100 records")


def cell_text(notebook_path) -> str:
    cells = json.loads(notebook_path.read_text())["cells"]
    texts = []
    for cell in cells:
        for output in cell.get("outputs", []):
            texts.append("".join(output.get("text", "")))
            texts.append("".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("source", sorted(NOTEBOOKS.glob("*.py")), ids=lambda p: p.stem)
def test_notebook_executes_on_committed_records(source, tmp_path):
    executed = execute(source, H100, tmp_path)
    text = cell_text(executed)
    assert "NVIDIA H100 80GB HBM3" in text  # the caption, read from env.json
    assert "Figure" in text  # figures were drawn


@pytest.mark.slow
@pytest.mark.integration
def test_deep_dive_takes_another_kernel(tmp_path):
    executed = execute(NOTEBOOKS / "kernel_deep_dive.py", H100, tmp_path, kernel="conv")
    assert "32x64x56x56-k64-3x3-p1" in cell_text(executed)


@pytest.mark.slow  # draws every figure of the committed records
def test_report_has_every_figure_and_the_table(tmp_path):
    path = build(H100, tmp_path)
    page = path.read_text()
    pngs = sorted((tmp_path / "figures").glob("*.png"))
    assert len(pngs) >= 6
    for png in pngs:
        assert f"figures/{png.name}" in page
    assert "speedup_vs_eager" in page and "max-autotune" in page and "NVIDIA H100" in page
