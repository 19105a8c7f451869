"""Mesh arithmetic (pure) and mesh construction (TensorFlow, imported lazily)."""

from __future__ import annotations

import math
from typing import Any

from dtcli.errors import UsageError

# The layout entry (in layouts.data_axis and the layout rules) for a dim no mesh axis shards.
UNSHARDED = "unsharded"


def mesh_text(axes: dict[str, int]) -> str:
    """`{"batch": 4, "model": 2}` -> "batch=4,model=2" (the --mesh form, in messages too)."""
    return ",".join(f"{a}={s}" for a, s in axes.items())


def resolve_axes(axes: dict[str, int], device_count: int) -> dict[str, int]:
    """Fill a -1 axis with the remaining devices and check the sizes multiply to the count."""
    known = math.prod(s for s in axes.values() if s != -1)
    fill = [a for a, s in axes.items() if s == -1]
    if fill:
        if device_count % known:
            raise UsageError(
                f"mesh {mesh_text(axes)}: the fixed axes ({known} devices) do not divide the "
                f"{device_count} devices"
            )
        axes = {a: (device_count // known if s == -1 else s) for a, s in axes.items()}
    total = math.prod(axes.values())
    if total != device_count:
        raise UsageError(
            f"mesh {mesh_text(axes)}: axis sizes multiply to {total}, but there are "
            f"{device_count} devices (set --devices or the recipe key 'devices', or use -1 for "
            "one axis)"
        )
    return axes


def device_count_for(axes: dict[str, int]) -> int | None:
    """The device count a mesh asks for, or None when one axis is -1."""
    if any(s == -1 for s in axes.values()):
        return None
    return math.prod(axes.values())


def data_shards(axes: dict[str, int], data_axis: str) -> int:
    """How many shards the batch dim is cut into (1 when the batch is replicated)."""
    return 1 if data_axis == UNSHARDED else axes[data_axis]


# What compiles a run's steps (mesh.step_compiler): XLA on plain variables, TensorFlow's own
# kernels on plain variables (a graph without XLA), or DTensor on a mesh.
XLA, GRAPH, DTENSOR = "xla", "graph", "dtensor"
PLAIN = (XLA, GRAPH)  # the compilers of a one-device run without a mesh


def step_compiler(
    setting: str, axes: dict[str, int], clients: int = 1, bf16_cpu: bool = False
) -> str:
    """What compiles the steps for train.compile `setting`: `xla` or `graph` (plain variables,
    no mesh) only on a mesh of one device in one process, where no SPMD is needed; DTensor's
    `jit_compile` compiles nothing and its XLA SPMD is TPU-only (DTENSOR_NOTES), so a bigger
    mesh stays on DTensor.

    `auto` on one device: XLA, except `bf16_cpu`, bf16 steps on a CPU whose matmul units take
    bfloat16 (cpuinfo.runs_bf16). There `auto` takes TensorFlow's own kernels (`graph`):
    XLA:CPU converts every bf16 dot to float32, while oneDNN runs them on AMX (tiny_gpt in bf16
    on a 2-core Xeon, alternated: 512 wide 229 ms a step against 382 through XLA; 128 wide on 1
    thread 45-54 against 74; 128 wide on 2 threads 44 against 42, the one shape measured where
    XLA's fusion wins). A float32 run's `auto` may still pick `graph` per CPU and shape
    (steps.choice measures both once and keeps the answer)."""
    one = math.prod(axes.values()) == 1 and clients == 1
    if setting in PLAIN and not one:
        raise UsageError(
            f"recipe key 'train.compile': {setting} compiles a mesh of one device in one "
            f"process, not mesh {mesh_text(axes)}"
            f"{f' over {clients} clients' if clients > 1 else ''} (use auto or dtensor)"
        )
    if setting != "auto":
        return setting
    if not one:
        return DTENSOR
    return GRAPH if bf16_cpu else XLA


def compiles_with_xla(
    setting: str, axes: dict[str, int], clients: int = 1, bf16_cpu: bool = False
) -> bool:
    """Whether the steps compile with XLA on plain variables (step_compiler)."""
    return step_compiler(setting, axes, clients, bf16_cpu) == XLA


def check_batch(axes: dict[str, int], data_axis: str, batch_size: int, key: str) -> None:
    shards = data_shards(axes, data_axis)
    if batch_size % shards:
        raise UsageError(
            f"recipe key '{key}': {batch_size} does not divide by the data axis "
            f"'{data_axis}' of size {shards} (mesh {mesh_text(axes)})"
        )


def build_mesh(
    axes: dict[str, int], device_type: str, distributed: bool = False, count: int | None = None
) -> Any:
    """A DTensor mesh of `device_type`, axes in recipe order.

    `distributed`: over the global device list of a multi-client run (client i holds the i-th
    block of devices); each client sees the same mesh and computes on its local devices only.
    `count`: over only the first `count` local devices (so that one process can compare a
    1-device mesh with a multi-device one, as `dtcli doctor` does).
    """
    from tensorflow.experimental import dtensor

    if distributed:
        return dtensor.create_distributed_mesh(list(axes.items()), device_type=device_type)
    if count is not None:
        names = [f"{device_type}:{i}" for i in range(count)]
        return dtensor.create_mesh(list(axes.items()), devices=names, device_type=device_type)
    return dtensor.create_mesh(list(axes.items()), device_type=device_type)


def barrier(mesh: Any) -> None:
    """Return only once every device of the mesh (every client) has reached this call.

    A sum over a tensor with one element per device, sharded along every mesh axis: its value
    needs every device's part, so no client gets it before all have contributed.
    """
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    names = list(mesh.dim_names)
    ones = [np.ones([1] * len(names), np.float32)] * len(mesh.local_device_ids())
    total = float(tf.reduce_sum(dtensor.pack(ones, dtensor.Layout(names, mesh))))
    if int(total) != mesh.size:
        raise RuntimeError(f"barrier: {total} of {mesh.size} devices answered")
