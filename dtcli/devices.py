"""Device specs (`cpu:8`, `gpu`, `tpu`, `auto`) and configuring TensorFlow before its runtime starts."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from dtcli.errors import UsageError

# Set before TensorFlow is imported anywhere in the process (dtcli/__init__ calls this).
# The all-reduce combining pass gives silently wrong weights when one tf.function computes
# gradients and applies them on a multi-device mesh (see DTENSOR_NOTES); only "0" turns it off.
# setdefault, so that `dtcli doctor` can see a user forcing it on.
RUNTIME_ENV = {
    "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION": "0",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def set_runtime_env() -> None:
    for key, value in RUNTIME_ENV.items():
        os.environ.setdefault(key, value)


@dataclass(frozen=True)
class DeviceSpec:
    kind: str  # "cpu", "gpu", "tpu" or "auto"
    count: int | None  # None: as many as the mesh needs (cpu) or all there are (gpu)


def parse(spec: str, key: str = "devices") -> DeviceSpec:
    m = re.fullmatch(r"(cpu|gpu|tpu|auto)(?::(\d+))?", spec.strip().lower())
    if not m or (m.group(1) in ("tpu", "auto") and m.group(2)) or m.group(2) == "0":
        raise UsageError(f"{key} {spec!r}: expected cpu, cpu:N, gpu, gpu:N, tpu or auto")
    return DeviceSpec(m.group(1), int(m.group(2)) if m.group(2) else None)


@dataclass(frozen=True)
class Devices:
    device_type: str  # "CPU", "GPU" or "TPU", as DTensor names them
    count: int

    @property
    def text(self) -> str:
        return f"{self.device_type.lower()}:{self.count}"


def configure(spec: str, wanted: int | None, key: str = "devices") -> Devices:
    """Configure TensorFlow's devices for `spec`; call before any TensorFlow op runs.

    `wanted` is the device count the mesh asks for (None when an axis is -1).
    """
    parsed = parse(spec, key)
    set_runtime_env()
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    kind = parsed.kind
    if kind == "auto":
        kind = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    if kind == "cpu":
        count = parsed.count or wanted or 1
        _virtual_cpus(tf, count, f"{key} {spec!r}")
        return Devices("CPU", count)
    if kind == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            raise UsageError(f"{key} {spec!r}: TensorFlow sees no GPU on this machine")
        count = parsed.count or len(gpus)
        if count > len(gpus):
            raise UsageError(f"{key} {spec!r}: asked for {count} GPUs, TensorFlow sees {len(gpus)}")
        try:
            tf.config.set_visible_devices(gpus[:count], "GPU")
            for gpu in gpus[:count]:
                tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            pass  # already initialized in this process with the same GPUs
        return Devices("GPU", count)
    try:
        dtensor.initialize_accelerator_system("TPU")
    except Exception as exc:  # noqa: BLE001 - TPU init raises many types
        raise UsageError(f"{key} {spec!r}: could not start the TPU system ({exc})") from None
    return Devices("TPU", len(tf.config.list_logical_devices("TPU")))


def _virtual_cpus(tf, count: int, where: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
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
