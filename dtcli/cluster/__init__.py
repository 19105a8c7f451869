"""The multi-client cluster: who this client is, where the others are, and a preflight handshake.

DTensor's own multi-client runtime does the work (one process per host, gRPC between them); this
module only describes it (`--client-id`/`--jobs`, DTensor's `DTENSOR_*` variables, or what a
scheduler hands each worker: `TF_CONFIG`, SLURM's `srun` variables, a TPU VM's `TPU_WORKER_*`)
and checks it before TensorFlow starts. Without the check, a missing peer, a wrong address or a
port held by a stale process makes `initialize_accelerator_system` wait forever or fail with a bare
"Could not start gRPC server".

The preflight runs on each client's own job port (the address in `--jobs`), before TensorFlow's
gRPC server binds it: binding it first is what proves the port is free, and connecting to it is
what proves the gRPC address is reachable. Every client connects to every other one (DTensor's
collectives talk peer to peer, not only through client 0), they compare recipe hashes and job
lists, and each client releases its port only once every peer has reported that it is done, so
no peer's preflight ever lands on a gRPC server. This module never imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import threading
import time
import typing
from dataclasses import dataclass, field
from typing import Any

from dtcli.errors import UsageError

ENV_CLIENT_ID = "DTENSOR_CLIENT_ID"
ENV_JOBS = "DTENSOR_JOBS"
ENV_JOB_NAME = "DTENSOR_JOB_NAME"
DEFAULT_JOB_NAME = "worker"
DEFAULT_CONNECT_TIMEOUT = 60.0
_MAGIC = "dtcli-preflight/1"


@dataclass(frozen=True)
class Cluster:
    """One client's view of a multi-client run."""

    client_id: int
    jobs: tuple[str, ...]  # host:port of every client, in client-id order
    job_name: str = DEFAULT_JOB_NAME
    # Agreed in the preflight: what client 0 decided for everyone (run directory, save tag).
    leader: dict[str, Any] = field(default_factory=dict)
    # Where the jobs list came from, for error messages: "--jobs" or "DTENSOR_JOBS".
    where: str = "--jobs"

    @property
    def num_clients(self) -> int:
        return len(self.jobs)

    @property
    def is_chief(self) -> bool:
        return self.client_id == 0

    @property
    def address(self) -> str:
        return self.jobs[self.client_id]


def _split_address(text: str, where: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{where}: expected host:port entries, got {text!r}")
    return host, int(port)


ENV_TF_CONFIG = "TF_CONFIG"
ENV_PORT = "DTCLI_PORT"
# The first job port of a SLURM step (client i on a node uses PORT + its local task id).
DEFAULT_PORT = 23456


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
        found = from_tf_config(env)
        if found is None:
            found = from_slurm(env)
        if found is None:
            found = from_tpu_vm(env)
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
    entries = _entries(jobs, jobs_where)
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


def _entries(jobs: str | list[str], where: str) -> tuple[str, ...]:
    items = jobs.split(",") if isinstance(jobs, str) else jobs
    entries = tuple(j.strip() for j in items)
    if not any(entries):
        raise UsageError(f"{where}: expected host:port,host:port,..., got {jobs!r}")
    if not all(entries):
        # A missing address would shift every later client's number: refused, not skipped.
        raise UsageError(
            f"{where}: an empty entry in {jobs!r} (two commas in a row, or one at an end); "
            "expected host:port,host:port,..."
        )
    for entry in entries:
        _split_address(entry, where)
    if len(set(entries)) != len(entries):
        raise UsageError(f"{where}: an address appears twice in {','.join(entries)!r}")
    return entries


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
    entries = _entries(jobs, f"{where} cluster")
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
    jobs = _entries([f"{h}:{port}" for h in hosts], "TPU_WORKER_HOSTNAMES")
    return Cluster(int(worker), jobs, DEFAULT_JOB_NAME, where="TPU_WORKER_HOSTNAMES")


def export_env(cluster: Cluster) -> None:
    """Set the variables DTensor reads when `initialize_accelerator_system` starts its runtime."""
    os.environ[ENV_JOBS] = ",".join(cluster.jobs)
    os.environ[ENV_CLIENT_ID] = str(cluster.client_id)
    os.environ[ENV_JOB_NAME] = cluster.job_name


# --------------------------------------------------------------------------- preflight


class _Peer:
    """What this client learned about one peer during the preflight."""

    def __init__(self) -> None:
        self.hello_in = threading.Event()  # the peer connected to us with a valid hello
        self.hello_out = threading.Event()  # we connected to the peer and it answered
        self.done = threading.Event()  # the peer finished its half of the handshake
        self.info: dict[str, Any] = {}


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall((json.dumps(message) + "\n").encode())


def _receive(reader: Any) -> dict[str, Any] | None:
    line = reader.readline(65536)
    if not line:
        return None
    try:
        message = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return message if isinstance(message, dict) and message.get("magic") == _MAGIC else None


def preflight(
    cluster: Cluster,
    recipe_hash: str,
    timeout: float = DEFAULT_CONNECT_TIMEOUT,
    leader: dict[str, Any] | None = None,
) -> Cluster:
    """Check that every client is reachable and runs the same recipe; returns the cluster with
    client 0's `leader` decisions. Raises UsageError naming the address at fault after at most
    `timeout` seconds (the timeout is stated in the message)."""
    n = cluster.num_clients
    me = cluster.client_id
    deadline = time.monotonic() + timeout
    hello = {
        "magic": _MAGIC,
        "client": me,
        "jobs": list(cluster.jobs),
        "job_name": cluster.job_name,
        "hash": recipe_hash,
        "leader": leader if cluster.is_chief else None,
    }
    host, port = _split_address(cluster.address, cluster.where)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    # SO_REUSEADDR lets the port be bound while sockets of an earlier run sit in TIME_WAIT; it
    # does not allow binding a port another process listens on (TensorFlow's gRPC server does
    # that silently with SO_REUSEPORT, which is why this bind comes first).
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", port))
    except OSError as exc:
        listener.close()
        raise UsageError(
            f"{cluster.where}: port {port} of this client ({cluster.address}, client {me}) is "
            f"in use ({exc.strerror}); stop what holds it or choose another port"
        ) from None
    listener.listen(max(n, 4))
    listener.settimeout(0.2)
    peers = {j: _Peer() for j in range(n) if j != me}
    errors: list[str] = []
    stop = threading.Event()
    sockets: list[socket.socket] = [listener]

    def check(info: dict[str, Any], expected: int | None) -> str | None:
        j = info.get("client")
        if not isinstance(j, int) or j not in peers or (expected is not None and j != expected):
            who = cluster.jobs[expected] if expected is not None else "a peer"
            return f"{who} answered as client {j!r}"
        where = f"client {j} ({cluster.jobs[j]})"
        if info.get("jobs") != list(cluster.jobs) or info.get("job_name") != cluster.job_name:
            return (
                f"{where} was started with another jobs list or job name "
                f"({','.join(info.get('jobs') or [])} as {info.get('job_name')!r}); every client "
                "needs the same --jobs"
            )
        if info.get("hash") != recipe_hash:
            return (
                f"{where} runs another recipe (hash {str(info.get('hash'))[:12]}, this client "
                f"{recipe_hash[:12]}); start every client with the same recipe and options"
            )
        return None

    def serve(conn: socket.socket) -> None:
        # One peer's incoming connection: its hello, our answer, then its "done".
        try:
            conn.settimeout(max(deadline - time.monotonic(), 0.1))
            reader = conn.makefile("rb")
            message = _receive(reader)
            if message is None or message.get("type") != "hello":
                return  # not a preflight peer (a port scanner, or gRPC retrying early)
            problem = check(message, None)
            _send(conn, {**hello, "type": "hello"})
            if problem:
                errors.append(problem)
                return
            j = message["client"]
            peers[j].info = message
            peers[j].hello_in.set()
            message = _receive(reader)
            if message is not None and message.get("type") == "done":
                peers[j].done.set()
        except OSError:
            pass

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sockets.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    def connect(j: int) -> socket.socket | None:
        peer_host, peer_port = _split_address(cluster.jobs[j], cluster.where)
        while time.monotonic() < deadline and not errors:
            try:
                sock = socket.create_connection(
                    (peer_host, peer_port), timeout=max(min(2.0, deadline - time.monotonic()), 0.1)
                )
            except OSError:
                time.sleep(0.2)
                continue
            try:
                sock.settimeout(max(deadline - time.monotonic(), 0.1))
                _send(sock, {**hello, "type": "hello"})
                answer = _receive(sock.makefile("rb"))
            except OSError:
                sock.close()
                time.sleep(0.2)
                continue
            if answer is None:  # the peer's port is held by something that is not dtcli
                sock.close()
                time.sleep(0.2)
                continue
            problem = check(answer, j)
            if problem:
                errors.append(problem)
                sock.close()
                return None
            peers[j].info = answer
            peers[j].hello_out.set()
            return sock
        return None

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        outgoing: dict[int, socket.socket] = {}
        for j in peers:
            sock = connect(j)
            if errors:
                break
            if sock is None:
                raise UsageError(
                    f"{cluster.where}: cannot reach client {j} at {cluster.jobs[j]} within "
                    f"{timeout:g} s (--connect-timeout); is it started, with the same jobs list, "
                    "and is the address reachable from this host?"
                )
            outgoing[j] = sock
            sockets.append(sock)
        _wait(lambda p: p.hello_in, peers, deadline, errors, cluster, timeout, "connect to")
        for sock in outgoing.values():
            _send(sock, {"magic": _MAGIC, "type": "done", "client": me})
        _wait(lambda p: p.done, peers, deadline, errors, cluster, timeout, "finish the check with")
    finally:
        stop.set()
        for sock in sockets:
            try:
                sock.close()
            except OSError:
                pass
        acceptor.join(timeout=2.0)
    if cluster.is_chief:
        agreed = dict(leader or {})
    else:
        agreed = dict(peers[0].info.get("leader") or {})
    return dataclasses.replace(cluster, leader=agreed)


def _wait(
    flag: Any,
    peers: dict[int, _Peer],
    deadline: float,
    errors: list[str],
    cluster: Cluster,
    timeout: float,
    what: str,
) -> None:
    for j, peer in peers.items():
        while not flag(peer).wait(0.05):
            if errors:
                raise UsageError(f"{cluster.where}: {errors[0]}")
            if time.monotonic() >= deadline:
                raise UsageError(
                    f"{cluster.where}: client {j} at {cluster.jobs[j]} did not {what} this client "
                    f"({cluster.address}) within {timeout:g} s (--connect-timeout)"
                )
    if errors:
        raise UsageError(f"{cluster.where}: {errors[0]}")
