"""A checkpoint restored into a session of its recipe on the target mesh, without data: the
model and the run's tokenizer, as generate and score run them."""

from __future__ import annotations

import sys
from pathlib import Path

from dtcli import checkpoint as ckpt_lib
from dtcli import rundir, tfruntime
from dtcli.recipe import Recipe
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
    ckpt = ckpt_lib.Checkpointer(held.parent, {"model": session.model.module}, keep=1)
    ckpt.restore(held, session.model.weights, partial=True)
    return session
