"""The multi-client cluster: who this client is, where the others are, and a preflight handshake.

DTensor's own multi-client runtime does the work (one process per host, gRPC between them); this
module only describes it (`--client-id`/`--jobs` or DTensor's `DTENSOR_*` variables) and checks it
before TensorFlow starts. Without the check, a missing peer, a wrong address or a port held by a
stale process makes `initialize_accelerator_system` wait forever or fail with a bare
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


def from_args(
    client_id: int | None, jobs: str | None, environ: dict[str, str] | None = None
) -> Cluster | None:
    """The cluster from `--client-id`/`--jobs`, else from DTensor's variables; None: one process.

    The client count is the length of the jobs list (DTensor dropped DTENSOR_NUM_CLIENTS).
    """
    env = os.environ if environ is None else environ
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
    entries = tuple(j.strip() for j in jobs.split(",") if j.strip())
    if not entries:
        raise UsageError(f"{jobs_where}: expected host:port,host:port,..., got {jobs!r}")
    for entry in entries:
        _split_address(entry, jobs_where)
    if len(set(entries)) != len(entries):
        raise UsageError(f"{jobs_where}: an address appears twice in {jobs!r}")
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
