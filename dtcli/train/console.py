"""What `dtcli train` prints: the run header, one line per epoch, the closing summary, and the
command that resumes a stopped run."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import layout as layout_lib
from dtcli import mesh as mesh_lib
from dtcli import progress as progress_lib
from dtcli.recipe import TrainConfig
from dtcli.session import Session


def header(console: Any, session: Session, run_dir: Path) -> None:
    """The run's first line: model, weights, mesh, devices, data, run directory; then a warning
    for each layout rule that does nothing."""
    from rich.markup import escape

    r = session.recipe
    sharded = sum(1 for p in session.plans if layout_lib.is_sharded(p, session.axes))
    params = parameter_count(session.plans)
    d = session.devices
    over = d.text if d.clients == 1 else f"{d.text} ({d.clients} clients x {d.local_count})"
    frozen = sum(math.prod(p.weight.shape) for p in session.plans if not p.weight.trainable)
    if r.lora is not None:  # the adapters train, the base is frozen
        params_text = f"{parameters_text(params)} trainable (LoRA), {frozen:,} frozen,"
    else:
        params_text = parameters_text(params)
    console.print(
        f"[bold]{r.name}[/]: {r.model.api} model, {params_text} "
        f"in {len(session.plans)} weights ({sharded} sharded) "
        f"on mesh {mesh_lib.mesh_text(session.axes)} over {over}"
        f"{steps_note(session)}; "
        f"data: {session.data.description}; run directory: {run_dir}",
        highlight=False,
    )
    for warning in layout_lib.layout_warnings(
        r.layouts.rules, session.plans, session.axes, r.layouts.data_axis
    ):
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)


def steps_note(session: Session) -> str:
    """How a one-device run's steps run, where the header says: XLA, or TensorFlow's own
    kernels (train.compile graph, or `auto` for bf16 on a CPU that takes it)."""
    measured = ""
    if session.choice is not None:  # auto's choice (session/choice.py)
        c = session.choice
        other = "graph" if session.xla else "xla"
        when = "measured now" if session.probe_seconds else f"measured {c.get('measured', '?')}"
        measured = (
            f": {c.get(f'{session.compiler}_ms')} ms a step against "
            f"{c.get(f'{other}_ms')} {'without' if session.xla else 'with'} XLA here, {when}, "
            "kept for this CPU and shape"
        )
    if session.xla:
        return f" (steps compiled by XLA{measured})"
    if session.compiler != mesh_lib.GRAPH:
        return ""
    if session.recipe.train.compile == "auto" and not measured:
        return " (bf16 steps on TensorFlow's oneDNN kernels: XLA:CPU computes bf16 in float32)"
    return f" (steps on TensorFlow's own kernels, no XLA{measured})"


def parameter_count(plans: list[Any]) -> int:
    """The model's trainable parameters: the elements of its trainable weights."""
    return sum(math.prod(p.weight.shape) for p in plans if p.weight.trainable)


def parameters_text(count: int) -> str:
    """A parameter count as people say it: "0.83 M parameters", "1.2 B", "7,850"."""
    if count >= 10**9:
        return f"{count / 1e9:.2f} B parameters"
    if count >= 10**5:
        return f"{count / 1e6:.2f} M parameters"
    return f"{count:,} parameter{'s' * (count != 1)}"


def epoch_line(record: dict[str, Any], cfg: TrainConfig) -> str:
    """An epoch's line: its losses and accuracies, throughput and (a language model's) MFU."""
    compiling = ""
    if "compile_seconds" in record:  # the rate stays honest; this says why it is low here
        compiling = f" (incl. {record['compile_seconds']:.1f} s compiling the step)"
    epoch = record["epoch"]
    if "eval_perplexity" in record:  # a language model
        where = f"step {record['step']}/{cfg.steps}" if cfg.steps else f"epoch {epoch}/{cfg.epochs}"
        flops = record.get("flops_per_sec_per_device")
        mfu = f", MFU {record['mfu']:.1%}" if "mfu" in record else ""
        per_device = f", {flops / 1e9:,.1f} GFLOP/s per device{mfu}" if flops else ""
        bpb = f" bpb {record['eval_bpb']:.4f}" if "eval_bpb" in record else ""
        return (
            f"{where} loss {record['train_loss']:.4f} | eval loss {record['eval_loss']:.4f}"
            f"{bpb} ppl {record['eval_perplexity']:.2f} acc {record['eval_accuracy']:.4f}"
            f"{task_metric(record, cfg)} | "
            f"{record['tokens_per_sec']:,.0f} tok/s{per_device}{compiling}"
        )
    return (
        f"epoch {epoch}/{cfg.epochs} loss {record['train_loss']:.4f} "
        f"acc {record['train_accuracy']:.4f} | eval loss {record['eval_loss']:.4f} "
        f"acc {record['eval_accuracy']:.4f} | {record['examples_per_sec']:,.0f} ex/s{compiling}"
    )


def task_metric(record: dict[str, Any], cfg: TrainConfig) -> str:
    """train.eval_tasks' first task's first metric, as ' | TASK/METRIC VALUE' (the rest are in
    metrics.jsonl); '' without tasks."""
    if cfg.eval_tasks is None:
        return ""
    first = cfg.eval_tasks.tasks[0] + "/"
    for key, value in record.items():
        if key.startswith(first) and "_stderr" not in key and isinstance(value, (int, float)):
            return f" | {key} {value:.4f}" if abs(value) < 100 else f" | {key} {value:,.1f}"
    return ""


def summary(
    console: Any, history: list[dict[str, Any]], first_epoch: int, checkpoints: list[Path]
) -> None:
    """One closing line with what the epoch lines did not say (they said the rest): the best
    evaluation, and whether a checkpoint of it is still there (`checkpoints`: the complete ones;
    train.keep removes old ones, train.checkpoint_every skips some)."""
    if not history:
        return
    seconds = sum(r["seconds"] for r in history[first_epoch:])
    last = history[-1]
    if "eval_perplexity" in last:
        best = min(history, key=lambda r: r["eval_loss"])
        done = (
            f"done: {last['step']} steps ({seconds:.1f} s training in this process); eval loss "
            f"{last['eval_loss']:.4f} (perplexity {last['eval_perplexity']:.2f}); best eval loss "
            f"{best['eval_loss']:.4f} at step {best['step']}"
        )
    else:
        best = max(history, key=lambda r: r["eval_accuracy"])
        done = (
            f"done: {last['epoch']} epoch{'s' * (last['epoch'] != 1)}, {last['step']} steps "
            f"({seconds:.1f} s training in this process); best eval acc "
            f"{best['eval_accuracy']:.4f} in epoch {best['epoch']} (step {best['step']})"
        )
    console.print(f"{done}, {_kept(best['step'], checkpoints)}", highlight=False)


def _kept(step: int, checkpoints: list[Path]) -> str:
    name = f"ckpt-{step:08d}"
    if any(c.name == name for c in checkpoints):  # a local or a remote (storage) path
        return f"its checkpoint {name} is kept"
    return "no checkpoint of it is kept (train.keep and train.checkpoint_every decide which are)"


def nothing_to_train(
    console: Any, cfg: TrainConfig, epochs: int, steps: int, batch: int = 0
) -> None:
    """A resume whose checkpoint (`epochs` done and `batch` batches of the next, at step
    `steps`) is already at the end."""
    if cfg.steps is not None:
        said = f"{steps} steps and train.steps is {cfg.steps}; train.steps is the total"
    else:
        # A run stopped inside an epoch past the new end has trained part of one more.
        more = f" and {batch} batches of epoch {epochs + 1} (step {steps})" if batch else ""
        said = f"{epochs} epochs{more} and train.epochs is {cfg.epochs}; --epochs is the total"
    console.print(f"[yellow]nothing to train:[/] the run has {said}, give more", highlight=False)


def profile_report(console: Any, profiler: Any, tensorboard: Path, step: int) -> None:
    """Where the profiler trace went, or that no step of --profile ran."""
    if profiler.traced is not None:
        first, last = profiler.traced
        console.print(
            f"profile: steps {first}-{last} traced into {tensorboard} "
            "(TensorBoard's Profile tab, with tensorboard-plugin-profile installed)",
            highlight=False,
        )
        return
    console.print(
        f"[yellow]warning:[/] --profile {profiler.start}:{profiler.stop}: no step of it ran "
        f"(this session trained up to step {step}); no trace was written",
        highlight=False,
    )


def resume_command(run_dir: Path | None) -> str:
    """The command that continues a stopped run (a launched client's: `dtcli launch`)."""
    if progress_lib.launched() and os.environ.get(cluster_lib.ENV_JOBS):
        clients = len(os.environ[cluster_lib.ENV_JOBS].split(","))
        return f"dtcli launch --clients {clients} --resume {run_dir}"
    return f"dtcli train --resume {run_dir}"
