"""What the steps read of a session (`Engine`), what a train call returns per step, and how many
steps an epoch and a call hold."""

from __future__ import annotations

from typing import Any, Protocol

from dtcli import models
from dtcli import pipeline as pipeline_lib
from dtcli.recipe import Recipe
from dtcli.stretches import stretch_steps


class Engine(Protocol):
    """What the steps read of a session.Session (a Protocol: dtcli.session imports this package)."""

    recipe: Recipe
    model: models.Built
    optimizer: Any
    packer: pipeline_lib.Packer
    train_feed: pipeline_lib.Feed
    placed: tuple[Any, Any] | None
    cluster: Any

    @property
    def xla(self) -> bool:
        """Whether the steps compile with XLA (plain variables, no mesh)."""
        ...


# What the train call returns for each step, read back once per call (the last two only
# where the recipe schedules or clips, see make_steps).
PER_STEP = ("loss", "correct", "count", "grad_norm", "learning_rate")


def steps_per_call(session: Engine) -> int:
    return session.recipe.train.steps_per_call


def epoch_steps(session: Engine, epoch: int = 0) -> int:
    """Steps of epoch `epoch`: a pass over the data, or train.steps_per_epoch; a train.steps
    run's last stretch may be shorter."""
    return stretch_steps(session.recipe.train, session.train_feed.steps, epoch)
