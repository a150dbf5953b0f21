"""What both launchers need from hydra-submitit-launcher's launch: the submitit jobs it made."""

import contextlib
from unittest import mock


@contextlib.contextmanager
def submitted_jobs():
    """Within it, the plugin's launch keeps every submitit job it submits in the yielded list (it
    keeps none itself once a task fails), so a launcher can wait for and read each of them."""
    import submitit

    jobs = []
    map_array = submitit.AutoExecutor.map_array

    def keep(executor, *args, **kwargs):
        jobs.extend(map_array(executor, *args, **kwargs))
        return jobs

    with mock.patch.object(submitit.AutoExecutor, "map_array", keep):
        yield jobs
