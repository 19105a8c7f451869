"""The preflight handshake: every client reachable, every client running the same recipe.

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
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from dtcli.cluster.jobs import Cluster, split_address
from dtcli.errors import UsageError

DEFAULT_CONNECT_TIMEOUT = 60.0
_MAGIC = "dtcli-preflight/1"


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
    handshake = _Handshake(cluster, recipe_hash, timeout, leader)
    handshake.run()
    if cluster.is_chief:
        agreed = dict(leader or {})
    else:
        agreed = dict(handshake.peers[0].info.get("leader") or {})
    return dataclasses.replace(cluster, leader=agreed)


def _listen(cluster: Cluster) -> socket.socket:
    """This client's job port, bound and listening: UsageError when something else holds it."""
    host, port = split_address(cluster.address, cluster.where)
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
            f"{cluster.where}: port {port} of this client ({cluster.address}, client "
            f"{cluster.client_id}) is in use ({exc.strerror}); stop what holds it or choose "
            "another port"
        ) from None
    listener.listen(max(cluster.num_clients, 4))
    listener.settimeout(0.2)
    return listener


class _Handshake:
    """One client's side of the preflight: a thread serves the peers that connect to this
    client's port, while this client connects to every peer in turn; both halves share the
    peers' state, the first error and the deadline."""

    def __init__(
        self, cluster: Cluster, recipe_hash: str, timeout: float, leader: dict[str, Any] | None
    ) -> None:
        me = cluster.client_id
        self.cluster = cluster
        self.recipe_hash = recipe_hash
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.hello = {
            "magic": _MAGIC,
            "client": me,
            "jobs": list(cluster.jobs),
            "job_name": cluster.job_name,
            "hash": recipe_hash,
            "leader": leader if cluster.is_chief else None,
        }
        self.listener = _listen(cluster)
        self.peers = {j: _Peer() for j in range(cluster.num_clients) if j != me}
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.sockets: list[socket.socket] = [self.listener]

    def run(self) -> None:
        """Hello to and from every peer, then "done" to and from every peer; UsageError on the
        first problem or at the deadline. Every socket is closed on return."""
        acceptor = threading.Thread(target=self.accept, daemon=True)
        acceptor.start()
        try:
            outgoing = self.connect_all()
            self.wait_all(lambda p: p.hello_in, "connect to")
            for sock in outgoing:
                _send(sock, {"magic": _MAGIC, "type": "done", "client": self.cluster.client_id})
            self.wait_all(lambda p: p.done, "finish the check with")
        finally:
            self.stop.set()
            for sock in self.sockets:
                try:
                    sock.close()
                except OSError:
                    pass
            acceptor.join(timeout=2.0)

    def check(self, info: dict[str, Any], expected: int | None) -> str | None:
        """What is wrong with a peer's hello (or answer), or None."""
        cluster = self.cluster
        j = info.get("client")
        unexpected = expected is not None and j != expected
        if not isinstance(j, int) or j not in self.peers or unexpected:
            who = cluster.jobs[expected] if expected is not None else "a peer"
            return f"{who} answered as client {j!r}"
        where = f"client {j} ({cluster.jobs[j]})"
        if info.get("jobs") != list(cluster.jobs) or info.get("job_name") != cluster.job_name:
            return (
                f"{where} was started with another jobs list or job name "
                f"({','.join(info.get('jobs') or [])} as {info.get('job_name')!r}); every client "
                "needs the same --jobs"
            )
        if info.get("hash") != self.recipe_hash:
            return (
                f"{where} runs another recipe (hash {str(info.get('hash'))[:12]}, this client "
                f"{self.recipe_hash[:12]}); start every client with the same recipe and options"
            )
        return None

    def accept(self) -> None:
        """The listener's thread: one `serve` thread per incoming connection, until stopped."""
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.sockets.append(conn)
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def serve(self, conn: socket.socket) -> None:
        """One peer's incoming connection: its hello, our answer, then its "done"."""
        try:
            conn.settimeout(max(self.deadline - time.monotonic(), 0.1))
            reader = conn.makefile("rb")
            message = _receive(reader)
            if message is None or message.get("type") != "hello":
                return  # not a preflight peer (a port scanner, or gRPC retrying early)
            problem = self.check(message, None)
            _send(conn, {**self.hello, "type": "hello"})
            if problem:
                self.errors.append(problem)
                return
            j = message["client"]
            self.peers[j].info = message
            self.peers[j].hello_in.set()
            message = _receive(reader)
            if message is not None and message.get("type") == "done":
                self.peers[j].done.set()
        except OSError:
            pass

    def connect_all(self) -> list[socket.socket]:
        """A checked connection to every peer, in client order; UsageError naming the first
        peer not reached in time. Stops early (returning what it has) once a check failed."""
        outgoing: list[socket.socket] = []
        for j in self.peers:
            sock = self.connect(j)
            if self.errors:
                break
            if sock is None:
                raise UsageError(
                    f"{self.cluster.where}: cannot reach client {j} at {self.cluster.jobs[j]} "
                    f"within {self.timeout:g} s (--connect-timeout); is it started, with the same "
                    "jobs list, and is the address reachable from this host?"
                )
            outgoing.append(sock)
            self.sockets.append(sock)
        return outgoing

    def connect(self, j: int) -> socket.socket | None:
        """Connect to peer `j` and exchange hellos, retrying until the deadline; None when it
        was not reached in time or its answer failed the check (then in `errors`)."""
        peer_host, peer_port = split_address(self.cluster.jobs[j], self.cluster.where)
        while time.monotonic() < self.deadline and not self.errors:
            try:
                sock = socket.create_connection(
                    (peer_host, peer_port),
                    timeout=max(min(2.0, self.deadline - time.monotonic()), 0.1),
                )
            except OSError:
                time.sleep(0.2)
                continue
            answer = self._hello(sock)
            if answer is None:  # no answer, or the port is held by something that is not dtcli
                sock.close()
                time.sleep(0.2)
                continue
            problem = self.check(answer, j)
            if problem:
                self.errors.append(problem)
                sock.close()
                return None
            self.peers[j].info = answer
            self.peers[j].hello_out.set()
            return sock
        return None

    def _hello(self, sock: socket.socket) -> dict[str, Any] | None:
        """Our hello on an outgoing connection, and the peer's answer (None: none came)."""
        try:
            sock.settimeout(max(self.deadline - time.monotonic(), 0.1))
            _send(sock, {**self.hello, "type": "hello"})
            return _receive(sock.makefile("rb"))
        except OSError:
            return None

    def wait_all(self, flag: Callable[[_Peer], threading.Event], what: str) -> None:
        """Wait until `flag` is set for every peer; UsageError on the first error or when the
        deadline passes (naming the peer and `what` it did not do)."""
        cluster = self.cluster
        for j, peer in self.peers.items():
            while not flag(peer).wait(0.05):
                if self.errors:
                    raise UsageError(f"{cluster.where}: {self.errors[0]}")
                if time.monotonic() >= self.deadline:
                    raise UsageError(
                        f"{cluster.where}: client {j} at {cluster.jobs[j]} did not {what} this "
                        f"client ({cluster.address}) within {self.timeout:g} s (--connect-timeout)"
                    )
        if self.errors:
            raise UsageError(f"{cluster.where}: {self.errors[0]}")
