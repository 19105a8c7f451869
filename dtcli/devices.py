"""Device specs (`cpu:8`, `gpu`, `tpu`, `auto`), configured before TensorFlow's runtime starts."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtcli.errors import UsageError, one_line
from dtcli.tfruntime import import_tensorflow, quiet_native_logs

if TYPE_CHECKING:
    from dtcli.cluster import Cluster


@dataclass(frozen=True)
class DeviceSpec:
    kind: str  # "cpu", "gpu", "tpu" or "auto"
    count: int | None  # None: as many as the mesh needs (cpu) or all there are (gpu)


# The most virtual CPU devices one process may ask for (cpu:N, or a mesh with devices `cpu`).
# Each virtual CPU is a full TensorFlow device with its own thread pools and buffers: hundreds of
# them exhaust memory or hang TensorFlow's runtime start. GPUs are checked against the real ones.
MAX_VIRTUAL_CPUS = 64


RECIPE_KEY = "recipe key 'devices'"


def key_for(given: str | None) -> str:
    """How messages name the devices: --devices when the command line gave them (the value the
    recipe then holds), else the recipe key."""
    return "--devices" if given is not None else RECIPE_KEY


def _named(key: str, spec: str) -> str:
    """`--devices 'gpu'` for the option, `recipe key 'devices' = 'gpu'` for the key."""
    return f"{key} {spec!r}" if key.startswith("--") else f"{key} = {spec!r}"


def parse(spec: str, where: str = RECIPE_KEY) -> DeviceSpec:
    m = re.fullmatch(r"(cpu|gpu|tpu|auto)(?::(\d+))?", spec.strip().lower())
    if not m or (m.group(1) in ("tpu", "auto") and m.group(2)) or m.group(2) == "0":
        raise UsageError(
            f"{where}: expected cpu, cpu:N, gpu, gpu:N (N at least 1), tpu or auto, got {spec!r}"
        )
    kind, digits = m.group(1), m.group(2)
    if digits is None:
        return DeviceSpec(kind, None)
    if digits.startswith("0"):
        fix = f"write {kind}:{digits.lstrip('0')}" if digits.strip("0") else "the count is >= 1"
        raise UsageError(f"{where}: the device count in {spec!r} has a leading zero ({fix})")
    if len(digits) > 9:  # no machine has a billion devices (and int() refuses huge strings)
        raise UsageError(f"{where}: {spec!r} asks for more devices than any machine has")
    count = int(digits)
    if kind == "cpu" and count > MAX_VIRTUAL_CPUS:
        raise UsageError(
            f"{where}: {spec.strip()} asks for {count} virtual CPUs; at most {MAX_VIRTUAL_CPUS} "
            "(MAX_VIRTUAL_CPUS: more exhaust memory or hang TensorFlow's runtime start)"
        )
    return DeviceSpec(kind, count)


@dataclass(frozen=True)
class Devices:
    device_type: str  # "CPU", "GPU" or "TPU", as DTensor names them
    count: int  # the devices of the whole mesh (all clients together)
    clients: int = 1  # processes the mesh spans; each holds count // clients devices

    @property
    def local_count(self) -> int:
        return self.count // self.clients

    @property
    def text(self) -> str:
        # The global count: the same recipe then means the same mesh in one process or in N.
        return f"{self.device_type.lower()}:{self.count}"


def configure(
    spec: str,
    wanted: int | None,
    key: str = RECIPE_KEY,
    cluster: Cluster | None = None,
) -> Devices:
    """Configure TensorFlow's devices for `spec`; call before any TensorFlow op runs.

    `wanted` is the device count the mesh asks for (None when an axis is -1). A count in `spec`
    is the mesh's device count over all clients: with a `cluster`, this client configures only
    its own share and starts DTensor's multi-client runtime (gRPC to the other clients).
    """
    parsed = parse(spec, key)
    tf = import_tensorflow()
    with quiet_native_logs():
        if cluster is None:
            return _configure(tf, parsed, spec, wanted, key)
        return _configure_client(tf, parsed, spec, wanted, key, cluster)


def _configure(tf: Any, parsed: DeviceSpec, spec: str, wanted: int | None, key: str) -> Devices:
    from tensorflow.experimental import dtensor

    kind = _kind(tf, parsed)
    if kind == "cpu":
        count = parsed.count or wanted or 1
        _virtual_cpus(tf, count, f"{key} {spec!r}")
        return Devices("CPU", count)
    if kind == "gpu":
        count = _visible_gpus(tf, parsed.count, spec, key)
        return Devices("GPU", count)
    try:
        dtensor.initialize_accelerator_system("TPU")
    except Exception as exc:  # noqa: BLE001 - TPU init raises many types
        raise UsageError(
            f"{_named(key, spec)}: could not start the TPU system ({one_line(exc)})"
        ) from None
    return Devices("TPU", len(tf.config.list_logical_devices("TPU")))


def _kind(tf: Any, parsed: DeviceSpec) -> str:
    if parsed.kind == "auto":
        return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    return parsed.kind


def _visible_gpus(tf: Any, count: int | None, spec: str, key: str) -> int:
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise UsageError(f"{_named(key, spec)}: TensorFlow sees no GPU on this machine")
    count = count or len(gpus)
    if count > len(gpus):
        raise UsageError(
            f"{_named(key, spec)}: asked for {count} GPUs, TensorFlow sees {len(gpus)}"
        )
    try:
        tf.config.set_visible_devices(gpus[:count], "GPU")
        for gpu in gpus[:count]:
            tf.config.experimental.set_memory_growth(gpu, True)
    except RuntimeError:
        pass  # already initialized in this process with the same GPUs
    return count


# Where a Linux machine shows its GPUs without TensorFlow: the NVIDIA driver lists one folder per
# GPU; a container or WSL may show only device files (NVIDIA's, ROCm's, WSL's GPU paravirtual).
NVIDIA_GPUS = "proc/driver/nvidia/gpus"
GPU_DEVICE_FILES = ("dev/nvidia[0-9]*", "dev/kfd", "dev/dxg")


def gpus_without_tensorflow(root: Path = Path("/")) -> int | None:
    """How many GPUs this machine has, as far as one can tell before TensorFlow starts (seconds
    a client): the NVIDIA driver's count; 0 where no GPU shows at all; None where one may be
    there but cannot be counted (a device file only, or a system other than Linux)."""
    listed = root / NVIDIA_GPUS
    if listed.is_dir():
        return sum(1 for _ in listed.iterdir())
    if not (root / "proc").is_dir():  # not Linux: nothing to read
        return None
    if any(any(root.glob(pattern)) for pattern in GPU_DEVICE_FILES):
        return None
    return 0


def local_share(total: int, clients: int, where: str) -> int:
    """The devices one client holds of a mesh of `total` devices (every client holds as many)."""
    if total % clients:
        raise UsageError(
            f"--jobs: {clients} clients do not divide the {total} devices of {where} (each "
            "client must hold the same number of devices)"
        )
    return total // clients


def check_clients(spec: str, wanted: int | None, clients: int, key: str) -> None:
    """Before any client starts: the clients must split the mesh's devices evenly."""
    parsed = parse(spec, key)
    total = parsed.count or (wanted if parsed.kind in ("cpu", "auto") else None)
    if total:
        local_share(total, clients, f"{key} {spec!r}")


def _configure_client(
    tf: Any, parsed: DeviceSpec, spec: str, wanted: int | None, key: str, cluster: Cluster
) -> Devices:
    """One client of a multi-client run: its local devices, then DTensor's runtime."""
    from tensorflow.experimental import dtensor

    from dtcli import cluster as cluster_lib

    n = cluster.num_clients
    kind = _kind(tf, parsed)
    local: int | None = None
    if kind == "cpu":
        total = parsed.count or wanted
        local = local_share(total, n, f"{key} {spec!r}") if total else 1
    elif kind == "gpu":
        count = parsed.count and local_share(parsed.count, n, f"{key} {spec!r}")
        local = _visible_gpus(tf, count, spec, key)
    cluster_lib.export_env(cluster)
    if kind == "cpu":
        _share_cores(tf, local)
    try:
        # Starts this client's gRPC server and waits for the others (they passed the preflight,
        # so they are up); CPU: the virtual devices are this client's share only.
        dtensor.initialize_accelerator_system(
            kind.upper(), num_logical_cpu_devices=local if kind == "cpu" else None
        )
    except Exception as exc:  # noqa: BLE001 - the runtime raises many types
        raise UsageError(
            f"{cluster.where}: client {cluster.client_id} could not start DTensor's multi-client "
            f"runtime on {cluster.address} ({one_line(exc, named=True)})"
        ) from None
    if kind == "tpu":
        local = dtensor.num_local_devices("TPU")
    return Devices(kind.upper(), local * n, n)


def intra_op_threads(devices: int, cores: int) -> int | None:
    """The intra-op threads for `devices` virtual CPUs sharing `cores`, or None: TensorFlow's
    default (one device). Every virtual device runs its own copy of each op at once, so ops
    that also split themselves over all the cores only contend: each device gets its share
    (measured on 2 cores, 8 devices: the tensor-parallel GPT 291 -> 239 ms a step, the
    data-parallel MLP 18.8 -> 15.6, the 2-D CNN 260 -> 250; the same losses to 2e-8)."""
    if devices <= 1:
        return None
    return max(1, cores // devices)


def _share_cores(tf: Any, count: int) -> None:
    """Before the runtime starts: intra_op_threads, unless the user set TF_NUM_INTRAOP_THREADS."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = intra_op_threads(count, cores or 1)
    if threads is None or os.environ.get("TF_NUM_INTRAOP_THREADS"):
        return
    with contextlib.suppress(RuntimeError):  # the runtime already started in this process
        tf.config.threading.set_intra_op_parallelism_threads(threads)


def _virtual_cpus(tf, count: int, where: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    _share_cores(tf, count)
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    except RuntimeError:
        # The runtime already started in this process; fine if it has the same devices.
        have = len(tf.config.list_logical_devices("CPU"))
        if have != count:
            raise UsageError(
                f"{where}: TensorFlow already started in this process with {have} CPU devices; "
                f"{count} need a fresh process"
            ) from None


# Dense bf16/fp16 peak FLOP/s of one device, by a name fragment, for the MFU (a fraction of
# this); float32 runs reach a fraction of it even at best. Vendors' data sheets, without
# sparsity. CPUs have no entry: their peak depends on cores, clock and vector units.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L4": 121e12,
    "A10G": 125e12,
    "V100": 125e12,
    "T4": 65e12,
    "TPU v5p": 459e12,
    "TPU v5 lite": 197e12,
    "TPU v4": 275e12,
}


def peak_flops() -> float | None:
    """The known peak of this process's first accelerator, or None (CPUs, unknown models)."""
    import tensorflow as tf

    for kind in ("GPU", "TPU"):
        found = tf.config.list_physical_devices(kind)
        if not found:
            continue
        try:
            name = tf.config.experimental.get_device_details(found[0]).get("device_name", "")
        except (ValueError, RuntimeError):
            name = ""
        for fragment, peak in PEAK_FLOPS.items():
            if fragment in name:
                return peak
    return None


def peak_memory(devices: Devices) -> int | None:
    """The highest memory peak (bytes) of this process' accelerators since the last call, which
    starts the next period; None where TensorFlow does not track it (CPUs)."""
    if devices.device_type not in ("GPU", "TPU"):
        return None
    import tensorflow as tf

    peaks = []
    for i in range(devices.local_count):
        name = f"{devices.device_type}:{i}"
        try:
            peaks.append(int(tf.config.experimental.get_memory_info(name)["peak"]))
            tf.config.experimental.reset_memory_stats(name)
        except (ValueError, RuntimeError, KeyError, tf.errors.OpError):
            return None
    return max(peaks) if peaks else None


def memory_limit(devices: Devices) -> int | None:
    """The memory (bytes) TensorFlow gives each of this process's devices, or None where it
    reports none: CPUs (virtual CPUs share the host's memory), TPUs. GPUs: the limit of
    TensorFlow's allocator on each (device_lib), the smallest over the local GPUs."""
    if devices.device_type != "GPU":
        return None
    import tensorflow as tf
    from tensorflow.python.client import device_lib

    try:
        # The runtime first, with the options configure() set (memory growth): device_lib would
        # otherwise create the GPUs' allocators with its defaults.
        tf.config.list_logical_devices("GPU")
        found = device_lib.list_local_devices()
    except Exception:  # noqa: BLE001 - a report, not a requirement: no budget then
        return None
    limits = [int(d.memory_limit) for d in found if d.device_type == "GPU" and d.memory_limit]
    return min(limits) if limits else None


def host_only() -> None:
    """TensorFlow in this process on its CPU only, before it starts: a launcher that builds a
    model to plan it while its clients hold the GPUs."""
    tf = import_tensorflow()
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        pass  # already started: it did its work on the CPU (models.keras.describe)
