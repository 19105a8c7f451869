"""The step arithmetic of a run, pure (no TensorFlow, no session): the loop, the resume and
tests/test_resume_steps.py share it. A train.steps run is stretches of eval_every steps
(recipe._resolve: its epochs), stretch e holding the global steps e*eval_every+1 up to
(e+1)*eval_every or train.steps, whichever comes first.
"""

from __future__ import annotations

from dtcli.recipe import TrainConfig


def stretch_steps(train: TrainConfig, pass_steps: int, epoch: int) -> int:
    """Steps of epoch (stretch) `epoch` of a run whose pass over the data is `pass_steps`."""
    steps = min(pass_steps, train.steps_per_epoch) if train.steps_per_epoch else pass_steps
    if train.steps is not None:
        steps = min(steps, train.steps - epoch * steps)
    return steps


def resume_position(train: TrainConfig, step: int, epoch: int, batch: int) -> tuple[int, int]:
    """(epoch, batch) where a run resumed from a checkpoint at global step `step`, saved at
    (`epoch`, `batch`), goes on.

    An epochs run: where its checkpoint says. A train.steps run: where `step` (the optimizer's
    count) falls among the stretches of the eval_every it resumes with, which may differ from
    the eval_every the checkpoint counted its epoch in. Its data then reads permutation `epoch`
    from `batch`, as a run trained with this eval_every from its start would have: a pure
    function of (seed, step, eval_every), though not the order the checkpoint's run would have
    read next when eval_every changed."""
    if train.steps is None or not train.steps_per_epoch:
        return epoch, batch
    return divmod(step, train.steps_per_epoch)


def finished(train: TrainConfig, step: int, epoch: int) -> bool:
    """Whether a checkpoint at global step `step` (epoch `epoch` done) leaves nothing to train:
    a train.steps run counts steps, an epochs run epochs."""
    if train.steps is not None:
        return step >= train.steps
    return epoch >= train.epochs
