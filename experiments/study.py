"""The study in one command: `make study` (docs/study.md).

    python -m experiments.study                         # the whole grid, multirun/study/<time>/
    python -m experiments.study --dir multirun/study/<time>   # finish an interrupted study
    python -m experiments.study --dry-run               # its parts, jobs and estimated time
    python -m experiments.study --smoke                 # a small study on the CPU (12 jobs)
    python -m experiments.study --dir <folder> study.budget_s=540   # one GPU: the next slice
    python -m experiments.study kernel=softmax dtype=bf16    # narrow an axis; any other override
                                                             # (bench.*, shapes=) goes to every job

conf/experiment/study.yaml holds the axes (kernel, mode, dtype) and what every job shares. The grid
is not one cartesian product: each op runs the passes its registry entry lists, the compute-bound
ops (registry `bound`) get an fp32 pass with TF32 on, and the modes that run as CUDA graphs (their
Inductor options set triton.cudagraphs) run again with static activations
(bench.static_inputs=true; the records' `activations` column), in the first dtype (bf16). So the
grid is split into parts, each a plain Hydra multirun into <study>/<part>/. On launcher=gpus they
all start at once and every job waits for a free GPU (conf/launcher/gpus.yaml); on
launcher=local they run one after another. <study>/study.json holds the plan and which parts
finished: `--dir` runs only the others, a started one through experiments.resume (its jobs skip
the shapes they recorded). Last, the study's summary is written to <study>/study_summary.csv and
printed by `python -m analysis.study_summary <study>`, run as a command: the harness imports no
analysis.
"""

import argparse
import datetime as dt
import functools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from omegaconf import OmegaConf

from experiments import study_slices
from experiments.processes import child_env
from experiments.study_slices import AXES, split_overrides
from experiments.workloads import kernel_config

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
EXPERIMENT = "+experiment=study"
STATE = "study.json"
# --smoke: each kind of part on the CPU in 12 small jobs: a compute-bound op (its TF32 pass) and a
# memory-bound one, ours, a CUDA-graph mode (both views) and a peer library (liger: no matmul)
SMOKE = ["kernel=matmul,softmax", "mode=triton,reduce-overhead,liger", "dtype=fp32", "pass=fwd",
         "shapes=cpu", "device=cpu", "bench=quick", "launcher=local", "isolate=false"]  # fmt: skip

# The time estimate (--dry-run; docs/study.md), from the committed H100 jobs with bench.rep_ms=50
# (results/current/h100): seconds per shape of one forward op, the median over jobs of wall_s per
# shape with the first compile (compile_cold_s) replaced by the one after a reset
# (compile_warm_s), plus 0.8 s for a new process's lookups in the warm disk cache
SECONDS_PER_SHAPE = {"eager": 1.7, "torchscript": 1.7, "triton": 2.8, "triton-compiled": 2.8,
                     "default": 2.2, "reduce-overhead": 1.9, "max-autotune": 2.8,
                     "max-autotune-no-cudagraphs": 2.8}  # fmt: skip
PEER_SECONDS_PER_SHAPE = 2.8  # assumed as ours: no peer job is on record yet
# What a cold cache adds per shape (a host's first study): compile_cold_s - compile_warm_s
COLD_SECONDS_PER_SHAPE = {"triton": 0.8, "triton-compiled": 1.8, "default": 0.7,
                          "reduce-overhead": 0.4, "max-autotune": 13.6,
                          "max-autotune-no-cudagraphs": 9.7}  # fmt: skip
# bench.cudagraph_replay=false (the study's) saves a shape two do_bench_cudagraph (a capture and
# 10 replays of rep_ms each), one in the modes that are CUDA graphs already (eager's replay)
REPLAY_SECONDS = 0.55
FWD_BWD_FACTOR = 1.4  # triton fwd_bwd against fwd in the same records: 1.32
BLOCK_FACTOR = 1.5  # assumed: a block calls 2-3 ops (no block is on record yet)
# What a job costs beyond its measurement, per launcher (docs/study.md, "Per-job overhead"): a
# 4-job slice on one H200 with the children's bytecode cached (experiments/processes.py), each
# job's cycle less its measured work. Before the cache every process compiled torch's sources
# again: 21.5 s a job on 4 H100s (results/current/h100/study: 12 s between jobs, 9.5 s in the
# worker beyond wall_s), which reproduced that study's 26.1 minutes
JOB_OVERHEAD_S = {"gpus": 9.3, "gpus_pool": 5.1}


def job_overhead(launcher: str) -> float:
    """Seconds a job costs beyond its measurement under `launcher` (local and slurm start a
    process per job, as gpus does)."""
    return JOB_OVERHEAD_S.get(launcher, JOB_OVERHEAD_S["gpus"])


@dataclass
class Part:
    name: str  # its folder in the study
    overrides: list[str]  # its multirun's, but the sweep folder
    jobs: int
    estimate_s: float  # GPU-seconds with warm caches
    cold_s: float  # GPU-seconds on a host's first study
    status: str = "pending"  # pending | done | failed


def compose(overrides: list[str]):
    """The study's config under `overrides`, but for the axes (a sweep is no single config)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    _, rest = split_overrides(overrides)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra_compose("config", overrides=[EXPERIMENT, *rest], return_hydra_config=True)


@functools.cache
def _conf(group: str, name: str):
    return kernel_config(name) if group == "kernel" else OmegaConf.load(
        CONF_DIR / group / f"{name}.yaml")  # fmt: skip


def cudagraph_modes(modes) -> list[str]:
    """The modes that run as CUDA-graph trees (reduce-overhead, max-autotune)."""
    import torch

    return [mode for mode in modes if _conf("mode", mode).kind == "compile"
            and torch._inductor.list_mode_options(_conf("mode", mode).compile_mode).get(
                "triton.cudagraphs")]  # fmt: skip


def plan(overrides: list[str]) -> list[Part]:
    """The parts of the study that the command line's `overrides` ask for."""
    from experiments import registry

    cfg = compose(overrides)
    params = cfg.hydra.sweeper.params or {}
    axes = {key: str(params[key]).split(",") for key in AXES if key in params}
    given, rest = split_overrides(overrides)
    axes.update(given)
    axes.setdefault("pass", list(registry.PASSES))
    groups: dict[tuple[str, ...], list[str]] = {}  # the ops that run the same passes
    for op in axes["kernel"]:
        passes = tuple(p for p in registry.get(op).passes if p in axes["pass"])
        if passes:
            groups.setdefault(passes, []).append(op)
    # The second view in the first dtype only (bf16, the headline's): it measures what the
    # CUDA-graph modes' input copies cost; the other dtypes would add 80 jobs (5 minutes)
    views = [("inputs", axes["mode"], axes["dtype"], []),
             ("static", cudagraph_modes(axes["mode"]), axes["dtype"][:1],
              ["bench.static_inputs=true"])]  # fmt: skip
    parts = []
    for view, modes, view_dtypes, view_overrides in views:
        for tf32 in (False, True):
            if not modes or (tf32 and "fp32" not in view_dtypes):
                continue
            for passes, ops in groups.items():
                if tf32:
                    ops = [op for op in ops if registry.get(op).bound == "compute"]
                if not ops:
                    continue
                grid = {"kernel": ops, "mode": modes, "dtype": ["fp32"] if tf32 else view_dtypes,
                        "pass": list(passes)}  # fmt: skip
                name = "-".join([f"{len(parts) + 1}_{view}", *(["tf32"] * tf32), *passes])
                sweeps = [f"{key}={','.join(values)}" for key, values in grid.items()]
                part_overrides = [EXPERIMENT, "hydra.sweeper.params=null", *sweeps,
                                  *(["dtype.tf32=true"] * tf32), *view_overrides,
                                  *rest]  # fmt: skip
                warm, cold = estimate(grid, cfg.shapes, bool(cfg.bench.cudagraph_replay),
                                      job_overhead(cfg.launcher.name))
                jobs = math.prod(len(values) for values in grid.values())
                parts.append(Part(name, part_overrides, jobs, warm, cold))
    return parts


def peer_lacks(mode: str, op: str, dtype: str, pass_name: str) -> bool:
    """A peer library has no kernel for this job on a GPU (the limits in experiments/peers.py,
    installed or not here): every row of the job is a skipped one."""
    from experiments import peers, registry

    peer = peers.PEERS.get(mode)
    if peer is None:
        return False
    spec, kernel = registry.get(op), _conf("kernel", op)
    job = peers.JobFacts(kernel={k: kernel.get(k) for k in ("dim", "activation", "bias")
                                 if k in kernel},
                         pass_name=pass_name, dtype=dtype, device="cuda",
                         block=op if spec.composed else None)  # fmt: skip
    parts = [registry.get(name) for name in spec.composed] or [spec]
    return any(part.function not in peer.limits or peer.limits[part.function](job)
               for part in parts)  # fmt: skip


def estimate(grid: dict, shapes: str, replay: bool, overhead: float) -> tuple[float, float]:
    """GPU-seconds of a part's jobs, each costing `overhead` beyond its shapes: with warm caches,
    and on a host's first study."""
    from experiments import registry

    warm = cold = 0.0
    graphs = set(cudagraph_modes(grid["mode"]))
    for op in grid["kernel"]:
        kernel = _conf("kernel", op)
        shape_set = kernel.default_shapes if shapes == "auto" else shapes
        count = len(kernel.shape_sets.get(shape_set, []))
        block = BLOCK_FACTOR if registry.get(op).composed else 1.0
        for mode in grid["mode"]:
            base = SECONDS_PER_SHAPE.get(mode, PEER_SECONDS_PER_SHAPE)
            if not replay:
                base -= REPLAY_SECONDS * (1 if mode in graphs else 2)
            for dtype in grid["dtype"]:
                for pass_name in grid["pass"]:
                    warm, cold = warm + overhead, cold + overhead
                    if peer_lacks(mode, op, dtype, pass_name):
                        continue  # skipped rows only
                    factor = block * (FWD_BWD_FACTOR if pass_name == "fwd_bwd" else 1.0)
                    warm += count * base * factor
                    cold += count * (base + COLD_SECONDS_PER_SHAPE.get(mode, 0.0)) * factor
    return warm, cold


GPU_LAUNCHERS = ("gpus", "gpus_pool")  # a job (or a pool task) a GPU, the GPUs run at once


def visible_gpus() -> int:
    """The GPUs launcher=gpus and gpus_pool take: CUDA_VISIBLE_DEVICES, else every one
    nvidia-smi lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return len([g for g in listed.split(",") if g.strip()])
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                         capture_output=True, text=True)  # fmt: skip
    return len(out.stdout.split()) if out.returncode == 0 else 0


def describe(parts: list[Part], gpus: int) -> str:
    lines = [f"{'part':<30} {'jobs':>5} {'GPU-min warm':>13} {'cold':>6}  status"]
    lines += [f"{p.name:<30} {p.jobs:>5} {p.estimate_s / 60:>13.1f} {p.cold_s / 60:>6.1f}  "
              f"{p.status}" for p in parts]  # fmt: skip
    warm, cold = sum(p.estimate_s for p in parts) / 60, sum(p.cold_s for p in parts) / 60
    lines.append(f"{sum(p.jobs for p in parts)} jobs; estimated wall time on {gpus} GPU(s): "
                 f"{warm / gpus:.0f} min with warm caches, {cold / gpus:.0f} min on a host's "
                 "first study (docs/study.md)")  # fmt: skip
    return "\n".join(lines)


def finished_jobs(study: Path) -> int:
    """Jobs whose env.json has its closing stamp (wall_s)."""
    count = 0
    for env in study.glob("*/*/env.json"):
        try:
            count += "wall_s" in json.loads(env.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
    return count


def command(study: Path, part: Part, extra: list[str]) -> list[str]:
    folder = study / part.name
    if (folder / "multirun.yaml").exists():  # started before: finish it
        return [sys.executable, "-m", "experiments.resume", str(folder), *extra]
    # every part's W&B runs in one group, the study's, unless the caller names one
    group = [] if any(o.startswith("wandb.group=") for o in extra) else [
        f"wandb.group=study-{study.name}"]  # fmt: skip
    return [sys.executable, "-m", "experiments.run", "--multirun", *part.overrides, *extra,
            *group, f"hydra.sweep.dir={folder}"]  # fmt: skip


def save(study: Path, state: dict) -> None:
    """study.json: the plan (its Part objects) and each part's status."""
    text = json.dumps(state, indent=2, default=asdict)
    (study / STATE).write_text(text + "\n", encoding="utf-8")


def run_parts(study: Path, state: dict, extra: list[str], concurrent: bool) -> None:
    """Each unfinished part's multirun, its output in <study>/logs/<part>.log."""
    logs = study / "logs"
    logs.mkdir(exist_ok=True)
    parts = state["parts"]
    pending = [p for p in parts if p.status != "done"]
    total, started, shown = sum(p.jobs for p in parts), time.monotonic(), (-1, 0.0)
    for wave in [pending] if concurrent else [[p] for p in pending]:
        running = {}
        try:
            for part in wave:
                log = (logs / f"{part.name}.log").open("a", encoding="utf-8")
                argv = command(study, part, extra)
                print(" ".join(argv), file=log, flush=True)
                running[part.name] = (part, subprocess.Popen(
                    argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=child_env()),
                    log)  # fmt: skip
                print(f"study: {part.name}: {part.jobs} jobs, log {log.name}", flush=True)
            while running:
                time.sleep(2)
                for name, (part, proc, log) in list(running.items()):
                    if proc.poll() is None:
                        continue
                    del running[name]
                    log.close()
                    part.status = "done" if proc.returncode == 0 else "failed"
                    print(f"study: {name} {part.status} (exit {proc.returncode})", flush=True)
                    save(study, state)
                done, minutes = finished_jobs(study), (time.monotonic() - started) / 60
                if done != shown[0] and minutes - shown[1] >= 0.5:
                    print(f"study: {done} of {total} jobs finished, {minutes:.1f} min", flush=True)
                    shown = (done, minutes)
        finally:
            for _, proc, log in running.values():  # interrupted: stop the multiruns it started
                proc.terminate()
                proc.wait()
                log.close()


def summarize(study: Path) -> None:
    """The analysis as its entry point, in a process of its own: the harness imports no
    analysis."""
    summary = subprocess.run([sys.executable, "-m", "analysis.study_summary", str(study)],
                             cwd=ROOT, env=child_env())  # fmt: skip
    if summary.returncode:
        print(f"warning: no summary (analysis.study_summary exited {summary.returncode})",
              file=sys.stderr)  # fmt: skip


def run_sliced(study: Path, state: dict, extra: list[str], budget: float) -> int:
    """One slice of the study within `budget` seconds (experiments/study_slices.py): the groups
    not yet done, in order; 0 when it stopped cleanly, done or not."""
    cfg = compose(state["overrides"])
    overhead = job_overhead(cfg.launcher.name)
    replay = bool(cfg.bench.cudagraph_replay)

    def modelled(group, mode) -> float:  # one job's cold seconds by the study's model
        grid = {"kernel": [group.kernel], "mode": [mode], "dtype": [group.dtype],
                "pass": [group.pass_name]}  # fmt: skip
        return estimate(grid, cfg.shapes, replay, overhead)[1]

    # the plan fixes the axes, and the study's own overrides are in every group's already
    _, extra = split_overrides([o for o in extra if o not in state["overrides"]])
    all_groups = study_slices.groups(state["parts"])
    data = study_slices.run_slice(study, all_groups, budget, extra, modelled)
    summarize(study)
    print(study_slices.describe(data), flush=True)
    left = data["jobs"] - data["jobs_done"]
    if left:
        print(f"study: {left} jobs to go: `make study STUDY={study} ARGS=\"study.budget_s="
              f"{budget:g}\"` runs the next slice", flush=True)  # fmt: skip
    else:
        print(f"study finished: {study}; publish it with `make promote RUN={study} "
              "GPU=<h100|h200> NAME=study` (docs/study.md)")  # fmt: skip
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, help="the study's folder; finish it if it exists")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and the estimate")
    parser.add_argument("--smoke", action="store_true", help=f"a small CPU study: {SMOKE}")
    parser.add_argument("--gpus", type=int, help="GPUs for the estimate (default: those visible)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every job of the study")
    args = parser.parse_intermixed_args(argv)
    try:
        budget, overrides = study_slices.budget_of(args.overrides)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.smoke:  # the command line's own values win over the preset's
        given = {o.partition("=")[0] for o in overrides}
        overrides = [o for o in SMOKE if o.partition("=")[0] not in given] + overrides

    study = args.dir
    if study is not None and (study / STATE).exists():  # resume, on the plan it started with
        state = json.loads((study / STATE).read_text(encoding="utf-8"))
        state["parts"] = [Part(**p) for p in state["parts"]]
        extra = overrides  # for the relaunch only, as `make resume` takes them
    else:
        stamp = dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        study = study or ROOT / "multirun" / "study" / stamp
        state = {"created": stamp, "overrides": overrides, "parts": plan(overrides)}
        extra = []
    launcher = compose(state["overrides"]).launcher.name
    gpus = visible_gpus() if launcher in GPU_LAUNCHERS else 1
    print(describe(state["parts"], args.gpus or gpus or 4), flush=True)
    if budget is not None:
        cold = sum(p.cold_s for p in state["parts"] if p.status != "done")
        slices = math.ceil(cold / max(budget - study_slices.MARGIN_S, 1.0))
        print(f"{len(study_slices.groups(state['parts']))} groups; on one GPU about {slices} "
              f"slices of study.budget_s={budget:g} with cold caches", flush=True)  # fmt: skip
    if args.dry_run:
        return 0
    if launcher in GPU_LAUNCHERS and gpus == 0:
        print(f"error: launcher={launcher} finds no GPU (CUDA_VISIBLE_DEVICES, nvidia-smi); "
              "`make study ARGS=--smoke` runs a small study on the CPU",
              file=sys.stderr)  # fmt: skip
        return 2
    study.mkdir(parents=True, exist_ok=True)
    save(study, state)
    print(f"study: {study}", flush=True)
    if budget is not None:
        return run_sliced(study, state, extra, budget)
    run_parts(study, state, extra, concurrent=launcher != "local")

    summarize(study)
    failed = [p.name for p in state["parts"] if p.status != "done"]
    if failed:
        print(f"error: {', '.join(failed)} did not finish (logs: {study / 'logs'}); finish "
              f"with `make study STUDY={study}`", file=sys.stderr)  # fmt: skip
        return 1
    print(f"study finished: {study}; publish it with `make promote RUN={study} GPU=<h100|h200> "
          "NAME=study` (docs/study.md)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
