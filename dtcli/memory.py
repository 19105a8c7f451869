"""What one device holds while a recipe trains, by arithmetic: weights, gradients, optimizer state
and activations, and whether their sum fits a budget (`--memory`, or the device's own memory).

Weights, gradients and optimizer state are exact: the bytes of the local shards a run allocates
on each device (tests unpack the live variables and compare them byte for byte):
- weights: every weight's shard (its plan's shard shape), float32 (master weights stay float32
  under `train.precision: bf16`); a LoRA run's frozen base counted apart (`frozen`), in bfloat16
  under `lora.base_precision: bf16`;
- gradients: one float32 gradient per trainable weight, with the weight's layout; with
  `train.accumulate` > 1 two (the running sum of the micro-batches' gradients, which the step
  carries with each weight's layout, and the current micro-batch's);
- optimizer: `optimizers.slots` copies of each trainable shard, plus the scalars the optimizer
  keeps on every device (`optimizers.scalar_bytes`).

Activations are an estimate (`models.activations`): what the forward pass keeps for the backward
pass at the recipe's micro-batch, compute precision and remat setting. The arithmetic needs no
TensorFlow, nor does the plan of dtcli's GPT and Core MLP (`models.weight_plans(values=False)`),
so `train` refuses such a run before TensorFlow even starts (`check_before_run`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from dtcli import devices as devices_lib
from dtcli import layout as layout_lib
from dtcli import mesh as mesh_lib
from dtcli import models, optimizers
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.models import activations as activations_lib
from dtcli.recipe import Recipe

FLOAT32 = 4  # bytes: weights, gradients and optimizer state are float32

# The four items, in the order tables show them, with the words a refusal names them by.
ITEMS = {
    "weights": "weights",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations",
}


@dataclass(frozen=True)
class Memory:
    """Bytes on one device (the largest: every device holds the same shard sizes)."""

    weights: int  # every weight: trainable and frozen
    gradients: int
    optimizer: int
    activations: activations_lib.Activations
    frozen: int = 0  # of `weights`, those not trained (a LoRA run's base)

    @property
    def trainable(self) -> int:
        """The trainable weights' bytes (a LoRA run's adapters)."""
        return self.weights - self.frozen

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations.total

    def items(self) -> dict[str, int]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations.total,
        }

    def largest(self) -> tuple[str, int]:
        key, value = max(self.items().items(), key=lambda kv: kv[1])
        return ITEMS[key], value

    def to_json(self) -> dict[str, int]:
        return {**self.items(), "total": self.total}


def estimate(
    recipe: Recipe,
    plans: list[layout_lib.WeightPlan],
    axes: dict[str, int],
    input_shape: tuple[int, ...],
    num_classes: int,
) -> Memory:
    """Per-device bytes of a recipe whose weights are laid out as `plans` on a mesh of `axes`."""
    frozen = sum(p.bytes_per_device(axes) for p in plans if not p.weight.trainable)
    # Gradients and slots are float32 whatever a weight is stored in (trainable ones are).
    trainable = sum(p.bytes_per_device(axes, FLOAT32) for p in plans if p.weight.trainable)
    gradients = trainable * (2 if recipe.train.accumulate > 1 else 1)
    optimizer = optimizers.slots(recipe.optimizer) * trainable
    optimizer += optimizers.scalar_bytes(recipe.model.api)
    acts = activations_lib.estimate(recipe, plans, axes, input_shape, num_classes)
    return Memory(trainable + frozen, gradients, optimizer, acts, frozen)


@dataclass(frozen=True)
class Budget:
    """What a run's memory is checked against."""

    bytes: int | None  # None: the devices' own memory, where TensorFlow reports it
    given: str | None = None  # --memory as the user wrote it
    check: bool = True  # False: --no-memory-check
    source: str = ""  # a device budget's origin ("GPU memory")

    @property
    def name(self) -> str:
        if self.given is not None:
            return f"--memory {self.given}"
        return f"the {self.source} of {size_text(self.bytes or 0)} per device"


# No --memory: the devices' own memory, where TensorFlow reports it.
NO_BUDGET = Budget(None)

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str, option: str = "--memory") -> int:
    """Bytes from `16GiB`, `512MiB`, `1.5GB` (powers of 1000), `1000000` (bytes)."""
    found = _SIZE.fullmatch(text)
    unit = found.group(2).lower() if found else ""
    number = found.group(1) if found else ""
    if not found or unit not in (*_UNITS, "") or ("." in number and not unit):
        raise UsageError(
            f"{option} {text!r}: expected a size like 16GiB, 512MiB, 1.5GB or 1000000 (bytes; "
            "units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    value = int(float(number) * _UNITS[unit or "b"])
    if value < 1:
        raise UsageError(f"{option} {text!r}: expected at least 1 byte")
    return value


def budget_from_args(memory: str | None, no_check: bool = False) -> Budget:
    """--memory and --no-memory-check as a Budget (the size checked now: before any work)."""
    if memory is not None and no_check:
        raise UsageError("--no-memory-check: skips the check --memory asks for; give one of them")
    return Budget(None if memory is None else parse_size(memory), memory, not no_check)


def size_text(n: float) -> str:
    """Bytes for people: `512 B`, `3.2 MiB`, `16.0 GiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n):,} B" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)  # unreachable


def fits(memory: Memory, budget: Budget) -> bool | None:
    """Whether the plan fits the budget; None without one."""
    return None if budget.bytes is None else memory.total <= budget.bytes


def refuse(memory: Memory, budget: Budget, transformer: bool, hint: str = "") -> None:
    """A plan over its budget, in one line naming the total, the largest item and the budget,
    and what would make it smaller (`transformer`: dtcli's, which has remat)."""
    if not budget.check or fits(memory, budget) in (None, True):
        return
    label, largest = memory.largest()
    remat = " or model.transformer.remat" if transformer else ""
    need, have = size_text(memory.total), size_text(budget.bytes)
    if need == have:  # close enough to round alike: the bytes say which is more
        need, have = f"{memory.total:,} B", f"{budget.bytes:,} B"
    raise UsageError(
        f"{budget.name}: the plan needs {need} per device, more than {have} "
        f"(largest: {label} {size_text(largest)}); shard more "
        f"(layouts.fsdp, a model axis), use smaller micro-batches (train.accumulate){remat}{hint}"
    )


def check_before_run(
    recipe: Recipe,
    budget: Budget,
    role: Literal["process", "client", "launcher"] = "process",
    clients: int = 1,
    devices_key: str = devices_lib.RECIPE_KEY,
) -> None:
    """`dtcli train` and `launch`, before the run's folder is made or the model allocated: the
    recipe's plan against `budget`, refused in one line (exit 2) when it does not fit.

    dtcli's GPT and Core MLP are planned by arithmetic (no TensorFlow); a tf-keras layer list or
    `model.build` is built once on the host to list its weights, as `dtcli plan` does. `role`:
    - "process", a one-process run: its devices are configured first where TensorFlow is needed
      (as the run would: TensorFlow's devices are fixed once it runs an op), and without
      --memory its GPUs' own memory is the budget (CPUs and TPUs report none: no check);
    - "client", one of `clients` clients of a multi-client run: its runtime must not start
      before the others are there, so only --memory and the arithmetic models are checked
      (`dtcli launch` checks the others, once);
    - "launcher": `dtcli launch`, --memory only, any model, on the host's CPU."""
    if not budget.check:
        return
    arithmetic = recipe.model.transformer is not None or recipe.model.api == "core"
    devices = None
    if role == "process" and (budget.bytes is None or not arithmetic):
        devices = _configure_for_check(recipe, budget, devices_key)
        if devices is None:
            return
        if budget.bytes is None:
            limit = devices_lib.memory_limit(devices)
            if limit is None:
                return
            budget = Budget(limit, source=f"{devices.device_type} memory")
    elif budget.bytes is None or (role == "client" and not arithmetic):
        return
    elif role == "launcher" and not arithmetic:
        devices_lib.host_only()  # the clients hold the accelerators
    count = devices.count if devices is not None else _device_count(recipe, clients)
    if count is None:
        return
    memory = plan_memory(recipe, mesh_lib.resolve_axes(recipe.mesh, count))
    transformer = recipe.model.transformer is not None
    refuse(memory, budget, transformer, "; or give --no-memory-check")


def _configure_for_check(
    recipe: Recipe, budget: Budget, devices_key: str
) -> devices_lib.Devices | None:
    """A one-process run's devices, configured as `session.prepare` will (which then finds them
    so), where the check needs TensorFlow; None where it has nothing to check: no --memory and
    no GPU, or a TPU (its system starts once, in the run) for a model TensorFlow must build."""
    kind = devices_lib.parse(recipe.devices, devices_key).kind
    if kind == "tpu" or (budget.bytes is None and kind == "cpu"):
        return None
    if budget.bytes is None and kind == "auto":
        from dtcli.tfruntime import import_tensorflow

        if not import_tensorflow().config.list_physical_devices("GPU"):
            return None  # auto is the CPU here: no budget of its own
    wanted = mesh_lib.device_count_for(recipe.mesh)
    return devices_lib.configure(recipe.devices, wanted, devices_key)


def plan_memory(recipe: Recipe, axes: dict[str, int]) -> Memory:
    """The recipe's memory per device on a mesh of `axes`, without placing anything."""
    from dtcli import data as data_lib

    mesh_lib.check_batch(axes, recipe.layouts.data_axis, recipe.data.batch_size, "data.batch_size")
    recipe_lib.check_micro_batch(recipe, axes)
    input_shape, num_classes = data_lib.describe(recipe.data, vocab_size=recipe.model.real_vocab)
    plans, _ = models.weight_plans(recipe, input_shape, num_classes, axes, values=False)
    return estimate(recipe, plans, axes, input_shape, num_classes)


def _device_count(recipe: Recipe, clients: int) -> int | None:
    """The mesh's device count as `session.prepare` will find it, without configuring the
    devices where the recipe says it (None: a TPU whose count only its runtime knows)."""
    spec = devices_lib.parse(recipe.devices)
    wanted = mesh_lib.device_count_for(recipe.mesh)
    if spec.count or wanted or spec.kind == "cpu":
        return spec.count or wanted or 1
    if spec.kind == "tpu":
        return None
    from dtcli.tfruntime import import_tensorflow

    gpus = len(import_tensorflow().config.list_physical_devices("GPU"))
    return gpus * clients if gpus else 1  # auto without a GPU: one CPU
