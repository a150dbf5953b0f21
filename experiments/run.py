"""One Hydra job: `python -m experiments.run kernel=matmul mode=max-autotune`.

`make experiment` and `make sweep` call this module.

It measures every shape of one shape set for one (kernel, mode, dtype, pass), writes
results.jsonl and env.json in the job's output directory, logs to W&B, and prints a summary.
Configuration errors exit 2 with one line; a failing shape is a failed row and the job goes on.
"""

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments import env, faults, model_measure, modes, registry, schema, timing, worker
from experiments.errors import ConfigError
from experiments.measure import Job, measure_shape, skipped_record
from experiments.records import JsonlWriter, format_table, geomean, recorded_keys
from experiments.tracking import Tracker, find_secret_keys, redact, run_group, scrub_hydra_dir
from experiments.workloads import resolve_shapes
from kernels._common import SUPPORTED_DTYPES, is_interpreter

log = logging.getLogger(__name__)
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"  # absolute: see the end of this file

CPU_BANNER = (
    "CPU run: no GPU in use. Triton kernels run in the interpreter and torch.compile on "
    "Inductor's CPU backend. The pipeline is the same; the timings are NOT representative."
)


def refuse_secrets(config) -> None:
    """A credential-looking key is refused, and its value is never printed."""
    if not isinstance(config, dict):
        config = OmegaConf.to_container(config, resolve=False)
        config.pop("hydra", None)
    secrets = find_secret_keys(config)
    if secrets:
        raise ConfigError(
            f"config keys {secrets} look like credentials: put the W&B key in "
            "WANDB_API_KEY, never in a config or an override"
        )


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device=cuda but torch sees no CUDA device")
    if name not in ("cuda", "cpu"):
        raise ConfigError(f"unknown device {name!r}; choose auto, cuda or cpu")
    return torch.device(name)


def resolve_dtype(dtype_cfg) -> torch.dtype:
    dtype = getattr(torch, str(dtype_cfg.torch_dtype), None)
    if dtype not in SUPPORTED_DTYPES:
        raise ConfigError(f"dtype {dtype_cfg.name!r} maps to unsupported {dtype_cfg.torch_dtype!r}")
    return dtype


def set_tf32(enabled: bool) -> None:
    """One TF32 setting for every mode, so fp32 comparisons are like for like."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def use_fresh_compile_cache() -> str:
    """Point Inductor's and Triton's caches at an empty folder: first calls are cold starts."""
    cache = tempfile.mkdtemp(prefix="kbench-compile-cache-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    os.environ["TRITON_CACHE_DIR"] = os.path.join(cache, "triton")
    return cache


def job_identity() -> tuple[Path, str, str | None]:
    """Output dir, job id and, in a multirun, the sweep folder's name."""
    hydra_cfg = HydraConfig.get()
    output_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == hydra.types.RunMode.MULTIRUN
    job_id = os.environ.get("KBENCH_JOB_ID") or (  # set by the parent of an isolated worker
        f"{Path(hydra_cfg.sweep.dir).name}/{hydra_cfg.job.num}" if multirun else output_dir.name
    )
    return output_dir, job_id, Path(hydra_cfg.sweep.dir).name if multirun else None


MEASUREMENT_KEYS = (
    "kernel",
    "mode",
    "dtype",
    "pass",
    "bench",
    "compile",
    "seed",
    "device",
    "shapes",
)


def config_hash(config: dict) -> str:
    """A short hash of everything that decides a row's numbers, not of where or how it is logged.

    Shape sets are left out (each row carries its own shape), so are W&B, naming and the
    resume/isolate/fault switches: a resumed job recognizes the rows its earlier run wrote.
    """
    decisive = {k: config[k] for k in MEASUREMENT_KEYS}
    decisive["kernel"] = {
        k: v for k, v in config["kernel"].items() if k not in ("shape_sets", "default_shapes")
    }
    text = json.dumps(decisive, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class Plan:
    """A validated job: what to measure and where its records go."""

    cfg: DictConfig
    config: dict
    output_dir: Path
    job_id: str
    sweep_name: str | None
    device: torch.device
    workload: object
    dtype: torch.dtype
    shape_set: str
    shapes: list
    config_hash: str

    def job(self, **measuring) -> Job:
        return Job(
            cfg=self.cfg,
            workload=self.workload,
            device=self.device,
            dtype=self.dtype,
            shape_set=self.shape_set,
            job_id=self.job_id,
            config_hash=self.config_hash,
            **{"peaks": None, "code_dir": None, "timer": None, **measuring},
        )


def prepare(cfg: DictConfig) -> Plan:
    """Every check that can fail on the config, before anything is measured or spawned."""
    output_dir, job_id, sweep_name = job_identity()
    config = OmegaConf.to_container(cfg, resolve=True)
    try:
        refuse_secrets(config)
    except ConfigError:
        scrub_hydra_dir(output_dir)
        raise
    schema.validate(config, HydraConfig.get().launcher)
    device = resolve_device(cfg.device)
    if device.type == "cpu" and "triton" in cfg.mode.kind and not is_interpreter():
        raise ConfigError(
            "device=cpu with a CUDA GPU present: Triton kernels need "
            "TRITON_INTERPRET=1 in the environment to run on the CPU"
        )
    workload = registry.make_workload(cfg.kernel)
    registry.check_pass(workload.name, cfg["pass"].name)
    modes.check_mode(cfg.mode)
    faults.check(cfg.get("fault"))
    dtype = resolve_dtype(cfg.dtype)
    shape_set, shapes = resolve_shapes(workload, cfg.kernel, cfg.shapes, device.type == "cuda")
    if getattr(workload, "is_model", False):  # the full model or its tiny variant, by device
        shapes = [workload.with_variant(shape, device) for shape in shapes]
    return Plan(
        cfg,
        config,
        output_dir,
        job_id,
        sweep_name,
        device,
        workload,
        dtype,
        shape_set,
        shapes,
        config_hash(config),
    )


def run(cfg: DictConfig) -> list[dict]:
    plan = prepare(cfg)
    if isolated(cfg):
        return worker.run_isolated(plan)
    return measure_job(plan)


def isolated(cfg: DictConfig) -> bool:
    """isolate=auto: a multirun job on the local or gpus launcher measures its shapes in child
    processes, so a CUDA fault or leaked compiler state costs one row, not the rest of the job
    (on gpus a job is its own process, but one lost CUDA context still ended all its remaining
    shapes) and cannot reach the next job. Not on slurm: there a killed process is the
    scheduler's scancel or time limit, which must stop the task (make resume finishes it), not
    be recorded as a failed shape and skipped; isolate=true asks for it there."""
    if cfg.isolate != "auto":
        return bool(cfg.isolate)
    hydra_cfg = HydraConfig.get()
    return hydra_cfg.mode == hydra.types.RunMode.MULTIRUN and "Slurm" not in str(
        hydra_cfg.launcher.get("_target_", "")
    )


def measure_job(plan: Plan) -> list[dict]:
    cfg, device, workload, output_dir = plan.cfg, plan.device, plan.workload, plan.output_dir
    results_path = output_dir / "results.jsonl"
    todo = list(enumerate(plan.shapes))
    if cfg.resume:
        done = recorded_keys(results_path)
        todo = [(i, s) for i, s in todo if (plan.config_hash, workload.label(s)) not in done]
        log.info(
            "resume: %d of %d shapes already recorded",
            len(plan.shapes) - len(todo),
            len(plan.shapes),
        )
    if device.type == "cpu":
        log.warning(CPU_BANNER)
        # Inductor's pool of compile workers competes with the timed calls for a small CPU's cores.
        torch._inductor.config.compile_threads = 1
        # One intra-op thread by default: two jobs on a small machine then never oversubscribe
        # its cores (each spinning OpenMP team slowing the other's calls by 10x and more).
        torch.set_num_threads(cfg.bench.get("cpu_threads", 1))
    set_tf32(bool(cfg.dtype.tf32))
    cache_dir = use_fresh_compile_cache() if cfg.compile.fresh_cache else None

    inductor_options = (
        modes.resolved_options(cfg.mode.compile_mode, dict(cfg.compile.options),
                               modes.kind_options(cfg.mode))
        if "compile_mode" in cfg.mode
        else None
    )
    peaks = env.device_peaks(device)
    environment = env.collect(redact(plan.config), device, cfg.seed)
    environment.update(
        peaks=peaks,
        inductor_options=inductor_options,
        shape_set=plan.shape_set,
        job_id=plan.job_id,
        config_hash=plan.config_hash,
        cpu_banner=CPU_BANNER if device.type == "cpu" else None,
    )
    env_path = output_dir / "env.json"
    if cfg.resume and env_path.exists():  # keep the stamp of the rows the earlier run wrote
        env_path.rename(output_dir / f"env.before-{time.strftime('%Y%m%d-%H%M%S')}.json")
    env_path.write_text(json.dumps(environment, indent=2, default=str))

    tags = [
        f"kernel:{workload.name}",
        f"mode:{cfg.mode.name}",
        f"dtype:{cfg.dtype.name}",
        f"pass:{cfg['pass'].name}",
        f"gpu:{environment.get('gpu_name') or 'cpu'}",
        *cfg.wandb.tags,
    ]
    env_summary = {k: v for k, v in environment.items() if k != "config"}
    tracker = Tracker(
        plan.config["wandb"],
        {**plan.config, "env": env_summary},
        output_dir,
        name=cfg.name,
        group=run_group(cfg.wandb.group, plan.sweep_name, cfg.name),
        tags=tags,
    )
    code_dir = output_dir / "inductor_code" if cfg.compile.save_code else None
    job = plan.job(
        peaks=peaks,
        code_dir=code_dir,
        timer=timing.GpuTimer(device, cfg.bench.flush_l2) if device.type == "cuda" else None,
    )

    writer = JsonlWriter(results_path)
    rows, started, poisoned = [], time.perf_counter(), False
    unsupported = registry.unsupported(cfg.mode, workload.name)
    measure = model_measure.measure_model if getattr(workload, "is_model", False) else (
        measure_shape)
    bar = tqdm(
        todo,
        desc=f"{workload.name}/{cfg.mode.name}/{cfg.dtype.name}",
        unit="shape",
        dynamic_ncols=True,
        file=sys.stderr,
    )
    try:
        for step, (index, shape) in enumerate(bar):
            label = workload.label(shape)
            reason = unsupported or workload.unsupported_shape(shape, cfg["pass"].name, cfg.mode)
            if reason:
                record = skipped_record(job, shape, reason)
            else:
                record = measure(
                    job,
                    shape,
                    index,
                    lambda stage, label=label: bar.set_postfix_str(
                        f"{label} [{stage}]", refresh=True
                    ),
                )
            row = writer.write(record)
            rows.append(row)
            tracker.log_row(row, step)
            if faults.is_sticky_cuda_error(record.reason):
                poisoned = True  # every later call would fail: stop, and let a new process resume
                break
    finally:
        bar.close()
        writer.close()
        environment["gpu_state_after"] = env.gpu_state(device)
        environment["wall_s"] = time.perf_counter() - started
        env_path.write_text(json.dumps(environment, indent=2, default=str))
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)

    summary = summarize(rows)
    tracker.finish(rows, summary, code_dir)
    print_summary(cfg, rows, summary, output_dir, device)
    if poisoned:
        log.error("the CUDA context is lost (%s); rerun with resume=true, or use isolate=true "
                  "to continue in a new process automatically", rows[-1]["reason"])
        sys.exit(faults.POISONED_EXIT)
    return rows


def summarize(rows: list[dict]) -> dict:
    """Row counts and geomeans; the geomeans leave out the rows flagged noisy (their repeats
    disagree by more than bench.noisy_threshold), and say how many."""
    ok = [r for r in rows if r["status"] == "ok"]
    steady = [r for r in ok if not r.get("noisy")]
    return {
        "rows": len(rows),
        "ok": len(ok),
        "failed": sum(r["status"] == "failed" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "noisy_left_out": len(ok) - len(steady),
        "geomean_speedup_vs_eager": geomean([r["speedup_vs_eager"] for r in steady]),
        "geomean_latency_speedup_vs_eager": geomean(
            [r["latency_speedup_vs_eager"] for r in steady]
        ),
    }


def print_summary(cfg, rows, summary, output_dir: Path, device) -> None:
    speedup = summary["geomean_speedup_vs_eager"]
    lines = [
        "",
        f"{cfg.name} on {device}: {summary['ok']} ok, {summary['failed']} failed, "
        f"{summary['skipped']} skipped; geomean speedup_vs_eager "
        + (f"{speedup:.3f}" if speedup else "-")
        + (f" ({summary['noisy_left_out']} noisy rows left out)"
           if summary["noisy_left_out"] else ""),
        format_table(rows),
        f"records: {output_dir / 'results.jsonl'}",
        f"env:     {output_dir / 'env.json'}",
    ]
    if device.type == "cpu":
        lines.insert(1, CPU_BANNER)
    print("\n".join(lines), flush=True)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    # Every job of the command line is composed and validated before Hydra makes any folder or
    # runs anything: a bad value is one `error:` line and exit 2 (Hydra's own errors included).
    try:
        schema.preflight(sys.argv[1:], CONF_DIR, check_secrets=refuse_secrets)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    # Call main through the module's importable name: submitit (launcher=gpus|slurm) pickles the
    # task function, and one from __main__ is pickled by value, with torch's unpicklable configs.
    from experiments.run import main as importable_main

    importable_main()
