"""The study on one GPU, in slices that fit a time budget: `make study ARGS="study.budget_s=540"`.

A host with one GPU (a lent node whose runs stop at 10 minutes) cannot run the ~600-job study in
one go. With a budget, experiments.study runs it in slices instead of its parts' multiruns:

- The grid becomes groups: one (part, op, dtype, pass) with the part's modes, a multirun over
  those modes into <study>/<group>/, so a group's modes end up side by side and a finished group
  is one whole cell of the answer. Groups run in this order: the first dtype (bf16, the headline's)
  first, op by op, then the other dtypes, then the TF32 pass, then the CUDA-graph modes' static
  view.
- A slice runs the groups in turn while the next one's estimate fits what is left of the budget
  (a group too large for a whole budget runs as many of its modes as fit), and stops cleanly
  before it: a group still running at the deadline is stopped, and its job in flight, with no
  closing stamp in its env.json, is deleted, so it reruns whole.
- What is done is read from the folder each time, not from a state file: a job is done when its
  env.json has its closing stamp (wall_s). So the next slice, the same day or from a promoted copy
  of the folder (results/current/<gpu>/study: records and env.json only), goes on where the last
  stopped, and no job runs twice.
- <study>/manifest.json says, after every group, which groups and jobs are done and pending, what
  each slice ran and how long its jobs took (the time per job that the estimate learns from:
  the mean wall time of the study's own finished jobs of the same op and mode, where it has any).
"""

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from experiments.processes import child_env

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = "manifest.json"
# Seconds kept back from the budget for the slice's own start and end (the summary, the
# manifest) and a group's Hydra start: a slice stops cleanly before its budget
MARGIN_S = 20.0
AXES = ("kernel", "mode", "dtype", "pass")  # the study file's sweeper params, and the passes
POLL_S = 1.0  # how often a slice looks at its running group and the clock


@dataclass
class Group:
    name: str  # its folder: <part number>_<view>[-tf32]-<op>-<dtype>-<pass>
    kernel: str
    dtype: str
    pass_name: str
    modes: list[str]
    overrides: list[str]  # the part's, with one op, dtype and pass and no mode axis
    view: str = "inputs"
    tf32: bool = False
    rank: tuple = field(default=(), repr=False)  # its place in the run order (groups())


def split_overrides(overrides: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """The swept axes among `overrides` ({key: values}), and every other override."""
    axes, rest = {}, []
    for override in overrides:
        key, _, value = override.partition("=")
        if key in AXES:
            axes[key] = value.split(",")
        else:
            rest.append(override)
    return axes, rest


def groups(parts) -> list[Group]:
    """Every (part, op, dtype, pass) of the study's parts, in run order: the inputs view before
    the static one, TF32 off before on, then by dtype, op, pass and part as the study lists
    them."""
    out = []
    for part_index, part in enumerate(parts):
        axes, rest = split_overrides(part.overrides)
        number, _, label = part.name.partition("_")
        view = label.split("-")[0]
        tf32 = "dtype.tf32=true" in rest
        for dtype in axes["dtype"]:
            for op_index, kernel in enumerate(axes["kernel"]):
                for pass_index, pass_name in enumerate(axes["pass"]):
                    name = "-".join([f"{number}_{view}", *(["tf32"] * tf32), kernel, dtype,
                                     pass_name])  # fmt: skip
                    out.append(Group(
                        name, kernel, dtype, pass_name, list(axes["mode"]),
                        [*rest, f"kernel={kernel}", f"dtype={dtype}", f"pass={pass_name}"],
                        view, tf32, (view != "inputs", tf32, axes["dtype"].index(dtype),
                                     op_index, pass_index, part_index)))  # fmt: skip
    return sorted(out, key=lambda g: g.rank)


# ---------------------------------------------------------------------------------------------
# What the folder says is done
# ---------------------------------------------------------------------------------------------
def _closed(job_dir: Path) -> dict | None:
    """The job's env.json when it has its closing stamp (wall_s), else None."""
    try:
        env = json.loads((job_dir / "env.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return env if "wall_s" in env else None


def _mode_of(job_dir: Path, group: Group) -> str | None:
    """The mode of a job folder `<num>_<op>-<mode>-<dtype>-<pass>` of `group`."""
    number, _, name = job_dir.name.partition("_")
    head, tail = f"{group.kernel}-", f"-{group.dtype}-{group.pass_name}"
    if not number.isdigit() or not name.startswith(head) or not name.endswith(tail):
        return None
    return name[len(head):-len(tail)] or None


def job_dirs(study: Path, group: Group) -> dict[Path, str]:
    folder = study / group.name
    if not folder.is_dir():
        return {}
    found = {path: _mode_of(path, group) for path in sorted(folder.iterdir()) if path.is_dir()}
    return {path: mode for path, mode in found.items() if mode in group.modes}


def done_modes(study: Path, group: Group) -> dict[str, float]:
    """{mode: the job's wall_s} of the group's finished jobs."""
    return {mode: float(env["wall_s"]) for path, mode in job_dirs(study, group).items()
            if (env := _closed(path)) is not None}  # fmt: skip


def clear_interrupted(study: Path, group: Group) -> list[str]:
    """Delete the group's job folders without a closing stamp (a job stopped mid-way reruns
    whole, so no shape is measured twice or by two processes); their names."""
    cleared = []
    for path in job_dirs(study, group):
        if _closed(path) is None:
            shutil.rmtree(path)
            cleared.append(path.name)
    return cleared


# ---------------------------------------------------------------------------------------------
# Estimates: the study's own measured jobs where it has them
# ---------------------------------------------------------------------------------------------
def measured_seconds(study: Path, all_groups: list[Group]) -> dict[tuple[str, str], float]:
    """{(op, mode): mean wall_s} over the study's finished jobs."""
    seen: dict[tuple[str, str], list[float]] = {}
    for group in all_groups:
        for mode, wall in done_modes(study, group).items():
            seen.setdefault((group.kernel, mode), []).append(wall)
    return {key: sum(walls) / len(walls) for key, walls in seen.items()}


def mode_seconds(group: Group, mode: str, measured: dict, modelled) -> float:
    """One job's seconds: measured for this op and mode, else the study's model (`modelled`:
    (group, mode) -> seconds, experiments.study's estimate with a cold cache)."""
    return measured.get((group.kernel, mode)) or modelled(group, mode)


# ---------------------------------------------------------------------------------------------
# A slice
# ---------------------------------------------------------------------------------------------
def _command(study: Path, group: Group, modes: list[str], extra: list[str]) -> list[str]:
    wandb = [] if any(o.startswith("wandb.group=") for o in extra) else [
        f"wandb.group=study-{study.name}"]  # fmt: skip
    return [sys.executable, "-m", "experiments.run", "--multirun", *group.overrides,
            f"mode={','.join(modes)}", *extra, *wandb,
            f"hydra.sweep.dir={study / group.name}"]  # fmt: skip


def _stop(proc: subprocess.Popen) -> None:
    """Stop a group's multirun and every process it started (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def manifest(study: Path, all_groups: list[Group], slices: list[dict]) -> dict:
    rows = []
    for group in all_groups:
        done = done_modes(study, group)
        rows.append({"group": group.name, "modes_done": sorted(done),
                     "modes_pending": [m for m in group.modes if m not in done],
                     "seconds": round(sum(done.values()), 1)})  # fmt: skip
    jobs = sum(len(g.modes) for g in all_groups)
    finished = sum(len(r["modes_done"]) for r in rows)
    return {"jobs": jobs, "jobs_done": finished,
            "groups_done": sum(not r["modes_pending"] for r in rows), "groups": len(rows),
            "slices": slices, "by_group": rows}  # fmt: skip


def save_manifest(study: Path, data: dict) -> None:
    (study / MANIFEST).write_text(json.dumps(data, indent=2, default=asdict) + "\n",
                                  encoding="utf-8")  # fmt: skip


def previous_slices(study: Path) -> list[dict]:
    try:
        return json.loads((study / MANIFEST).read_text(encoding="utf-8")).get("slices", [])
    except (OSError, ValueError):
        return []


def run_slice(study: Path, all_groups: list[Group], budget_s: float, extra: list[str],
              modelled, clock=time.monotonic) -> dict:  # fmt: skip
    """Run pending groups in order within `budget_s` seconds; returns the manifest."""
    start = clock()
    deadline = start + budget_s - MARGIN_S
    logs = study / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    slices = previous_slices(study)
    this = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "budget_s": budget_s, "jobs": [],
            "stopped": None}  # fmt: skip
    slices.append(this)
    measured = measured_seconds(study, all_groups)
    for group in all_groups:
        cleared = clear_interrupted(study, group)
        if cleared:
            this.setdefault("rerun_whole", []).extend(f"{group.name}/{c}" for c in cleared)
        done = done_modes(study, group)
        pending = [m for m in group.modes if m not in done]
        if not pending:
            continue
        left, fits, total = deadline - clock(), [], 0.0
        for mode in pending:
            cost = mode_seconds(group, mode, measured, modelled)
            if total + cost > left:
                break
            fits.append(mode)
            total += cost
        if not fits:
            this["stopped"] = (f"budget: {group.name}'s next job needs about "
                               f"{mode_seconds(group, pending[0], measured, modelled):.0f} s, "
                               f"{max(left, 0):.0f} s left")  # fmt: skip
            break
        argv = _command(study, group, fits, extra)
        with (logs / f"{group.name}.log").open("a", encoding="utf-8") as log:
            print(" ".join(argv), file=log, flush=True)
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    env=child_env(), start_new_session=True)  # fmt: skip
            print(f"study: {group.name}: {', '.join(fits)} (~{total:.0f} s)", flush=True)
            while proc.poll() is None:
                if clock() >= deadline:
                    _stop(proc)
                    this["stopped"] = f"deadline: {group.name} stopped mid-way"
                    break
                time.sleep(POLL_S)
        finished = done_modes(study, group)
        this["jobs"] += [{"group": group.name, "mode": m, "wall_s": round(finished[m], 1)}
                         for m in fits if m in finished]  # fmt: skip
        clear_interrupted(study, group)  # a job the deadline stopped: it reruns whole
        save_manifest(study, manifest(study, all_groups, slices))
        if this["stopped"]:
            break
        if len(fits) < len(pending):
            this["stopped"] = f"budget: {group.name} has {len(pending) - len(fits)} jobs left"
            break
    this["seconds"] = round(clock() - start, 1)
    data = manifest(study, all_groups, slices)
    save_manifest(study, data)
    return data


def describe(data: dict) -> str:
    last = data["slices"][-1] if data["slices"] else {}
    per_job = [j["wall_s"] for j in last.get("jobs", [])]
    mean = f", {sum(per_job) / len(per_job):.1f} s a job" if per_job else ""
    stopped = f"; stopped: {last['stopped']}" if last.get("stopped") else ""
    return (f"study slice: {len(per_job)} jobs in {last.get('seconds', 0):.0f} s{mean}; "
            f"{data['jobs_done']} of {data['jobs']} jobs, {data['groups_done']} of "
            f"{data['groups']} groups done{stopped}")


def budget_of(overrides: list[str]) -> tuple[float | None, list[str]]:
    """study.budget_s from the command line's overrides (a positive number of seconds), and the
    other overrides (which go to every job)."""
    budget, rest = None, []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.startswith("study."):
            if key != "study.budget_s":
                raise ValueError(f"unknown study option {key!r}; the one option is study.budget_s")
            try:
                budget = float(value)
            except ValueError:
                budget = math.nan
            if not budget > 0 or math.isinf(budget):
                raise ValueError(f"study.budget_s={value!r}: a positive number of seconds")
        else:
            rest.append(override)
    return budget, rest
