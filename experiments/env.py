"""Stamp every job with where it ran (env.json), and measure the device's real ceilings once.

Peaks come from the device, never from a datasheet: a large device-to-device copy (bytes read plus
bytes written) and a large bf16 matmul through torch. They are cached per GPU, torch version and
driver under ~/.cache/triton-vs-compile/ (KBENCH_CACHE_DIR overrides) and recorded in env.json.
"""

import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_PREFIXES = (
    "TORCHINDUCTOR_",
    "TRITON_",
    "TORCH_COMPILE",
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_CUDA",
    "KBENCH_GRAPHS",
)


def git_state() -> dict:
    """SHA and dirty flag of the checkout. KBENCH_GIT_SHA, where set, names the commit instead
    (dirty unknown): for a copy of a tree without .git, or with a stale one (a working tree
    synced to a GPU host over an older clone records that clone's HEAD otherwise)."""
    if os.environ.get("KBENCH_GIT_SHA"):
        return {"git_sha": os.environ["KBENCH_GIT_SHA"], "git_dirty": None}

    def git(*args):
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10
        )

    try:
        sha = git("rev-parse", "HEAD")
        if sha.returncode == 0:
            dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip() != ""
            return {"git_sha": sha.stdout.strip(), "git_dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"git_sha": os.environ.get("KBENCH_GIT_SHA", "unknown"), "git_dirty": None}


def gpu_uuid(device: torch.device) -> str | None:
    """The GPU's UUID as NVML spells it: unlike the CUDA index, it names the physical device
    whatever CUDA_VISIBLE_DEVICES hides or reorders."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith("GPU-") else f"GPU-{text}"


def _nvml_handle(device: torch.device):
    import pynvml

    pynvml.nvmlInit()
    uuid = gpu_uuid(device)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError:
            pass  # fall back to the index, right when nothing narrows the visible devices
    index = device.index if device.index is not None else torch.cuda.current_device()
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def gpu_state(device: torch.device) -> dict:
    """Clocks, temperature and power right now, through NVML; says why when it cannot."""
    if device.type != "cuda":
        return {"nvml": "not a CUDA device"}
    try:
        import pynvml

        handle = _nvml_handle(device)
        return {
            "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        }
    except Exception as exc:  # pynvml missing, or no NVML in this container
        return {"nvml": f"unavailable: {type(exc).__name__}: {exc}"}


def driver_version() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:
        return None


def device_info(device: torch.device) -> dict:
    if device.type != "cuda":
        return {
            "device": "cpu",
            "gpu_name": None,
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
        }
    props = torch.cuda.get_device_properties(device)
    return {
        "device": str(device),
        "gpu_name": props.name,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "gpu_uuid": gpu_uuid(device),
        "gpu_memory_gb": round(props.total_memory / 1e9, 2),
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }


def software_versions() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "platform": platform.platform(),
    }


def cpu_affinity() -> list[int] | None:
    """The cores this process may run on (None where the OS cannot say)."""
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def relevant_env_vars() -> dict:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}


def graphed_backward() -> bool:
    from kernels import _graphs

    return _graphs.GRAPHS


def collect(config: dict, device: torch.device, seed: int) -> dict:
    return {
        **device_info(device),
        **software_versions(),
        **git_state(),
        "hostname": socket.gethostname(),
        "argv": sys.argv[1:],
        "seed": seed,
        "env_vars": relevant_env_vars(),
        # whether our kept backwards replay as CUDA graphs (kernels._graphs; KBENCH_GRAPHS=0: no)
        "graphed_backward": graphed_backward(),
        # the cores this job may run on (launcher=gpus pins each job to its GPU's share)
        "cpu_affinity": cpu_affinity(),
        "config": config,
        "gpu_state_before": gpu_state(device),
    }


# ---------------------------------------------------------------------------------------------
# Measured ceilings
# ---------------------------------------------------------------------------------------------
def _cache_path(device: torch.device) -> Path:
    root = Path(os.environ.get("KBENCH_CACHE_DIR", Path.home() / ".cache" / "triton-vs-compile"))
    name = torch.cuda.get_device_name(device).replace(" ", "_")
    key = f"peaks-{name}-torch{torch.__version__}-driver{driver_version()}.json"
    return root / key.replace("/", "_")


def _copy_gbps(device: torch.device, nbytes: int = 1 << 30) -> float:
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), rep=200, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9  # read + write


def _bf16_matmul_tflops(device: torch.device, size: int = 8192) -> float:
    import triton.testing

    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    ms = triton.testing.do_bench(lambda: a @ b, rep=200, return_mode="median")
    return 2 * size**3 / (ms * 1e-3) / 1e12


def measure_peaks(device: torch.device) -> dict:
    return {
        "copy_gbps": _copy_gbps(device),
        "bf16_matmul_tflops": _bf16_matmul_tflops(device),
        "method": "do_bench median: 1 GiB device-to-device copy; 8192^3 bf16 torch.matmul",
    }


def device_peaks(device: torch.device) -> dict | None:
    """The device's measured copy bandwidth and bf16 matmul rate, cached after the first job."""
    if device.type != "cuda":
        return None
    path = _cache_path(device)
    if path.exists():
        return {**json.loads(path.read_text()), "cached": str(path)}
    peaks = measure_peaks(device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(peaks, indent=2))
    return {**peaks, "cached": None}
