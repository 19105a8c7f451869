"""A checkpoint restored into a session of its recipe on the target mesh, without data: the
model and the run's tokenizer, as generate and score run them; a checkpoint's model restored into
a session (`restore_model`: eval too)."""

from __future__ import annotations

import sys
from pathlib import Path

from dtcli import checkpoint as ckpt_lib
from dtcli import rundir, tfruntime
from dtcli.recipe import Recipe
from dtcli.session import finetune
from dtcli.session.build import Session, prepare


def restored_session(
    found: Path,
    held: Path,
    recipe: Recipe,
    command: str,
    use_devices: int | None,
    devices_key: str,
) -> Session:
    """A session of `recipe` for `command` (recipe.COMMANDS) with no data read (only its shape
    and the run's tokenizer, kept beside the checkpoint `found`), the weights of the checkpoint
    `held` (read through it: checkpoint.held) restored into its model. A warning on stderr for
    each mesh axis no layout rule splits along (as `train` and `plan` say it: it only copies
    the work)."""
    tfruntime.import_tensorflow()  # without its native start-up notices
    from dtcli.layout import layout_warnings

    session = prepare(
        recipe,
        splits=(),
        use_devices=use_devices,
        devices_key=devices_key,
        tokenizer_file=rundir.tokenizer_file(found),
        command=command,
    )
    rules = recipe.layouts.rules
    for warning in layout_warnings(rules, session.plans, session.axes, recipe.layouts.data_axis):
        print(f"warning: {warning}", file=sys.stderr, flush=True)
    restore_model(session, held)
    return session


def restore_model(session: Session, held: Path) -> None:
    """The model's weights of the checkpoint `held` restored into `session`, without its
    optimizer; a LoRA checkpoint's adapters after the recipe's base, once the base is checked
    to be the checkpoint's (session.finetune)."""
    if session.recipe.lora is not None:
        finetune.load_base(session, ckpt_lib.read_meta(held), held)
    ckpt = ckpt_lib.Checkpointer(held.parent, session.model.checkpointed(), keep=1)
    ckpt.restore(held, session.model.weights, partial=True)
