"""The cost model of `dtcli plan --auto` (pure: no TensorFlow): a training step's predicted time
on a mesh, from the recipe's arithmetic and rates measured on the devices (autoplan.calibrate).

    step = compute + memory + collectives + ops
    compute     = FLOPs per device / FLOP rate
    memory      = activation bytes per device * ACTIVATION_PASSES / streaming rate (the
                  element-wise work a FLOP count misses: LayerNorm, softmax, GELU, residuals)
    collectives = sum over the step's collectives of alpha(group) + bytes per device / beta(group)
    ops         = op executions per device * seconds per op

The collectives of a step, by layout (the group: the devices along the axis it runs over):
- a weight replicated along the data axis: its gradient all-reduced over the data axis;
- a weight sharded along the data axis (FSDP): gathered before use (an all-gather) and its
  gradient reduce-scattered (each moves (g-1)/g of the full weight per device), again in the
  backward pass where the blocks are recomputed (model.transformer.remat);
- tensor parallel (a weight sharded along the model axis): a row-parallel matmul (contracting
  dim sharded) all-reduces its output in the forward pass, a column-parallel one (output dim
  sharded) the gradient of its input in the backward pass; with `clip_norm`, the global norm of
  a sharded weight needs one scalar all-reduce per weight.
- the loss and the step's counters: a few scalar all-reduces over the whole mesh.
What it leaves out: overlap of communication with compute, kernels slower on small shards, the
data pipeline and the training loop's own time per step (the same for every candidate, so
the predictions are below the measured times by about that much), relayouts DTensor inserts
on its own (a tf-keras layer reading a weight sharded on the data axis), and any collective
beyond those listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dtcli.layout import WeightPlan
from dtcli.mesh import UNSHARDED

FLOAT32 = 4
SCALAR_ALL_REDUCES = 3  # the loss, its count and the accuracy, summed over the mesh
# Each kept activation is written in the forward pass, read in the backward pass and its
# gradient written there: three passes over the activation bytes.
ACTIVATION_PASSES = 3


@dataclass(frozen=True)
class Rates:
    """What the probe measured on one device kind."""

    flop_rate: float  # FLOP/s per device in a matmul
    alpha: dict[int, float]  # seconds per all-reduce of a few floats, by group size
    beta: dict[int, float]  # bytes per second per device in an all-reduce, by group size
    op_seconds: float  # seconds per small op on every device
    stream_rate: float = 0.0  # bytes/s per device an element-wise op reads and writes (0: none)

    def alpha_for(self, group: int) -> float:
        return _nearest(self.alpha, group)

    def beta_for(self, group: int) -> float:
        return _nearest(self.beta, group)

    def to_json(self) -> dict:
        return {
            "flop_rate": self.flop_rate,
            "alpha": {str(k): v for k, v in self.alpha.items()},
            "beta": {str(k): v for k, v in self.beta.items()},
            "op_seconds": self.op_seconds,
            "stream_rate": self.stream_rate,
        }

    @classmethod
    def from_json(cls, data: dict) -> Rates:
        return cls(
            float(data["flop_rate"]),
            {int(k): float(v) for k, v in data["alpha"].items()},
            {int(k): float(v) for k, v in data["beta"].items()},
            float(data["op_seconds"]),
            float(data.get("stream_rate", 0.0)),
        )


def _nearest(by_group: dict[int, float], group: int) -> float:
    if not by_group:
        return 0.0
    return by_group[min(by_group, key=lambda g: (abs(math.log(g / group)), g))]


@dataclass(frozen=True)
class Collective:
    kind: str  # "all-reduce", "all-gather", "reduce-scatter"
    group: int  # devices along the axis it runs over
    bytes: int  # of the full tensor it reduces or gathers, per device group member

    def moved(self) -> float:
        """Bytes each device sends (ring algorithms)."""
        share = (self.group - 1) / self.group
        return (2 if self.kind == "all-reduce" else 1) * share * self.bytes


@dataclass(frozen=True)
class Workload:
    """What one training step does, by arithmetic, on one mesh."""

    flops_per_device: float
    collectives: list[Collective] = field(default_factory=list)
    ops_per_device: float = 0.0
    activation_bytes: float = 0.0  # kept for the backward pass, per device (memory.estimate)


@dataclass(frozen=True)
class Prediction:
    seconds: float
    compute: float
    memory: float
    communication: float
    ops: float
    collectives: int

    def to_json(self) -> dict:
        return {
            "compute_ms": self.compute * 1e3,
            "memory_ms": self.memory * 1e3,
            "communication_ms": self.communication * 1e3,
            "ops_ms": self.ops * 1e3,
            "collectives": self.collectives,
        }


def predict(work: Workload, rates: Rates) -> Prediction:
    compute = work.flops_per_device / rates.flop_rate
    memory = 0.0
    if rates.stream_rate > 0:
        memory = ACTIVATION_PASSES * work.activation_bytes / rates.stream_rate
    comm = sum(
        rates.alpha_for(c.group) + c.moved() / rates.beta_for(c.group)
        for c in work.collectives
        if c.group > 1
    )
    ops = work.ops_per_device * rates.op_seconds
    count = sum(1 for c in work.collectives if c.group > 1)
    return Prediction(compute + memory + comm + ops, compute, memory, comm, ops, count)


def weight_collectives(
    plans: list[WeightPlan], axes: dict[str, int], data_axis: str, remat: bool, clip: bool
) -> list[Collective]:
    """The gradient reduction of every trainable weight, FSDP's gathers, and clip_norm's
    scalar all-reduces over the axes a weight is split along."""
    data = axes.get(data_axis, 1)
    out = []
    for p in plans:
        if not p.weight.trainable:
            continue
        shard = p.bytes_per_device(axes, FLOAT32)
        if data_axis in p.spec and data > 1:
            full = shard * data  # the weight as gathered along the data axis
            gathers = 2 if remat else 1
            out += [Collective("all-gather", data, full)] * gathers
            out.append(Collective("reduce-scatter", data, full))
        else:
            out.append(Collective("all-reduce", data, shard))
        if clip:
            groups = math.prod(axes[a] for a in set(p.spec) if a != UNSHARDED)
            if groups > 1:
                out.append(Collective("all-reduce", groups, FLOAT32))
    return out


def ops_per_device(plans: list[WeightPlan], activation_ops: int) -> float:
    """Op executions per step on each device: per trainable weight its forward use, two
    backward matmuls or reductions, the optimizer's update (about 12 element-wise ops for
    Adam(W)) and the gradient's norm; plus the activations' own ops (`activation_ops`)."""
    per_weight = 16
    return per_weight * sum(1 for p in plans if p.weight.trainable) + activation_ops
