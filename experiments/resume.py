"""Finish an interrupted sweep: `python -m experiments.resume <sweep dir> [extra overrides]`.

`make resume SWEEP=multirun/<date>/<time>` calls this. It reads the sweep's own multirun.yaml for
the overrides it was launched with, and launches the same multirun into the same folder with
resume=true: every job skips the shapes its results.jsonl already holds (matched on the config
hash and the shape), so only missing work runs and nothing is duplicated.
"""

import argparse
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf


def resume_command(sweep_dir: Path, extra: list[str]) -> list[str]:
    saved = sweep_dir / "multirun.yaml"
    if not saved.exists():
        raise SystemExit(f"error: {saved} not found: is {sweep_dir} a sweep folder?")
    task_overrides = list(OmegaConf.load(saved).hydra.overrides.task)
    return [
        sys.executable,
        "-m",
        "experiments.run",
        "--multirun",
        *task_overrides,
        f"hydra.sweep.dir={sweep_dir}",
        "resume=true",
        *extra,
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. fault.kind=null")
    args = parser.parse_args(argv)
    command = resume_command(args.sweep_dir, args.overrides)
    print(" ".join(command), flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
