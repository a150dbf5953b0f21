"""The record schema, written down once: analysis, W&B and the tests all read it from here.

One `Record` is one line of results.jsonl: one (kernel, shape, dtype, pass, mode) measured in one
job. Times are medians (p50) with p20/p80 beside them. README.md's "Records" section describes the
same fields for readers.
"""

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "skipped")


@dataclass
class Record:
    # what was run
    kernel: str
    mode: str
    shape: dict
    shape_label: str
    shape_set: str
    dtype: str
    pass_: str
    tf32: bool
    device: str
    static_inputs: list
    run_name: str
    job_id: str
    config_hash: str | None = None  # hash of what decides the measurement; resume keys rows on it
    # the outcome
    status: str = "ok"  # ok | failed | skipped
    reason: str | None = None  # why a row failed or was skipped
    stage: str | None = None  # where it failed: build, compile, correctness, timing
    max_rel_err: float | None = None  # worst ||out - ref|| / ||ref|| over seeds and outputs
    tolerance: float | None = None
    seeds_checked: int = 0
    # GPU time of one call (ms): events + L2 flush, CPU path kept off the clock; on a CPU the
    # calling thread's CPU time (cpu-thread-time, one thread) or the wall clock (cpu-wall)
    timer: str | None = None
    time_ms_p50: float | None = None
    time_ms_p20: float | None = None
    time_ms_p80: float | None = None
    eager_time_ms_p50: float | None = None
    speedup_vs_eager: float | None = None  # eager time / mode time, medians of interleaved pairs
    repeat_spread: float | None = None  # largest (max - min) / median over the pairs' repeats
    noisy: bool = False
    # triton.testing.do_bench as commonly used (its events also catch a long CPU path)
    do_bench_ms_p50: float | None = None
    do_bench_ms_p20: float | None = None
    do_bench_ms_p80: float | None = None
    eager_do_bench_ms_p50: float | None = None  # the same for eager's call, in the same job
    # CUDA-graph replay of one call (ms); None for modes that already run as CUDA graphs
    cudagraph_ms: float | None = None
    eager_cudagraph_ms: float | None = None
    # wall-clock per call, back-to-back, one final sync (us)
    call_latency_us_p50: float | None = None
    call_latency_us_p20: float | None = None
    call_latency_us_p80: float | None = None
    eager_call_latency_us_p50: float | None = None
    latency_speedup_vs_eager: float | None = None
    # compile cost (s): first call with an empty cache, then again after a reset with a warm one
    compile_cold_s: float | None = None
    compile_warm_s: float | None = None
    graph_breaks: int | None = None  # when compiling
    # compiled rows: Inductor replaced a matmul-softmax-matmul pattern by one fused attention call
    fused_attention: bool | None = None
    recompiles_during_timing: int | None = None
    graph_breaks_during_timing: int | None = None
    peak_mem_mb: float | None = None  # above the inputs, during the mode's calls
    # whole models (experiments/model_measure.py): the dashboard's figures beside the op ones
    eager_peak_mem_mb: float | None = None  # eager's, in the same job
    peak_mem_ratio: float | None = None  # peak_mem_mb / eager_peak_mem_mb
    graphs_compiled: int | None = None  # Dynamo graphs at the first call (1 + graph breaks)
    eager_max_rel_err: float | None = None  # eager's own worst error against float64
    accuracy_ratio: float | None = None  # output's and gradients' error / eager's, the worse
    accuracy_pass: bool | None = None  # every tensor within 2x eager's error + tolerance / 10
    fallbacks: dict | None = None  # kernels.enable()'s calls per op: {op: {"ours"|reason: n}}
    fallback_share: float | None = None  # the share of those calls left to torch
    # derived from analytic formulas and the device's measured peaks
    flops: float | None = None
    min_bytes: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    pct_peak_flops: float | None = None
    pct_peak_bw: float | None = None
    # GPU ms of a device copy moving min_bytes (half read, half written), timed as the row was,
    # and the row's rate as a percent of that copy's: the roofline at the row's own size
    copy_ms_same_bytes: float | None = None
    pct_copy_same_bytes: float | None = None
    notes: list = field(default_factory=list)  # non-fatal remarks (a timer that did not apply, ...)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        row = dataclasses.asdict(self)
        row["pass"] = row.pop("pass_")
        return {k: _finite_or_none(v) for k, v in row.items()}


def _finite_or_none(value):
    """JSON has no NaN or inf: write them as null (the status and reason say what happened)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


FIELDS = [f.name if f.name != "pass_" else "pass" for f in dataclasses.fields(Record)]
REQUIRED = [
    f.name if f.name != "pass_" else "pass"
    for f in dataclasses.fields(Record)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
]


def validate(row: dict) -> list[str]:
    """Problems with one parsed results.jsonl row; an empty list means it follows the schema."""
    problems = [f"missing field {name!r}" for name in REQUIRED if name not in row]
    problems += [f"unknown field {name!r}" for name in row if name not in FIELDS]
    if row.get("status") not in STATUSES:
        problems.append(f"status {row.get('status')!r} is not one of {STATUSES}")
    if row.get("status") == "ok":
        for name in ("time_ms_p50", "speedup_vs_eager", "max_rel_err"):
            if row.get(name) is None:
                problems.append(f"ok row without {name}")
    elif not row.get("reason"):
        problems.append(f"{row.get('status')} row without a reason")
    return problems


class JsonlWriter:
    """Appends one JSON line per record and flushes it, so a crash keeps every finished row."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: Record) -> dict:
        row = record.to_json()
        self._file.write(json.dumps(row, sort_keys=True) + "\n")
        self._file.flush()
        return row

    def close(self) -> None:
        self._file.close()


def recorded_keys(path: Path) -> set[tuple[str | None, str]]:
    """(config_hash, shape_label) of every readable row already in a results.jsonl."""
    keys = set()
    if Path(path).exists():
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
                keys.add((row.get("config_hash"), row["shape_label"]))
            except (json.JSONDecodeError, KeyError, AttributeError, TypeError):
                continue  # a line cut short by a crash: that shape is measured again
    return keys


def read_jsonl(path: Path) -> list[dict]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


SUMMARY_COLUMNS = [  # (header, field, format)
    ("shape", "shape_label", "{}"),
    ("status", "status", "{}"),
    ("time_ms", "time_ms_p50", "{:.4f}"),
    ("eager_ms", "eager_time_ms_p50", "{:.4f}"),
    ("speedup_vs_eager", "speedup_vs_eager", "{:.3f}"),
    ("latency_us", "call_latency_us_p50", "{:.1f}"),
    ("TFLOP/s", "tflops", "{:.1f}"),
    ("GB/s", "gbps", "{:.0f}"),
    ("rel_err", "max_rel_err", "{:.1e}"),
]


def format_table(rows: list[dict]) -> str:
    """A plain-text table of a job's rows, with flags and failure reasons on the right."""
    headers = [h for h, _, _ in SUMMARY_COLUMNS] + ["flags"]
    body = []
    for row in rows:
        cells = ["-" if row.get(f) is None else fmt.format(row[f]) for _, f, fmt in SUMMARY_COLUMNS]
        flags = [
            name
            for name, on in (
                ("noisy", row.get("noisy")),
                ("recompiled", row.get("recompiles_during_timing")),
            )
            if on
        ]
        if row.get("reason"):
            flags.append(row["reason"][:80])
        body.append(cells + [" ".join(flags)])
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [headers, *body]
    ]
    return "\n".join(lines)


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))
