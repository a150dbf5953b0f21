"""Run a job's shapes in a child process, so a fault that kills a process costs one row.

A CUDA illegal-address error poisons the whole process, and compiler state leaks from one job to
the next. With isolation (isolate=auto in a local multirun), the Hydra job starts
`python -m experiments.run` on its own saved config (.hydra/config.yaml) with resume=true. If
that child dies, the shape it was measuring, the first one without a row, is recorded as failed,
and a new child carries on from the next shape. A child whose CUDA context is lost (an illegal
address, say) records its failed row itself and exits with POISONED_EXIT, and a new child goes on.
"""

import collections
import logging
import re
import signal
import subprocess
import sys

from experiments.faults import POISONED_EXIT
from experiments.measure import base_record
from experiments.processes import child_env
from experiments.records import JsonlWriter, read_jsonl, recorded_keys
from experiments.tracking import redact, run_group

log = logging.getLogger(__name__)


def quoted(value: str) -> str:
    """A string as a quoted Hydra override value, so that "1" or "1e3" stays a string."""
    return "'" + value.replace("'", "\\'") + "'"  # Hydra unescapes only quotes


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def missing_shapes(plan) -> list[tuple[int, dict]]:
    done = recorded_keys(plan.output_dir / "results.jsonl")
    return [
        (i, shape)
        for i, shape in enumerate(plan.shapes)
        if (plan.config_hash, plan.workload.label(shape)) not in done
    ]


# A line of a Python traceback's end or of an `error:` message: what a dying worker said last
ERROR_LINE = re.compile(r"^(?:(?:\w+\.)*[A-Z]\w*(?::|$)|error:)")  # `pkg.mod.SomeError: text`


def last_error(lines) -> str | None:
    """The last error line among a worker's final stderr lines, if it printed one."""
    return next((line.strip() for line in reversed(lines) if ERROR_LINE.match(line)), None)


def run_worker(command: list[str], env: dict) -> tuple[int, str | None]:
    """The worker's exit code and its last error line; its stderr still reaches ours, line by
    line, so the job's log shows it as before."""
    tail = collections.deque(maxlen=200)
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True,
                          errors="replace") as child:  # fmt: skip
        for line in child.stderr:
            sys.stderr.write(line)
            tail.append(line)
    sys.stderr.flush()
    return child.returncode, last_error(tail)


def record_death(plan, index: int, shape: dict, returncode: int, error: str | None) -> None:
    record = base_record(plan.job(), shape)
    record.status, record.stage = "failed", "worker"
    record.reason = (
        f"the job's worker process died ({describe_exit(returncode)}) "
        f"while measuring shape {index} of its set"
        + (f"; its last error: {redact(error[:300])}" if error else "")
    )
    writer = JsonlWriter(plan.output_dir / "results.jsonl")
    writer.write(record)
    writer.close()
    log.warning("%s: %s", record.shape_label, record.reason)


def run_isolated(plan) -> list[dict]:
    cfg = plan.cfg
    command = [
        sys.executable,
        "-m",
        "experiments.run",
        f"--config-path={plan.output_dir / '.hydra'}",
        "--config-name=config",
        f"hydra.run.dir={plan.output_dir}",
        "hydra.output_subdir=.hydra-worker",  # keep the parent's own config dumps as they are
        "isolate=false",
        "resume=true",
        f"wandb.group={quoted(run_group(cfg.wandb.group, plan.sweep_name, cfg.name))}",
    ]
    env = child_env({"KBENCH_JOB_ID": plan.job_id})
    for _ in range(len(plan.shapes)):  # each death records a row, so this always ends
        returncode, error = run_worker(command, env)
        missing = missing_shapes(plan)
        if returncode == 0 or not missing:
            break
        if returncode == POISONED_EXIT:
            continue  # it recorded its failed row and stopped cleanly: a new child goes on
        index, shape = missing[0]
        record_death(plan, index, shape, returncode, error)
        if len(missing) == 1:
            break
    rows = [
        row
        for row in read_jsonl(plan.output_dir / "results.jsonl")
        if row.get("config_hash") == plan.config_hash
    ]
    failed = sum(row["status"] != "ok" for row in rows)
    print(
        f"job {plan.job_id}: {len(rows)} rows, {failed} not ok "
        f"(records: {plan.output_dir / 'results.jsonl'})",
        flush=True,
    )
    return rows
