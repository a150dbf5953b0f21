"""Finish an interrupted sweep: `python -m experiments.resume <sweep dir> [extra overrides]`.

`make resume SWEEP=multirun/<date>/<time>` calls this. It reads the sweep's own multirun.yaml for
the overrides it was launched with (the sweep's and the launcher's, such as
hydra.launcher.partition) and launches the same multirun into the same folder with resume=true:
every job skips the shapes its results.jsonl already holds (matched on the config hash and the
shape), so only missing work runs and nothing is duplicated. It refuses while any of the sweep's
SLURM tasks is still queued or running.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

# Hydra overrides that the relaunch sets itself: the folder (the same one) and the run mode
# (--multirun). Every other hydra.* override, such as the launcher's partition, account or
# setup, is the sweep's own and must come back with it.
RELAUNCH_SETS = ("hydra.sweep.dir=", "hydra.mode=")


def resume_command(sweep_dir: Path, extra: list[str]) -> list[str]:
    saved = sweep_dir / "multirun.yaml"
    if not saved.exists():
        raise SystemExit(f"error: {saved} not found: is {sweep_dir} a sweep folder?")
    overrides = OmegaConf.load(saved).hydra.overrides
    hydra_overrides = [o for o in overrides.hydra if not o.startswith(RELAUNCH_SETS)]
    # A sweep resumed before already holds resume=true; one is enough.
    task_overrides = [o for o in overrides.task if not o.startswith("resume=")]
    return [
        sys.executable,
        "-m",
        "experiments.run",
        "--multirun",
        *task_overrides,
        *hydra_overrides,
        f"hydra.sweep.dir={sweep_dir}",
        "resume=true",
        *extra,
    ]


def live_slurm_tasks(sweep_dir: Path) -> list[str]:
    """This sweep's SLURM array tasks that are still queued or running.

    When one task fails or is cancelled, the launcher stops waiting and exits while the other
    tasks run on: a resume beside them would measure their missing shapes a second time, into the
    same results.jsonl. submitit names a folder under <sweep>/.submitit/ after each array job id.
    """
    folder = sweep_dir / ".submitit"
    if not folder.is_dir() or shutil.which("squeue") is None:
        return []
    array_ids = {p.name.split("_")[0] for p in folder.iterdir() if p.name.split("_")[0].isdigit()}
    listed = subprocess.run(
        ["squeue", "--noheader", "--format=%F %i %T"], capture_output=True, text=True
    )
    if listed.returncode != 0:  # no controller to ask: nothing can still be running there
        return []
    rows = (line.split() for line in listed.stdout.splitlines())
    return [f"{task} ({state})" for array, task, state in rows if array in array_ids]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. fault.kind=null")
    args = parser.parse_args(argv)
    if (args.sweep_dir / "study.json").exists():  # a study's folder: its driver finishes it
        command = [sys.executable, "-m", "experiments.study", "--dir", str(args.sweep_dir),
                   *args.overrides]  # fmt: skip
        print(" ".join(command), flush=True)
        return subprocess.run(command).returncode
    live = live_slurm_tasks(args.sweep_dir)
    if live:
        print(
            f"error: tasks of this sweep are still in SLURM: {', '.join(live)}; wait for them "
            f"(squeue) or cancel them (scancel), then resume",
            file=sys.stderr,
        )
        return 2
    command = resume_command(args.sweep_dir, args.overrides)
    print(" ".join(command), flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
