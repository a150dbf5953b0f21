"""One Hydra job: `python -m experiments.run kernel=matmul mode=max-autotune`.

`make experiment` and `make sweep` call this module.

It measures every shape of one shape set for one (kernel, mode, dtype, pass), writes
results.jsonl and env.json in the job's output directory, logs to W&B, and prints a summary.
Configuration errors exit 2 with one line; a failing shape is a failed row and the job goes on.
"""

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments import env, modes, timing
from experiments.errors import ConfigError
from experiments.measure import Job, measure_shape
from experiments.records import JsonlWriter, format_table, geomean
from experiments.tracking import Tracker, find_secret_keys, redact, scrub_hydra_dir
from experiments.workloads import make_workload, resolve_shapes
from kernels._common import is_interpreter

log = logging.getLogger(__name__)

CPU_BANNER = (
    "CPU run: no GPU in use. Triton kernels run in the interpreter and torch.compile on "
    "Inductor's CPU backend. The pipeline is the same; the timings are NOT representative."
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
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
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
    job_id = (
        f"{Path(hydra_cfg.sweep.dir).name}/{hydra_cfg.job.num}" if multirun else output_dir.name
    )
    return output_dir, job_id, Path(hydra_cfg.sweep.dir).name if multirun else None


def run(cfg: DictConfig) -> list[dict]:
    output_dir, job_id, sweep_name = job_identity()
    config = OmegaConf.to_container(cfg, resolve=True)
    secrets = find_secret_keys(config)
    if secrets:
        scrub_hydra_dir(output_dir)
        raise ConfigError(
            f"config keys {secrets} look like credentials: put the W&B key in "
            "WANDB_API_KEY, never in a config or an override"
        )
    device = resolve_device(cfg.device)
    if device.type == "cpu" and "triton" in cfg.mode.kind and not is_interpreter():
        raise ConfigError(
            "device=cpu with a CUDA GPU present: Triton kernels need "
            "TRITON_INTERPRET=1 in the environment to run on the CPU"
        )
    if device.type == "cpu":
        # Inductor's pool of compile workers competes with the timed calls for a small CPU's cores.
        torch._inductor.config.compile_threads = 1
    workload = make_workload(cfg.kernel)
    workload.check_pass(cfg["pass"].name)
    modes.check_mode(cfg.mode)
    dtype = resolve_dtype(cfg.dtype)
    shape_set, shapes = resolve_shapes(workload, cfg.kernel, cfg.shapes, device.type == "cuda")
    set_tf32(bool(cfg.dtype.tf32))

    cache_dir = use_fresh_compile_cache() if cfg.compile.fresh_cache else None
    if device.type == "cpu":
        log.warning(CPU_BANNER)
    torch.compiler.reset()
    inductor_options = (
        modes.resolved_options(cfg.mode.compile_mode, dict(cfg.compile.options))
        if "compile_mode" in cfg.mode
        else None
    )
    peaks = env.device_peaks(device)
    environment = env.collect(redact(config), device, cfg.seed)
    environment.update(
        peaks=peaks,
        inductor_options=inductor_options,
        shape_set=shape_set,
        job_id=job_id,
        cpu_banner=CPU_BANNER if device.type == "cpu" else None,
    )
    env_path = output_dir / "env.json"
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
        config["wandb"],
        {**config, "env": env_summary},
        output_dir,
        name=cfg.name,
        group=cfg.wandb.group or sweep_name or cfg.name,
        tags=tags,
    )
    code_dir = output_dir / "inductor_code" if cfg.compile.save_code else None
    job = Job(
        cfg=cfg,
        workload=workload,
        device=device,
        dtype=dtype,
        peaks=peaks,
        code_dir=code_dir,
        shape_set=shape_set,
        job_id=job_id,
        timer=timing.GpuTimer(device, cfg.bench.flush_l2) if device.type == "cuda" else None,
    )

    writer = JsonlWriter(output_dir / "results.jsonl")
    rows, started = [], time.perf_counter()
    bar = tqdm(
        shapes,
        desc=f"{workload.name}/{cfg.mode.name}/{cfg.dtype.name}",
        unit="shape",
        dynamic_ncols=True,
        file=sys.stderr,
    )
    try:
        for step, shape in enumerate(bar):
            label = workload.label(shape)
            record = measure_shape(
                job,
                shape,
                lambda stage, label=label: bar.set_postfix_str(f"{label} [{stage}]", refresh=True),
            )
            row = writer.write(record)
            rows.append(row)
            tracker.log_row(row, step)
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
    return rows


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["status"] == "ok"]
    return {
        "rows": len(rows),
        "ok": len(ok),
        "failed": sum(r["status"] == "failed" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "geomean_speedup_vs_eager": geomean([r["speedup_vs_eager"] for r in ok]),
        "geomean_latency_speedup_vs_eager": geomean([r["latency_speedup_vs_eager"] for r in ok]),
    }


def print_summary(cfg, rows, summary, output_dir: Path, device) -> None:
    speedup = summary["geomean_speedup_vs_eager"]
    lines = [
        "",
        f"{cfg.name} on {device}: {summary['ok']} ok, {summary['failed']} failed, "
        f"{summary['skipped']} skipped; geomean speedup_vs_eager "
        + (f"{speedup:.3f}" if speedup else "-"),
        format_table(rows),
        f"records: {output_dir / 'results.jsonl'}",
        f"env:     {output_dir / 'env.json'}",
    ]
    if device.type == "cpu":
        lines.insert(1, CPU_BANNER)
    print("\n".join(lines), flush=True)


@hydra.main(version_base="1.3", config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    try:
        run(cfg)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
