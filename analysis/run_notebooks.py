"""Execute the analysis notebooks against a results folder, as `make notebooks` and CI do.

    python -m analysis.run_notebooks results/current/h100/study outputs/notebooks

The notebooks live in analysis/notebooks/ as jupytext percent-format .py files (clean diffs);
each is converted to .ipynb and executed with papermill, with `results_dir` as a parameter. The
executed notebooks, outputs included, are written to the output folder.
"""

import argparse
from pathlib import Path

import jupytext
import papermill

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO_ROOT / "analysis" / "notebooks"


def execute(source: Path, results_dir: Path, out_dir: Path, **parameters) -> Path:
    """Run one notebook with papermill from the repo root; a failing cell raises."""
    out_dir.mkdir(parents=True, exist_ok=True)
    unexecuted = out_dir / f"{source.stem}.input.ipynb"
    jupytext.write(jupytext.read(source), unexecuted)
    executed = out_dir / f"{source.stem}.ipynb"
    papermill.execute_notebook(
        str(unexecuted), str(executed), parameters={"results_dir": str(results_dir), **parameters},
        cwd=str(REPO_ROOT), kernel_name="python3", progress_bar=False)
    unexecuted.unlink()
    return executed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    for source in sorted(NOTEBOOKS.glob("*.py")):
        print(execute(source, args.results_dir.resolve(), args.out_dir))


if __name__ == "__main__":
    main()
