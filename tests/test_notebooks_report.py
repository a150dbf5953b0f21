"""The analysis notebooks execute against the committed records with every figure embedded as a
PNG, and the static report builds (with the CPU mark when the records were timed on a CPU)."""

import base64
import json
import re

import pytest

from analysis import figures
from analysis.report import build
from analysis.run_notebooks import NOTEBOOKS, execute
from tests.conftest import REPO_ROOT
from tests.test_figures import ENV, fixture_rows, write_job

H100 = REPO_ROOT / "results" / "current" / "h100" / "study"
pytestmark = pytest.mark.skipif(not H100.exists(), reason="no committed H100 records")
# figures.draw("name", ...) or figures.name(...), for a name in figures.FIGURES
FIGURE_CALL = re.compile(r"\bfigures\.(?:draw\(\s*[\"'](\w+)[\"']|(\w+)\()")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def cell_text(notebook_path) -> str:
    cells = json.loads(notebook_path.read_text())["cells"]
    texts = []
    for cell in cells:
        for output in cell.get("outputs", []):
            texts.append("".join(output.get("text", "")))
            texts.append("".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


def figure_cells(notebook: dict) -> list[dict]:
    """The code cells that draw a figure of analysis.figures."""
    return [
        cell for cell in notebook["cells"] if cell["cell_type"] == "code"
        and any(a in figures.FIGURES or b in figures.FIGURES
                for a, b in FIGURE_CALL.findall("".join(cell["source"])))
    ]  # fmt: skip


def cells_without_a_png(notebook: dict) -> list[str]:
    """The source of each figure cell with no image/png output that decodes to a PNG."""
    missing = []
    for cell in figure_cells(notebook):
        pngs = [base64.b64decode(output["data"]["image/png"])
                for output in cell.get("outputs", []) if "image/png" in output.get("data", {})]
        if not any(png.startswith(PNG_SIGNATURE) for png in pngs):
            missing.append("".join(cell["source"]))
    return missing


def test_the_image_check_catches_a_figure_shown_as_text():
    as_text = {"output_type": "execute_result", "execution_count": 1, "metadata": {},
               "data": {"text/plain": "<Figure size 1260x500 with 4 Axes>"}}
    as_png = {**as_text, "data": {"image/png": base64.b64encode(PNG_SIGNATURE).decode()}}
    notebook = {"cells": [
        {"cell_type": "code", "source": ['figures.draw("roofline", frame)'], "outputs": [as_text]},
        {"cell_type": "code", "source": ["figures.speedup_by_mode(frame)"], "outputs": [as_png]},
        {"cell_type": "code", "source": ["table"], "outputs": [as_text]},
    ]}  # fmt: skip
    assert len(figure_cells(notebook)) == 2
    assert cells_without_a_png(notebook) == ['figures.draw("roofline", frame)']


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize("source", sorted(NOTEBOOKS.glob("*.py")), ids=lambda p: p.stem)
def test_notebook_executes_on_committed_records(source, tmp_path):
    executed = execute(source, H100, tmp_path)
    text = cell_text(executed)
    assert "NVIDIA H100 80GB HBM3" in text  # the caption, read from env.json
    notebook = json.loads(executed.read_text())
    assert len(figure_cells(notebook)) >= 2
    assert cells_without_a_png(notebook) == []  # every figure is embedded, not its repr
    assert figures.CPU_MARK not in text


@pytest.mark.slow
@pytest.mark.integration
def test_deep_dive_takes_another_kernel(tmp_path):
    executed = execute(NOTEBOOKS / "kernel_deep_dive.py", H100, tmp_path, kernel="softmax")
    text = cell_text(executed)
    assert "kernel: softmax" in text and "2048x16384" in text
    assert cells_without_a_png(json.loads(executed.read_text())) == []


@pytest.mark.slow  # draws every figure of the committed records
def test_report_has_every_figure_and_the_table(tmp_path):
    path = build(H100, tmp_path)
    page = path.read_text()
    pngs = sorted((tmp_path / "figures").glob("*.png"))
    assert len(pngs) >= 7
    for png in pngs:
        assert f"figures/{png.name}" in page
    for name in ("who_wins", "speedup_by_mode", "roofline", "compile_break_even"):
        assert f"<h3>{name}</h3>" in page
    assert "gpu_comparison" not in page  # one GPU: nothing to compare
    assert "speedup_vs_eager" in page and "max-autotune" in page and "NVIDIA H100" in page
    assert figures.CPU_MARK not in page


def test_report_of_cpu_records_says_they_are_not_representative(tmp_path, monkeypatch):
    env = {**ENV, "device": "cpu", "gpu_name": None, "peaks": None}
    rows = [{**row, "device": "cpu", "timer": "cpu-wall"} for row in fixture_rows()]
    write_job(tmp_path / "records" / "job", rows, env)
    # the figures carry their own mark (tests/test_figures.py); here only the page is checked
    monkeypatch.setattr(figures, "save_all", lambda frame, out_dir: [])
    page = build(tmp_path / "records", tmp_path / "report").read_text()
    assert f"<p class='cpu-mark'>{figures.CPU_MARK}" in page
