"""`dtcli doctor`: check the installation a user is about to trust.

Versions, devices and the environment flags dtcli relies on, then two numerical probes that run
the same few steps on a 1-device mesh and on a multi-device mesh in one process and compare the
weights: DTensor's known failure modes (DTENSOR_NOTES: optimizers without `mesh=`, packing on
2-D meshes, a collective next to a write that the all-reduce combining pass reorders) raise no
error; they only give other numbers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dtcli import cpuinfo, tfruntime
from dtcli import devices as devices_lib
from dtcli import progress as progress_lib
from dtcli.errors import UsageError
from dtcli.mesh import mesh_text
from dtcli.tables import Column, print_table

# Largest relative weight difference between the 1-device and the multi-device run that passes.
TOLERANCE = 1e-5
PROBE_STEPS = 5


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    warn: bool = False  # not a failure, but worth reading

    @property
    def status(self) -> str:
        return "ok" if self.ok and not self.warn else ("warn" if self.ok else "FAIL")


def _versions() -> Check:
    import tensorflow as tf
    import tf_keras

    tf_minor = ".".join(tf.__version__.split(".")[:2])
    keras_minor = ".".join(tf_keras.__version__.split(".")[:2])
    detail = f"tensorflow {tf.__version__}, tf-keras {tf_keras.__version__}"
    if tf_minor != keras_minor:
        return Check("versions", False, detail + ": minor versions differ; pin both to one minor")
    return Check("versions", True, detail)


def _cpu() -> Check:
    """The CPU, and what `train.precision: bf16` does on it (mesh.compiles_with_xla decides)."""
    name = cpuinfo.model_name() or "unknown model"
    if not cpuinfo.lines():
        return Check("cpu", True, f"{name} (no {cpuinfo.CPUINFO}: bf16 units unknown)")
    units = cpuinfo.bf16_units()
    if units:
        return Check(
            "cpu",
            True,
            f"{name}; bf16 matmul units ({', '.join(units)}): with train.compile: auto (the "
            "default) a one-device run with train.precision: bf16 runs its steps on "
            "TensorFlow's oneDNN kernels, which use them (XLA:CPU would compute its bf16 dots "
            "in float32); a mesh of several devices runs on those kernels anyway (DTensor)",
        )
    return Check(
        "cpu",
        True,
        f"{name}; no bf16 matmul units ({', '.join(cpuinfo.BF16_FLAGS)}): bf16 matmuls run "
        "through float32 here, so train.precision: bf16 brings no speed-up",
    )


def _env_flags() -> list[Check]:
    combine = os.environ.get("DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION")
    expansion = os.environ.get("DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION")
    checks = [
        Check(
            "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION",
            True,
            "'0' (all-reduce combining off: right, one all-reduce per gradient)"
            if combine == "0"
            else f"{combine!r} (all-reduce combining on; dtcli's steps keep collectives out of "
            "their updates, where the pass would reorder writes and reads)",
        ),
        Check(
            "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION",
            expansion != "1",
            "not set" if expansion is None else repr(expansion),
        )
        if expansion != "1"
        else Check(
            "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION",
            False,
            "'1': gives wrong numbers even on one device; unset it",
        ),
    ]
    checks.append(_xla_cache())
    checks.append(_compile_choices())
    nccl = os.environ.get("DTENSOR_GPU_USE_NCCL_COMMUNICATION")
    checks.append(
        Check(
            "DTENSOR_GPU_USE_NCCL_COMMUNICATION",
            True,
            f"{nccl!r} (GPU collectives: 1 uses NCCL, needs one logical device per GPU)"
            if nccl
            else "not set (GPU collectives without NCCL; set 1 on GPU hosts)",
        )
    )
    return checks


def _xla_cache() -> Check:
    """Where a one-device run keeps XLA's compiled steps (tfruntime), and what is there."""
    name = tfruntime.XLA_CACHE_ENV
    flags = os.environ.get("TF_XLA_FLAGS", "")
    folder = tfruntime.xla_cache_dir(os.environ)
    if folder is None:
        return Check(name, True, "off (every one-device run compiles its steps anew)")
    if f"{tfruntime.XLA_CACHE_FLAG}={folder}" not in flags:
        if tfruntime.XLA_CACHE_FLAG in flags:
            return Check(name, True, "not used: TF_XLA_FLAGS names its own folder")
        why = tfruntime.xla_cache_problem(folder)
        if why is None:
            return Check(name, True, f"not used: {folder}: set after dtcli started", warn=True)
        named = tfruntime.xla_cache_named(os.environ)
        if named:  # a folder the user named: every one-device run refuses it (exit 2)
            return Check(
                name,
                False,
                f"{named}={os.environ[named]}: cannot keep XLA's compiled steps in "
                f"{folder} ({why}); name a folder dtcli can write to, or set {name}=off",
            )
        return Check(name, True, f"not used: {folder}: {why}", warn=True)
    # What a run does first: make the folder (a path its parent's permissions allow may still
    # fail, /proc/x say, or any path as root) and keep it under its limit.
    try:
        opened = tfruntime.open_xla_cache(os.environ)
    except UsageError as exc:  # a folder the user named: every one-device run refuses it
        return Check(name, False, str(exc))
    if opened is None:
        return Check(name, True, f"not used: {folder} cannot be made", warn=True)
    entries = list(folder.glob("*.pb"))
    size = sum(p.stat().st_size for p in entries) / 2**20
    return Check(
        name,
        True,
        f"{folder}: {len(entries)} compiled step{'' if len(entries) == 1 else 's'}, "
        f"{size:.0f} MB (a one-device run on the CPU loads its "
        f"steps from here instead of compiling them; GPU steps are not kept; at most "
        f"{tfruntime.XLA_CACHE_LIMIT / 2**30:.0f} GB, '{name}=off' turns it off)",
    )


def _compile_choices() -> Check:
    """What `train.compile: auto` measured and kept for this CPU (session/choice.py)."""
    from dtcli.session import choice

    path, host = choice.choices_path(), tfruntime.host_key(os.environ)
    mine = [e for k, e in choice.read_choices(path).items() if k.startswith(f"{host}/")]
    shown = "; ".join(
        f"{e.get('compiler')} ({e.get('xla_ms')} ms a step with XLA, {e.get('graph_ms')} "
        f"without, {float(e.get('flops') or 0) / 1e9:.0f} GFLOP a step)"
        for e in mine
    )
    return Check("compile choices", True, f"{len(mine)} kept for this CPU in {path}: {shown}")


def _devices(spec: str) -> tuple[Check, devices_lib.Devices]:
    import tensorflow as tf

    devices = devices_lib.configure(spec, None, "--devices")
    physical = {kind: len(tf.config.list_physical_devices(kind)) for kind in ("CPU", "GPU", "TPU")}
    seen = ", ".join(f"{n} {k}" for k, n in physical.items() if n)
    detail = f"physical: {seen}; dtcli uses {devices.text}"
    if devices.count < 2:
        detail += " (one device: no multi-device probe)"
    return Check("devices", True, detail, warn=devices.count < 2), devices


def _max_rel(a: dict, b: dict) -> float:
    import numpy as np

    return max(
        float(np.max(np.abs(a[k] - b[k])) / max(float(np.max(np.abs(b[k]))), 1e-12)) for k in b
    )


def _runtime_probe(devices: devices_lib.Devices) -> Check:
    """A plain DTensor step, independent of dtcli's: gradients summed over the batch axis and
    a momentum update, fused in one function. Each variable is written once, from values
    computed before any write (a read after a write would be reordered by the all-reduce
    combining pass, which dtcli leaves on: DTENSOR_NOTES)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from dtcli.mesh import build_mesh

    def run(count: int) -> dict:
        mesh = build_mesh({"batch": count}, devices.device_type, count=count)
        rep = lambda rank: dtensor.Layout.replicated(mesh, rank)  # noqa: E731
        init = np.random.default_rng(1)
        shapes = [(32, 16), (16,), (16, 4), (4,)]
        weights = [
            dtensor.DVariable(
                dtensor.copy_to_mesh(
                    tf.constant(0.3 * init.standard_normal(s), tf.float32), rep(len(s))
                )
            )
            for s in shapes
        ]
        moments = [
            dtensor.DVariable(dtensor.call_with_layout(tf.zeros, rep(len(s)), shape=s))
            for s in shapes
        ]
        x_layout = dtensor.Layout(["batch", dtensor.UNSHARDED], mesh)

        @tf.function
        def step(x: Any) -> Any:
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x, weights[0]) + weights[1])
                loss = tf.reduce_mean(tf.square(tf.matmul(h, weights[2]) + weights[3] - 1.0))
            for g, w, m in zip(tape.gradient(loss, weights), weights, moments):
                moment = 0.9 * m + g
                m.assign(moment)
                w.assign_sub(0.1 * moment)
            return loss

        data = np.random.default_rng(0)
        for _ in range(PROBE_STEPS * 4):
            parts = np.split(data.standard_normal((64, 32)).astype(np.float32), count)
            locations = mesh.local_device_locations()
            step(dtensor.pack([parts[loc["batch"]] for loc in locations], x_layout))
        return {
            i: dtensor.unpack(dtensor.relayout(w.read_value(), rep(len(w.shape))))[0].numpy()
            for i, w in enumerate(weights)
        }

    diff = _max_rel(run(devices.count), run(1))
    return Check(
        "probe: DTensor runtime (fused step)",
        diff <= TOLERANCE,
        f"1 vs {devices.count} devices, {PROBE_STEPS * 4} steps: max relative weight "
        f"difference {diff:.1e} (limit {TOLERANCE:.0e})",
    )


def _probe_recipe(api: str, optimizer: str, devices: devices_lib.Devices) -> Any:
    from dtcli import recipe as recipe_lib

    model = (
        {
            "api": "keras",
            "layers": [{"Dense": {"units": 32, "activation": "relu"}}, {"Dense": {"units": 10}}],
        }
        if api == "keras"
        else {"api": "core", "hidden": [32]}
    )
    return recipe_lib.from_mapping(
        {
            "name": "doctor",
            "devices": devices.text,
            "mesh": {"batch": -1, "model": 1},
            "layouts": {
                # dense_0's bias stays replicated while its kernel is split: its gradient is
                # then gathered, the collective the combining pass must find outside the
                # update (tfruntime).
                "rules": {
                    r"dense_0\.kernel": ["unsharded", "model"],
                    r"dense_1\.kernel": ["model", "unsharded"],
                }
            },
            "model": model,
            "data": {
                "source": "synthetic",
                "shape": [16],
                "classes": 10,
                "count": 256,
                "eval_count": 32,
                "batch_size": 32,
            },
            "optimizer": {"name": optimizer, "learning_rate": 0.01, "momentum": 0.9},
        }
    )


@contextlib.contextmanager
def _doing(console: Any, what: str) -> Iterator[None]:
    """`what` doctor does next (a probe compiles for seconds): at a terminal a spinner that goes
    when it is done (the table follows: no line is left above it); elsewhere a line as it
    starts, and again every BEAT_EVERY seconds it lasts. No console: silent (--no-progress)."""
    if console is None:
        yield
        return
    if console.is_terminal:
        with console.status(f"doctor: {what}...", spinner="line"):
            yield
        return
    console.print(f"doctor: {what}...", markup=False, highlight=False)
    with progress_lib.Heartbeat(console, f"doctor: {what}") as beat:
        beat.heard()  # the line above: the first beat comes BEAT_EVERY seconds after it
        yield


def _dtcli_probe(devices: devices_lib.Devices, console: Any = None) -> list[Check]:
    """dtcli's own train step, per API and optimizer: 1 device against the 2-D mesh."""
    from dtcli import models
    from dtcli import recipe as recipe_lib
    from dtcli import session as session_lib

    count = devices.count
    model_axis = 2 if count % 2 == 0 else 1
    multi = {"batch": count // model_axis, "model": model_axis}
    checks = []
    for api in ("keras", "core"):
        for optimizer in ("sgd", "adam", "adamw"):
            recipe = _probe_recipe(api, optimizer, devices)
            results = {}
            mesh = mesh_text(multi)
            with _doing(console, f"probe: dtcli {api} + {optimizer} (1 device vs {mesh})"):
                for axes, use in (({"batch": 1, "model": 1}, 1), (multi, count)):
                    session = session_lib.prepare(
                        recipe_lib.replace(recipe, mesh=axes), use_devices=use
                    )
                    start = models.host_weights(session.model, session.mesh)
                    session_lib.run_steps(session, PROBE_STEPS)
                    results[use] = (models.host_weights(session.model, session.mesh), start)
            diff = _max_rel(results[count][0], results[1][0])
            # A step that changed nothing would be "mesh invariant" too.
            moved = _max_rel(results[1][0], results[1][1]) > 100 * TOLERANCE
            checks.append(
                Check(
                    f"probe: dtcli {api} + {optimizer}",
                    diff <= TOLERANCE and moved,
                    f"1 device vs {mesh}, {PROBE_STEPS} steps: max relative weight difference "
                    f"{diff:.1e} (limit {TOLERANCE:.0e})"
                    + ("" if moved else "; but the weights did not move"),
                )
            )
    return checks


def default_devices() -> str:
    """GPUs when there are any, else 8 virtual CPUs (enough for a 2-D probe mesh)."""
    tf = tfruntime.import_tensorflow()
    with tfruntime.quiet_native_logs():  # "no CUDA driver" is not news on a CPU machine
        return "gpu" if tf.config.list_physical_devices("GPU") else "cpu:8"


def run(spec: str | None = None, probe: bool = True, console: Any = None) -> list[Check]:
    """Every check, in order; the probes only when there are several devices. `console`: where
    doctor says what it does as it goes (the probes take a minute on a CPU)."""
    if spec is not None:  # a mistake in --devices is named before TensorFlow's start, as train's
        devices_lib.parse(spec, "--devices")
    with _doing(console, "starting TensorFlow"):
        tfruntime.import_tensorflow()
    checks = [_versions(), _cpu(), *_env_flags()]
    device_check, devices = _devices(default_devices() if spec is None else spec)
    checks.append(device_check)
    if probe and devices.count > 1:
        with _doing(console, f"probe: DTensor runtime (1 vs {devices.count} devices)"):
            runtime = _runtime_probe(devices)
        checks.append(runtime)
        if runtime.ok:
            try:
                checks += _dtcli_probe(devices, console)
            except UsageError as exc:  # the setting a check above names (DTCLI_XLA_CACHE, say)
                checks.append(Check("probe: dtcli train steps", False, f"not run: {exc}"))
        else:  # DTensor's own numbers are wrong here: dtcli's, built on them, would say nothing
            checks.append(
                Check(
                    "probe: dtcli train steps",
                    False,
                    "not run: DTensor's own fused step gives wrong numbers here (above); fix "
                    "that first",
                )
            )
    return checks


# DTENSOR_* names are what a user sets: never cut (broken after a '_' only where one is wider
# than the terminal). The detail is prose and wraps.
COLUMNS = (
    Column("check", "name"),
    Column("status", styles={"ok": "green", "warn": "yellow", "FAIL": "bold red"}),
    Column("detail", "prose"),
)


def render(checks: list[Check], console: Any) -> None:
    rows = [(c.name, c.status, c.detail) for c in checks]
    print_table(console, COLUMNS, rows, title="dtcli doctor")
