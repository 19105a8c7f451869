"""The compiled steps: K training steps per `tf.function` call, and the eval step.

`make_steps` builds them from a session (session.Session: the model, optimizer and packer on the
mesh); `train_block` runs one block of at most K batches through the train call and reads its
per-step results back. Loss is the mean over the real examples of the global batch plus
regularization, so one recipe gives the same numbers on any mesh. With train.accumulate N each
step runs its batch as N micro-batches and applies their summed gradient once: the same numbers
as the whole batch in one.

    engine.py    what the steps read of a session, and the step counts of an epoch and a call
    call.py      the K-step train call and the eval step compiled, and a block run through it
    lowering.py  a step's tf.function; on a mesh one make_steps' steps hold their lowering
    step.py      one optimizer step traced: forward, loss sums, gradients (accumulated), update
    batch.py     a step's batch taken from a block on the mesh, or from a split on the devices
"""

from dtcli.steps.call import make_steps, train_block, xla_refusal
from dtcli.steps.engine import PER_STEP, Engine, epoch_steps, steps_per_call

__all__ = [
    "PER_STEP",
    "Engine",
    "epoch_steps",
    "make_steps",
    "steps_per_call",
    "train_block",
    "xla_refusal",
]
