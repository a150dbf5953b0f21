"""Records into one DataFrame: from results.jsonl folders (offline) or from W&B runs (online).

    from analysis.load import load_results, caption
    results = load_results("results/h100")   # every results.jsonl below the folder
    results.frame, results.problems           # the rows; lines that could not be read, and why

One row per record (the fields of experiments.records.Record, `pass` spelled as in the JSONL),
plus from the env.json beside each results.jsonl: what the job fused (`epilogue`, e.g. "bias+gelu",
for linear and conv) and its conv `memory_format`; where it ran: gpu_name, torch, triton, git_sha,
git_short_sha, peak_copy_gbps, peak_bf16_tflops; `job_dir`; and `activations`: "static" when every
activation of the workload was marked static (bench.static_inputs=true), else "inputs" (the
default view, in which CUDA-graph modes copy their inputs on every call).
"""

import ast
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from experiments import registry
from experiments.records import FIELDS, geomean, validate

__all__ = [
    "ENV_COLUMNS", "Results", "caption", "drop_noisy", "geomean", "load_results", "load_wandb",
    "records_frame",
]

ENV_COLUMNS = [
    "epilogue",
    "memory_format",
    "gpu_name",
    "torch",
    "triton",
    "git_sha",
    "git_short_sha",
    "peak_copy_gbps",
    "peak_bf16_tflops",
]
COLUMNS = FIELDS + ENV_COLUMNS + ["job_dir", "activations"]
LIST_FIELDS = ("shape", "static_inputs", "notes")  # W&B tables store these as str(value)


@dataclass
class Results:
    frame: pd.DataFrame
    problems: list[str] = field(default_factory=list)


def env_columns(env: dict | None, config: dict | None = None) -> dict:
    """The env.json entries a figure or table names: where and with what the rows were made."""
    if not env:
        return {name: math.nan for name in ENV_COLUMNS}
    peaks = env.get("peaks") or {}
    sha = env.get("git_sha")
    kernel_cfg = ((config if config is not None else env.get("config")) or {}).get("kernel") or {}
    return {
        "epilogue": epilogue(kernel_cfg),
        "memory_format": kernel_cfg.get("memory_format", math.nan),
        "gpu_name": env.get("gpu_name", math.nan),
        "torch": env.get("torch", math.nan),
        "triton": env.get("triton", math.nan),
        "git_sha": sha if sha else math.nan,
        "git_short_sha": sha[:7] if sha else math.nan,
        "peak_copy_gbps": peaks.get("copy_gbps", math.nan),
        "peak_bf16_tflops": peaks.get("bf16_matmul_tflops", math.nan),
    }


def epilogue(kernel_cfg: dict):
    """What a linear or conv job fused after its GEMM: "bias+gelu", "bias", "relu", "none";
    NaN for kernels without the options (matmul, softmax)."""
    if "bias" not in kernel_cfg and "activation" not in kernel_cfg:
        return math.nan
    parts = ["bias"] if kernel_cfg.get("bias") else []
    if kernel_cfg.get("activation") not in (None, "none"):
        parts.append(str(kernel_cfg["activation"]))
    return "+".join(parts) or "none"


def activations(kernel: str, static_inputs) -> str:
    spec = registry.OPS.get(kernel)
    if spec is None or not isinstance(static_inputs, list | tuple):
        return "inputs"
    return "static" if set(spec.workload.input_names) <= set(static_inputs) else "inputs"


def drop_noisy(frame: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The frame without its ok rows flagged noisy (repeats that disagreed by more than
    bench.noisy_threshold), and how many were left out. Geomeans and figures use this view by
    default; `--include-noisy` on their CLIs keeps every row."""
    noisy = (frame["status"] == "ok") & frame["noisy"].fillna(False).astype(bool)
    return frame[~noisy], int(noisy.sum())


def records_frame(rows: list[dict]) -> pd.DataFrame:
    """Rows (record fields + env columns + job_dir) as a frame with every column present."""
    for row in rows:
        row["activations"] = activations(row.get("kernel"), row.get("static_inputs"))
    frame = pd.DataFrame(rows)
    extra = sorted(set(frame.columns) - set(COLUMNS))
    return frame.reindex(columns=COLUMNS + extra).reset_index(drop=True)


def _read_env(path: Path, problems: list[str]) -> dict | None:
    if not path.exists():
        problems.append(f"{path}: missing; gpu, versions and peaks of its records are unknown")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        problems.append(f"{path}: unreadable ({exc}); gpu, versions and peaks are unknown")
        return None


def load_results(root) -> Results:
    """Every results.jsonl below `root`, in sorted path order; bad lines are skipped and reported.

    A line that is not JSON (a job killed mid-write leaves a truncated last line) or does not
    follow the schema is left out and named in `problems` as "path:line: message"; every other
    line still loads.
    """
    root = Path(root)
    paths = sorted(root.rglob("results.jsonl")) if root.is_dir() else []
    if not paths:
        raise FileNotFoundError(f"no results.jsonl under {root} (is it a sweep or results folder?)")
    rows, problems = [], []
    for path in paths:
        env = env_columns(_read_env(path.parent / "env.json", problems))
        lines = path.read_text(encoding="utf-8").splitlines()
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"{path}:{line_no}: not valid JSON ({exc.msg}); truncated?")
                continue
            if not isinstance(row, dict):
                problems.append(f"{path}:{line_no}: not a JSON object")
                continue
            if errors := validate(row):
                problems.append(f"{path}:{line_no}: {'; '.join(errors)}")
                continue
            rows.append({**row, **env, "job_dir": str(path.parent)})
    if not rows:
        raise FileNotFoundError(
            f"no valid records under {root}: {len(problems)} problem(s), first: {problems[:1]}"
        )
    return Results(frame=records_frame(rows), problems=problems)


# ---------------------------------------------------------------------------------------------
# W&B
# ---------------------------------------------------------------------------------------------
def _parse_cell(name: str, value):
    """Undo experiments.tracking._cell: list/dict fields were logged as their str()."""
    if name in LIST_FIELDS and isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return value
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def _rows_table(run):
    """The "rows" wandb.Table a run logged (a run_table artifact named run-<id>-rows)."""
    tables = [
        artifact
        for artifact in run.logged_artifacts()
        if artifact.type == "run_table" and artifact.name.split(":")[0].endswith("-rows")
    ]
    return tables[-1].get("rows") if tables else None


def load_wandb(project: str, entity: str | None = None, api=None) -> pd.DataFrame:
    """The rows of every run in a W&B project, in the same shape as load_results(...).frame.

    Each job logs its rows once, as the wandb.Table "rows", and its env.json (less the config)
    as config["env"]. Runs without a table (crashed, or W&B failed) are left out and listed,
    with rows that fail the schema, in `frame.attrs["problems"]`.
    """
    if api is None:
        import wandb

        api = wandb.Api()
    path = f"{entity}/{project}" if entity else project
    rows, problems = [], []
    for run in api.runs(path):
        table = _rows_table(run)
        if table is None:
            problems.append(f"wandb:{path}/{run.id}: no rows table")
            continue
        env = env_columns((run.config or {}).get("env"), config=run.config or {})
        for index, cells in enumerate(table.data):
            row = {
                name: _parse_cell(name, value)
                for name, value in zip(table.columns, cells, strict=True)
            }
            if errors := validate(row):
                problems.append(f"wandb:{path}/{run.id}:{index}: {'; '.join(errors)}")
                continue
            rows.append({**row, **env, "job_dir": f"wandb:{path}/{run.id}"})
    if not rows:
        raise FileNotFoundError(f"no rows tables in W&B project {path}")
    frame = records_frame(rows)
    frame.attrs["problems"] = problems
    return frame


# ---------------------------------------------------------------------------------------------
# Captions
# ---------------------------------------------------------------------------------------------
def _distinct(frame: pd.DataFrame, column: str) -> str:
    if column not in frame:
        return "?"
    values = sorted({str(v) for v in frame[column].dropna()})
    return ", ".join(values) if values else "?"


def caption(frame: pd.DataFrame) -> str:
    """One line naming the GPU(s), torch and triton versions and git SHA(s) of the rows."""
    return (
        f"{_distinct(frame, 'gpu_name')} · torch {_distinct(frame, 'torch')} · "
        f"triton {_distinct(frame, 'triton')} · records @ {_distinct(frame, 'git_short_sha')}"
    )
