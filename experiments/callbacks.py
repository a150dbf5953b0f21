"""Hydra callbacks: what happens around a whole multirun rather than inside one job."""

import json
import logging
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

log = logging.getLogger(__name__)

MERGED = "sweep_results.jsonl"  # not "results.jsonl": loaders that search for those skip it


class AggregateRecords(Callback):
    """Merge every job's records into one file at the sweep root and print a summary."""

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
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
        print(summary_text(rows, unreadable, merged), flush=True)


def summary_text(rows: list[dict], unreadable: int, merged: Path) -> str:
    from analysis.load import records_frame
    from analysis.summary import report_text

    lines = ["", f"sweep: {len(rows)} rows in {merged}", report_text(records_frame(rows))]
    if unreadable:
        lines.append(f"{unreadable} unreadable lines skipped")
    return "\n".join(lines)
