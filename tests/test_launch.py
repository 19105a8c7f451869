"""Multi-client DTensor runs: `dtcli launch`, `dtcli train --client-id/--jobs`, the preflight,
per-client data shards, collective checkpoints, a killed client, and bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from conftest import RECIPES, ROOT, dtcli, env, run_cli

from dtcli import checkpoint as ckpt_lib
from dtcli import cluster as cluster_lib
from dtcli import data as data_lib
from dtcli import metrics, rundir
from dtcli import pipeline as pipeline_lib
from dtcli.errors import UsageError

QUICK = str(RECIPES / "quickstart.yaml")
EPOCHS = "3"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pids_of(stderr: str) -> list[int]:
    """The client pids `dtcli launch` announces on its first line."""
    found = re.search(r"\(pids ([\d, ]+)\)", stderr)
    assert found, stderr
    return [int(p) for p in found.group(1).split(", ")]


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)  # each client led its own process group: nothing of it is left


def last_json(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- fast: no TensorFlow


def test_cluster_from_flags_and_from_dtensor_variables():
    c = cluster_lib.from_args(1, "127.0.0.1:1000,127.0.0.1:1001", environ={})
    assert (c.client_id, c.num_clients, c.address, c.job_name) == (1, 2, "127.0.0.1:1001", "worker")
    assert cluster_lib.from_args(None, None, environ={}) is None
    c = cluster_lib.from_args(
        None,
        None,
        environ={
            "DTENSOR_JOBS": "h1:9,h2:9,h3:9",
            "DTENSOR_CLIENT_ID": "2",
            "DTENSOR_JOB_NAME": "w",
        },
    )
    assert (c.client_id, c.num_clients, c.job_name, c.where) == (2, 3, "w", "DTENSOR_JOBS")
    # flags win over the variables
    c = cluster_lib.from_args(
        0, "a:1,b:2", environ={"DTENSOR_JOBS": "x:1", "DTENSOR_CLIENT_ID": "0"}
    )
    assert c.jobs == ("a:1", "b:2")


def test_cluster_from_tf_config_numbers_the_chief_first():
    cfg = {
        "cluster": {"chief": ["c:1"], "worker": ["w0:2", "w1:3"]},
        "task": {"type": "worker", "index": 1},
    }
    c = cluster_lib.from_args(None, None, environ={"TF_CONFIG": json.dumps(cfg)})
    assert (c.client_id, c.jobs, c.job_name, c.where) == (
        2,
        ("c:1", "w0:2", "w1:3"),
        "worker",
        "TF_CONFIG",
    )
    cfg["task"] = {"type": "chief", "index": 0}
    assert cluster_lib.from_args(None, None, environ={"TF_CONFIG": json.dumps(cfg)}).client_id == 0
    # workers only (no chief): worker 0 is client 0; an evaluator task in the cluster is ignored
    cfg = {
        "cluster": {"worker": ["a:1", "b:1"], "evaluator": ["e:1"]},
        "task": {"type": "worker", "index": 1},
    }
    assert cluster_lib.from_args(None, None, environ={"TF_CONFIG": json.dumps(cfg)}).client_id == 1
    # one task: one process, no cluster
    cfg = {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    assert cluster_lib.from_args(None, None, environ={"TF_CONFIG": json.dumps(cfg)}) is None
    # --jobs and DTENSOR_JOBS come first
    both = {"TF_CONFIG": json.dumps(cfg), "DTENSOR_JOBS": "x:1,y:1", "DTENSOR_CLIENT_ID": "1"}
    assert cluster_lib.from_args(None, None, environ=both).where == "DTENSOR_JOBS"


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ("{nope", "TF_CONFIG: not valid JSON"),
        ('{"cluster": {"worker": ["a:1"]}}', "TF_CONFIG: expected {"),
        (
            '{"cluster": {"ps": ["p:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}',
            "cluster job 'ps' is not something DTensor runs",
        ),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}',
            "task worker 2: the cluster has 2 worker task",
        ),
        (
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "evaluator", "index": 0}}',
            "task type 'evaluator' is not a training client",
        ),
        (
            '{"cluster": {"worker": ["a", "b:1"]}, "task": {"type": "worker", "index": 0}}',
            "expected host:port entries, got 'a'",
        ),
        (
            '{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}',
            "an address appears twice",
        ),
    ],
)
def test_tf_config_bad_input(tf_config, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        cluster_lib.from_args(None, None, environ={"TF_CONFIG": tf_config})


def test_slurm_node_list_and_tasks_per_node_expand():
    assert cluster_lib.expand_nodelist("node[01-03,07],gpu-a[8-10],login") == [
        "node01", "node02", "node03", "node07", "gpu-a8", "gpu-a9", "gpu-a10", "login"
    ]  # fmt: skip
    assert cluster_lib.expand_nodelist("r[1-2]-n[0-1]") == ["r1-n0", "r1-n1", "r2-n0", "r2-n1"]
    assert cluster_lib.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    for bad in ("node[01-", "node[a-b]", "node[3-1]"):
        with pytest.raises(UsageError, match="SLURM node list"):
            cluster_lib.expand_nodelist(bad)
    with pytest.raises(UsageError, match="SLURM tasks per node"):
        cluster_lib.expand_tasks_per_node("2(3)")


def slurm_env(**extra: str) -> dict[str, str]:
    return {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_STEP_NODELIST": "gpu[07-08]",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        **extra,
    }


def test_cluster_from_tpu_vm_variables():
    tpu = {"TPU_WORKER_ID": "2", "TPU_WORKER_HOSTNAMES": "t1k-w-0,t1k-w-1,t1k-w-2,t1k-w-3"}
    c = cluster_lib.from_args(None, None, environ=tpu)
    assert (c.client_id, c.jobs[2], c.num_clients, c.where) == (
        2, "t1k-w-2:23456", 4, "TPU_WORKER_HOSTNAMES"
    )  # fmt: skip
    one_host = {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "h"}  # a single-host slice
    assert cluster_lib.from_args(None, None, environ=one_host) is None
    with pytest.raises(UsageError, match=r"TPU_WORKER_ID: expected 0 to 3 .* got '7'"):
        cluster_lib.from_args(None, None, environ={**tpu, "TPU_WORKER_ID": "7"})


def test_cluster_from_slurm_step_variables():
    c = cluster_lib.from_args(None, None, environ=slurm_env())
    assert c.client_id == 3 and c.where == "SLURM"
    assert c.jobs == ("gpu07:23456", "gpu07:23457", "gpu08:23456", "gpu08:23457")
    c = cluster_lib.from_args(None, None, environ=slurm_env(DTCLI_PORT="9000", SLURM_PROCID="0"))
    assert c.client_id == 0 and c.jobs[1] == "gpu07:9001"
    # the batch script itself (no srun step) and a one-task step are one process
    batch = {k: v for k, v in slurm_env().items() if not k.startswith("SLURM_STEP")}
    assert cluster_lib.from_args(None, None, environ=batch) is None
    assert cluster_lib.from_args(None, None, environ=slurm_env(SLURM_STEP_NUM_TASKS="1")) is None
    with pytest.raises(
        UsageError,
        match=r"SLURM: the node list has 2 node\(s\) and tasks per node \[2, 1\] for 4 tasks",
    ):
        cluster_lib.from_args(None, None, environ=slurm_env(SLURM_STEP_TASKS_PER_NODE="2,1"))
    with pytest.raises(UsageError, match="DTCLI_PORT: expected a port from 1 to 65534"):
        cluster_lib.from_args(None, None, environ=slurm_env(DTCLI_PORT="http"))
    with pytest.raises(UsageError, match="expected a port from 1 to 65534 .* got '65535'"):
        cluster_lib.from_args(None, None, environ=slurm_env(DTCLI_PORT="65535"))
    with pytest.raises(UsageError, match="SLURM_STEP_NUM_TASKS: expected a positive integer"):
        cluster_lib.from_args(None, None, environ=slurm_env(SLURM_STEP_NUM_TASKS="0"))


@pytest.mark.parametrize(
    "client_id, jobs, environ, message",
    [
        (2, "a:1,b:2", {}, "--client-id 2: expected 0 to 1 (the jobs list has 2 clients)"),
        (0, "a:1,a:1", {}, "--jobs: an address appears twice"),
        (0, "a,b:2", {}, "--jobs: expected host:port entries, got 'a'"),
        (0, "a:1,,b:2", {}, "--jobs: an empty entry in 'a:1,,b:2' (two commas in a row"),
        (None, None, {"DTENSOR_JOBS": "a:1,", "DTENSOR_CLIENT_ID": "0"}, "DTENSOR_JOBS: an empty"),
        (1, None, {}, "--client-id: also give --jobs"),
        (None, None, {"DTENSOR_JOBS": "a:1,b:2"}, "DTENSOR_JOBS is set: also give --client-id"),
        (
            None,
            None,
            {"DTENSOR_JOBS": "a:1", "DTENSOR_CLIENT_ID": "x"},
            "DTENSOR_CLIENT_ID: expected",
        ),
    ],
)
def test_cluster_bad_input(client_id, jobs, environ, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        cluster_lib.from_args(client_id, jobs, environ=environ)


def test_each_client_reads_only_its_rows_and_together_they_make_the_global_batch():
    split = data_lib.Split(np.arange(10, dtype=np.float32)[:, None], np.arange(10, dtype=np.int32))
    order = np.array([9, 3, 0, 7, 1, 4, 8, 2, 6, 5])
    whole = list(pipeline_lib.batches(split, 8, order))
    # A batch of 8 in 4 shards of 2 rows; client 0 holds shards 0 and 1, client 1 shards 2 and 3.
    halves = [
        list(pipeline_lib.batches(split, 8, order, np.arange(0, 4))),
        list(pipeline_lib.batches(split, 8, order, np.arange(4, 8))),
    ]
    for i, batch in enumerate(whole):
        parts = [h[i] for h in halves]
        assert all(len(p.y) == 4 for p in parts)  # each client reads half of the batch
        np.testing.assert_array_equal(np.concatenate([p.y for p in parts]), batch.y)
        np.testing.assert_array_equal(np.concatenate([p.mask for p in parts]), batch.mask)
    # the last, ragged batch: 2 real rows, both on client 0; client 1 holds only padding
    assert whole[1].mask.tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert halves[1][1].mask.tolist() == [0, 0, 0, 0]


# --------------------------------------------------------------------------- bad input, exit 2


def test_unreachable_peer_fails_within_the_timeout_naming_the_address(tmp_path):
    peer = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    proc = dtcli(
        "train",
        QUICK,
        "--client-id",
        "0",
        "--jobs",
        f"127.0.0.1:{free_port()},{peer}",
        "--connect-timeout",
        "2",
        "--out",
        tmp_path / "run",
        "--no-progress",  # piped, 4.5 s of setup would say so in a line (progress.Heartbeat)
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"error: --jobs: cannot reach client 1 at {peer} within 2 s (--connect-timeout); is it "
        "started, with the same jobs list, and is the address reachable from this host?"
    )
    assert time.monotonic() - started < 30  # 2 s plus the interpreter's start-up, not a hang
    assert not (tmp_path / "run").exists()


def test_port_in_use_is_named_for_train_and_launch(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        proc = dtcli(
            "train",
            QUICK,
            "--client-id",
            "0",
            "--jobs",
            f"127.0.0.1:{port},127.0.0.1:{free_port()}",
            "--connect-timeout",
            "5",
            "--no-progress",  # piped, 4.5 s of setup would say so in a line (progress.Heartbeat)
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(
            f"error: --jobs: port {port} of this client (127.0.0.1:{port}, client 0) is in use"
        )
        assert len(proc.stderr.strip().splitlines()) == 1
        proc = dtcli("launch", "--clients", "2", "--port", str(port - 1), QUICK, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(
            f"error: --port {port - 1}: 127.0.0.1:{port} (client 1) is in use"
        )
        assert len(proc.stderr.strip().splitlines()) == 1
    finally:
        holder.close()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["launch", "--clients", "3", QUICK],
            "error: --clients 3: 3 clients do not divide the devices of the mesh batch=4,model=2 "
            "(devices cpu:8); give --devices-per-client or another --clients",
        ),
        (
            ["launch", "--clients", "3", "--devices-per-client", "cpu:2", QUICK],
            "error: --devices-per-client cpu:2: 3 clients x 2 = 6 devices, which the mesh "
            "batch=4,model=2 cannot take",
        ),
        (
            ["train", QUICK, "--client-id", "0", "--jobs", "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"],
            "error: --jobs: 3 clients do not divide the 8 devices of recipe key 'devices' "
            "'cpu:8' (each client must hold the same number of devices)",
        ),
        (["launch", "--clients", "0", QUICK], "error: --clients 0: expected at least 1"),
    ],
)
def test_clients_that_do_not_divide_the_devices(args, message):
    proc = dtcli(*args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == message


def test_clients_with_different_recipes_are_stopped_by_the_preflight(tmp_path):
    jobs = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    common = ["-m", "dtcli.cli", "train", QUICK, "--jobs", jobs, "--connect-timeout", "20"]
    other = subprocess.Popen(
        [sys.executable, *common, "--client-id", "1", "--set", "optimizer.learning_rate=0.01"],
        cwd=ROOT,
        env=env(),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        proc = dtcli("train", QUICK, "--jobs", jobs, "--client-id", "0", timeout=60)
        _, other_err = other.communicate(timeout=60)
    finally:
        if other.poll() is None:
            os.killpg(other.pid, signal.SIGKILL)
            other.wait()
    assert proc.returncode == 2 and other.returncode == 2
    assert "error: --jobs: client 1 (127.0.0.1:" in proc.stderr
    assert "runs another recipe" in proc.stderr and "runs another recipe" in other_err


# --------------------------------------------------------------------------- two clients


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, cpu8):
    """The quickstart in one process on 8 virtual CPUs (batch=4 x model=2): this one."""
    out = tmp_path_factory.mktemp("single") / "run"
    proc = run_cli("train", QUICK, "--epochs", EPOCHS, "--out", out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The same, as 2 clients of 4 virtual CPUs each on loopback."""
    out = tmp_path_factory.mktemp("launched") / "run"
    proc = dtcli(
        "launch",
        "--clients",
        "2",
        "--devices-per-client",
        "cpu:4",
        QUICK,
        "--epochs",
        EPOCHS,
        "--out",
        out,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return out, proc


@pytest.mark.slow
def test_two_clients_match_one_process(launched, single_run):
    out, proc = launched
    a = metrics.read(out / "metrics.jsonl")
    b = metrics.read(single_run / "metrics.jsonl")
    assert [r["epoch"] for r in a] == [1, 2, 3]
    for key in ("train_loss", "eval_loss", "eval_accuracy", "train_accuracy"):
        assert a[-1][key] == pytest.approx(b[-1][key], rel=1e-4), key
    assert a[-1]["train_examples"] == 1437 and a[-1]["eval_examples"] == 360
    assert proc.stdout.strip() == str(out)
    # client 0 speaks for the run, each line once; the other clients print only their errors
    lines = [x for x in proc.stderr.splitlines() if x.startswith("[client 0] epoch 3/3")]
    assert len(lines) == 1 and f"eval loss {a[-1]['eval_loss']:.4f}" in lines[0]
    assert not [x for x in proc.stderr.splitlines() if x.startswith("[client 1]")]
    assert "over cpu:8 (2 clients x 4)" in proc.stderr
    assert proc.stderr.count(str(out)) == 1  # the run directory, named once (and on stdout)


def two_free_ports() -> int:
    """A port P with P+1 free too (SLURM's addresses on one node are PORT and PORT+1)."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


def tf_config_of(port: int, client: int) -> dict[str, str]:
    cluster = {"chief": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{port + 1}"]}
    task = {"type": "chief", "index": 0} if client == 0 else {"type": "worker", "index": 0}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}


def slurm_of(port: int, client: int) -> dict[str, str]:
    return {
        "SLURM_PROCID": str(client), "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_STEP_TASKS_PER_NODE": "2",
        "DTCLI_PORT": str(port),
    }  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("source", ["TF_CONFIG", "SLURM"])
def test_clients_found_by_tf_config_or_slurm_match_one_process(tmp_path, single_run, source):
    """Two `dtcli train RECIPE` processes given no dtcli flag and no DTENSOR_* variable, only
    what a Kubeflow TFJob (TF_CONFIG: chief and worker) or an srun step (SLURM_*: tasks 0 and 1
    of 2 on one node) hands its workers: they form one run and train to the one-process
    numbers."""
    port = two_free_ports()
    of = tf_config_of if source == "TF_CONFIG" else slurm_of
    out = tmp_path / "run"
    args = [sys.executable, "-m", "dtcli", "train", QUICK, "--epochs", EPOCHS, "--out", str(out)]
    args += ["--no-progress", "--connect-timeout", "60"]
    base = {k: v for k, v in env().items() if not k.startswith(("DTENSOR_", "SLURM_", "TF_CONFIG"))}
    procs = [
        subprocess.Popen(
            args,
            cwd=ROOT,
            env={**base, **extra},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )  # fmt: skip
        for extra in (of(port, 0), of(port, 1))
    ]
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err
    assert "over cpu:8 (2 clients x 4)" in results[0][1]
    a = metrics.read(out / "metrics.jsonl")
    b = metrics.read(single_run / "metrics.jsonl")
    assert [r["epoch"] for r in a] == [1, 2, 3]
    for key in ("train_loss", "eval_loss", "eval_accuracy", "train_accuracy"):
        assert a[-1][key] == pytest.approx(b[-1][key], rel=1e-4), key


@pytest.mark.slow
def test_only_client_0_writes_and_the_checkpoint_is_complete(launched):
    out, _ = launched
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoints",
        "metrics.jsonl",
        "plots",
        "recipe.yaml",
        "steps.jsonl",
        "tensorboard",
        "train.log",
    ]
    assert len(metrics.read(out / "metrics.jsonl")) == 3  # one writer: no duplicated records
    assert (out / "train.log").read_text().count("epoch 3/3 ") == 1
    steps = [r["step"] for r in metrics.read(out / "steps.jsonl")]
    assert steps == sorted(set(steps))
    assert "devices: cpu:8" in (out / "recipe.yaml").read_text()  # the mesh's total
    assert [p.name for p in rundir.complete_checkpoints(out)] == ["ckpt-00000069"]
    assert not list((out / "checkpoints").glob(".tmp-*"))
    assert ckpt_lib.read_meta(rundir.complete_checkpoints(out)[-1])["mesh"] == {
        "batch": 4,
        "model": 2,
    }


@pytest.mark.slow
def test_a_two_client_checkpoint_evaluates_on_one_device(launched):
    out, _ = launched
    proc = dtcli("eval", out, "--devices", "cpu:1", "--mesh", "batch=1", "--json")
    assert proc.returncode == 0, proc.stderr
    result = last_json(proc)
    final = metrics.read(out / "metrics.jsonl")[-1]
    assert result["devices"] == "cpu:1" and result["trained_on_mesh"] == "batch=4,model=2"
    assert result["examples"] == 360
    assert abs(result["accuracy"] - final["eval_accuracy"]) <= 1e-6
    assert result["loss"] == pytest.approx(final["eval_loss"], rel=1e-4)


@pytest.mark.slow
def leave_nothing(launcher: subprocess.Popen, pids: list[int]) -> None:
    """Kill the launcher's and the clients' process groups, even when an assert failed."""
    for pid in [launcher.pid, *pids]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait(timeout=30)


def launch_and_signal(
    args: list[str], out, sig: int, extra_env: dict | None = None, timeout: float = 60
) -> tuple[subprocess.Popen, list[int], str, float]:
    """`dtcli launch ARGS`; once the run's first checkpoint is complete, `sig` to client 1.
    Returns the (exited) launcher, the client pids, its stderr and the seconds from the signal
    to its exit. Nothing is left running, even when an assert failed."""
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dtcli", "launch", *args],
        cwd=ROOT,
        env={**env(), **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        pids = pids_of(launcher.stderr.readline())
        deadline = time.monotonic() + 600  # 2 clients start and compile: minutes on a slow CI
        while not rundir.complete_checkpoints(out):
            assert launcher.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(pids[1], sig)
        sent = time.monotonic()
        _, stderr = launcher.communicate(timeout=timeout)
        return launcher, pids, stderr, time.monotonic() - sent
    finally:
        leave_nothing(launcher, pids)


def test_a_killed_client_stops_the_run_and_leaves_a_resumable_checkpoint(launched, tmp_path):
    out = tmp_path / "run"
    args = ["--clients", "2", QUICK, "--epochs", "40", "--set", "train.checkpoint_every=1"]
    launcher, pids, stderr, stopped_after = launch_and_signal(
        [*args, "--out", str(out), "--no-progress"], out, signal.SIGKILL
    )
    assert launcher.returncode == 1, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: client 1 failed (killed by SIGKILL); stopped the other clients")
    assert f"resume with: dtcli launch --clients 2 --resume {out}" in last
    assert stopped_after < 20
    assert_gone(pids)
    latest = rundir.complete_checkpoints(out)[-1]
    assert latest is not None and f"last complete checkpoint: {latest}" in last
    # The last complete checkpoint resumes; one more epoch matches the uninterrupted run.
    epoch = ckpt_lib.read_meta(latest)["epoch"] + 1
    proc = dtcli("launch", "--clients", "2", "--resume", out, "--epochs", str(epoch), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"resuming {latest}" in proc.stderr
    assert_gone(pids_of(proc.stderr))
    assert not list((out / "checkpoints").glob(".tmp-*"))
    resumed = metrics.read(out / "metrics.jsonl")
    assert [r["epoch"] for r in resumed] == list(range(1, epoch + 1))
    whole = metrics.read(launched[0] / "metrics.jsonl")
    if epoch <= len(whole):
        for key in ("train_loss", "eval_loss", "eval_accuracy"):
            assert resumed[-1][key] == pytest.approx(whole[epoch - 1][key], rel=1e-5)


@pytest.mark.slow
def test_sigterm_to_one_client_all_save_one_checkpoint_exit_143_and_resume_equal(
    launched, tmp_path
):
    """A scheduler preempts client 1: TensorFlow records the notice, both clients learn of it
    through the same train call, write one checkpoint together and exit 143; so does the
    launcher. Resumed, the run ends where the uninterrupted one does."""
    out = tmp_path / "run"
    args = ["--clients", "2", QUICK, "--epochs", EPOCHS, "--set", "train.checkpoint_every=1"]
    launcher, pids, stderr, _ = launch_and_signal(
        [*args, "--out", str(out), "--no-progress"],
        out,
        signal.SIGTERM,
        # slow saves: the notice (TF checks for it each second) lands mid-run
        {"DTCLI_TEST_PAUSE_IN_SAVE": "3"},
        timeout=120,
    )
    assert launcher.returncode == 143, stderr
    latest = rundir.complete_checkpoints(out)[-1]
    step = ckpt_lib.read_meta(latest)["step"]
    assert 23 < step < 3 * 23  # after the first checkpoint, before the end
    # one checkpoint, the same for both, said once by client 0 (and the launcher); resumed as a launch
    assert (
        f"[client 0] preempted (SIGTERM); saved {latest}; resume with: dtcli launch --clients 2 --resume {out}"
        in stderr
    )
    assert "[client 1] preempted" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last == (
        f"preempted (SIGTERM); last complete checkpoint: {latest}; resume with: "
        f"dtcli launch --clients 2 --resume {out}"
    )
    assert_gone(pids)
    assert not list((out / "checkpoints").glob(".tmp-*"))
    proc = dtcli("launch", "--clients", "2", "--resume", out, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"resuming {latest}" in proc.stderr
    resumed = metrics.read(out / "metrics.jsonl")
    whole = metrics.read(launched[0] / "metrics.jsonl")
    assert [r["epoch"] for r in resumed] == [1, 2, 3]
    assert resumed[-1]["step"] == whole[-1]["step"]
    for key in ("train_loss", "eval_loss", "eval_accuracy"):
        assert resumed[-1][key] == pytest.approx(whole[-1][key], rel=1e-5), key


@pytest.mark.slow
def test_sigterm_to_the_launcher_while_clients_start_exits_143_and_leaves_no_run(tmp_path):
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dtcli", "launch", "--clients", "2", QUICK, "--out", str(out),
         "--no-progress"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    pids: list[int] = []
    try:
        pids = pids_of(launcher.stderr.readline())
        launcher.send_signal(signal.SIGTERM)  # forwarded to clients that are still starting
        _, stderr = launcher.communicate(timeout=120)
    finally:
        leave_nothing(launcher, pids)
    assert launcher.returncode == 143, stderr
    last = stderr.strip().splitlines()[-1]
    assert last == "preempted (SIGTERM); no complete checkpoint was written"
    assert_gone(pids)
    assert not out.exists()  # nothing to resume: the requeued job starts it anew with --out


def ignore_sigint() -> None:
    """As a non-interactive shell starts a background job (`dtcli ... &` in a script)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.slow
def test_ctrl_c_stops_a_launch_started_with_sigint_ignored_and_its_clients(tmp_path):
    """A script's background launch inherits SIGINT ignored: Ctrl-C (kill -INT) still stops it
    with 130, and it stops its clients as at a terminal. (It ran to its end and exited 0.)"""
    out = tmp_path / "run"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "dtcli", "launch", "--clients", "2", QUICK, "--epochs", "40",
         "--out", str(out), "--no-progress"],
        cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=ignore_sigint,
    )  # fmt: skip
    pids: list[int] = []
    try:
        pids = pids_of(launcher.stderr.readline())  # the launcher's main() runs: clients started
        launcher.send_signal(signal.SIGINT)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        leave_nothing(launcher, pids)
    assert launcher.returncode == 130, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: interrupted; stopped 2 clients"), last
    assert_gone(pids)


def test_a_launch_whose_clients_all_finished_exits_0_whatever_signal_comes_after(
    tmp_path, monkeypatch
):
    """The launcher's SIGTERM once every client is done (forwarded to none: a scheduler would
    requeue a finished job on 143), and SIGINT or SIGTERM after it returned: nothing changes."""
    from dtcli.launch import supervisor

    heard = []

    def hear(signum, frame):  # stands in for Python's defaults, which would end this process
        heard.append(signal.Signals(signum).name)

    def supervised_then_sigterm(*args, **kwargs):
        failed = real_supervise(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # every client exited 0: the run is complete
        return failed

    real_supervise = supervisor._supervise
    monkeypatch.setattr(supervisor, "_supervise", supervised_then_sigterm)
    done = [sys.executable, "-c", "print('done: 1 epoch')"]  # a client that trained its run
    monkeypatch.setattr(supervisor, "_command", lambda p, client, progress: done)
    p = types.SimpleNamespace(
        clients=2, jobs=("a:1", "b:2"), grace=1.0, run_dir=tmp_path, gpus_per_client=None
    )
    found = {sig: signal.signal(sig, hear) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        returned = supervisor.run(p, progress=False, until_exit=True)
        for sig in found:  # as the launcher prints the run directory and exits
            signal.raise_signal(sig)
    finally:
        for sig, handler in found.items():
            signal.signal(sig, handler)
    assert returned == tmp_path and heard == []


@pytest.mark.slow
def test_two_clients_read_disjoint_shares_of_tfrecord_files(tmp_path, digit_files):
    """3 TFRecord files of 479 digits on 2 clients: client 0 reads files 0 and 2, client 1 file 1,
    each 32 rows of every global batch of 64. Every example counts once; the run takes as many
    steps as the larger share needs (958 / 32 = 30), client 1 padding its last 15. Reading
    everything on both clients would count 2874 examples in 45 steps."""
    out = tmp_path / "run"
    sets = [x for s in digit_files["tfrecord"] for x in ("--set", s)]
    proc = dtcli(
        "launch", "--clients", "2", "--devices-per-client", "cpu:4", QUICK, *sets,
        "--epochs", "1", "--out", out, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    record = metrics.read(out / "metrics.jsonl")[-1]
    assert record["train_examples"] == 1437 and record["step"] == 30
    assert record["eval_examples"] == 360  # one eval file: examples dealt out, each once


def test_launch_passes_profile_to_the_clients(tmp_path):
    from dtcli import launch as launch_lib

    p = launch_lib.plan(QUICK, 2, out=tmp_path / "run", profile=(3, 5))
    assert p.train_args[-2:] == ("--profile", "3:5")


@pytest.mark.parametrize("chief", [True, False])
def test_a_launched_non_chief_client_stops_without_its_own_line(monkeypatch, chief):
    """Client 0 and the launcher say that the run was preempted; client 1 only exits 143."""
    from dtcli import progress as progress_lib
    from dtcli import recipe as R
    from dtcli.errors import Interrupted
    from dtcli.train import run as run_lib

    def preempted(run):
        raise Interrupted(None, None, preempted=True)

    monkeypatch.setenv(progress_lib.LAUNCHED_ENV, "1")
    monkeypatch.setattr(run_lib, "_open_and_train", preempted)
    cluster = types.SimpleNamespace(is_chief=chief)
    expected = Interrupted if chief else SystemExit
    with pytest.raises(expected) as caught:
        run_lib.train(R.load(QUICK), cluster=cluster)
    if not chief:
        assert caught.value.code == 143


def test_gpus_are_counted_without_tensorflow(tmp_path):
    from dtcli.devices import gpus_without_tensorflow

    assert gpus_without_tensorflow(tmp_path) is None  # no /proc: not Linux, nothing to read
    (tmp_path / "proc").mkdir()
    (tmp_path / "dev").mkdir()
    assert gpus_without_tensorflow(tmp_path) == 0  # Linux, and no sign of a GPU
    (tmp_path / "dev" / "dxg").touch()  # WSL's GPU: there, but not counted
    assert gpus_without_tensorflow(tmp_path) is None
    listed = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (listed / bus).mkdir(parents=True)
    assert gpus_without_tensorflow(tmp_path) == 2


@pytest.mark.parametrize("found", [0, 1, 2, None])
def test_launch_checks_the_gpus_per_client_before_any_client_starts(found, monkeypatch, tmp_path):
    """On a machine without GPUs, `--devices-per-client gpu:1` started both clients, and each
    failed after its TensorFlow started with `--devices 'gpu:2': TensorFlow sees no GPU`, an
    option the user never typed."""
    from dtcli import devices as devices_lib
    from dtcli import launch as launch_lib
    from dtcli import recipe as R

    monkeypatch.setattr(devices_lib, "gpus_without_tensorflow", lambda: found)
    given = R.Overrides(mesh="batch=2")
    if found in (0, 1):
        there = "this machine shows no GPU" if found == 0 else "the NVIDIA driver lists 1 GPU "
        with pytest.raises(UsageError, match=rf"^--devices-per-client gpu:1: {there}.* need 2;"):
            launch_lib.plan(QUICK, 2, "gpu:1", given, out=tmp_path / "run")
        return
    p = launch_lib.plan(QUICK, 2, "gpu:1", given, out=tmp_path / "run")  # None: TF will tell
    assert p.gpus_per_client == 1 and p.devices == "gpu:2"
