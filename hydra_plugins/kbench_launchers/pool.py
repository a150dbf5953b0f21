"""launcher=gpus_pool: one local task per GPU, each running the sweep's jobs one after another.

launcher=gpus starts a process per job (submitit's local executor), which then waits for a free
GPU, picks it and imports torch, Hydra and the harness: on a GPU host that start is several
seconds a job, most of a short study job's cost (docs/study.md). This launcher starts one task
per GPU instead. Each runs the same `setup` as launcher=gpus once (the GPU lock, the CPU cores),
then claims the sweep's jobs in order from a counter in the sweep folder, and runs each the way
launcher=gpus runs it (under `isolate=auto`, each job still measures in a worker process of its
own, so a crash costs one row as before). A task that dies loses no record: the jobs it finished
are on disk, and every job it did not return is listed when the sweep fails.
"""

import fcntl
import logging
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher import submitit_launcher

from hydra_plugins.kbench_launchers.submitted import submitted_jobs

log = logging.getLogger(__name__)


class PoolTasksFailed(RuntimeError):
    """A pool task died; the message names the jobs it did not return."""


def claim(counter: Path) -> int:
    """The next job index of a pool, from the file `counter` (locked while read and advanced)."""
    with open(counter, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        index = int(handle.read() or 0)
        handle.seek(0)
        handle.truncate()
        handle.write(str(index + 1))
        handle.flush()
        return index


class PooledLocalLauncher(submitit_launcher.LocalLauncher):
    def __init__(self, pool_size=None, **params) -> None:
        super().__init__(**params)
        self.pool_size = pool_size
        self.pool: dict | None = None  # what the tasks read: the jobs and the counter

    def launch(self, job_overrides, initial_job_idx):
        assert self.config is not None
        from experiments.study import visible_gpus

        jobs = [list(overrides) for overrides in job_overrides]
        tasks = min(len(jobs), self.pool_size or max(1, visible_gpus()))
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        counter = sweep_dir / ".pool" / f"next-{initial_job_idx}"
        counter.parent.mkdir(parents=True, exist_ok=True)
        counter.write_text("0")
        for index, overrides in enumerate(jobs):
            log.info(f"\t#{initial_job_idx + index} : {' '.join(filter_overrides(overrides))}")
        log.info(f"launcher=gpus_pool: {len(jobs)} jobs on {tasks} pool tasks")
        self.pool = {"jobs": jobs, "first": initial_job_idx, "counter": str(counter),
                     "state": Singleton.get_state()}  # fmt: skip
        returned = {}
        # the plugin's launch, with the pool's tasks in place of the jobs: each task is a call
        # of __call__ below with no overrides of its own
        with submitted_jobs() as executor_jobs:
            try:
                super().launch([[] for _ in range(tasks)], initial_job_idx)
            except Exception:  # noqa: BLE001 (a task died: the others' jobs still count, below)
                pass
        lost = []
        for task in executor_jobs:
            try:
                for index, result in task.results()[0]:
                    returned[index] = result
            except Exception as exc:  # noqa: BLE001 (each dead task is a line of the summary)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                lost.append(f"pool task {task.job_id}: {type(exc).__name__}: {first}")
        missing = [i for i in range(len(jobs)) if i not in returned]
        if missing:
            lines = [f"  #{initial_job_idx + i}: {' '.join(filter_overrides(jobs[i]))}"
                     for i in missing]  # fmt: skip
            summary = "\n".join([f"{len(missing)} of {len(jobs)} jobs were not returned "
                                 "(their finished shapes' records are on disk):", *lost, *lines])
            print(summary, flush=True)
            raise PoolTasksFailed(summary)
        return [returned[i] for i in range(len(jobs))]

    def __call__(self, sweep_overrides, job_dir_key, job_num, job_id, singleton_state):
        """One pool task: claim jobs until none is left, run each as launcher=gpus would."""
        assert self.pool is not None
        done = []
        while (index := claim(Path(self.pool["counter"]))) < len(self.pool["jobs"]):
            number = self.pool["first"] + index
            result = super().__call__(self.pool["jobs"][index], job_dir_key, number,
                                      f"job_id_for_{number}", self.pool["state"])  # fmt: skip
            if result.status == JobStatus.FAILED:
                log.warning("job #%d failed: %s", number, result._return_value)
            done.append((index, result))
        return done
