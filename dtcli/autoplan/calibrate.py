"""The cost model's rates, measured on the devices themselves by a probe of a minute or so, and
cached per device kind (DTCLI_CACHE_DIR, else $XDG_CACHE_HOME/dtcli, else ~/.cache/dtcli).

The probe times, on a mesh of each device count the search weighs (every divisor of the count:
on virtual CPUs sharing a few cores a mesh of fewer devices runs each op fewer times), each in
its own `tf.function` called a few times after a first (compiling) call, the fastest call taken
(load from other processes only ever adds time):
- a batch-sharded matmul: FLOP/s per device;
- chains of dependent all-reduces over each axis of a 2-axis mesh (the group sizes the search's
  meshes have), of a few floats and of 1 MiB: seconds per collective (alpha) and bytes per
  second per device (beta), per group size;
- a chain of small element-wise ops: seconds per op per device (on N virtual CPUs sharing a
  few cores, every op runs once per device: this is what a step's op count costs);
- a chain of element-wise ops on 4 MiB per device: bytes read and written per second;
and on one device, plain tensors compiled by XLA (what a one-device candidate runs): the same
matmul, a chain of small matmuls (seconds per kernel: XLA fuses element-wise chains, so a step
runs kernels, not ops) and one fused element-wise op on 4 MiB.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtcli import cpuinfo
from dtcli.autoplan.cost import Calibration, Rates
from dtcli.errors import UsageError
from dtcli.progress import Heartbeat
from dtcli.tfruntime import CACHE_ROOT_ENV, cache_root

CACHE_ENV = CACHE_ROOT_ENV
CACHE_FILE = "calibration.json"
PROBE_VERSION = 3  # a cached entry of another version is measured again
CHAIN = 24  # dependent collectives or ops per timed call
BIG_FLOATS = 2**18  # 1 MiB of float32 per all-reduce
STREAM_FLOATS = 2**20  # 4 MiB of float32 per device per element-wise op


def cache_path() -> Path:
    """Where calibrations are kept: dtcli's cache folder, never inside the repository."""
    return cache_root(os.environ) / CACHE_FILE


def device_kind(device_type: str, count: int) -> str:
    """The cache key: device type and count, the processor's name, TensorFlow's version."""
    from dtcli.tfruntime import import_tensorflow

    tf = import_tensorflow()
    name = platform.processor() or platform.machine()
    if device_type == "CPU":
        name = cpuinfo.model_name() or name
        name += f" x{os.cpu_count()} cores"
    else:
        found = tf.config.list_physical_devices(device_type)
        if found:
            details = tf.config.experimental.get_device_details(found[0])
            name = details.get("device_name", name)
    return f"{device_type.lower()}:{count} {name} tf {tf.__version__}"


def load_cached(kind: str) -> Calibration | None:
    path = cache_path()
    try:
        entries = json.loads(path.read_text())
        entry = entries[kind]
        if entry.get("version") != PROBE_VERSION:
            return None
        return Calibration.from_json(entry["rates"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # no cache, another version, or a damaged file: measure again


def store(kind: str, rates: Calibration) -> Path:
    path = cache_path()
    try:
        entries = json.loads(path.read_text()) if path.is_file() else {}
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries[kind] = {"version": PROBE_VERSION, "rates": rates.to_json(), "when": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)
    except OSError as exc:
        raise UsageError(
            f"calibration cache {str(path)!r}: cannot write it ({exc.strerror}); set "
            f"{CACHE_ENV} to a writable folder"
        ) from None
    return path


def rates_for(
    device_type: str,
    count: int,
    console: Any,
    recalibrate: bool = False,
    progress: bool = True,
) -> tuple[Calibration, bool]:
    """The cached rates of these devices, or a fresh probe's (then cached); and whether they
    were measured now. A probe says on `console` (stderr) what it measures as each part starts
    and, where that is no terminal, again every BEAT_EVERY seconds it lasts (a mesh of 8
    virtual CPUs on 2 cores takes 15 s: a log must not go silent); `progress` False: nothing."""
    kind = device_kind(device_type, count)
    cached = None if recalibrate else load_cached(kind)
    if cached is not None:
        return cached, False
    where = f"{device_type.lower()}:{count}"
    with Heartbeat(console, "calibrating", on=progress) as beat:

        def say(text: str) -> None:
            if progress:
                beat.now(text)  # the heartbeat's clock counts this part's seconds
                beat.heard()
                console.print(text, markup=False, highlight=False, soft_wrap=True)

        say(f"calibrating the cost model on {where} (once; cached in {cache_path()})")
        rates = probe(device_type, count, say)
    store(kind, rates)
    return rates, True


def _timed(fn: Callable[[], Any], repeats: int = 7) -> float:
    """Seconds of the fastest of `repeats` calls of `fn`, after a first (compiling) call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def probe(device_type: str, count: int, say: Callable[[str], None] = print) -> Calibration:
    """Measure the rates on meshes of each divisor of `count` devices of `device_type`
    (configured already), and XLA's on one device where it compiles (mesh.compiles_with_xla)."""
    meshes = {}
    for devices in [d for d in range(1, count + 1) if count % d == 0]:
        say(f"calibrating: a mesh of {devices} device{'s' if devices > 1 else ''}")
        meshes[devices] = _probe_mesh(device_type, devices)
    xla = None
    if device_type != "TPU":
        say("calibrating: one device compiled by XLA")
        xla = _probe_xla()
    return Calibration(meshes, xla)


def _probe_mesh(device_type: str, count: int) -> Rates:
    """The rates of a mesh of the first `count` devices."""
    from dtcli import mesh as mesh_lib

    flat = mesh_lib.build_mesh({"x": count}, device_type, count=count)
    flop_rate = _matmul_rate(flat, count)
    op_seconds = _op_seconds(flat, count, 16)
    stream = _op_seconds(flat, count, STREAM_FLOATS)
    stream_rate = 2 * STREAM_FLOATS * 4 / max(stream - op_seconds, 1e-9)  # read and write
    alpha: dict[int, float] = {}
    beta: dict[int, float] = {}
    for sizes in _probe_meshes(count):
        mesh = mesh_lib.build_mesh(dict(zip(("a", "b"), sizes)), device_type, count=count)
        for axis, group in zip(("a", "b"), sizes):
            if group > 1 and group not in alpha:
                alpha[group], beta[group] = _all_reduce_costs(mesh, axis, op_seconds)
    return Rates(flop_rate, alpha, beta, op_seconds, stream_rate)


def _probe_meshes(count: int) -> list[tuple[int, int]]:
    """2-axis meshes whose axes give every group size > 1 that divides `count`."""
    out = []
    for group in range(2, count + 1):
        if count % group == 0:
            out.append((group, count // group))
    return out


# The matmuls the FLOP rate is probed on: rows per device through a 4x wide MLP, the shapes of
# a small transformer's layers (XLA's CPU matmuls vary 3x with shape: a square 256 x 256 one ran
# at a third of this one's rate, where oneDNN's did not).
PROBE_ROWS, PROBE_WIDTH = 1024, 256


def _mlp_chain(x: Any, w_in: Any, w_out: Any) -> Any:
    """Four [rows, W] @ [W, 4W] @ [4W, W] pairs: 16 * rows * W * 4W FLOPs."""
    import tensorflow as tf

    for _ in range(4):
        x = tf.matmul(tf.matmul(x, w_in), w_out)
    return tf.reduce_sum(x[:1, :1])


def _mlp_flops(rows: int) -> float:
    return 16 * 2.0 * rows * PROBE_WIDTH * 4 * PROBE_WIDTH


def _matmul_rate(mesh: Any, count: int) -> float:
    """FLOP/s per device of `_mlp_chain`, rows sharded over the mesh."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    rows, width = PROBE_ROWS * count, PROBE_WIDTH
    x = dtensor.copy_to_mesh(np.ones((rows, width), np.float32), dtensor.Layout.replicated(mesh, 2))
    x = dtensor.relayout(x, dtensor.Layout(["x", dtensor.UNSHARDED], mesh))
    w_in, w_out = (
        dtensor.copy_to_mesh(np.full(shape, 1e-3, np.float32), dtensor.Layout.replicated(mesh, 2))
        for shape in ((width, 4 * width), (4 * width, width))
    )
    chain = tf.function(_mlp_chain)
    return _mlp_flops(PROBE_ROWS) / _timed(lambda: chain(x, w_in, w_out).numpy())


def _op_seconds(mesh: Any, count: int, floats: int) -> float:
    """Seconds per element-wise op of `floats` floats per device, on every device."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    layout = dtensor.Layout(["x", dtensor.UNSHARDED], mesh)
    x, y = (
        dtensor.relayout(
            dtensor.copy_to_mesh(
                np.full((count, floats), v, np.float32), dtensor.Layout.replicated(mesh, 2)
            ),
            layout,
        )
        for v in (1.0, 0.999)
    )

    def make(n: int) -> Callable[[], Any]:
        @tf.function
        def chain(x: Any, y: Any) -> Any:
            for _ in range(n):
                x = x * y  # a tensor, not a constant: Grappler cannot fold the chain
            return tf.reduce_sum(x[:, :1])

        return lambda: chain(x, y).numpy()

    # a small op costs microseconds: a longer chain, so that it stands out of the call's noise
    chain_length = CHAIN * (8 if floats < 1024 else 2)
    short, long = _timed(make(2)), _timed(make(2 + chain_length))
    return max(long - short, 0.0) / chain_length


def _all_reduce_costs(mesh: Any, axis: str, op_seconds: float) -> tuple[float, float]:
    """(seconds per all-reduce, bytes per second per device) over `axis` of `mesh`: chains of
    CHAIN dependent all-reduces of 16 floats and of BIG_FLOATS floats per device."""
    small = _all_reduce_seconds(mesh, axis, 16, op_seconds)
    big = _all_reduce_seconds(mesh, axis, BIG_FLOATS, op_seconds)
    group = mesh.dim_size(axis)
    moved = 2.0 * (group - 1) / group * BIG_FLOATS * 4  # a ring all-reduce's bytes per device
    return small, moved / max(big - small, 1e-9)


def _all_reduce_seconds(mesh: Any, axis: str, floats: int, op_seconds: float) -> float:
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    group = mesh.dim_size(axis)
    other = [a for a in mesh.dim_names if a != axis][0]
    shape = (group, mesh.dim_size(other), floats)
    x = dtensor.copy_to_mesh(np.ones(shape, np.float32), dtensor.Layout.replicated(mesh, 3))
    x = dtensor.relayout(x, dtensor.Layout([axis, other, dtensor.UNSHARDED], mesh))

    def make(n: int) -> Callable[[], Any]:
        @tf.function
        def chain(x: Any) -> Any:
            for _ in range(n):
                # sum over the axis' shards: one all-reduce; added back, so the next depends on it
                x = x + 1e-6 * tf.reduce_sum(x, axis=0, keepdims=True)
            return tf.reduce_sum(x[:1, :1, :1])

        return lambda: chain(x).numpy()

    short, long = _timed(make(2)), _timed(make(2 + CHAIN))
    return max(max(long - short, 0.0) / CHAIN - 2 * op_seconds, 0.0)


def _probe_xla() -> Rates:
    """The rates of one device running plain tensors compiled by XLA (no collectives)."""
    import numpy as np
    import tensorflow as tf

    x = tf.constant(np.ones((PROBE_ROWS, PROBE_WIDTH), np.float32))
    w_in, w_out = (
        tf.constant(np.full(shape, 1e-3, np.float32))
        for shape in ((PROBE_WIDTH, 4 * PROBE_WIDTH), (4 * PROBE_WIDTH, PROBE_WIDTH))
    )
    chain = tf.function(_mlp_chain, jit_compile=True)
    flop_rate = _mlp_flops(PROBE_ROWS) / _timed(lambda: chain(x, w_in, w_out).numpy())
    small = tf.constant(np.full((16, 16), 0.1, np.float32))

    def kernels(n: int) -> Callable[[], Any]:
        @tf.function(jit_compile=True)
        def chain(x: Any) -> Any:
            for _ in range(n):
                x = tf.matmul(x, small)  # a dot each: XLA fuses element-wise ops, not these
            return tf.reduce_sum(x)

        return lambda: chain(small).numpy()

    length = CHAIN * 8
    kernel_seconds = max(_timed(kernels(2 + length)) - _timed(kernels(2)), 0.0) / length
    # the mesh's size: activations of small models stay in the caches, as these do
    floats = STREAM_FLOATS
    big = tf.constant(np.ones((floats,), np.float32))

    @tf.function(jit_compile=True)
    def stream(x: Any, y: Any) -> Any:
        return x * y + 1.0  # one fused kernel: reads x and y, writes the result

    tiny = tf.constant(np.ones((16,), np.float32))
    # on a CPU the call returns once the result is written (no copy out: it stays a tensor)
    seconds = _timed(lambda: stream(big, big)) - _timed(lambda: stream(tiny, tiny))
    stream_rate = 2 * floats * 4 / max(seconds, 1e-9)  # as the mesh's: read and write
    return Rates(flop_rate, {}, {}, kernel_seconds, stream_rate)
