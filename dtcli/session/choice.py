"""`train.compile: auto` on one CPU device in float32: XLA's fused steps, or TensorFlow's own
kernels without XLA (`graph`), whichever runs this model's training step faster on this CPU.

Which wins depends on the CPU and the shapes. XLA fuses the elementwise work, the optimizer and
the loss and pays no per-op dispatch, so it wins where a step is small (tiny_gpt: 128 wide); at
GPT-2-small's shape the matmuls are the step, and TensorFlow's oneDNN kernels run them faster
than XLA:CPU's dots on an AVX-512/AMX Xeon (GPT-2-small, 2 cores: 1,264-1,308 ms a step against
1,344-1,355). So `auto` measures both once per CPU and shape, on the run's own model and first
batch, and keeps the answer in dtcli's cache folder (CHOICES_FILE, keyed as XLA's compiled steps
are, by TensorFlow's version, the CPU, XLA_FLAGS and the cores, and by the recipe's model and
step shape); later runs, `eval` and `generate` of the same shape read it. Only a transformer
whose training step holds at least PROBE_FLOPS is measured: below that XLA is kept without
measuring (the step is dispatch, not matmuls); `graph` must beat XLA by GRAPH_MARGIN. The
weights and optimizer state are restored after the probe, so the run's numbers are those of the
chosen path alone; the probe's seconds count into the first step's compile time.
`train.compile: xla` or `graph` skips all of this.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from dtcli import mesh as mesh_lib
from dtcli import models, tfruntime
from dtcli.steps import make_steps, train_block

CHOICES_FILE = "compile-choices.json"
# Training FLOPs a step (the model's, nanoGPT's formula) from which `auto` measures both paths:
# tiny_gpt's 3.8 G stays on XLA unmeasured; its 512-wide variant (58 G) and GPT-2-small (268 G)
# are measured.
PROBE_FLOPS = 2e10
# Timed one-step calls of each path, alternated, after each path's first (its compile).
PROBE_ROUNDS = 3
# `graph` is kept only where it beats XLA by this fraction: closer is a tie (a re-measure could
# flip it), and XLA, `auto`'s path before any measuring, stays.
GRAPH_MARGIN = 0.03


def step_flops(session: Any) -> float | None:
    """Training FLOPs of one optimizer step of dtcli's transformer (None for other models)."""
    cfg = session.recipe.model.transformer
    if cfg is None:
        return None
    context = models.transformer.window(session.data.input_shape)
    per_token = models.transformer.flops_per_token(cfg, session.data.num_classes, context)
    return per_token * context * session.recipe.data.batch_size


def measured(session: Any) -> bool:
    """Whether `auto` chooses this session's compiler by measuring (see the module's doc)."""
    recipe = session.recipe
    flops = step_flops(session)
    return (
        recipe.train.compile == "auto"
        and session.compiler == mesh_lib.XLA
        and session.devices.device_type == "CPU"
        and session.cluster is None
        and flops is not None
        and flops >= PROBE_FLOPS
    )


def shape_key(recipe: Any) -> str:
    """What of the recipe decides a step's shapes and work: the model, LoRA, the batch, the
    optimizer's kind and the step's options."""
    t, o = recipe.train, recipe.optimizer
    parts = {
        "model": dataclasses.asdict(recipe.model),
        "lora": None if recipe.lora is None else dataclasses.asdict(recipe.lora),
        "batch": recipe.data.batch_size,
        "train": [t.steps_per_call, t.accumulate, t.precision, getattr(t, "remat", None)],
        "optimizer": [o.name, o.clip_norm is not None, bool(getattr(o, "weight_decay", 0))],
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def choices_path() -> Path:
    return tfruntime.cache_root(os.environ) / CHOICES_FILE


def _entry_key(recipe: Any) -> str:
    return f"{tfruntime.host_key(os.environ)}/{shape_key(recipe)}"


def read_choices(path: Path | None = None) -> dict[str, dict]:
    """Every kept choice (an unreadable or damaged file reads as none)."""
    try:
        data = json.loads((path or choices_path()).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def settle(session: Any, probe: bool) -> None:
    """Set session.compiler for `auto` (see the module's doc): the kept choice for this CPU and
    shape, else, with `probe` (a training session), measured now and kept."""
    if not measured(session):
        return
    key = _entry_key(session.recipe)
    entry = read_choices().get(key)
    if entry is None and probe:
        started = time.perf_counter()
        entry = _probe(session)
        session.probe_seconds = time.perf_counter() - started
        _keep(key, entry)
    if isinstance(entry, dict) and entry.get("compiler") in mesh_lib.PLAIN:
        session.choice = entry
        use(session, entry["compiler"])


def use(session: Any, compiler: str) -> None:
    """Run the session's steps with `compiler` (xla or graph; both on plain variables)."""
    session.compiler = compiler
    session.optimizer.fused = compiler == mesh_lib.GRAPH


def _probe(session: Any) -> dict[str, Any]:
    """Both paths timed on one step of the first batch, alternated, the state restored after."""
    import tensorflow as tf

    saved = [(v, tf.identity(v)) for v in _state(session)]
    batch = list(itertools.islice(session.train_feed.epoch(0, 0, 1), 1))
    calls = {}
    for compiler in mesh_lib.PLAIN:
        use(session, compiler)
        calls[compiler] = make_steps(session)[0]
    times: dict[str, list[float]] = {c: [] for c in calls}
    try:
        for round_ in range(PROBE_ROUNDS + 1):
            for compiler, call in calls.items():
                use(session, compiler)
                started = time.perf_counter()
                train_block(session, call, batch)
                if round_:  # the first call of each traces and compiles it
                    times[compiler].append(time.perf_counter() - started)
    finally:
        for variable, value in saved:
            variable.assign(value)
    ms = {c: 1000 * statistics.median(t) for c, t in times.items()}
    faster = ms[mesh_lib.GRAPH] < (1 - GRAPH_MARGIN) * ms[mesh_lib.XLA]
    return {
        "compiler": mesh_lib.GRAPH if faster else mesh_lib.XLA,
        **{f"{c}_ms": round(v, 1) for c, v in ms.items()},
        "flops": step_flops(session),
        "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _state(session: Any) -> list:
    """Every variable a step writes: the model's and the optimizer's (slots, step count)."""
    found: dict[int, Any] = {}
    optimizer = session.optimizer.trackable
    extra = optimizer.variables
    for variable in [*session.model.module.variables, *(extra() if callable(extra) else extra)]:
        found.setdefault(id(variable), variable)
    return list(found.values())


def _keep(key: str, entry: dict[str, Any]) -> None:
    """Add `entry` to the choices file (written whole, then renamed into place); a cache that
    cannot be written only costs the next run another probe."""
    path = choices_path()
    choices = read_choices(path)
    choices[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(choices, indent=1, sort_keys=True) + "\n")
        partial.replace(path)
    except OSError:
        pass
