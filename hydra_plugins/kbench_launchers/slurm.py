"""The SLURM launcher, with a summary when tasks fail.

hydra-submitit-launcher waits for the array's tasks in order and raises at the first one that
failed, so the sweep ends in a traceback: the tasks still running are not waited for, nothing
finished is merged, and which tasks failed, and why, is left to the logs. This launcher waits for
every task, merges and prints what finished (experiments.callbacks.AggregateRecords), prints one
line per failed task (its SLURM job id, state, overrides and the first line of its error), and
then fails the sweep with those lines.
"""

import logging

from hydra_plugins.hydra_submitit_launcher import submitit_launcher

from hydra_plugins.kbench_launchers.submitted import submitted_jobs

log = logging.getLogger(__name__)


class SweepTasksFailed(RuntimeError):
    """Some array tasks of a sweep failed; the message has one line per failed task."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


class SlurmLauncher(submitit_launcher.SlurmLauncher):
    def launch(self, job_overrides, initial_job_idx):
        with submitted_jobs() as jobs:
            try:
                return super().launch(job_overrides, initial_job_idx)
            except Exception as first:  # a task failed: wait for the rest, then summarize
                lines = self._failed_tasks(jobs, job_overrides, initial_job_idx)
                self._merge_finished()
                summary = "\n".join([f"{len(lines)} of {len(jobs)} SLURM tasks failed:", *lines])
                print(summary, flush=True)
                raise SweepTasksFailed(summary) from first

    @staticmethod
    def _failed_tasks(jobs, job_overrides, initial_job_idx) -> list[str]:
        lines = []
        for index, (job, overrides) in enumerate(zip(jobs, job_overrides, strict=False)):
            try:
                job.results()
            except Exception as exc:  # noqa: BLE001 (each failure is a line of the summary)
                state = getattr(job, "state", "?")
                task = " ".join(o for o in overrides if not o.startswith("hydra."))
                lines.append(f"  task #{initial_job_idx + index} (SLURM job {job.job_id}, "
                             f"state {state}): {task}: {_first_line(exc)}")  # fmt: skip
        return lines

    def _merge_finished(self) -> None:
        from experiments.callbacks import AggregateRecords

        try:
            AggregateRecords().on_multirun_end(self.config)
        except Exception as exc:  # noqa: BLE001 (the summary of failures matters more)
            log.warning("could not merge the finished tasks' records: %s", _first_line(exc))
