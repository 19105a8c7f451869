"""The multi-client cluster: who this client is, where the others are, and a preflight handshake.

DTensor's own multi-client runtime does the work (one process per host, gRPC between them); this
package only describes it (`--client-id`/`--jobs`, DTensor's `DTENSOR_*` variables, or what a
scheduler hands each worker: `TF_CONFIG`, SLURM's `srun` variables, a TPU VM's `TPU_WORKER_*`,
read in `schedulers`) and checks it before TensorFlow starts (`preflight`). Without the check, a
missing peer, a wrong address or a port held by a stale process makes
`initialize_accelerator_system` wait forever or fail with a bare "Could not start gRPC server".
This package never imports TensorFlow.
"""

from __future__ import annotations

import os
import re
import typing

from dtcli.cluster.jobs import DEFAULT_JOB_NAME, Cluster, parse_jobs, split_address
from dtcli.cluster.preflight import DEFAULT_CONNECT_TIMEOUT, preflight
from dtcli.cluster.schedulers import (
    DEFAULT_PORT,
    ENV_PORT,
    ENV_TF_CONFIG,
    expand_nodelist,
    expand_tasks_per_node,
    from_scheduler,
    from_slurm,
    from_tf_config,
    from_tpu_vm,
)
from dtcli.errors import UsageError

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_JOB_NAME",
    "DEFAULT_PORT",
    "ENV_CLIENT_ID",
    "ENV_JOBS",
    "ENV_JOB_NAME",
    "ENV_PORT",
    "ENV_TF_CONFIG",
    "Cluster",
    "expand_nodelist",
    "expand_tasks_per_node",
    "export_env",
    "from_args",
    "from_scheduler",
    "from_slurm",
    "from_tf_config",
    "from_tpu_vm",
    "parse_jobs",
    "preflight",
    "split_address",
]

ENV_CLIENT_ID = "DTENSOR_CLIENT_ID"
ENV_JOBS = "DTENSOR_JOBS"
ENV_JOB_NAME = "DTENSOR_JOB_NAME"


def from_args(
    client_id: int | None, jobs: str | None, environ: typing.Mapping[str, str] | None = None
) -> Cluster | None:
    """The cluster from `--client-id`/`--jobs`, else DTensor's variables, else a scheduler's
    (`TF_CONFIG` of Kubeflow/Vertex AI, then SLURM's `srun`, then a TPU VM slice's); None: one
    process.

    The client count is the length of the jobs list (DTensor dropped DTENSOR_NUM_CLIENTS).
    """
    env = os.environ if environ is None else environ
    if jobs is None and client_id is None and not env.get(ENV_JOBS):
        found = from_scheduler(env)
        if found is not None:
            return found if found.num_clients > 1 else None
    jobs_where = "--jobs" if jobs is not None else ENV_JOBS
    id_where = "--client-id" if client_id is not None else ENV_CLIENT_ID
    if jobs is None:
        jobs = env.get(ENV_JOBS) or None
    if jobs is None:
        if client_id is not None:
            raise UsageError(
                f"--client-id: also give --jobs host:port,host:port,... (or {ENV_JOBS})"
            )
        return None
    entries = parse_jobs(jobs, jobs_where)
    if client_id is None:
        text = env.get(ENV_CLIENT_ID)
        if text is None:
            raise UsageError(f"{jobs_where} is set: also give --client-id (or {ENV_CLIENT_ID})")
        if not re.fullmatch(r"\d+", text.strip()):
            raise UsageError(f"{ENV_CLIENT_ID}: expected an integer, got {text!r}")
        client_id = int(text)
    if not 0 <= client_id < len(entries):
        raise UsageError(
            f"{id_where} {client_id}: expected 0 to {len(entries) - 1} "
            f"(the jobs list has {len(entries)} clients)"
        )
    job_name = env.get(ENV_JOB_NAME) or DEFAULT_JOB_NAME
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", job_name):
        raise UsageError(f"{ENV_JOB_NAME}: not a usable job name, got {job_name!r}")
    return Cluster(client_id, entries, job_name, where=jobs_where)


def export_env(cluster: Cluster) -> None:
    """Set the variables DTensor reads when `initialize_accelerator_system` starts its runtime."""
    os.environ[ENV_JOBS] = ",".join(cluster.jobs)
    os.environ[ENV_CLIENT_ID] = str(cluster.client_id)
    os.environ[ENV_JOB_NAME] = cluster.job_name
