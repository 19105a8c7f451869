"""`dtcli launch`, once the clients run: start them, relay their output (client 0's progress as
the one bar), stop the others when one fails, forward a preemption, and say how to resume."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from dtcli import children, rundir
from dtcli import cluster as cluster_lib
from dtcli import progress as progress_lib
from dtcli.errors import PREEMPTED_EXIT, Interrupted, TrainingError
from dtcli.launch.planning import LaunchPlan, quiet

# How long stopped clients get to exit on SIGINT before SIGKILL.
STOP_GRACE_S = 3.0


class ClientFailed(TrainingError):
    """A client exited non-zero (or was killed); the others were stopped."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def _command(p: LaunchPlan, client: int, progress: bool) -> list[str]:
    cmd = [sys.executable, "-m", "dtcli.cli", "train", *p.train_args]
    cmd += ["--client-id", str(client), "--jobs", ",".join(p.jobs)]
    cmd += ["--connect-timeout", f"{p.connect_timeout:g}"]
    if client != 0 or not progress:
        cmd.append("--no-progress")
    return cmd


def _env(p: LaunchPlan, client: int, progress: bool) -> dict[str, str]:
    env = dict(os.environ)
    for key in (cluster_lib.ENV_JOBS, cluster_lib.ENV_CLIENT_ID):
        env.pop(key, None)  # the command line says who each client is
    env["PYTHONUNBUFFERED"] = "1"
    env[progress_lib.LAUNCHED_ENV] = "1"  # the launcher prints the run directory, once
    if env.get("DTCLI_TF_LOGS") != "1":
        # When a client dies, every other one logs the same gRPC errors natively, several lines
        # each; the one-line Python error of each client says it all.
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    if client == 0 and progress:
        env[progress_lib.PROGRESS_EVENTS_ENV] = "1"
    if p.gpus_per_client:
        k = p.gpus_per_client
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(client * k, client * k + k))
    return env


def run(
    p: LaunchPlan, progress: bool = True, console: Any = None, until_exit: bool = False
) -> Path:
    """Start the clients, relay them, and return the run directory once every client is done.

    A run whose every client exited 0 is complete, whatever signal came after (the clients
    ignore one once their run is): a SIGTERM forwarded to them then is no preemption.
    `until_exit` (the command line's launch, whose process ends with it): a complete run leaves
    SIGINT and SIGTERM ignored until the process exits, as a client's does (exit 0, not 143)."""
    from rich.console import Console

    console = console or Console(stderr=True, soft_wrap=True, highlight=False)
    procs: list[subprocess.Popen] = []
    lines: queue.Queue = queue.Queue()

    preempting = False

    def forward_sigterm(signum: int, frame: Any) -> None:
        # A scheduler preempting the launcher: every client gets the notice (TensorFlow records
        # it; the clients agree on a step, save once and exit 143).
        nonlocal preempting
        preempting = True
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc.pid, signal.SIGTERM)

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, forward_sigterm)
    try:
        _start_clients(p, progress, procs, lines)
        console.print(
            f"launch: {p.clients} clients on {','.join(p.jobs)} "
            f"(pids {', '.join(str(x.pid) for x in procs)})"
        )
        failed = _supervise(procs, lines, console, progress, p.grace)
    except KeyboardInterrupt:
        _stop(procs)
        raise ClientFailed(
            f"interrupted; stopped {len(procs)} clients; {_resume_hint(p)}", exit_code=130
        ) from None
    finally:
        _stop(procs)
        complete = bool(procs) and all(q.returncode == 0 for q in procs)
        if previous is not None and complete and until_exit:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
        elif previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if not complete:
        _raise_outcome(p, procs, failed, preempting)
    return p.run_dir


def _start_clients(
    p: LaunchPlan, progress: bool, procs: list[subprocess.Popen], lines: queue.Queue
) -> None:
    """Start every client (appended to `procs` as it starts), its output pumped into `lines`."""
    for client in range(p.clients):
        proc = subprocess.Popen(
            _command(p, client, progress),
            env=_env(p, client, progress),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: stopped as a whole
            preexec_fn=children.die_with_parent if sys.platform == "linux" else None,
        )
        procs.append(proc)
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(
                target=children.pump, args=(client, stream, lines), daemon=True
            ).start()


def _raise_outcome(
    p: LaunchPlan,
    procs: list[subprocess.Popen],
    failed: tuple[int, int, str] | None,
    preempting: bool,
) -> None:
    """Every client done: a preemption (requeue) or a failed client as one exception."""
    if preempting or (failed is None and _all_preempted(procs)):
        # Preempted, the launcher or a client: requeue. (A SIGTERM before the clients' runtime
        # started ends them at once; client 0 then removes a new run that has no checkpoint.)
        raise Interrupted(
            None, None, preempted=True, message=f"preempted (SIGTERM); {_resume_hint(p)}"
        )
    if failed is not None:
        client, code, last = failed
        how = children.describe_exit(code)
        if code == 2 and last:  # bad input: the client said which, in one line
            raise ClientFailed(f"client {client}: {last.removeprefix('error: ')}", exit_code=2)
        raise ClientFailed(
            f"client {client} failed ({how}){': ' + last if last else ''}; stopped the other "
            f"clients; {_resume_hint(p)}"
        )


def _supervise(
    procs: list[subprocess.Popen],
    lines: queue.Queue,
    console: Any,
    progress: bool,
    grace: float = 30.0,
) -> tuple[int, int, str] | None:
    """Relay output until every client exits; on the first failure stop the others.

    A client that exits 143 (preempted, its part of the agreed checkpoint written) is not a
    failure: the others are on their way out too and get the grace period to finish saving.
    Returns (client, exit code, its last error line) of the first client that failed, or None.
    """
    # Without a terminal the bar is a plain line now and then (a log shows the run is alive).
    bar = progress_lib.LaunchBar(console) if progress else None
    open_streams = 2 * len(procs)
    last_error: dict[int, str] = {}
    failed: tuple[int, int, str] | None = None
    preempted_at: float | None = None
    try:
        while open_streams:
            try:
                client, line = lines.get(timeout=0.1)
            except queue.Empty:
                client, line = -1, ""
            if line is None:
                open_streams -= 1
            elif client >= 0:
                _relay(client, line, bar, console, last_error)
            if failed is None:
                failed, preempted_at = _poll(procs, grace, preempted_at)
                if failed is not None:
                    # Stop the others now: they would wait on the dead client's collectives.
                    _stop([q for i, q in enumerate(procs) if i != failed[0]], wait=False)
        for proc in procs:
            proc.wait(timeout=STOP_GRACE_S * 2)
    except subprocess.TimeoutExpired:
        pass  # run() stops what is left
    finally:
        if bar is not None:
            bar.stop()
    if failed is None and not _all_preempted(procs):
        for i, proc in enumerate(procs):
            if proc.returncode != 0:
                failed = (i, proc.returncode, "")
                break
    if failed is not None:
        client, code, _ = failed
        return client, code, last_error.get(client, "")
    return None


def _relay(
    client: int,
    line: str,
    bar: progress_lib.LaunchBar | None,
    console: Any,
    last_error: dict[int, str],
) -> None:
    """A client's output line: a progress event drawn (or dropped), anything else printed."""
    if line.startswith(progress_lib.PROGRESS_EVENT):
        if bar is not None:
            bar.event(json.loads(line[len(progress_lib.PROGRESS_EVENT) :]))
        return
    if line.startswith("error: "):
        last_error[client] = line
    console.print(f"[client {client}] {line}", markup=False)


def _poll(
    procs: list[subprocess.Popen], grace: float, preempted_at: float | None
) -> tuple[tuple[int, int, str] | None, float | None]:
    """The first client that failed, if one did, and when the first one exited preempted.

    A client that exits 143 (preempted) gets the grace period before it counts as failed: the
    others are on their way out too and finish saving their part of the checkpoint."""
    for i, proc in enumerate(procs):
        code = proc.poll()
        if code == PREEMPTED_EXIT:
            if preempted_at is None:
                preempted_at = time.monotonic()
            if time.monotonic() - preempted_at < grace + STOP_GRACE_S:
                continue
        if code not in (None, 0):
            return (i, code, ""), preempted_at
    return None, preempted_at


def _all_preempted(procs: list[subprocess.Popen]) -> bool:
    """Every client exited 143: each saved its part of the one agreed checkpoint."""
    return bool(procs) and all(q.returncode == PREEMPTED_EXIT for q in procs)


def _stop(procs: list[subprocess.Popen], wait: bool = True) -> None:
    """SIGINT each client's process group; SIGKILL what is left after the grace period.

    Not SIGTERM: in multi-client mode TensorFlow's coordination service takes SIGTERM as a
    preemption notice and the client trains on (seen with TF 2.21). SIGINT raises
    KeyboardInterrupt, so a client that has written nothing resumable removes its run directory.
    """
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGINT)
    if not wait:
        threading.Thread(target=_reap, args=(procs,), daemon=True).start()
        return
    _reap(procs)


def _reap(procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_GRACE_S)
        # Anything the client started shares its group; make sure none of it lingers.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _resume_hint(p: LaunchPlan) -> str:
    latest = rundir.latest_intact(p.run_dir, quiet)
    if latest is None:
        return "no complete checkpoint was written"
    return (
        f"last complete checkpoint: {latest}; resume with: dtcli launch --clients {p.clients} "
        f"--resume {p.run_dir}"
    )
