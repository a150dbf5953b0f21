"""Hydra callbacks: what happens around a whole multirun rather than inside one job."""

import json
import logging
import subprocess
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from experiments.processes import child_env

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
MERGED = "sweep_results.jsonl"  # not "results.jsonl": loaders that search for those skip it


class AggregateRecords(Callback):
    """Merge every job's records into one file at the sweep root and print a summary."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        rows, unreadable = [], 0
        for path in sorted(sweep_dir.glob("*/results.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    unreadable += 1
        if not rows:
            log.warning("no records under %s to aggregate", sweep_dir)
            return
        merged = sweep_dir / MERGED
        merged.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        print(f"\nsweep: {len(rows)} rows in {merged}", flush=True)
        print_summary(sweep_dir)
        if unreadable:
            print(f"{unreadable} unreadable lines skipped", flush=True)


def print_summary(sweep_dir: Path) -> None:
    """The sweep's geomean table, printed by `python -m analysis.summary <sweep>` in a process of
    its own: the harness calls the analysis as its entry point and imports none of it."""
    summary = subprocess.run([sys.executable, "-m", "analysis.summary", str(sweep_dir)],
                             cwd=ROOT, env=child_env())  # fmt: skip
    if summary.returncode:
        log.warning("no summary table: analysis.summary exited %d", summary.returncode)
