"""This repo's Hydra launcher plugins (Hydra finds launchers only under the hydra_plugins
namespace package): `slurm.SlurmLauncher`, hydra-submitit-launcher's with a failure summary, and
`pool.PooledLocalLauncher` (launcher=gpus_pool), a task per GPU running the jobs in turn."""
