"""The batch sizes against the mesh's data axis, for the command that runs the recipe.

A command checks only the batch keys it steps through: `train` both batches and train.accumulate's
micro-batches, `eval` its evaluation batch (data.eval_batch_size, else data.batch_size), and
`generate`, `score` and `export` none (generate pads its prompts to the data axis, score its
windows; export runs on one device). A checkpoint's recipe was checked for training when it was
trained; what eval, generate or score changes of it (--mesh, --set) is checked for what they run.
"""

from __future__ import annotations

from dtcli import devices as devices_lib
from dtcli.errors import UsageError
from dtcli.mesh import UNSHARDED, check_batch, resolve_axes
from dtcli.recipe.configs import Recipe

COMMANDS = ("train", "eval", "generate", "score", "export")


def batches_used(recipe: Recipe, command: str) -> dict[str, int]:
    """{recipe key: batch size} of the batches `command` splits along the data axis."""
    if command not in COMMANDS:
        raise ValueError(f"command {command!r}: expected one of {COMMANDS}")
    d = recipe.data
    if command == "train":
        used = {"data.batch_size": d.batch_size}
        if d.eval_batch_size:
            used["data.eval_batch_size"] = d.eval_batch_size
        return used
    if command == "eval":
        if d.eval_batch_size:
            return {"data.eval_batch_size": d.eval_batch_size}
        return {"data.batch_size": d.batch_size}
    return {}


def check_batches(recipe: Recipe, axes: dict[str, int], command: str) -> None:
    """Each batch `command` uses divides by the data axis of the mesh `axes` (sizes known)."""
    axis = recipe.layouts.data_axis
    for key, batch in batches_used(recipe, command).items():
        check_batch(axes, axis, batch, key)
    if command == "train":
        check_micro_batch(recipe, axes)


def check_batches_at_load(recipe: Recipe, command: str) -> None:
    """`check_batches` wherever the axis sizes are known without the devices, so that `config`
    and every command refuse it before TensorFlow starts; the session checks it again once the
    devices are known."""
    axes = _axes_before_devices(recipe)
    if axes is not None:
        check_batches(recipe, axes, command)


def _axes_before_devices(recipe: Recipe) -> dict[str, int] | None:
    """The mesh's axis sizes where the data axis's is known without the devices, or None: where
    the devices decide it (-1 with no device count), and where the mesh does not take the device
    count the spec names (cpu:8 for a mesh of 6): that mistake is the one to name, and the
    session names it (config: check_mesh_on_devices) before it checks a batch."""
    count = devices_lib.parse(recipe.devices).count
    if count is None:
        return None if recipe.mesh.get(recipe.layouts.data_axis) == -1 else dict(recipe.mesh)
    try:
        return resolve_axes(recipe.mesh, count)
    except UsageError:
        return None


def check_micro_batch(recipe: Recipe, axes: dict[str, int]) -> None:
    """With train.accumulate N each micro-batch is data.batch_size / N examples, split along the
    data axis like a batch."""
    n, batch = recipe.train.accumulate, recipe.data.batch_size
    if n == 1:
        return
    if batch % n:
        raise UsageError(
            f"recipe key 'train.accumulate': data.batch_size {batch} does not divide into {n} "
            "micro-batches (expected a divisor of data.batch_size)"
        )
    axis = recipe.layouts.data_axis
    shards = 1 if axis == UNSHARDED else axes[axis]
    if (batch // n) % shards:
        raise UsageError(
            f"recipe key 'train.accumulate': micro-batches of {batch // n} examples "
            f"(data.batch_size {batch} / {n}) do not divide along mesh axis '{axis}' of size "
            f"{shards}; use fewer micro-batches or a larger batch"
        )
