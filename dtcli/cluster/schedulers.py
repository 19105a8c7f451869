"""Where the cluster comes from when a scheduler starts the clients: `TF_CONFIG` (Kubeflow TFJob,
Vertex AI), the variables of a SLURM `srun` step, or those of a Cloud TPU VM slice."""

from __future__ import annotations

import json
import re
import typing

from dtcli.cluster.jobs import DEFAULT_JOB_NAME, Cluster, parse_jobs
from dtcli.errors import UsageError

ENV_TF_CONFIG = "TF_CONFIG"
ENV_PORT = "DTCLI_PORT"
# The first job port of a SLURM step (client i on a node uses PORT + its local task id).
DEFAULT_PORT = 23456


def from_scheduler(environ: typing.Mapping[str, str]) -> Cluster | None:
    """The cluster a scheduler describes: `TF_CONFIG` first, then SLURM's `srun`, then a TPU VM
    slice's; None when none of them is set."""
    for find in (from_tf_config, from_slurm, from_tpu_vm):
        found = find(environ)
        if found is not None:
            return found
    return None


def from_tf_config(environ: typing.Mapping[str, str]) -> Cluster | None:
    """The cluster of a Kubeflow TFJob / Vertex AI worker pool from `TF_CONFIG`, numbered as
    TensorFlow maps it to DTensor's clients: the chief first, then the workers in order."""
    text = environ.get(ENV_TF_CONFIG, "").strip()
    if not text:
        return None
    where = ENV_TF_CONFIG
    try:
        config = json.loads(text)
    except json.JSONDecodeError:
        raise UsageError(f"{where}: not valid JSON ({text[:60]!r})") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise UsageError(
            f'{where}: expected {{"cluster": {{"chief": [...], "worker": [...]}}, '
            f'"task": {{"type": ..., "index": ...}}}}, got {text[:80]!r}'
        )
    others = sorted(set(cluster) - {"chief", "worker", "evaluator"})
    if others:
        raise UsageError(
            f"{where}: cluster job {others[0]!r} is not something DTensor runs (it has no "
            "parameter servers); dtcli trains with 'chief' and 'worker' tasks"
        )
    jobs: list[str] = []
    for kind in ("chief", "worker"):
        addresses = cluster.get(kind, [])
        if isinstance(addresses, dict):  # {index: address}, TensorFlow's sparse form
            addresses = [addresses[k] for k in sorted(addresses, key=int)]
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise UsageError(f"{where}: cluster.{kind}: expected a list of host:port strings")
        if kind == "chief" and len(addresses) > 1:
            raise UsageError(f"{where}: cluster.chief: expected one address, got {len(addresses)}")
        jobs += addresses
    if not jobs:
        raise UsageError(f"{where}: the cluster has no 'chief' or 'worker' task")
    entries = parse_jobs(jobs, f"{where} cluster")
    kind, index = task.get("type"), task.get("index", 0)
    if kind == "evaluator":
        raise UsageError(
            f"{where}: task type 'evaluator' is not a training client; dtcli trains on the "
            "chief and workers (evaluate their checkpoints with dtcli eval)"
        )
    if kind not in ("chief", "worker") or not isinstance(index, int) or isinstance(index, bool):
        raise UsageError(
            f"{where}: task: expected type 'chief' or 'worker' and an integer index, got {task!r}"
        )
    chiefs = len(cluster.get("chief") or [])
    client = index if kind == "chief" else chiefs + index
    count = len(cluster.get(kind) or [])
    if not 0 <= index < count:
        raise UsageError(f"{where}: task {kind} {index}: the cluster has {count} {kind} task(s)")
    return Cluster(client, entries, DEFAULT_JOB_NAME, where=where)


def expand_nodelist(text: str) -> list[str]:
    """SLURM's compressed host list: "node[01-03,07],gpu-a[1-2]" -> node01 node02 node03 node07
    gpu-a1 gpu-a2 (zero padding kept; several bracket groups in a name multiply)."""
    names: list[str] = []
    for item in _split_top(text.strip()):
        names += _expand_one(item, text)
    return names


def _split_top(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str, text: str) -> list[str]:
    found = re.search(r"\[([^\[\]]*)\]", item)
    if found is None:
        if "[" in item or "]" in item:
            raise UsageError(f"SLURM node list: unbalanced brackets in {text!r}")
        return [item]
    head, tail = item[: found.start()], item[found.end() :]
    out: list[str] = []
    for part in found.group(1).split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise UsageError(f"SLURM node list: expected ranges like [01-04,07], got {text!r}")
        width = len(low)
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise UsageError(f"SLURM node list: descending range {part!r} in {text!r}")
        for n in range(first, last + 1):
            out += _expand_one(f"{head}{n:0{width}d}{tail}", text)
    return out


def expand_tasks_per_node(text: str) -> list[int]:
    """SLURM's tasks per node: "2(x3),1" -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in text.split(","):
        found = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if found is None:
            raise UsageError(f"SLURM tasks per node: expected like 2(x3),1, got {text!r}")
        out += [int(found.group(1))] * int(found.group(2) or 1)
    return out


def _first_port(environ: typing.Mapping[str, str], per_host: int) -> int:
    """DTCLI_PORT (or the default): the port of a host's first client; its others use the ports
    after it."""
    text = environ.get(ENV_PORT, str(DEFAULT_PORT)).strip()
    top = 65536 - per_host
    if not text.isdigit() or not 0 < int(text) <= top:
        uses = f" (a node's {per_host} tasks use it and the ports after it)" if per_host > 1 else ""
        raise UsageError(f"{ENV_PORT}: expected a port from 1 to {top}{uses}, got {text!r}")
    return int(text)


def from_slurm(environ: typing.Mapping[str, str]) -> Cluster | None:
    """The cluster of an `srun` step: SLURM_PROCID is the client id, the step's node list and
    tasks per node give the addresses (client i on a node uses DTCLI_PORT + its local id).

    Only inside an srun step (SLURM_STEP_NUM_TASKS set): the batch script itself also carries
    SLURM_PROCID=0 and the job's task count, and would wait for peers nobody starts."""
    if "SLURM_STEP_NUM_TASKS" not in environ or "SLURM_PROCID" not in environ:
        return None

    def need(*names: str) -> str:
        for name in names:
            if environ.get(name, "").strip():
                return environ[name].strip()
        raise UsageError(f"SLURM: {names[0]} is not set (dtcli reads the srun step's variables)")

    ntasks_text = need("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    procid_text = need("SLURM_PROCID")
    for name, value in (("SLURM_STEP_NUM_TASKS", ntasks_text), ("SLURM_PROCID", procid_text)):
        if not value.isdigit():
            raise UsageError(f"SLURM: {name}: expected an integer, got {value!r}")
    ntasks, procid = int(ntasks_text), int(procid_text)
    if ntasks < 1:
        raise UsageError(f"SLURM: SLURM_STEP_NUM_TASKS: expected a positive integer, got {ntasks}")
    if ntasks == 1:
        return Cluster(0, ("localhost:0",), where="SLURM")  # one task: one process
    nodes = expand_nodelist(need("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"))
    per_node = expand_tasks_per_node(need("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
    if len(per_node) != len(nodes) or sum(per_node) != ntasks:
        raise UsageError(
            f"SLURM: the node list has {len(nodes)} node(s) and tasks per node {per_node} "
            f"for {ntasks} tasks; they disagree"
        )
    port = _first_port(environ, max(per_node))
    # srun's default (block) distribution numbers the tasks node by node.
    jobs = tuple(f"{node}:{port + local}" for node, k in zip(nodes, per_node) for local in range(k))
    if not 0 <= procid < ntasks:
        raise UsageError(f"SLURM: SLURM_PROCID {procid}: expected 0 to {ntasks - 1}")
    return Cluster(procid, jobs, DEFAULT_JOB_NAME, where="SLURM")


def from_tpu_vm(environ: typing.Mapping[str, str]) -> Cluster | None:
    """The hosts of a Cloud TPU VM slice, from the variables its runtime sets on every host
    (`TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`; what TensorFlow's and JAX's TPU resolvers read
    on a TPU VM), each host's client on port DTCLI_PORT."""
    hosts_text = environ.get("TPU_WORKER_HOSTNAMES", "").strip()
    if not hosts_text or "TPU_WORKER_ID" not in environ:
        return None
    hosts = [h.strip() for h in hosts_text.split(",") if h.strip()]
    worker = environ["TPU_WORKER_ID"].strip()
    if not worker.isdigit() or int(worker) >= len(hosts):
        raise UsageError(
            f"TPU_WORKER_ID: expected 0 to {len(hosts) - 1} (TPU_WORKER_HOSTNAMES lists "
            f"{len(hosts)} hosts), got {worker!r}"
        )
    port = _first_port(environ, 1)
    jobs = parse_jobs([f"{h}:{port}" for h in hosts], "TPU_WORKER_HOSTNAMES")
    return Cluster(int(worker), jobs, DEFAULT_JOB_NAME, where="TPU_WORKER_HOSTNAMES")
