"""The cost model of `dtcli plan --auto` (pure: no TensorFlow): a training step's predicted time
on a mesh, from the recipe's arithmetic and rates measured on the devices (autoplan.calibrate):
a DTensor mesh of N devices is priced by the rates probed on a mesh of N devices (on virtual
CPUs sharing a few cores, every op runs once per device: fewer devices, fewer runs), one device
compiled by XLA on plain variables (mesh.compiles_with_xla) by the rates of XLA on one device
(fused element-wise work, a few kernels per weight, no collectives).

    step = compute + memory + collectives + ops
    compute     = FLOPs per device / FLOP rate
    memory      = (activation bytes per device * ACTIVATION_PASSES + weight, gradient and
                  optimizer bytes per device * STATE_PASSES) / streaming rate (the element-wise
                  work a FLOP count misses: LayerNorm, softmax, GELU, residuals, the update)
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
  a sharded weight needs one scalar all-reduce per weight; in dtcli's GPT, the relayouts
  DTensor runs on its own (ops and all-reduces per split block, counted in traced steps:
  autoplan.workload);
- the loss and the step's counters: one scalar all-reduce over the whole mesh.
What it leaves out: overlap of communication with compute, kernels slower on small shards, the
data pipeline and the training loop's own time per step (the same for every candidate, so
the predictions are below the measured times by about that much), relayouts DTensor inserts
in other models (a tf-keras layer reading a weight sharded on the data axis), and any
collective beyond those listed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dtcli.layout import WeightPlan
from dtcli.mesh import UNSHARDED

FLOAT32 = 4
SCALAR_ALL_REDUCES = 1  # the loss, its count and the accuracy: stacked, summed over the mesh
# Passes of element-wise work over the activation bytes a step keeps for its backward pass
# (each written forward, read backward, its gradient written, and the element-wise ops around
# them: LayerNorm, softmax, GELU, residuals, masks, forward and backward). Fitted to traced
# tiny_gpt steps (`dtcli train --profile`): the ops other than matmuls took 1.0-1.7x the
# matmuls' time on DTensor meshes of 1 and 2 devices and 0.43x under XLA; with the probed rates
# (XLA's matmuls slower, its fused element-wise kernels faster) 10 passes gives both.
ACTIVATION_PASSES = 10
# The optimizer's update reads each weight, its gradient and its slots and writes the weight and
# the slots: about two passes over those bytes (on every device that holds a copy).
STATE_PASSES = 2


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
    return by_group[_nearest_key(by_group, group)] if by_group else 0.0


def _nearest_key(by_size: dict[int, object], size: int) -> int:
    """The size probed nearest `size` (on a log scale; the smaller on a tie)."""
    return min(by_size, key=lambda g: (abs(math.log(g / size)), g))


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
    ops_per_device: float = 0.0  # op executions (DTensor) or kernels (XLA) per device
    activation_bytes: float = 0.0  # kept for the backward pass, per device (memory.estimate)
    state_bytes: float = 0.0  # weights, gradients and optimizer slots per device
    devices: int = 1  # of the mesh
    xla: bool = False  # one device, plain variables compiled by XLA


@dataclass(frozen=True)
class Calibration:
    """The rates of one device kind for each way a candidate runs: DTensor on a mesh of each
    device count probed, and one device compiled by XLA (None: not probed)."""

    meshes: dict[int, Rates]
    xla: Rates | None = None

    def rates_for(self, work: Workload) -> Rates:
        if work.xla and self.xla is not None:
            return self.xla
        return self.meshes[_nearest_key(self.meshes, work.devices)]

    def to_json(self) -> dict:
        return {
            "meshes": {str(n): r.to_json() for n, r in self.meshes.items()},
            "xla": None if self.xla is None else self.xla.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict) -> Calibration:
        xla = data.get("xla")
        return cls(
            {int(n): Rates.from_json(r) for n, r in data["meshes"].items()},
            None if xla is None else Rates.from_json(xla),
        )


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
        passes = ACTIVATION_PASSES * work.activation_bytes + STATE_PASSES * work.state_bytes
        memory = passes / rates.stream_rate
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
    scalar all-reduces over the axes a weight is split along. DTensor's all-reduce combining
    pass makes the gradients' all-reduces over the data axis one (independent of each other,
    over the same devices): a traced data-parallel step of tiny_gpt ran 2 all-reduces per
    device, not one per weight."""
    data = axes.get(data_axis, 1)
    out = []
    combined = 0
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
            combined += shard
        if clip:
            groups = math.prod(axes[a] for a in set(p.spec) if a != UNSHARDED)
            if groups > 1:
                out.append(Collective("all-reduce", groups, FLOAT32))
    if combined:
        out.append(Collective("all-reduce", data, combined))
    return out
