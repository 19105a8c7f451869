"""The engine every command builds on: a recipe built on its mesh, evaluation, the epoch loop.

`prepare` configures the devices, loads the data and builds the model and optimizer with their
layouts; steps.make_steps gives the compiled train and eval steps, both of (batch) -> sums over
the global batch; `run_epoch` trains through one epoch in data order. Loss is the mean over the
real examples of the global batch plus regularization, so one recipe gives the same numbers on
any mesh. train (the loop), eval, doctor and bench import this package; it imports none of them.

    build.py       `Session` and `prepare`: the recipe on its devices and mesh, its feeds
    epoch.py       training in data order: `run_epoch`, `run_steps`, `EpochState`, where a resume
                   goes on
    evaluation.py  `evaluate`: loss and accuracy (perplexity, bits per byte) over a split
    restore.py     `restored_session`: a checkpoint restored on a mesh without data (generate,
                   score); `restore_model`: a checkpoint's model into a session (eval too)
    choice.py      `auto` on one CPU device: XLA or TensorFlow's own kernels, measured once per
                   CPU and shape and kept
    finetune.py    a fine-tuning run's base: its weights loaded, a LoRA checkpoint's base
                   named by its files' digests and checked before the adapters are restored
"""

from dtcli.session.build import (
    Session,
    eval_feed,
    flops_per_token,
    prepare,
)
from dtcli.session.epoch import EpochState, NonFiniteLoss, resume_state, run_epoch, run_steps
from dtcli.session.evaluation import evaluate, pack_all
from dtcli.session.restore import restore_model

__all__ = [
    "EpochState",
    "NonFiniteLoss",
    "Session",
    "eval_feed",
    "evaluate",
    "flops_per_token",
    "pack_all",
    "prepare",
    "restore_model",
    "resume_state",
    "run_epoch",
    "run_steps",
]
